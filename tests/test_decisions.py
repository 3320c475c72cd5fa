"""The coordinator's decision table (:mod:`twophase.decisions`), pair by pair, without a sink or a log.

The expected actions are written out here from the table in the module docstring, not read from
:func:`decide`, so a wrong decision fails a test. Every (event, record state) pair is listed, with each
fact that splits its cell.
"""

from __future__ import annotations

import builtins
import itertools
import time

import pytest

from twophase.decisions import (STATES, AbortHandles, CheckSuperseded, CommitHandles, CommitOutcome, CommitUpTo,
                                DeclineWriteJob, Event,
                                Facts, Handles, Outcome, Prune, Refuse, RefuseResolve, Sweep, TakeAcks, WriteAborted,
                                WriteCommitted, WriteCompleted, WriteLost, WritePending, decide)
from twophase.states import CheckpointState, is_transition_valid

C = CheckpointState
E = Event
ALL = STATES
ACKED, UNRECORDED, RECORDED = Handles.ACKED, Handles.UNRECORDED, Handles.RECORDED
ALREADY = Outcome(CommitOutcome.ALREADY_COMMITTED)
REASON = "r"

# named facts: the value of each fact that splits a cell
PLAIN = Facts()
WITH_REASON = Facts(reason=REASON)
REDELIVERED = Facts(redelivered=True)
NOT_REDELIVERED = Facts(redelivered=False)
OLDER = Facts(older=True, notified=7)
NOTIFIED = Facts(older=False, notified=7)
OLDER_WITH_COMMIT = Facts(older=True, notified=7, sweep_with_commit=True)
NOTIFIED_WITH_COMMIT = Facts(older=False, notified=7, sweep_with_commit=True)
NOTIFIED_WITH_COMMIT_NOT_SWEEPING = Facts(older=False, notified=7, sweep_with_commit=True, sweep_after_commit=False)
SWEEPING = Facts(sweep_after_commit=True)
NOT_SWEEPING = Facts(sweep_after_commit=False)
SWEEPING_WITH_COMMIT = Facts(sweep_after_commit=True, sweep_with_commit=True)
HIGHEST_4 = Facts(highest_committed=4)
HIGHEST_0 = Facts(highest_committed=0)
HIGHEST_4_SWEPT = Facts(highest_committed=4, swept=True)
NONE_COMMITTED = Facts(highest_committed=None)
BELOW = Facts(below_highest=True, sweep_after_commit=True)
BELOW_NOT_SWEEPING = Facts(below_highest=True, sweep_after_commit=False)
NOT_BELOW = Facts(below_highest=False, sweep_after_commit=True)
NOT_BELOW_NOT_SWEEPING = Facts(below_highest=False, sweep_after_commit=False)
SUPERSEDED = Facts(below_highest=True, highest_committed=9)
NOT_SUPERSEDED = Facts(below_highest=False, highest_committed=3)
ABORT_BELOW = Facts(below_highest=True, reason=REASON)
ABORT_NOT_BELOW = Facts(below_highest=False, reason=REASON)


def same(states, facts_to_actions):
    return {s: facts_to_actions for s in states}


