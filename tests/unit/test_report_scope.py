"""A reconciliation report of another cluster, or of topics since recreated, is shown as such
on the dashboard and never makes the overview amber."""

from __future__ import annotations

from kdiv.worker.overview import GroupsQuery, overview
from kdiv.worker.report_scope import elsewhere

NOW = 1_795_478_400_000
FOUND = {"status": "discrepancies", "counts": {"LOST": 3}, "cluster_id": "c-1", "topic_ids": {"orders": "id-a"}}


def shown(reconciliation: dict) -> dict:
    return overview(
        [],
        [{"topic": "orders", "partition": 0}],
        NOW,
        process="ready",
        unavailable_workers=[],
        reconciliation=reconciliation,
        report_url="/r",
        groups=GroupsQuery(),
    )


def run(summary: dict, cluster_id: str | None, topic_ids: dict[str, str]) -> dict:
    return {
        "available": True,
        "run": "20261124T000000Z",
        "summary": summary,
        "elsewhere": elsewhere(summary, cluster_id, topic_ids),
    }


def test_a_report_of_this_cluster_and_these_topics_is_current():
    assert elsewhere(FOUND, "c-1", {"orders": "id-a", "payments": "id-b"}) is None
    answer = shown(run(FOUND, "c-1", {"orders": "id-a"}))
    assert answer["state"] == "amber"
    assert [r["what"] for r in answer["reasons"]] == ["last reconciliation discrepancies: 3 findings"]
    assert answer["reconciliation"]["elsewhere"] is None


def test_a_report_of_another_cluster_is_shown_as_such_and_is_no_reason():
    why = elsewhere(FOUND, "c-2", {"orders": "id-a"})
    assert why == "from another cluster: the report read cluster c-1, this worker's is c-2"
    answer = shown(run(FOUND, "c-2", {"orders": "id-a"}))
    assert (answer["state"], answer["reasons"]) == ("green", [])
    last = answer["reconciliation"]
    assert (last["elsewhere"], last["status"], last["state"]) == (why, "discrepancies", "green")


def test_a_report_of_topics_since_recreated_is_from_a_previous_run():
    why = elsewhere(FOUND, "c-1", {"orders": "id-new"})
    assert why == "from a previous run: orders was deleted and created again since"
    answer = shown(run(FOUND, "c-1", {"orders": "id-new"}))
    assert (answer["state"], answer["reasons"], answer["reconciliation"]["elsewhere"]) == ("green", [], why)
    many = {"status": "clean", "topic_ids": {f"t{i}": "old" for i in range(6)}}
    assert elsewhere(many, None, {f"t{i}": "new" for i in range(6)}) == (
        "from a previous run: t0, t1, t2, t3 and 2 more were deleted and created again since"
    )


def test_without_ids_on_either_side_or_in_another_shape_nothing_says_elsewhere():
    assert elsewhere({"status": "discrepancies"}, "c-1", {"orders": "id-a"}) is None  # a report from before ids
    assert elsewhere(FOUND, None, {}) is None  # a worker that knows no id
    assert elsewhere(FOUND, "c-1", {"payments": "id-b"}) is None  # a topic the worker does not watch
    odd = {"cluster_id": 7, "topic_ids": ["orders"], "status": "failed"}
    assert elsewhere(odd, "c-1", {"orders": "id-a"}) is None
    assert elsewhere({"topic_ids": {"orders": 5, 6: "x"}}, "c-1", {"orders": "id-a"}) is None
