"""Event-time tumbling windows, the example keyed operator driven by watermarks.

A record with timestamp ``t`` belongs to the window ``[t - t % size, t - t % size + size)``. A window
fires when the watermark reaches its last timestamp (``end - 1``) and emits one record
``{"key", "window_start", "window_end", "value"}`` with timestamp ``end - 1``.

Invariants (``test_windows_invN_*``):

1. A window fires exactly once, and only after the watermark passed its end: no record that the
   watermark still allows can be missing from it.
2. A record whose window already fired (the watermark passed its end) is late: it is dropped and
   counted in ``late_records``, never emitted in a second firing.
3. Open windows and their accumulators are keyed state: they survive a restore and rescaling.
4. At end of input the maximum watermark fires every open window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional

from twophase.errors import ConfigurationError
from twophase.runtime.channels import MIN_WATERMARK, stable_hash
from twophase.runtime.operators import Operator, Output, TaskInfo, _to_key


@dataclass(frozen=True)
class AggregateFunction:
    """``create() -> acc``, ``add(acc, value) -> acc``, ``result(acc) -> output``; acc must be JSON."""

    create: Callable[[], Any]
    add: Callable[[Any, Any], Any]
    result: Callable[[Any], Any] = lambda acc: acc


COUNT = AggregateFunction(lambda: 0, lambda acc, _v: acc + 1)


def sum_of(field: str) -> AggregateFunction:
    return AggregateFunction(lambda: 0, lambda acc, v: acc + v[field])


class TumblingEventTimeWindowOperator(Operator):
    """Keyed tumbling event-time windows (see module invariants)."""

    def __init__(self, key_fn: Callable[[Any], Hashable], size: int, aggregate: AggregateFunction) -> None:
        if size <= 0:
            raise ConfigurationError(f"window size must be > 0, got {size}")
        self.key_fn = key_fn
        self.size = size
        self.agg = aggregate
        self.windows: dict[tuple[Hashable, int], Any] = {}  # (key, start) -> accumulator
        self.watermark = MIN_WATERMARK
        self.late_records = 0

    def process(self, value: Any, timestamp: Optional[int], out: Output) -> None:
        if timestamp is None:
            raise ConfigurationError("event-time windows need timestamps: give the source a WatermarkStrategy")
        start = timestamp - timestamp % self.size
        if start + self.size - 1 <= self.watermark:
            self.late_records += 1  # invariant 2
            return
        k = (self.key_fn(value), start)
        acc = self.windows.get(k)
        self.windows[k] = self.agg.add(self.agg.create() if acc is None else acc, value)

    def on_watermark(self, watermark: int, out: Output) -> None:
        self.watermark = watermark
        due = sorted((k for k in self.windows if k[1] + self.size - 1 <= watermark), key=lambda k: (k[1], repr(k[0])))
        for k in due:  # invariant 1
            acc = self.windows.pop(k)
            end = k[1] + self.size
            out.emit({"key": k[0], "window_start": k[1], "window_end": end, "value": self.agg.result(acc)}, end - 1)

    def snapshot(self) -> Any:
        return {"watermark": self.watermark, "late": self.late_records,
                "windows": [[k[0], k[1], acc] for k, acc in self.windows.items()]}

    def restore(self, states: list[Any]) -> None:
        info: TaskInfo = self.info
        marks = [st["watermark"] for st in states if st]
        if marks:  # late-record decisions stay the same after a restore (invariant 2)
            self.watermark = min(marks)
        for st in states:
            if not st:
                continue
            for key, start, acc in st["windows"]:
                key = _to_key(key)
                if stable_hash(key) % info.parallelism == info.subtask:  # invariant 3
                    self.windows[(key, start)] = acc
