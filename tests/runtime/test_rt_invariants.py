"""Unit tests of runtime invariants that had no test of their own (issue 10): windows, sources,
savepoints, the job graph, the committer, barrier handlers and keyed operators.

Every test says in its docstring how it would fail if the invariant it is named after were broken.
"""

from __future__ import annotations

import json
import logging

import pytest

from fakes import FakeSink
from twophase.checkpoint import CheckpointBarrier
from twophase.errors import ConfigurationError
from twophase.runtime import COUNT, CollectionSource, JobGraph
from twophase.runtime.barriers import AligningBarrierHandler, UnalignedBarrierHandler
from twophase.runtime.channels import MAX_WATERMARK, InputGate, hash_partitioner, stable_hash
from twophase.runtime.committer import JobCommitter
from twophase.runtime.operators import KeyedProcessOperator, TaskInfo, keyed_map
from twophase.runtime.savepoint import match_state
from twophase.runtime.windows import TumblingEventTimeWindowOperator


class Out:
    def __init__(self):
        self.items = []

    def emit(self, value, timestamp=None):
        self.items.append((value, timestamp))


def info(uid="op", subtask=0, parallelism=1):
    return TaskInfo(uid, subtask, parallelism, 1)


def window_op(subtask=0, parallelism=1, size=10):
    op = TumblingEventTimeWindowOperator(lambda r: r["k"], size, COUNT)
    op.open(info("win", subtask, parallelism))
    return op


# ---------------------------------------------------------------- windows


def test_windows_inv1_fires_once_and_only_after_the_watermark_passed_its_end():
    """Fails if a window fires before the watermark reaches ``end - 1`` (the first check sees output
    at watermark 8), fires twice (a second watermark past its end emits it again), or misses a record
    the watermark still allowed (the count would be below 10)."""
    op, out = window_op(), Out()
    for t in range(0, 10):
        op.process({"k": "a"}, t, out)
    op.process({"k": "a"}, 12, out)  # next window [10, 20)
    op.on_watermark(8, out)
    assert out.items == [], "window [0, 10) fired before the watermark reached 9"
    op.process({"k": "a"}, 9, out)  # still allowed: watermark 8 < 9
    op.on_watermark(9, out)
    assert out.items == [({"key": "a", "window_start": 0, "window_end": 10, "value": 11}, 9)]
    op.on_watermark(15, out)
    op.on_watermark(15, out)
    assert len(out.items) == 1, "a window fired a second time"


def test_windows_inv2_late_record_is_dropped_and_counted_never_fired_again():
    """Fails if a record of an already fired window is added to a new accumulator (a second firing
    of [0, 10) at the next watermark) or is not counted in ``late_records``."""
    op, out = window_op(), Out()
    op.process({"k": "a"}, 3, out)
    op.on_watermark(9, out)
    assert len(out.items) == 1
    op.process({"k": "a"}, 5, out)  # its window [0, 10) already fired
    assert op.late_records == 1
    op.on_watermark(100, out)
    op.on_watermark(MAX_WATERMARK, out)
    assert len(out.items) == 1, "the late record caused a second firing of its window"
    # the late decision survives a restore: the watermark is part of the snapshot
    op2 = window_op()
    op2.restore([json.loads(json.dumps(op.snapshot()))])
    op2.process({"k": "a"}, 5, out)
    assert op2.late_records == 1 and not op2.windows


def test_windows_inv3_open_windows_survive_restore_and_rescaling():
    """Two subtasks hold open windows of many keys; their JSON snapshots are restored into three
    subtasks. Fails if a window or its accumulator is lost or duplicated (the fired totals differ from
    the records fed) or lands on a subtask that does not own its key (``stable_hash(key) % 3``)."""
    keys = [f"k{i}" for i in range(20)]
    old = [window_op(s, 2) for s in range(2)]
    fed = {}
    for i, k in enumerate(keys):
        owner = old[stable_hash(k) % 2]
        for t in range(i % 7 + 1):
            owner.process({"k": k}, t, Out())
            fed[k] = fed.get(k, 0) + 1
    snaps = [json.loads(json.dumps(o.snapshot())) for o in old]
    fired = {}
    for s in range(3):
        new = window_op(s, 3)
        new.restore(snaps)
        for (k, _start) in new.windows:
            assert stable_hash(k) % 3 == s, f"key {k} restored on subtask {s}"
        out = Out()
        new.on_watermark(MAX_WATERMARK, out)
        for v, _ts in out.items:
            assert v["key"] not in fired, f"window of {v['key']} restored twice"
            fired[v["key"]] = v["value"]
    assert fired == fed


