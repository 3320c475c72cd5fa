"""The embedded runtime, the Kafka sink and a transaction the broker ends before the decision (job invariant 5,
tests/test_runtime_check_prepared.py on the file sink): the check (DescribeTransactions) names it gone, the
checkpoint is never decided, the job fails over and read_committed readers see every record exactly once.
The broker's abort of an expired transaction is played as in test_kafka_sink.py: its id's epoch is bumped
(``fence``), which aborts the Ongoing transaction, right after the task pre-committed it. Both clients."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests", "runtime"))

from rt_helpers import two_source_job  # noqa: E402
from integration.kafka.broker import create_topic, read_topic, unique  # noqa: E402
from twophase.runtime import CheckpointConfig, FixedDelayRestart, JobRunner  # noqa: E402
from twophase.sinks.kafka import KafkaSink  # noqa: E402
from twophase.states import CheckpointState  # noqa: E402

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_job_inv5_kafka_transaction_ended_by_the_broker_before_the_decision_fails_over_exactly_once(
        tmp_path, kafka_bootstrap, client):
    topic = create_topic(kafka_bootstrap, unique("rt-gone"), partitions=2)
    g, _, expected = two_source_job(str(tmp_path / "unused"), n_a=6000, n_b=1000, a_delay=0.02, b_delay=0.05,
                                    name=f"gone-{client}")
    sink = KafkaSink.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic,
                                   "prefixRegistry": str(tmp_path / "registry"), "log.location": str(tmp_path / "log"),
                                   "transactionalIdPrefix": unique("rtg"), "checkpointLocation": str(tmp_path / "ck"),
                                   "kafkaClient": client})
    out = g.vertex("out")
    out.sink = sink
    out.to_row = lambda r: {"key": str(r["id"]), "value": json.dumps(r)}
    lock = threading.Lock()
    ended: dict[str, object] = {}
    seen: list = []
    create_writer = sink.create_writer

    def writer_whose_transaction_the_broker_ends(context):
        w = create_writer(context)
        prepare = w.prepare_commit

        def prepare_then_end():
            c = prepare()
            with lock:
                seen.append((c.checkpoint_id, c.records))
                if "txn" not in ended and c.checkpoint_id >= 3 and c.records:
                    ended.update(txn=c.transactional_id, label=c.checkpoint_id, pid=c.producer_id, epoch=c.epoch)
                    sink._client().fence(c.transactional_id, 60_000)
            return c
        w.prepare_commit = prepare_then_end
        return w
    sink.create_writer = writer_whose_transaction_the_broker_ends
    runner = JobRunner(g, checkpointing=CheckpointConfig(0.03, mode="aligned", timeout_s=20.0),
                       restart=FixedDelayRestart(attempts=2), owner=str(tmp_path / "ck"))
    result = runner.run()
    assert "txn" in ended, f"the broker ended a prepared transaction (prepared: {seen})"
    assert len(result.metrics.failovers) == 1 and result.attempts == 2, (result.metrics.failures, ended)
    failed = result.metrics.failovers[0]
    assert failed >= ended["label"]
    assert sink.transaction_log().get(failed).state is CheckpointState.ABORTED
    assert not [r.checkpoint_id for r in sink.transaction_log().records()
                if r.state in (CheckpointState.COMPLETED, CheckpointState.COMMITTED)
                for h in r.handles.values() for t in h.get("txns") or ()
                if (t.get("transactional_id"), t.get("producer_id"), t.get("epoch"))
                == (ended["txn"], ended["pid"], ended["epoch"])], "a decided checkpoint holds the ended transaction"
    values = [json.loads(m.value)["id"] for m in read_topic(kafka_bootstrap, topic)]
    dup = len(values) - len(set(values))
    assert (dup, sorted(expected - set(values))[:5], sorted(set(values) - expected)[:5]) == (0, [], [])
    assert not sink._client().list_transactions(sink.prefix + "-"), "a transaction of the job stayed open"
