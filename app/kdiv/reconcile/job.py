"""The nightly reconciliation: `spark-submit reconcile/main.py [options]`, or `kdiv reconcile`.

1. Snapshot: the changelogs' end offsets are taken first, then the watched topics' (and the
   workers' incidents topic's): every record the tables mention then lies inside the topics'
   snapshot. The snapshot is saved
   beside the report; `--snapshot FILE` runs again on exactly those offsets.
2. Read the changelogs and the topics through kdiv's Kafka data source (or Spark's own).
3. Compare: key ledger vs compacted topics, producer state vs every topic, schema ids of
   all restorable state vs the registry. TiCDC changefeed topics (KDIV_TICDC_*) carry no DIV
   headers: every row checksum of theirs is verified instead (kdiv.reconcile.changefeeds).
   Pipeline routes (KDIV_ROUTES): every traced record judged across its hops against the
   groups' committed offsets, read before the snapshot (kdiv.reconcile.routes). The workers'
   incidents detected since the previous run's window ended are counted beside the findings
   (kdiv.reconcile.incidents).
4. Report into OUT/<snapshot time>/: summary.json, discrepancies/ (Parquet by topic and
   class), sequences/, report.html, snapshot.json, route_offsets.json (with routes),
   kdiv_reconcile.prom.

Settings are the worker's (`KDIV_*`, docs/settings.md); options override them. Exit status: 0 clean,
1 discrepancies, 2 failure (the report then names the error).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from aiokafka.errors import KafkaError

from kdiv.config.settings import Settings, SettingsError
from kdiv.kafka.discovery import discover, run_in_own_loop
from kdiv.kafka.failures import failure_text, refusals_explained
from kdiv.reconcile.backlog import WORKER_OFFSETS_JSON
from kdiv.registry.client import RegistryError, SchemaRegistry
from kdiv.state.tables import state_changelogs

log = logging.getLogger("kdiv.reconcile")

EXIT_CLEAN, EXIT_DISCREPANCIES, EXIT_FAILED = 0, 1, 2
SNAPSHOT_JSON = "snapshot.json"
ROUTE_OFFSETS_JSON = "route_offsets.json"
PROM_FILE = "kdiv_reconcile.prom"
KAFKA_SOURCES = ("auto", "python", "spark")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="reconcile/main.py",
        description="Reconcile kdiv's validator tables with the topics at rest, and restored state with the "
        "Schema Registry. Settings come from KDIV_* variables; options override them.",
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (KDIV_BOOTSTRAP)")
    parser.add_argument("--app-id", help="the worker's application id, which names its changelogs (KDIV_APP_ID)")
    parser.add_argument("--topics", help="comma-separated watched topics (KDIV_TOPICS / KDIV_TOPIC_PATTERN)")
    parser.add_argument(
        "--routes",
        help="pipeline routes to check at rest, 'name=topic>group>topic...;...', the last stage possibly "
        "files (parquet:PATH, avro:PATH) (KDIV_ROUTES)",
    )
    parser.add_argument(
        "--out",
        default="reconcile-reports",
        type=Path,
        help="reports land in OUT/<snapshot time, UTC>/ (default: reconcile-reports)",
    )
    parser.add_argument("--snapshot", type=Path, help="re-run on the offsets of an earlier run's snapshot.json")
    parser.add_argument(
        "--kafka-source",
        choices=KAFKA_SOURCES,
        default="auto",
        help="python: kdiv's data source; spark: Spark's kafka source (needs its jars: `kdiv fetch-jars`); "
        "auto: Spark's when its jars are on the classpath (default)",
    )
    parser.add_argument(
        "--max-records-per-split",
        type=int,
        default=500_000,
        help="kdiv's data source splits larger Kafka partitions by offset range (never those of "
        "Simple-protocol changefeed topics, whose schemas come earlier in the partition)",
    )
    parser.add_argument("--registry-url", help="Schema Registry URL (KDIV_SCHEMA_REGISTRY_URL)")
    parser.add_argument(
        "--schemas-topic",
        metavar="TOPIC",
        help="map schema ids to subjects by replaying the registry's topic (e.g. _schemas) "
        "instead of asking its REST API",
    )
    parser.add_argument(
        "--rocksdb",
        type=Path,
        metavar="DIR",
        help="also check state in a worker's RocksDB directory (a copy of its KDIV_DATA_DIR)",
    )
    parser.add_argument(
        "--repair",
        action="store_true",
        help="register the state schema ids found under the wrong subject, printing each first",
    )
    parser.add_argument(
        "--textfile",
        type=Path,
        metavar="FILE",
        help="also write the gauges here (node_exporter's textfile collector directory)",
    )
    parser.add_argument("--pushgateway", metavar="URL", help="also push the gauges to this Prometheus Pushgateway")
    parser.add_argument(
        "--master",
        help="Spark master, over spark-submit's; default: spark-submit's (its --master), else local[2]",
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace, environ) -> Settings:
    env = dict(environ)
    for option, variable in (
        ("bootstrap", "KDIV_BOOTSTRAP"),
        ("app_id", "KDIV_APP_ID"),
        ("topics", "KDIV_TOPICS"),
        ("routes", "KDIV_ROUTES"),
        ("registry_url", "KDIV_SCHEMA_REGISTRY_URL"),
    ):
        value = getattr(args, option)
        if value:
            env[variable] = value
    if args.topics:
        env.pop("KDIV_TOPIC_PATTERN", None)
    return Settings.from_env(env)


# Failures with a message that says it all: no traceback after it.
EXPECTED_FAILURES = (SettingsError, RegistryError, LookupError, ValueError, OSError, TimeoutError, KafkaError)


def write_early_failure(args: argparse.Namespace, error: str) -> Path:
    """The failure report of a run that ended before it had a Spark session (bad settings)."""
    from kdiv.reconcile.prometheus import write_textfile
    from kdiv.reconcile.report import write_failure_report

    now_ms = int(time.time() * 1000)
    out_dir = report_dir(args.out, now_ms)
    summary = {"error": error, "finished_at_ms": now_ms, "duration_s": 0.0, "exit_code": EXIT_FAILED}
    summary = write_failure_report(summary, out_dir).summary
    write_textfile(summary, out_dir / PROM_FILE)
    if args.textfile:
        write_textfile(summary, args.textfile)
    return out_dir


def report_dir(out: Path, taken_at_ms: int) -> Path:
    return out / datetime.fromtimestamp(taken_at_ms / 1000, UTC).strftime("%Y-%m-%dT%H%M%SZ")


class Reconciliation:
    """One run; `run()` returns the exit status."""

    def __init__(self, args: argparse.Namespace, settings: Settings, spark, say=print) -> None:
        self.args = args
        self.settings = settings
        self.spark = spark
        self.say = say
        # The registry client's connections belong to one loop; a thread of its own lets the
        # job run under a caller that has a loop running (tests, notebooks).
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="kdiv-reconcile-io", daemon=True)
        self._loop_thread.start()
        self.registry: SchemaRegistry | None = None
        self.source = args.kafka_source  # resolved ("python" or "spark") when the run starts

    def _await(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def run(self) -> tuple[int, Path | None]:
        from kdiv.reconcile.kafka_source import resolve_source
        from kdiv.reconcile.prometheus import push, write_textfile
        from kdiv.reconcile.report import write_failure_report, write_report

        started = time.time()
        summary: dict = {"app_id": self.settings.app_id, "started_at_ms": int(started * 1000)}
        out_dir = None
        try:
            # The job's first contact with Kafka: refused credentials are named here, in one line.
            with refusals_explained(self.settings.bootstrap):
                cluster = run_in_own_loop(discover(self.settings, wait_s=0, create_own=False))
            topics = [t.name for t in cluster.topics]
            # Changefeed topics are verified by row checksum: the DIV comparisons never see them.
            changefeed_topics = [t for t in topics if self.settings.is_changefeed(t)]
            div_topics = [t for t in topics if t not in changefeed_topics]
            compacted = [t.name for t in cluster.topics if t.compaction_lag_ms is not None and t.name in div_topics]
            changelogs = state_changelogs(self.settings.app_id, cluster)
            # Routes, like changefeeds, are checked without the worker's state.
            route_topics = self.settings.audit.route_topics()
            needs_changelogs = any(t not in route_topics for t in div_topics)
            # Before the snapshot: see kdiv.reconcile.routes.
            partitions = {t.name: t.partitions for t in cluster.topics}
            committed = self._route_offsets(partitions)
            worker_offsets = self._worker_offsets(partitions)
            snapshot = self._snapshot(changelogs, topics, needs_changelogs=needs_changelogs)
            # Whose records these are: a report read later (the dashboard) tells another
            # cluster's, or a recreated topic's, from the current one's by these.
            summary.update(self._identity(topics))
            if not needs_changelogs and not set(changelogs) & set(snapshot.topics):
                # No worker ran: its tables, which the DIV comparisons need, do not exist.
                div_topics, compacted = [], []
            out_dir = report_dir(self.args.out, snapshot.taken_at_ms)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / SNAPSHOT_JSON).write_text(snapshot.to_json())
            summary.update(
                topics=topics,
                compacted_topics=compacted,
                changelogs=changelogs,
                snapshot={
                    "taken_at_ms": snapshot.taken_at_ms,
                    "records_planned": snapshot.only([*changelogs, *topics]).records_planned,
                    "file": SNAPSHOT_JSON,
                },
            )
            if worker_offsets is not None:
                (out_dir / WORKER_OFFSETS_JSON).write_text(worker_offsets.to_json())
                summary["snapshot"].update(
                    worker_offsets_file=WORKER_OFFSETS_JSON, worker_offsets_taken_at_ms=worker_offsets.taken_at_ms
                )
            if committed is not None:
                (out_dir / ROUTE_OFFSETS_JSON).write_text(committed.to_json())
                summary["snapshot"].update(
                    route_offsets_file=ROUTE_OFFSETS_JSON, route_offsets_taken_at_ms=committed.taken_at_ms
                )
            self.source = resolve_source(self.spark, self.args.kafka_source)
            summary["kafka_source"] = self.source

            def read(names, max_records_per_split=None):
                return self._read(snapshot, names, max_records_per_split)

            findings, sequences, stats = self._compare(
                read, changelogs, div_topics, compacted, changefeed_topics, committed, partitions, snapshot
            )
            summary.update(stats)
            # Without the worker's state no worker ran: nothing was its to validate.
            worker_ran = bool(set(changelogs) & set(snapshot.topics))
            backlog, summary["not_validated"] = self._not_validated(snapshot, topics, worker_offsets, worker_ran)
            if backlog is not None:
                findings = _like(backlog, findings).unionByName(findings)
            summary["incidents"] = self._live_incidents(snapshot, read)
            code = EXIT_DISCREPANCIES if findings.count() else EXIT_CLEAN
            summary.update(
                exit_code=code, finished_at_ms=int(time.time() * 1000), duration_s=round(time.time() - started, 3)
            )
            summary = write_report(findings, sequences, summary, out_dir).summary
        except Exception as failure:  # the job's one place that turns any failure into a report
            log.debug("reconciliation failed", exc_info=True)
            code = EXIT_FAILED
            summary.update(
                error=failure_text(failure),
                finished_at_ms=int(time.time() * 1000),
                duration_s=round(time.time() - started, 3),
                exit_code=code,
            )
            self.say(f"reconciliation failed: {summary['error']}", err=True)
            if not isinstance(failure, EXPECTED_FAILURES):
                traceback.print_exc()
            out_dir = out_dir or report_dir(self.args.out, int(started * 1000))
            summary = write_failure_report(summary, out_dir).summary
        write_textfile(summary, out_dir / PROM_FILE)
        if self.args.textfile:
            write_textfile(summary, self.args.textfile)
        if self.args.pushgateway:
            try:
                push(summary, self.args.pushgateway)
            except OSError as unreachable:
                self.say(f"cannot push to {self.args.pushgateway}: {unreachable}", err=True)
        self.say(f"{summary['status']}: report in {out_dir}", err=False)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join()
        self.loop.close()
        return code, out_dir

    def _snapshot(self, changelogs: list[str], topics: list[str], needs_changelogs: bool = True):
        from kdiv.reconcile.snapshot import Snapshot, take_snapshot

        if self.args.snapshot:
            return Snapshot.from_json(self.args.snapshot.read_text())
        security = self.settings.kafka_security
        # Changelogs first: a table can then only mention records inside the topics' snapshot.
        tables = take_snapshot(self.settings.bootstrap, changelogs, security=security, missing_ok=True)
        # Changefeed topics alone need no worker state: their rows carry their own checksums.
        if not tables.ranges and needs_changelogs:
            # A wrong application id would otherwise compare nothing and call it clean.
            raise LookupError(
                f"none of the changelogs of application {self.settings.app_id!r} exists "
                f"({', '.join(changelogs)}): is the application id right?"
            )
        # The workers' incidents with the watched topics: the report sets them beside the
        # findings (kdiv.reconcile.incidents). Its absence is reported, not a failure.
        incidents = self.settings.incidents
        watched = take_snapshot(
            self.settings.bootstrap, [*topics, incidents], security=security, missing_ok=[incidents]
        )
        return Snapshot(tables.taken_at_ms, tables.ranges + watched.ranges, tables.missing + watched.missing)

    def _live_incidents(self, snapshot, read) -> dict:
        """summary["incidents"]: the incidents topic's counts in this run's window, or why
        there are none (kdiv.reconcile.incidents)."""
        from kdiv.reconcile.incidents import IncidentWindow, count_incidents, not_read, previous_window_end_ms
        from kdiv.reconcile.report import SUMMARY_JSON
        from kdiv.reconcile.summary import INCIDENTS_MISSING, INCIDENTS_NOT_IN_SNAPSHOT, INCIDENTS_UNREADABLE

        topic = self.settings.incidents
        window = IncidentWindow(
            previous_window_end_ms(self.args.out, snapshot.taken_at_ms, SUMMARY_JSON), snapshot.taken_at_ms
        )
        if topic in snapshot.missing:
            return not_read(topic, window, INCIDENTS_MISSING)
        if topic not in snapshot.topics:
            return not_read(topic, window, INCIDENTS_NOT_IN_SNAPSHOT)
        try:
            return count_incidents(read([topic]), topic, window)
        except Exception as failure:  # the findings stand without the incidents; the report says why
            log.debug("reading %s failed", topic, exc_info=True)
            return not_read(topic, window, INCIDENTS_UNREADABLE, failure_text(failure))

    def _compare(self, read, changelogs, topics, compacted, changefeed_topics, committed, partitions, snapshot):
        """Findings, sequences and stats: the DIV comparisons over `topics`, row checksums
        over `changefeed_topics`, the routes' traces against the `committed` offsets; and
        what of `topics` and the changelogs was deleted before it could be read."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from kdiv.reconcile.compare import compare_keys, compare_sequences
        from kdiv.reconcile.findings import FINDINGS_SCHEMA, with_checksum_columns, with_report_columns
        from kdiv.reconcile.findings import UNREADABLE as UNREADABLE_CLASS
        from kdiv.reconcile.schemas import judge_uses, local_store_uses, schema_id_uses
        from kdiv.reconcile.state import UNDECODED, UNREADABLE, decoded_state
        from kdiv.reconcile.topics import (
            at_rest_view,
            highest_sequences,
            keyed_data,
            latest_per_key,
        )

        changelog_records = read(changelogs).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            directory = self._directory()
            uses = schema_id_uses(changelog_records)
            if self.args.rocksdb:
                uses += local_store_uses(self.args.rocksdb, self.settings.app_id)
            schema_findings = judge_uses(uses, directory)
            writer_schemas = {}
            for schema_id in sorted({u.schema_id for u in uses if u.schema_id is not None}):
                text = directory.schema_text(schema_id)
                if text is not None:
                    writer_schemas[schema_id] = text
            state = decoded_state(changelog_records, writer_schemas).persist(StorageLevel.MEMORY_AND_DISK)
            view = at_rest_view(read(topics)).persist(StorageLevel.MEMORY_AND_DISK)
            records_read, changelog_records_read = (
                {r["topic"]: r["n"] for r in frame.groupBy("topic").agg(F.count(F.lit(1)).alias("n")).collect()}
                for frame in (view, changelog_records)
            )
            # Both are read (and kept) by now: what they miss of the snapshot is known.
            vanished = self._vanished(snapshot, [*topics, *changelogs], [view, changelog_records])
            latest = latest_per_key(keyed_data(view.where(F.col("topic").isin(compacted))))
            key_findings = compare_keys(latest, state, compacted)
            sequences, behind = compare_sequences(highest_sequences(view), state, compacted)
            state_kinds = {r["kind"]: r["n"] for r in state.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}
            unreadable = state.where(F.col("kind") == UNREADABLE).select(
                F.lit(UNREADABLE_CLASS).alias("class"),
                F.col("changelog").alias("topic"),
                F.col("changelog_partition").alias("partition"),
                F.col("changelog_offset").alias("offset"),
                F.col("key"),
                F.lit(None).cast("string").alias("producer"),
                F.lit(None).cast("long").alias("segment"),
                F.lit(None).cast("long").alias("seq"),
                F.lit(-1).cast("long").alias("timestamp_ms"),
                F.lit(1).cast("long").alias("count"),
                F.col("schema_id"),
                F.lit(None).cast("string").alias("expected_subject"),
                F.lit(None).cast("array<string>").alias("registered_subjects"),
                F.col("error").alias("detail"),
            )
            schema_rows = self.spark.createDataFrame([f.row() for f in schema_findings], FINDINGS_SCHEMA)
            findings = with_checksum_columns(
                key_findings.unionByName(behind).unionByName(schema_rows).unionByName(unreadable)
            )
            changefeeds = None
            if self.settings.changefeeds.configured:
                checksum_findings, changefeeds, changefeed_records = self._verify_changefeeds(
                    read, changefeed_topics, directory
                )
                findings = findings.unionByName(checksum_findings)
                records_read.update(changefeed_records)
            routes = None
            if committed is not None:
                from kdiv.reconcile.routes import check_routes

                check = check_routes(self.spark, self.settings.audit.all_routes, read, committed, partitions)
                findings = with_report_columns(findings).unionByName(check.findings)
                routes = check.summary
            if self.args.repair:
                self._repair(schema_findings)
            stats = {
                "vanished": [v.to_json() for v in vanished],
                "records_read": records_read,
                # Findings on a changelog (values the job cannot read) count against these.
                "changelog_records_read": changelog_records_read,
                "state": {k: state_kinds.get(k, 0) for k in ("partition", "producer", "key", UNREADABLE, UNDECODED)},
                "registry": (
                    f"replayed from {self.args.schemas_topic}"
                    if self.args.schemas_topic
                    else self.settings.registry.url
                ),
            }
            if changefeeds is not None:
                stats["changefeeds"] = changefeeds
            if routes is not None:
                stats["routes"] = routes
            return findings.persist(StorageLevel.MEMORY_AND_DISK), sequences, stats
        finally:
            changelog_records.unpersist()
            if self.registry is not None:
                self._await(self.registry.close())

    def _vanished(self, snapshot, names: list[str], frames) -> list:
        """What of `names` was deleted between the snapshot and the read that `frames` (the
        kept DataFrames of those reads) hold: kdiv.reconcile.vanished."""
        from kdiv.reconcile.vanished import first_offsets, log_starts, moved, pieces_of, vanished_ranges

        planned = [r for r in snapshot.only(names).ranges if r.end > r.start]
        if not planned:
            return []
        starts = run_in_own_loop(
            log_starts(
                self.settings.bootstrap,
                [(r.topic, r.partition) for r in planned],
                security=self.settings.kafka_security,
            )
        )
        pieces = pieces_of(moved(planned, starts), self.source, self.args.max_records_per_split)
        found = vanished_ranges(pieces, first_offsets(frames, pieces), starts)
        for v in found:
            self.say(
                f"{v.topic}[{v.partition}]: offsets [{v.start}, {v.end}) were deleted before they could be read "
                f"(the log now starts at {v.log_start})",
                err=True,
            )
        return found

    def _identity(self, topics: list[str]) -> dict:
        """summary's cluster_id (None from a broker that gives none) and topic_ids {topic: id}
        of the topics read that have one."""
        from confluent_kafka import KafkaException

        from kdiv.kafka.tansu import fetch_cluster_id
        from kdiv.kafka.topicids import TopicIds

        cluster_id = run_in_own_loop(fetch_cluster_id(self.settings.bootstrap, self.settings.kafka_security))
        try:
            topic_ids = TopicIds(self.settings).describe(topics)
        except KafkaException as unanswered:  # the findings stand without them; the report then names none
            log.warning("could not read the topic ids: %s", unanswered)
            topic_ids = {}
        return {"cluster_id": cluster_id, "topic_ids": topic_ids}

    def _worker_offsets(self, partitions: dict[str, int]):
        """The worker group's committed offsets: read now, before the snapshot, or the ones
        saved beside the snapshot a rerun is given (None when that run saved none)."""
        from kdiv.reconcile.backlog import WorkerOffsets, fetch_worker_offsets

        if self.args.snapshot:
            saved = self.args.snapshot.parent / WORKER_OFFSETS_JSON
            return WorkerOffsets.from_json(saved.read_text(), str(saved)) if saved.is_file() else None
        return run_in_own_loop(
            fetch_worker_offsets(
                self.settings.bootstrap, self.settings.app_id, partitions, security=self.settings.kafka_security
            )
        )

    def _not_validated(self, snapshot, topics: list[str], offsets, worker_ran: bool):
        """(NOT_VALIDATED findings or None, summary["not_validated"]): the records past the
        worker's committed offsets written more than KDIV_UNVALIDATED_AFTER_S before the
        offsets were read (kdiv.reconcile.backlog)."""
        from kdiv.reconcile import backlog

        after_s = self.settings.unvalidated_after_s
        if not worker_ran:
            return None, backlog.summary_of(backlog.NO_WORKER, offsets, after_s)
        if offsets is None:
            return None, backlog.summary_of(backlog.NOT_SAVED, None, after_s)
        past = backlog.backlog_snapshot(snapshot, offsets, topics)
        records = self._read(past, list(past.topics) + list(past.missing))
        rows = backlog.backlog_rows(records, offsets, offsets.taken_at_ms - round(after_s * 1000))
        summary = backlog.summary_of(backlog.CHECKED, offsets, after_s, rows)
        return backlog.findings(self.spark, rows, after_s, offsets.group), summary

    def _verify_changefeeds(self, read, topics: list[str], directory):
        """(findings, summary["changefeeds"], records read per topic) of the changefeed topics:
        verified on the executors, only Spark's aggregates collected."""
        from pyspark import StorageLevel

        from kdiv.reconcile.changefeeds import (
            ChangefeedCounts,
            collect_counts,
            fault_findings,
            plan_for,
            read_plan,
            summary_of,
            verified_rows,
        )
        from kdiv.reconcile.findings import REPORT_SCHEMA
        from kdiv.reconcile.schemas import ReplayedRegistry

        # A replayed registry log holds every schema: executors then need no registry at all.
        replayed = dict(directory.state.schemas) if isinstance(directory, ReplayedRegistry) else None
        plan = plan_for(self.settings.changefeeds, topics, self.settings.registry, replayed)
        verified = None
        for names, split in read_plan(plan, self.args.max_records_per_split):
            rows = verified_rows(read(names, split), plan)
            verified = rows if verified is None else verified.unionByName(rows)
        if verified is None:
            # No changefeed topic on the cluster (yet): zeros, so the summary still says so.
            return self.spark.createDataFrame([], REPORT_SCHEMA), summary_of(plan, ChangefeedCounts({}, {}, {})), {}
        # Verifying is the costly part: done once, its few rows (faults, counts) kept.
        verified = verified.persist(StorageLevel.MEMORY_AND_DISK)
        counts = collect_counts(verified)
        return fault_findings(verified), summary_of(plan, counts), counts.records

    def _route_offsets(self, partitions: dict[str, int]):
        """The route groups' committed offsets (None without routes): read now, before the
        snapshot, or the ones saved beside the snapshot a rerun is given."""
        from kdiv.reconcile.routes import CommittedOffsets, fetch_committed

        routes = self.settings.audit.all_routes
        if not routes:
            return None
        if self.args.snapshot:
            saved = self.args.snapshot.parent / ROUTE_OFFSETS_JSON
            if not saved.is_file():
                # Offsets read now are later than the snapshot: records they passed since would be LOST.
                raise LookupError(
                    f"no {ROUTE_OFFSETS_JSON} beside {self.args.snapshot}: the routes' committed offsets of that "
                    "snapshot were not saved (run without --snapshot, or without routes)"
                )
            return CommittedOffsets.from_json(saved.read_text(), str(saved))
        return run_in_own_loop(
            fetch_committed(self.settings.bootstrap, routes, partitions, security=self.settings.kafka_security)
        )

    def _read(self, snapshot, names, max_records_per_split: int | None = None):
        """The snapshot's records of `names`, through the source this run resolved."""
        from kdiv.reconcile.kafka_source import read_topics

        librdkafka = {"bootstrap.servers": self.settings.bootstrap, **self.settings.kafka_security.librdkafka_config()}
        return read_topics(
            self.spark,
            snapshot,
            names,
            librdkafka=librdkafka,
            source=self.source,
            max_records_per_split=max_records_per_split or self.args.max_records_per_split,
        )

    def _directory(self):
        from kdiv.reconcile.schemas import ReplayedRegistry, RestRegistry

        if self.args.schemas_topic:
            from kdiv.reconcile.snapshot import take_snapshot

            # The registry's log is read to its end now: it is not part of the tables' snapshot.
            snapshot = take_snapshot(
                self.settings.bootstrap, [self.args.schemas_topic], security=self.settings.kafka_security
            )
            records = self._read(snapshot, [self.args.schemas_topic])
            rows = records.select("partition", "offset", "key", "value").orderBy("partition", "offset").collect()
            return ReplayedRegistry((r["key"], r["value"]) for r in rows)
        self.registry = SchemaRegistry(self.settings.registry)
        return RestRegistry(self.registry, self._await)

    def _repair(self, schema_findings) -> None:
        from kdiv.reconcile.schemas import repair, repair_lines

        pairs = repair_lines(schema_findings)
        if not pairs:
            self.say("repair: nothing to register")
            return
        for schema_id, subject in pairs:
            self.say(f"repair plan: register schema id {schema_id} under {subject}")
        registry = SchemaRegistry(self.settings.registry)
        try:
            self._await(repair(registry, pairs, self.say))
        finally:
            self._await(registry.close())


def _like(findings, other):
    """`findings` with the columns of `other` (those it lacks null), in `other`'s order."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in other.schema.fields}
    missing = {name: F.lit(None).cast(types[name]) for name in other.columns if name not in findings.columns}
    return (findings.withColumns(missing) if missing else findings).select(*other.columns)


def _say(message: str, err: bool = False) -> None:
    print(message, file=sys.stderr if err else sys.stdout, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from(args, os.environ)
    except SettingsError as bad:
        _say(f"reconciliation failed: bad settings: {bad}", err=True)
        _say(f"failed: report in {write_early_failure(args, f'bad settings: {bad}')}", err=False)
        return EXIT_FAILED
    from kdiv.reconcile.session import build_session

    spark = build_session(args.master)
    try:
        code, _out = Reconciliation(args, settings, spark, _say).run()
    finally:
        spark.stop()
    return code


def main_guarded() -> int:
    # Python exits 1 on an uncaught exception, which would read as "discrepancies".
    try:
        return main()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - anything unforeseen is a failure, status 2
        traceback.print_exc()
        return EXIT_FAILED
