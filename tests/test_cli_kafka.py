"""``twophase kafka abort-lingering`` without a broker: argument validation, every refusal and its message,
which ids it may touch (sinks/kafka_cli.py invariants), over a real log and prefix registry on disk and a
fake transaction client. The broker side (real aborts read back with read_committed) is in
integration/kafka/test_kafka_cli.py."""

from __future__ import annotations

import io
import json
import time
from typing import Any, Optional

import pytest

from twophase.cli import main
from twophase.errors import OperatorRefusedError
from twophase.states import CheckpointState

kafka_cli = pytest.importorskip("twophase.sinks.kafka_cli")
from twophase.sinks._kafka_txn import TxnState  # noqa: E402
from twophase.sinks.kafka import KafkaSink  # noqa: E402

PREFIX = "pfx"
HOUR = 3600.0


class FakeClient:
    """The broker's transaction coordinator as the command sees it: listing, describing, fencing."""

    def __init__(self, txns: dict[str, TxnState]) -> None:
        self.txns = dict(txns)
        self.fenced: list[str] = []
        #: tid -> what describe shows from the second call on (an id taken over meanwhile)
        self.changes: dict[str, TxnState] = {}
        #: ids whose fence the broker ignores (still open afterwards)
        self.ignore: set[str] = set()

    def list_transactions(self, prefix: str, states: Any = ("Ongoing",)) -> list[tuple[str, int, str]]:
        return [(t, s.producer_id, s.state) for t, s in self.txns.items() if t.startswith(prefix) and s.is_open]

    def describe(self, ids: Any) -> dict[str, Optional[TxnState]]:
        return {t: self.txns.get(t) for t in ids}

    def fence(self, tid: str, timeout_ms: int) -> tuple[int, int]:
        self.fenced.append(tid)
        st = self.txns[tid]
        if tid not in self.ignore:
            self.txns[tid] = TxnState("Empty", st.producer_id, st.epoch + 1)
        return st.producer_id, st.epoch + 1

    def took_over(self) -> None:
        self.txns.update(self.changes)


def _open(epoch: int = 0, age_s: float = 2 * HOUR) -> TxnState:
    return TxnState("Ongoing", 1000 + epoch, epoch, int((time.time() - age_s) * 1000), (("t", 0),))


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A stopped query's Kafka sink: its log (owner, checkpoint 0 COMMITTED, naming pfx-0-0-0) and prefix claim."""
    ck = str(tmp_path / "ck")
    raw = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "checkpointLocation": ck,
           "prefixRegistry": str(tmp_path / "registry"), "transactionalIdPrefix": PREFIX}
    sink = KafkaSink.from_options(raw)
    log = sink.transaction_log()
    log.claim(ck)
    sink._claim_prefix(ck)
    handle = {"sink": "kafka", "transactional_id": f"{PREFIX}-0-0-0", "producer_id": 1, "epoch": 0, "partitions": [],
              "records": 0, "checkpoint_id": 0, "task_id": "0", "attempt_uid": "a"}
    log.transition(0, CheckpointState.PENDING)
    log.transition(0, CheckpointState.COMPLETED, handles={"0": handle})
    log.transition(0, CheckpointState.COMMITTED)
    client = FakeClient({f"{PREFIX}-0-1-0": _open(), f"{PREFIX}-1-1-3": _open(),
                         f"{PREFIX}-other-0-0-0": _open(),   # prefix pfx-other's id: not this sink's naming
                         f"{PREFIX}x-0-0-0": _open(),         # prefix pfxx
                         f"{PREFIX}-timeout-check": _open()})  # the sink's timeout probe id, never a writer's
    monkeypatch.setattr(KafkaSink, "_client", lambda self: client)
    monkeypatch.setattr("twophase.sinks._kafka_txn.stable_offsets",
                        lambda config, parts: {tp: (10, 10) for tp in parts})
    return raw, sink, client


