"""Fast tests (no broker): nothing the Kafka sink's driver needs lives on the driver host's disk.

The timeout alarm (sinks/kafka.py invariant 7) is an object of the sink's transaction log store, and the
prefix registry (invariant 5) follows the log. A "driver on another host" is a sink built with another
HOME, TWOPHASE_STATE_DIR and working directory; the shared log is a directory both see (the S3 versions
of these tests are in integration/kafka/test_kafka_driver_state.py).
"""

from __future__ import annotations

import json
import os
import pickle
import time

import pyarrow as pa
import pytest

from twophase.sinks.kafka import ALARM_OBJECT, ALARM_STORE, KafkaCommittable, KafkaSink, KafkaSinkOptions
from twophase.errors import ConcurrentWriterError, ConfigurationError
from twophase.log import decode_record
from twophase.states import CheckpointState

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])


def _host(monkeypatch, tmp_path, name: str) -> str:
    """Make this process look like the driver on host ``name``: its own HOME, state dir and cwd."""
    root = tmp_path / name
    for d in ("home", "state", "cwd"):
        (root / d).mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.setenv("TWOPHASE_STATE_DIR", str(root / "state"))
    monkeypatch.chdir(root / "cwd")
    return str(root)


def _files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def _raw(tmp_path, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "out", "transactionalIdPrefix": "p-alarm",
            "checkpointLocation": str(tmp_path / "shared" / "ck"), "kafka.transaction.timeout.ms": "60000", **extra}


def _slow_handle(sink: KafkaSink, age_s: float, checkpoint_id: int = 0) -> KafkaCommittable:
    return KafkaCommittable(checkpoint_id=checkpoint_id, task_id="0", attempt_uid="a",
                            transactional_id=sink.transactional_id("0", checkpoint_id, 0),
                            began_at=time.time() - age_s, timeout_ms=sink.options.transaction_timeout_ms)


def test_kafka_sink_inv7_timeout_alarm_lives_in_the_log_store(tmp_path, monkeypatch):
    """Host A's commit of a handle older than half the timeout raises the alarm in the (shared) log; a
    driver restarted on host B still refuses the next batch, naming the object; a raised timeout clears it."""
    host_a = _host(monkeypatch, tmp_path, "host-a")
    a = KafkaSink.from_options(_raw(tmp_path), SCHEMA)
    a.create_committer()._check_age(_slow_handle(a, 40))
    alarm_file = os.path.join(a.log_location(), ALARM_STORE, ALARM_OBJECT)
    assert os.path.exists(alarm_file)
    assert _files(host_a) == []  # nothing on host A's own disk
    a.create_committer()._check_age(_slow_handle(a, 35))  # a younger handle never lowers the alarm
    assert decode_record(open(alarm_file, "rb").read(), alarm_file)["age_ms"] >= 40_000

    host_b = _host(monkeypatch, tmp_path, "host-b")
    b = KafkaSink.from_options(_raw(tmp_path), SCHEMA)
    assert b.log_location() == a.log_location() and b.sink_id == a.sink_id
    with pytest.raises(ConfigurationError, match="kafka.transaction.timeout.ms") as e:
        b._check_age_alarm()
    assert alarm_file in str(e.value) and f"rm {alarm_file}" in str(e.value), str(e.value)
    # below the threshold (the timeout raised to 15 min) it clears, by compare-and-swap, for good
    KafkaSink.from_options(_raw(tmp_path, **{"kafka.transaction.timeout.ms": "900000"}), SCHEMA)._check_age_alarm()
    assert decode_record(open(alarm_file, "rb").read(), alarm_file)["cleared"] is True
    b._check_age_alarm()
    assert _files(host_b) == []
    # a later slow batch raises it again over the cleared record
    b.create_committer()._check_age(_slow_handle(b, 45, checkpoint_id=3))
    with pytest.raises(ConfigurationError, match="checkpoint 3 kept"):
        b._check_age_alarm()
    # deleting the object, as the error says, clears it too
    os.remove(alarm_file)
    b._check_age_alarm()


def test_kafka_sink_inv7_timeout_alarm_raised_while_the_coordinator_holds_the_log_lock(tmp_path, monkeypatch):
    """Commits run under the log's lock (another store object, another flock fd): raising the alarm there
    must not wait for that lock (it deadlocked when the alarm was an object of the log's own store)."""
    import threading
    _host(monkeypatch, tmp_path, "host-a")
    sink = KafkaSink.from_options(_raw(tmp_path), SCHEMA)
    done = threading.Event()

    def commit_under_the_lock():
        with sink.transaction_log().locked():
            sink.create_committer()._check_age(_slow_handle(sink, 40))
        done.set()

    threading.Thread(target=commit_under_the_lock, daemon=True).start()
    assert done.wait(20), "raising the alarm under the log's lock deadlocked"
    with pytest.raises(ConfigurationError, match="kafka.transaction.timeout.ms"):
        sink._check_age_alarm()


