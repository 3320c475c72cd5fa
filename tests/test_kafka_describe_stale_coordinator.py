"""Issue 22: TxnClient.describe trusts "unknown transactional id" only from a coordinator another broker named.

A broker resumed after a pause (SIGSTOP, a long GC) may still believe it leads the ``__transaction_state``
partition of an id and answer TRANSACTIONAL_ID_NOT_FOUND for an id another broker took over meanwhile (the id's
transaction was initialised on the new coordinator); asked FindCoordinator, it names itself. The attempt-slot probe
(invariant 4) takes an unknown id as free and InitProducerIds it: that aborts an open transaction which may hold
prepared data. These units drive the real :meth:`TxnClient.describe` over a fake admin connection (its coordinator
cache, FindCoordinator and DescribeTransactions per node, brokers that are stale, down or answer an empty
FindCoordinator): a protocol unit, the one place a fake is allowed.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, Iterable

import pytest

pytest.importorskip("kafka")

import kafka.errors as Errors  # noqa: E402

from twophase.errors import TransientSinkError  # noqa: E402
from twophase.sinks._kafka_txn import TxnClient, TxnState  # noqa: E402

STALE, NEW, OTHER = 1, 2, 3


def _row(tid: str, state: Any) -> SimpleNamespace:
    if state is None:
        return SimpleNamespace(transactional_id=tid, error_code=Errors.TransactionalIdNotFoundError.errno)
    return SimpleNamespace(transactional_id=tid, error_code=0, transaction_state=state.state,
                           producer_id=state.producer_id, producer_epoch=state.epoch,
                           transaction_start_time_ms=state.start_ms, topics=[])


class _Admin:
    """A cluster of ``nodes`` (default ``STALE`` and ``NEW``): ``STALE`` is the resumed old coordinator, knows
    nothing and names itself; the others name the truth, ``NEW``.

    ``cached`` seeds the client's coordinator cache; kafka-python's own lookup (``_find_coordinator_ids``, which
    does not say which broker answered) answers ``find_answers`` in turn (then ``NEW``). FindCoordinator sent to one
    node (``elsewhere``) answers as that node believes: a node of ``stale`` names itself, one of ``down`` raises
    (paused, timed out), one of ``empty`` answers a v4 response with no coordinator row. Each node answers
    DescribeTransactions from its own ``states``."""

    def __init__(self, states: dict[int, dict[str, TxnState]], cached: dict[str, int],
                 find_answers: Iterable[int] = (), nodes: Iterable[int] = (STALE, NEW)) -> None:
        self.states = states
        self.find_answers = list(find_answers)
        self.finds = 0
        self.asked: list[tuple[int, tuple[str, ...]]] = []
        self.stale = {STALE}                # nodes answering FindCoordinator with themselves
        self.catch_up_after: dict[int, int] = {}  # stale node -> FindCoordinator answers before it names the truth
        self.down: set[int] = set()         # nodes whose requests fail (paused: the request times out)
        self.empty: set[int] = set()        # nodes answering FindCoordinator v4 with an empty coordinators list
        self.elsewhere: list[int] = []      # nodes a FindCoordinator was sent to explicitly
        self.truth = NEW                    # the coordinator the up-to-date brokers name
        self.nodes = tuple(nodes)
        self.refreshed_nodes: Any = None    # the broker list a metadata refresh returns (None: unchanged)
        self.refreshes = 0
        cluster = SimpleNamespace(_coordinators={}, add_coordinator=self._add_coordinator,
                                  brokers=lambda: [SimpleNamespace(node_id=n) for n in self.nodes],
                                  refresh_metadata=self._refresh_metadata)
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
                coords[(self._type, k)] = self.find_answers.pop(0) if self.find_answers else self.truth
            out[k] = coords[(self._type, k)]
        return out

    async def _refresh_metadata(self, node_id: Any = None) -> None:
        self.refreshes += 1
        if self.refreshed_nodes is not None:
            self.nodes = tuple(self.refreshed_nodes)

    def _add_coordinator(self, row: Any, key_type: Any, key: str, synthesize_node_id: bool = True) -> int:
        if row.error_code:
            raise Errors.for_code(row.error_code)("FindCoordinatorResponse error")
        self._manager.cluster._coordinators[(self._type, key)] = row.node_id
        return row.node_id

    async def _send(self, request: Any, node_id: int) -> Any:
        if node_id in self.down:
            raise Errors.KafkaTimeoutError(f"node {node_id} does not answer")
        if type(request).__name__ == "FindCoordinatorRequest":     # the truth, except from a stale node
            self.elsewhere.append(node_id)
            if node_id in self.empty:
                return SimpleNamespace(coordinators=[])
            if node_id in self.catch_up_after:
                self.catch_up_after[node_id] -= 1
                if self.catch_up_after[node_id] < 0:
                    self.stale.discard(node_id)
            named = node_id if node_id in self.stale else self.truth
            return SimpleNamespace(coordinators=[SimpleNamespace(key=k, node_id=named, error_code=0)
                                                 for k in request.coordinator_keys])
        tids = tuple(request.transactional_ids)
        self.asked.append((node_id, tids))
        known = self.states.get(node_id, {})
        return SimpleNamespace(transaction_states=[_row(t, known.get(t)) for t in tids])


def _client(admin: _Admin, deadline_s: float = 5.0) -> TxnClient:
    client = TxnClient.__new__(TxnClient)
    client.config, client.retry_deadline_s = {}, deadline_s
    client.admin = admin
    return client


OPEN = TxnState("Ongoing", 4000, 0, 1_700_000_000_000)


def test_not_found_from_a_stale_cached_coordinator_is_asked_again_after_a_fresh_lookup() -> None:
    """The trace of issue 22: the cached coordinator (the resumed broker) says unknown; the id is open on NEW."""
    admin = _Admin({STALE: {}, NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": STALE})
    states = _client(admin).describe(["p-0-1-0"])
    assert states == {"p-0-1-0": OPEN}
    assert admin.elsewhere                      # the cached coordinator was forgotten and looked up again
    assert admin.asked[-1] == (NEW, ("p-0-1-0",))


def test_not_found_is_trusted_when_a_broker_other_than_the_answering_one_named_it() -> None:
    admin = _Admin({STALE: {}, NEW: {}}, cached={"p-0-1-0": STALE, "p-0-1-1": NEW})
    admin.stale = set()                         # every broker's FindCoordinator names NEW
    states = _client(admin).describe(["p-0-1-0", "p-0-1-1"])
    assert states == {"p-0-1-0": None, "p-0-1-1": None}
    # each: unknown at the cached coordinator, then at the coordinator another broker named (STALE names NEW):
    # trusted after one explicit lookup, without the recheck pause
    assert [n for n, t in admin.asked if "p-0-1-0" in t] == [STALE, NEW]
    assert [n for n, t in admin.asked if "p-0-1-1" in t] == [NEW, NEW]
    assert admin.finds == 0 and STALE in admin.elsewhere


def test_a_fresh_lookup_naming_the_stale_node_again_is_looked_up_through_another_broker() -> None:
    """kafka-python's lookup, answered by the stale broker itself, would name it again (and it never catches up
    here): the confirming lookup is asked of the other broker, which names NEW: the open transaction is seen."""
    admin = _Admin({STALE: {}, NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": STALE}, find_answers=[STALE, STALE])
    states = _client(admin).describe(["p-0-1-0"])
    assert states == {"p-0-1-0": OPEN}
    assert [n for n, _ in admin.asked] == [STALE, NEW]


def test_known_ids_cost_no_extra_lookup() -> None:
    admin = _Admin({NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": NEW})
    assert _client(admin).describe(["p-0-1-0"]) == {"p-0-1-0": OPEN}
    assert admin.finds == 0 and len(admin.asked) == 1 and admin.elsewhere == []


def test_the_slot_probe_does_not_take_a_slot_the_stale_coordinator_calls_unknown() -> None:
    """Invariant 4 end to end through _choose_id: slot 0's transaction is open on NEW, the cached coordinator (the
    resumed STALE broker) calls it unknown; the probe must pick slot 1, not re-initialise slot 0."""
    from twophase.sinks._kafka_writer import _KafkaWriterBase
    admin = _Admin({STALE: {}, NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": STALE, "p-0-1-1": STALE},
                   nodes=(STALE, NEW, OTHER))
    client = _client(admin)
    sink = SimpleNamespace(_candidate_ids=lambda ctx: ["p-0-1-0", "p-0-1-1"], _client=lambda: client,
                           options=SimpleNamespace(attempt_slots=2))
    writer = SimpleNamespace(sink=sink, options=sink.options)   # _choose_id reads only these
    tid, seen = _KafkaWriterBase._choose_id(writer, SimpleNamespace(task_id=0, checkpoint_id=1))
    assert (tid, seen) == ("p-0-1-1", None)


# ---- session 15: the confirmation's holes (each of these failed before the fix)

def test_a_confirming_lookup_whose_first_broker_is_down_asks_the_next_broker() -> None:
    """Defect 1: the lookup elsewhere asked only the lowest-numbered other broker. Here that broker (node 2) is
    paused, the coordinator now is node 3, and kafka-python's own lookups are answered by the stale broker (naming
    itself): before, the third "unknown" from STALE was trusted and the open transaction taken for a free slot."""
    admin = _Admin({STALE: {}, OTHER: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": STALE},
                   find_answers=[STALE] * 5, nodes=(STALE, NEW, OTHER))
    admin.down, admin.truth = {NEW}, OTHER      # node 2 paused: every request to it times out
    states = _client(admin).describe(["p-0-1-0"])
    assert states == {"p-0-1-0": OPEN}
    assert admin.asked[-1] == (OTHER, ("p-0-1-0",))


def test_a_confirmation_whose_lookup_fails_on_every_other_broker_never_reports_unknown() -> None:
    """Defect 1: every broker but the stale one is down; the stale one's "unknown" is never confirmed: at the
    deadline describe raises the transient error the probe's callers retry (the task fails and is re-run), never
    "unknown" (a free slot whose InitProducerId would abort the open transaction)."""
    admin = _Admin({STALE: {}}, cached={"p-0-1-0": STALE}, find_answers=[STALE] * 50, nodes=(STALE, NEW, OTHER))
    admin.down = {NEW, OTHER}
    with pytest.raises(TransientSinkError, match="p-0-1-0"):
        _client(admin, deadline_s=1.0).describe(["p-0-1-0"])
    assert all(n == STALE for n, _ in admin.asked)


def test_unknown_from_two_nodes_is_not_trusted_when_the_second_named_itself() -> None:
    """Defect 2: the cached coordinator OTHER says unknown, kafka-python's fresh lookup is answered by the stale
    broker naming itself, which says unknown too: two different nodes, but the second was named by nobody else.
    Before, that was trusted; now the confirming lookup goes to a broker other than the answering one."""
    admin = _Admin({STALE: {}, OTHER: {}, NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": OTHER},
                   find_answers=[STALE] * 5, nodes=(STALE, NEW, OTHER))
    states = _client(admin).describe(["p-0-1-0"])
    assert states == {"p-0-1-0": OPEN}
    assert admin.asked[-1] == (NEW, ("p-0-1-0",))


def test_an_empty_find_coordinator_answer_counts_as_a_failed_lookup() -> None:
    """Defect 3: a FindCoordinator v4 answer with no coordinator row raised IndexError out of describe; it is a
    failed lookup at that broker: the next one is asked."""
    admin = _Admin({STALE: {}, NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": STALE}, find_answers=[STALE] * 5,
                   nodes=(STALE, NEW, OTHER))
    admin.empty = {NEW}
    states = _client(admin).describe(["p-0-1-0"])
    assert states == {"p-0-1-0": OPEN}
    assert NEW in admin.elsewhere and OTHER in admin.elsewhere


# ---- two brokers: the only other broker is stale too (what is and is not covered: TxnClient.describe's docstring)

def test_invariant_4_two_brokers_the_only_other_broker_paused_never_confirms_unknown() -> None:
    """2-broker cluster, the stale broker answers and the only other one is paused: no broker but the answering
    one names a coordinator, so "unknown" is never trusted: TransientSinkError at the deadline (the task fails and
    is re-run once the pause ends), never a free slot."""
    admin = _Admin({STALE: {}}, cached={"p-0-1-0": STALE}, find_answers=[STALE] * 50)
    admin.down = {NEW}
    with pytest.raises(TransientSinkError):
        _client(admin, deadline_s=1.0).describe(["p-0-1-0"])


def test_invariant_4_two_brokers_both_naming_themselves_ask_the_one_not_yet_heard() -> None:
    """2-broker cluster, the other broker stale too (both name themselves: each believes it leads the partition):
    a self-named coordinator's "unknown" is not trusted; the one that has not answered yet is asked (it holds the
    open transaction here); if both said unknown, describe would retry until one of them catches up (or raise
    TransientSinkError at the deadline)."""
    admin = _Admin({STALE: {}, NEW: {"p-0-1-0": OPEN}}, cached={"p-0-1-0": STALE}, find_answers=[STALE] * 50)
    admin.stale = {STALE, NEW}
    assert _client(admin).describe(["p-0-1-0"]) == {"p-0-1-0": OPEN}
    admin = _Admin({STALE: {}, NEW: {}}, cached={"p-0-1-0": STALE}, find_answers=[STALE] * 50)
    admin.stale = {STALE, NEW}
    with pytest.raises(TransientSinkError):
        _client(admin, deadline_s=1.0).describe(["p-0-1-0"])


def test_invariant_4_two_brokers_a_stale_broker_catching_up_confirms_unknown() -> None:
    """2-broker cluster, an id unknown everywhere: the stale broker names itself (disagreeing with NEW, which names
    itself too) for two lookups, then catches up and names NEW: NEW's "unknown" is trusted from then on."""
    admin = _Admin({STALE: {}, NEW: {}}, cached={"p-0-1-0": STALE})
    admin.catch_up_after = {STALE: 1}
    assert _client(admin).describe(["p-0-1-0"]) == {"p-0-1-0": None}
    assert admin.asked[-1] == (NEW, ("p-0-1-0",))


def test_a_single_broker_cluster_trusts_its_own_unknown() -> None:
    """One broker in the metadata: it names itself and no other broker could have taken its partitions over."""
    admin = _Admin({NEW: {}}, cached={"p-0-1-0": NEW}, nodes=(NEW,))
    admin.stale = {NEW}
    assert _client(admin).describe(["p-0-1-0"]) == {"p-0-1-0": None}
    assert [n for n, _ in admin.asked] == [NEW, NEW] and admin.elsewhere == [NEW]
