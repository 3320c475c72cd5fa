"""twophase-postgres: the driver's statements that wait on the server, watched by ONE thread per process.

A stopped (SIGSTOP) or hung server's kernel answers TCP keepalives, and a server-side ``statement_timeout`` cannot
fire in a stopped process: a statement on an open connection waits until the server answers. Each driver statement
(COMMIT / ROLLBACK PREPARED, the marker reads, the sweeps, the destination checks, the completion guard's fence
locks) runs inside :meth:`Watcher.watch`, which

- warns ``postgres_statement_waiting`` every ``warn_s`` seconds while the block waits, and
- at ``deadline_s`` (option ``serverWaitTimeout``) abandons the statement: the connection's socket is shut down
  (the blocked read returns at once; psycopg raises ``OperationalError`` and the connection is unusable), and the
  block raises a retriable :class:`~twophase.errors.TransientSinkError` naming the option. The caller must treat
  the abandoned statement's outcome as unknown (``PostgresSink.commit`` re-checks ``pg_prepared_xacts`` and the
  marker before it acts again).

One daemon thread (started on first use) serves every watched block of every sink of the process: before, each
block started its own thread (one per COMMIT PREPARED)."""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from twophase._logging import get_logger

_log = get_logger("twophase.sinks.postgres")

THREAD_NAME = "twophase-postgres-waiting"


@dataclass
class _Wait:
    doing: str
    start: float
    warn_s: float
    deadline_s: float
    conn: Callable[[], Any]
    warn: Callable[[str, float], None]
    next_warn: float = 0.0
    #: the deadline passed while the block had no connection yet (connecting): tried again from then on
    next_try: float = 0.0
    expired: bool = False
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def shutdown_socket(conn: Any) -> bool:
    """Shut the socket of psycopg connection ``conn`` down (both directions): a read blocked on it returns at once,
    whatever the server does. Returns whether there was a socket to shut down."""
    try:
        fd = conn.pgconn.socket
    except Exception:  # closed, or never connected
        return False
    try:
        dup = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        dup.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        dup.close()  # the duplicate only: the connection's own descriptor is psycopg's to close


class Watcher:
    """The process's watcher of waiting statements (one thread for all of them)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waits: dict[int, _Wait] = {}
        self._ids = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()

    @contextlib.contextmanager
    def watch(self, doing: str, *, warn_s: float, deadline_s: float, conn: Callable[[], Any],
              warn: Callable[[str, float], None]) -> Iterator[_Wait]:
        """Watch the block: ``warn(doing, waited_s)`` every ``warn_s`` s, and at ``deadline_s`` (0: never) the
        socket of ``conn()`` shut down and ``expired`` set on the yielded wait."""
        now = time.monotonic()
        w = _Wait(doing, now, warn_s, deadline_s, conn, warn, next_warn=now + warn_s)
        with self._cond:
            key = next(self._ids)
            self._waits[key] = w
            self._ensure_thread()
            self._cond.notify()
        try:
            yield w
        finally:
            with w.lock:
                w.done = True
            with self._cond:
                self._waits.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = []
                nearest = None
                for w in self._waits.values():
                    events = [w.next_warn] + ([max(w.start + w.deadline_s, w.next_try)]
                                              if w.deadline_s > 0 and not w.expired else [])
                    when = min(events)
                    if when <= now:
                        due.append(w)
                    else:
                        nearest = when if nearest is None else min(nearest, when)
                if not due:
                    self._cond.wait(None if nearest is None else nearest - now)
                    continue
            for w in due:  # outside the condition: a warning or a shutdown never holds up registrations
                self._fire(w, now)

    @staticmethod
    def _fire(w: _Wait, now: float) -> None:
        with w.lock:
            if w.done:
                return
            if w.deadline_s > 0 and not w.expired and now >= max(w.start + w.deadline_s, w.next_try):
                try:
                    conn = w.conn()
                except Exception:
                    conn = None
                w.expired = True  # before the shutdown: the block, woken by it, must see it
                if conn is None or not shutdown_socket(conn):
                    # no connection yet (the block is connecting: connect_timeout ends that): look again soon
                    w.expired = False
                    w.next_try = now + 0.5
            if now >= w.next_warn:
                while w.next_warn <= now:
                    w.next_warn += w.warn_s
                try:
                    w.warn(w.doing, now - w.start)
                except Exception:  # a log handler's failure never stops the watcher
                    pass


#: the process's one watcher
WATCHER = Watcher()
