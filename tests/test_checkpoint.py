"""The checkpoint model (:mod:`twophase.checkpoint`); tests are named after its numbered invariants."""

from __future__ import annotations

import dataclasses

import pytest

from twophase.checkpoint import (CancelCheckpointMarker, CheckpointBarrier, CheckpointProperties, CheckpointType,
                                 CompletedCheckpoint, PendingCheckpoint, TaskAcknowledgeResult)
from twophase.errors import InvalidTransitionError
from twophase.states import PENDING_CHECKPOINT_TRANSITIONS, PendingState

R = TaskAcknowledgeResult


def h(task: str, cid: int = 1) -> dict:
    return {"txn": f"{cid}-{task}", "task_id": task}


@pytest.fixture
def pending() -> PendingCheckpoint:
    return PendingCheckpoint(1, ["0", "1", "2"], triggered_at=100.0)


# ---- invariant 1: completes only when every expected task acked once


def test_checkpoint_inv1_not_complete_until_every_task_acked(pending):
    for task in ("0", "1"):
        assert pending.acknowledge(task, h(task)) is R.SUCCESS
        assert not pending.is_fully_acknowledged
        with pytest.raises(InvalidTransitionError, match="missing acks"):
            pending.finalize()
    assert pending.not_yet_acknowledged == {"2"}
    assert pending.acknowledge("2", h("2")) is R.SUCCESS
    assert pending.is_fully_acknowledged
    completed = pending.finalize()
    assert completed.checkpoint_id == 1
    assert completed.triggered_at == 100.0
    assert pending.is_disposed


def test_checkpoint_inv1_finalize_failure_keeps_the_checkpoint_usable(pending):
    pending.acknowledge("0", h("0"))
    with pytest.raises(InvalidTransitionError):
        pending.finalize()
    assert not pending.is_disposed
    assert pending.acknowledge("1", h("1")) is R.SUCCESS
    assert pending.acknowledge("2", h("2")) is R.SUCCESS
    assert pending.finalize().handles.keys() == {"0", "1", "2"}


def test_checkpoint_inv1_finalize_only_once(pending):
    for task in ("0", "1", "2"):
        pending.acknowledge(task, h(task))
    pending.finalize()
    assert not pending.is_fully_acknowledged
    with pytest.raises(InvalidTransitionError, match="disposed"):
        pending.finalize()


def test_checkpoint_inv1_aborted_checkpoint_never_completes(pending):
    for task in ("0", "1", "2"):
        pending.acknowledge(task, h(task))
    pending.abort("declined")
    assert not pending.is_fully_acknowledged
    with pytest.raises(InvalidTransitionError, match="disposed"):
        pending.finalize()


def test_checkpoint_inv1_no_tasks_completes_at_once():
    """An empty micro-batch has no tasks: it completes with no handles (it used to be refused, and the
    refusal left a PENDING record that every replay of the batch failed on again)."""
    p = PendingCheckpoint(3, [])
    assert p.is_fully_acknowledged
    assert p.finalize().handles == {}


def test_checkpoint_inv1_task_ids_are_strings():
    p = PendingCheckpoint(1, [0, 1])
    assert p.expected_tasks == {"0", "1"}
    assert p.acknowledge(0, h("0")) is R.SUCCESS  # type: ignore[arg-type]
    assert p.acknowledge("1", h("1")) is R.SUCCESS
    assert p.is_fully_acknowledged


# ---- invariant 2: an ack counts at most once per task


def test_checkpoint_inv2_duplicate_ack_is_not_counted(pending):
    first = h("0")
    assert pending.acknowledge("0", first, task_state={"n": 1}) is R.SUCCESS
    assert pending.acknowledge("0", {"txn": "retry-of-0"}, task_state={"n": 2}) is R.DUPLICATE
    assert pending.acked_handles == {"0": first}
    assert pending.not_yet_acknowledged == {"1", "2"}
    pending.acknowledge("1", h("1"))
    pending.acknowledge("2", h("2"))
    completed = pending.finalize()
    assert completed.handles["0"] == first
    assert completed.task_state == {"0": {"n": 1}}


# ---- invariant 3: unknown tasks and disposed checkpoints


def test_checkpoint_inv3_unknown_task(pending):
    assert pending.acknowledge("9", h("9")) is R.UNKNOWN
    assert pending.acked_handles == {}
    assert pending.not_yet_acknowledged == {"0", "1", "2"}


def test_checkpoint_inv3_ack_after_abort_is_discarded(pending):
    pending.acknowledge("0", h("0"))
    pending.abort("timeout")
    assert pending.acknowledge("1", h("1")) is R.DISCARDED
    assert pending.acknowledge("9", h("9")) is R.DISCARDED
    assert pending.acked_handles == {"0": h("0")}


def test_checkpoint_inv3_ack_after_completion_is_discarded(pending):
    for task in ("0", "1", "2"):
        pending.acknowledge(task, h(task))
    pending.finalize()
    assert pending.acknowledge("0", {"txn": "late"}) is R.DISCARDED


