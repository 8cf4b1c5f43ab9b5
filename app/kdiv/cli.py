"""The `kdiv` command."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import click
from click.core import ParameterSource

from kdiv import __version__
from kdiv.config.redact import redacted
from kdiv.div.faults import Verdict
from kdiv.div.validator import DEFAULT_WINDOW, DISABLED, DataIntegrityValidator, Semantics, TopicPolicy
from kdiv.offline.jsonl import InputError, not_json_lines, parse_record_bytes, result_to_line, ticdc_protocol_of
from kdiv.ticdc.timestamps import TimestampMode, load_zone, parse_timestamp_mode

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# Exit statuses, the same in every command: 0 clean, FAULTS_FOUND when the data has faults,
# BAD_INPUT_OR_UNREACHABLE for bad input or options, or a service (Kafka, the registry) that
# could not be reached or read (click's usage errors exit with 2 too).
FAULTS_FOUND = 1
BAD_INPUT_OR_UNREACHABLE = 2
# Bytes of the input looked at before the first line, to tell a compressed or binary file.
SNIFF_BYTES = 4096


class CommandFailed(click.ClickException):
    """A failure that is no finding: bad input, or a service that could not be reached."""

    exit_code = BAD_INPUT_OR_UNREACHABLE


def bootstrap_option(command):
    return click.option(
        "--bootstrap",
        envvar="KDIV_BOOTSTRAP",
        default=DEFAULT_BOOTSTRAP,
        show_default=True,
        help="Kafka bootstrap servers (env KDIV_BOOTSTRAP).",
    )(command)


def kafka_security():
    """TLS / SASL settings from the worker's KDIV_* variables (docs/operations.md#security)."""
    from kdiv.config.security import KafkaSecurity
    from kdiv.config.settings import SettingsError

    try:
        return KafkaSecurity.from_env(os.environ)
    except SettingsError as bad:
        raise CommandFailed(str(bad)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kdiv")
@click.option("--debug", is_flag=True, help="Show the traceback of an expected failure too.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """kdiv: prove a Kafka pipeline lost, duplicated and corrupted nothing, or name what it did.

    Exit status of every command: 0 clean, 1 faults found, 2 bad input or options, or a
    service (Kafka, the Schema Registry) that could not be reached."""
    ctx.obj = {"debug": debug}


def _debugging() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and isinstance(ctx.find_root().obj, dict) and ctx.find_root().obj.get("debug"))


@contextmanager
def kafka_errors_as_messages(bootstrap: str) -> Iterator[None]:
    """A command's Kafka failures as one line naming what failed, not a traceback (with
    --debug, the traceback first)."""
    from aiokafka.errors import KafkaError

    from kdiv.kafka.failures import failure_text, refusals_explained

    try:
        if _debugging():
            yield
        else:
            with refusals_explained():
                yield
    except LookupError as missing:  # no such topic or partition
        _traceback_when_debugging()
        raise CommandFailed(str(missing).strip("'\"")) from None
    except (KafkaError, OSError, TimeoutError) as failed:
        _traceback_when_debugging()
        raise CommandFailed(f"Kafka at {redacted(bootstrap)}: {failure_text(failed)}") from None


def _traceback_when_debugging() -> None:
    """With --debug, the traceback of the failure being handled, before its one line."""
    if _debugging():
        traceback.print_exc()


duration_option = click.option(
    "--duration", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Seconds to run (0: forever)."
)


def replication_factor_option(what: str):
    return click.option(
        "--replication-factor",
        envvar="KDIV_REPLICATION_FACTOR",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help=f"Replication of {what} if it is created (env KDIV_REPLICATION_FACTOR).",
    )


def semantics_options(command):
    """--semantics and --seq-window, for the commands that validate."""
    command = click.option(
        "--seq-window",
        type=click.IntRange(min=0, max=65535),
        default=DEFAULT_WINDOW,
        show_default=True,
        help="Recent seqs per producer whose CRCs tell DUPLICATE from DIVERGENT (exact semantics).",
    )(command)
    return click.option(
        "--semantics",
        type=click.Choice([s.value for s in Semantics]),
        default=Semantics.EXACT.value,
        show_default=True,
        help="exact: LATE and DIVERGENT told from DUPLICATE, one gap named once; venice: Venice's verdicts.",
    )(command)


# The worker's ChangefeedSettings choices and defaults, spelled out: kdiv.config.settings would
# make every command start slower (it loads the Kafka client).
TICDC_PROTOCOLS = ("avro", "simple")
TICDC_TIME_ZONE = "UTC"
TICDC_TIMESTAMP_MODE = TimestampMode.UTC.value

# Options of one kind of check, meaningless to the other: given on the command line, an error.
DIV_CHECK_OPTIONS = ("phase", "compaction_lag_ms", "max_age_ms", "now_ms", "semantics", "seq_window")
TICDC_CHECK_OPTIONS = ("registry_url", "time_zone", "timestamp_mode")


def _reject_options(ctx: click.Context, names: tuple[str, ...], why: str) -> None:
    given = [
        param.opts[0]
        for param in ctx.command.params
        if param.name in names and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE
    ]
    if given:
        raise click.UsageError(f"{', '.join(given)}: {why}")


@main.command()
@click.argument("source", type=click.File("rb"), default="-")
@click.option(
    "--phase",
    type=click.Choice(["push", "stream"]),
    default="stream",
    show_default=True,
    help="Phase every partition starts in: inside a push (faults are fatal) or streaming.",
)
@click.option(
    "--compaction-lag-ms",
    type=click.IntRange(min=0),
    default=None,
    help="The topics are compacted with this min.compaction.lag.ms (default: not compacted).",
)
@click.option(
    "--max-age-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Expire producers idle this long (data-relative), as if state were saved after every record.",
)
@click.option("--now", "now_ms", type=int, default=None, help="The clock, ms since epoch (default: wall clock).")
@semantics_options
@click.option(
    "--ticdc",
    type=click.Choice(TICDC_PROTOCOLS),
    default=None,
    help="Verify the rows of a TiCDC changefeed in this protocol by their checksums, instead of DIV.",
)
@click.option(
    "--registry-url",
    metavar="URL",
    default=None,
    help="--ticdc avro: the Schema Registry holding the writer schemas (default: KDIV_SCHEMA_REGISTRY_URL, "
    "the worker's, or http://127.0.0.1:8081; KDIV_SCHEMA_REGISTRY_* apply).",
)
@click.option(
    "--time-zone",
    envvar="KDIV_TICDC_TIME_ZONE",
    default=TICDC_TIME_ZONE,
    show_default=True,
    help="--ticdc: the TiCDC server's time zone (env KDIV_TICDC_TIME_ZONE).",
)
@click.option(
    "--timestamp-mode",
    envvar="KDIV_TICDC_TIMESTAMP_MODE",
    metavar=f"[{'|'.join(mode.value for mode in TimestampMode)}]",
    default=TICDC_TIMESTAMP_MODE,
    show_default=True,
    help="--ticdc: TIMESTAMP columns hashed in UTC (TiCDC v7.1.4 on) or as sent (earlier releases) "
    "(env KDIV_TICDC_TIMESTAMP_MODE).",
)
@click.pass_context
def check(
    ctx: click.Context,
    source,
    ticdc: str | None,
    registry_url: str | None,
    time_zone: str,
    timestamp_mode: str,
    phase: str,
    compaction_lag_ms: int | None,
    max_age_ms: int | None,
    now_ms: int | None,
    semantics: str,
    seq_window: int,
) -> None:
    """Validate a recorded stream (JSON Lines, as `kdiv dump` writes) from SOURCE or stdin.

    Prints one verdict per record, in input order, and a summary to stderr. Exits 0 when every
    record is OK or UNTRACKED, 1 when any fault was found, 2 when the input has bad lines.

    With --ticdc avro|simple the records are a TiCDC changefeed, verified by row checksum
    instead: one line per faulty row (CHECKSUM_MISMATCH, CORRUPTED_FLAG, MALFORMED) and a
    summary to stderr. Exits 0 when no row is faulty, 1 when some are, 2 when the input has bad
    lines or the registry cannot give a writer schema a record needs. The DIV options
    (--phase, --compaction-lag-ms, --max-age-ms, --now, --semantics, --seq-window) do not apply.
    """
    name = getattr(source, "name", "<stdin>")  # a test runner's stdin has no name
    peek = getattr(source, "peek", None)
    head = peek(SNIFF_BYTES)[:SNIFF_BYTES] if peek is not None else b""
    unreadable = not_json_lines(head)
    if unreadable is not None:
        raise CommandFailed(f"{name} {unreadable}")
    if ticdc is not None:
        _reject_options(ctx, DIV_CHECK_OPTIONS, "DIV options, which do not apply to --ticdc")
        _check_changefeed(source, name, ticdc, registry_url, time_zone, timestamp_mode)
        return
    _reject_options(ctx, TICDC_CHECK_OPTIONS, "only with --ticdc avro|simple")
    policy = TopicPolicy(compaction_lag_ms=compaction_lag_ms)
    validator = DataIntegrityValidator(
        lambda topic: policy,
        start_in_push=phase == "push",
        max_age_ms=DISABLED if max_age_ms is None else max_age_ms,
        semantics=Semantics(semantics),
        window=seq_window,
    )
    verdicts: Counter[Verdict] = Counter()
    fatal = bad_lines = 0
    ticdc_like: Counter[str] = Counter()
    out = sys.stdout
    for lineno, raw in enumerate(source, 1):
        if not raw.strip():
            continue
        try:
            record = parse_record_bytes(raw, name, lineno)
        except InputError as bad:
            click.echo(f"kdiv check: {bad}", err=True)
            bad_lines += 1
            continue
        checked_at = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        result = validator.validate(record, checked_at)
        if max_age_ms is not None:
            # Only this record's producer changed: the checkpoint asks it, not every producer.
            validator.checkpoint(record.topic, record.partition, () if result.guid is None else (result.guid,))
        verdicts[result.verdict] += 1
        if result.verdict is Verdict.UNTRACKED:
            protocol = ticdc_protocol_of(record)
            if protocol is not None:
                ticdc_like[protocol] += 1
        fatal += result.fatal
        out.write(result_to_line(result, checked_at) + "\n")
    out.flush()
    faults = sum(n for v, n in verdicts.items() if v.is_fault)
    counts = ", ".join(f"{v.value} {verdicts[v]}" for v in Verdict if verdicts[v])
    click.echo(
        f"kdiv check: {sum(verdicts.values())} records ({counts or 'none'}); "
        f"{faults} faults, {fatal} fatal; {bad_lines} bad input lines",
        err=True,
    )
    records = sum(verdicts.values())
    if not records and not bad_lines:
        raise CommandFailed(f"{name} is empty: no records to check")
    if records and verdicts[Verdict.UNTRACKED] == records:
        hint = ""
        if ticdc_like:
            protocol, rows = ticdc_like.most_common(1)[0]
            hint = f"; {rows} of them look like a TiCDC changefeed: check them with --ticdc {protocol}"
        raise CommandFailed(f"{name}: no record has a div header, so nothing was validated{hint}")
    sys.exit(BAD_INPUT_OR_UNREACHABLE if bad_lines else FAULTS_FOUND if faults else 0)


def _check_changefeed(
    source, name: str, protocol: str, registry_url: str | None, time_zone: str, timestamp_mode: str
) -> None:
    """`kdiv check --ticdc`: the command's options to kdiv.offline.changefeed, its results to exit codes."""
    from kdiv.config.settings import RegistrySettings, SettingsError
    from kdiv.offline.changefeed import RegistrySchemas, SchemaUnavailable, check_changefeed

    def report(message: str) -> None:
        click.echo(f"kdiv check: {message}", err=True)

    # Checked here, not by click: a DIV check must not fail on the worker's KDIV_TICDC_* variables.
    try:
        load_zone(time_zone)
    except ValueError as bad:
        raise click.BadParameter(str(bad), param_hint="--time-zone / KDIV_TICDC_TIME_ZONE") from None
    try:
        parse_timestamp_mode(timestamp_mode)
    except ValueError as bad:
        raise click.BadParameter(str(bad), param_hint="--timestamp-mode / KDIV_TICDC_TIMESTAMP_MODE") from None
    schemas = None
    if protocol == "avro":
        environ = dict(os.environ)
        if registry_url is not None:
            environ["KDIV_SCHEMA_REGISTRY_URL"] = registry_url
        try:
            registry = RegistrySettings.from_env(environ)
        except SettingsError as bad:
            raise click.UsageError(f"the registry for --ticdc avro: {bad}") from None
        if not registry.configured:
            raise click.UsageError(
                "--ticdc avro reads writer schemas from the Schema Registry, but its URL is none: "
                "pass --registry-url or set KDIV_SCHEMA_REGISTRY_URL"
            )
        schemas = RegistrySchemas(registry)
    try:
        counts = check_changefeed(
            source,
            name,
            protocol,
            sys.stdout,
            schemas=schemas,
            time_zone=time_zone,
            timestamp_mode=timestamp_mode,
            report=report,
        )
    except SchemaUnavailable as failed:
        report(f"{failed}")
        report("stopped there: no row is judged without its writer schema")
        sys.exit(BAD_INPUT_OR_UNREACHABLE)
    finally:
        if schemas is not None:
            schemas.close()
    click.echo(f"kdiv check --ticdc {protocol}: {counts.summary()}", err=True)
    if not counts.records and not counts.bad_lines:
        raise CommandFailed(f"{name} is empty: no records to check")
    sys.exit(counts.exit_status)


@main.command()
@click.argument("topic")
@bootstrap_option
@click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True, help="Only these partitions.")
@click.option(
    "--output", "-o", type=click.File("w", encoding="utf-8"), default="-", help="Where to write (default stdout)."
)
def dump(topic: str, bootstrap: str, partitions: tuple[int, ...], output) -> None:
    """Write TOPIC, from its start to its end when the command starts, as JSON Lines for `kdiv check`."""
    from kdiv.offline.dump import dump_topic

    with kafka_errors_as_messages(bootstrap):
        count = asyncio.run(dump_topic(bootstrap, topic, output, partitions or None, security=kafka_security()))
    click.echo(f"kdiv dump: {count} records from {topic}", err=True)


