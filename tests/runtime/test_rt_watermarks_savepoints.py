"""Event time through a running job (idle sources, late-resuming channels, windows) and savepoints."""

from __future__ import annotations

import time

import pytest

from rt_helpers import assert_exactly_once, completed_records, keyed_counts, read_ids, slow
from twophase.sinks.files import FileSink
from twophase.errors import ConfigurationError
from twophase.runtime import (COUNT, CheckpointConfig, CollectionSource, JobGraph, JobRunner, JobStatus, Operator,
                              Savepoint, WatermarkStrategy)
from twophase.runtime.channels import MAX_WATERMARK


class WatermarkProbe(Operator):
    """Passes records through and records every watermark it sees."""

    def __init__(self, seen: list) -> None:
        self.seen = seen

    def process(self, value, timestamp, out):
        out.emit(value, timestamp)

    def on_watermark(self, watermark, out):
        self.seen.append(watermark)


def _events(key, n, start=0, step=10):
    return [{"k": key, "t": start + i * step} for i in range(n)]


def _wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("idle_timeout", [0.05, None])
def test_watermarks_idle_source_does_not_stall_windows(tmp_path, idle_timeout):
    """Source b never sends anything. With an idle timeout the windows of source a fire while the job
    runs; without one the watermark stalls at b and nothing fires until the job ends."""
    g = JobGraph("idle")
    strategy = WatermarkStrategy(lambda r: r["t"], 0, idle_timeout)
    a = g.source(CollectionSource({"a0": _events("x", 200)}, pause=slow(0.002), unbounded=True), uid="a",
                 watermarks=strategy)
    b = g.source(CollectionSource({"b0": []}, unbounded=True), uid="b", watermarks=strategy)
    results: list = []
    a.union(b).key_by(lambda r: r["k"]).window(100, COUNT, uid="win").collect(results)
    job = JobRunner(g, checkpointing=CheckpointConfig(0.05), state_location=str(tmp_path / "state")).start()
    try:
        fired = _wait_for(lambda: len(results) >= 5, timeout=1.5 if idle_timeout is None else 5.0)
    finally:
        job.cancel()
        assert job.wait(10).status is JobStatus.CANCELLED
    if idle_timeout is None:
        assert not fired and results == [], "without idleness the silent source holds the watermark back"
    else:
        assert fired and all(r["value"] == 10 for r in results[:5])


def test_watermarks_late_resuming_channel_does_not_move_watermark_back(tmp_path):
    """Source b goes idle, a advances the watermark, then b resumes with old timestamps: the watermark
    seen downstream never decreases, and the max watermark arrives at end of input."""
    g = JobGraph("late")
    strategy = WatermarkStrategy(lambda r: r["t"], 0, 0.03)
    gate = {"open": False}
    a = g.source(CollectionSource({"a0": _events("x", 300, start=1000)}, pause=slow(0.003)), uid="a",
                 watermarks=strategy)
    b = g.source(CollectionSource({"b0": _events("y", 50, start=0)}, pause=lambda s, p: not gate["open"]),
                 uid="b", watermarks=strategy)
    seen: list = []
    results: list = []
    a.union(b).process(lambda: WatermarkProbe(seen), uid="probe").key_by(lambda r: r["k"]) \
        .window(100, COUNT, uid="win").collect(results)
    job = JobRunner(g, checkpointing=CheckpointConfig(0.05), state_location=str(tmp_path / "state")).start()
    assert _wait_for(lambda: seen and seen[-1] >= 1500), "a alone moves the watermark while b is idle"
    gate["open"] = True
    assert job.wait(20).status is JobStatus.FINISHED
    assert seen == sorted(seen), "the combined watermark never goes back"
    assert seen[-1] == MAX_WATERMARK
    assert sum(r["value"] for r in results if r["key"] == "x") == 300
    # b's records were behind the watermark when b resumed: late, dropped, never a second firing
    assert sum(r["value"] for r in results if r["key"] == "y") < 50


def _savepoint_job(out, *, variant, data, unbounded):
    g = JobGraph("sp-job")
    src = g.source(CollectionSource({"s0": data}, pause=slow(0.03), unbounded=unbounded), uid="src")
    s = src
    if variant == 1:
        s = s.map(lambda r: dict(r, tag="old"), uid="old-tagger")

    def count(v, st):
        c = st.value(0) + 1
        st.update(c)
        return {"id": v["id"], "k": v["k"], "n": c}
    s = s.key_by(lambda r: r["k"]).map(count, uid="count", parallelism=2)
    if variant == 2:
        s = s.filter(lambda r: True, uid="new-filter")
    sink = FileSink.from_options({"path": out})
    s.sink_to(sink, uid="out")
    return g, sink


def test_savepoint_inv2_inv3_restore_with_operator_added_and_removed(tmp_path):
    out, sp = str(tmp_path / "out"), str(tmp_path / "sp" / "savepoint-1")
    data = [{"id": i, "k": i % 3} for i in range(3000)]
    g1, sink = _savepoint_job(out, variant=1, data=data, unbounded=True)
    job = JobRunner(g1, checkpointing=CheckpointConfig(0.05)).start()
    assert _wait_for(lambda: len(job.metrics.checkpoints_completed) >= 2)
    path = job.stop_with_savepoint(sp, timeout=10)
    assert job.wait(10).status is JobStatus.STOPPED
    saved = Savepoint.read(path)
    done = sum(v for k, v in keyed_counts(saved.task_state).items())
    assert 0 < done < 3000, "the savepoint is taken mid-stream"
    assert sorted(read_ids(out)) == list(range(done)), "output up to the savepoint is committed, nothing after"

    g2, _ = _savepoint_job(out, variant=2, data=data, unbounded=False)
    with pytest.raises(ConfigurationError, match="old-tagger"):  # invariant 2
        JobRunner(g2, checkpointing=CheckpointConfig(0.05), restore_from=path).run()
    g2, sink2 = _savepoint_job(out, variant=2, data=data, unbounded=False)
    result = JobRunner(g2, checkpointing=CheckpointConfig(0.05), restore_from=path,
                       allow_non_restored_state=True).run()
    assert result.status is JobStatus.FINISHED
    assert_exactly_once(out, set(range(3000)))
    assert keyed_counts(completed_records(sink2)[-1].task_state) == {0: 1000, 1: 1000, 2: 1000}, \
        "keyed state continued from the savepoint"


def test_savepoint_inv1_corrupt_file_is_refused(tmp_path):
    p = Savepoint("j", 3, {"a#0": {"op": 1}}).write(str(tmp_path / "sp"))
    assert Savepoint.read(p).task_state == {"a#0": {"op": 1}}
    data = bytearray(open(p, "rb").read())
    data[-3] ^= 1
    open(p, "wb").write(bytes(data))
    from twophase.errors import LogCorruptError
    with pytest.raises(LogCorruptError):
        Savepoint.read(p)