def _run(sink: KafkaSink, **kw: Any) -> Any:
    kw.setdefault("now", time.time() + HOUR)
    return kafka_cli.abort_lingering(sink, **kw)


def test_cli_kafka_abort_lingering_fences_only_this_sinks_naming(setup):
    raw, sink, client = setup
    report = _run(sink, query_stopped=True)
    assert client.fenced == [f"{PREFIX}-0-1-0", f"{PREFIX}-1-1-3"]  # invariant 2
    assert [(t.transactional_id, t.action, t.state_after) for t in report.transactions] == [
        (f"{PREFIX}-0-1-0", "aborted", "Empty"), (f"{PREFIX}-1-1-3", "aborted", "Empty")]
    assert report.ok


def test_cli_kafka_abort_lingering_dry_run_changes_nothing(setup):
    raw, sink, client = setup
    report = _run(sink, dry_run=True, query_stopped=True)
    assert client.fenced == [] and {t.action for t in report.transactions} == {"would-abort"}


@pytest.mark.parametrize("state", ["COMPLETED", "PENDING"])
def test_cli_kafka_abort_lingering_refuses_an_unfinished_checkpoint(setup, state):
    raw, sink, client = setup
    log = sink.transaction_log()
    handle = {"sink": "kafka", "transactional_id": f"{PREFIX}-0-1-0", "producer_id": 1000, "epoch": 0}
    log.transition(1, CheckpointState.PENDING, handles={} if state == "COMPLETED" else {"0": handle})
    if state == "COMPLETED":
        log.transition(1, CheckpointState.COMPLETED, handles={"0": handle})
    with pytest.raises(OperatorRefusedError) as e:
        _run(sink, query_stopped=True)
    msg = str(e.value)
    assert f"checkpoint 1 is {state}" in msg and "restart the query" in msg.lower() and "Nothing was aborted" in msg
    if state == "COMPLETED":  # what to run instead, runnable as printed
        assert "would lose it" in msg
        assert f"twophase log resolve {log.location} --sink-id {sink.sink_id} --checkpoint 1 --accept-loss" in msg
    assert client.fenced == []
    # --allow-unfinished: the rest goes, the ids the unfinished record names stay
    report = _run(sink, query_stopped=True, allow_unfinished=True)
    assert client.fenced == [f"{PREFIX}-1-1-3"]
    kept = [t for t in report.transactions if t.action == "kept"]
    assert [t.transactional_id for t in kept] == [f"{PREFIX}-0-1-0"] and "checkpoint 1" in kept[0].detail


def test_cli_kafka_abort_lingering_refuses_recent_activity_unless_query_stopped(setup):
    raw, sink, client = setup
    with pytest.raises(OperatorRefusedError) as e:  # the log was written just now
        kafka_cli.abort_lingering(sink)
    msg = str(e.value)
    assert "within --min-idle 300s" in msg and "--query-stopped" in msg and "checkpoint 0 COMMITTED" in msg
    # the log is quiet (an hour later), but a transaction under the prefix began 10 s before: a query may be writing
    client.txns[f"{PREFIX}-1-1-3"] = _open(age_s=10 - HOUR)
    with pytest.raises(OperatorRefusedError, match=f"transaction {PREFIX}-1-1-3 began"):
        _run(sink)
    assert client.fenced == []
    assert _run(sink, min_idle_ms=5_000).ok  # idle long enough for a shorter --min-idle
    assert client.fenced == [f"{PREFIX}-0-1-0", f"{PREFIX}-1-1-3"]


