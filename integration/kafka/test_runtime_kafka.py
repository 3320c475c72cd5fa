"""The embedded runtime with the Kafka sink: randomized task failure, output exactly once for read_committed
readers. Uses the session's broker (integration/kafka/conftest.py: KAFKA_BOOTSTRAP_SERVERS, Docker or noida-db).
"""

from __future__ import annotations

import json
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests", "runtime"))

from rt_helpers import runner, two_source_job  # noqa: E402
from integration.kafka.broker import create_topic, read_topic, unique  # noqa: E402
from twophase.sinks.kafka import KafkaSink  # noqa: E402
from twophase.runtime import FixedDelayRestart  # noqa: E402
from twophase.sink import TransactionContext  # noqa: E402

pytestmark = pytest.mark.kafka


@pytest.fixture
def bootstrap(kafka_bootstrap):
    return kafka_bootstrap


def test_job_random_task_failure_kafka_sink_exactly_once(tmp_path, bootstrap):
    topic = create_topic(bootstrap, unique("rt-out"), partitions=2)
    rng = random.Random(3)
    fired = {"n": 0}
    k = rng.randint(500, 3000)

    def fail(v):
        if not fired["n"]:
            fired["k"] = fired.get("k", 0) + 1
            if fired["k"] >= k:
                fired["n"] += 1
                raise RuntimeError("injected failure")
        return v
    g, _, expected = two_source_job(str(tmp_path / "unused"), map_fn=fail)
    sink = KafkaSink.from_options({"kafka.bootstrap.servers": bootstrap, "topic": topic,
                                   "prefixRegistry": str(tmp_path / "registry"),
                                   "log.location": str(tmp_path / "log"),
                                   "checkpointLocation": str(tmp_path / "ck")})
    out = g.vertex("out")
    out.sink = sink
    out.to_row = lambda r: {"key": str(r["id"]), "value": json.dumps(r)}
    result = runner(g, "aligned", interval=0.05, restart=FixedDelayRestart(3, 0.0),
                    owner=str(tmp_path / "ck")).run()
    assert fired["n"] == 1 and result.attempts == 2
    values = [json.loads(m.value)["id"] for m in read_topic(bootstrap, topic)]
    assert len(values) == len(set(values)) and set(values) == expected


def _kafka_input(bootstrap: str) -> tuple[str, set]:
    """A 2-partition topic: 3000 committed, 500 aborted (never to be read), 2000 more committed records."""
    from integration.kafka.broker import produce
    topic = create_topic(bootstrap, unique("rt-in"), partitions=2)
    produce(bootstrap, topic, [str(i).encode() for i in range(3000)], transactional_id=unique("tx-in"))
    produce(bootstrap, topic, [str(10**6 + i).encode() for i in range(500)], transactional_id=unique("tx-ab"),
            commit=False)
    produce(bootstrap, topic, [str(i).encode() for i in range(3000, 5000)])
    return topic, set(range(5000))


