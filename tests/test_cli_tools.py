"""``twophase log verify`` and ``twophase metrics``: read-only operator commands over a real file sink's log."""

from __future__ import annotations

import json
import os

import pyarrow as pa

from twophase.cli import main
from twophase.coordinator import CheckpointCoordinator
from twophase.sink import TransactionContext, run_task
from twophase.sinks.files import FileSink


def _sink(tmp_path, batches: int = 2) -> FileSink:
    sink = FileSink.from_options({"path": str(tmp_path / "out")})
    sink.validate_destination()
    sink.transaction_log().claim("test")
    for cid in range(batches):
        ack = run_task(sink, TransactionContext(sink.sink_id, cid, "0"), [pa.RecordBatch.from_pydict({"id": [cid]})])
        CheckpointCoordinator(sink).complete_batch(cid, [ack], ["0"])
    return sink


def test_log_verify_clean_then_finds_uncommitted_files_and_a_corrupt_record(tmp_path, capsys):
    sink = _sink(tmp_path)
    assert main(["log", "verify", sink.root]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    # a prepared attempt that never committed leaves a final-named file only if something went wrong: fake one
    stray = os.path.join(sink.root, f"part-{sink.token}-00000000000000000009-0-x-0.parquet")
    open(stray, "wb").write(b"x")
    assert main(["log", "verify", sink.root]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["uncommitted_files"] == [os.path.basename(stray)] and report["corrupt"] == []
    os.unlink(stray)
    log_dir = os.path.join(sink.root, sink.internal_rel, "log", "checkpoints")
    victim = sorted(os.listdir(log_dir))[-1]
    with open(os.path.join(log_dir, victim), "r+b") as f:
        f.seek(-3, 2)
        f.write(b"zzz")
    assert main(["log", "verify", sink.root]) == 1
    assert "fails its checksum" in json.loads(capsys.readouterr().out)["corrupt"][0]


def test_metrics_command_json_and_prometheus(tmp_path, capsys):
    sink = _sink(tmp_path, 3)
    assert main(["metrics", sink.root]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["last_checkpoint"] == 2 and m["records_committed"] == 3
    assert main(["metrics", sink.root, "--prometheus"]) == 0
    assert "twophase_records_committed{" in capsys.readouterr().out
