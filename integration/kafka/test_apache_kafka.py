"""twophase-kafka against Apache Kafka itself with Kafka's default broker settings (issue 22 section 0).

A default broker caps transaction timeouts at ``transaction.max.timeout.ms`` = 900000 (15 min), below the
sink's 1-hour default. With no ``kafka.transaction.timeout.ms`` the sink takes the largest timeout the
brokers accept and logs it; an explicit value the brokers refuse stays a clear error naming both settings;
and the Kafka quick start of docs/kafka.md runs as written on such a broker, every record once."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from integration.doc_blocks import python_blocks, run_as_written
from integration.kafka.apache_kafka import apache_kafka_broker

pytestmark = pytest.mark.kafka

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_broker():
    with apache_kafka_broker() as bootstrap:
        yield bootstrap


def _sink(bootstrap, tmp_path, **extra):
    from twophase.sinks.kafka import KafkaSink
    return KafkaSink.from_options({"kafka.bootstrap.servers": bootstrap, "topic": f"t-{uuid.uuid4().hex[:8]}",
                                   "checkpointLocation": str(tmp_path / "ck"),
                                   "prefixRegistry": str(tmp_path / "registry"), **extra})


def test_kafka_default_timeout_is_the_largest_the_default_brokers_accept(default_broker, tmp_path, caplog):
    caplog.set_level("INFO")
    sink = _sink(default_broker, tmp_path)
    sink.validate_destination()
    assert sink.options.transaction_timeout_ms == 900_000          # Kafka's default transaction.max.timeout.ms
    assert sink.effective_timeout_ms() == 900_000
    chosen = [r for r in caplog.records if "kafka_transaction_timeout_chosen" in r.getMessage()]
    assert chosen and "15 min" in chosen[0].getMessage() and "DataLossError" in chosen[0].getMessage()
    # the pinned value travels with the sink to executors and the commit runner
    import pickle
    assert pickle.loads(pickle.dumps(sink)).options.transaction_timeout_ms == 900_000


def test_kafka_explicit_timeout_above_the_brokers_maximum_is_refused_naming_both(default_broker, tmp_path):
    from twophase.errors import ConfigurationError
    sink = _sink(default_broker, tmp_path, **{"kafka.transaction.timeout.ms": "3600000"})
    with pytest.raises(ConfigurationError) as e:
        sink.validate_destination()
    assert "kafka.transaction.timeout.ms=3600000" in str(e.value) and "transaction.max.timeout.ms" in str(e.value)


def test_kafka_default_timeout_below_two_triggers_is_refused_after_the_choice(default_broker, tmp_path):
    from twophase.errors import ConfigurationError
    sink = _sink(default_broker, tmp_path, triggerInterval="10 minutes")
    with pytest.raises(ConfigurationError) as e:
        sink.validate_destination()
    assert "900000 ms, chosen because kafka.transaction.timeout.ms is not set" in str(e.value)


def test_kafka_default_timeout_is_one_hour_where_the_brokers_allow_it(tmp_path):
    with apache_kafka_broker("transaction.max.timeout.ms=3600000") as bootstrap:
        sink = _sink(bootstrap, tmp_path)
        sink.validate_destination()
        assert sink.options.transaction_timeout_ms == 3_600_000


CHECK = textwrap.dedent('''
    import json, time
    from kafka import KafkaConsumer
    deadline, seen = time.time() + 300, []
    consumer = KafkaConsumer("out", bootstrap_servers=BOOTSTRAP, isolation_level="read_committed",
                             auto_offset_reset="earliest", consumer_timeout_ms=2000)
    while len(seen) < 500 and time.time() < deadline:
        for q in spark.streams.active:
            assert q.exception() is None, q.exception()
        seen.extend(m.value.decode() for m in consumer)
    for q in spark.streams.active:
        q.stop()
    seen.extend(m.value.decode() for m in consumer)
    print(json.dumps({"records": len(seen), "distinct": len(set(seen))}))
    spark.stop()
''')


@pytest.mark.spark
def test_kafka_quick_start_runs_as_written_on_a_default_apache_kafka(default_broker, tmp_path):
    """docs/kafka.md's first example, with only the broker address and /data replaced: it used to stop at
    start (the 1-hour default above the broker's 15-minute maximum)."""
    from kafka import KafkaProducer
    block = python_blocks("docs/kafka.md")[0]
    producer = KafkaProducer(bootstrap_servers=default_broker)
    for i in range(500):
        producer.send("in", f"r{i}".encode())
    producer.flush()
    producer.close()
    data = str(tmp_path / "data") + "/"
    script = ("from pyspark.sql import SparkSession\nspark = SparkSession.builder.getOrCreate()\n"
              + block.replace("localhost:9092", default_broker).replace("/data/", data)
              + f"\nBOOTSTRAP = {default_broker!r}\n" + CHECK)
    got = run_as_written(script, tmp_path)
    assert got == {"records": 500, "distinct": 500}, got


# ---- what a real broker does that the old stand-in did not (issue 22 section 2)

CHILD = textwrap.dedent('''
    import json, sys
    from integration.kafka.broker import key_value_batch
    from twophase.coordinator import CheckpointCoordinator
    from twophase.sink import TransactionContext, run_task
    from twophase.sinks.kafka import KafkaSink
    from twophase.spark.datasource import prepare_sink
    raw = json.loads(sys.argv[1])
    sink = KafkaSink.from_options(raw)
    prepare_sink(sink, raw["checkpointLocation"], what="expiry-test")
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), [key_value_batch("lost", 10)])
    print(json.dumps(ack.handle), flush=True)
    CheckpointCoordinator(sink).complete_batch(0, [ack], ["0"])   # TWOPHASE_FAULT=after_complete kills here
''')


def test_kafka_transaction_expired_by_the_broker_is_named_loss_then_accept_loss_goes_on(kafka_bootstrap, tmp_path):
    """The driver dies after the checkpoint is decided; the broker aborts the prepared transaction when its
    timeout passes. The restart must raise DataLossError naming the checkpoint and ``twophase log resolve``
    (never a silent skip); after ``--accept-loss`` the next batch commits."""
    from integration.kafka.broker import committed_values, create_topic, key_value_batch, unique
    from twophase.coordinator import CheckpointCoordinator
    from twophase.errors import DataLossError
    from twophase.sink import TransactionContext, run_task
    from twophase.sinks.kafka import KafkaSink
    from twophase.spark.datasource import prepare_sink

    topic = create_topic(kafka_bootstrap, unique("expiry"), 2)
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "checkpointLocation": str(tmp_path / "ck"),
           "prefixRegistry": str(tmp_path / "registry"), "transactionalIdPrefix": unique("exp"),
           "kafka.transaction.timeout.ms": "3000"}
    env = {**os.environ, "TWOPHASE_FAULT": "after_complete", "PYTHONPATH": str(ROOT)}
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(raw)], capture_output=True, text=True,
                           timeout=120, env=env, start_new_session=True, cwd=str(ROOT))
    assert child.returncode == -9, child.stderr[-3000:]           # killed at after_complete
    handle = json.loads(child.stdout.strip().splitlines()[-1])
    sink = KafkaSink.from_options(raw)
    deadline = time.time() + 60                                    # the broker's abort of the expired transaction
    while time.time() < deadline:
        state = sink._client().describe([handle["transactional_id"]])[handle["transactional_id"]]
        if state is not None and state.state != "Ongoing":
            break
        time.sleep(1)
    else:
        raise AssertionError("the broker never expired the transaction")
    with pytest.raises(DataLossError) as e:
        prepare_sink(sink, raw["checkpointLocation"], what="restart")
    assert "checkpoint 0" in str(e.value) and "twophase log resolve" in str(e.value) and "--accept-loss" in str(e.value)
    with pytest.raises(DataLossError):                             # every restart stops there until resolved
        prepare_sink(KafkaSink.from_options(raw), raw["checkpointLocation"], what="restart")
    log = sink.transaction_log()
    res = subprocess.run([sys.executable, "-m", "twophase.cli", "log", "resolve", log.location, "--sink-id",
                          sink.sink_id, "--checkpoint", "0", "--accept-loss", "--reason", "expired in test"],
                         capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert res.returncode == 0, res.stderr
    sink = KafkaSink.from_options(raw)
    prepare_sink(sink, raw["checkpointLocation"], what="after resolve")
    ack = run_task(sink, TransactionContext(sink.sink_id, 1, "0", 0), [key_value_batch("kept", 10)])
    assert CheckpointCoordinator(sink).complete_batch(1, [ack], ["0"]) == "COMMITTED"
    assert committed_values(kafka_bootstrap, topic) == sorted(f"kept-{i}".encode() for i in range(10))


def test_kafka_task_that_produced_nothing_commits_as_a_no_op(kafka_bootstrap, tmp_path):
    """Apache Kafka answers an EndTxn of a transaction with no partitions with an error: a task that wrote no
    record must still ack and commit, never fail the batch."""
    from integration.kafka.broker import committed_values, create_topic, key_value_batch, unique
    from twophase.coordinator import CheckpointCoordinator
    from twophase.sink import TransactionContext, run_task
    from twophase.sinks.kafka import KafkaSink
    from twophase.spark.datasource import prepare_sink

    topic = create_topic(kafka_bootstrap, unique("empty"), 2)
    for client in ("librdkafka", "kafka-python"):
        raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic,
               "checkpointLocation": str(tmp_path / f"ck-{client}"), "prefixRegistry": str(tmp_path / "registry"),
               "transactionalIdPrefix": unique("empty"), "kafkaClient": client}
        sink = KafkaSink.from_options(raw)
        prepare_sink(sink, raw["checkpointLocation"], what="test")
        empty = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), [])
        full = run_task(sink, TransactionContext(sink.sink_id, 0, "1", 0), [key_value_batch(client, 3)])
        assert CheckpointCoordinator(sink).complete_batch(0, [empty, full], ["0", "1"]) == "COMMITTED"
    assert len(committed_values(kafka_bootstrap, topic)) == 6