def test_source_inv1_kafka_split_replays_identically_from_a_position(bootstrap):
    from twophase.sources.kafka import runtime_source
    topic, _ = _kafka_input(bootstrap)
    src = runtime_source({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"},
                         bounded=True)
    split = src.splits()[0]

    def drain(position):
        """Every value read from ``position`` on, and after each read (position, values read so far)."""
        r = src.open_reader(split, position)
        out, marks = [], []
        try:
            while True:
                res = r.read(300)
                out += [int(x["value"]) for x in res.records]
                marks.append((r.position(), len(out)))
                if res.finished:
                    return out, marks
        finally:
            r.close()

    first, marks = drain(None)
    assert len(first) == 2500 and not any(v >= 10**6 for v in first), "aborted records must never be read"
    assert [p for p, _ in marks] == sorted(p for p, _ in marks), "positions only move forward"
    position, consumed = next((p, n) for p, n in marks if 0 < n < len(first))
    replay, _ = drain(position)
    assert replay == first[consumed:], "a replay from a recorded position differs from the first read"


def test_runtime_kafka_source_to_file_sink_exactly_once_after_a_failure(tmp_path, bootstrap):
    from rt_helpers import read_ids
    from twophase.sinks.files import FileSink
    from twophase.sources.kafka import runtime_source
    from twophase.runtime import JobGraph
    topic, expected = _kafka_input(bootstrap)
    seen = {"n": 0, "failed": False}

    def parse(r):
        seen["n"] += 1
        if not seen["failed"] and seen["n"] == 1700:
            seen["failed"] = True
            raise RuntimeError("injected failure")
        return {"id": int(r["value"]), "partition": r["partition"], "offset": r["offset"]}

    g = JobGraph("kafka-to-files")
    s = g.source(runtime_source({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                 "startingOffsets": "earliest"}, bounded=True), uid="kafka")
    out = str(tmp_path / "out")
    s.map(parse, uid="parse").sink_to(FileSink.from_options({"path": out}), uid="files", parallelism=2)
    result = runner(g, "aligned", interval=0.05, restart=FixedDelayRestart(3, 0.0), owner=str(tmp_path / "ck")).run()
    assert seen["failed"] and result.attempts == 2
    ids = read_ids(out)
    assert len(ids) == len(set(ids)), "duplicates after the restart"
    assert set(ids) == expected, "missing records, or aborted ones read"


def _runtime_sink(bootstrap: str, tmp_path, topic: str) -> KafkaSink:
    return KafkaSink.from_options({"kafka.bootstrap.servers": bootstrap, "topic": topic,
                                   "prefixRegistry": str(tmp_path / "registry"), "log.location": str(tmp_path / "log"),
                                   "transactionalIdPrefix": unique("rt"),
                                   "checkpointLocation": str(tmp_path / "ck")})


def _write(writer, tag: str, n: int) -> None:
    import pyarrow as pa
    writer.write(pa.RecordBatch.from_pylist([{"key": f"{tag}-{i}", "value": f"{tag}-{i}"} for i in range(n)]))


def test_kafka_sink_inv4_runtime_two_checkpoints_in_flight_never_abort_a_prepared_one(tmp_path, bootstrap):
    """The runtime's sink task opens checkpoint c+1's transaction right after pre-committing c; with
    max_concurrent >= 2 (or a savepoint while c is pending) it pre-commits c+1 and opens c+2 while c
    is still pending. Opening c+2 must not abort c's prepared transaction, and the sweep after c's
    commit must not abort c+2's."""
    topic = create_topic(bootstrap, unique("rt-conc"), partitions=1)
    sink = _runtime_sink(bootstrap, tmp_path, topic)
    ctx = lambda c: TransactionContext(sink.sink_id, c, "out-0", 0, task_attempt_id=7)  # noqa: E731
    committer = sink.create_committer()  # the job committer's, over the same sink object as the writers
    t1 = sink.create_writer(ctx(1))
    _write(t1, "c1", 5)
    h1 = t1.prepare_commit()
    t2 = sink.create_writer(ctx(2))
    _write(t2, "c2", 5)
    h2 = t2.prepare_commit()
    t3 = sink.create_writer(ctx(3))  # checkpoint 1 is still pending
    _write(t3, "c3", 5)
    t3.producer.flush()
    committer.commit(h1)
    assert sorted(m.value for m in read_topic(bootstrap, topic)) == sorted(f"c1-{i}".encode() for i in range(5))
    assert len({h1.transactional_id, h2.transactional_id, t3.transactional_id}) == 3
    log = sink.transaction_log()  # as the coordinator records it, then sweeps (step 5)
    from twophase.states import CheckpointState
    log.transition(1, CheckpointState.PENDING)
    log.transition(1, CheckpointState.COMPLETED,
                   handles={"out-0": {"task": "out-0", "sink": "out", "txns": [h1.to_json()]}})
    log.transition(1, CheckpointState.COMMITTED)
    committer.abort_lingering(1, log.highest_committed())
    h3 = t3.prepare_commit()
    committer.commit(h2)
    committer.commit(h3)
    values = sorted(m.value for m in read_topic(bootstrap, topic))
    assert values == sorted(f"c{c}-{i}".encode() for c in (1, 2, 3) for i in range(5))


def test_kafka_sink_inv4_runtime_lingering_transactions_are_found_and_aborted(tmp_path, bootstrap):
    """Runtime task ids (``out-0``) are part of the transactional id: a transaction a dead job attempt
    left open is found by the sweep and aborted (it holds back read_committed readers until then)."""
    topic = create_topic(bootstrap, unique("rt-ling"), partitions=1)
    sink = _runtime_sink(bootstrap, tmp_path, topic)
    tid = sink.transactional_id("out-0", 1, 0)
    assert sink._parse_id(tid) is not None, tid
    dead = KafkaSink(sink.options)  # the sink object of a job attempt that died (another process)
    lingering = dead.create_writer(TransactionContext(sink.sink_id, 1, "out-0", 0, task_attempt_id=1))
    _write(lingering, "lingering", 5)
    lingering.producer.flush()
    lingering.txn.producer = None  # the attempt's process died: its producer is gone, never closed (close aborts)
    import gc
    gc.collect()
    assert sink._client().describe([lingering.transactional_id])[lingering.transactional_id].state == "Ongoing"
    t = sink.create_writer(TransactionContext(sink.sink_id, 1, "out-0", 1, task_attempt_id=2))
    _write(t, "ok", 5)
    h = t.prepare_commit()
    committer = sink.create_committer()
    committer.commit(h)
    log = sink.transaction_log()
    from twophase.states import CheckpointState
    log.transition(1, CheckpointState.PENDING)
    log.transition(1, CheckpointState.COMPLETED,
                   handles={"out-0": {"task": "out-0", "sink": "out", "txns": [h.to_json()]}})
    log.transition(1, CheckpointState.COMMITTED)
    assert committer.abort_lingering(1, log.highest_committed()) >= 1
    assert not sink._client().list_transactions(sink.prefix + "-"), "a lingering runtime transaction stayed open"
    assert sorted(m.value for m in read_topic(bootstrap, topic)) == sorted(f"ok-{i}".encode() for i in range(5))


def test_runtime_kafka_sink_max_concurrent_checkpoints_exactly_once(tmp_path, bootstrap):
    """A whole runtime job with two checkpoints in flight (max_concurrent=2) into Kafka: exactly once."""
    from twophase.runtime import CheckpointConfig, JobRunner
    topic = create_topic(bootstrap, unique("rt-mc"), partitions=2)
    g, _, expected = two_source_job(str(tmp_path / "unused"), n_a=3000, n_b=1000)
    out = g.vertex("out")
    out.sink = _runtime_sink(bootstrap, tmp_path, topic)
    out.to_row = lambda r: {"key": str(r["id"]), "value": json.dumps(r)}
    JobRunner(g, checkpointing=CheckpointConfig(0.02, mode="aligned", max_concurrent=2, timeout_s=20.0),
              owner=str(tmp_path / "ck")).run()
    values = [json.loads(m.value)["id"] for m in read_topic(bootstrap, topic)]
    assert len(values) == len(set(values)) and set(values) == expected
