"""Event time: watermark generation at the sources and the valve that combines input channels.

:class:`StatusWatermarkValve` (name from Flink) keeps, per input channel, its last watermark, its
status (active or idle) and whether it is *aligned* (active and caught up with the output).
Invariants (``test_valve_invN_*``):

1. The output watermark is the minimum over aligned active channels, and it never decreases.
2. An idle channel does not hold the watermark back; when every channel is idle the valve emits the
   maximum watermark seen over all channels (if it advances) and then an idle status.
3. A channel that becomes active again with a watermark below the output is not aligned, so it
   cannot move the watermark back; it rejoins the minimum once its watermark catches up.
4. End of input of a channel is a maximum watermark on it followed by idleness.

A source split gets its watermark from a :class:`WatermarkStrategy`: the largest timestamp seen minus
the allowed out-of-orderness minus one (Flink's bounded out-of-orderness), and it turns idle after
``idle_timeout_s`` seconds without records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from twophase.errors import ConfigurationError
from twophase.runtime.channels import MAX_WATERMARK, MIN_WATERMARK


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a source assigns timestamps and generates watermarks for each of its splits."""

    timestamp_fn: Callable[[Any], int]
    max_out_of_orderness: int = 0
    idle_timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.max_out_of_orderness < 0:
            raise ConfigurationError("WatermarkStrategy.max_out_of_orderness must be >= 0")
        if self.idle_timeout_s is not None and self.idle_timeout_s <= 0:
            raise ConfigurationError("WatermarkStrategy.idle_timeout_s must be > 0 (or None: never idle)")

    def watermark_for(self, max_timestamp: int) -> int:
        return max_timestamp - self.max_out_of_orderness - 1


@dataclass
class _ChannelStatus:
    watermark: int = MIN_WATERMARK
    active: bool = True
    aligned: bool = True


class StatusWatermarkValve:
    """Combines per-channel watermarks and statuses into one output (see module invariants).

    ``emit_watermark(ts)`` and ``emit_status(idle)`` are called with what the task should forward.
    """

    def __init__(self, num_channels: int, emit_watermark: Callable[[int], None],
                 emit_status: Callable[[bool], None]) -> None:
        self.channels = [_ChannelStatus() for _ in range(num_channels)]
        self.last_output = MIN_WATERMARK
        self.output_idle = False
        self._emit_watermark = emit_watermark
        self._emit_status = emit_status

    def input_watermark(self, channel: int, watermark: int) -> None:
        c = self.channels[channel]
        if not c.active or watermark <= c.watermark:
            return
        c.watermark = watermark
        if not c.aligned and watermark >= self.last_output:
            c.aligned = True  # invariant 3: rejoins once caught up
        self._output_min_of_aligned()

    def input_status(self, channel: int, idle: bool) -> None:
        c = self.channels[channel]
        if idle and c.active:
            c.active = False
            c.aligned = False
            if all(not ch.active for ch in self.channels):  # invariant 2
                self._output_max_of_all()
                if not self.output_idle:
                    self.output_idle = True
                    self._emit_status(True)
            else:
                self._output_min_of_aligned()
        elif not idle and not c.active:
            c.active = True
            if c.watermark >= self.last_output:
                c.aligned = True
            if self.output_idle:
                self.output_idle = False
                self._emit_status(False)

    def end_of_input(self, channel: int) -> None:
        """Invariant 4: the channel's watermark goes to the maximum and it stops counting."""
        self.input_watermark(channel, MAX_WATERMARK)
        self.input_status(channel, True)

    def _output_min_of_aligned(self) -> None:
        aligned = [c.watermark for c in self.channels if c.active and c.aligned]
        if aligned:
            new = min(aligned)
            if new > self.last_output:  # invariant 1
                self.last_output = new
                self._emit_watermark(new)

    def _output_max_of_all(self) -> None:
        new = max(c.watermark for c in self.channels)
        if new > self.last_output:
            self.last_output = new
            self._emit_watermark(new)
