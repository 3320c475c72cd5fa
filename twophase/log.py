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
   the steady state, which matters when the log is on S3.
7. Every transition is a compare-and-swap against the version of the record the decision was based
   on (:meth:`LogStore.put_if_version`: a hash under the lock for local stores, If-Match /
   If-None-Match on S3): of two writers (drivers) that read the same record, the second write fails
   with :class:`ConcurrentWriterError` instead of silently replacing the first decision. So one
   checkpoint id has at most one COMPLETED record, whatever the number of drivers.
8. Directories are created durably (each new directory's parent is fsynced) and writes are complete
   (a short ``os.write`` is continued, never ignored).
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, Optional

from twophase._logging import get_logger
from twophase._redact import redact_text
from twophase.checkpoint import CheckpointProperties, CompletedCheckpoint, Handle
from twophase.errors import (ConcurrentWriterError, ConfigurationError, LogCorruptError, QueryMismatchError,
                             TransientSinkError)
from twophase.states import CheckpointState, check_transition

_log = get_logger(__name__)

FORMAT_VERSION = 1
_MAGIC = "twophase-log"


# --------------------------------------------------------------------------- stores


class ReentrantFileLock:
    """An exclusive ``flock`` on ``path`` that serialises processes on this machine and is re-entrant
    within a thread (the coordinator nests decisions). Not shared across processes by pickling."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd = -1

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._thread_lock:
            if self._depth == 0:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    os.close(self._fd)
                    self._fd = -1


class LogStore(abc.ABC):
    """Where log objects live. Names are relative, ``/``-separated. Implementations must make
    :meth:`put` atomic (readers see the old or the new bytes) and :meth:`put_if_absent` exclusive."""

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Human-readable location (path or URL) for messages."""

    @abc.abstractmethod
    def get(self, name: str) -> Optional[bytes]:
        """The bytes stored under ``name``, or None."""

    @abc.abstractmethod
    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` under ``name`` atomically, replacing what was there; durable on return."""

    @abc.abstractmethod
    def put_if_absent(self, name: str, data: bytes) -> bool:
        """Store ``data`` under ``name`` only if nothing is there; True if this call created it."""

    @abc.abstractmethod
    def get_versioned(self, name: str) -> tuple[Optional[bytes], Optional[str]]:
        """The bytes under ``name`` and an opaque version of them (None, None if absent)."""

    @abc.abstractmethod
    def put_if_version(self, name: str, data: bytes, version: Optional[str]) -> Optional[str]:
        """Compare-and-swap: store ``data`` only if ``name`` is still at ``version`` (None: still absent).

        Returns the new version if this call wrote, None if another writer changed ``name`` since
        ``version`` was read (nothing written).
        """

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Names under ``prefix`` (a folder name ending in ``/``), sorted."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove ``name``; no error if absent."""

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialise mutations from processes on this machine; a no-op where the store cannot."""
        yield


class LocalLogStore(LogStore):
    """A log store on a local or POSIX-shared directory."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self._lock = ReentrantFileLock(os.path.join(self.root, ".lock"))
        try:
            makedirs_durable(os.path.join(self.root, "checkpoints"))
        except OSError as e:
            raise ConfigurationError(
                f"cannot create the transaction log at {self.root!r}: {e.strerror}; "
                "give a writable path (option 'path' or 'log.location')") from e
        if not os.access(self.root, os.W_OK):
            raise ConfigurationError(
                f"the transaction log at {self.root!r} is not writable; "
                "give a writable path (option 'path' or 'log.location')")

    @property
    def location(self) -> str:
        return self.root

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"])

    def _path(self, name: str) -> str:
        return os.path.join(self.root, *name.split("/"))

    def get(self, name: str) -> Optional[bytes]:
        try:
            with open(self._path(name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    @staticmethod
    def _write_temp(path: str, data: bytes) -> str:
        """``data`` written whole and fsynced to a fresh temporary name beside ``path``; returns that name."""
        tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}-{os.path.basename(path)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        return tmp

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        directory = os.path.dirname(path)
        tmp = None
        try:
            tmp = self._write_temp(path, data)
            os.replace(tmp, path)
            _fsync_dir(directory)
        except OSError as e:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise TransientSinkError(f"cannot write log record {path!r}: {e}") from e

    def get_versioned(self, name: str) -> tuple[Optional[bytes], Optional[str]]:
        data = self.get(name)
        return data, (None if data is None else hashlib.sha256(data).hexdigest())

    def put_if_version(self, name: str, data: bytes, version: Optional[str]) -> Optional[str]:
        """Under the flock (which serialises every writer of this directory on this host, and on POSIX
        shared filesystems with working flock), compare the current bytes' hash, then replace."""
        with self._lock.hold():
            if version is None:  # a new record: the exclusive link, atomic even where flock is not
                return hashlib.sha256(data).hexdigest() if self.put_if_absent(name, data) else None
            _, current = self.get_versioned(name)
            if current != version:
                return None
            self.put(name, data)
            return hashlib.sha256(data).hexdigest()

    def put_if_absent(self, name: str, data: bytes) -> bool:
        path = self._path(name)
        directory = os.path.dirname(path)
        try:
            tmp = self._write_temp(path, data)
            try:
                os.link(tmp, path)  # atomic and exclusive: fails if path exists
                created = True
            except FileExistsError:
                created = False
            finally:
                os.unlink(tmp)
            _fsync_dir(directory)
        except OSError as e:
            raise TransientSinkError(f"cannot write log record {path!r}: {e}") from e
        return created

    def list(self, prefix: str) -> list[str]:
        directory = self._path(prefix.rstrip("/"))
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        base = prefix if prefix.endswith("/") else prefix + "/"
        return sorted(base + n for n in names if not n.startswith(".tmp-"))

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(name))

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """An exclusive flock on ``.lock``; re-entrant within a thread (the coordinator nests it)."""
        with self._lock.hold():
            yield

    def clean_temporaries(self, older_than_s: float = 60.0) -> int:
        """Remove temp files left by a writer that died mid-write (they never count as records)."""
        removed = 0
        now = time.time()
        for folder in (self.root, os.path.join(self.root, "checkpoints")):
            for n in os.listdir(folder):
                p = os.path.join(folder, n)
                if n.startswith(".tmp-") and now - os.path.getmtime(p) > older_than_s:
                    with contextlib.suppress(OSError):
                        os.unlink(p)
                        removed += 1
        return removed


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a short write is continued, never ignored)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write returned 0 bytes")
        view = view[n:]


def makedirs_durable(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, fsyncing the parent of every directory it creates, so
    that the new entries survive a power loss (a file fsynced inside an unsynced new directory can
    vanish with its directory)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
            continue
        _fsync_dir(os.path.dirname(d))


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems refuse fsync on directories
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def open_store(location: str) -> LogStore:
    """A :class:`LogStore` for ``location``: a local path now; ``s3://`` once an S3 store is registered."""
    if "://" in location and not location.startswith("file://"):
        scheme = location.split("://", 1)[0]
        factory = _STORE_FACTORIES.get(scheme)
        if factory is None and scheme in ("s3", "s3a"):
            import twophase.log_s3  # noqa: F401  (registers the S3 store)
            factory = _STORE_FACTORIES.get(scheme)
        if factory is None:
            raise ConfigurationError(
                f"no transaction log store for {scheme}:// locations (log location {location!r}); "
                f"known: file paths{', ' + ', '.join(s + '://' for s in _STORE_FACTORIES) if _STORE_FACTORIES else ''}")
        return factory(location)
    return LocalLogStore(location[len("file://"):] if location.startswith("file://") else location)


_STORE_FACTORIES: dict[str, Any] = {}


def register_store(scheme: str, factory: Any) -> None:
    """Let ``open_store`` build stores for ``scheme://`` locations (the S3 store registers here)."""
    _STORE_FACTORIES[scheme] = factory


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
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CheckpointRecord":
        return cls(int(d["checkpoint_id"]), CheckpointState(d["state"]), dict(d.get("handles") or {}),
                   CheckpointProperties.from_json(d.get("properties") or {}), int(d.get("attempt", 1)),
                   dict(d.get("timestamps") or {}), d.get("reason"), d.get("task_state"))

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
        self._ids: Optional[set[int]] = None

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
        current, created = self._write_once("owner.json", {"sink_id": self.sink_id, "owner": owner,
                                                            "host": socket.gethostname(), "claimed_at": time.time()})
        if created:
            _log.info("log_claimed", sink_id=self.sink_id, owner=owner, location=self.location)
            return
        if current is None or current.get("owner") not in (owner, given) or current.get("sink_id") != self.sink_id:
            raise ConcurrentWriterError(
                f"sink id {self.sink_id!r} (log {self.location}) is owned by "
                f"{redact_text(str(current.get('owner'))) if current else '?'!r}; this writer is {owner!r}. Two queries must not share "
                "a sink: give this one its own output path or 'sink.id', or delete the old output to start over")

    def owner(self) -> Optional[dict[str, Any]]:
        return self._read_once("owner.json")

    # ---- records

    @staticmethod
    def _name(checkpoint_id: int) -> str:
        return f"checkpoints/{checkpoint_id:020d}.json"

    def get(self, checkpoint_id: int) -> Optional[CheckpointRecord]:
        return self.get_versioned(checkpoint_id)[0]

    def get_versioned(self, checkpoint_id: int) -> tuple[Optional[CheckpointRecord], Optional[str]]:
        """The record and the store version it was read at (what :meth:`transition` compares against)."""
        if self._locked_depth and checkpoint_id in self._cache:
            return self._cache[checkpoint_id]
        got = self._read(checkpoint_id)
        if self._locked_depth:
            self._cache[checkpoint_id] = got
        return got

    def _read(self, checkpoint_id: int) -> tuple[Optional[CheckpointRecord], Optional[str]]:
        name = self._name(checkpoint_id)
        data, version = self.store.get_versioned(name)
        if data is None:
            return None, None
        return self._decode(name, data), version

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
        return [rec for rec in map(self.get, self.checkpoint_ids()) if rec is not None]

    def checkpoint_ids(self) -> list[int]:
        if self._locked_depth and self._ids is not None:
            return sorted(self._ids)
        ids = set()
        for name in self.store.list("checkpoints/"):
            base = name.rsplit("/", 1)[-1]
            if base.endswith(".json") and base[:-5].isdigit():
                ids.add(int(base[:-5]))
        if self._locked_depth:
            self._ids = ids
        return sorted(ids)

    def view(self) -> "LogView":
        """One listing, then records read from the newest down to the first COMMITTED one (invariant 6)."""
        ids = self.checkpoint_ids()
        newer: list[CheckpointRecord] = []
        for cid in reversed(ids):
            rec = self.get(cid)
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
            self._ids = None
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
            raise ConcurrentWriterError(
                f"checkpoint {record.checkpoint_id} of sink {self.sink_id!r} (log {self.location}) was changed by "
                f"another writer since this one read it; refusing to record {record.state.value} over it. Another "
                "driver (a zombie after a failover, or a second query with this sink id) is writing this log; "
                "this attempt stops and nothing of it is committed")
        if self._locked_depth:
            self._cache[record.checkpoint_id] = (record, new_version)
            if self._ids is not None:
                self._ids.add(record.checkpoint_id)

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
                if self._ids is not None:
                    self._ids.discard(cid)
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
                    self._ids = None
