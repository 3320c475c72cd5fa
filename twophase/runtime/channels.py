"""Channels between tasks: bounded queues with backpressure, and the stream elements they carry.

A task's inputs form one :class:`InputGate`: one FIFO per upstream subtask (a *channel*), all guarded
by one lock. A producer blocks in :meth:`InputGate.put` while the channel holds ``capacity`` elements
(backpressure reaches the sources). The consumer polls the gate; channels the barrier handler has
*blocked* are skipped, so their data stays queued (and, once full, stalls their producer) until the
alignment ends.

Elements, in the order a producer sends them:

* a data buffer: a ``list`` of ``(value, timestamp)`` records (``timestamp`` may be None);
* :class:`Watermark`, :class:`StreamStatus` (idle/active);
* :class:`~twophase.checkpoint.CheckpointBarrier`, :class:`~twophase.checkpoint.CancelCheckpointMarker`;
* :data:`END_OF_INPUT`, the last element of a channel.

Invariants (``test_channels_invN_*``):

1. Elements of one channel are delivered in the order they were put, except an element put with
   :meth:`InputGate.put_priority` (an unaligned barrier), which is delivered before every queued
   element; the number of elements it overtook is returned to the producer's caller and recorded.
2. ``put`` never holds more than ``capacity`` elements in a channel; ``put_priority`` may exceed it
   by one (a barrier must never wait behind data it overtakes).
3. After :meth:`InputGate.close`, every blocked ``put`` and ``poll`` returns at once (``put`` raises
   :class:`TaskCancelled`), so a failed job always shuts down.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence

MAX_WATERMARK = (1 << 63) - 1
MIN_WATERMARK = -(1 << 63)


@dataclass(frozen=True)
class Watermark:
    """No record with a timestamp ``<= timestamp`` is expected any more on this channel."""

    timestamp: int


@dataclass(frozen=True)
class StreamStatus:
    """A channel became idle (sends no records or watermarks for a while) or active again."""

    idle: bool


class _EndOfInput:
    def __repr__(self) -> str:
        return "END_OF_INPUT"


#: The last element of every channel of a finished producer.
END_OF_INPUT = _EndOfInput()


class TaskCancelled(Exception):
    """Raised inside a task thread when the job is being torn down (not an error of the task)."""


@dataclass
class PriorityEvent:
    """A priority element (unaligned barrier) and how many queued elements it overtook."""

    element: Any
    overtaken: int


class InputGate:
    """The input channels of one task (see module invariants)."""

    def __init__(self, num_channels: int, capacity: int = 8, name: str = "") -> None:
        if num_channels < 1:
            raise ValueError("an input gate needs at least one channel")
        self.name = name
        self.capacity = capacity
        self._lock = threading.Lock()
        self._data = threading.Condition(self._lock)
        self._space = threading.Condition(self._lock)
        self._queues: list[deque[Any]] = [deque() for _ in range(num_channels)]
        self._priority: list[deque[PriorityEvent]] = [deque() for _ in range(num_channels)]
        self._blocked = [False] * num_channels
        self._next = 0
        self._closed = False

    @property
    def num_channels(self) -> int:
        return len(self._queues)

    # ---- producer side

    def put(self, channel: int, element: Any, *, cancelled: Optional[threading.Event] = None) -> None:
        """Append ``element`` to ``channel``, blocking while it is full (invariant 2)."""
        q = self._queues[channel]
        with self._lock:
            while len(q) >= self.capacity and not self._closed:
                self._space.wait(0.05)
                if cancelled is not None and cancelled.is_set():
                    raise TaskCancelled()
            if self._closed:
                raise TaskCancelled()
            q.append(element)
            self._data.notify()

    def put_priority(self, channel: int, element: Any) -> int:
        """Deliver ``element`` ahead of everything queued in ``channel``; returns how many it overtook."""
        with self._lock:
            if self._closed:
                raise TaskCancelled()
            overtaken = len(self._queues[channel])
            self._priority[channel].append(PriorityEvent(element, overtaken))
            self._data.notify()
            return overtaken

    # ---- consumer side

    def poll(self, timeout: float) -> Optional[tuple[int, Any]]:
        """The next ``(channel, element)`` from an unblocked channel, or None after ``timeout`` seconds.

        Priority elements come first and are returned as :class:`PriorityEvent` (even from a blocked
        channel). Channels are served round-robin so no channel starves.
        """
        deadline = None
        with self._lock:
            while True:
                n = len(self._queues)
                for ch in range(n):
                    if self._priority[ch]:
                        return ch, self._priority[ch].popleft()
                start = self._next
                for i in range(n):
                    ch = (start + i) % n
                    q = self._queues[ch]
                    if q and not self._blocked[ch]:
                        self._next = (ch + 1) % n
                        element = q.popleft()
                        if len(q) == self.capacity - 1:
                            self._space.notify_all()
                        return ch, element
                if self._closed:
                    return None
                if deadline is None:
                    deadline = time.monotonic() + timeout
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._data.wait(remaining)

    def peek_queued(self, channel: int, count: int) -> list[Any]:
        """A copy of the first ``count`` queued elements of ``channel`` (what a priority barrier overtook)."""
        with self._lock:
            return [self._queues[channel][i] for i in range(min(count, len(self._queues[channel])))]

    def block(self, channel: int) -> None:
        with self._lock:
            self._blocked[channel] = True

    def unblock_all(self) -> None:
        with self._lock:
            self._blocked = [False] * len(self._queues)
            self._data.notify_all()

    def is_blocked(self, channel: int) -> bool:
        return self._blocked[channel]

    def close(self) -> None:
        """Wake every producer and consumer; later puts raise :class:`TaskCancelled` (invariant 3)."""
        with self._lock:
            self._closed = True
            self._data.notify_all()
            self._space.notify_all()

    def queued(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._queues)


# --------------------------------------------------------------------------- partitioning


def _normalize_key(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(_normalize_key(k) for k in key)
    return key


def stable_hash(key: Hashable) -> int:
    """A hash of ``key`` that is the same in every process (Python's ``hash`` of str is salted).

    Lists (keys read back from JSON) hash like the tuples they were.
    """
    if isinstance(key, bool):
        key = int(key)
    if isinstance(key, int):
        return key & 0x7FFFFFFF
    return zlib.crc32(repr(_normalize_key(key)).encode())


Partitioner = Callable[[Any, int], int]
"""(record value, number of channels) -> channel index."""


def hash_partitioner(key_fn: Callable[[Any], Hashable]) -> Partitioner:
    """Records with equal keys go to the same channel: ``stable_hash(key) % n``."""
    return lambda value, n: stable_hash(key_fn(value)) % n


@dataclass
class _Target:
    gate: InputGate
    channel: int


class OutputEdge:
    """One output edge of a subtask: the targets (downstream channels) and how records are routed."""

    def __init__(self, targets: Sequence[tuple[InputGate, int]], partitioner: Optional[Partitioner],
                 buffer_size: int) -> None:
        self.targets = [_Target(g, c) for g, c in targets]
        self.partitioner = partitioner  # None: forward / round-robin
        self.buffers: list[list[Any]] = [[] for _ in self.targets]
        self.buffer_size = buffer_size
        self._rr = 0


class RecordWriter:
    """A subtask's outputs: buffers records per target channel and flushes full buffers.

    Events (watermarks, barriers, ...) flush every buffer first, then go to every channel, so they
    keep their place in each channel's order (invariant 1).
    """

    def __init__(self, edges: Sequence[OutputEdge], cancelled: threading.Event) -> None:
        self.edges = list(edges)
        self.cancelled = cancelled
        self.records_out = 0

    def emit(self, value: Any, timestamp: Optional[int] = None) -> None:
        self.records_out += 1
        for edge in self.edges:
            n = len(edge.targets)
            if n == 1:
                i = 0
            elif edge.partitioner is not None:
                i = edge.partitioner(value, n)
            else:
                i = edge._rr
                edge._rr = (i + 1) % n
            buf = edge.buffers[i]
            buf.append((value, timestamp))
            if len(buf) >= edge.buffer_size:
                self._flush_one(edge, i)

    def _flush_one(self, edge: OutputEdge, i: int) -> None:
        buf = edge.buffers[i]
        if buf:
            edge.buffers[i] = []
            t = edge.targets[i]
            t.gate.put(t.channel, buf, cancelled=self.cancelled)

    def flush(self) -> None:
        for edge in self.edges:
            for i in range(len(edge.targets)):
                self._flush_one(edge, i)

    def broadcast(self, event: Any) -> None:
        """Flush, then send ``event`` to every downstream channel."""
        self.flush()
        for edge in self.edges:
            for t in edge.targets:
                t.gate.put(t.channel, event, cancelled=self.cancelled)

    def broadcast_priority(self, event: Any) -> None:
        """Flush, then send ``event`` ahead of queued data to every downstream channel (unaligned barrier)."""
        self.flush()
        for edge in self.edges:
            for t in edge.targets:
                t.gate.put_priority(t.channel, event)