def test_kafka_sink_inv7_timeout_alarm_deferred_while_a_completed_checkpoint_awaits_recovery(tmp_path, monkeypatch):
    _host(monkeypatch, tmp_path, "host-a")
    sink = KafkaSink.from_options(_raw(tmp_path), SCHEMA)
    sink.create_committer()._check_age(_slow_handle(sink, 40))
    log = sink.transaction_log()
    log.transition(5, CheckpointState.PENDING)
    log.transition(5, CheckpointState.COMPLETED)
    _host(monkeypatch, tmp_path, "host-b")
    KafkaSink.from_options(_raw(tmp_path), SCHEMA)._check_age_alarm()  # recovery comes first
    log.transition(5, CheckpointState.COMMITTED)
    with pytest.raises(ConfigurationError, match="kafka.transaction.timeout.ms"):
        KafkaSink.from_options(_raw(tmp_path), SCHEMA)._check_age_alarm()


def test_kafka_sink_inv7_clearing_never_drops_an_alarm_raised_meanwhile(tmp_path, monkeypatch):
    """The next batch's check clears by compare-and-swap: an alarm a commit raised between the check's
    read and its write stays up."""
    from twophase.log import LocalLogStore
    _host(monkeypatch, tmp_path, "host-a")
    old = KafkaSink.from_options(_raw(tmp_path), SCHEMA)
    old.create_committer()._check_age(_slow_handle(old, 40, checkpoint_id=1))  # over half of 1 min
    raised = KafkaSink.from_options(_raw(tmp_path, **{"kafka.transaction.timeout.ms": "900000"}), SCHEMA)
    real, fired = LocalLogStore.get_versioned, []

    def read_then_a_commit_raises_the_alarm(store, name):
        got = real(store, name)
        if name == ALARM_OBJECT and not fired:
            fired.append(1)
            raised.create_committer()._check_age(_slow_handle(raised, 460, checkpoint_id=2))  # over half of 15 min
        return got

    monkeypatch.setattr(LocalLogStore, "get_versioned", read_then_a_commit_raises_the_alarm)
    raised._check_age_alarm()  # read checkpoint 1's alarm (under 15 min / 2): tries to clear it, loses
    monkeypatch.undo()
    _host(monkeypatch, tmp_path, "host-a")
    with pytest.raises(ConfigurationError, match="checkpoint 2 kept"):
        raised._check_age_alarm()


def test_kafka_sink_inv7_timeout_alarm_left_on_local_disk_by_an_earlier_version_moves_to_the_log(tmp_path,
                                                                                                  monkeypatch):
    _host(monkeypatch, tmp_path, "host-a")
    sink = KafkaSink.from_options(_raw(tmp_path), SCHEMA)
    legacy = sink._legacy_alarm_path()
    assert legacy is not None and legacy.startswith(str(tmp_path / "host-a" / "state"))
    os.makedirs(os.path.dirname(legacy))
    with open(legacy, "w") as f:
        json.dump({"checkpoint_id": 9, "age_ms": 40_000, "transaction_timeout_ms": 60_000, "at": time.time()}, f)
    with pytest.raises(ConfigurationError, match="checkpoint 9 kept"):
        sink._check_age_alarm()
    assert not os.path.exists(legacy)
    assert os.path.exists(os.path.join(sink.log_location(), ALARM_STORE, ALARM_OBJECT))


def test_kafka_sink_inv5_prefix_claim_in_a_shared_registry_follows_the_checkpoint_not_the_host(tmp_path, monkeypatch):
    shared = str(tmp_path / "shared" / "registry")
    _host(monkeypatch, tmp_path, "host-a")
    KafkaSink.from_options(_raw(tmp_path, prefixRegistry=shared), SCHEMA)._claim_prefix(str(tmp_path / "shared" / "ck"))
    _host(monkeypatch, tmp_path, "host-b")
    other = _raw(tmp_path, prefixRegistry=shared, checkpointLocation=str(tmp_path / "shared" / "ck2"))
    with pytest.raises(ConcurrentWriterError, match="transactionalIdPrefix") as e:
        KafkaSink.from_options(other, SCHEMA)._claim_prefix(other["checkpointLocation"])
    assert "owner.json" in str(e.value)
    # query A's driver restarted on host B takes its prefix back
    KafkaSink.from_options(_raw(tmp_path, prefixRegistry=shared), SCHEMA)._claim_prefix(str(tmp_path / "shared" / "ck"))


