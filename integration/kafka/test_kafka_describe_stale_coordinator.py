"""Issue 22 on the 3-broker cluster: a paused-then-resumed old coordinator must not make an open transaction
look unknown to :meth:`TxnClient.describe` (whose "unknown" the attempt-slot probe takes as a free slot).

The driver's client knows the coordinator of a never-initialised id ``T`` (broker V). V is SIGSTOPped; once
another broker coordinates ``T``, a producer initialises ``T`` there and leaves a transaction open with records
in it. V is SIGCONTed and, at once, the driver's client (its coordinator cache still naming V) describes ``T``:
it must see the open transaction. Needs ``TWOPHASE_KAFKA_CLUSTER=1`` (about 30 s: the controller fences the
paused broker after its 9 s session timeout)."""

from __future__ import annotations

import os
import time

import pytest

from integration.kafka.broker import unique

pytestmark = pytest.mark.kafka

needs_flag = pytest.mark.skipif(os.environ.get("TWOPHASE_KAFKA_CLUSTER") != "1",
                                reason="cluster fault campaign: set TWOPHASE_KAFKA_CLUSTER=1")


def _raw_describe(client, node: int, tid: str):
    """One DescribeTransactions straight to ``node`` (what describe did before issue 22's fix): error name."""
    import kafka.errors as Errors
    from kafka.protocol.admin.transactions import DescribeTransactionsRequest

    async def go():
        return await client.admin._manager.send(DescribeTransactionsRequest(transactional_ids=[tid]), node_id=node)
    try:
        (row,) = client.admin._manager.run(go).transaction_states
        return Errors.for_code(row.error_code).__name__, getattr(row, "transaction_state", None)
    except Exception as e:  # noqa: BLE001 - informational
        return type(e).__name__, None


def _coordinator_via(bootstrap: str, tid: str) -> int:
    """FindCoordinator through ``bootstrap`` only (cluster.coordinator bootstraps from every live PID, the paused
    broker included, and kafka-python may wait 30 s on it)."""
    from kafka import KafkaAdminClient
    from kafka.protocol.metadata import CoordinatorType
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        async def go():
            return await admin._find_coordinator_id(tid, CoordinatorType.TRANSACTION)
        return int(admin._manager.run(go))
    finally:
        admin.close()


def _init_transactions(producer, deadline_s: float = 120.0) -> None:
    """init_transactions, again while the new coordinator loads the partition (it waits for the ISR to shrink)."""
    from confluent_kafka import KafkaError, KafkaException
    again = {KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
             KafkaError.NOT_COORDINATOR, KafkaError._TIMED_OUT}
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            producer.init_transactions(30)
            return
        except KafkaException as e:
            err = e.args[0]
            if time.monotonic() > deadline or not (err.retriable() or err.code() in again):
                raise


@needs_flag
@pytest.mark.parametrize("round_", range(3))
def test_kafka_cluster_resumed_old_coordinator_never_makes_an_open_transaction_unknown(kafka_cluster, round_):
    from confluent_kafka import Producer

    from integration.kafka.cluster import wait_for
    from twophase.sinks._kafka_txn import TxnClient

    cluster = kafka_cluster
    cluster.wait_healthy()
    topic = cluster.create_topic(unique("stale"), 1)
    tid = unique("stale-tid")
    client = TxnClient({"bootstrap_servers": cluster.bootstrap.split(","), "request_timeout_ms": 4000},
                       retry_deadline_s=60.0)
    producer = None
    victim = cluster.coordinator(tid)
    try:
        assert client.describe([tid]) == {tid: None}            # never initialised; the client caches V
        cluster.pause(victim)
        try:
            others = ",".join(cluster.address(i) for i in range(1, cluster.n + 1) if i != victim)
            wait_for(lambda: _coordinator_via(others, tid) != victim, 90, f"the coordinator of {tid} to move")
            producer = Producer({"bootstrap.servers": others, "transactional.id": tid,
                                 "transaction.timeout.ms": 60000})
            _init_transactions(producer)
            producer.begin_transaction()
            for i in range(10):
                producer.produce(topic, f"v{i}".encode())
            assert producer.flush(30) == 0
        finally:
            cluster.resume(victim)
        t0 = time.monotonic()
        raw = _raw_describe(client, victim, tid)                 # the old, single ask at the cached coordinator
        t_raw = time.monotonic() - t0
        states = client.describe([tid])
        t_desc = time.monotonic() - t0
        print(f"round {round_}: victim {victim}; raw ask at the resumed broker after {t_raw:.3f}s: {raw}; "
              f"describe after {t_desc:.3f}s: {states}")
        st = states[tid]
        assert st is not None and st.is_open, (f"describe called the open transaction of {tid} {st} right after "
                                               f"its old coordinator {victim} resumed (raw answer there: {raw})")
    finally:
        cluster.resume(victim)
        if producer is not None:
            try:
                producer.abort_transaction(30)
            except Exception:  # noqa: BLE001 - cleanup
                pass
        client.close()
        cluster.wait_healthy(topics=(topic,))
