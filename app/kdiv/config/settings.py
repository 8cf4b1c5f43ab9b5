"""Worker settings, read from ``KDIV_*`` environment variables (every one in docs/settings.md).

Every bad value is reported with the variable's name; nothing falls back silently.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kdiv.config.env import PREFIX, EnvReader, SettingsError
from kdiv.config.redact import redacted, split_userinfo
from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.div.validator import DEFAULT_WINDOW
from kdiv.ticdc.timestamps import TimestampMode, load_zone
from kdiv.trace.routes import Route, RouteError, parse_routes
from kdiv.trace.sampling import SamplingError, SamplingSpec

GUARANTEES = ("at_least_once", "exactly_once")
PHASES = ("stream", "push")
SEMANTICS = ("exact", "venice")
STRATEGIES = ("topic", "record", "topic_record")


# KDIV_SCHEMA_REGISTRY_URL=none: no registry (state framed with a local id, schemas unchecked).
NO_REGISTRY = "none"
# The least KDIV_RECENT_INCIDENTS_BYTES: above the largest incident read
# (kdiv.incident.bounds.MAX_INCIDENT_BYTES), so the newest is always held.
MIN_RECENT_INCIDENTS_BYTES = 1 << 20


@dataclass(frozen=True)
class RegistrySettings:
    """How to reach the Schema Registry (KDIV_SCHEMA_REGISTRY_*)."""

    url: str = "http://127.0.0.1:8081"
    basic_auth: str = field(default="", repr=False)  # user:password
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    timeout_s: float = 5.0

    @property
    def configured(self) -> bool:
        """False when the worker runs without a registry."""
        return self.url != NO_REGISTRY

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RegistrySettings:
        env = EnvReader(environ)
        given = env.str("SCHEMA_REGISTRY_URL", cls.url)
        if given.strip().lower() == NO_REGISTRY:
            return cls(NO_REGISTRY)
        # Credentials in the URL become basic auth: the URL kdiv keeps, shows and logs has none.
        split = [split_userinfo(u) for u in given.split(",")]
        url = ",".join(u for u, _ in split)
        if not all(u.startswith(("http://", "https://")) for u, _ in split):
            raise SettingsError(
                f"{PREFIX}SCHEMA_REGISTRY_URL={redacted(url)!r} is not an http(s):// URL (or a comma-separated list)"
            )
        in_url = {userinfo for _, userinfo in split if userinfo is not None}
        basic_auth = env.str("SCHEMA_REGISTRY_BASIC_AUTH", "")
        if in_url and (basic_auth or len(in_url) > 1):
            raise SettingsError(
                f"{PREFIX}SCHEMA_REGISTRY_URL={url!r} carries credentials in "
                + (
                    "more than one form"
                    if len(in_url) > 1
                    else f"its URL and {PREFIX}SCHEMA_REGISTRY_BASIC_AUTH is set"
                )
                + f": give them once, as {PREFIX}SCHEMA_REGISTRY_BASIC_AUTH=USER:PASSWORD"
            )
        if in_url:
            basic_auth = next(iter(in_url))
        if basic_auth and ":" not in basic_auth:
            raise SettingsError(f"{PREFIX}SCHEMA_REGISTRY_BASIC_AUTH must be USER:PASSWORD")
        ca, cert, key = (env.file(f"SCHEMA_REGISTRY_{name}") for name in ("CA", "CERT", "KEY"))
        if bool(cert) != bool(key):
            raise SettingsError(
                f"{PREFIX}SCHEMA_REGISTRY_CERT and {PREFIX}SCHEMA_REGISTRY_KEY go together (a client certificate and its key)"
            )
        if (ca or cert) and not url.startswith("https://"):
            raise SettingsError(
                f"{PREFIX}SCHEMA_REGISTRY_CA/CERT are set but {PREFIX}SCHEMA_REGISTRY_URL={url} is not https://"
            )
        return cls(url, basic_auth, ca, cert, key, env.float("SCHEMA_REGISTRY_TIMEOUT_S", cls.timeout_s))


def _bootstrap(servers: str) -> str:
    """KDIV_BOOTSTRAP, refused when it carries credentials: Kafka clients take host:port, and
    the value is shown in error messages, which must not show a password."""
    if "@" in servers:
        raise SettingsError(
            f"{PREFIX}BOOTSTRAP={redacted(servers)!r} carries credentials (user:password@): give host:port "
            f"only, and the credentials as {PREFIX}SASL_USERNAME and {PREFIX}SASL_PASSWORD"
        )
    return servers


TICDC_PROTOCOLS = ("avro", "simple")


@dataclass(frozen=True)
class ChangefeedSettings:
    """TiCDC changefeed topics (KDIV_TICDC_*): verified by row checksum, not by DIV headers."""

    topics: tuple[str, ...] = ()
    topic_pattern: re.Pattern | None = None
    # topic -> "avro" | "simple"; "*": every changefeed topic not named.
    protocols: Mapping[str, str] = field(default_factory=dict)
    # The TiCDC server's time zone (TIMESTAMP columns are rendered in it before hashing).
    time_zone: str = "UTC"
    # "utc" (TiCDC v7.1.4 on) or "as_sent" (earlier releases hashed the rendered value).
    timestamp_mode: str = TimestampMode.UTC.value

    @property
    def configured(self) -> bool:
        return bool(self.topics) or self.topic_pattern is not None

    @property
    def uses_avro(self) -> bool:
        """Some changefeed topic may be Avro (which needs the registry's writer schemas)."""
        return self.protocol_of("*") == "avro" or "avro" in self.protocols.values()

    def declares(self, topic: str) -> bool:
        if self.topic_pattern is not None:
            return self.topic_pattern.fullmatch(topic) is not None
        return topic in self.topics

    def protocol_of(self, topic: str) -> str:
        return self.protocols.get(topic) or self.protocols.get("*") or "avro"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ChangefeedSettings:
        env = EnvReader(environ)
        topics = tuple(t.strip() for t in env.str("TICDC_TOPICS", "").split(",") if t.strip())
        pattern = _pattern(env, "TICDC_TOPIC_PATTERN")
        if topics and pattern:
            raise SettingsError(f"set {PREFIX}TICDC_TOPICS or {PREFIX}TICDC_TOPIC_PATTERN, not both")
        time_zone = env.str("TICDC_TIME_ZONE", cls.time_zone)
        try:
            load_zone(time_zone)
        except ValueError as bad:
            raise SettingsError(f"{PREFIX}TICDC_TIME_ZONE={time_zone!r}: {bad}") from None
        return cls(
            topics=topics,
            topic_pattern=pattern,
            protocols=env.mapping(  # type: ignore[arg-type]  # values parsed to a protocol name
                "TICDC_PROTOCOL", lambda v: v if v in TICDC_PROTOCOLS else None, "avro or simple"
            ),
            time_zone=time_zone,
            timestamp_mode=env.choice(
                "TICDC_TIMESTAMP_MODE", tuple(m.value for m in TimestampMode), cls.timestamp_mode
            ),
        )


def _pattern(env: EnvReader, name: str) -> re.Pattern | None:
    text = env.str(name, "")
    if not text:
        return None
    try:
        return re.compile(text)
    except re.error as bad:
        raise SettingsError(f"{PREFIX}{name}={text!r} is not a regex: {bad}") from None


@dataclass(frozen=True)
class AuditSettings:
    """The pipeline audit (KDIV_ROUTES, KDIV_TRACE_*): traced records followed across hops."""

    # "name=topic>group>topic[|topic]>group>topic;..." (kdiv.trace.routes), as given.
    routes_text: str = ""
    # After a processor's group has committed past a traced record, how long its output may
    # take to appear before the record is LOST.
    grace_ms: int = 30_000
    # A trace unresolved this long after it was first seen is reported UNRESOLVED and dropped.
    max_wait_ms: int = 6 * 3600 * 1000
    # Partitions of the observations topic (traces are judged where their id hashes to).
    partitions: int = 4
    offsets_poll_s: float = 2.0
    # The writers' sampling spec, when known: the views scale their counts by it.
    sampling_text: str = ""

    @property
    def configured(self) -> bool:
        return bool(self.routes_text.strip())

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AuditSettings:
        env = EnvReader(environ)
        routes_text = env.str("ROUTES", "")
        try:
            parse_routes(routes_text)
        except RouteError as bad:
            raise SettingsError(f"{PREFIX}ROUTES: {bad}") from None
        sampling_text = env.str("TRACE_SAMPLING", "")
        try:
            SamplingSpec.parse(sampling_text)
        except SamplingError as bad:
            raise SettingsError(f"{PREFIX}TRACE_SAMPLING: {bad}") from None
        return cls(
            routes_text=routes_text,
            grace_ms=int(env.float("TRACE_GRACE_S", cls.grace_ms / 1000) * 1000),
            max_wait_ms=int(env.float("TRACE_MAX_WAIT_S", cls.max_wait_ms / 1000) * 1000),
            partitions=env.int("TRACE_PARTITIONS", cls.partitions, minimum=1),
            offsets_poll_s=env.float("TRACE_OFFSETS_POLL_S", cls.offsets_poll_s),
            sampling_text=sampling_text,
        )

    @cached_property
    def sampling(self) -> SamplingSpec | None:
        """The writers' sampling, None when not given (rates then unknown)."""
        return SamplingSpec.parse(self.sampling_text) if self.sampling_text else None

    @cached_property
    def all_routes(self) -> tuple[Route, ...]:
        """Every route in full, file sinks included: what the nightly job checks at rest."""
        return parse_routes(self.routes_text) if self.configured else ()

    @cached_property
    def routes(self) -> tuple[Route, ...]:
        """The routes the worker judges live: each up to its last Kafka stage (`Route.live`), as
        the worker cannot observe files; a route whose one hop writes files is not among them."""
        return tuple(live for route in self.all_routes if (live := route.live()) is not None)

    @property
    def judged_live(self) -> bool:
        """Some route has a hop the worker can judge (not only hops writing files)."""
        return bool(self.routes)

    def route_topics(self) -> frozenset[str]:
        """The Kafka topics of every route (file sinks are no topics): watched, and DIV-validated."""
        return frozenset(topic for route in self.all_routes for topic in route.kafka_topics)


@dataclass(frozen=True)
class Settings:
    bootstrap: str = "127.0.0.1:9092"
    app_id: str = "kdiv"
    # Watched topics: explicit names, or a regex matched against the cluster's topics.
    topics: tuple[str, ...] = ()
    topic_pattern: re.Pattern | None = None
    data_dir: Path = Path("kdiv-data")
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    web_enabled: bool = True
    # Bearer token every web view but /health and /metrics requires ("": none, loopback only).
    web_token: str = field(default="", repr=False)
    web_allow_unauthenticated: bool = False
    # Host header names the views answer besides the bound and advertised host, localhost
    # names and IP literals ("*": any); a browser page of another name (DNS rebinding) is refused.
    web_allowed_hosts: tuple[str, ...] = ()
    # Host patterns (fnmatch, "host" or "host:port") of the workers this one forwards
    # requests to; () asks every group member.
    web_peers: tuple[str, ...] = ()
    # What a client may hold of the web server (docs/web-views.md#connections): a request
    # head whole within the header timeout of its first byte, a connection idle at most the
    # idle timeout, at most max_connections open; client faults logged as counts per interval.
    web_header_timeout_s: float = 10.0
    web_idle_timeout_s: float = 30.0
    web_max_connections: int = 256
    web_fault_log_interval_s: float = 60.0
    processing_guarantee: str = "at_least_once"
    # topic -> min.compaction.lag.ms; "*" applies to every topic not named. A topic in
    # neither is judged by its own cleanup.policy / min.compaction.lag.ms config.
    compaction_lag_ms: Mapping[str, int] = field(default_factory=dict)
    # Producers idle this long in data time are forgotten (Venice's maxAge; -1: never).
    max_age_ms: int = 7 * 24 * 3600 * 1000
    # Producers tracked per partition at most; past it the least recently seen are evicted
    # (0: no limit). kdiv's bound, not Venice's.
    producers_limit: int = 100_000
    # "exact" (LATE, DIVERGENT, one incident per gap, log rewinds) or Venice's verdicts alone.
    semantics: str = "exact"
    # Recent seqs per producer whose CRCs tell DUPLICATE from DIVERGENT (8 bytes each).
    seq_window: int = DEFAULT_WINDOW
    incident_topic: str = ""
    initial_phase: str = "stream"
    # Takeover after a worker dies takes about two session timeouts; see docs/worker.md#takeover.
    session_timeout_s: float = 6.0
    heartbeat_interval_s: float = 0.5
    standby_replicas: int = 1
    replication_factor: int = 1
    # Records validated at most between two state writes (written at every commit anyway).
    batch_max: int = 100_000
    # Fetched record bytes the worker's consumer holds at most, shared by its partitions
    # (docs/worker.md#memory): a backlog over 1,000 partitions was otherwise fetched whole.
    fetch_buffer_bytes: int = 64 << 20
    # Each table partition's RocksDB database: memtable size and count, block cache
    # (docs/worker.md#memory).
    rocksdb_write_buffer_bytes: int = 4 << 20
    rocksdb_write_buffers: int = 2
    rocksdb_block_cache_bytes: int = 8 << 20
    # All table partitions' memtables together (one budget for the worker, past which RocksDB
    # flushes the largest): with 1,000 partitions, per-database memtables alone held 200 MB.
    rocksdb_memtables_bytes: int = 64 << 20
    commit_interval_s: float = 1.0
    # Liveness bounds (docs/worker.md#liveness): each request of the worker's producer to the
    # broker, each commit of a unit of work (then written again), how long a partition with
    # a backlog may make no progress before it is `stalled`, how often the true log ends are
    # read, and how long a stop (SIGTERM) may take before the worker exits anyway.
    broker_timeout_s: float = 20.0
    commit_timeout_s: float = 30.0
    stall_s: float = 60.0
    progress_poll_s: float = 5.0
    stop_timeout_s: float = 8.0
    recent_incidents: int = 10_000
    # The incidents' records a worker holds for the views, in bytes (kdiv.worker.incidents.RecentIncidents).
    recent_incidents_bytes: int = 33_554_432  # 32 MiB
    # One log line per incident written (kdiv.worker.incident_log); off: the incidents topic only.
    log_incidents: bool = True
    kafka_security: KafkaSecurity = PLAINTEXT
    registry: RegistrySettings = field(default_factory=RegistrySettings)
    # Watched topics whose values carry Confluent's framing, checked against the registry
    # ("*": every watched topic), and the subject name strategy per topic ("*": default).
    schema_topics: tuple[str, ...] = ()
    subject_strategies: Mapping[str, str] = field(default_factory=dict)
    schema_check_keys: bool = False
    # Register kdiv's state schema under its changelog subject when a restore finds it
    # missing there (what ksqlDB's operators did by hand after KAFKA-10179); off: report only.
    schema_auto_repair: bool = False
    # How often open subject findings of the state are looked at again (a repair clears them).
    schema_recheck_s: float = 30.0
    # Where the nightly reconciliation writes its runs (`kdiv reconcile --out`): the views
    # serve the latest run's summary when set.
    reconcile_reports: Path | None = None
    # The nightly job reports records past the worker's committed offsets older than this
    # (written this long before it read the offsets) as NOT_VALIDATED; newer ones are lag.
    unvalidated_after_s: float = 300.0
    changefeeds: ChangefeedSettings = field(default_factory=ChangefeedSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)

    @property
    def incidents(self) -> str:
        return self.incident_topic or f"{self.app_id}-incidents"

    @property
    def observations(self) -> str:
        """The pipeline audit's observations topic (traced records seen, keyed by trace)."""
        return f"{self.app_id}-trace-observations"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        env = EnvReader(environ)
        topics = tuple(t.strip() for t in env.str("TOPICS", "").split(",") if t.strip())
        pattern = _pattern(env, "TOPIC_PATTERN")
        if topics and pattern:
            raise SettingsError(f"set {PREFIX}TOPICS or {PREFIX}TOPIC_PATTERN, not both")
        changefeeds = ChangefeedSettings.from_env(environ)
        audit = AuditSettings.from_env(environ)
        if not topics and not pattern and not changefeeds.configured and not audit.configured:
            raise SettingsError(
                f"no watched topics: set {PREFIX}TOPICS (names) or {PREFIX}TOPIC_PATTERN (regex), "
                f"or TiCDC changefeeds ({PREFIX}TICDC_TOPICS or {PREFIX}TICDC_TOPIC_PATTERN)"
            )
        settings = cls(
            bootstrap=_bootstrap(env.str("BOOTSTRAP", cls.bootstrap)),
            app_id=env.str("APP_ID", cls.app_id),
            topics=topics,
            topic_pattern=pattern,
            data_dir=Path(env.str("DATA_DIR", str(cls.data_dir))),
            web_host=env.str("WEB_HOST", cls.web_host),
            web_port=env.int("WEB_PORT", cls.web_port, minimum=0),
            web_enabled=env.bool("WEB_ENABLED", cls.web_enabled),
            web_token=env.web_token("WEB_TOKEN"),
            web_allow_unauthenticated=env.bool("WEB_ALLOW_UNAUTHENTICATED", False),
            web_allowed_hosts=env.host_names("WEB_ALLOWED_HOSTS"),
            web_peers=env.host_names("WEB_PEERS"),
            web_header_timeout_s=env.float("WEB_HEADER_TIMEOUT_S", cls.web_header_timeout_s),
            web_idle_timeout_s=env.float("WEB_IDLE_TIMEOUT_S", cls.web_idle_timeout_s),
            web_max_connections=env.int("WEB_MAX_CONNECTIONS", cls.web_max_connections, minimum=1),
            web_fault_log_interval_s=env.float("WEB_FAULT_LOG_INTERVAL_S", cls.web_fault_log_interval_s),
            processing_guarantee=env.choice("PROCESSING_GUARANTEE", GUARANTEES, cls.processing_guarantee),
            compaction_lag_ms=env.compaction_lags("COMPACTION_LAG_MS"),
            max_age_ms=env.int("MAX_AGE_MS", cls.max_age_ms, minimum=-1),
            producers_limit=env.int("PRODUCERS_LIMIT", cls.producers_limit, minimum=0),
            semantics=env.choice("SEMANTICS", SEMANTICS, cls.semantics),
            seq_window=env.int("SEQ_WINDOW", cls.seq_window, minimum=0),
            incident_topic=env.str("INCIDENT_TOPIC", ""),
            initial_phase=env.choice("INITIAL_PHASE", PHASES, cls.initial_phase),
            session_timeout_s=env.float("SESSION_TIMEOUT_S", cls.session_timeout_s),
            heartbeat_interval_s=env.float("HEARTBEAT_INTERVAL_S", cls.heartbeat_interval_s),
            standby_replicas=env.int("STANDBY_REPLICAS", cls.standby_replicas, minimum=0),
            replication_factor=env.int("REPLICATION_FACTOR", cls.replication_factor, minimum=1),
            batch_max=env.int("BATCH_MAX", cls.batch_max, minimum=1),
            fetch_buffer_bytes=env.int("FETCH_BUFFER_BYTES", cls.fetch_buffer_bytes, minimum=1 << 20),
            rocksdb_write_buffer_bytes=env.int(
                "ROCKSDB_WRITE_BUFFER_BYTES", cls.rocksdb_write_buffer_bytes, minimum=64 << 10
            ),
            rocksdb_write_buffers=env.int("ROCKSDB_WRITE_BUFFERS", cls.rocksdb_write_buffers, minimum=2),
            rocksdb_block_cache_bytes=env.int("ROCKSDB_BLOCK_CACHE_BYTES", cls.rocksdb_block_cache_bytes, minimum=0),
            rocksdb_memtables_bytes=env.int("ROCKSDB_MEMTABLES_BYTES", cls.rocksdb_memtables_bytes, minimum=1 << 20),
            commit_interval_s=env.float("COMMIT_INTERVAL_S", cls.commit_interval_s),
            broker_timeout_s=env.float("BROKER_TIMEOUT_S", cls.broker_timeout_s),
            commit_timeout_s=env.float("COMMIT_TIMEOUT_S", cls.commit_timeout_s),
            stall_s=env.float("STALL_S", cls.stall_s),
            progress_poll_s=env.float("PROGRESS_POLL_S", cls.progress_poll_s),
            stop_timeout_s=env.float("STOP_TIMEOUT_S", cls.stop_timeout_s),
            recent_incidents=env.int("RECENT_INCIDENTS", cls.recent_incidents, minimum=1),
            recent_incidents_bytes=env.int(
                "RECENT_INCIDENTS_BYTES", cls.recent_incidents_bytes, minimum=MIN_RECENT_INCIDENTS_BYTES
            ),
            log_incidents=env.bool("LOG_INCIDENTS", cls.log_incidents),
            kafka_security=KafkaSecurity.from_env(environ),
            registry=RegistrySettings.from_env(environ),
            schema_topics=tuple(t.strip() for t in env.str("SCHEMA_TOPICS", "").split(",") if t.strip()),
            subject_strategies=env.mapping(  # type: ignore[arg-type]  # values parsed to a strategy name
                "SUBJECT_STRATEGY", lambda v: v if v in STRATEGIES else None, "topic, record or topic_record"
            ),
            schema_check_keys=env.bool("SCHEMA_CHECK_KEYS", False),
            schema_auto_repair=env.bool("SCHEMA_AUTO_REPAIR", False),
            schema_recheck_s=env.float("SCHEMA_RECHECK_S", cls.schema_recheck_s),
            reconcile_reports=Path(env.str("RECONCILE_REPORTS", "")) if env.str("RECONCILE_REPORTS", "") else None,
            unvalidated_after_s=env.float("UNVALIDATED_AFTER_S", cls.unvalidated_after_s),
            changefeeds=changefeeds,
            audit=audit,
        )
        if changefeeds.configured and not settings.registry.configured and changefeeds.uses_avro:
            raise SettingsError(
                f"{PREFIX}TICDC_PROTOCOL is avro for some changefeed topics, whose writer schemas are in the "
                f"registry, but {PREFIX}SCHEMA_REGISTRY_URL=none: set a registry, or "
                f"{PREFIX}TICDC_PROTOCOL=simple"
            )
        if not math.isfinite(settings.unvalidated_after_s):
            raise SettingsError(f"{PREFIX}UNVALIDATED_AFTER_S={settings.unvalidated_after_s} must be a finite number")
        if settings.heartbeat_interval_s * 3 > settings.session_timeout_s:
            raise SettingsError(
                f"{PREFIX}HEARTBEAT_INTERVAL_S={settings.heartbeat_interval_s} must be at most a third of "
                f"{PREFIX}SESSION_TIMEOUT_S={settings.session_timeout_s}"
            )
        if (
            settings.web_enabled
            and not settings.web_token
            and not settings.web_allow_unauthenticated
            and not is_loopback(settings.web_host)
        ):
            raise SettingsError(
                f"{PREFIX}WEB_HOST={settings.web_host} is reachable from other hosts, but {PREFIX}WEB_TOKEN is "
                f"not set: set a token, bind to 127.0.0.1, or set {PREFIX}WEB_ALLOW_UNAUTHENTICATED=true"
            )
        return settings

    def checks_schemas_of(self, topic: str) -> bool:
        return "*" in self.schema_topics or topic in self.schema_topics

    def subject_strategy(self, topic: str) -> str:
        return self.subject_strategies.get(topic) or self.subject_strategies.get("*") or "topic"

    def watches(self, topic: str) -> bool:
        """True for a watched topic (never one of kdiv's own topics)."""
        own = topic.startswith(f"{self.app_id}-") and (topic.endswith("-changelog") or "-__assignor-" in topic)
        if own or topic in (self.incidents, self.observations) or topic.startswith("__"):
            return False
        if self.changefeeds.declares(topic) or topic in self.audit.route_topics():
            return True
        if self.topic_pattern is not None:
            return self.topic_pattern.fullmatch(topic) is not None
        return topic in self.topics

    def is_changefeed(self, topic: str) -> bool:
        """A watched TiCDC changefeed topic: verified by row checksum, not by DIV."""
        return self.changefeeds.declares(topic)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve to any interface
        return False
