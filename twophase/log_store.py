"""Where transaction logs live: the :class:`LogStore` interface, the local store, and the registry of stores.

A store keeps small named objects (``owner.json``, ``checkpoints/<id>.json``) with put-if-absent and
compare-and-swap (:meth:`LogStore.put_if_version`); :mod:`twophase.log` builds the transaction log on
it. The local store is here, and :class:`ObjectLogStore`, what the stores on object stores share; the
S3 store (:mod:`twophase.log_s3`) registers itself for ``s3://`` and ``s3a://``, the Azure Blob store
(:mod:`twophase.log_azure`) for ``abfss://``, ``abfs://``, ``az://``, ``wasbs://``, each when a location
first needs it. This module imports neither :mod:`twophase.log` nor any store: the log depends on the
stores, never the other way round.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import hashlib
import importlib
import os
import tempfile
import threading
import time
import uuid
from typing import Any, ClassVar, Iterable, Iterator, Optional

from twophase._logging import get_logger
from twophase.errors import ConfigurationError, TransientSinkError

_log = get_logger(__name__)


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

    #: :meth:`list_versioned` reports versions (S3's ETags), so a record already held needs no read
    lists_versions: bool = False
    #: every read is a network request (S3): a write-once object (owner.json) this process verified is
    #: not read again (a local store reads it every time, which also finds it corrupted at once)
    remote: bool = False

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

    def list_versioned(self, prefix: str) -> list[tuple[str, Optional[str]]]:
        """Names under ``prefix`` with the version each had when listed (the one :meth:`get_versioned`
        and :meth:`put_if_version` give), or None where the listing does not tell it (the default:
        then only a read tells the version). Sorted by name."""
        return [(name, None) for name in self.list(prefix)]

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove ``name``; no error if absent."""

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialise mutations from processes on this machine; a no-op where the store cannot."""
        yield


class ObjectLogStore(LogStore):
    """A log store on an object store (S3, Azure Blob): what the stores there share.

    A subclass gives the location (``location``, ``prefix``), one request per operation (``get_versioned``,
    ``put``, ``put_if_version``, ``delete``, ``_list``) and how its client's errors read (``_error_text``).
    Pickles carry the location and the config (secrets included, for executors); the client is made
    lazily in each process.

    Invariants of every object-store log (``test_object_log_invN_*``, each run against the real server of
    every store: S3 and Azure Blob):

    1. ``put`` is one request that replaces the object atomically: readers see the old or the new bytes.
    2. ``put_if_absent`` is one conditional create (``If-None-Match: *``): of writers racing for a name,
       exactly one gets True.
    3. ``put_if_version`` is one conditional write (``If-Match: <version read>``; ``If-None-Match: *`` for
       a new record): of two drivers that read the same record, the second write is refused and nothing
       is replaced (log invariant 7). A server that ignored the condition would make this unsafe, so the
       tests race real servers. A refusal whose object holds exactly the bytes this call wrote is this
       call's own write (:meth:`_own_write`): the client re-sent a request the server had applied but whose
       answer was lost, and the copy was refused. Records carry the writer's timestamps (and owner.json
       its host), so another writer's bytes never equal them; and where they did, the object would hold
       exactly what this writer wanted.
    4. ``lock`` serialises mutations of processes on this machine (an flock keyed by the location), which
       is what Spark's planner and commit workers need; writers on other machines are kept apart by the
       log's ownership record (put-if-absent), not by this lock.
    5. ``list_versioned`` reports each object's version (ETag) as the listing saw it, in the form
       ``get_versioned`` and ``put_if_version`` give: a record whose listed version equals the one this
       process put or read has those bytes, so the log reads it from memory (log invariant 9).
    """

    lists_versions = True  # invariant 5
    remote = True
    #: short name of the store, for its lock file and messages ("s3", "azure")
    kind: ClassVar[str] = "object"
    #: how the store is named in messages
    display: ClassVar[str] = "object store"

    def __init__(self, config: Any) -> None:
        self.config = config
        self._client: Any = None
        digest = hashlib.sha256(self.location.encode()).hexdigest()[:24]
        self._lock = ReentrantFileLock(os.path.join(tempfile.gettempdir(), "twophase-locks", f"{self.kind}-{digest}.lock"))

    #: the key prefix of the log's objects ('' at the root of the bucket or container)
    prefix: str = ""

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"], state["config"])  # type: ignore[misc]

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _error_text(self, e: BaseException) -> str:
        """``str(e)`` as it may be shown (a subclass masks its credentials)."""
        return str(e)

    def _fail(self, what: str, name: str, e: BaseException) -> TransientSinkError:
        return TransientSinkError(f"{self.display} transaction log {self.location}: cannot {what} {name!r}: "
                                  f"{self._error_text(e)}")

    def get(self, name: str) -> Optional[bytes]:
        return self.get_versioned(name)[0]

    def _own_write(self, name: str, data: bytes) -> tuple[Optional[str], Optional[str]]:
        """After a conditional write was refused: ``(version, None)`` if ``name`` holds exactly ``data`` (the
        refused request was a re-send of this call's own write, applied before, whose answer was lost: it is
        done, at that version), else ``(None, the version there)`` (another writer's; None if absent)."""
        current, version = self.get_versioned(name)
        return (version, None) if current == data and version is not None else (None, version)

    def put_if_absent(self, name: str, data: bytes) -> bool:  # invariant 2
        return self.put_if_version(name, data, None) is not None

    @abc.abstractmethod
    def _list(self, key_prefix: str) -> Iterable[tuple[str, Optional[str]]]:
        """``(key, version)`` of every object whose key starts with ``key_prefix`` (all pages)."""

    def list(self, prefix: str) -> list[str]:
        return [name for name, _ in self.list_versioned(prefix)]

    def list_versioned(self, prefix: str) -> list[tuple[str, Optional[str]]]:  # invariant 5
        """One listing (a request per page): each name with the version the listing reports."""
        folder = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        base = f"{self.prefix}/{folder}" if self.prefix else folder
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            return sorted((key[strip:], version) for key, version in self._list(base))
        except Exception as e:
            raise self._fail("list", prefix, e) from e

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Invariant 4: an flock keyed by this location, re-entrant within a thread."""
        with self._lock.hold():
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
            if not os.path.isdir(directory):  # a nested name (write-jobs/open/...): its folder, durably
                makedirs_durable(directory)
            tmp = self._write_temp(path, data)
            os.replace(tmp, path)
            fsync_dir(directory)
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
            fsync_dir(directory)
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
        fsync_dir(os.path.dirname(d))


def fsync_dir(directory: str) -> None:
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


def open_store(location: str, *configs: Any) -> LogStore:
    """A :class:`LogStore` for ``location``: a local path, or a URL of a registered store (``s3://``,
    ``abfss://``...). ``configs`` are the client configs the caller has (an ``S3Config``, an
    ``AzureConfig``...): each store takes the one of its own type, else its environment's defaults."""
    if "://" in location and not location.startswith("file://"):
        scheme = location.split("://", 1)[0]
        factory = _STORE_FACTORIES.get(scheme)
        if factory is None and scheme in _LAZY_STORES:
            importlib.import_module(_LAZY_STORES[scheme])  # registers its store
            factory = _STORE_FACTORIES.get(scheme)
        if factory is None:
            raise ConfigurationError(
                f"no transaction log store for {scheme}:// locations (log location {location!r}); "
                f"known: file paths{', ' + ', '.join(s + '://' for s in _STORE_FACTORIES) if _STORE_FACTORIES else ''}")
        return factory(location, *configs)
    return LocalLogStore(location[len("file://"):] if location.startswith("file://") else location)


_STORE_FACTORIES: dict[str, Any] = {}
#: store modules loaded on first use of their scheme (each calls :func:`register_store` when imported)
_LAZY_STORES = {"s3": "twophase.log_s3", "s3a": "twophase.log_s3", "abfss": "twophase.log_azure",
                "abfs": "twophase.log_azure", "az": "twophase.log_azure", "wasbs": "twophase.log_azure"}


def register_store(scheme: str, factory: Any) -> None:
    """Let ``open_store`` build stores for ``scheme://`` locations: ``factory(location, *configs)`` (the S3
    and Azure stores register here)."""
    _STORE_FACTORIES[scheme] = factory
