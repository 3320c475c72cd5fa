"""Unit tests of the runtime's parts: channels, barrier handlers, the watermark valve, restart strategies."""

from __future__ import annotations

import threading

import pytest

from twophase.checkpoint import CancelCheckpointMarker, CheckpointBarrier
from twophase.errors import ConfigurationError
from twophase.runtime.barriers import AligningBarrierHandler, TrackingBarrierHandler, UnalignedBarrierHandler
from twophase.runtime.channels import (MAX_WATERMARK, InputGate, PriorityEvent, TaskCancelled, stable_hash)
from twophase.runtime.restart import FailureRateRestart, FixedDelayRestart, NoRestart, parse_restart_strategy
from twophase.runtime.watermarks import StatusWatermarkValve


class FakeTask:
    def __init__(self):
        self.events = []

    def on_checkpoint(self, barrier, priority):
        self.events.append(("snapshot", barrier.checkpoint_id, priority))

    def ack(self, cid, channel_state):
        self.events.append(("ack", cid, channel_state))

    def forward_cancel(self, cid):
        self.events.append(("cancel", cid))


def B(n):
    return CheckpointBarrier(n, 0.0)


def drain(gate):
    out = []
    while (item := gate.poll(0)) is not None:
        out.append(item)
    return out


# ---- channels


def test_channels_inv1_priority_overtakes_and_counts():
    g = InputGate(1, capacity=4)
    g.put(0, [(1, None)])
    g.put(0, [(2, None)])
    assert g.put_priority(0, "barrier") == 2
    ch, first = g.poll(0)
    assert isinstance(first, PriorityEvent) and first.overtaken == 2
    assert g.peek_queued(0, first.overtaken) == [[(1, None)], [(2, None)]]


def test_channels_inv2_backpressure_blocks_producer():
    g = InputGate(1, capacity=2)
    g.put(0, [1])
    g.put(0, [2])
    done = threading.Event()
    t = threading.Thread(target=lambda: (g.put(0, [3]), done.set()))
    t.start()
    assert not done.wait(0.1), "a full channel must block its producer"
    g.poll(0)
    assert done.wait(2.0)
    t.join(2.0)


def test_channels_inv3_close_wakes_blocked_producer():
    g = InputGate(1, capacity=1)
    g.put(0, [1])
    errors = []

    def put():
        try:
            g.put(0, [2])
        except TaskCancelled as e:
            errors.append(e)
    t = threading.Thread(target=put)
    t.start()
    g.close()
    t.join(2.0)
    assert errors and not t.is_alive()


def test_stable_hash_is_process_independent():
    assert stable_hash("abc") == 2530215470  # crc32 of repr, not the salted str hash
    assert stable_hash(("a", 1)) == stable_hash(["a", 1])


# ---- barrier handlers


def test_barriers_aligned_inv1_blocked_channel_is_not_read():
    g, task = InputGate(2), FakeTask()
    h = AligningBarrierHandler(g, task)
    h.on_barrier(0, B(1))
    g.put(0, ["after-barrier"])
    g.put(1, ["before-barrier"])
    assert drain(g) == [(1, ["before-barrier"])], "channel 0 delivered barrier 1 and must stay blocked"
    assert task.events == []
    h.on_barrier(1, B(1))
    assert task.events == [("snapshot", 1, False), ("ack", 1, None)]  # invariant 2
    assert drain(g) == [(0, ["after-barrier"])]


def test_barriers_aligned_inv3_cancel_and_newer_barrier_end_alignment():
    g, task = InputGate(2), FakeTask()
    h = AligningBarrierHandler(g, task)
    h.on_barrier(0, B(1))
    h.on_cancel(1, CancelCheckpointMarker(1))
    assert task.events == [("cancel", 1)] and not g.is_blocked(0)
    h.on_barrier(0, B(2))
    h.on_barrier(1, B(3))  # newer barrier: 2 is given up
    assert ("cancel", 2) in task.events and h.current.checkpoint_id == 3
    h.on_barrier(0, B(3))
    assert task.events[-2:] == [("snapshot", 3, False), ("ack", 3, None)]
    h.on_barrier(1, B(2))  # late barrier of a cancelled checkpoint is ignored
    assert task.events[-1] == ("ack", 3, None)