def test_windows_inv4_maximum_watermark_fires_every_open_window():
    """Fails if a window is still open after the maximum watermark (end of input): its records would
    never be emitted."""
    op, out = window_op(size=1000), Out()
    for t in (5, 1500, 10**9):
        for k in ("a", "b"):
            op.process({"k": k}, t, out)
    op.on_watermark(MAX_WATERMARK, out)
    assert not op.windows
    assert sorted((v["key"], v["window_start"]) for v, _ in out.items) == \
        sorted((k, s) for k in ("a", "b") for s in (0, 1000, 10**9))


# ---------------------------------------------------------------- sources


def _read_until_finished(reader, rounds):
    for _ in range(rounds):
        if reader.read(10).finished:
            return True
    return False


def test_source_inv3_bounded_source_finishes_unbounded_one_never_does():
    """Fails if a bounded split never reports ``finished`` (a bounded job would never end) or an
    unbounded split reports it (the job would end while data may still come)."""
    data = {"s0": list(range(25)), "s1": []}
    bounded = CollectionSource(data)
    for split in bounded.splits():
        assert _read_until_finished(bounded.open_reader(split, None), 10), f"bounded split {split} never finished"
    unbounded = CollectionSource(data, unbounded=True)
    for split in unbounded.splits():
        assert not _read_until_finished(unbounded.open_reader(split, None), 50), f"unbounded split {split} finished"


# ---------------------------------------------------------------- savepoints (state matching)


def _graph(*, count_parallelism=2, extra_uid=None):
    g = JobGraph("sp")
    s = g.source(CollectionSource({"s0": [1]}), uid="src").key_by(lambda r: r).map(lambda v, st: v, uid="count",
                                                                                    parallelism=count_parallelism)
    if extra_uid:
        s = s.map(lambda v: v, uid=extra_uid)
    s.collect([], uid="out")
    return g


STATE = {"src#0": {"splits": {"s0": 1}}, "count#0": {"op": [[1, 1]]}, "count#1": {"op": [[2, 1]]},
         "gone#0": {"op": 5}}


def test_savepoint_inv2_unknown_uid_is_refused_unless_allowed(caplog):
    """Fails if state of a uid the job does not have is silently dropped (no ConfigurationError naming
    it), or, with ``allow_non_restored_state``, is kept or not logged."""
    with pytest.raises(ConfigurationError, match="gone"):
        match_state(STATE, _graph())
    with caplog.at_level(logging.WARNING):
        got = match_state(STATE, _graph(), allow_non_restored_state=True)
    assert "gone" not in got and set(got) == {"src", "count"}
    assert "state_not_restored" in caplog.text and "gone" in caplog.text


def test_savepoint_inv3_vertex_without_state_starts_empty():
    """Fails if a new vertex (uid ``added``) is given state from the savepoint (any entry for it)."""
    got = match_state({k: v for k, v in STATE.items() if k != "gone#0"}, _graph(extra_uid="added"))
    assert "added" not in got
    assert got["count"] == {0: {"op": [[1, 1]]}, 1: {"op": [[2, 1]]}}


def test_savepoint_inv4_keyed_state_rescales_but_in_flight_state_with_new_parallelism_is_refused():
    """Keyed state of 2 subtasks is handed to a job with parallelism 3 (every subtask gets every old
    snapshot and filters by key), but state with in-flight channel data (unaligned) is refused when
    the parallelism changed. Fails if a rescale of keyed state is refused, or if in-flight data would
    be restored into another parallelism (no ConfigurationError)."""
    got = match_state({k: v for k, v in STATE.items() if k != "gone#0"}, _graph(count_parallelism=3))
    assert got["count"] == {0: {"op": [[1, 1]]}, 1: {"op": [[2, 1]]}}
    unaligned = {"src#0": {"splits": {"s0": 1}}, "count#0": {"op": [], "channels": [[0, [[1, None]]]]},
                 "count#1": {"op": []}}
    with pytest.raises(ConfigurationError, match="in-flight"):
        match_state(unaligned, _graph(count_parallelism=3))
    assert set(match_state(unaligned, _graph(count_parallelism=2))["count"]) == {0, 1}


