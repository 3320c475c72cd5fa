"""``twophase kafka ...``: the Kafka connector's operator commands (read-only), added to the CLI by name
(:data:`twophase.cli.CLI_COMMANDS`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    kafka_p = sub.add_parser("kafka", help="Kafka tools (read-only)")
    kafka_sub = kafka_p.add_subparsers(dest="kafka_command", required=True)
    lt = kafka_sub.add_parser("list-transactions", help="the broker's transactions under a transactional id prefix")
    lt.add_argument("--bootstrap", required=True, help="host:port[,host:port]")
    lt.add_argument("--prefix", default="", help="transactional id prefix (a sink's transactionalIdPrefix)")
    lt.add_argument("--state", action="append", help="Ongoing (default), PrepareCommit, CompleteAbort, ...")
    lt.set_defaults(handler=list_transactions)


def list_transactions(args: argparse.Namespace) -> int:
    """Print ``transactional id, producer id, state`` of every transaction under the prefix."""
    from twophase.sinks._kafka_txn import shared_client
    rows = shared_client({"bootstrap_servers": [s.strip() for s in args.bootstrap.split(",") if s.strip()]}
                         ).list_transactions(args.prefix, tuple(args.state or ("Ongoing",)))
    if rows is None:
        sys.stderr.write("twophase: this broker cannot list transactions (Kafka < 3.0)\n")
        return 2
    for tid, pid, state in sorted(rows):
        sys.stdout.write(f"{tid}\t{pid}\t{state}\n")
    return 0
