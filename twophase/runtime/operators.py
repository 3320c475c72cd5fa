"""Stream operators: map, filter, flat_map, and keyed processing with keyed state.

An operator runs inside one subtask thread; the task calls, in this order, ``open``, then
``restore`` (if a checkpoint has state for its uid), then ``process`` for each record and
``on_watermark`` for each combined watermark, ``snapshot`` at each checkpoint, ``end_input`` once at
the end of all input, ``close``.

Invariants (``test_operators_invN_*``):

1. ``snapshot`` returns a JSON value; ``restore`` of every subtask's snapshots of the same uid
   gives back the same logical state, whatever the new parallelism (keyed state is merged and
   filtered by key ownership: a key belongs to subtask ``stable_hash(key) % parallelism``, the same
   function that routes its records).
2. Keyed state is only ever touched for the key of the record being processed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Optional, Protocol

from twophase.runtime.channels import MIN_WATERMARK, stable_hash


class Output(Protocol):
    def emit(self, value: Any, timestamp: Optional[int] = None) -> None: ...


@dataclass(frozen=True)
class TaskInfo:
    """Where an operator instance runs."""

    uid: str
    subtask: int
    parallelism: int
    attempt: int


class Operator:
    """Base of every operator; stateless by default."""

    info: TaskInfo

    def open(self, info: TaskInfo) -> None:
        self.info = info

    def process(self, value: Any, timestamp: Optional[int], out: Output) -> None:
        raise NotImplementedError

    def on_watermark(self, watermark: int, out: Output) -> None:
        """Called with each new combined watermark, before the task forwards it."""

    def end_input(self, out: Output) -> None:
        """All input is consumed (after the maximum watermark)."""

    def snapshot(self) -> Any:
        return None

    def restore(self, states: list[Any]) -> None:
        """``states``: the snapshots of every subtask of this uid in the checkpoint (invariant 1)."""

    def close(self) -> None:
        pass


class MapOperator(Operator):
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def process(self, value: Any, timestamp: Optional[int], out: Output) -> None:
        out.emit(self.fn(value), timestamp)


class FilterOperator(Operator):
    def __init__(self, fn: Callable[[Any], bool]) -> None:
        self.fn = fn

    def process(self, value: Any, timestamp: Optional[int], out: Output) -> None:
        if self.fn(value):
            out.emit(value, timestamp)


class FlatMapOperator(Operator):
    def __init__(self, fn: Callable[[Any], Iterable[Any]]) -> None:
        self.fn = fn

    def process(self, value: Any, timestamp: Optional[int], out: Output) -> None:
        for v in self.fn(value):
            out.emit(v, timestamp)


def _to_key(k: Any) -> Any:
    """A key read back from JSON: lists become tuples again so they hash."""
    return tuple(_to_key(x) for x in k) if isinstance(k, list) else k


class KeyedStateBackend:
    """Per-key values of one operator subtask (heap backend); snapshots as ``[[key, value], ...]``."""

    def __init__(self) -> None:
        self.values: dict[Hashable, Any] = {}

    def snapshot(self) -> list[list[Any]]:
        return [[k, v] for k, v in self.values.items()]

    def restore(self, states: list[Any], info: TaskInfo) -> None:
        for st in states:
            for k, v in st or ():
                key = _to_key(k)
                if stable_hash(key) % info.parallelism == info.subtask:  # invariant 1
                    self.values[key] = v


class ValueState:
    """The state of the current key (invariant 2)."""

    __slots__ = ("_backend", "key")

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend
        self.key: Hashable = None

    def value(self, default: Any = None) -> Any:
        return self._backend.values.get(self.key, default)

    def update(self, value: Any) -> None:
        self._backend.values[self.key] = value

    def clear(self) -> None:
        self._backend.values.pop(self.key, None)


class KeyedContext:
    """What a keyed function sees: the key, its state, the record's timestamp, the current watermark."""

    __slots__ = ("key", "state", "timestamp", "watermark", "info")

    def __init__(self, state: ValueState, info: TaskInfo) -> None:
        self.state = state
        self.key: Hashable = None
        self.timestamp: Optional[int] = None
        self.watermark = MIN_WATERMARK
        self.info = info


class KeyedProcessOperator(Operator):
    """``fn(value, ctx) -> iterable of outputs (or None)`` per record, with per-key ``ctx.state``."""

    def __init__(self, key_fn: Callable[[Any], Hashable], fn: Callable[[Any, KeyedContext], Optional[Iterable[Any]]]) -> None:
        self.key_fn = key_fn
        self.fn = fn
        self.backend = KeyedStateBackend()

    def open(self, info: TaskInfo) -> None:
        super().open(info)
        self.state = ValueState(self.backend)
        self.ctx = KeyedContext(self.state, info)

    def process(self, value: Any, timestamp: Optional[int], out: Output) -> None:
        key = self.key_fn(value)
        self.state.key = key
        self.ctx.key = key
        self.ctx.timestamp = timestamp
        result = self.fn(value, self.ctx)
        if result is not None:
            for v in result:
                out.emit(v, timestamp)

    def on_watermark(self, watermark: int, out: Output) -> None:
        self.ctx.watermark = watermark

    def snapshot(self) -> Any:
        return self.backend.snapshot()

    def restore(self, states: list[Any]) -> None:
        self.backend.restore(states, self.info)


def keyed_map(fn: Callable[[Any, ValueState], Any]) -> Callable[[Any, KeyedContext], Iterable[Any]]:
    """Adapt ``fn(value, state) -> output`` to a keyed process function."""
    return lambda value, ctx: (fn(value, ctx.state),)


def keyed_reduce(fn: Callable[[Any, Any], Any]) -> Callable[[Any, KeyedContext], Iterable[Any]]:
    """A rolling reduce per key: emits the new aggregate after each record."""
    def process(value: Any, ctx: KeyedContext) -> Iterable[Any]:
        acc = ctx.state.value()
        acc = value if acc is None else fn(acc, value)
        ctx.state.update(acc)
        return (acc,)
    return process


class CollectSinkOperator(Operator):
    """A non-transactional sink that appends ``(value, timestamp)`` to a list (tests; at-least-once)."""

    def __init__(self, target: list, with_timestamps: bool = False) -> None:
        self.target = target
        self.with_timestamps = with_timestamps

    def process(self, value: Any, timestamp: Optional[int], out: Output) -> None:
        self.target.append((value, timestamp) if self.with_timestamps else value)