#: event -> state -> {facts: expected actions}
TABLE = {
    E.TRIGGER: {
        **same([None, C.ABORTED], {PLAIN: [WritePending()]}),
        **same([C.PENDING, C.COMPLETED, C.COMMITTED, C.LOST], {PLAIN: [Refuse(C.PENDING)]}),
    },
    E.ACK_REJECTED: {
        **same([C.COMPLETED, C.COMMITTED], {REDELIVERED: [], NOT_REDELIVERED: [AbortHandles(UNRECORDED)]}),
        **same([None, C.PENDING, C.ABORTED, C.LOST], {REDELIVERED: [], NOT_REDELIVERED: [AbortHandles(ACKED)]}),
    },
    E.ACKS_COMPLETE: {
        C.PENDING: {PLAIN: [WriteCompleted(), CommitUpTo()]},
        **same([None, C.COMPLETED, C.COMMITTED, C.ABORTED, C.LOST], {PLAIN: [Refuse(C.COMPLETED)]}),
    },
    E.NOTIFY_COMPLETE: {
        C.COMPLETED: {OLDER: [CommitHandles(recovering=True), WriteCommitted()],
                      OLDER_WITH_COMMIT: [CommitHandles(recovering=True), WriteCommitted()],
                      NOTIFIED: [CommitHandles(recovering=False), WriteCommitted()],
                      NOTIFIED_WITH_COMMIT: [CommitHandles(recovering=False), Sweep(best_effort=True),
                                             WriteCommitted()],
                      NOTIFIED_WITH_COMMIT_NOT_SWEEPING: [CommitHandles(recovering=False), WriteCommitted()]},
        C.PENDING: {OLDER: [WriteAborted("subsumed by checkpoint 7")], NOTIFIED: [], NOTIFIED_WITH_COMMIT: []},
        **same([None, C.COMMITTED, C.ABORTED, C.LOST], {OLDER: [], NOTIFIED: [], NOTIFIED_WITH_COMMIT: []}),
    },
    E.CLEAN_UP: same(ALL, {SWEEPING: [Sweep(best_effort=True), Prune()], NOT_SWEEPING: [Prune()],
                           SWEEPING_WITH_COMMIT: [Prune()]}),
    E.ABORT: {
        C.PENDING: {WITH_REASON: [AbortHandles(ACKED), WriteAborted(REASON)]},
        **same([None, C.ABORTED], {WITH_REASON: [AbortHandles(ACKED)]}),
        **same([C.COMPLETED, C.COMMITTED, C.LOST], {WITH_REASON: [AbortHandles(UNRECORDED)]}),
    },
    E.RECOVER: {
        C.COMPLETED: {PLAIN: [CommitHandles(recovering=True), WriteCommitted()]},
        C.PENDING: {PLAIN: [AbortHandles(RECORDED, recovering=True), WriteAborted("aborted at recovery")]},
        **same([None, C.COMMITTED, C.ABORTED, C.LOST], {PLAIN: []}),
    },
    E.RECOVERY_SWEEP: same(ALL, {HIGHEST_4: [Sweep(up_to=4)], HIGHEST_0: [Sweep(up_to=0)], HIGHEST_4_SWEPT: [],
                                 NONE_COMMITTED: []}),
    E.BATCH_COMMIT: {
        # below the highest committed id or not, the record is created first and CheckSuperseded decides
        None: same([BELOW, BELOW_NOT_SWEEPING, NOT_BELOW, NOT_BELOW_NOT_SWEEPING],
                   [WritePending(), CheckSuperseded(), TakeAcks()]),
        C.ABORTED: same([BELOW, NOT_BELOW, NOT_BELOW_NOT_SWEEPING], [WritePending(), CheckSuperseded(), TakeAcks()]),
        C.PENDING: same([BELOW, NOT_BELOW, NOT_BELOW_NOT_SWEEPING], [CheckSuperseded(), TakeAcks()]),
        C.COMPLETED: same([BELOW, NOT_BELOW, NOT_BELOW_NOT_SWEEPING],
                          [AbortHandles(UNRECORDED), CommitUpTo(), Outcome(CommitOutcome.RECOVERED)]),
        C.COMMITTED: {NOT_BELOW: [AbortHandles(UNRECORDED), Sweep(best_effort=True), ALREADY],
                      BELOW: [AbortHandles(UNRECORDED), Sweep(best_effort=True), ALREADY],
                      NOT_BELOW_NOT_SWEEPING: [AbortHandles(UNRECORDED), ALREADY]},
        C.LOST: same([BELOW, NOT_BELOW, NOT_BELOW_NOT_SWEEPING], [AbortHandles(UNRECORDED), ALREADY]),
    },
    E.SUPERSEDED_CHECK: {
        C.PENDING: {SUPERSEDED: [WriteAborted("below the highest committed checkpoint 9: committed before (its "
                                              "record pruned) or by another driver meanwhile; nothing of this "
                                              "attempt is committed"),
                                 AbortHandles(ACKED), ALREADY],
                    NOT_SUPERSEDED: []},
        **same([None, C.COMPLETED, C.COMMITTED, C.ABORTED, C.LOST], {SUPERSEDED: [], NOT_SUPERSEDED: []}),
    },
    E.SPARK_ABORT_BATCH: {
        None: {ABORT_BELOW: [AbortHandles(ACKED)], ABORT_NOT_BELOW: [AbortHandles(ACKED), WriteAborted(REASON)]},
        C.PENDING: same([ABORT_BELOW, ABORT_NOT_BELOW], [AbortHandles(ACKED), WriteAborted(REASON)]),
        **same([C.ABORTED, C.COMPLETED, C.COMMITTED, C.LOST],
               {ABORT_BELOW: [AbortHandles(UNRECORDED)], ABORT_NOT_BELOW: [AbortHandles(UNRECORDED)]}),
    },
    E.QUERY_MISMATCH: same(ALL, {PLAIN: [AbortHandles(ACKED)]}),
    E.RESOLVE_LOST: {
        C.COMPLETED: {WITH_REASON: [WriteLost(f"data loss accepted: {REASON}")]},
        **same([None, C.PENDING, C.COMMITTED, C.ABORTED, C.LOST], {WITH_REASON: [RefuseResolve()]}),
    },
    E.WRITE_JOB_COMMIT: {
        C.PENDING: {PLAIN: [TakeAcks()]},
        C.COMPLETED: {PLAIN: [AbortHandles(UNRECORDED), CommitUpTo(), Outcome(CommitOutcome.RECOVERED)]},
        C.COMMITTED: {PLAIN: [AbortHandles(UNRECORDED), Sweep(best_effort=True), ALREADY]},
        C.LOST: {PLAIN: [AbortHandles(UNRECORDED), ALREADY]},
        **same([None, C.ABORTED], {PLAIN: [AbortHandles(ACKED), DeclineWriteJob()]}),  # never reopened
    },
    E.WRITE_JOB_ABORT: {
        C.PENDING: {WITH_REASON: [AbortHandles(ACKED), WriteAborted(REASON), Sweep(best_effort=True)]},
        C.ABORTED: {WITH_REASON: [AbortHandles(ACKED), Sweep(best_effort=True)]},
        None: {WITH_REASON: [AbortHandles(ACKED)]},
        **same([C.COMPLETED, C.COMMITTED, C.LOST], {WITH_REASON: [AbortHandles(UNRECORDED)]}),
    },
    E.WRITE_JOB_TAKE_OVER: {
        C.PENDING: {WITH_REASON: [AbortHandles(RECORDED, recovering=True), WriteAborted(REASON),
                                  Sweep(best_effort=True)]},
        C.ABORTED: {WITH_REASON: [Sweep(best_effort=True)]},
        **same([None, C.COMPLETED, C.COMMITTED, C.LOST], {WITH_REASON: []}),
    },
}