def test_cli_kafka_abort_lingering_refuses_a_prefix_it_cannot_prove(setup, tmp_path):
    raw, sink, client = setup
    # another query claimed prefix 'taken' in the registry
    other = KafkaSink.from_options({**raw, "transactionalIdPrefix": "taken", "checkpointLocation": str(tmp_path / "o")})
    other._claim_prefix(str(tmp_path / "o"))
    with pytest.raises(OperatorRefusedError, match="is claimed by the query with checkpoint"):
        _run(KafkaSink.from_options({**raw, "transactionalIdPrefix": "taken", "log.location": sink.log_location()}),
             query_stopped=True)
    # no claim and the log names no id under the prefix: nothing proves it is this sink's
    with pytest.raises(OperatorRefusedError, match=r"nothing proves .* the log's transactions use prefix\(es\) pfx"):
        _run(KafkaSink.from_options({**raw, "transactionalIdPrefix": "unclaimed", "log.location": sink.log_location()}),
             query_stopped=True)
    # no claim, but the log's handles carry the prefix: that proves it (the registry may be on another host)
    elsewhere = KafkaSink.from_options({**raw, "prefixRegistry": str(tmp_path / "empty-registry")})
    assert _run(elsewhere, query_stopped=True).ok
    assert client.fenced == [f"{PREFIX}-0-1-0", f"{PREFIX}-1-1-3"]


def test_cli_kafka_abort_lingering_refuses_a_missing_or_foreign_log(setup, tmp_path):
    raw, sink, client = setup
    with pytest.raises(OperatorRefusedError, match="no transaction log of sink"):
        _run(KafkaSink.from_options({**raw, "checkpointLocation": str(tmp_path / "nothing")}), query_stopped=True)
    with pytest.raises(OperatorRefusedError, match="belongs to sink"):
        _run(KafkaSink.from_options({**raw, "sink.id": "someone-else", "log.location": sink.log_location()}),
             query_stopped=True)
    assert client.fenced == []


def test_cli_kafka_abort_lingering_never_fences_an_id_that_changed_and_reports_an_ignored_fence(setup, monkeypatch):
    raw, sink, client = setup
    monkeypatch.setattr(kafka_cli, "VERIFY_WAIT_S", 0.2)
    real_describe = client.describe
    calls = {"n": 0}

    def describe(ids: Any) -> Any:  # between the listing and the fence, a writer re-initialised pfx-0-1-0
        calls["n"] += 1
        if calls["n"] == 2:
            client.txns[f"{PREFIX}-0-1-0"] = _open(epoch=5, age_s=0)
        return real_describe(ids)
    client.describe = describe
    client.ignore.add(f"{PREFIX}-1-1-3")  # the broker answers the fence but the transaction stays open
    report = _run(sink, query_stopped=True)
    actions = {t.transactional_id: (t.action, t.detail) for t in report.transactions}
    assert actions[f"{PREFIX}-0-1-0"][0] == "changed" and client.fenced == [f"{PREFIX}-1-1-3"]
    assert actions[f"{PREFIX}-1-1-3"][0] == "failed" and "still Ongoing" in actions[f"{PREFIX}-1-1-3"][1]
    assert not report.ok