# ---------------------------------------------------------------- graph


def test_graph_inv1_unique_uids_a_source_and_a_sink_no_cycles():
    """Fails if a duplicate uid is accepted, a graph without source or sink validates, or an edge
    points to a vertex created earlier (a cycle would be possible)."""
    g = JobGraph("g")
    s = g.source(CollectionSource([[1]]), uid="a")
    with pytest.raises(ConfigurationError, match="used twice"):
        g.source(CollectionSource([[1]]), uid="a")
    with pytest.raises(ConfigurationError, match="no sink"):
        g.validate()
    m = s.map(lambda v: v, uid="m")
    m.union(s.map(lambda v: v + 1, uid="m2")).key_by(lambda v: v).map(lambda v, st: v, uid="k").collect([], uid="out")
    g.validate()
    order = {v.uid: i for i, v in enumerate(g.vertices)}
    for v in g.vertices:
        for e in v.inputs:
            assert order[e.upstream.uid] < order[v.uid], f"edge {e.upstream.uid} -> {v.uid} points backwards"
    with pytest.raises(ConfigurationError, match="no source"):
        JobGraph("empty").validate()


def test_graph_inv2_hash_edge_routes_key_to_stable_hash_mod_parallelism():
    """The hash partitioner of a key_by edge must send key k to ``stable_hash(k) % n``. Fails if it
    uses any other function (e.g. the salted ``hash``), which would break the match between routing
    and keyed-state ownership on restore. (A running job is checked in
    ``test_graph_inv2_running_job_routes_each_key_to_its_subtask``.)"""
    part = hash_partitioner(lambda r: r["k"])
    for n in (1, 2, 3, 7):
        for k in ["a", "b", 17, ("x", 1), None]:
            assert part({"k": k}, n) == stable_hash(k) % n


# ---------------------------------------------------------------- committer


class CheckpointSink(FakeSink):
    """A FakeSink recording ``commit_checkpoint`` calls (a sink that commits a checkpoint atomically)."""

    def __init__(self, log, sink_id):
        super().__init__(log, sink_id)
        self.checkpoint_commits = []
        self.lingering = []

    def commit_checkpoint(self, checkpoint_id, handles, *, recovering=False):
        self.checkpoint_commits.append((checkpoint_id, [h.txn for h in handles], recovering))
        return [self.commit(h, recovering=recovering) for h in handles]


def _committer(txlog):
    a, b = CheckpointSink(txlog, "a"), CheckpointSink(txlog, "b")
    return JobCommitter({"out-a": a, "out-b": b}), a, b


def _wrapped(sink, cid, task):
    return sink.prepare(cid, task).handle


def test_committer_inv1_commit_checkpoint_hands_every_transaction_to_its_sinks_own_commit_checkpoint(txlog):
    """Fails if a wrapped transaction is dropped, committed by the wrong sink, committed one by one
    instead of through the sink's ``commit_checkpoint`` (in one call per sink), or if a non-sink
    task handle (no transactions) reaches a sink."""
    c, a, b = _committer(txlog)
    a1, a2, a3, b1 = _wrapped(a, 4, "0"), _wrapped(a, 3, "0"), _wrapped(a, 4, "1"), _wrapped(b, 4, "0")
    handles = [{"task": "out-a#0", "sink": "out-a", "txns": [a2, a1]}, {"task": "out-a#1", "sink": "out-a", "txns": [a3]},
               {"task": "out-b#0", "sink": "out-b", "txns": [b1]}, {"task": "src#0", "txns": []}, {"task": "m#0"}]
    c.commit_checkpoint(4, handles)
    assert a.checkpoint_commits == [(4, [a2["txn"], a1["txn"], a3["txn"]], False)]
    assert b.checkpoint_commits == [(4, [b1["txn"]], False)]
    assert sorted(a.committed) == sorted([a1["txn"], a2["txn"], a3["txn"]]) and b.committed == [b1["txn"]]


def test_committer_inv2_abort_of_a_task_handle_keeps_the_wrapped_transactions(txlog):
    """Fails if ``abort`` (a declined, expired or subsumed checkpoint) aborts the wrapped
    transactions: the sink task acks them again with the next checkpoint, whose commit would then
    raise DataLossError. Only ``abort_transactions`` (failover, cancel) aborts them."""
    c, a, _ = _committer(txlog)
    t = _wrapped(a, 5, "0")
    handle = {"task": "out-a#0", "sink": "out-a", "txns": [t]}
    c.abort(handle)
    assert a.aborted == [] and a.calls == []
    c.commit_checkpoint(6, [handle])  # carried into the next checkpoint
    assert a.committed == [t["txn"]]
    t2 = _wrapped(a, 7, "0")
    c.abort_transactions("out-a", [t2])
    assert a.aborted == [t2["txn"]]


