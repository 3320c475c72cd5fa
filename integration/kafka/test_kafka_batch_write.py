"""Batch writes into Kafka (:mod:`twophase.write_job`) against the real broker, without Spark: a run whose
driver died after its tasks pre-committed leaves open transactions that hold back every read_committed
reader; the next run of the same write takes it over, fences exactly those transactions, and writes
once. Checked with read_committed readers (a NoError from the broker proves nothing here)."""

from __future__ import annotations

from integration.kafka.broker import committed_values, create_topic, end_offsets, key_value_batch, unique
from twophase.sink import TransactionContext, run_task
from twophase.sinks.kafka import KafkaSink
from twophase.write_job import abort_write_job, commit_write_job, plan_write_job


def _tasks(job, tag):
    return [run_task(job.spec, TransactionContext(job.spec.sink_id, job.checkpoint_id, str(i), 0,
                                                  task_attempt_id=100 * job.checkpoint_id + i),
                     [key_value_batch(f"{tag}{i}", 10)]) for i in range(2)]


def _values(tag, tasks=2):
    return [f"{tag}{i}-{j}".encode() for i in range(tasks) for j in range(10)]


def _settled(bootstrap, topic):
    """No open transaction holds read_committed readers back."""
    return end_offsets(bootstrap, topic, "read_committed") == end_offsets(bootstrap, topic, "read_uncommitted")


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


def test_kafka_batch_write_a_zombie_runs_abort_never_fences_a_later_run_in_flight(kafka_bootstrap, tmp_path, registry):
    """write_job invariant 3 on Kafka: a run's sweeps reach only runs <= its own. Run 0 of a write is taken
    over by the user's re-run (run 1) while its job is still alive (a zombie); run 1 fails; run 2 is in flight
    when the zombie's job finally fails and Spark calls its abort. That abort's sweep (ids <= run 0) must not
    fence run 2: before, ids carried the generation (run mod 2), run 2 had run 0's, and run 2's commit raised
    DataLossError. Every record of run 2 is committed once, nothing of runs 0 and 1 is visible."""
    topic = create_topic(kafka_bootstrap, unique("bwz"), 2)
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "log.location": str(tmp_path / "logs"),
           "prefixRegistry": registry, "transactionalIdPrefix": unique("p"), "kafka.transaction.timeout.ms": "900000"}
    sink = KafkaSink.from_options(raw)
    zombie = plan_write_job(sink, write_id="w")
    zombie_acks = _tasks(zombie, "zombie")  # pre-committed; its driver is slow, not dead
    run1 = plan_write_job(sink, write_id="w")  # the user re-runs: run 0 is taken over (fenced)
    abort_write_job(run1, _tasks(run1, "one"), "the Spark job failed")
    run2 = plan_write_job(sink, write_id="w")
    assert (zombie.checkpoint_id, run1.checkpoint_id, run2.checkpoint_id) == (0, 1, 2)
    acks2 = _tasks(run2, "two")  # run 2 pre-committed, its commit not yet called
    abort_write_job(zombie, zombie_acks, "the Spark job failed")  # the zombie's job ends at last
    commit_write_job(run2, acks2)
    assert sorted(committed_values(kafka_bootstrap, topic)) == sorted(_values("two"))
    assert _settled(kafka_bootstrap, topic)
    assert plan_write_job(sink, write_id="w").skip


def test_kafka_batch_write_two_pipelines_on_one_topic_with_the_same_write_id_never_fence_each_other(
        kafka_bootstrap, tmp_path, registry):
    """Two pipelines write to one topic, each with its own log.location and no transactionalIdPrefix or sink.id
    (so one streaming prefix, the topic's), with the same writeId (a run date), their runs overlapping. They are
    two writes: their transactional ids differ, neither fences the other, both are committed once (before:
    one id space, B's tasks fenced A's pre-committed transactions and A's commit raised DataLossError)."""
    topic = create_topic(kafka_bootstrap, unique("bwp"), 2)

    def pipeline(log):
        return KafkaSink.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic,
                                       "log.location": str(tmp_path / log), "prefixRegistry": registry,
                                       "kafka.transaction.timeout.ms": "900000"})

    a, b = pipeline("logs-a"), pipeline("logs-b")
    assert a.prefix == b.prefix
    job_a = plan_write_job(a, write_id="backfill-2026-11-01")
    acks_a = _tasks(job_a, "a")
    job_b = plan_write_job(b, write_id="backfill-2026-11-01")
    assert not job_b.skip
    commit_write_job(job_b, _tasks(job_b, "b"))
    commit_write_job(job_a, acks_a)
    assert job_b.spec.prefix != job_a.spec.prefix
    assert sorted(committed_values(kafka_bootstrap, topic)) == sorted(_values("a") + _values("b"))
    assert _settled(kafka_bootstrap, topic)
    assert all(plan_write_job(p, write_id="backfill-2026-11-01").skip for p in (a, b))  # re-runs write nothing