def test_checkpoint_inv3_abort_returns_the_acked_handles(pending):
    pending.acknowledge("0", h("0"))
    pending.acknowledge("2", h("2"))
    handles = pending.abort("declined by task 1")
    assert handles == {"0": h("0"), "2": h("2")}
    assert pending.abort_reason == "declined by task 1"
    assert pending.is_disposed
    handles["1"] = {"txn": "injected"}  # a copy: the caller cannot change the checkpoint
    assert "1" not in pending.acked_handles


def test_checkpoint_inv3_abort_with_no_acks_returns_nothing(pending):
    assert pending.abort("timeout") == {}


# ---- invariant 4: a completed checkpoint is immutable, one handle per expected task


def test_checkpoint_inv4_completed_holds_one_handle_per_task(pending):
    for task in ("2", "0", "1"):
        pending.acknowledge(task, h(task))
    pending.acknowledge("1", {"txn": "dup"})
    completed = pending.finalize()
    assert set(completed.handles) == pending.expected_tasks
    assert completed.ordered_handles() == [h("0"), h("1"), h("2")]
    with pytest.raises(dataclasses.FrozenInstanceError):
        completed.checkpoint_id = 2  # type: ignore[misc]


def test_checkpoint_inv4_completed_is_not_changed_by_later_acks_or_aborts(pending):
    for task in ("0", "1", "2"):
        pending.acknowledge(task, h(task))
    completed = pending.finalize()
    pending.acknowledge("0", {"txn": "late"})
    pending.abort("too late")
    assert completed.handles == {"0": h("0"), "1": h("1"), "2": h("2")}


def test_checkpoint_inv4_ordered_handles_sorts_numeric_task_ids_numerically():
    p = PendingCheckpoint(1, ["10", "9", "b", "a", "0"])
    for task in ("10", "9", "b", "a", "0"):
        p.acknowledge(task, h(task))
    assert [x["task_id"] for x in p.finalize().ordered_handles()] == ["0", "9", "10", "a", "b"]


# ---- properties, barriers, markers


def test_properties_json_round_trip():
    for props in (CheckpointProperties.checkpoint(), CheckpointProperties.savepoint(),
                  CheckpointProperties.savepoint(terminate=True)):
        assert CheckpointProperties.from_json(props.to_json()) == props
    assert CheckpointProperties.from_json({}) == CheckpointProperties()


def test_savepoint_is_forced():
    sp = CheckpointProperties.savepoint(terminate=True)
    assert sp.type is CheckpointType.SAVEPOINT and sp.forced and sp.terminate
    cp = CheckpointProperties.checkpoint()
    assert cp.type is CheckpointType.CHECKPOINT and not cp.forced and not cp.terminate


def test_pending_keeps_its_properties():
    p = PendingCheckpoint(4, ["0"], CheckpointProperties.savepoint())
    p.acknowledge("0", h("0", 4))
    assert p.finalize().properties == CheckpointProperties.savepoint()


def test_barrier_and_cancel_marker_are_values():
    b = CheckpointBarrier(5, 1.5)
    assert b == CheckpointBarrier(5, 1.5, CheckpointProperties())
    assert CancelCheckpointMarker(5) == CancelCheckpointMarker(5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.checkpoint_id = 6  # type: ignore[misc]


def test_completed_checkpoint_defaults():
    c = CompletedCheckpoint(1, {"0": h("0")})
    assert c.properties == CheckpointProperties()
    assert c.ordered_handles() == [h("0")]


# ---- its disposal is a state of a table


def test_checkpoint_every_state_a_pending_checkpoint_can_be_in_is_in_a_table():
    """Walk every way a PendingCheckpoint moves (ack, finalize, abort, abort again, late acks) and check each
    state seen is a PendingState in the table, every PendingState is reached, and there is no other flag."""
    seen = set()

    def walk(p: PendingCheckpoint, *steps) -> None:
        seen.add(p.state)
        for step in steps:
            step(p)
            seen.add(p.state)
            p.acknowledge("0", h("0"))  # a late ack never moves it
            seen.add(p.state)

    walk(PendingCheckpoint(1, ["0"]), lambda p: p.acknowledge("0", h("0")), lambda p: p.finalize(),
         lambda p: p.abort("late"))
    walk(PendingCheckpoint(1, ["0", "1"]), lambda p: p.abort("declined"), lambda p: p.abort("again"))
    walk(PendingCheckpoint(1, []), lambda p: p.finalize())
    assert seen == set(PendingState)
    assert all(isinstance(s, PendingState) and s in PENDING_CHECKPOINT_TRANSITIONS for s in seen)
    assert not hasattr(PendingCheckpoint(1, []), "_disposed")


def test_checkpoint_inv3_abort_of_a_disposed_checkpoint_returns_no_handle(pending):
    for task in ("0", "1", "2"):
        pending.acknowledge(task, h(task))
    pending.finalize()
    assert pending.abort("too late") == {}  # the completed checkpoint's handles are never to be aborted
    assert pending.state is PendingState.COMPLETED
    aborted = PendingCheckpoint(2, ["0"])
    aborted.acknowledge("0", h("0", 2))
    assert aborted.abort("declined") == {"0": h("0", 2)}
    assert aborted.abort("again") == {} and aborted.abort_reason == "declined"
    assert aborted.state is PendingState.ABORTED
