"""Helpers of the runtime tests: the standard two-source keyed job, reading the file sink's output."""

from __future__ import annotations

import glob
import os
import time
from collections import Counter
from typing import Any, Callable, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from twophase.sinks.files import FileSink
from twophase.log import TransactionLog
from twophase.runtime import CheckpointConfig, CollectionSource, JobGraph, JobRunner
from twophase.states import CheckpointState

pa.RecordBatch.from_pylist([{"warm": 1}])  # pyarrow's first from_pylist takes ~0.4 s; keep it out of the jobs


def read_ids(path: str, column: str = "id") -> list[Any]:
    """Every value of ``column`` in the committed files under ``path`` (what a reader sees)."""
    out: list[Any] = []
    for f in sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True)):
        if "/_twophase/" in f or os.path.basename(f).startswith((".", "_")):
            continue
        out += pq.read_table(f).column(column).to_pylist()
    return out


def assert_exactly_once(path: str, expected: set) -> None:
    ids = read_ids(path)
    dup = [k for k, c in Counter(ids).items() if c > 1]
    assert not dup, f"duplicates in output: {dup[:10]} ({len(dup)} ids)"
    missing = expected - set(ids)
    assert not missing, f"missing from output: {sorted(missing)[:10]} ({len(missing)} ids)"
    assert set(ids) == expected


def completed_records(sink: FileSink) -> list:
    log: TransactionLog = sink.transaction_log()
    return [r for r in log.records() if r.state in (CheckpointState.COMPLETED, CheckpointState.COMMITTED)]


def slow(seconds: float) -> Callable[[str, int], bool]:
    """A CollectionSource pause hook that sleeps before each read (never pauses for good)."""
    def pause(_split: str, _pos: int) -> bool:
        time.sleep(seconds)
        return False
    return pause


def two_source_job(out: str, *, n_a: int = 8000, n_b: int = 2000, a_delay: float = 0.005,
                   b_delay: float = 0.02, map_fn: Optional[Callable[[dict], dict]] = None,
                   name: str = "two-sources", key_parallelism: int = 1, unbounded: bool = False,
                   extra: Optional[Callable[[Any], Any]] = None) -> tuple[JobGraph, FileSink, set]:
    """Sources a (split a0) and b (split b0) -> map -> key_by(split) count -> file sink.

    Records are ``{"id", "split", "off"}``; the keyed operator keeps, per split, how many records of
    it reached its state -- equal to the split's position at a barrier if alignment holds.
    """
    g = JobGraph(name)
    a = g.source(CollectionSource({"a0": [{"id": i, "split": "a0", "off": i} for i in range(n_a)]},
                                  pause=slow(a_delay), unbounded=unbounded), uid="a")
    b = g.source(CollectionSource({"b0": [{"id": 10**6 + i, "split": "b0", "off": i} for i in range(n_b)]},
                                  pause=slow(b_delay), unbounded=unbounded), uid="b")
    s = a.union(b)
    if map_fn is not None:
        s = s.map(map_fn, uid="mapper")

    def count(v: dict, st: Any) -> dict:
        c = st.value(0) + 1
        st.update(c)
        return {"id": v["id"], "split": v["split"], "n": c}
    s = s.key_by(lambda r: r["split"]).map(count, uid="count", parallelism=key_parallelism)
    if extra is not None:
        s = extra(s)
    sink = FileSink.from_options({"path": out})
    s.sink_to(sink, uid="out", parallelism=2)
    expected = set(range(n_a)) | {10**6 + i for i in range(n_b)}
    return g, sink, expected


def keyed_counts(task_state: dict, uid: str = "count") -> dict:
    out: dict = {}
    for tid, st in task_state.items():
        if tid.startswith(uid + "#") and st and st.get("op"):
            for k, v in st["op"]:
                out[k] = out.get(k, 0) + v
    return out


def positions(task_state: dict) -> dict:
    out: dict = {}
    for tid, st in task_state.items():
        if st and "splits" in st:
            out.update(st["splits"])
    return out


def in_flight_per_split(task_state: dict, uids: tuple = ("mapper", "count")) -> Counter:
    """In-flight records (unaligned channel state) per split, stored with the tasks of ``uids``."""
    c: Counter = Counter()
    for tid, st in task_state.items():
        if tid.rpartition("#")[0] in uids and st and st.get("channels"):
            for _ch, recs in st["channels"]:
                for v, _ts in recs:
                    c[v["split"]] += 1
    return c


class FailOnce:
    """A map function that raises once, on the k-th record it sees after ``armed()`` is true."""

    def __init__(self, k: int, armed: Callable[[], bool] = lambda: True) -> None:
        self.k, self.armed, self.seen, self.fired = k, armed, 0, 0
        self.limit = 1

    def __call__(self, v: dict) -> dict:
        if self.fired < self.limit and self.armed():
            self.seen += 1
            if self.seen >= self.k:
                self.fired += 1
                self.seen = 0
                raise RuntimeError(f"injected failure #{self.fired}")
        return v


def runner(g: JobGraph, mode: str = "aligned", interval: float = 0.03, **kw: Any) -> JobRunner:
    return JobRunner(g, checkpointing=CheckpointConfig(interval, mode=mode, timeout_s=kw.pop("timeout_s", 10.0),
                                                       tolerable_failures=kw.pop("tolerable_failures", 0)), **kw)