PAIRS = list(itertools.product(list(Event), ALL))
CASES = [(e, s, f, actions) for e, s in PAIRS for f, actions in TABLE[e][s].items()]


def _sid(state) -> str:
    return state.value if state is not None else "none"


def test_decision_table_lists_every_event_and_state():
    assert set(TABLE) == set(Event)
    for event, row in TABLE.items():
        assert set(row) == set(ALL), event


@pytest.mark.parametrize("event,state", PAIRS, ids=[f"{e.value}-{_sid(s)}" for e, s in PAIRS])
def test_decision(event, state):
    for facts, expected in TABLE[event][state].items():
        assert decide(event, state, facts) == expected, facts


@pytest.mark.parametrize("event,state,facts,actions", CASES)
def test_decision_never_asks_the_log_for_a_move_the_tables_refuse(event, state, facts, actions):
    """Each Write in a decision is allowed by CHECKPOINT_TRANSITIONS from the state the actions before it
    left; each Refuse names a move the tables refuse; nothing follows an Outcome, TakeAcks or a Refuse."""
    targets = {WritePending: C.PENDING, WriteCompleted: C.COMPLETED, WriteCommitted: C.COMMITTED,
               WriteAborted: C.ABORTED, WriteLost: C.LOST}
    current = state
    for i, action in enumerate(actions):
        if type(action) in targets:
            assert is_transition_valid(current, targets[type(action)]), (current, action)
            current = targets[type(action)]
        if isinstance(action, Refuse):
            assert not is_transition_valid(current, action.target)
        if isinstance(action, RefuseResolve):
            assert not is_transition_valid(current, C.LOST)
        if isinstance(action, (Outcome, TakeAcks, Refuse, RefuseResolve)):
            assert i == len(actions) - 1, actions


def test_decision_a_completed_or_committed_checkpoint_never_has_its_own_handles_aborted():
    """Coordinator invariant 1 in table form: on a decided record, only handles it did not record are aborted.
    (QUERY_MISMATCH is asked before any record is read: its acks are another query's, never recorded here.)"""
    for (event, state, facts, actions) in CASES:
        if state in (C.COMPLETED, C.COMMITTED) and event is not E.QUERY_MISMATCH:
            assert AbortHandles(ACKED) not in actions and AbortHandles(RECORDED, recovering=True) not in actions


def test_decision_is_pure(monkeypatch):
    """No I/O and no clock: decide runs with open() and time.time() broken, and the same arguments give
    equal, fresh lists."""
    def broken(*a, **k):
        raise AssertionError("decide did I/O or read the clock")

    monkeypatch.setattr(builtins, "open", broken)
    monkeypatch.setattr(time, "time", broken)
    monkeypatch.setattr(time, "perf_counter", broken)
    for event, state, facts, _ in CASES:
        first = decide(event, state, facts)
        first.append("mutated")
        assert decide(event, state, facts) == first[:-1]


def test_decision_needs_a_reason_where_it_writes_one():
    with pytest.raises(ValueError, match="reason"):
        decide(E.ABORT, C.PENDING, Facts())
    with pytest.raises(TypeError):
        decide(E.TRIGGER, "PENDING")  # type: ignore[arg-type]


def test_decision_spark_abort_of_a_batch_with_no_record_writes_aborted_directly():
    """No hop through PENDING: the one write is None -> ABORTED, which the table allows."""
    actions = decide(E.SPARK_ABORT_BATCH, None, Facts(reason="a Spark task failed"))
    assert [type(a) for a in actions] == [AbortHandles, WriteAborted]
    assert is_transition_valid(None, C.ABORTED)
