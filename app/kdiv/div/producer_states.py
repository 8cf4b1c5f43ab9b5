"""One partition's producer states, with no Python object per idle producer.

An active producer's state is a `Segment` object (it is touched per record). An idle one is
its packed form (`Segment.pack`), kept with its GUID inside a shared bucket: one bytes object
per bucket of about `_BUCKET_LOAD` producers, in a dict keyed by the GUID's hash. A dict of
GUID -> packed bytes spent about 150 bytes per idle producer on the key object, the value's
object header and the dict entry; a bucket spends about 20 (its share of one such triple).

Reading an idle entry walks its bucket (a few microseconds): that happens when the producer
becomes active again, and for views that list producers. Buckets are keyed by `hash(guid)`,
which is salted per process: GUIDs come from outside, and chosen ones must not fill a bucket.

Pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kdiv.div.segment import Segment

# An entry in a bucket: GUID length (u8), GUID, packed length (u16; 0xFFFF: a u32 follows,
# for a large seq window or gap log), packed state.
_GUID_LEN = struct.Struct("<B")
_STATE_LEN = struct.Struct("<H")
_LONG_STATE_LEN = struct.Struct("<HI")
_LONG = 0xFFFF
# Idle producers per bucket on average before the buckets double: more saves memory, fewer
# makes a lookup shorter.
_BUCKET_LOAD = 16


def _entry(guid: bytes, packed: bytes) -> bytes:
    if len(guid) > 0xFF:
        raise ValueError(f"producer GUID of {len(guid)} bytes: at most 255 are kept")
    n = len(packed)
    size = _STATE_LEN.pack(n) if n < _LONG else _LONG_STATE_LEN.pack(_LONG, n)
    return b"".join((_GUID_LEN.pack(len(guid)), guid, size, packed))


def _entries(bucket: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(entry start, GUID start, GUID end, state start, entry end) of each entry of a bucket."""
    at, end = 0, len(bucket)
    while at < end:
        guid_at = at + 1
        guid_end = guid_at + bucket[at]
        (n,) = _STATE_LEN.unpack_from(bucket, guid_end)
        if n == _LONG:
            _, n = _LONG_STATE_LEN.unpack_from(bucket, guid_end)
            state_at = guid_end + _LONG_STATE_LEN.size
        else:
            state_at = guid_end + _STATE_LEN.size
        yield at, guid_at, guid_end, state_at, state_at + n
        at = state_at + n


def _find(bucket: bytes, guid: bytes) -> tuple[int, int, int] | None:
    """(entry start, state start, entry end) of `guid`'s entry in `bucket`, or None."""
    if guid not in bucket:
        return None  # in C: the common answer for a producer never seen before
    size = len(guid)
    for at, guid_at, _guid_end, state_at, end in _entries(bucket):
        if bucket[at] == size and bucket.startswith(guid, guid_at):
            return at, state_at, end
    return None


