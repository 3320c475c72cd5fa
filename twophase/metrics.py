"""Sink metrics from the transaction log, where Spark users look: a StreamingQueryListener, and Prometheus text.

The log is the only writer of checkpoint states (:mod:`twophase.log`), so every number here is read from
it; no counters are kept in memory that a restart would lose. For one sink:

| metric | meaning |
|---|---|
| ``last_checkpoint`` / ``last_state`` | the newest checkpoint (micro-batch id) in the log and its state |
| ``commit_ms`` | COMPLETED -> COMMITTED of the newest committed checkpoint (the driver's commit phase) |
| ``transactions`` / ``records`` | transactions (handles) and records of the newest committed checkpoint |
| ``records_committed`` | records of every committed checkpoint the log still holds (``log.retain``) |
| ``checkpoints{state}`` | checkpoints per state in the retained log |
| ``recoveries`` | checkpoints that needed more than one attempt (a re-run batch, a retried commit) |
| ``data_loss`` | checkpoints an operator resolved as LOST (``twophase log resolve --accept-loss``) |

:func:`query_listener` (a PySpark ``StreamingQueryListener``) reads these after every progress event and
logs them as event ``twophase_sink_progress`` next to Spark's progress, keyed by ``batchId``. A Python
listener cannot add fields to Spark's own progress objects, so its ``latest`` holds them for dashboards and
:func:`prometheus_text` renders them in Prometheus' text format. :func:`serve_prometheus` serves them over
HTTP on request.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping, Optional

from twophase._logging import get_logger
from twophase._redact import redact_text
from twophase.states import CheckpointState

_log = get_logger(__name__)


@dataclass
class SinkMetrics:
    """What one sink's log says (see the module table)."""

    sink: str
    log: str
    last_checkpoint: Optional[int] = None
    last_state: Optional[str] = None
    commit_ms: Optional[float] = None
    transactions: int = 0
    records: int = 0
    records_committed: int = 0
    checkpoints: dict[str, int] = field(default_factory=dict)
    recoveries: int = 0
    data_loss: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sink_metrics(location: str, sink_id: Optional[str] = None, *, name: Optional[str] = None) -> SinkMetrics:
    """The metrics of the log at ``location`` (a log directory, or a file/Delta sink's output path as the CLI
    takes it)."""
    from twophase.cli import _recorded_sink_id, _resolve_log_location
    from twophase.log import TransactionLog
    where = _resolve_log_location(location, sink_id)
    log = TransactionLog.open(where, sink_id or (_recorded_sink_id(where) if "://" not in where else "?"))
    records = log.records()
    m = SinkMetrics(sink=name or sink_id or log.sink_id, log=redact_text(log.location))
    for state in CheckpointState:
        m.checkpoints[state.value] = 0
    last_committed = None
    for rec in records:
        m.checkpoints[rec.state.value] = m.checkpoints.get(rec.state.value, 0) + 1
        if rec.attempt > 1:
            m.recoveries += 1
        if rec.state.value == "LOST":
            m.data_loss += 1
        if rec.state is CheckpointState.COMMITTED:
            m.records_committed += _records(rec.handles)
            last_committed = rec
    if records:
        m.last_checkpoint, m.last_state = records[-1].checkpoint_id, records[-1].state.value
    if last_committed is not None:
        ts = last_committed.timestamps
        if "COMMITTED" in ts and "COMPLETED" in ts:
            m.commit_ms = round((ts["COMMITTED"] - ts["COMPLETED"]) * 1e3, 3)
        m.transactions = len(last_committed.handles)
        m.records = _records(last_committed.handles)
    return m


def _records(handles: Mapping[str, Any]) -> int:
    return sum(int((h or {}).get("records", 0) or 0) for h in handles.values())


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(metrics: list[SinkMetrics]) -> str:
    """``metrics`` in Prometheus' text exposition format (one ``sink`` label per sink)."""
    gauges: list[tuple[str, str, Callable[[SinkMetrics], Any]]] = [
        ("twophase_last_checkpoint", "newest checkpoint (micro-batch) id in the sink's log", lambda m: m.last_checkpoint),
        ("twophase_commit_seconds", "commit phase of the newest committed checkpoint",
         lambda m: None if m.commit_ms is None else m.commit_ms / 1e3),
        ("twophase_transactions", "transactions of the newest committed checkpoint", lambda m: m.transactions),
        ("twophase_records", "records of the newest committed checkpoint", lambda m: m.records),
        ("twophase_records_committed", "records of the committed checkpoints the log retains",
         lambda m: m.records_committed),
        ("twophase_recoveries", "retained checkpoints that needed more than one attempt", lambda m: m.recoveries),
        ("twophase_data_loss", "checkpoints resolved as LOST by an operator", lambda m: m.data_loss),
    ]
    lines = []
    for metric, help_, get in gauges:
        lines += [f"# HELP {metric} {help_}", f"# TYPE {metric} gauge"]
        for m in metrics:
            v = get(m)
            if v is not None:
                lines.append(f'{metric}{{sink="{_label(m.sink)}"}} {v}')
    lines += ["# HELP twophase_checkpoints retained checkpoints per state", "# TYPE twophase_checkpoints gauge"]
    for m in metrics:
        for state, n in sorted(m.checkpoints.items()):
            lines.append(f'twophase_checkpoints{{sink="{_label(m.sink)}",state="{state}"}} {n}')
    return "\n".join(lines) + "\n"


def query_listener(sinks: Mapping[str, str]) -> Any:
    """A PySpark ``StreamingQueryListener`` reading the logs of ``sinks`` (name -> log location or output path)
    after each progress event; add it with ``spark.streams.addListener(listener)``."""
    from pyspark.sql.streaming import StreamingQueryListener

    class _Listener(StreamingQueryListener):  # type: ignore[misc]
        def __init__(self) -> None:
            self.sinks = dict(sinks)
            self.latest: dict[str, SinkMetrics] = {}
            self._lock = threading.Lock()

        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - PySpark's names
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            self.refresh(batch_id=getattr(event.progress, "batchId", None),
                         query=str(getattr(event.progress, "name", None) or getattr(event.progress, "id", "")))

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            self.refresh()

        def refresh(self, batch_id: Optional[int] = None, query: Optional[str] = None) -> dict[str, SinkMetrics]:
            for name, location in self.sinks.items():
                try:
                    m = sink_metrics(location, name=name)
                except Exception as e:  # noqa: BLE001 - a listener must never fail the query
                    _log.warning("twophase_metrics_unavailable", sink=name, error=redact_text(str(e)))
                    continue
                with self._lock:
                    self.latest[name] = m
                _log.info("twophase_sink_progress", query=query, batch_id=batch_id, **m.to_json())
            return dict(self.latest)

        def prometheus(self) -> str:
            with self._lock:
                return prometheus_text(list(self.latest.values()))

    return _Listener()


def serve_prometheus(render: Callable[[], str], port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``render()`` at ``http://host:port/metrics`` in a daemon thread; returns the server (``.server_address``
    has the port; ``.shutdown()`` stops it)."""

    class _Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") not in ("/metrics", ""):
                self.send_error(404)
                return
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="twophase-prometheus").start()
    return server
