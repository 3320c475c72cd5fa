"""The ``twophase`` command line.

``twophase log inspect LOCATION [--json] [--sink-id ID]`` shows every checkpoint of a transaction log
with its state, handles and timings. LOCATION is the log directory, or a file sink's output path
(its log is under ``_twophase/log``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from typing import Any, Optional, Sequence

from twophase.errors import TwoPhaseError
from twophase.log import TransactionLog


def _resolve_log_location(location: str) -> str:
    candidate = os.path.join(location, "_twophase", "log")
    if "://" not in location and os.path.isdir(candidate):
        return candidate
    return location


def _fmt_ts(ts: Optional[float]) -> str:
    return "" if not ts else _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def inspect_log(location: str, sink_id: Optional[str] = None) -> dict[str, Any]:
    """Everything the log at ``location`` says, as plain data."""
    location = _resolve_log_location(location)
    log = TransactionLog.open(location, sink_id or "?")
    owner = log.owner()
    if sink_id is None and owner is not None:
        log = TransactionLog.open(location, owner["sink_id"])
    checkpoints = []
    for rec in log.records():
        ts = rec.timestamps
        d = rec.to_json()
        d["records"] = sum(int(h.get("records", 0) or 0) for h in rec.handles.values())
        d["commit_ms"] = (round((ts["COMMITTED"] - ts["COMPLETED"]) * 1e3, 3)
                          if "COMMITTED" in ts and "COMPLETED" in ts else None)
        checkpoints.append(d)
    return {"location": log.location, "owner": owner, "checkpoints": checkpoints}


def _print_table(info: dict[str, Any], out: Any) -> None:
    owner = info["owner"] or {}
    out.write(f"log {info['location']}  sink {owner.get('sink_id', '?')}  owner {owner.get('owner', '?')}\n")
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="twophase", description="twophase: exactly-once sinks for Spark")
    sub = parser.add_subparsers(dest="command", required=True)
    log_p = sub.add_parser("log", help="transaction log tools")
    log_sub = log_p.add_subparsers(dest="log_command", required=True)
    insp = log_sub.add_parser("inspect", help="show every checkpoint with its state, handles and timings")
    insp.add_argument("location", help="log directory, or a twophase-file output path")
    insp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    insp.add_argument("--sink-id", help="sink id (default: the log's owner record)")
    args = parser.parse_args(argv)
    try:
        if args.command == "log" and args.log_command == "inspect":
            info = inspect_log(args.location, args.sink_id)
            if args.json:
                json.dump(info, sys.stdout, indent=2, default=str)
                sys.stdout.write("\n")
            else:
                _print_table(info, sys.stdout)
            return 0
    except TwoPhaseError as e:
        sys.stderr.write(f"twophase: {e}\n")
        return 2
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
