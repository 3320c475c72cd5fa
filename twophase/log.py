"""The durable transaction log: one per sink id, the source of truth for what is committed.

Layout under the log location (a :class:`LogStore`)::

    owner.json                      who owns this sink id (written once, put-if-absent)
    query.json                      the streaming query bound to this log (its persistent id; put-if-absent)
    checkpoints/<id:020d>.json      one record per checkpoint id, replaced atomically on each transition

Every record is written whole to a temporary name, fsynced and renamed over the old one, and carries
a SHA-256 of its body. Invariants (named in tests as ``test_log_invN_*``):

1. A record is either the old one or the new one, never a mix: writes are atomic (temp, fsync, rename).
2. A record whose checksum does not match, or that does not parse, is never taken as valid:
   reading it raises :class:`~twophase.errors.LogCorruptError`. Stray temporary files are ignored.
3. Every state change is checked by :func:`twophase.states.check_transition`; a COMPLETED record is
   never overwritten by anything but COMMITTED.
4. Retention removes only final (COMMITTED/ABORTED) records, never the newest ``retain`` of them and
   never the highest committed one, so ``highest_committed`` survives pruning.
5. A sink id has one owner: a second owner is refused with :class:`ConcurrentWriterError`, and one
   streaming query: a query with another persistent id (a deleted and recreated checkpoint, whose batch
   ids restart at 0) is refused with :class:`QueryMismatchError` instead of having its batches taken
   for already-committed ones.
6. No record below the highest COMMITTED one is unfinished (the coordinator commits completed
   checkpoints in id order and aborts older pending ones before it commits a newer one). So the
   questions recovery asks (what is unfinished, what is the highest committed id) are answered by
   one listing and reading records from the newest down to the first COMMITTED one: O(1) reads in
   the steady state, which matters when the log is on S3. One record may break the first sentence: a PENDING
   record that a commit created at an id committed and pruned long before (a zombie driver, or a
   re-run of an old batch) and was killed before recording it ABORTED. Recovery does not see it, and
   a commit that meets it finds it below the highest COMMITTED id and never commits it
   (:mod:`twophase.decisions`, CheckSuperseded).
7. Every transition is a compare-and-swap against the version of the record the decision was based
   on (:meth:`LogStore.put_if_version`: a hash under the lock for local stores, If-Match /
   If-None-Match on S3): of two writers (drivers) that read the same record, the second write fails
   with :class:`ConcurrentWriterError` instead of silently replacing the first decision. So one
   checkpoint id has at most one COMPLETED record, whatever the number of drivers.
8. Directories are created durably (each new directory's parent is fsynced) and writes are complete
   (a short ``os.write`` is continued, never ignored).
9. Reading costs one listing per decision, not a GET per record this process already holds: a record
   is taken from memory only when the listing (one per :meth:`~TransactionLog.locked` span, or per
   :meth:`~TransactionLog.view` outside it) reports it at the very version this process put or read it
   at (``LogStore.list_versioned``: S3's ETags; a local store reports none, so there every record is
   read), and a checkpoint id missing from the span's listing is taken as absent without a read. Both
   are safe against other writers: a record changed since has another version (read again), and a
   record created after the listing makes this process's create fail its compare-and-swap
   (invariant 7), never replace it. A record this process just wrote is never read back: the put's
   version is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, Optional

from twophase._logging import get_logger
from twophase._redact import redact_text
from twophase.log_store import LocalLogStore, LogStore, open_store  # noqa: F401  (public names here too)
from twophase.checkpoint import CheckpointProperties, CompletedCheckpoint, Handle
from twophase.errors import (ConcurrentWriterError, ConfigurationError, LogCorruptError, QueryMismatchError,
                             RecordExistsError)
from twophase.states import CheckpointState, check_transition

_log = get_logger(__name__)

FORMAT_VERSION = 1
_MAGIC = "twophase-log"


# --------------------------------------------------------------------------- stores (see twophase.log_store)

# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class CheckpointRecord:
    """What the log knows of one checkpoint id."""

    checkpoint_id: int
    state: CheckpointState
    handles: Mapping[str, Handle] = field(default_factory=dict)
    properties: CheckpointProperties = field(default_factory=CheckpointProperties)
    attempt: int = 1
    timestamps: Mapping[str, float] = field(default_factory=dict)
    reason: Optional[str] = None
    task_state: Optional[Mapping[str, Any]] = None
    #: COMMITTED: the sink's lingering transactions up to this id were swept after its handles were
    #: committed and before this record was written (so recovery needs no sweep up to here)
    swept: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "state": self.state.value,
            "attempt": self.attempt,
            "properties": self.properties.to_json(),
            "handles": dict(self.handles),
            "timestamps": dict(self.timestamps),
            "reason": self.reason,
            "task_state": self.task_state,
            **({"swept": True} if self.swept else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CheckpointRecord":
        return cls(int(d["checkpoint_id"]), CheckpointState(d["state"]), dict(d.get("handles") or {}),
                   CheckpointProperties.from_json(d.get("properties") or {}), int(d.get("attempt", 1)),
                   dict(d.get("timestamps") or {}), d.get("reason"), d.get("task_state"), bool(d.get("swept", False)))

    def to_completed(self) -> CompletedCheckpoint:
        return CompletedCheckpoint(self.checkpoint_id, dict(self.handles), self.properties,
                                   self.timestamps.get("PENDING", 0.0), self.timestamps.get("COMPLETED", 0.0),
                                   self.task_state)


def encode_record(body: Mapping[str, Any]) -> bytes:
    """Serialise ``body`` with a checksum header: ``twophase-log 1 <sha256> <len>\\n<json>``."""
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(payload).hexdigest()
    return f"{_MAGIC} {FORMAT_VERSION} {digest} {len(payload)}\n".encode() + payload


def decode_record(data: bytes, where: str) -> dict[str, Any]:
    """Parse and verify bytes written by :func:`encode_record` (invariant 2)."""
    head, sep, payload = data.partition(b"\n")
    parts = head.decode("ascii", "replace").split(" ")
    if not sep or len(parts) != 4 or parts[0] != _MAGIC:
        raise LogCorruptError(f"log record {where} has no valid header; refusing to read it")
    if parts[1] != str(FORMAT_VERSION):
        raise LogCorruptError(f"log record {where} has format version {parts[1]}, this twophase reads {FORMAT_VERSION}")
    if not parts[3].isdigit() or int(parts[3]) != len(payload):
        raise LogCorruptError(f"log record {where} is torn: length {len(payload)} != {parts[3]}")
    if hashlib.sha256(payload).hexdigest() != parts[2]:
        raise LogCorruptError(f"log record {where} fails its checksum; refusing to read it")
    try:
        return json.loads(payload)
    except ValueError as e:
        raise LogCorruptError(f"log record {where} does not parse: {e}") from e


# --------------------------------------------------------------------------- the log

#: (location, sink id, query id) whose query.json this process has read and found equal; the object is
#: write-once, so a verified match needs no further read (bind_query runs up to three times a batch)
_VERIFIED_BINDINGS: set[tuple[str, str, str]] = set()
#: (location, sink id, owner) whose owner.json this process has read or written and found its own; also
#: write-once (claim runs before every micro-batch, in the planner and the commit worker)
_VERIFIED_OWNERS: set[tuple[str, str, str]] = set()

#: Records this process put or read, by (log location, sink id, checkpoint id): (version, record).
#: Invariant 9: used only when a listing reports the same version. Bounded; the oldest go first.
_KNOWN: "OrderedDict[tuple[str, str, int], tuple[str, CheckpointRecord]]" = OrderedDict()
_KNOWN_MAX = 128
_KNOWN_LOCK = threading.Lock()


def _same_version(a: Optional[str], b: Optional[str]) -> bool:
    """Two versions of one object are equal (S3 ETags compare without their quotes)."""
    return a is not None and b is not None and a.strip('"') == b.strip('"')


@dataclass(frozen=True)
class LogView:
    """What one scan of the log saw: every id, the highest COMMITTED record, and the records above it."""

    ids: list[int]
    committed: Optional[CheckpointRecord]
    newer: list[CheckpointRecord]

    @property
    def highest_committed(self) -> Optional[int]:
        return self.committed.checkpoint_id if self.committed is not None else None

    @property
    def unfinished(self) -> list[CheckpointRecord]:
        return [r for r in self.newer if not r.state.is_final]


class TransactionLog:
    """The durable per-sink log of checkpoint decisions (see module invariants)."""

    def __init__(self, store: LogStore, sink_id: str, *, retain: int = 100) -> None:
        if retain < 2:
            raise ConfigurationError(f"log.retain must be at least 2, got {retain}")
        self.store = store
        self.sink_id = sink_id
        self.retain = retain
        # While this process holds the store's lock it is the only writer, so what it read or wrote
        # stays true until the lock is released: reads and the listing are cached for that span only.
        self._locked_depth = 0
        self._cache: dict[int, tuple[Optional[CheckpointRecord], Optional[str]]] = {}
        #: the lock span's listing: checkpoint id -> version the listing reported (None: not reported)
        self._listing: Optional[dict[int, Optional[str]]] = None

    @classmethod
    def open(cls, location: str, sink_id: str, *, retain: int = 100) -> "TransactionLog":
        return cls(open_store(location), sink_id, retain=retain)

    @property
    def location(self) -> str:
        return self.store.location

    # ---- ownership (invariant 5)

    def claim(self, owner: str, *, query_id: Optional[str] = None) -> None:
        """Bind this sink id to ``owner`` (a query's checkpoint location) or refuse a second owner; with
        ``query_id`` (the query's persistent id) also bind the query (:meth:`bind_query`)."""
        self._claim_owner(owner)
        if query_id:
            self.bind_query(query_id, owner=owner)

    def bind_query(self, query_id: str, *, owner: Optional[str] = None) -> None:
        """Bind this log to the streaming query ``query_id`` or refuse another query (invariant 5).

        A query's persistent id lives in ``<checkpointLocation>/metadata``; a new id at the same
        location means the checkpoint was deleted and batch ids restart at 0, so the log's committed
        ids would swallow the new query's batches. Refused; the way out is a new ``sink.id``.
        """
        key = (self.location, self.sink_id, query_id)
        if key in _VERIFIED_BINDINGS:  # query.json is write-once: a match seen in this process stays one
            return
        current, created = self._write_once("query.json", {"sink_id": self.sink_id, "query_id": query_id,
                                                            "bound_at": time.time()})
        if created:
            _log.info("log_bound_to_query", sink_id=self.sink_id, query_id=query_id, location=self.location)
        if current is not None and current.get("query_id") == query_id:
            _VERIFIED_BINDINGS.add(key)
            return
        bound = current.get("query_id") if current else "?"
        raise QueryMismatchError(
            f"sink id {self.sink_id!r} (log {self.location}) belongs to the streaming query {bound}, but this "
            f"is query {query_id}{f' (checkpoint {owner})' if owner else ''}. A new query id at the same checkpoint "
            "location means the checkpoint was deleted or replaced: its batch ids restart at 0 and would be taken "
            "for batches the old query already committed. Nothing was committed for this query. To write this "
            "query's data to the same destination, give it a new option 'sink.id' (its log starts empty; the data "
            "the old query committed stays); to resume the old query, restore its checkpoint directory")

    def query(self) -> Optional[dict[str, Any]]:
        """The query binding (``query.json``), or None before the first bound micro-batch."""
        return self._read_once("query.json")

    def _read_once(self, name: str) -> Optional[dict[str, Any]]:
        data = self.store.get(name)
        return None if data is None else decode_record(data, f"{self.location}/{name}")

    def _write_once(self, name: str, body: dict[str, Any]) -> tuple[Optional[dict[str, Any]], bool]:
        """A write-once object (owner.json, query.json): what it holds, and whether this call created it.
        The common case (it exists) is one read and no write."""
        current = self._read_once(name)
        if current is not None:
            return current, False
        if self.store.put_if_absent(name, encode_record(body)):
            return body, True
        return self._read_once(name), False

    def _claim_owner(self, owner: str) -> None:
        # the owner is recorded without a password a checkpoint URL may carry (user:password@): the log
        # never holds credentials (twophase._redact); an older record with the full URL still matches
        given, owner = owner, redact_text(owner)
        key = (self.location, self.sink_id, owner)
        if self.store.remote and key in _VERIFIED_OWNERS:  # owner.json is write-once: verified once per process
            return
        current, created = self._write_once("owner.json", {"sink_id": self.sink_id, "owner": owner,
                                                            "host": socket.gethostname(), "claimed_at": time.time()})
        if created:
            _log.info("log_claimed", sink_id=self.sink_id, owner=owner, location=self.location)
            _VERIFIED_OWNERS.add(key)
            return
        if current is None or current.get("owner") not in (owner, given) or current.get("sink_id") != self.sink_id:
            raise ConcurrentWriterError(
                f"sink id {self.sink_id!r} (log {self.location}) is owned by "
                f"{redact_text(str(current.get('owner'))) if current else '?'!r}; this writer is {owner!r}. Two queries must not share "
                "a sink: give this one its own output path or 'sink.id', or delete the old output to start over")
        _VERIFIED_OWNERS.add(key)

    def owner(self) -> Optional[dict[str, Any]]:
        return self._read_once("owner.json")

    def recorded_sink_id(self) -> Optional[str]:
        """The sink id this log's records name (its owner record, else its newest checkpoint record), or None
        where there is no log: what an operator's tool opens a log by when it is not told the sink id."""
        owner = self.owner()
        if owner is not None:
            return str(owner["sink_id"])
        for name in reversed(self.store.list("checkpoints/")):
            data = self.store.get(name)
            if data is not None:
                return str(decode_record(data, f"{self.location}/{name}")["sink_id"])
        return None

    # ---- records

    @staticmethod
    def _name(checkpoint_id: int) -> str:
        return f"checkpoints/{checkpoint_id:020d}.json"

    def get(self, checkpoint_id: int) -> Optional[CheckpointRecord]:
        return self.get_versioned(checkpoint_id)[0]

    def get_versioned(self, checkpoint_id: int) -> tuple[Optional[CheckpointRecord], Optional[str]]:
        """The record and the store version it was read at (what :meth:`transition` compares against).

        Inside :meth:`locked`, once the span has listed the log, no read where the listing answers
        (invariant 9)."""
        if self._locked_depth and self._listing is not None:
            return self._listed(checkpoint_id, self._listing)
        if self._locked_depth and checkpoint_id in self._cache:
            return self._cache[checkpoint_id]
        got = self._read(checkpoint_id)
        if self._locked_depth:
            self._cache[checkpoint_id] = got
        return got

    def _listed(self, checkpoint_id: int,
                listing: Mapping[int, Optional[str]]) -> tuple[Optional[CheckpointRecord], Optional[str]]:
        """The record of ``checkpoint_id`` given a listing of the log (invariant 9): absent if the listing
        has no such id, from memory if the listing reports the version this process holds, else read."""
        if self._locked_depth and checkpoint_id in self._cache:
            return self._cache[checkpoint_id]
        if checkpoint_id not in listing:
            got: tuple[Optional[CheckpointRecord], Optional[str]] = (None, None)
        else:
            got = self._known(checkpoint_id, listing[checkpoint_id]) or self._read(checkpoint_id)
        if self._locked_depth:
            self._cache[checkpoint_id] = got
        return got

    def _known(self, checkpoint_id: int, listed: Optional[str]) -> Optional[tuple[CheckpointRecord, str]]:
        """The record this process put or read at version ``listed``, if it holds that version."""
        key = (self.location, self.sink_id, checkpoint_id)
        with _KNOWN_LOCK:
            hit = _KNOWN.get(key)
            if hit is None or not _same_version(hit[0], listed):
                return None
            _KNOWN.move_to_end(key)
        return hit[1], hit[0]

    def _remember(self, checkpoint_id: int, record: Optional[CheckpointRecord], version: Optional[str]) -> None:
        if not self.store.lists_versions:  # nothing could ever prove it current: keep nothing
            return
        key = (self.location, self.sink_id, checkpoint_id)
        with _KNOWN_LOCK:
            if record is None or version is None:
                _KNOWN.pop(key, None)
                return
            _KNOWN[key] = (version, record)
            _KNOWN.move_to_end(key)
            while len(_KNOWN) > _KNOWN_MAX:
                _KNOWN.popitem(last=False)

    def _read(self, checkpoint_id: int) -> tuple[Optional[CheckpointRecord], Optional[str]]:
        name = self._name(checkpoint_id)
        data, version = self.store.get_versioned(name)
        if data is None:
            self._remember(checkpoint_id, None, None)
            return None, None
        record = self._decode(name, data)
        self._remember(checkpoint_id, record, version)
        return record, version

    def _decode(self, name: str, data: bytes) -> CheckpointRecord:
        body = decode_record(data, f"{self.location}/{name}")
        if body.get("sink_id") not in (None, self.sink_id):
            raise LogCorruptError(f"log record {name} belongs to sink {body.get('sink_id')!r}, not {self.sink_id!r}")
        try:
            return CheckpointRecord.from_json(body["record"])
        except (KeyError, ValueError, TypeError) as e:
            raise LogCorruptError(f"log record {self.location}/{name} has a valid checksum but an invalid body: {e}") from e

    def records(self) -> list[CheckpointRecord]:
        """Every record, in checkpoint id order."""
        listing = self._list()
        return [rec for rec in (self._listed(cid, listing)[0] for cid in sorted(listing)) if rec is not None]

    def checkpoint_ids(self) -> list[int]:
        return sorted(self._list())

    def _list(self) -> dict[int, Optional[str]]:
        """Checkpoint id -> version as listed; one listing per lock span (invariant 9)."""
        if self._locked_depth and self._listing is not None:
            return self._listing
        listing: dict[int, Optional[str]] = {}
        for name, version in self.store.list_versioned("checkpoints/"):
            base = name.rsplit("/", 1)[-1]
            if base.endswith(".json") and base[:-5].isdigit():
                listing[int(base[:-5])] = version
        if self._locked_depth:
            self._listing = listing
        return listing

    def view(self) -> "LogView":
        """One listing, then records read from the newest down to the first COMMITTED one (invariant 6),
        each from memory where the listing shows the version this process holds (invariant 9)."""
        listing = self._list()
        ids = sorted(listing)
        newer: list[CheckpointRecord] = []
        for cid in reversed(ids):
            rec = self._listed(cid, listing)[0]
            if rec is None:
                continue
            if rec.state is CheckpointState.COMMITTED:
                return LogView(ids, rec, newer[::-1])
            newer.append(rec)
        return LogView(ids, None, newer[::-1])

    def highest_committed(self, *, fresh: bool = False) -> Optional[int]:
        """The highest COMMITTED checkpoint id (kept through pruning, invariant 4); ``fresh`` lists and
        reads again even inside :meth:`locked` (to see what another host wrote meanwhile)."""
        if fresh:
            # a new listing; records are then taken from memory only where it shows the version held (inv. 9)
            self._listing = None
            self._cache = {cid: got for cid, got in self._cache.items() if got[0] is not None and got[0].state.is_final}
        return self.view().highest_committed

    def unfinished(self) -> list[CheckpointRecord]:
        """PENDING and COMPLETED records (the ones recovery must act on), in id order (invariant 6)."""
        return self.view().unfinished

    def latest_completed(self) -> Optional[CheckpointRecord]:
        """The newest COMPLETED or COMMITTED record: what a restart restores from."""
        v = self.view()
        for rec in reversed(v.newer):
            if rec.state is CheckpointState.COMPLETED:
                return rec
        return v.committed

    def transition(self, checkpoint_id: int, target: CheckpointState, *,
                   expected: Optional[tuple[Optional[CheckpointRecord], Optional[str]]] = None,
                   **changes: Any) -> CheckpointRecord:
        """Move ``checkpoint_id`` to ``target`` (invariant 3) and write the record durably (invariant 1).

        The write is a compare-and-swap against ``expected`` (a :meth:`get_versioned` result; default:
        the record as this log last read it, which inside :meth:`locked` is the read the caller's
        decision was based on). Raises :class:`ConcurrentWriterError` if another writer changed the
        record since (invariant 7).
        """
        current, version = expected if expected is not None else self.get_versioned(checkpoint_id)
        source = current.state if current else None
        check_transition(source, target, what=f"checkpoint {checkpoint_id} of sink {self.sink_id!r}")
        now = time.time()
        if current is None or (source is CheckpointState.ABORTED and target is CheckpointState.PENDING):
            attempt = 1 if current is None else current.attempt + 1
            base = CheckpointRecord(checkpoint_id, target, attempt=attempt)
            timestamps: dict[str, float] = {}
        else:
            base = current
            timestamps = dict(current.timestamps)
        timestamps[target.value] = now
        record = replace(base, state=target, timestamps=timestamps, **changes)
        self._write(record, version)
        _log.debug("log_transition", sink_id=self.sink_id, checkpoint_id=checkpoint_id,
                   source=source.value if source else None, target=target.value)
        return record

    def _write(self, record: CheckpointRecord, version: Optional[str]) -> None:
        name = self._name(record.checkpoint_id)
        data = encode_record({"sink_id": self.sink_id, "record": record.to_json()})
        new_version = self.store.put_if_version(name, data, version)
        if new_version is None:
            self._cache.pop(record.checkpoint_id, None)
            self._listing = None  # the listing no longer tells this record's version: list again if asked
            self._remember(record.checkpoint_id, None, None)
            raise (ConcurrentWriterError if version is not None else RecordExistsError)(
                f"checkpoint {record.checkpoint_id} of sink {self.sink_id!r} (log {self.location}) was changed by "
                f"another writer since this one read it; refusing to record {record.state.value} over it. Another "
                "driver (a zombie after a failover, or a second query with this sink id) is writing this log; "
                "this attempt stops and nothing of it is committed")
        self._remember(record.checkpoint_id, record, new_version)  # never read back (invariant 9)
        if self._locked_depth:
            self._cache[record.checkpoint_id] = (record, new_version)
            if self._listing is not None:
                self._listing[record.checkpoint_id] = new_version

    def prune(self) -> int:
        """Apply retention (invariant 4); returns how many records were removed.

        Records at or below the highest committed id are final (invariant 6), so only the few above it
        are read.
        """
        v = self.view()
        hc = v.highest_committed
        final = sorted([cid for cid in v.ids if hc is not None and cid <= hc]
                       + [r.checkpoint_id for r in v.newer if r.state.is_final])
        if len(final) <= self.retain:
            return 0
        keep_ids = set(final[-self.retain:])
        if hc is not None:
            keep_ids.add(hc)
        removed = 0
        for cid in final:
            if cid not in keep_ids:
                self.store.delete(self._name(cid))
                self._cache.pop(cid, None)
                self._remember(cid, None, None)
                if self._listing is not None:
                    self._listing.pop(cid, None)
                removed += 1
        return removed

    @contextlib.contextmanager
    def locked(self) -> Iterator["TransactionLog"]:
        """Hold the store's lock for a multi-step decision; reads are cached until it is released."""
        with self.store.lock():
            self._locked_depth += 1
            try:
                yield self
            finally:
                self._locked_depth -= 1
                if self._locked_depth == 0:
                    self._cache.clear()
                    self._listing = None