def test_committer_inv3_recovery_and_lingering_reach_every_sinks_committer(txlog):
    """Fails if a recovered checkpoint's commit does not reach the sink's ``commit_checkpoint`` with
    ``recovering=True`` and the inner handles, if an abort at recovery does not abort the inner
    handles in their sink (no sink task holds them any more), or if ``abort_lingering`` does not reach
    every sink with the bound and the highest committed id unchanged."""
    c, a, b = _committer(txlog)
    keep, stale, newer = _wrapped(a, 2, "0"), _wrapped(a, 2, "1"), _wrapped(b, 9, "0")
    c.abort({"task": "out-a#1", "sink": "out-a", "txns": [stale]}, recovering=True)
    assert a.aborted == [stale["txn"]] and b.calls == []
    c.commit_checkpoint(2, [{"task": "out-a#0", "sink": "out-a", "txns": [keep]}], recovering=True)
    assert a.checkpoint_commits == [(2, [keep["txn"]], True)]
    n = c.abort_lingering(3, 2)
    assert n == 0 and a.lingering_calls == [(3, 2)] and b.lingering_calls == [(3, 2)]
    assert b.state_of(newer).value == "PRE_COMMITTED"


def test_committer_inv3_recovery_hooks_reach_the_sinks_own_recovery_hooks(txlog):
    """Fails if the inner sink is not told it is recovering (``recovering=True`` on abort and commit;
    a sink may treat a handle whose writer is gone differently; before, the committer called the plain
    hooks and a sink's recovery hooks were bypassed)."""
    c, a, _ = _committer(txlog)
    stale, done = _wrapped(a, 2, "1"), _wrapped(a, 2, "0")
    c.abort({"task": "out-a#1", "sink": "out-a", "txns": [stale]}, recovering=True)
    c.commit_checkpoint(2, [{"task": "out-a#0", "sink": "out-a", "txns": [done]}], recovering=True)
    assert a.calls == [("recover_and_abort", stale["txn"]), ("recover_and_commit", done["txn"])]


# ---------------------------------------------------------------- barrier handlers


class OrderTask:
    """Records, at each snapshot, which channels were still blocked."""

    def __init__(self, gate):
        self.gate, self.events = gate, []

    def on_checkpoint(self, barrier, priority):
        self.events.append(("snapshot", barrier.checkpoint_id,
                            tuple(self.gate.is_blocked(c) for c in range(self.gate.num_channels))))

    def ack(self, cid, channel_state):
        self.events.append(("ack", cid, tuple(self.gate.is_blocked(c) for c in range(self.gate.num_channels))))

    def forward_cancel(self, cid):
        self.events.append(("cancel", cid))


def test_barriers_aligned_inv2_snapshot_and_forward_before_unblock_once_per_checkpoint():
    """Fails if the channels are unblocked before the snapshot (records after the barrier could reach
    the operator first: the snapshot would see some channel unblocked), or if a checkpoint is
    snapshotted or acked more than once (a repeated barrier n must be ignored)."""
    g = InputGate(3)
    task = OrderTask(g)
    h = AligningBarrierHandler(g, task)
    for ch in (2, 0, 1):
        h.on_barrier(ch, CheckpointBarrier(1, 0.0))
    assert task.events == [("snapshot", 1, (True, True, True)), ("ack", 1, (False, False, False))]
    for ch in (0, 1, 2):
        h.on_barrier(ch, CheckpointBarrier(1, 0.0))  # duplicates of a finished checkpoint
    assert len(task.events) == 2, "a checkpoint was snapshotted twice"
    assert not any(g.is_blocked(c) for c in range(3))