def _cli(capsys: Any, *args: str) -> tuple[int, str, str]:
    rc = main(["kafka", "abort-lingering", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_kafka_abort_lingering_arguments(setup, capsys, tmp_path):
    raw, sink, client = setup
    rc, _, err = _cli(capsys, "--bootstrap", "h:1")
    assert rc == 2 and "needs the sink's log: --log LOCATION" in err
    rc, _, err = _cli(capsys, "--log", sink.log_location())
    assert rc == 2 and "needs the brokers: --bootstrap" in err
    rc, _, err = _cli(capsys, "--log", sink.log_location(), "--bootstrap", "h:1", "--option", "password:hunter2")
    assert rc == 2 and "expected KEY=VALUE" in err and "hunter2" not in err
    rc, _, err = _cli(capsys, "--log", sink.log_location(), "--bootstrap", "h:1", "--option",
                      'kafka.sasl.jaas.config password="hunter2"')
    # a misspelt option (no kafka-python setting; with the default librdkafka writer a librdkafka-only connection
    # name, c6d1f7e): refused, named, its secret value not shown
    assert rc == 2 and "option 'kafka.sasl.jaas.config password'" in err and "hunter2" not in err
    rc, _, err = _cli(capsys, "--log", sink.log_location(), "--bootstrap", "h:1", "--prefix", "a",
                      "--option", "transactionalIdPrefix=b")
    assert rc == 2 and "--prefix 'a' disagrees with option transactionalIdPrefix='b'" in err
    rc, _, err = _cli(capsys, "--log", sink.log_location(), "--bootstrap", "h:1", "--min-idle", "soon")
    assert rc == 2 and "--min-idle 'soon'" in err
    bad = tmp_path / "opts.json"
    bad.write_text("[1]")
    rc, _, err = _cli(capsys, "--options-file", str(bad))
    assert rc == 2 and "expected a JSON object" in err


def test_cli_kafka_abort_lingering_command_output_and_secrets(setup, capsys, tmp_path):
    raw, sink, client = setup
    opts = tmp_path / "opts.json"  # the sink's options as the query has them, a SASL password included
    opts.write_text(json.dumps({**raw, "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
                                "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule '
                                                          'required username="u" password="hunter2";'}))
    rc, out, err = _cli(capsys, "--options-file", str(opts))  # the log was written just now
    assert rc == 2 and "refusing: sink" in err and "hunter2" not in out + err
    rc, out, err = _cli(capsys, "--options-file", str(opts), "--query-stopped", "--dry-run")
    assert rc == 0 and "dry run" in out and out.count("would-abort") == 2 and client.fenced == []
    rc, out, err = _cli(capsys, "--options-file", str(opts), "--query-stopped", "--json")
    report = json.loads(out)
    assert rc == 0 and report["ok"] and [t["action"] for t in report["transactions"]] == ["aborted", "aborted"]
    assert "hunter2" not in out + err


def test_cli_kafka_abort_lingering_reads_the_sink_id_from_the_log(setup, capsys):
    """--log without --sink-id: the sink id (and so the default prefix) is the one the log records."""
    raw, sink, client = setup
    rc, out, err = _cli(capsys, "--log", sink.log_location(), "--bootstrap", "h:1", "--prefix", PREFIX,
                        "--prefix-registry", raw["prefixRegistry"], "--query-stopped", "--dry-run")
    assert rc == 0, err
    assert out.startswith(f"sink {sink.sink_id}  prefix {PREFIX}") and out.count("would-abort") == 2


def test_progress_line_only_when_asked_or_on_a_terminal(tmp_path, capsys, monkeypatch):
    from twophase._progress import Progress, progress_enabled
    clock = iter([0.0, 0.1, 0.2, 0.6, 0.65, 0.9, 1.0])
    stream = io.StringIO()
    with Progress("walked", stream, clock=lambda: next(clock)) as p:
        p(1, 4)      # t=0.1: within the delay, nothing
        p(2, 4)      # t=0.2
        p(3, 4)      # t=0.6: drawn
        p(3, 4)      # t=0.65: too soon after the last draw
        p(4, 4)      # t=0.9: the last one is always drawn
    assert stream.getvalue().count("\r") == 2 and "walked 4/4 (100%" in stream.getvalue()
    assert stream.getvalue().endswith("\n")
    assert progress_enabled(None, io.StringIO()) is False and progress_enabled(True, io.StringIO()) is True

    from twophase.log import TransactionLog
    log = TransactionLog.open(str(tmp_path / "log"), "s")
    log.claim("owner")
    for cid in range(3):
        log.transition(cid, CheckpointState.PENDING)
    for args, shown in (([], False), (["--progress"], True), (["--no-progress"], False)):
        assert main(["log", "inspect", str(tmp_path / "log"), "--json", *args]) == 0
        out = capsys.readouterr()
        assert len(json.loads(out.out)["checkpoints"]) == 3  # stdout stays clean JSON
        assert ("read checkpoint records 3/3" in out.err) is shown
        assert main(["log", "verify", str(tmp_path / "log"), *args]) == 0
        out = capsys.readouterr()
        assert json.loads(out.out)["ok"] is True and ("verified log objects" in out.err) is shown
