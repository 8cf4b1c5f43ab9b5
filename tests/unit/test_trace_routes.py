import pytest

from kdiv.trace.routes import FileSink, Hop, Route, RouteError, parse_routes, validate_routes


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


def test_a_last_stage_of_files_is_read_at_rest_and_left_out_of_the_live_route():
    archive, mixed, whole = parse_routes(
        "archive=orders>enricher>enriched>archiver>parquet:s3a://lake/enriched/dt=2024-01-01;"
        "mixed=orders>router>eu|avro:/archive/us;"
        "whole=orders>archiver>parquet:/data/orders"
    )
    assert archive.stages == (("orders",), ("enriched",), ("parquet:s3a://lake/enriched/dt=2024-01-01",))
    assert archive.file_sinks == (FileSink("parquet", "s3a://lake/enriched/dt=2024-01-01"),)
    assert archive.kafka_topics == ("orders", "enriched")
    assert archive.stage_of("parquet:s3a://lake/enriched/dt=2024-01-01") == 2
    assert archive.live() == Route("archive", (Hop(("orders",), "enricher", ("enriched",)),))
    # A hop writing files even as one alternative cannot be judged live: the worker sees no file.
    assert mixed.file_sinks == (FileSink("avro", "/archive/us"),) and mixed.kafka_topics == ("orders", "eu")
    assert mixed.live() is None
    assert whole.live() is None
    (plain,) = parse_routes("plain=a>g>b")
    assert plain.live() is plain and plain.file_sinks == () and plain.kafka_topics == ("a", "b")
    assert FileSink("avro", "/x").name == "avro:/x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("r=a>g>orc:/x", r"segment 3: file sink 'orc:/x': format 'orc' is not one of parquet, avro"),
        ("r=a>g>parquet:", r"segment 3: file sink 'parquet:' has an empty path"),
        ("r=a>g>parquet:/x>h>b", r"segment 3: file sink 'parquet:/x' is not the last stage"),
        ("r=parquet:/x>g>b", r"segment 1: file sink 'parquet:/x' is not the last stage"),
        ("r=a>g>parquet:/x|parquet:/x", r"topic 'parquet:/x' appears twice"),
    ],
)
def test_file_sink_errors_name_the_route_and_the_segment(text, message):
    with pytest.raises(RouteError, match=message) as caught:
        parse_routes(text)
    assert str(caught.value).startswith(f"route {text!r}: ")


def test_routes_built_directly_keep_files_to_the_last_stage():
    with pytest.raises(RouteError, match=r"route 'r': file sink 'parquet:/x' is stage 1, but only the last stage"):
        Route("r", (Hop(("a",), "g", ("parquet:/x",)), Hop(("parquet:/x",), "h", ("c",))))
    with pytest.raises(RouteError, match=r"route 'r': file sink 'csv:/x': format 'csv' is not one of"):
        Route("r", (Hop(("a",), "g", ("csv:/x",)),))


def test_validate_routes_does_not_look_for_files_on_the_cluster():
    routes = parse_routes("r=a>g>b>h>parquet:/archive")
    assert validate_routes(routes, {"a", "b"}, {"g", "h"}) == []


def test_the_worker_gets_the_live_routes_and_watches_no_file():
    from kdiv.config.settings import AuditSettings

    audit = AuditSettings.from_env({"KDIV_ROUTES": "deep=a>g>b>h>parquet:/lake/b;flat=c>k>avro:/lake/c;kafka=d>m>e"})
    assert [route.name for route in audit.all_routes] == ["deep", "flat", "kafka"]
    assert [(route.name, route.last_stage) for route in audit.routes] == [("deep", 1), ("kafka", 1)]
    assert audit.route_topics() == frozenset({"a", "b", "c", "d", "e"})
    assert audit.judged_live
    # Files only: checked at rest, nothing for the worker to judge (no observations topic).
    archive_only = AuditSettings.from_env({"KDIV_ROUTES": "flat=c>k>avro:/lake/c"})
    assert archive_only.configured and not archive_only.judged_live
    assert archive_only.route_topics() == frozenset({"c"})


def test_stage_map_names_every_route_stage_of_a_topic():
    from kdiv.trace.routes import stage_map

    routes = parse_routes("flow=orders>enricher>enriched|audit;short=orders>shipper>parquet:/lake/s")
    assert stage_map(routes) == {
        "orders": (("flow", 0), ("short", 0)),
        "enriched": (("flow", 1),),
        "audit": (("flow", 1),),
        "parquet:/lake/s": (("short", 1),),
    }