@main.command()
@click.argument("topic")
@bootstrap_option
@click.option("--from-end", is_flag=True, help="Only records written from now on (default: from the start).")
@click.option(
    "--phase",
    type=click.Choice(["push", "stream"]),
    default="stream",
    show_default=True,
    help="Phase every partition starts in.",
)
@semantics_options
def validate(topic: str, bootstrap: str, from_end: bool, phase: str, semantics: str, seq_window: int) -> None:
    """Validate TOPIC live with a plain consumer, printing every fault as a JSON line.

    Keeps no state across runs and reads every partition itself: a quick look at a topic.
    """
    from kdiv.kafka.consume import follow
    from kdiv.offline.jsonl import result_to_line

    validator = DataIntegrityValidator(start_in_push=phase == "push", semantics=Semantics(semantics), window=seq_window)
    security = kafka_security()

    async def run() -> None:
        async for record in follow(bootstrap, topic, from_beginning=not from_end, security=security):
            checked_at = time.time_ns() // 1_000_000
            result = validator.validate(record, checked_at)
            if result.verdict.is_fault:
                click.echo(result_to_line(result, checked_at))

    try:
        with kafka_errors_as_messages(bootstrap):
            asyncio.run(run())
    except KeyboardInterrupt:
        pass


@main.command()
@bootstrap_option
@click.option("--topic", default="kdiv-demo", show_default=True, help="Topic to write (created if missing).")
@click.option("--partitions", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--rate", type=click.FloatRange(min=0.1), default=50.0, show_default=True, help="Records per second.")
@click.option(
    "--fault-every",
    type=click.FloatRange(min=0.1),
    default=4.0,
    show_default=True,
    help="Seconds between injected faults (loss, duplicate, corruption, reordering, unregistered, push failure).",
)
@duration_option
@replication_factor_option("the topic")
@click.option("--writers", type=click.IntRange(min=1), default=3, show_default=True, help="Producers (GUIDs) at once.")
@click.option(
    "--restart-every",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds between producer restarts (each a new GUID; 0: never).",
)
@click.option(
    "--compacted-topic",
    default=None,
    help="Also write this compacted topic (200 keys, updated over and over), e.g. kdiv-demo-compacted.",
)
@click.option(
    "--at-rest-every",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds between at-rest faults on the compacted topic (LOST, DIVERGED, UNVALIDATED for the "
    "nightly reconciliation; they alter the key ledger of worker --app-id). 0: none.",
)
@click.option("--app-id", envvar="KDIV_APP_ID", default="kdiv", show_default=True, help="The worker's app id.")
@click.option(
    "--tracing",
    default=None,
    callback=lambda ctx, param, value: _sampling(value),
    help="Trace this share of each topic's records for the pipeline audit, e.g. 'kdiv-demo=0.2' (default: none).",
)
def demo(
    bootstrap: str,
    topic: str,
    partitions: int,
    rate: float,
    fault_every: float,
    duration: float,
    replication_factor: int,
    writers: int,
    restart_every: float,
    compacted_topic: str | None,
    at_rest_every: float,
    app_id: str,
    tracing: str | None,
) -> None:
    """Write a stamped topic and inject every fault class on a schedule."""
    import logging

    from kdiv.dev.demo import run_demo

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from kdiv.dev.sigterm import exit_at_sigterm

    exit_at_sigterm("kdiv demo")
    try:
        asyncio.run(
            run_demo(
                bootstrap,
                topic,
                partitions,
                rate,
                fault_every,
                duration,
                kafka_security(),
                replication_factor,
                writers=writers,
                restart_every_s=restart_every,
                compacted_topic=compacted_topic,
                at_rest_every_s=at_rest_every,
                app_id=app_id,
                tracing=tracing,
            )
        )
    except KeyboardInterrupt:
        pass


def _sampling(value: str | None) -> str | None:
    from kdiv.trace.sampling import SamplingError, SamplingSpec

    if value is not None:
        try:
            SamplingSpec.parse(value)
        except SamplingError as bad:
            raise click.BadParameter(str(bad)) from None
    return value


@main.command()
@click.argument("source")
@click.argument("sink")
@bootstrap_option
@click.option("--group", required=True, help="The processors' consumer group (the route's hop).")
@click.option(
    "--fault",
    type=click.Choice(["none", "drop", "duplicate"]),
    default="none",
    show_default=True,
    help="drop: the buffer is committed but not written at each rebalance; duplicate: every 5th batch twice.",
)
@click.option("--instances", type=click.IntRange(min=1), default=2, show_default=True, help="Processors at once.")
@click.option(
    "--restart-every",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds between restarts of the oldest processor (a rebalance; 0: never).",
)
@duration_option
@click.option("--partitions", type=click.IntRange(min=1), default=4, show_default=True, help="Of SINK, if created.")
@replication_factor_option("SINK")
def processor(
    source: str,
    sink: str,
    bootstrap: str,
    group: str,
    fault: str,
    instances: int,
    restart_every: float,
    duration: float,
    partitions: int,
    replication_factor: int,
) -> None:
    """A pipeline hop SOURCE -> SINK that forwards trace headers, with an optional fault, for the
    pipeline audit's demo: what it dropped and duplicated is logged at each restart."""
    import logging

    from kdiv.dev.processor import run_processors

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from kdiv.dev.sigterm import exit_at_sigterm

    exit_at_sigterm("kdiv processor")
    with kafka_errors_as_messages(bootstrap):
        try:
            ledger = asyncio.run(
                run_processors(
                    bootstrap,
                    source,
                    sink,
                    group,
                    fault=fault,
                    instances=instances,
                    restart_every_s=restart_every,
                    duration_s=duration,
                    partitions=partitions,
                    security=kafka_security(),
                    replication_factor=replication_factor,
                )
            )
        except KeyboardInterrupt:
            return
    click.echo(
        f"kdiv processor: {sum(ledger.writes.values())} records written, {len(ledger.lost)} dropped, "
        f"{len(ledger.duplicated)} duplicated",
        err=True,
    )


@main.command("changefeed-demo")
@bootstrap_option
@click.option("--topic", default="kdiv-cdc", show_default=True, help="Topic to write (created if missing).")
@click.option("--partitions", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--rate", type=click.FloatRange(min=0.1), default=20.0, show_default=True, help="Rows per second.")
@click.option(
    "--fault-rate",
    type=click.FloatRange(0, 1),
    default=0.01,
    show_default=True,
    help="Share of rows planted corrupt (half changed after their checksum, half flagged by TiCDC).",
)
@click.option("--delete-rate", type=click.FloatRange(0, 1), default=0.05, show_default=True, help="Share of DELETEs.")
@click.option("--rows", type=click.IntRange(min=0), default=0, show_default=True, help="Rows to write (0: forever).")
def changefeed_demo(
    bootstrap: str, topic: str, partitions: int, rate: float, fault_rate: float, delete_rate: float, rows: int
) -> None:
    """Write a TiCDC-shaped Avro changefeed (row checksums, schemas in the registry) with
    occasional corrupt rows, for the worker's and the nightly job's TiCDC checks."""
    import logging

    from kdiv.config.settings import RegistrySettings
    from kdiv.dev.changefeed import write_changefeed

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from kdiv.dev.sigterm import exit_at_sigterm

    exit_at_sigterm("kdiv changefeed-demo")
    try:
        asyncio.run(
            write_changefeed(
                bootstrap,
                topic,
                RegistrySettings.from_env(os.environ),
                rows=rows or None,
                partitions=partitions,
                rate_per_s=rate,
                mismatch_rate=fault_rate / 2,
                flag_rate=fault_rate / 2,
                delete_rate=delete_rate,
                seed=int(time.time()),
                security=kafka_security(),
            )
        )
    except KeyboardInterrupt:
        pass


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9092,
    show_default=True,
    help="The first node's port; node n listens on PORT+n-1 (0: any free ones).",
)
@click.option("--nodes", type=click.IntRange(1, 9), default=1, show_default=True, help="Broker processes (3: RF 3).")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the cluster's logs here across restarts (default: a temporary directory, removed at stop).",
)
@click.option(
    "--tansu",
    is_flag=True,
    help="Run the in-memory stand-in (Tansu) instead: for machines without a Java runtime only.",
)
def broker(host: str, port: int, nodes: int, data_dir: str | None, tansu: bool) -> None:
    """Run a development broker until interrupted: Apache Kafka in KRaft mode (from `kdiv fetch-jars`)."""
    from kdiv.dev.ports import BrokerError

    try:
        if tansu:
            from kdiv.dev.tansu import TansuBroker

            if nodes != 1 or data_dir is not None:
                raise click.UsageError("--tansu runs one in-memory node: no --nodes or --data-dir")
            TansuBroker(host=host, port=port, log_level=os.environ.get("RUST_LOG", "warn")).run_forever()
        else:
            from kdiv.dev.broker import KafkaCluster

            KafkaCluster(nodes, host=host, port=port, data_dir=data_dir).run_forever()
    except BrokerError as failed:
        raise CommandFailed(str(failed)) from None


@main.command("wait-for-broker")
@bootstrap_option
@click.option("--timeout", type=click.FloatRange(min=0), default=120.0, show_default=True, help="Seconds to wait.")
def wait_for_broker(bootstrap: str, timeout: float) -> None:
    """Wait until a broker at BOOTSTRAP (PLAINTEXT) serves clients; exit 2 after --timeout.

    For the development stack, whose services start together while the broker takes seconds.
    """
    from kdiv.dev.ports import live_brokers

    addresses = [address.strip().rsplit(":", 1) for address in bootstrap.split(",") if address.strip()]
    deadline = time.monotonic() + timeout
    while True:
        for host, port in addresses:
            answer = live_brokers(host.strip("[]"), int(port))
            if answer is not None and answer[1]:
                return
        if time.monotonic() >= deadline:
            raise CommandFailed(f"no broker serving at {redacted(bootstrap)} after {timeout:.0f} s")
        time.sleep(0.2)


@main.command("fetch-jars")
@click.option("--maven", default="mvn", show_default=True, help="The Maven executable.")
def fetch_jars(maven: str) -> None:
    """Fetch the Java components kdiv runs (Apache Kafka's broker and command-line tools, Spark's
    kafka connector for the nightly job, Apicurio Registry for the registry tests) into kdiv's
    cache, with Maven, and build kdiv's own Java programs there (its producer interceptor, its
    Kafka Streams hop).

    The one step that downloads; run it once after installing kdiv. Prints each bundle's directory.
    """
    from kdiv.maven import BUNDLES, JarsError
    from kdiv.maven.project import PROJECTS

    try:
        for bundle in BUNDLES:
            click.echo(bundle.fetch(maven))
        for project in PROJECTS:
            click.echo(project.build(maven))
    except JarsError as failed:
        raise CommandFailed(str(failed)) from None


@main.command()
@bootstrap_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8081, show_default=True, help="Port.")
@click.option("--topic", default="_schemas", show_default=True, help="The registry's log topic (Confluent's format).")
@click.option(
    "--apicurio",
    is_flag=True,
    help="Run Apicurio Registry (in memory, from `kdiv fetch-jars`) instead; prints its Confluent API base URL.",
)
def registry(bootstrap: str, host: str, port: int, topic: str, apicurio: bool) -> None:
    """Run the development Schema Registry (Confluent REST subset, Avro) until interrupted."""
    if apicurio:
        from kdiv.dev.apicurio import ApicurioError, ApicurioRegistry

        try:
            ApicurioRegistry(host=host, port=port).run_forever()
        except ApicurioError as failed:
            raise CommandFailed(str(failed)) from None
        return
    import logging

    from kdiv.dev.registry.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kdiv.dev.sigterm import exit_at_sigterm

    exit_at_sigterm("kdiv registry")
    try:
        with kafka_errors_as_messages(bootstrap):
            asyncio.run(serve(bootstrap, host, port, topic, kafka_security()))
    except KeyboardInterrupt:
        pass


