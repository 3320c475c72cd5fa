"""Nothing the Kafka sink's driver needs is on the driver host's disk (issue 9): against the real broker
and the real S3 server, with the log on S3 and a "driver on another host" played by a process with its
own HOME, TWOPHASE_STATE_DIR and working directory (integration/kafka/other_host.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from integration.kafka.broker import create_topic, read_topic, unique
from twophase.sinks.kafka import ALARM_OBJECT, ALARM_STORE, KafkaSink
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConcurrentWriterError
from twophase.log import decode_record
from twophase.sink import Ack, TransactionContext, run_task
from twophase.spark.datasource import prepare_sink

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
OTHER_HOST = os.path.join(os.path.dirname(__file__), "other_host.py")


def _host_dirs(tmp_path, name: str) -> dict[str, str]:
    root = tmp_path / name
    dirs = {d: str(root / d) for d in ("home", "state", "cwd")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    return dirs


def _local_files(dirs: dict[str, str]) -> list[str]:
    return sorted(os.path.join(d, f) for root in dirs.values() for d, _, fs in os.walk(root) for f in fs)


@pytest.fixture
def host_a(tmp_path, monkeypatch) -> dict[str, str]:
    """This test process is the driver on host A."""
    dirs = _host_dirs(tmp_path, "host-a")
    monkeypatch.setenv("HOME", dirs["home"])
    monkeypatch.setenv("TWOPHASE_STATE_DIR", dirs["state"])
    monkeypatch.chdir(dirs["cwd"])
    return dirs


def _on_other_host(tmp_path, name: str, raw: dict) -> tuple[dict, dict[str, str]]:
    """``prepare_sink`` of a sink built from ``raw`` by a driver process on host ``name``."""
    dirs = _host_dirs(tmp_path, name)
    env = {**os.environ, "HOME": dirs["home"], "TWOPHASE_STATE_DIR": dirs["state"]}
    out = subprocess.run([sys.executable, OTHER_HOST, json.dumps(raw)], capture_output=True, text=True, timeout=180,
                         env=env, cwd=dirs["cwd"])
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), dirs


@pytest.fixture
def s3env(kafka_bootstrap, s3_server):
    bucket = s3_server.new_bucket()
    topic = create_topic(kafka_bootstrap, unique("out"), 1)
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "transactionalIdPrefix": unique("p"),
           "checkpointLocation": f"s3://{bucket}/queries/a/ck", "kafka.transaction.timeout.ms": "60000",
           **s3_server.options()}
    return raw, bucket, topic


def _batch(tag: str, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": [f"k{i}".encode() for i in range(n)],
                                       "value": [f"{tag}-{i}".encode() for i in range(n)]}, schema=SCHEMA)


def test_kafka_sink_inv7_timeout_alarm_lives_in_the_log_store(s3env, s3_server, kafka_bootstrap, host_a, tmp_path):
    """A batch committed past half the timeout on host A raises the alarm in the S3 log; the driver
    restarted on host B still refuses the next batch, naming the object; with the timeout raised it clears."""
    raw, bucket, topic = s3env
    owner = raw["checkpointLocation"]
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, owner, what="test")
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), [_batch("slow", 5)])
    slow = Ack(ack.checkpoint_id, ack.task_id, ack.attempt_uid, {**ack.handle, "began_at": time.time() - 40},
               ack.records)
    assert CheckpointCoordinator(sink).complete_batch(0, [slow], ["0"]) == "COMMITTED"
    assert len(read_topic(kafka_bootstrap, topic)) == 5
    key = f"queries/a/ck/twophase-kafka/{raw['transactionalIdPrefix']}/{ALARM_STORE}/{ALARM_OBJECT}"
    alarm = decode_record(s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read(), key)
    assert alarm["checkpoint_id"] == 0 and alarm["age_ms"] >= 40_000
    assert _local_files(host_a) == []

    got, host_b = _on_other_host(tmp_path, "host-b", raw)
    assert not got["ok"] and got["error"] == "ConfigurationError", got
    assert "kafka.transaction.timeout.ms" in got["message"] and f"aws s3 rm s3://{bucket}/{key}" in got["message"], got
    # the timeout raised to 15 min (> twice the measured age): the query goes on, and the alarm is cleared
    got, _ = _on_other_host(tmp_path, "host-b", {**raw, "kafka.transaction.timeout.ms": "900000"})
    assert got["ok"], got
    got, _ = _on_other_host(tmp_path, "host-c", raw)
    assert got["ok"], got
    assert _local_files(host_b) == []


def test_kafka_sink_inv5_prefix_claim_lives_in_the_log_bucket(s3env, s3_server, host_a, tmp_path):
    """Query A (checkpoint X on S3) claims prefix P in s3://<bucket>/_twophase/kafka-prefixes; query B on
    another host is refused naming the fix; A's driver restarted on another host takes P back."""
    raw, bucket, _topic = s3env
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    key = f"_twophase/kafka-prefixes/{sink._cluster()}/{raw['transactionalIdPrefix']}/owner.json"
    claim = decode_record(s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read(), key)
    assert claim["owner"] == raw["checkpointLocation"]
    assert _local_files(host_a) == []

    other = {**raw, "checkpointLocation": f"s3://{bucket}/queries/b/ck"}
    got, _ = _on_other_host(tmp_path, "host-b", other)
    assert not got["ok"] and got["error"] == ConcurrentWriterError.__name__, got
    assert "transactionalIdPrefix" in got["message"] and f"s3://{bucket}/{key}" in got["message"], got

    got, host_c = _on_other_host(tmp_path, "host-c", raw)  # A's driver, restarted elsewhere
    assert got["ok"], got
    assert _local_files(host_c) == []
