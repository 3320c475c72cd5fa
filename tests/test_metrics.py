"""Sink metrics read from the transaction log, as Prometheus text, and through a StreamingQueryListener's hooks."""

from __future__ import annotations

import urllib.request

import pyarrow as pa

from twophase.coordinator import CheckpointCoordinator
from twophase.metrics import prometheus_text, query_listener, serve_prometheus, sink_metrics
from twophase.sink import TransactionContext, run_task
from twophase.sinks.files import FileSink


def _sink_with_batches(tmp_path, batches: int) -> FileSink:
    sink = FileSink.from_options({"path": str(tmp_path / "out")})
    sink.validate_destination()
    sink.transaction_log().claim("test")
    for cid in range(batches):
        acks = [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)),
                         [pa.RecordBatch.from_pydict({"id": list(range(10 * t, 10 * t + 5 + cid))})]) for t in range(2)]
        CheckpointCoordinator(sink).complete_batch(cid, acks, ["0", "1"])
    return sink


def test_sink_metrics_come_from_the_log(tmp_path):
    sink = _sink_with_batches(tmp_path, 3)
    m = sink_metrics(sink.root, name="orders")
    assert (m.last_checkpoint, m.last_state, m.transactions) == (2, "COMMITTED", 2)
    assert m.records == 2 * 7 and m.records_committed == 2 * (5 + 6 + 7)
    assert m.checkpoints["COMMITTED"] == 3 and m.data_loss == 0 and m.commit_ms is not None
    text = prometheus_text([m])
    assert 'twophase_records_committed{sink="orders"} 36' in text
    assert 'twophase_checkpoints{sink="orders",state="COMMITTED"} 3' in text


def test_listener_refreshes_on_progress_and_serves_prometheus(tmp_path):
    sink = _sink_with_batches(tmp_path, 1)

    class Progress:
        batchId, name = 0, "q"

    class Event:
        progress = Progress()

    listener = query_listener({"files": sink.root, "broken": str(tmp_path / "nowhere")})
    listener.onQueryProgress(Event())  # a sink whose log cannot be read is logged, never raised
    assert listener.latest["files"].records == 10 and "broken" not in listener.latest
    server = serve_prometheus(listener.prometheus)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
    assert 'twophase_records{sink="files"} 10' in body