@main.group()
def schemas() -> None:
    """Schema Registry checks (registry settings: KDIV_SCHEMA_REGISTRY_*)."""


@schemas.command("check")
@click.argument("topic")
@bootstrap_option
@click.option(
    "--strategy",
    type=click.Choice(["topic", "record", "topic_record"]),
    default="topic",
    show_default=True,
    help="The subject name strategy the topic's deserializers use.",
)
@click.option("--keys", is_flag=True, help="Check the keys' framing instead of the values'.")
@click.option("--repair", is_flag=True, help="Register each mismatched schema under the expected subject.")
def schemas_check(topic: str, bootstrap: str, strategy: str, keys: bool, repair: bool) -> None:
    """Check every schema id TOPIC's records carry is registered under its expected subject.

    For a kdiv changelog (<app id>-state-p<N>-changelog) this is the post-restore check of
    the worker, run by hand. Exit status: 0 all found where expected, 1 mismatches or
    unknown ids remain, 2 the registry or the broker could not be read.
    """
    from kdiv.config.settings import RegistrySettings, SettingsError
    from kdiv.offline.schemascan import check_topic
    from kdiv.offline.schemascan import repair as repair_id
    from kdiv.registry.client import RegistryError, SchemaRegistry

    security = kafka_security()

    async def run() -> int:
        registry = SchemaRegistry(RegistrySettings.from_env(os.environ))
        try:
            verdicts = await check_topic(registry, bootstrap, topic, strategy, keys=keys, security=security)
            for verdict in verdicts:
                click.echo(verdict.line(topic))
            wrong = [v for v in verdicts if v.verdict is not None]
            if repair and wrong:
                for verdict in wrong:
                    if verdict.verdict == "SUBJECT_MISMATCH" and verdict.expected_subject:
                        async for line in repair_id(registry, verdict):
                            click.echo(line)
                verdicts = await check_topic(registry, bootstrap, topic, strategy, keys=keys, security=security)
                wrong = [v for v in verdicts if v.verdict is not None]
            click.echo(f"{len(verdicts)} schema ids in {topic}: {len(wrong)} not where their readers look")
            return 1 if wrong else 0
        finally:
            await registry.close()

    from aiokafka.errors import KafkaError

    from kdiv.kafka.failures import failure_text, refusals_explained

    try:
        with refusals_explained():
            code = asyncio.run(run())
    except SettingsError as bad:
        raise CommandFailed(str(bad)) from None
    except (RegistryError, LookupError) as failed:
        _traceback_when_debugging()
        click.echo(f"error: {failed}", err=True)
        sys.exit(BAD_INPUT_OR_UNREACHABLE)
    except (KafkaError, OSError) as failed:
        _traceback_when_debugging()
        click.echo(f"error: Kafka at {redacted(bootstrap)}: {failure_text(failed)}", err=True)
        sys.exit(BAD_INPUT_OR_UNREACHABLE)
    sys.exit(code)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option(
    "--master",
    default="local[2]",
    show_default=True,
    help="Spark master (local[N], spark://host:7077, yarn, k8s://...).",
)
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE", help="Spark configuration, repeatable.")
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def reconcile(master: str, spark_conf: tuple[str, ...], job_args: tuple[str, ...]) -> None:
    """Nightly reconciliation through spark-submit: tables vs topics at rest, state schemas vs the registry.

    Every other option goes to the job (`kdiv reconcile -- --help` lists them), e.g.
    `kdiv reconcile --out reports --topics orders`. Exit status: 0 clean, 1 discrepancies,
    2 failure.
    """
    from kdiv.reconcile.submit import SubmitError, run

    conf = {}
    for item in spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--conf")
        conf[key] = value
    try:
        sys.exit(run(master, list(job_args), conf))
    except SubmitError as missing:
        raise CommandFailed(str(missing)) from None