def test_kafka_sink_inv5_registry_follows_the_log_to_s3():
    base = {"kafka.bootstrap.servers": "h:9092", "topic": "t", "transactionalIdPrefix": "p"}
    on_s3 = KafkaSink.from_options({**base, "checkpointLocation": "s3://bkt/queries/q1/ck"}, SCHEMA)
    assert on_s3.log_location() == "s3://bkt/queries/q1/ck/twophase-kafka/p"
    assert on_s3._registry() == "s3://bkt/_twophase/kafka-prefixes"
    assert on_s3._registry_store().location == f"s3://bkt/_twophase/kafka-prefixes/{on_s3._cluster()}/p"
    log_s3a = KafkaSink.from_options({**base, "checkpointLocation": "/ck", "log.location": "s3a://other/logs/x"},
                                     SCHEMA)
    assert log_s3a._registry() == "s3a://other/_twophase/kafka-prefixes"
    given = KafkaSink.from_options({**base, "checkpointLocation": "s3://bkt/ck", "prefixRegistry": "s3://reg/claims"},
                                   SCHEMA)
    assert given._registry_store().location == f"s3://reg/claims/{given._cluster()}/p"
    local = KafkaSink.from_options({**base, "checkpointLocation": "/data/ck"}, SCHEMA)
    assert local._registry() == local._local_registry()


def test_kafka_sink_options_s3_validated_and_secret_never_in_repr():
    base = {"kafka.bootstrap.servers": "h:9092", "topic": "t", "checkpointLocation": "s3://bkt/ck"}
    o = KafkaSinkOptions.from_options({**base, "s3.endpoint": "http://127.0.0.1:1", "s3.accessKeyId": "AK",
                                       "s3.secretAccessKey": "SECRET-123", "s3.region": "eu-west-1"}, SCHEMA)
    assert o.s3.endpoint == "http://127.0.0.1:1" and o.s3.secret_access_key == "SECRET-123"
    assert "SECRET-123" not in repr(o)
    assert pickle.loads(pickle.dumps(KafkaSink(o))).options.s3 == o.s3
    with pytest.raises(ConfigurationError, match="s3.secretAccessKey"):
        KafkaSinkOptions.from_options({**base, "s3.accessKeyId": "AK"}, SCHEMA)
    with pytest.raises(ConfigurationError, match="prefixRegistry"):
        KafkaSinkOptions.from_options({**base, "prefixRegistry": "hdfs://nn/claims"}, SCHEMA)
    with pytest.raises(ConfigurationError, match="log.location"):
        KafkaSinkOptions.from_options({**base, "log.location": "s3://"}, SCHEMA)


def test_kafka_sink_default_id_of_an_s3_checkpoint_is_the_same_on_every_host(tmp_path, monkeypatch):
    raw = {"kafka.bootstrap.servers": "h:9092", "topic": "t", "checkpointLocation": "s3://bkt/ck"}
    _host(monkeypatch, tmp_path, "host-a")
    a = KafkaSinkOptions.from_options(raw, SCHEMA).sink_id
    _host(monkeypatch, tmp_path, "host-b")
    assert KafkaSinkOptions.from_options(raw, SCHEMA).sink_id == a
    assert KafkaSinkOptions.from_options({**raw, "checkpointLocation": "s3://bkt/ck/"}, SCHEMA).sink_id == a


def test_kafka_sink_inv7_recovery_commit_after_an_outage_warns_and_raises_no_alarm(tmp_path, monkeypatch, caplog):
    """A commit made by recovery measures the driver's outage, not the batch: a handle aged 50 s of a 60 s
    timeout committed while recovering logs ``transaction_aged_by_outage`` and the next batch is not refused
    (it was, with a ConfigurationError, before: any outage over half the timeout stopped a healthy query)."""
    _host(monkeypatch, tmp_path, "host-a")
    caplog.set_level("WARNING")
    sink = KafkaSink.from_options(_raw(tmp_path), SCHEMA)
    sink.create_committer()._check_age(_slow_handle(sink, 50), recovering=True)
    assert not os.path.exists(os.path.join(sink.log_location(), ALARM_STORE, ALARM_OBJECT))
    assert any("transaction_aged_by_outage" in r.getMessage() for r in caplog.records)
    sink._check_age_alarm()  # the next batch goes on
    sink.create_committer()._check_age(_slow_handle(sink, 50))  # the same age measured by a live batch: alarm
    assert os.path.exists(os.path.join(sink.log_location(), ALARM_STORE, ALARM_OBJECT))
