"""Recovery and assignment state Faust keeps without a public API, read in one place."""

from __future__ import annotations

from typing import Any

from faust.types import TP


def changelog_highwater(app: Any, tp: TP) -> int | None:
    """The end offset recovery restores a changelog partition to (None when not restoring it)."""
    return app.tables.recovery.active_highwaters.get(tp)


def restored_partitions(app: Any, table: Any) -> Any:
    """The changelog partitions recovery restored for `table` as an active."""
    return app.tables.recovery.actives_for_table.get(table, ())


def recovery_status(app: Any) -> dict:
    """Whether tables are recovering, and how many changelog records are left."""
    recovery = app.tables.recovery
    return {
        "in_progress": bool(recovery.in_recovery),
        "active_remaining": recovery.active_remaining_total(),
        "standby_remaining": recovery.standby_remaining_total(),
    }


def peer_topics(app: Any) -> dict:
    """Other workers' web URLs with the topic partitions Faust's assignor gave each."""
    return app.assignor.external_topics_metadata()


async def hand_over_table_writes(app: Any) -> None:
    """Wait until every table write is handed to the Kafka producer.

    Faust queues table writes and a task hands them over one per event-loop turn; while the
    worker validates a fetched batch the loop does not turn, so without this a commit (which
    waits for them) would wait for many batches."""
    await app.producer.buffer.flush()
