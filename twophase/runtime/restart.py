"""Restart strategies: whether, and after how long, a failed job is restarted (names from Flink).

Invariants (``test_restart_invN_*``):

1. :class:`NoRestart` never restarts: the first failure fails the job.
2. :class:`FixedDelayRestart` restarts at most ``attempts`` times in total, each after ``delay_s``.
3. :class:`FailureRateRestart` restarts unless more than ``max_failures`` failures happened within
   the last ``interval_s`` seconds.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from twophase.errors import ConfigurationError


class RestartStrategy:
    """Asked once per failure: ``on_failure(now)`` returns the delay before restarting, or None to fail."""

    def on_failure(self, now: float) -> float | None:
        raise NotImplementedError


class NoRestart(RestartStrategy):
    def on_failure(self, now: float) -> float | None:
        return None

    def __repr__(self) -> str:
        return "NoRestart()"


@dataclass
class FixedDelayRestart(RestartStrategy):
    attempts: int = 3
    delay_s: float = 0.0
    used: int = 0

    def __post_init__(self) -> None:
        if self.attempts < 0 or self.delay_s < 0:
            raise ConfigurationError("FixedDelayRestart: attempts and delay_s must be >= 0")

    def on_failure(self, now: float) -> float | None:
        if self.used >= self.attempts:
            return None
        self.used += 1
        return self.delay_s


@dataclass
class FailureRateRestart(RestartStrategy):
    max_failures: int = 3
    interval_s: float = 60.0
    delay_s: float = 0.0
    failures: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.max_failures < 1 or self.interval_s <= 0 or self.delay_s < 0:
            raise ConfigurationError("FailureRateRestart: max_failures >= 1, interval_s > 0, delay_s >= 0")

    def on_failure(self, now: float) -> float | None:
        self.failures.append(now)
        while self.failures and now - self.failures[0] > self.interval_s:
            self.failures.popleft()
        if len(self.failures) > self.max_failures:
            return None
        return self.delay_s


def parse_restart_strategy(spec: str) -> RestartStrategy:
    """``none`` | ``fixed-delay:<attempts>:<delay_s>`` | ``failure-rate:<max>:<interval_s>:<delay_s>``."""
    parts = spec.strip().lower().split(":")
    try:
        if parts[0] == "none" and len(parts) == 1:
            return NoRestart()
        if parts[0] == "fixed-delay" and len(parts) == 3:
            return FixedDelayRestart(int(parts[1]), float(parts[2]))
        if parts[0] == "failure-rate" and len(parts) == 4:
            return FailureRateRestart(int(parts[1]), float(parts[2]), float(parts[3]))
    except ValueError:
        pass
    raise ConfigurationError(f"restart strategy {spec!r} is not valid; use 'none', 'fixed-delay:<attempts>:<delay_s>' "
                             "or 'failure-rate:<max_failures>:<interval_s>:<delay_s>'")


Clock = Callable[[], float]
_monotonic: Clock = time.monotonic
