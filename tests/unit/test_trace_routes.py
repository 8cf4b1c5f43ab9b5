import pytest

from kdiv.trace.routes import Hop, Route, RouteError, parse_routes, validate_routes


def test_parse_multi_hop_routes_with_alternatives():
    flow, audit = parse_routes(" flow = orders > enricher > enriched > router > eu | us ;audit=a>g>b;")
    assert flow.name == "flow"
    assert flow.hops == (
        Hop(("orders",), "enricher", ("enriched",)),
        Hop(("enriched",), "router", ("eu", "us")),
    )
    assert flow.stages == (("orders",), ("enriched",), ("eu", "us"))
    assert flow.topics == ("orders", "enriched", "eu", "us")
    assert [flow.stage_of(t) for t in ("orders", "enriched", "eu", "us", "nope")] == [0, 1, 2, 2, None]
    assert flow.last_stage == 2
    assert flow.hops[1].source == "enriched"
    assert audit == Route("audit", (Hop(("a",), "g", ("b",)),))
    assert audit.last_stage == 1


def test_alternatives_followed_by_a_hop_make_the_whole_stage_its_sources():
    (route,) = parse_routes("r=a>g1>b|c>g2>d")
    assert route.hops[1].sources == ("b", "c")
    assert route.stages == (("a",), ("b", "c"), ("d",))
    with pytest.raises(RouteError, match="reads 2 topics"):
        route.hops[1].source


def test_empty_text_has_no_routes():
    assert parse_routes("") == ()
    assert parse_routes(" ; ") == ()


@pytest.mark.parametrize(
    ("text", "entry", "message"),
    [
        ("=a>g>b", "=a>g>b", "the route name is empty"),
        ("r=a>g>b; r=c>g>d", "r=c>g>d", "route name 'r' is used twice"),
        ("r=a>g>b>h>a", "r=a>g>b>h>a", r"topic 'a' appears twice \(segments 1 and 5\)"),
        ("r=a>g>b|a", "r=a>g>b|a", "topic 'a' appears twice"),
        ("r=a>g>b>h", "r=a>g>b>h", "ends with the group 'h'"),
        ("r=a>>b", "r=a>>b", "segment 2 of the chain is empty"),
        ("r=a>g> ", "r=a>g>", "segment 3 of the chain is empty"),
        ("r=a>g>b|", "r=a>g>b|", "segment 3 'b|' has an empty alternative"),
        ("r=a b>g>c", "r=a b>g>c", "segment 1: 'a b' is not a valid topic name"),
        ("r=..>g>c", "r=..>g>c", "'..' is not a valid topic name"),
        ("r=" + "x" * 250 + ">g>c", "r=" + "x" * 250 + ">g>c", "is not a valid topic name"),
        ("r=a", "r=a", "needs at least one hop"),
        ("r a>g>b", "r a>g>b", "missing '='"),
        ("r=a>g|h>b", "r=a>g|h>b", "segment 2 'g|h' is a group and cannot list alternatives"),
        ("r!=a>g>b", "r!=a>g>b", "route name 'r!' is not valid"),
    ],
)
def test_errors_name_the_route_and_the_problem(text, entry, message):
    with pytest.raises(RouteError, match=message) as caught:
        parse_routes(text)
    assert str(caught.value).startswith(f"route {entry!r}: ")
    assert isinstance(caught.value, ValueError)


def test_routes_built_directly_must_chain():
    with pytest.raises(RouteError, match="hop 1 reads \\('x',\\), not what hop 0 writes to \\('b',\\)"):
        Route("r", (Hop(("a",), "g", ("b",)), Hop(("x",), "h", ("c",))))
    with pytest.raises(RouteError, match="has no hop"):
        Route("r", ())
    with pytest.raises(RouteError, match="appears twice"):
        Route("r", (Hop(("a",), "g", ("a",)),))


def test_validate_routes_lists_missing_topics_and_unknown_groups():
    routes = parse_routes("flow=orders>enricher>enriched>router>eu|us")
    assert validate_routes(routes, {"orders", "enriched", "eu", "us"}, {"enricher", "router"}) == []
    assert validate_routes(routes, {"orders", "enriched", "eu"}, None) == [
        "route 'flow': topic 'us' (stage 2) does not exist on the cluster"
    ]
    problems = validate_routes(routes, {"orders", "eu", "us"}, {"enricher"})
    assert problems == [
        "route 'flow': topic 'enriched' (stage 1) does not exist on the cluster",
        "route 'flow': group 'router' (hop 1, reading enriched) is not known to the cluster, "
        "so the audit cannot see its committed offsets",
    ]
