"""Review 15 of 35d47d4 (issue 22 residual) on the real 3-broker cluster: a second broker SIGSTOPped while
:meth:`TxnClient.describe` looks the coordinator up "elsewhere" (defect 1 of the residual was only covered on the
fake admin).

Set-up as integration/kafka/test_kafka_describe_stale_coordinator.py: the driver's client caches V as the
coordinator of a never-initialised id ``T``; V is paused; once another broker N coordinates ``T`` a producer
leaves a transaction open there; V is resumed and at once the client describes ``T``. The first "unknown" comes
from V (stale); during the confirmation lookup (:meth:`TxnClient._find_coordinator_elsewhere`), right before its
first FindCoordinator leaves, a second broker is SIGSTOPped:

- ``asked``: the broker that lookup asks first (its request times out; the lookup must go on to another broker
  and never fall back to trusting V's own naming);
- ``coordinator``: N itself (the lookup is answered, but the DescribeTransactions to N times out until N is fenced
  and a third broker loads ``T``).

Either way describe must never answer "unknown" for ``T`` (the attempt-slot probe would take it as free and its
InitProducerId abort the open transaction): the open transaction, or TransientSinkError at the deadline. Needs
``TWOPHASE_KAFKA_CLUSTER=1``; run under ``flock /tmp/twophase-spark.lock`` (about 45 s per case)."""

from __future__ import annotations

import os
import time

import pytest

from integration.kafka.broker import unique
from integration.kafka.test_kafka_describe_stale_coordinator import _coordinator_via, _init_transactions

pytestmark = pytest.mark.kafka

needs_flag = pytest.mark.skipif(os.environ.get("TWOPHASE_KAFKA_CLUSTER") != "1",
                                reason="cluster fault campaign: set TWOPHASE_KAFKA_CLUSTER=1")


@needs_flag
@pytest.mark.parametrize("second", ["asked", "coordinator"])
def test_review15_second_broker_paused_during_the_elsewhere_lookup_never_makes_an_open_txn_unknown(
        kafka_cluster, second, monkeypatch):
    from confluent_kafka import Producer
    from kafka.protocol.metadata import FindCoordinatorRequest

    from integration.kafka.cluster import wait_for
    from twophase.errors import TransientSinkError
    from twophase.sinks._kafka_txn import TxnClient

    cluster = kafka_cluster
    cluster.wait_healthy()
    topic = cluster.create_topic(unique("stale2"), 1)
    tid = unique("stale2-tid")
    client = TxnClient({"bootstrap_servers": cluster.bootstrap.split(","), "request_timeout_ms": 4000},
                       retry_deadline_s=60.0)
    producer = None
    victim = cluster.coordinator(tid)
    paused: list[int] = []
    lookups: list[tuple[int, str]] = []
    try:
        assert client.describe([tid]) == {tid: None}            # never initialised; the client caches V
        cluster.pause(victim)
        try:
            others = ",".join(cluster.address(i) for i in range(1, cluster.n + 1) if i != victim)
            wait_for(lambda: _coordinator_via(others, tid) != victim, 90, f"the coordinator of {tid} to move")
            new = _coordinator_via(others, tid)
            producer = Producer({"bootstrap.servers": others, "transactional.id": tid,
                                 "transaction.timeout.ms": 120000})
            _init_transactions(producer)
            producer.begin_transaction()
            for i in range(10):
                producer.produce(topic, f"v{i}".encode())
            assert producer.flush(30) == 0
        finally:
            cluster.resume(victim)

        manager = client.admin._manager
        real_send = manager.send

        async def send(request, node_id=None, **kw):
            if isinstance(request, FindCoordinatorRequest) and node_id is not None:
                lookups.append((node_id, "find"))
                if not paused:
                    target = node_id if second == "asked" else new
                    cluster.pause(target)
                    paused.append(target)
            return await real_send(request, node_id=node_id, **kw)
        monkeypatch.setattr(manager, "send", send)

        t0 = time.monotonic()
        try:
            states = client.describe([tid])
            outcome = states[tid]
        except TransientSinkError as e:
            outcome = e
        took = time.monotonic() - t0
        print(f"{second}: victim {victim}, new coordinator {new}, paused during the lookup {paused}, "
              f"FindCoordinator sent to {[n for n, _ in lookups]}; describe after {took:.1f}s: {outcome!r}")
        assert paused, "the confirmation lookup never ran (V's first answer was not 'unknown'?)"
        assert outcome is not None, (f"describe called the open transaction of {tid} unknown: V={victim} resumed, "
                                     f"N={new}, {paused} paused during the lookup, lookups {lookups}")
        if not isinstance(outcome, TransientSinkError):
            assert outcome.is_open, outcome
    finally:
        monkeypatch.undo()
        for node in paused:
            cluster.resume(node)
        cluster.resume(victim)
        if producer is not None:
            try:
                producer.abort_transaction(30)
            except Exception:  # noqa: BLE001 - cleanup
                pass
        client.close()
        cluster.wait_healthy(topics=(topic,))


