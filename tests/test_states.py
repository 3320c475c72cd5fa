"""Every (source, target) pair of the transition tables of :mod:`twophase.states`.

The allowed moves are written out here from the diagrams in the module docstring, not read from
the tables, so a wrong table entry fails a test.
"""

from __future__ import annotations

import itertools

import pytest

from twophase.errors import InvalidTransitionError, TwoPhaseError
from twophase.states import (CHECKPOINT_TRANSITIONS, TABLES, TRANSACTION_TRANSITIONS, CheckpointState, PendingState,
                             TransactionState, check_transition, is_transition_valid)

C = CheckpointState
T = TransactionState

CHECKPOINT_ALLOWED = {
    (None, C.PENDING),
    (None, C.ABORTED),  # Spark aborts a batch with no record (no hop through PENDING)
    (C.PENDING, C.COMPLETED),
    (C.PENDING, C.ABORTED),
    (C.COMPLETED, C.COMMITTED),
    (C.COMPLETED, C.LOST),  # only by an operator: twophase log resolve --accept-loss
    (C.ABORTED, C.PENDING),  # a re-run of the same checkpoint id
}

TRANSACTION_ALLOWED = {
    (None, T.OPEN),
    (T.OPEN, T.PRE_COMMITTED),
    (T.OPEN, T.ABORTED),
    (T.PRE_COMMITTED, T.COMMITTED),
    (T.PRE_COMMITTED, T.ABORTED),
}

CHECKPOINT_PAIRS = list(itertools.product([None, *C], list(C)))
TRANSACTION_PAIRS = list(itertools.product([None, *T], list(T)))


def _id(pair) -> str:
    source, target = pair
    return f"{source.value if source else 'none'}->{target.value}"


@pytest.mark.parametrize("pair", CHECKPOINT_PAIRS, ids=[_id(p) for p in CHECKPOINT_PAIRS])
def test_checkpoint_transition(pair):
    source, target = pair
    if pair in CHECKPOINT_ALLOWED:
        assert is_transition_valid(source, target)
        check_transition(source, target)
    else:
        assert not is_transition_valid(source, target)
        with pytest.raises(InvalidTransitionError) as err:
            check_transition(source, target, what="checkpoint 7")
        assert "checkpoint 7" in str(err.value)
        assert not err.value.retriable


@pytest.mark.parametrize("pair", TRANSACTION_PAIRS, ids=[_id(p) for p in TRANSACTION_PAIRS])
def test_transaction_transition(pair):
    source, target = pair
    if pair in TRANSACTION_ALLOWED:
        assert is_transition_valid(source, target)
        check_transition(source, target)
    else:
        assert not is_transition_valid(source, target)
        with pytest.raises(InvalidTransitionError):
            check_transition(source, target)


MIXED_PAIRS = [(s, t) for s in C for t in T] + [(s, t) for s in T for t in C]


@pytest.mark.parametrize("pair", MIXED_PAIRS, ids=[_id(p) for p in MIXED_PAIRS])
def test_transition_between_kinds_is_invalid(pair):
    """A transaction state never moves to a checkpoint state or back, even where the names match."""
    source, target = pair
    assert not is_transition_valid(source, target)
    with pytest.raises(InvalidTransitionError):
        check_transition(source, target)


def test_tables_cover_every_state():
    assert set(CHECKPOINT_TRANSITIONS) == {None, *C}
    assert set(TRANSACTION_TRANSITIONS) == {None, *T}


def test_final_states_have_no_way_out_but_a_rerun():
    assert CHECKPOINT_TRANSITIONS[C.COMMITTED] == frozenset()
    assert TRANSACTION_TRANSITIONS[T.COMMITTED] == frozenset()
    assert TRANSACTION_TRANSITIONS[T.ABORTED] == frozenset()
    # a COMPLETED checkpoint is never aborted (coordinator invariant 1)
    assert C.ABORTED not in CHECKPOINT_TRANSITIONS[C.COMPLETED]


@pytest.mark.parametrize("state,decided,final", [
    (C.PENDING, False, False),
    (C.COMPLETED, True, False),
    (C.COMMITTED, True, True),
    (C.ABORTED, True, True),
    (C.LOST, True, True),
])
def test_checkpoint_state_flags(state, decided, final):
    assert state.is_decided is decided
    assert state.is_final is final


def test_invalid_transition_error_is_a_twophase_error():
    assert issubclass(InvalidTransitionError, TwoPhaseError)


# ---- the in-memory PendingCheckpoint's table

P = PendingState

PENDING_ALLOWED = {
    (None, P.COLLECTING),
    (P.COLLECTING, P.COMPLETED),  # finalize: every expected task acked
    (P.COLLECTING, P.ABORTED),  # abort: declined, expired, subsumed, a task missing
}

PENDING_PAIRS = list(itertools.product([None, *P], list(P)))


@pytest.mark.parametrize("pair", PENDING_PAIRS, ids=[_id(p) for p in PENDING_PAIRS])
def test_pending_checkpoint_transition(pair):
    source, target = pair
    assert is_transition_valid(source, target) is (pair in PENDING_ALLOWED)
    if pair not in PENDING_ALLOWED:
        with pytest.raises(InvalidTransitionError):
            check_transition(source, target)


def test_every_kind_of_state_has_a_table_covering_it():
    assert set(TABLES) == {C, T, P}
    for kind, table in TABLES.items():
        assert set(table) == {None, *kind}
        assert all(isinstance(t, kind) for targets in table.values() for t in targets)


@pytest.mark.parametrize("state,disposed", [(P.COLLECTING, False), (P.COMPLETED, True), (P.ABORTED, True)])
def test_pending_state_disposed(state, disposed):
    assert state.is_disposed is disposed
