"""The ``twophase`` command line.

``twophase log inspect LOCATION [--json] [--sink-id ID]`` shows every checkpoint of a transaction log
with its state, handles and timings. LOCATION is the log directory, or a file or Delta sink's output
path (its logs are under ``_twophase/<token>/log``, one per sink id; ``--sink-id`` picks one when
several sinks write there).

``twophase log resolve LOCATION --checkpoint N --accept-loss [--sink-id ID] [--reason TEXT]`` is the
operator's way out of a checkpoint that can never be committed (its transactions expired or were
deleted: recovery raises DataLossError at every restart): it records the checkpoint as LOST, with the
reason, in the log. The loss is then recorded, never silent, and the query can go on.

``twophase log verify LOCATION [--sink-id ID]`` reads every record of the log and checks its checksum,
and, given a twophase-file output path, looks for what no committed checkpoint accounts for:
- staged files of checkpoints up to the newest committed one (a sweep that has not run yet);
- final files of this sink whose checkpoint is not COMMITTED in the log.

It exits 1 when it finds a problem, 0 otherwise. It only reads; the sink's own recovery removes orphans.

``twophase metrics LOCATION [--prometheus]`` prints :mod:`twophase.metrics` of a sink's log.

``twophase kafka list-transactions --bootstrap HOST:PORT [--prefix P] [--state S]`` lists the broker's
transactions under a transactional id prefix (ListTransactions); it only reads. A query aborts its own
lingering transactions when it starts; ``twophase kafka abort-lingering`` aborts those of a query that
stays stopped, and refuses whatever could lose committed data (:mod:`twophase.sinks.kafka_cli`).

``log inspect`` and ``log verify`` draw a progress line on stderr (:mod:`twophase._progress`) when stderr
is a terminal or with ``--progress``; the functions behind them take a ``progress`` callback and never
write to a stream themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import json
import os
import sys
from typing import Any, Iterator, Optional, Sequence

from twophase._progress import Progress, ProgressCallback, progress_enabled
from twophase._redact import redact_json, redact_mapping, redact_text
from twophase.errors import TwoPhaseError
from twophase.log import TransactionLog


#: "module:function" adding a connector's subcommands to the parser (each sets ``handler`` on its parsers)
CLI_COMMANDS: tuple[str, ...] = ("twophase.sinks.kafka_cli:register",)


def _resolve_log_location(location: str, sink_id: Optional[str] = None) -> str:
    """A log directory as given, or the log of the sink (``sink_id``, or the only one) under an output path."""
    from twophase.naming import INTERNAL_DIR, default_log_location
    internal = os.path.join(location, INTERNAL_DIR)
    if "://" in location or not os.path.isdir(internal):
        return location
    if sink_id is not None:
        return default_log_location(location, sink_id)
    logs = sorted(os.path.join(internal, t, "log") for t in os.listdir(internal)
                  if os.path.isdir(os.path.join(internal, t, "log")))
    if len(logs) > 1:
        raise TwoPhaseError(f"{location} holds the logs of {len(logs)} sinks; name one with --sink-id")
    return logs[0] if logs else location


def _fmt_ts(ts: Optional[float]) -> str:
    return "" if not ts else _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def inspect_log(location: str, sink_id: Optional[str] = None, *,
                progress: Optional[ProgressCallback] = None) -> dict[str, Any]:
    """Everything the log at ``location`` says, as plain data, redacted (:mod:`twophase._redact`): no
    secret is shown even if a record held one (handles and the owner / query records by field name,
    every string for embedded secrets such as ``user:password@`` in a URL). ``progress`` is called with
    ``(records read, records)`` as the walk goes (the CLI's indicator; nothing is written here)."""
    location = _resolve_log_location(location, sink_id)
    log = TransactionLog.open(location, sink_id or "?")
    owner = log.owner()
    if sink_id is None:
        log = TransactionLog.open(location, _recorded_sink_id(location) if log.store.list("checkpoints/") else "?")
    checkpoints = []
    ids = log.checkpoint_ids()
    for i, cid in enumerate(ids, 1):
        rec = log.get(cid)
        if progress is not None:
            progress(i, len(ids))
        if rec is None:  # pruned between the listing and the read
            continue
        ts = rec.timestamps
        d = rec.to_json()
        d["records"] = sum(int(h.get("records", 0) or 0) for h in rec.handles.values())
        d["commit_ms"] = (round((ts["COMMITTED"] - ts["COMPLETED"]) * 1e3, 3)
                          if "COMMITTED" in ts and "COMPLETED" in ts else None)
        # handles: fields the sink named (a secret-named one is masked); the rest is keyed by data (topics,
        # task ids), so only secrets inside its strings are masked
        checkpoints.append({**redact_json(d), "handles": redact_mapping(d.get("handles") or {})})
    query = log.query()
    return {"location": redact_text(log.location), "owner": redact_mapping(owner) if owner else owner,
            "query": redact_mapping(query) if query else query, "checkpoints": checkpoints}


def _recorded_sink_id(location: str) -> str:
    """The sink id the log at ``location`` records (its owner record, else its newest record)."""
    sink_id = TransactionLog.open(location, "?").recorded_sink_id()
    if sink_id is None:
        raise TwoPhaseError(f"no transaction log at {location}")
    return sink_id


def resolve_lost(location: str, checkpoint_id: int, reason: str, sink_id: Optional[str] = None) -> dict[str, Any]:
    """Record COMPLETED checkpoint ``checkpoint_id`` as LOST (see module docstring); returns its record."""
    from twophase.coordinator import CheckpointCoordinator
    location = _resolve_log_location(location, sink_id)
    sink_id = sink_id or _recorded_sink_id(location)
    log = TransactionLog.open(location, sink_id)
    return CheckpointCoordinator(_NoSink(sink_id), log).resolve_lost(checkpoint_id, reason).to_json()


class _NoSink:
    """Resolving a loss touches only the log, never the sink's data."""

    def __init__(self, sink_id: str) -> None:
        self.sink_id = sink_id


def verify_log(location: str, sink_id: Optional[str] = None, *,
               progress: Optional[ProgressCallback] = None) -> dict[str, Any]:
    """Checksums of every record, and (for a twophase-file output path) staged leftovers and uncommitted files.
    ``progress`` is called with ``(objects checked, objects)`` (the CLI's indicator; nothing is written here)."""
    from twophase.errors import LogCorruptError
    from twophase.log import decode_record
    where = _resolve_log_location(location, sink_id)
    log = TransactionLog.open(where, sink_id or "?")
    names = [*log.store.list("checkpoints/"), "owner.json", "query.json"]
    corrupt: list[str] = []
    for i, name in enumerate(names, 1):
        if progress is not None:
            progress(i, len(names))
        data = log.store.get(name)
        if data is None or not name.endswith(".json"):
            continue
        try:
            decode_record(data, name)
        except LogCorruptError as e:
            corrupt.append(redact_text(str(e)))
    report: dict[str, Any] = {"location": redact_text(log.location), "objects": len(names), "corrupt": corrupt,
                              "staged_leftovers": [], "uncommitted_files": []}
    if not corrupt and os.path.isdir(location) and where != location:
        report.update(_file_orphans(location, where))
    report["ok"] = not (corrupt or report["staged_leftovers"] or report["uncommitted_files"])
    return report


def _file_orphans(root: str, log_location: str) -> dict[str, list[str]]:
    """A file sink's staged leftovers and final part files no COMMITTED record lists."""
    from twophase.naming import INTERNAL_DIR
    sink_id = _recorded_sink_id(log_location)
    log = TransactionLog.open(log_location, sink_id)
    records = log.records()
    committed = {r.checkpoint_id for r in records if r.state.value == "COMMITTED"}
    top = max(committed, default=-1)
    # a Spark task's handle lists its files; the embedded runtime's task handle wraps its transactions (txns)
    listed = {f.get("final") for r in records if r.state.value == "COMMITTED"
              for h in r.handles.values() for t in [h or {}, *((h or {}).get("txns") or ())]
              for f in t.get("files", [])}
    token = os.path.basename(os.path.dirname(log_location.rstrip("/")))
    staged, uncommitted = [], []
    staging = os.path.join(root, INTERNAL_DIR, token, "staging")
    if os.path.isdir(staging):
        for ck in sorted(os.listdir(staging)):
            if ck.isdigit() and int(ck) <= top and os.listdir(os.path.join(staging, ck)):
                staged.append(os.path.join(staging, ck))
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(("_", "."))]
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), root)
            if f.startswith(f"part-{token}-") and rel not in listed:
                uncommitted.append(rel)
    return {"staged_leftovers": staged, "uncommitted_files": sorted(uncommitted)}


