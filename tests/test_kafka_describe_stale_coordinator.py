"""Issue 22: TxnClient.describe trusts "unknown transactional id" only from a freshly looked-up coordinator.

A broker resumed after a pause (SIGSTOP, a long GC) may still believe it leads the ``__transaction_state``
partition of an id and answer TRANSACTIONAL_ID_NOT_FOUND for an id another broker took over meanwhile (the id's
transaction was initialised on the new coordinator). The attempt-slot probe (invariant 4) takes an unknown id as
free and InitProducerIds it: that aborts an open transaction which may hold prepared data. These units drive the
real :meth:`TxnClient.describe` over a fake admin connection (its coordinator cache, FindCoordinator and
DescribeTransactions per node): a protocol unit, the one place a fake is allowed.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("kafka")

import kafka.errors as Errors  # noqa: E402

from twophase.sinks._kafka_txn import TxnClient, TxnState  # noqa: E402

STALE, NEW = 1, 2


def _row(tid: str, state: Any) -> SimpleNamespace:
    if state is None:
        return SimpleNamespace(transactional_id=tid, error_code=Errors.TransactionalIdNotFoundError.errno)
    return SimpleNamespace(transactional_id=tid, error_code=0, transaction_state=state.state,
                           producer_id=state.producer_id, producer_epoch=state.epoch,
                           transaction_start_time_ms=state.start_ms, topics=[])


class _Admin:
    """A cluster of two nodes: ``STALE`` (the resumed old coordinator, knows nothing) and ``NEW``.

    ``cached`` seeds the client's coordinator cache; FindCoordinator answers ``find_answers`` in turn
    (then ``NEW``). Each node answers DescribeTransactions from its own ``states``."""

    def __init__(self, states: dict[int, dict[str, TxnState]], cached: dict[str, int],
                 find_answers: list[int] = ()) -> None:
        self.states = states
        self.find_answers = list(find_answers)
        self.finds = 0
        self.asked: list[tuple[int, tuple[str, ...]]] = []
        self.stale = {STALE}                # nodes answering FindCoordinator with themselves
        self.elsewhere: list[int] = []      # nodes a FindCoordinator was sent to explicitly
        cluster = SimpleNamespace(_coordinators={}, add_coordinator=self._add_coordinator,
                                  brokers=lambda: [SimpleNamespace(node_id=n) for n in (STALE, NEW)])
        self._manager = SimpleNamespace(cluster=cluster, run=self._run, send=self._send,
                                        broker_version_data=SimpleNamespace(api_version=lambda request: 4))
        from twophase.sinks._kafka_txn import CoordinatorType
        self._type = CoordinatorType.TRANSACTION
        for tid, node in cached.items():
            self._manager.cluster._coordinators[(self._type, tid)] = node

    def _run(self, go: Any) -> Any:
        return asyncio.run(go())

    async def _find_coordinator_ids(self, keys: list[str], key_type: Any) -> dict[str, int]:
        coords = self._manager.cluster._coordinators
        out = {}
        for k in keys:
            if (self._type, k) not in coords:
                self.finds += 1
                coords[(self._type, k)] = self.find_answers.pop(0) if self.find_answers else NEW
            out[k] = coords[(self._type, k)]
        return out

    def _add_coordinator(self, row: Any, key_type: Any, key: str, synthesize_node_id: bool = True) -> int:
        self._manager.cluster._coordinators[(self._type, key)] = row.node_id
        return row.node_id

    async def _send(self, request: Any, node_id: int) -> Any:
        if type(request).__name__ == "FindCoordinatorRequest":     # the truth, except from a stale node
            self.elsewhere.append(node_id)
            named = node_id if node_id in self.stale else NEW
            return SimpleNamespace(coordinators=[SimpleNamespace(key=k, node_id=named, error_code=0)
                                                 for k in request.coordinator_keys])
        tids = tuple(request.transactional_ids)
        self.asked.append((node_id, tids))
        known = self.states.get(node_id, {})
        return SimpleNamespace(transaction_states=[_row(t, known.get(t)) for t in tids])


def _client(admin: _Admin) -> TxnClient:
    client = TxnClient.__new__(TxnClient)
    client.config, client.retry_deadline_s = {}, 5.0
    client.admin = admin
    return client


OPEN = TxnState("Ongoing", 4000, 0, 1_700_000_000_000)


def test_not_found_from_a_stale_cached_coordinator_is_asked_again_after_a_fresh_lookup() -> None:
    """The trace of issue 22: the cached coordinator (the resumed broker) says unknown; the id is open on NEW."""
    admin = _Admin({STALE: {}, NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": STALE})
    states = _client(admin).describe(["p-0-1-0"])
    assert states == {"p-0-1-0": OPEN}
    assert admin.finds == 1                     # the cached coordinator was forgotten and looked up again
    assert admin.asked[-1] == (NEW, ("p-0-1-0",))


def test_not_found_is_trusted_when_the_freshly_named_coordinator_says_it_too() -> None:
    admin = _Admin({STALE: {}, NEW: {}}, cached={"p-0-1-0": STALE, "p-0-1-1": NEW})
    admin.stale = set()                         # every broker's FindCoordinator names NEW
    states = _client(admin).describe(["p-0-1-0", "p-0-1-1"])
    assert states == {"p-0-1-0": None, "p-0-1-1": None}
    # p-0-1-0: unknown at STALE, then at NEW (freshly named, a different node): trusted after one fresh lookup;
    # p-0-1-1: unknown at NEW twice (the same node): asked a third time, after a pause, at the coordinator another
    # broker (here STALE, the only other one) names
    assert [n for n, t in admin.asked if "p-0-1-0" in t] == [STALE, NEW]
    assert [n for n, t in admin.asked if "p-0-1-1" in t] == [NEW, NEW, NEW]
    assert admin.finds == 2 and admin.elsewhere == [STALE]


def test_a_fresh_lookup_naming_the_stale_node_again_is_looked_up_through_another_broker() -> None:
    """FindCoordinator answered by the stale broker itself names it again (and it never catches up here): the third
    ask's coordinator is looked up through another broker, which names NEW: the open transaction is seen."""
    admin = _Admin({STALE: {}, NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": STALE}, find_answers=[STALE, STALE])
    states = _client(admin).describe(["p-0-1-0"])
    assert states == {"p-0-1-0": OPEN}
    assert [n for n, _ in admin.asked] == [STALE, STALE, NEW]
    assert admin.elsewhere == [NEW]


def test_known_ids_cost_no_extra_lookup() -> None:
    admin = _Admin({NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": NEW})
    assert _client(admin).describe(["p-0-1-0"]) == {"p-0-1-0": OPEN}
    assert admin.finds == 0 and len(admin.asked) == 1


def test_the_slot_probe_does_not_take_a_slot_the_stale_coordinator_calls_unknown() -> None:
    """Invariant 4 end to end through _choose_id: slot 0's transaction is open on NEW, the cached coordinator (the
    resumed STALE broker) calls it unknown; the probe must pick slot 1, not re-initialise slot 0."""
    from twophase.sinks._kafka_writer import _KafkaWriterBase
    admin = _Admin({STALE: {}, NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": STALE, "p-0-1-1": STALE})
    client = _client(admin)
    sink = SimpleNamespace(_candidate_ids=lambda ctx: ["p-0-1-0", "p-0-1-1"], _client=lambda: client,
                           options=SimpleNamespace(attempt_slots=2))
    writer = SimpleNamespace(sink=sink, options=sink.options)   # _choose_id reads only these
    tid, seen = _KafkaWriterBase._choose_id(writer, SimpleNamespace(task_id=0, checkpoint_id=1))
    assert (tid, seen) == ("p-0-1-1", None)
