"""Log rewinds: validated offsets whose records are no longer in the log.

Four signals (`kdiv.worker.live` says what a rewind does to the state): a topic id that
changed (`check_topic_ids` after an assignment, `recreated_topics` before a flush),
a high watermark below an offset validated, confirmed by the partition's leader
(`check_high_watermarks`), and a batch of a newer leader epoch whose leader says the epoch
last validated ends before the next offset to validate (`log_diverged`, KIP-320). The
content signal is `LiveValidation`'s own. Rewinds found become incidents in the unit of work
(`note_rewinds`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

from aiokafka.errors import KafkaError
from faust.types import TP

from kdiv.kafka.discovery import ClusterView, WatchedTopic
from kdiv.kafka.topicids import TopicIds
from kdiv.worker.faustcompat.epochs import NO_EPOCH, EpochsUnsupported, batch_leader_epochs
from kdiv.worker.faustcompat.transport import cap_next_seek, leader_epoch_ends, restart_at, restart_from_beginning
from kdiv.worker.incidents import rewind_incident
from kdiv.worker.live import LiveValidation
from kdiv.worker.unit import UnitOfWork

log = logging.getLogger("kdiv.worker")

# How long a commit waits for a partition leader to confirm that its log ends lower than
# the last fetch said (`check_high_watermarks`); unanswered, it asks at the next commit.
HIGHWATER_CONFIRM_TIMEOUT_S = 5.0
# How long a batch of a new leader epoch waits for its leader to say where the last epoch
# validated ends (`log_diverged`); unanswered, the batch is fetched again.
LEADER_EPOCH_TIMEOUT_S = 5.0


def fetched_highwater(app: Any, topic: str, partition: int) -> int | None:
    """The partition's high watermark from the consumer's last fetch, None when unknown."""
    if app.consumer is None:
        return None
    try:
        highwater = app.consumer.highwater(TP(topic, partition))
    except (KeyError, AttributeError):
        return None
    return None if highwater is None or highwater < 0 else highwater


class RewindChecks:
    """The rewind signals of the worker's partitions, asked of the consumer and the brokers."""

    def __init__(
        self,
        app: Any,
        live: LiveValidation,
        unit: UnitOfWork,
        stats: Any,
        clock: Callable[[], int],
        *,
        detects_rewinds: bool = True,
        topic_ids: TopicIds | None = None,
        cluster: ClusterView | None = None,
        assigned_partitions: Callable[[], list[tuple[str, int]]] = list,
    ) -> None:
        self.app = app
        self.live = live
        self.unit = unit
        self.stats = stats
        self.clock = clock
        # Venice's semantics knows no log rewinds: its verdicts alone, as Venice gives them.
        self.detects_rewinds = detects_rewinds
        self.topic_ids = topic_ids
        self.cluster = cluster
        self.assigned_partitions = assigned_partitions
        # The leader epoch signal of rewinds (`log_diverged`): per watched partition, the
        # leader epoch of the last record validated, and that record's offset. In memory:
        # a worker started afresh learns it from its first batch (the other signals cover
        # what came before). Kept when the partition is revoked: it still holds when the
        # partition comes back with the state saved at that offset (a rebalance, as a
        # broker failure often brings), and not otherwise (`known_epoch`).
        self.checks_leader_epochs = detects_rewinds
        self.leader_epochs: dict[tuple[str, int], tuple[int, int]] = {}

    async def check_topic_ids(self, partition_count: int) -> None:
        """After an assignment: loaded partitions of a topic deleted and created again since
        their state was saved are rewound. Every partition with saved state resumes at the
        first offset it has not validated when its committed offset is past it (after a
        rewind that offset counts records of the old log)."""
        loaded = [
            (t, p)
            for t, p in self.assigned_partitions()
            if self.live.is_loaded(t, p)
            and cast(WatchedTopic, cast(ClusterView, self.cluster).topic(t)).partitions == partition_count
        ]
        if not loaded:
            return
        ids = await cast(TopicIds, self.topic_ids).current({t for t, _ in loaded}) if self.detects_rewinds else {}
        for topic, partition in loaded:
            if topic in ids:
                self.live.check_topic_id(topic, partition, ids[topic])
        caps = {}
        for topic, partition in loaded:
            resume = self.live.resume_offset(topic, partition)
            if resume is not None:
                caps[TP(topic, partition)] = resume
        if caps and self.app.consumer is not None:
            cap_next_seek(self.app.consumer, caps)
        self.note_rewinds()

    async def recreated_topics(self, keys: Sequence[tuple[str, int]]) -> list[tuple[tuple[str, int], str]]:
        """Before a flush: of `keys` (the partitions with unflushed work), those whose topic
        was deleted and created again since their state was saved, each with its topic's id
        now (`kdiv.worker.divtopics` reads them again). A partition whose topic id is seen
        for the first time learns it (saved with this flush)."""
        if not keys or not self.detects_rewinds:
            return []
        ids = await cast(TopicIds, self.topic_ids).current({t for t, _ in keys})
        recreated = []
        for topic, partition in keys:
            part = self.live.validator.partitions.get((topic, partition))
            now_id = ids.get(topic)
            if part is None or now_id is None:
                continue
            if part.topic_id in (None, now_id):
                self.live.check_topic_id(topic, partition, now_id)
                continue
            recreated.append(((topic, partition), now_id))
        return recreated

    async def read_again_from_beginning(self, keys: Sequence[tuple[str, int]]) -> None:
        """Have the consumer read the partitions again from their beginning, now; the rewinds
        their reloaded state found are reported."""
        if keys and self.app.consumer is not None:
            await restart_from_beginning(self.app.consumer, [TP(*key) for key in keys])
        self.note_rewinds()

    async def check_high_watermarks(self) -> None:
        """A partition whose log now ends below an offset already validated was truncated.

        The fetch's high watermark only raises the suspicion: a leader just elected cleanly
        serves fetches with a high watermark below its predecessor's until its followers
        have fetched again (they learn it lazily), though it lost nothing. The leader's
        ListOffsets answer decides: it refuses (OFFSET_NOT_AVAILABLE, KIP-207) until its
        high watermark covers its epoch's start, and from then on a clean leader's is no
        lower than its predecessor's. A suspicion not confirmed is looked at again at the
        next commit. Where the leader epoch of the last record validated ends in the leader's
        log (when known) says where the log was cut, also when records written since have
        refilled it past the offsets validated."""
        if not self.detects_rewinds:
            return
        suspects: dict[TP, int] = {}
        for (topic, partition), part in self.live.validator.partitions.items():
            highwater = fetched_highwater(self.app, topic, partition)
            if highwater is not None and highwater <= part.last_offset:
                suspects[TP(topic, partition)] = highwater
        if not suspects or self.app.consumer is None:
            return
        try:
            ends = await asyncio.wait_for(self.app.consumer.highwaters(*suspects), HIGHWATER_CONFIRM_TIMEOUT_S)
        except (TimeoutError, KafkaError) as unanswered:
            log.info(
                "log ends of %s not confirmed yet (%r): asked again at the next commit", list(suspects), unanswered
            )
            return
        answered: dict[TP, tuple[int, int]] = {}
        for tp, fetched in sorted(suspects.items()):
            end = ends.get(tp)
            if (tp.topic, tp.partition) in self.live.validator.partitions and end is not None and end >= 0:
                answered[tp] = (end, fetched)
        if not answered:
            return
        # The log's end now is where it was cut only while nothing has been written since, and
        # a log refilled past the offsets validated no longer looks cut at all: where the
        # leader epoch last validated ends in the leader's log is where it diverged.
        diverged = await self._epoch_ends(list(answered))
        if diverged is None:
            return
        truncated: dict[TP, int] = {}
        for tp, (end, fetched) in answered.items():
            state = self.live.validator.partitions[(tp.topic, tp.partition)]
            cuts = [offset for offset in (end, diverged.get(tp)) if offset is not None and offset <= state.last_offset]
            if not cuts:
                log.info(
                    "%s[%d]: a fetch's high watermark %d lay below offset %d validated; its leader says the "
                    "log ends at %d, and nothing validated is gone from it: no rewind",
                    tp.topic,
                    tp.partition,
                    fetched,
                    state.last_offset,
                    end,
                )
                continue
            first = min(cuts)
            diverged_at = f"it diverged from what was validated at offset {first}, where the leader epoch of the last record validated ends in its log"
            if end > state.last_offset:
                detail = (
                    f"a fetch said the log ends at offset {fetched}, below offset {state.last_offset} validated; it "
                    f"ends at {end} now (its leader's answer), refilled since, and {diverged_at}"
                )
            else:
                detail = (
                    f"the log now ends at offset {end} (its leader's answer; the last fetch said {fetched}), below "
                    f"offset {state.last_offset} validated" + (f", and {diverged_at}" if first < end else "")
                )
            self.live.rewind(tp.topic, tp.partition, first, "high watermark", detail)
            truncated[tp] = first
        if not truncated:
            return
        # Read on from there: the consumer's position, and what Faust takes as already read,
        # may lie past it (a fetch out of range starts over at the earliest offset, whose
        # records Faust then drops as read), and the records written there since are new.
        await restart_at(self.app.consumer, truncated)

    async def _epoch_ends(self, tps: list[TP]) -> dict[TP, int] | None:
        """Where the leader epoch last validated ends in each partition leader's log, for the
        partitions whose epoch is known (OffsetForLeaderEpoch); None when not answered now."""
        epochs = {tp: self.known_epoch((tp.topic, tp.partition)) for tp in tps}
        epochs = {tp: epoch for tp, epoch in epochs.items() if epoch != NO_EPOCH}
        if not epochs or not self.checks_leader_epochs:
            return {}
        try:
            ends = await asyncio.wait_for(leader_epoch_ends(self.app.consumer, epochs), LEADER_EPOCH_TIMEOUT_S)
        except EpochsUnsupported as old:
            log.warning("%s: log rewinds are found without leader epochs", old)
            self.checks_leader_epochs = False
            return {}
        except (TimeoutError, KafkaError) as unanswered:
            log.info(
                "where the leader epochs %s end is not known yet (%r): asked at the next commit", epochs, unanswered
            )
            return None
        return {tp: end for tp, (_epoch, end) in ends.items() if end >= 0}

    def known_epoch(self, key: tuple[str, int]) -> int:
        """The leader epoch of the partition's last validated record, NO_EPOCH when not known:
        learnt of another record than the one its state ends at now (a rewind since, or
        another worker's progress while it was revoked)."""
        known = self.leader_epochs.get(key)
        part = self.live.validator.partitions.get(key)
        if known is None or part is None or known[1] != part.last_offset:
            return NO_EPOCH
        return known[0]

    def _learn_epoch(self, key: tuple[str, int], newest: int, records: Sequence) -> None:
        """The epoch of the batch's last record, which validating it makes the last validated
        one (only when it is new: replays of older epochs teach nothing)."""
        part = self.live.validator.partitions[key]
        if newest != NO_EPOCH and records and records[-1].offset > part.last_offset:
            self.leader_epochs[key] = (newest, records[-1].offset)

    async def log_diverged(self, key: tuple[str, int], records: Sequence) -> bool:
        """The leader epoch signal (KIP-320), before a batch is validated. Records of a leader
        epoch newer than the last batch validated mean the partition changed leaders since:
        the leader says where the epoch last validated ends in its log, and an end below the
        next offset to validate means the records from there on, validated, are not in the
        log. Those offsets are rewound and the partition is read again from that end: the
        batch is dropped (True), its records fetched again in order. Exact, unlike the high
        watermark, even when new records have already filled the log past the old end."""
        epochs = batch_leader_epochs(records)
        part = self.live.validator.partitions.get(key)
        if not epochs or part is None:
            return False
        newest = epochs[-1][1]
        known = self.known_epoch(key)
        if known == NO_EPOCH or newest <= known:
            self._learn_epoch(key, newest, records)
            return False
        tp = TP(*key)
        position = part.last_offset + 1
        try:
            ends = await asyncio.wait_for(leader_epoch_ends(self.app.consumer, {tp: known}), LEADER_EPOCH_TIMEOUT_S)
        except EpochsUnsupported as old:
            log.warning("%s: log rewinds are found without leader epochs", old)
            self.checks_leader_epochs = False
            return False
        except (TimeoutError, KafkaError) as unanswered:
            # Not validated unchecked: fetched again from the same offset, asked again then.
            log.info("where leader epoch %d of %s[%d] ends is not known yet (%r)", known, *key, unanswered)
            await restart_at(self.app.consumer, {tp: position})
            return True
        epoch, end = ends.get(tp, (NO_EPOCH, -1))
        if not 0 <= end < position:
            self._learn_epoch(key, newest, records)
            return False
        self.live.rewind(
            key[0],
            key[1],
            end,
            "leader epoch",
            f"leader epoch {known}, the last one validated, ends at offset {end} in the leader's log "
            f"(OffsetForLeaderEpoch{'' if epoch == known else f' answered with epoch {epoch}'}; "
            f"the log is in epoch {newest} now)",
        )
        await restart_at(self.app.consumer, {tp: end})
        self.note_rewinds()
        return True

    def note_rewinds(self) -> None:
        """Rewinds found by `live` become incidents, written with their partitions' next unit."""
        now = self.clock()
        for rewind in self.live.take_rewinds():
            key = (rewind.topic, rewind.partition)
            incident = rewind_incident(rewind, now)
            self.unit.add_incident(key, incident)
            self.stats.log_rewinds += 1