# ---- B: 6a391ce / 960822a, librdkafka-only kafka.* options of the source

def _aborted_then_committed(bootstrap: str, topic: str) -> None:
    """3 records in an aborted transaction ("aborted-*"), then 2 in a committed one ("committed-*")."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("rv15-tid")})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, f"aborted-{i}".encode(), partition=0)
    assert p.flush(30) == 0
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, f"committed-{i}".encode(), partition=0)
    p.commit_transaction(30)


@pytest.mark.parametrize("extra", [{"kafka.api.version.request": "false"},
                                   {"kafka.api.version.request": "false", "kafka.broker.version.fallback": "0.10.0"}])
def test_review15_librdkafka_option_never_makes_the_source_read_aborted_records(kafka3_bootstrap, extra):
    """read_committed must hold whatever librdkafka-only option is accepted: ``api.version.request=false`` makes
    librdkafka assume a 0.10 broker (``broker.version.fallback``) and fetch with a pre-transactions Fetch version,
    which has no isolation level; Apache Kafka 3.x still serves it (4.x removed those versions) and returns the
    records of aborted transactions. Refusing the option passes this test; reading them fails it."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from twophase.errors import ConfigurationError
    from twophase.sources._kafka_offsets import KafkaSplit
    from twophase.sources._kafka_split_reader import KafkaSplitReader
    from twophase.sources.kafka import KafkaSourceOptions

    topic = unique("rv15-avr")
    admin = AdminClient({"bootstrap.servers": kafka3_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    _aborted_then_committed(kafka3_bootstrap, topic)
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": kafka3_bootstrap, "group.id": unique("rv15-g"),
                  "isolation.level": "read_committed"})
    _, end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)   # read_committed: the stable end
    c.close()
    try:
        options = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": kafka3_bootstrap, "subscribe": topic,
                                                   "kafkaConsumer.pollTimeoutMs": "20000", **extra})
    except ConfigurationError as e:
        print(f"refused: {e}")
        return
    values = []
    try:
        for batch in KafkaSplitReader(options).read(KafkaSplit(topic, 0, 0, end)):
            values += [v.decode() for v in batch.column("value").to_pylist()]
    except Exception as e:  # noqa: BLE001 - a loud failure is not a silent read
        print(f"read failed loudly: {type(e).__name__}: {e}")
        return
    print(f"{extra}: read {values} of [0, {end})")
    assert not [v for v in values if v.startswith("aborted")], (
        f"the source (read_committed) read aborted transactional records with {extra}: {values}")


def test_review15_single_broker_describe_of_a_free_id_refreshes_metadata_and_confirms(kafka_bootstrap):
    """The single-broker exception on real kafka-python and Apache Kafka: a never-used id is "unknown" after one
    metadata refresh (review 15 A1's fix: a lone broker's own naming stands only when a fresh metadata still lists
    it alone); an open transaction is seen open."""
    from confluent_kafka import Producer

    from twophase.sinks._kafka_txn import TxnClient
    client = TxnClient({"bootstrap_servers": kafka_bootstrap.split(",")}, retry_deadline_s=30.0)
    free, held = unique("rv15-free"), unique("rv15-held")
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": held})
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        out = client.describe([free, held])
        assert out[free] is None
        assert out[held] is not None and out[held].state in ("Empty", "Ongoing"), out
    finally:
        try:
            producer.abort_transaction(30)
        except Exception:  # noqa: BLE001 - cleanup
            pass
        client.close()
