"""The state's schema findings go through the unit of work, as every other incident."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from kdiv.config.settings import Settings
from kdiv.kafka.discovery import ClusterView, WatchedTopic
from kdiv.registry.client import SchemaRegistry
from kdiv.registry.subjects import SchemaLookups
from kdiv.state.values import StateValues
from kdiv.worker.restore import RestoreListener
from kdiv.worker.schemas import SchemaChecks
from kdiv.worker.statecheck import StateFinding
from kdiv.worker.unit import UnitOfWork

SETTINGS = Settings.from_env({"KDIV_TOPICS": "orders"})
CHANGELOG = "kdiv-state-p1-changelog"


def _checks() -> SchemaChecks:
    cluster = ClusterView(tansu=False, topics=(WatchedTopic("orders", 1, None),))
    lookups = SchemaLookups(SchemaRegistry(SETTINGS.registry), clock=lambda: 0.0)
    return SchemaChecks(
        SETTINGS, cluster, lookups, StateValues(7), RestoreListener(lambda: 0), SimpleNamespace(), lambda: 1_000, True
    )


def test_state_findings_are_written_with_the_next_unit_once():
    checks = _checks()
    finding = StateFinding(CHANGELOG, 0, 42, "UNKNOWN_ID", f"{CHANGELOG}-value", (), 17)
    checks.report_state_findings([finding])
    unit = UnitOfWork()
    asyncio.run(checks.judge_schemas(unit))
    (incident,) = unit.incidents((CHANGELOG, 0))
    assert (incident.topic, incident.partition, incident.offset) == (CHANGELOG, 0, 17)
    again = UnitOfWork()
    asyncio.run(checks.judge_schemas(again))
    assert again.partitions == []  # handed over once: the unit that took them writes them