@main.command("reconcile-loop", context_settings={"ignore_unknown_options": True})
@bootstrap_option
@click.option(
    "--first-after", type=click.FloatRange(min=0), default=90.0, show_default=True, help="Seconds before the first run."
)
@click.option("--every", type=click.FloatRange(min=1), default=86400.0, show_default=True, help="Seconds between runs.")
@click.option(
    "--retry-after",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds before retrying a failed run.",
)
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=7200.0, show_default=True, help="Seconds a run may take."
)
@click.argument("reconcile_args", nargs=-1, type=click.UNPROCESSED)
def reconcile_loop(
    bootstrap: str,
    first_after: float,
    every: float,
    retry_after: float,
    timeout: float,
    reconcile_args: tuple[str, ...],
) -> None:
    """Run `kdiv reconcile RECONCILE_ARGS...` after --first-after seconds, then every --every seconds,
    for the development stack: while the broker at --bootstrap does not answer it waits (saying so
    once), and runs as soon as it is back. E.g. `kdiv reconcile-loop -- --out reconcile-reports`."""
    import logging

    from kdiv.dev.nightly import NightlyLoop, broker_answers, run_bounded
    from kdiv.dev.sigterm import exit_at_sigterm

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    exit_at_sigterm("kdiv reconcile-loop")
    command = [sys.executable, "-m", "kdiv.cli", "reconcile", *reconcile_args]
    loop = NightlyLoop(
        broker_up=lambda: broker_answers(bootstrap),
        run=lambda: run_bounded(command, timeout),
        every_s=every,
        retry_after_s=retry_after,
    )
    try:
        loop.forever(first_after)
    except KeyboardInterrupt:
        pass


# Last, so `python -m kdiv.cli` sees every command.
if __name__ == "__main__":
    main()