def test_barriers_aligned_inv4_end_of_input_completes_alignment():
    g, task = InputGate(2), FakeTask()
    h = AligningBarrierHandler(g, task)
    h.on_barrier(0, B(1))
    h.on_end_of_input(1)
    assert task.events == [("snapshot", 1, False), ("ack", 1, None)]


def test_barriers_tracking_never_blocks():
    g, task = InputGate(2), FakeTask()
    h = TrackingBarrierHandler(g, task)
    h.on_barrier(0, B(1))
    g.put(0, ["after"])
    assert drain(g) == [(0, ["after"])]
    h.on_barrier(1, B(1))
    assert task.events == [("snapshot", 1, False), ("ack", 1, None)]


def test_barriers_unaligned_inv5_to_7_channel_state():
    g, task = InputGate(2), FakeTask()
    h = UnalignedBarrierHandler(g, task)
    g.put(0, [("x", None)])  # overtaken by the barrier below
    ov = g.put_priority(0, B(1))
    ch, ev = g.poll(0)
    h.on_barrier(ch, ev.element, ev.overtaken)
    assert task.events == [("snapshot", 1, True)]  # invariant 5: snapshot at the first barrier
    h.on_data(1, [("y", None)])  # read from channel 1 before its barrier: in flight
    h.on_data(0, [("x", None)])  # channel 0 already delivered its barrier: not recorded again
    h.on_barrier(1, B(1), 0)
    assert task.events[-1] == ("ack", 1, {0: [("x", None)], 1: [("y", None)]})  # invariants 6, 7
    assert ov == 1


# ---- watermark valve


class Valve:
    def __init__(self, n):
        self.out = []
        self.v = StatusWatermarkValve(n, lambda w: self.out.append(w), lambda idle: self.out.append("idle" if idle else "active"))


def test_valve_inv1_min_of_channels_never_decreases():
    t = Valve(2)
    t.v.input_watermark(0, 10)
    assert t.out == []
    t.v.input_watermark(1, 5)
    t.v.input_watermark(1, 3)  # channel goes back: ignored
    t.v.input_watermark(1, 20)
    assert t.out == [5, 10]


def test_valve_inv2_idle_channel_does_not_hold_back():
    t = Valve(2)
    t.v.input_watermark(0, 10)
    t.v.input_status(1, True)
    assert t.out == [10]
    t.v.input_status(0, True)
    assert t.out == [10, "idle"]


def test_valve_inv3_late_resuming_channel_does_not_move_watermark_back():
    t = Valve(2)
    t.v.input_watermark(1, 1)
    t.v.input_status(1, True)
    t.v.input_watermark(0, 100)
    assert t.out == [100]
    t.v.input_status(1, False)  # resumes at watermark 1 < 100
    t.v.input_watermark(1, 50)
    t.v.input_watermark(0, 120)
    assert t.out == [100, 120], "channel 1 is not aligned until it catches up"
    t.v.input_watermark(1, 110)  # still below the output (120): not aligned yet
    t.v.input_watermark(0, 200)
    assert t.out == [100, 120, 200]
    t.v.input_watermark(1, 250)  # caught up: counts again
    t.v.input_watermark(0, 300)
    assert t.out == [100, 120, 200, 250]


def test_valve_inv4_end_of_input_is_max_watermark():
    t = Valve(2)
    t.v.input_watermark(0, 5)
    t.v.end_of_input(1)
    t.v.end_of_input(0)
    assert t.out[-2:] == [MAX_WATERMARK, "idle"]


# ---- restart strategies


def test_restart_inv1_none():
    assert NoRestart().on_failure(0.0) is None


def test_restart_inv2_fixed_delay_counts_attempts():
    s = FixedDelayRestart(2, 0.5)
    assert [s.on_failure(t) for t in (0, 1, 2)] == [0.5, 0.5, None]


def test_restart_inv3_failure_rate_window():
    s = FailureRateRestart(2, 10.0, 0.1)
    assert [s.on_failure(t) for t in (0, 1)] == [0.1, 0.1]
    assert s.on_failure(2) is None
    s2 = FailureRateRestart(2, 10.0, 0.0)
    assert [s2.on_failure(t) for t in (0, 1, 20, 21)] == [0.0, 0.0, 0.0, 0.0]


def test_restart_parse():
    assert isinstance(parse_restart_strategy("none"), NoRestart)
    assert parse_restart_strategy("fixed-delay:3:0.5") == FixedDelayRestart(3, 0.5)
    with pytest.raises(ConfigurationError):
        parse_restart_strategy("sometimes")
