"""A one-line progress indicator for the command line, for commands that walk a long log.

Only the CLI (:mod:`twophase.cli`) creates one, and only when asked (``--progress``) or when its stream
is a terminal (:func:`progress_enabled`); library functions take an optional ``progress`` callback
``(done, total) -> None`` and never write to a stream themselves. No dependency: a carriage return
rewrites the line, at most :attr:`Progress.min_interval` apart, and :meth:`Progress.close` ends it
with a newline, so stdout (the command's real output, e.g. JSON) is never mixed with it.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

#: what a library function calls with ``(done, total)`` as it walks; None means no progress
ProgressCallback = Callable[[int, int], None]


def progress_enabled(flag: Optional[bool], stream: Optional[TextIO] = None) -> bool:
    """``flag`` when given (``--progress`` / ``--no-progress``), else whether ``stream`` (stderr) is a TTY."""
    if flag is not None:
        return flag
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False


class Progress:
    """``twophase: <label> <done>/<total> (<pct>%, <rate>/s)`` rewritten in place on ``stream``.

    Invariants: nothing is written before ``delay`` seconds have passed since the start (a short walk
    shows nothing unless ``delay`` is 0), the last update is always drawn once drawing began, and every
    line written is ended by :meth:`close` (also on an error: use it as a context manager)."""

    #: seconds between two redraws
    min_interval: float = 0.1

    def __init__(self, label: str, stream: Optional[TextIO] = None, *, delay: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.delay = delay
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.started = clock()
        self._last_draw: Optional[float] = None
        self._width = 0

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if self._last_draw is None and now - self.started < self.delay:
            return
        if self._last_draw is not None and now - self._last_draw < self.min_interval and done < total:
            return
        self._last_draw = now
        elapsed = max(now - self.started, 1e-9)
        pct = f"{100 * done / total:.0f}%" if total else "-"
        line = f"twophase: {self.label} {done}/{total} ({pct}, {done / elapsed:.0f}/s)"
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)

    def close(self) -> None:
        """End the line (if one was drawn)."""
        if self._last_draw is not None:
            self.stream.write("\n")
            self.stream.flush()
            self._last_draw = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
