"""``twophase kafka abort-lingering`` run as a subprocess against a real broker (sinks/kafka_cli.py invariants).

A lingering transaction is made the way a dropped query leaves one: a writer process pre-commits its
transaction and exits without cleanup (``write_task.py``: ``os._exit``, the producer never closed), so
the transaction stays Ongoing and holds the last stable offset of its partitions. Every check reads
back with a read_committed consumer: the broker's NoError proves nothing (noida-db answers NoError to
an EndTxn it ignores), records that are visible or invisible do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from integration.kafka.broker import (committed_values, create_topic, end_offsets, key_value_batch, produce,
                                      read_topic, unique, write_in_another_process)
from twophase.coordinator import CheckpointCoordinator
from twophase.sink import TransactionContext, run_task
from twophase.sinks.kafka import KafkaSink
from twophase.sinks._kafka_txn import OPEN_STATES
from twophase.spark.datasource import prepare_sink
from twophase.states import CheckpointState

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def env(kafka_bootstrap, tmp_path, registry):
    topic = create_topic(kafka_bootstrap, unique("cli"), 2)
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "checkpointLocation": str(tmp_path / "ck"),
           "prefixRegistry": registry, "transactionalIdPrefix": unique("p")}
    return raw, topic


def _cli(raw: dict, *args: str) -> subprocess.CompletedProcess:
    """``twophase kafka abort-lingering`` for the sink of ``raw``, as an operator runs it: another process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, "-m", "twophase.cli", "kafka", "abort-lingering", "--bootstrap",
           raw["kafka.bootstrap.servers"], "--option", f"checkpointLocation={raw['checkpointLocation']}",
           "--prefix", raw["transactionalIdPrefix"], "--prefix-registry", raw["prefixRegistry"], *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)


def _open_ids(sink: KafkaSink) -> list[str]:
    return sorted(tid for tid, _pid, _state in sink._client().list_transactions(sink.prefix + "-"))


def _started_sink(raw: dict) -> KafkaSink:
    """A query's sink after its start (log and prefix claimed) and one committed checkpoint 0."""
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    a0 = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), [key_value_batch("c0", 4)])
    assert CheckpointCoordinator(sink).complete_batch(0, [a0], ["0"]) == "COMMITTED"
    return sink