def test_barriers_unaligned_inv7_ack_only_when_every_live_channel_delivered_the_barrier():
    """Fails if the task acks n before every live channel delivered barrier n (its channel state could
    miss records still before the barrier in a slower channel), or never acks once the only missing
    channel reached end of input."""
    g = InputGate(3)
    task = OrderTask(g)
    h = UnalignedBarrierHandler(g, task)
    h.on_barrier(0, CheckpointBarrier(1, 0.0))
    assert [e[0] for e in task.events] == ["snapshot"]
    h.on_data(1, [("late", None)])
    h.on_barrier(1, CheckpointBarrier(1, 0.0))
    assert [e[0] for e in task.events] == ["snapshot"], "acked while channel 2 had not delivered barrier 1"
    h.on_data(2, [("z", None)])
    h.on_end_of_input(2)  # no longer live: the checkpoint completes without it
    assert task.events[-1][0] == "ack" and task.events[-1][1] == 1
    acks = []
    task.ack = lambda cid, st: acks.append((cid, st))
    h2 = UnalignedBarrierHandler(InputGate(2), task)
    h2.on_barrier(1, CheckpointBarrier(2, 0.0))
    h2.on_data(0, [("a", None)])
    assert acks == []
    h2.on_barrier(0, CheckpointBarrier(2, 0.0))
    assert acks == [(2, {0: [("a", None)]})]


# ---------------------------------------------------------------- operators


def _counter(subtask, parallelism):
    def count(v, st):
        st.update(st.value(0) + 1)
        return v
    op = KeyedProcessOperator(lambda r: r["k"], keyed_map(count))
    op.open(info("count", subtask, parallelism))
    return op


@pytest.mark.parametrize("new_parallelism", [1, 2, 3, 5])
def test_operators_inv1_snapshots_are_json_and_restore_the_same_state_at_any_parallelism(new_parallelism):
    """Keyed counts of 3 subtasks (records routed by ``stable_hash % 3``) are snapshotted, sent
    through JSON and restored at another parallelism. Fails if a snapshot is not JSON, if a key's
    count is lost or duplicated, if a key lands on a subtask that does not own it, or if tuple keys
    do not come back hashable and equal."""
    keys = [f"k{i}" for i in range(30)] + [("t", i) for i in range(5)] + [7, 8]
    old = [_counter(s, 3) for s in range(3)]
    expected = {}
    for i, k in enumerate(keys):
        for _ in range(i % 4 + 1):
            old[stable_hash(k) % 3].process({"k": k}, None, Out())
            expected[k] = expected.get(k, 0) + 1
    snaps = [json.loads(json.dumps(o.snapshot())) for o in old]
    merged = {}
    for s in range(new_parallelism):
        new = _counter(s, new_parallelism)
        new.restore(snaps)
        for k, v in new.backend.values.items():
            assert stable_hash(k) % new_parallelism == s, f"key {k!r} restored on subtask {s}"
            assert k not in merged
            merged[k] = v
    assert merged == expected


def test_operators_inv2_keyed_state_is_touched_only_for_the_current_key():
    """A keyed function reads and writes ``state`` for record after record of different keys. Fails
    if the state seen or written for one record belongs to another key (counts would mix) or if
    processing a record changes any other key's value."""
    op = _counter(0, 1)
    seq = ["a", "b", "a", "c", "a", "b"]
    for k in seq:
        before = dict(op.backend.values)
        op.process({"k": k}, None, Out())
        after = op.backend.values
        assert {x: v for x, v in after.items() if x != k} == {x: v for x, v in before.items() if x != k}
        assert after[k] == before.get(k, 0) + 1
    assert op.backend.values == {"a": 3, "b": 2, "c": 1}


def test_committer_inv1_commit_of_one_task_handle_commits_each_wrapped_transaction(txlog):
    """Fails if committing a single task handle reaches a sink under a made-up checkpoint id (it passed
    -1 to the sink's commit_checkpoint, which a sink keyed by checkpoint id, like Delta's table version,
    would take for 'already committed'), or if a lost wrapped transaction is not reported LOST."""
    c, a, _ = _committer(txlog)
    t1, t2 = _wrapped(a, 4, "0"), _wrapped(a, 5, "0")
    r = c.commit({"task": "out-a#0", "sink": "out-a", "txns": [t1, t2]})
    assert r.status.value == "committed" and a.checkpoint_commits == []
    assert sorted(a.committed) == sorted([t1["txn"], t2["txn"]])
    assert c.commit({"task": "out-a#0", "sink": "out-a", "txns": [t1]}).status.value == "already_committed"
    gone = _wrapped(a, 6, "0")
    a.abort(gone)
    assert c.commit({"task": "out-a#0", "sink": "out-a", "txns": [gone]}).status.value == "lost"