class ProducerStates(MutableMapping[bytes, "Segment | bytes"]):
    """GUID -> the producer's state: a `Segment` while active (`active`), its packed bytes
    while idle (a fresh bytes object per read)."""

    __slots__ = ("_buckets", "_mask", "_packed", "active")

    def __init__(self, states: Mapping[bytes, Segment | bytes] | None = None) -> None:
        self.active: dict[bytes, Segment] = {}
        self._buckets: dict[int, bytes] = {}
        self._mask = 0  # buckets - 1 (a power of two)
        self._packed = 0
        if states:
            self.update(states)

    # -- idle (packed) entries ----------------------------------------------------------------

    def take_packed(self, guid: bytes) -> bytes | None:
        """Remove `guid`'s packed state and return it (None when it has none)."""
        key = hash(guid) & self._mask
        bucket = self._buckets.get(key)
        if bucket is None:
            return None
        found = _find(bucket, guid)
        if found is None:
            return None
        at, state_at, end = found
        rest = bucket[:at] + bucket[end:]
        if rest:
            self._buckets[key] = rest
        else:
            del self._buckets[key]
        self._packed -= 1
        return bucket[state_at:end]

    def remove_many(self, guids: Iterable[bytes]) -> None:
        """Forget these producers (each must be held), every bucket rebuilt once: one by one,
        each removal copies its whole bucket."""
        by_bucket: dict[int, set[bytes]] = {}
        active = self.active
        mask = self._mask
        for guid in guids:
            if active.pop(guid, None) is None:
                by_bucket.setdefault(hash(guid) & mask, set()).add(guid)
        buckets = self._buckets
        for key, gone in by_bucket.items():
            bucket = buckets.get(key, b"")
            kept = []
            for at, guid_at, guid_end, _state_at, end in _entries(bucket):
                guid = bucket[guid_at:guid_end]
                if guid in gone:
                    gone.discard(guid)
                    self._packed -= 1
                else:
                    kept.append(bucket[at:end])
            if kept:
                buckets[key] = b"".join(kept)
            elif key in buckets:
                del buckets[key]
            if gone:
                raise KeyError(next(iter(gone)))

    def put_packed(self, states: Iterable[tuple[bytes, bytes]]) -> None:
        """Keep these (GUID, packed state) as idle entries (none may be held already, packed
        or active: the caller took them out)."""
        states = list(states)
        self._packed += len(states)
        if self._packed > _BUCKET_LOAD * (self._mask + 1):
            self._rehash()  # before adding: the new entries go straight to their bucket
        added: dict[int, list[bytes]] = {}
        mask = self._mask
        for guid, packed in states:
            added.setdefault(hash(guid) & mask, []).append(_entry(guid, packed))
        buckets = self._buckets
        for key, entries in added.items():
            old = buckets.get(key)
            buckets[key] = b"".join(entries if old is None else [old, *entries])

    def _rehash(self) -> None:
        """Buckets for `_packed` entries (some of which may still be on their way in)."""
        mask = self._mask
        while self._packed > _BUCKET_LOAD * (mask + 1):
            mask = mask * 2 + 1
        spread: dict[int, list[bytes]] = {}
        for bucket in self._buckets.values():
            for at, guid_at, guid_end, _state_at, end in _entries(bucket):
                guid = bucket[guid_at:guid_end]
                spread.setdefault(hash(guid) & mask, []).append(bucket[at:end])
        self._mask = mask
        self._buckets = {key: b"".join(entries) for key, entries in spread.items()}

    def _packed_items(self) -> list[tuple[bytes, bytes]]:
        # One flat loop (not `_entries`): checkpoints and views walk every idle producer.
        items: list[tuple[bytes, bytes]] = []
        append = items.append
        for bucket in self._buckets.values():
            at, end = 0, len(bucket)
            while at < end:
                guid_end = at + 1 + bucket[at]
                n = bucket[guid_end] | bucket[guid_end + 1] << 8
                state_at = guid_end + 2
                if n == _LONG:
                    _, n = _LONG_STATE_LEN.unpack_from(bucket, guid_end)
                    state_at = guid_end + _LONG_STATE_LEN.size
                append((bucket[at + 1 : guid_end], bucket[state_at : state_at + n]))
                at = state_at + n
        return items

    def packed_field(self, field: struct.Struct, offset: int) -> list[int]:
        """One fixed-place field (`field` at `offset` of the packed state) of every idle
        producer, without building its bytes."""
        return [value for value, _ in self._packed_fields(field, offset, False)]

    def packed_field_by_guid(self, field: struct.Struct, offset: int) -> list[tuple[int, bytes]]:
        """(`packed_field`'s value, GUID) of every idle producer."""
        return self._packed_fields(field, offset, True)

    def _packed_fields(self, field: struct.Struct, offset: int, guids: bool) -> list[tuple[int, bytes]]:
        values: list[tuple[int, bytes]] = []
        append = values.append
        unpack_from = field.unpack_from
        for bucket in self._buckets.values():
            at, end = 0, len(bucket)
            while at < end:
                guid_end = at + 1 + bucket[at]
                n = bucket[guid_end] | bucket[guid_end + 1] << 8
                state_at = guid_end + 2
                if n == _LONG:
                    _, n = _LONG_STATE_LEN.unpack_from(bucket, guid_end)
                    state_at = guid_end + _LONG_STATE_LEN.size
                append((unpack_from(bucket, state_at + offset)[0], bucket[at + 1 : guid_end] if guids else b""))
                at = state_at + n
        return values

    def _packed_get(self, guid: bytes) -> bytes | None:
        bucket = self._buckets.get(hash(guid) & self._mask)
        if bucket is None:
            return None
        found = _find(bucket, guid)
        return None if found is None else bucket[found[1] : found[2]]

    def copy(self) -> ProducerStates:
        """A copy that later changes to this one leave alone (Segment objects are shared,
        as in a dict's copy; packed buckets are immutable)."""
        clone = ProducerStates()
        clone.active = dict(self.active)
        clone._buckets = dict(self._buckets)
        clone._mask = self._mask
        clone._packed = self._packed
        return clone

    # -- the mapping ----------------------------------------------------------------------------

    def __getitem__(self, guid: bytes) -> Segment | bytes:
        state = self.active.get(guid)
        if state is not None:
            return state
        packed = self._packed_get(guid)
        if packed is None:
            raise KeyError(guid)
        return packed

    def get(self, guid: bytes, default=None):
        state = self.active.get(guid)
        if state is not None:
            return state
        packed = self._packed_get(guid)
        return default if packed is None else packed

    def __contains__(self, guid: object) -> bool:
        if guid in self.active:
            return True
        return isinstance(guid, bytes) and self._packed_get(guid) is not None

    def __setitem__(self, guid: bytes, state: Segment | bytes) -> None:
        if isinstance(state, bytes):
            if self.active.pop(guid, None) is None:
                self.take_packed(guid)
            self.put_packed(((guid, state),))
        else:
            if guid not in self.active and self._packed:
                self.take_packed(guid)
            self.active[guid] = state

    def __delitem__(self, guid: bytes) -> None:
        if self.active.pop(guid, None) is None and self.take_packed(guid) is None:
            raise KeyError(guid)

    def __iter__(self) -> Iterator[bytes]:
        yield from list(self.active)
        for guid, _ in self._packed_items():
            yield guid

    def __len__(self) -> int:
        return len(self.active) + self._packed

    def items(self):
        """(GUID, state) pairs: a list, so that the caller may change the states meanwhile."""
        return [*self.active.items(), *self._packed_items()]

    def values(self):
        """The states: a list, as `items`."""
        return [*self.active.values(), *(packed for _, packed in self._packed_items())]

    def __repr__(self) -> str:
        return f"ProducerStates({len(self.active)} active, {self._packed} packed)"
