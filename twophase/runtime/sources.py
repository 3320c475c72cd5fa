"""Sources for the embedded runtime: splits with positions, read by source tasks.

A :class:`Source` names its splits (stable ids: a Kafka partition, a file, a slice of a collection)
and opens a :class:`SplitReader` for a split at a position. The runtime assigns splits to source
subtasks round-robin, records each split's :meth:`SplitReader.position` when it injects a barrier,
and on restore opens each split at the recorded position. Positions are JSON values.

Invariants every source must keep (``test_source_invN_*``):

1. Replayable: reading a split from a recorded position yields the same records that followed that
   position the first time (the replay of ``[start, end)`` is identical).
2. ``position()`` is the position of the next record not yet returned; it only moves forward.
3. A bounded source eventually reports every split ``finished``; an unbounded one never does.
"""

from __future__ import annotations

import abc
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from twophase.errors import ConfigurationError


@dataclass
class ReadResult:
    """Records read from a split (possibly none for now) and whether the split is exhausted."""

    records: list[Any] = field(default_factory=list)
    finished: bool = False


class SplitReader(abc.ABC):
    """Reads one split sequentially from a position (see module invariants)."""

    @abc.abstractmethod
    def read(self, max_records: int) -> ReadResult:
        """Up to ``max_records`` next records; may return none without being finished (nothing yet)."""

    @abc.abstractmethod
    def position(self) -> Any:
        """JSON position of the next record (invariant 2)."""

    def close(self) -> None:
        """Release the reader's resources."""


class Source(abc.ABC):
    """A replayable, split source (invariant 1)."""

    #: False for sources that never end (Kafka); the job then runs until cancelled or stopped
    bounded: bool = True

    @abc.abstractmethod
    def splits(self) -> list[str]:
        """The split ids, stable across runs."""

    @abc.abstractmethod
    def open_reader(self, split_id: str, position: Optional[Any]) -> SplitReader:
        """A reader of ``split_id`` starting at ``position`` (None: the beginning)."""


# --------------------------------------------------------------------------- collections


class _ListReader(SplitReader):
    def __init__(self, source: "CollectionSource", split_id: str, data: Sequence[Any], start: int) -> None:
        self.source, self.split_id, self.data, self.pos = source, split_id, data, start

    def read(self, max_records: int) -> ReadResult:
        if self.source.pause is not None and self.source.pause(self.split_id, self.pos):
            return ReadResult()
        limit = self.source.pause_at.get(self.split_id) if self.source.pause_at else None
        end = min(self.pos + max_records, len(self.data))
        if limit is not None and self.pos < limit:
            end = min(end, limit)
        records = list(self.data[self.pos:end])
        self.pos = end
        finished = self.pos >= len(self.data) and not self.source.unbounded
        return ReadResult(records, finished)

    def position(self) -> int:
        return self.pos


class CollectionSource(Source):
    """In-memory splits of records; position is the index of the next record (replayable).

    ``data``: split id -> records (or a list of lists, split ids ``"0"``, ``"1"``, ...).
    ``unbounded``: splits never finish (they just have nothing more), as with a live topic.
    ``pause(split_id, position) -> bool``: a test hook; while it returns True the split returns nothing.
    ``pause_at``: split id -> position a read never crosses in one step (so ``pause`` sees it).
    """

    def __init__(self, data: Mapping[str, Sequence[Any]] | Sequence[Sequence[Any]], *, unbounded: bool = False,
                 pause: Optional[Callable[[str, int], bool]] = None,
                 pause_at: Optional[Mapping[str, int]] = None) -> None:
        if not isinstance(data, Mapping):
            data = {str(i): list(d) for i, d in enumerate(data)}
        if not data:
            raise ConfigurationError("CollectionSource needs at least one split")
        self.data = {str(k): list(v) for k, v in data.items()}
        self.unbounded = unbounded
        self.bounded = not unbounded
        self.pause = pause
        self.pause_at = dict(pause_at or {})

    def splits(self) -> list[str]:
        return list(self.data)

    def open_reader(self, split_id: str, position: Optional[Any]) -> SplitReader:
        start = int(position or 0)
        if not 0 <= start <= len(self.data[split_id]):
            raise ConfigurationError(f"position {start} is outside split {split_id!r} (0..{len(self.data[split_id])})")
        return _ListReader(self, split_id, self.data[split_id], start)


# --------------------------------------------------------------------------- files


class _LinesReader(SplitReader):
    def __init__(self, path: str, offset: int, parse: Callable[[str], Any]) -> None:
        self.f = open(path, "rb")
        self.f.seek(offset)
        self.offset = offset
        self.parse = parse

    def read(self, max_records: int) -> ReadResult:
        out = []
        for _ in range(max_records):
            line = self.f.readline()
            if not line:
                return ReadResult(out, True)
            if not line.endswith(b"\n"):  # a torn last line is not a record (yet)
                self.f.seek(self.offset)
                return ReadResult(out, True)
            self.offset += len(line)
            if line.strip():
                out.append(self.parse(line.decode()))
        return ReadResult(out, False)

    def position(self) -> int:
        return self.offset

    def close(self) -> None:
        self.f.close()


class FileLinesSource(Source):
    """One split per file of text lines (JSON lines by default); the position is a byte offset."""

    def __init__(self, paths: Sequence[str], parse: Callable[[str], Any] = json.loads) -> None:
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise ConfigurationError(f"FileLinesSource: no such files {missing}; give existing paths")
        self.paths = {os.path.abspath(p): os.path.abspath(p) for p in paths}
        self.parse = parse

    def splits(self) -> list[str]:
        return list(self.paths)

    def open_reader(self, split_id: str, position: Optional[Any]) -> SplitReader:
        return _LinesReader(self.paths[split_id], int(position or 0), self.parse)