def _print_table(info: dict[str, Any], out: Any) -> None:
    owner = info["owner"] or {}
    query = (info.get("query") or {}).get("query_id", "-")
    out.write(f"log {info['location']}  sink {owner.get('sink_id', '?')}  owner {owner.get('owner', '?')}  query {query}\n")
    header = ("checkpoint", "state", "attempt", "handles", "records", "triggered", "completed", "committed", "commit_ms", "reason")
    rows = []
    for c in info["checkpoints"]:
        ts = c["timestamps"]
        rows.append((str(c["checkpoint_id"]), c["state"], str(c["attempt"]), str(len(c["handles"])), str(c["records"]),
                     _fmt_ts(ts.get("PENDING")), _fmt_ts(ts.get("COMPLETED")), _fmt_ts(ts.get("COMMITTED")),
                     "" if c["commit_ms"] is None else f"{c['commit_ms']:.1f}", c.get("reason") or ""))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    out.write("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip() + "\n")
    for r in rows:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() + "\n")
    if not rows:
        out.write("(no checkpoints)\n")


def _progress_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="a progress line on stderr while the log is read (default: only when stderr is a "
                             "terminal)")


@contextlib.contextmanager
def _progress(args: argparse.Namespace, label: str) -> Iterator[Optional[Progress]]:
    """The indicator the command asked for (``--progress``, or stderr is a TTY), ended when the walk ends."""
    flag = getattr(args, "progress", None)
    if not progress_enabled(flag, sys.stderr):
        yield None
        return
    # asked for explicitly: drawn from the first record; on a bare TTY only for walks that take a while
    with Progress(label, sys.stderr, delay=0.0 if flag else 0.5) as progress:
        yield progress


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="twophase", description="twophase: exactly-once sinks for Spark")
    sub = parser.add_subparsers(dest="command", required=True)
    log_p = sub.add_parser("log", help="transaction log tools")
    log_sub = log_p.add_subparsers(dest="log_command", required=True)
    insp = log_sub.add_parser("inspect", help="show every checkpoint with its state, handles and timings")
    insp.add_argument("location", help="log directory, or a twophase-file output path")
    insp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    insp.add_argument("--sink-id", help="sink id (default: the log's owner record)")
    _progress_flag(insp)
    res = log_sub.add_parser("resolve", help="record a COMPLETED checkpoint that can never commit as LOST")
    res.add_argument("location", help="log directory, or a file/Delta sink's output path")
    res.add_argument("--checkpoint", type=int, required=True, help="the checkpoint (batch) id DataLossError named")
    res.add_argument("--accept-loss", action="store_true",
                     help="required: you accept that records of this checkpoint are missing from the sink")
    res.add_argument("--reason", default="operator accepted the loss", help="recorded with the checkpoint")
    res.add_argument("--sink-id", help="sink id (default: the log's owner record)")
    ver = log_sub.add_parser("verify", help="check every record's checksum and, for a file sink, look for orphans")
    ver.add_argument("location", help="log directory, or a twophase-file output path")
    ver.add_argument("--sink-id", help="sink id (default: the log's owner record)")
    _progress_flag(ver)
    met = sub.add_parser("metrics", help="a sink's metrics from its log (see twophase.metrics)")
    met.add_argument("location", help="log directory, or a file/Delta sink's output path")
    met.add_argument("--sink-id", help="sink id (default: the log's owner record)")
    met.add_argument("--prometheus", action="store_true", help="Prometheus text instead of JSON")
    for spec in CLI_COMMANDS:  # connectors' commands, by name (the core imports no connector)
        module, _, fn = spec.partition(":")
        try:
            getattr(importlib.import_module(module), fn)(sub)
        except (ImportError, TwoPhaseError):  # its extra is not installed
            continue
    args = parser.parse_args(argv)
    try:
        if args.command == "log" and args.log_command == "verify":
            with _progress(args, "verified log objects") as progress:
                report = verify_log(args.location, args.sink_id, progress=progress)
            json.dump(report, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return 0 if report["ok"] else 1
        if args.command == "metrics":
            from twophase.metrics import prometheus_text, sink_metrics
            m = sink_metrics(args.location, args.sink_id)
            sys.stdout.write(prometheus_text([m]) if args.prometheus else json.dumps(m.to_json(), indent=2) + "\n")
            return 0
        if getattr(args, "handler", None) is not None:
            return int(args.handler(args))
        if args.command == "log" and args.log_command == "inspect":
            with _progress(args, "read checkpoint records") as progress:
                info = inspect_log(args.location, args.sink_id, progress=progress)
            if args.json:
                json.dump(info, sys.stdout, indent=2, default=str)
                sys.stdout.write("\n")
            else:
                _print_table(info, sys.stdout)
            return 0
        if args.command == "log" and args.log_command == "resolve":
            if not args.accept_loss:
                sys.stderr.write("twophase: resolve records data loss; repeat with --accept-loss if that is what you "
                                 "accept (check the sink first: DataLossError names the records)\n")
                return 2
            rec = resolve_lost(args.location, args.checkpoint, args.reason, args.sink_id)
            sys.stdout.write(f"checkpoint {rec['checkpoint_id']} recorded as {rec['state']}: {rec['reason']}\n")
            return 0
    except TwoPhaseError as e:
        sys.stderr.write(f"twophase: {redact_text(str(e))}\n")
        return 2
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
