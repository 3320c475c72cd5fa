"""Batch writes into Kafka (:mod:`twophase.write_job`) against the real broker, without Spark: a run whose
driver died after its tasks pre-committed leaves open transactions that hold back every read_committed
reader; the next run of the same write takes it over, fences exactly those transactions, and writes
once. Checked with read_committed readers (a NoError from the broker proves nothing here)."""

from __future__ import annotations

from integration.kafka.broker import committed_values, create_topic, end_offsets, key_value_batch, unique
from twophase.sink import TransactionContext, run_task
from twophase.sinks.kafka import KafkaSink
from twophase.write_job import commit_write_job, plan_write_job


def _tasks(job, tag):
    return [run_task(job.spec, TransactionContext(job.spec.sink_id, job.checkpoint_id, str(i), 0,
                                                  task_attempt_id=100 * job.checkpoint_id + i),
                     [key_value_batch(f"{tag}{i}", 10)]) for i in range(2)]


def test_kafka_batch_write_rerun_takes_over_a_dead_run_and_fences_only_its_transactions(kafka_bootstrap, tmp_path,
                                                                                        registry):
    topic = create_topic(kafka_bootstrap, unique("bw"), 2)
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "log.location": str(tmp_path / "logs"),
           "prefixRegistry": registry, "transactionalIdPrefix": unique("p"), "kafka.transaction.timeout.ms": "900000"}
    sink = KafkaSink.from_options(raw)
    other = plan_write_job(sink, write_id="other")  # another write, in flight the whole time
    other_acks = _tasks(other, "other")
    dead = plan_write_job(sink, write_id="w")
    _tasks(dead, "dead")  # pre-committed; then the driver dies: its transactions stay open
    stuck = end_offsets(kafka_bootstrap, topic, "read_committed")
    assert stuck != end_offsets(kafka_bootstrap, topic, "read_uncommitted")  # the LSO is held back
    rerun = plan_write_job(sink, write_id="w")  # the user re-runs the write: takes the dead run over
    assert rerun.checkpoint_id == dead.checkpoint_id + 1
    commit_write_job(rerun, _tasks(rerun, "new"))
    commit_write_job(other, other_acks)  # the other write's transactions were never fenced
    values = committed_values(kafka_bootstrap, topic)
    assert not [v for v in values if v.startswith(b"dead")]
    assert sorted(values) == sorted([f"new{i}-{j}".encode() for i in range(2) for j in range(10)]
                                    + [f"other{i}-{j}".encode() for i in range(2) for j in range(10)])
    assert end_offsets(kafka_bootstrap, topic, "read_committed") == end_offsets(kafka_bootstrap, topic,
                                                                                "read_uncommitted")
    again = plan_write_job(sink, write_id="w")
    assert again.skip  # committed: a third run writes nothing