def test_cli_kafka_abort_lingering_aborts_a_dropped_querys_transaction_and_the_lso_advances(env, kafka_bootstrap):
    raw, topic = env
    sink = _started_sink(raw)
    lingering = write_in_another_process(raw, 1, "0", 0, 6, "lingering")  # checkpoint 1's writer; the query died
    # a committed record after it on each partition: read_committed readers cannot reach it (the LSO is held)
    produce(kafka_bootstrap, topic, [b"after-0", b"after-1"], partitions=2)
    assert committed_values(kafka_bootstrap, topic) == sorted(f"c0-{i}".encode() for i in range(4))
    # a transaction of another sink whose prefix extends ours (p-other): never ours to abort
    other_topic = create_topic(kafka_bootstrap, unique("clio"), 1)
    from kafka import KafkaProducer
    foreign_id = f"{sink.prefix}-other-0-0-0"  # an id of prefix p-other (task 0), not of p
    foreign = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=foreign_id)
    try:
        foreign.init_transactions()
        foreign.begin_transaction()
        foreign.send(other_topic, b"foreign", partition=0)
        foreign.flush()
        tid = lingering.handle["transactional_id"]
        assert tid in _open_ids(sink)

        # invariant 4: the transaction began seconds ago: a query might be running
        r = _cli(raw)
        assert r.returncode == 2, r.stderr
        assert "--min-idle" in r.stderr and "--query-stopped" in r.stderr and "Nothing was aborted" in r.stderr
        assert tid in _open_ids(sink)

        # invariant 5: a dry run lists it and changes nothing
        r = _cli(raw, "--query-stopped", "--dry-run")
        assert r.returncode == 0, r.stderr
        rows = [line.split("\t") for line in r.stdout.splitlines() if "\t" in line]
        assert [(row[0], row[2]) for row in rows] == [(tid, "would-abort")]
        assert tid in _open_ids(sink) and committed_values(kafka_bootstrap, topic) == sorted(f"c0-{i}".encode() for i in range(4))

        r = _cli(raw, "--query-stopped", "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert [(t["transactional_id"], t["action"]) for t in report["transactions"]] == [(tid, "aborted")]
        assert report["transactions"][0]["state_after"] not in OPEN_STATES and report["ok"] is True
        # read back: the aborted records stay invisible, the LSO advanced past them to the later commits
        assert committed_values(kafka_bootstrap, topic) == sorted([*(f"c0-{i}".encode() for i in range(4)),
                                                           b"after-0", b"after-1"])
        assert end_offsets(kafka_bootstrap, topic, "read_committed") == end_offsets(kafka_bootstrap, topic)
        # invariant 2: the other prefix's transaction is still open, its record still invisible
        assert foreign_id in [t for t, _p, _s in sink._client().list_transactions(foreign_id)]
        assert read_topic(kafka_bootstrap, other_topic) == []
        foreign.commit_transaction()
        assert [r.value for r in read_topic(kafka_bootstrap, other_topic)] == [b"foreign"]
    finally:
        foreign.close(timeout=5)
    assert _open_ids(sink) == []
    # nothing left to do: a second run says so
    r = _cli(raw, "--query-stopped")
    assert r.returncode == 0 and "no open transaction" in r.stdout, r.stdout + r.stderr


def test_cli_kafka_abort_lingering_refuses_a_completed_checkpoint_whose_records_stay_committable(env, kafka_bootstrap):
    """Invariant 3: checkpoint 1 is COMPLETED (its transaction holds committed data) but the driver died
    before committing it. The command refuses, and the restarted query still commits every record."""
    raw, topic = env
    sink = _started_sink(raw)
    log = sink.transaction_log()
    ack = write_in_another_process(raw, 1, "0", 0, 6, "c1")
    log.transition(1, CheckpointState.PENDING)
    log.transition(1, CheckpointState.COMPLETED, handles={ack.task_id: ack.handle})
    stray = write_in_another_process(raw, 1, "1", 0, 3, "stray")  # an attempt no record names
    tid, stray_tid = ack.handle["transactional_id"], stray.handle["transactional_id"]

    r = _cli(raw, "--query-stopped")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "checkpoint 1 is COMPLETED" in r.stderr and "Restart the query" in r.stderr
    assert f"twophase log resolve {log.location} --sink-id {sink.sink_id} --checkpoint 1 --accept-loss" in r.stderr
    assert sorted(_open_ids(sink)) == sorted([tid, stray_tid])

    # told to go on anyway: the COMPLETED checkpoint's transaction is kept, only the stray one is aborted
    r = _cli(raw, "--query-stopped", "--allow-unfinished")
    assert r.returncode == 0, r.stdout + r.stderr
    actions = {row.split("\t")[0]: row.split("\t")[2] for row in r.stdout.splitlines() if "\t" in row}
    assert actions == {tid: "kept", stray_tid: "aborted"}
    assert _open_ids(sink) == [tid]

    # the restart's recovery commits checkpoint 1: none of its records was lost
    prepare_sink(KafkaSink.from_options(raw, SCHEMA), raw["checkpointLocation"], what="test")
    assert log.get(1).state is CheckpointState.COMMITTED
    assert committed_values(kafka_bootstrap, topic) == sorted([*(f"c0-{i}".encode() for i in range(4)),
                                                       *(f"c1-{i}".encode() for i in range(6))])


def test_cli_kafka_abort_lingering_refuses_a_prefix_claimed_by_another_query(env, kafka_bootstrap, tmp_path):
    """Invariant 1: the prefix registry says the prefix is another query's: its transactions are not touched."""
    raw, topic = env
    _started_sink(raw)
    other = {**raw, "checkpointLocation": str(tmp_path / "other-ck"), "sink.id": "other-sink"}
    lingering = write_in_another_process(raw, 1, "0", 0, 2, "l")
    # the operator points the other query's log at this query's prefix
    sink2 = KafkaSink.from_options({**other, "transactionalIdPrefix": unique("q")}, SCHEMA)
    prepare_sink(sink2, other["checkpointLocation"], what="test")
    r = _cli({**other, "transactionalIdPrefix": raw["transactionalIdPrefix"]}, "--query-stopped",
             "--sink-id", "other-sink", "--log", sink2.log_location())
    assert r.returncode == 2, r.stdout + r.stderr
    assert "is claimed by the query with checkpoint" in r.stderr and "Nothing was aborted" in r.stderr
    sink = KafkaSink.from_options(raw, SCHEMA)
    assert lingering.handle["transactional_id"] in _open_ids(sink)
