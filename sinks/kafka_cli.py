"""``twophase kafka ...``: the Kafka connector's operator commands, added to the CLI by name
(:data:`twophase.cli.CLI_COMMANDS`).

``list-transactions`` only reads. ``abort-lingering`` aborts (fences) a Kafka sink's lingering
transactions: open transactions of a query that is gone (dropped for good, or stopped and not restarted
yet), which hold back every read_committed consumer at the last stable offset until the broker expires
them after ``kafka.transaction.timeout.ms`` (1 hour by default; never, on some test brokers). A running
query aborts its own lingering transactions when it starts (:meth:`KafkaCommitter.abort_lingering`), so
the command is for a query that will not start again soon.

Fencing a transactional id aborts whatever transaction it has open. If that transaction belongs to a
checkpoint the log records as COMPLETED but not yet COMMITTED, its records are committed data that the
query's recovery still has to commit: aborting it LOSES them. So :func:`abort_lingering` acts only on
what it can prove is safe, and refuses (:class:`~twophase.errors.OperatorRefusedError`, nothing changed)
otherwise. Invariants (``test_cli_kafka_abort_lingering_*``):

1. Ownership, proven as the sink proves it: the sink's log exists and is this sink id's (its owner
   record, and with option ``checkpointLocation`` the same query); the transactional id prefix is this
   sink's: the prefix registry's claim (invariant 5 of :mod:`twophase.sinks.kafka`) names the log's
   owner, else, without a claim, the log's own handles carry ids under the prefix. A claim by another
   query is always refused.
2. Only ids of the sink's naming are touched: ``<prefix>-<task>-<0|1>-<slot>``
   (:meth:`KafkaSink._parse_id`), never another prefix's (a task never contains ``-``, so ids of ``p-x``
   never parse as ids of ``p``), never ``<prefix>-timeout-check``.
3. No checkpoint decision is undone: while the log has an unfinished (PENDING / COMPLETED) checkpoint the
   command refuses and names what to run instead (restart the query: its recovery commits COMPLETED and
   aborts PENDING checkpoints; or ``twophase log resolve`` for one that can never commit). With
   ``--allow-unfinished`` it goes on, but never touches an id an unfinished record names.
4. No race with a running query: it refuses when the log was written, or an open transaction under the
   prefix began, within ``--min-idle`` (default 5 minutes), unless ``--query-stopped`` states that no
   query of the sink runs. It holds the log's lock while it fences (a coordinator on this host cannot
   record a decision meanwhile), reads the log again right before fencing, and fences an id only if the
   broker still shows the very transaction (producer id, epoch) it listed.
5. Every abort is checked, not trusted (a broker may answer NoError to anything): afterwards the id must
   no longer have an open transaction (DescribeTransactions), and the last stable offset of each
   partition it wrote is reported before and after. ``--dry-run`` lists what would be aborted and
   changes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from twophase._logging import get_logger
from twophase._redact import redact_text
from twophase.errors import ConfigurationError, OperatorRefusedError
from twophase.options import parse_duration_ms

_log = get_logger(__name__)

#: default of ``--min-idle``: how long the log and the prefix's transactions must have been quiet
DEFAULT_MIN_IDLE_MS = 5 * 60_000
#: the transaction timeout sent with InitProducerId when fencing: the id is left Empty, so it matters only
#: until the sink initialises the id again with its own (every broker accepts one minute)
FENCE_TIMEOUT_MS = 60_000
#: how long an id may stay PrepareAbort after its fence before the abort counts as failed
VERIFY_WAIT_S = 10.0
#: a schema stub with a 'topic' column: the command writes nothing, so the sink's option 'topic' is optional
_ANY_TOPIC = types.SimpleNamespace(names=["topic", "value"])
#: the sink id used to open a log whose sink id is read from the log itself
_PROBE_ID = "twophase-operator-probe"


def register(sub: Any) -> None:
    kafka_p = sub.add_parser("kafka", help="Kafka tools")
    kafka_sub = kafka_p.add_subparsers(dest="kafka_command", required=True)
    lt = kafka_sub.add_parser("list-transactions", help="the broker's transactions under a transactional id prefix")
    lt.add_argument("--bootstrap", required=True, help="host:port[,host:port]")
    lt.add_argument("--prefix", default="", help="transactional id prefix (a sink's transactionalIdPrefix)")
    lt.add_argument("--state", action="append", help="Ongoing (default), PrepareCommit, CompleteAbort, ...")
    lt.set_defaults(handler=list_transactions)
    al = kafka_sub.add_parser(
        "abort-lingering", help="abort a stopped Kafka sink's lingering transactions (refuses what could lose data)",
        description="Abort the open transactions a Kafka sink left behind (a query dropped or stopped for good), "
                    "which hold back read_committed consumers. Give the sink's log (--log, or the query's "
                    "checkpointLocation with --option) and the brokers. Refuses while the log has an "
                    "unfinished checkpoint, or the log or the prefix's transactions were active within "
                    "--min-idle (unless --query-stopped). Try --dry-run first.")
    al.add_argument("--log", help="the sink's transaction log location (its option log.location; default with "
                                  "--option checkpointLocation=CK: CK/twophase-kafka/<prefix>)")
    al.add_argument("--sink-id", help="the sink's sink.id (default: derived from checkpointLocation, else the log's "
                                      "owner record)")
    al.add_argument("--bootstrap", help="host:port[,host:port] (the sink's kafka.bootstrap.servers)")
    al.add_argument("--prefix", help="the sink's transactionalIdPrefix (default: the sink id, as the sink)")
    al.add_argument("--prefix-registry", help="the sink's option prefixRegistry, where the query claimed the prefix")
    al.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="one of the sink's writeStream options (checkpointLocation, kafka.security.protocol, "
                         "s3.endpoint, ...); repeatable. Put secrets in --options-file, not on the command line")
    al.add_argument("--options-file", help="a JSON object of the sink's writeStream options")
    al.add_argument("--dry-run", action="store_true", help="list what would be aborted; change nothing")
    al.add_argument("--query-stopped", action="store_true",
                    help="state that no query of this sink runs: skip the --min-idle check")
    al.add_argument("--min-idle", default="5 minutes",
                    help="refuse when the log or a transaction under the prefix was active within this "
                         "(default: 5 minutes)")
    al.add_argument("--allow-unfinished", action="store_true",
                    help="go on although the log has a PENDING / COMPLETED checkpoint; the transactions its "
                         "record names are kept (never aborted)")
    al.add_argument("--json", action="store_true", help="print the report as JSON")
    al.set_defaults(handler=abort_lingering_command)


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


# --------------------------------------------------------------------------- the sink from the arguments


def sink_options(args: argparse.Namespace) -> dict[str, str]:
    """The sink's options from ``--options-file``, ``--option`` and the dedicated flags (a flag and an
    option that disagree are an error naming both)."""
    raw: dict[str, str] = {}
    if args.options_file:
        try:
            with open(args.options_file) as f:
                loaded = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigurationError(f"--options-file {args.options_file}: cannot read a JSON object: {e}") from e
        if not isinstance(loaded, dict):
            raise ConfigurationError(f"--options-file {args.options_file}: expected a JSON object of options")
        raw.update({str(k): str(v) for k, v in loaded.items()})
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--option {redact_text(item)!r}: expected KEY=VALUE, e.g. "
                                     "--option checkpointLocation=/data/ck")
        raw[key.strip()] = value
    lower = {k.lower(): k for k in raw}
    for flag, key in (("log", "log.location"), ("sink_id", "sink.id"), ("bootstrap", "kafka.bootstrap.servers"),
                      ("prefix", "transactionalIdPrefix"), ("prefix_registry", "prefixRegistry")):
        value = getattr(args, flag)
        if value is None:
            continue
        given = lower.get(key.lower())
        if given is not None and raw[given] != value:
            raise ConfigurationError(f"--{flag.replace('_', '-')} {value!r} disagrees with option {given}="
                                     f"{raw[given]!r}; give one of them")
        raw[given or key] = value
    return raw


def sink_from_options(raw: Mapping[str, str]) -> Any:
    """The :class:`~twophase.sinks.kafka.KafkaSink` the options describe, for its naming, log and clients
    (it writes nothing). Without ``sink.id`` or ``checkpointLocation`` the sink id is the one the log at
    ``log.location`` records."""
    from twophase.sinks.kafka import KafkaSink, KafkaSinkOptions
    keys = {k.lower() for k in raw}
    if "log.location" not in keys and "checkpointlocation" not in keys:
        raise ConfigurationError("twophase kafka abort-lingering needs the sink's log: --log LOCATION (the sink's "
                                 "log.location) or --option checkpointLocation=CK (the query's checkpoint)")
    if "kafka.bootstrap.servers" not in keys:
        raise ConfigurationError("twophase kafka abort-lingering needs the brokers: --bootstrap HOST:PORT (the "
                                 "sink's kafka.bootstrap.servers)")
    if "sink.id" in keys or "checkpointlocation" in keys:
        return KafkaSink(KafkaSinkOptions.from_options(raw, _ANY_TOPIC))
    probe = KafkaSinkOptions.from_options({**raw, "sink.id": _PROBE_ID}, _ANY_TOPIC)
    recorded = _recorded_sink_id(KafkaSink(probe))
    given_prefix = next((v for k, v in raw.items() if k.lower() == "transactionalidprefix"), None)
    return KafkaSink(dataclasses.replace(probe, sink_id=recorded, transactional_id_prefix=given_prefix or recorded))


def _recorded_sink_id(sink: Any) -> str:
    """The sink id the log records: its owner record, else its newest checkpoint record."""
    log = sink.transaction_log()
    sink_id = log.recorded_sink_id()
    if sink_id is not None:
        return sink_id
    raise OperatorRefusedError(f"no transaction log at {redact_text(log.location)}: give the sink's log "
                               "(--log, its option log.location, or --option checkpointLocation=...) and --sink-id")


# --------------------------------------------------------------------------- the command


@dataclass
class LingeringTransaction:
    """One open transaction under the prefix, and what the command did with it."""

    transactional_id: str
    state: str
    producer_id: int
    epoch: int
    #: when it began (ms since the epoch; -1 unknown)
    start_ms: int = -1
    partitions: list[tuple[str, int]] = field(default_factory=list)
    #: would-abort (dry run), aborted, kept, changed, failed
    action: str = ""
    detail: str = ""
    #: DescribeTransactions after the abort (None: unknown to the coordinator)
    state_after: Optional[str] = None
    #: "topic-partition" -> [last stable offset, high watermark], before and after
    offsets_before: dict[str, list[int]] = field(default_factory=dict)
    offsets_after: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class AbortReport:
    """What :func:`abort_lingering` found and did."""

    sink_id: str
    prefix: str
    log_location: str
    dry_run: bool
    transactions: list[LingeringTransaction] = field(default_factory=list)
    #: partitions whose read_committed end (LSO) is still below the high watermark afterwards
    still_held: dict[str, list[int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every transaction meant to be aborted was aborted and is verified no longer open."""
        return all(t.action in ("aborted", "would-abort", "kept") for t in self.transactions)

    def to_json(self) -> dict[str, Any]:
        return {"sink_id": self.sink_id, "prefix": self.prefix, "log": self.log_location, "dry_run": self.dry_run,
                "ok": self.ok, "transactions": [t.to_json() for t in self.transactions],
                "still_held": self.still_held}


def _handle_ids(handles: Mapping[str, Any]) -> set[str]:
    """Transactional ids a record's handles name (a Kafka handle, or a runtime envelope's ``txns``)."""
    out = set()
    for h in handles.values():
        for inner in [h, *((h or {}).get("txns") or ())]:
            tid = (inner or {}).get("transactional_id")
            if tid:
                out.add(str(tid))
    return out


def _unfinished_refusal(unfinished: Sequence[Any], sink: Any, location: str) -> OperatorRefusedError:
    lines = []
    for rec in unfinished:
        if rec.state.value == "COMPLETED":
            lines.append(f"checkpoint {rec.checkpoint_id} is COMPLETED but not committed: its transactions hold "
                         "committed data that only the query's recovery commits (aborting them would lose it). "
                         "Restart the query to commit it; if it can never commit (DataLossError), record the loss "
                         f"with: twophase log resolve {location} --sink-id {sink.sink_id} --checkpoint "
                         f"{rec.checkpoint_id} --accept-loss")
        else:
            lines.append(f"checkpoint {rec.checkpoint_id} is {rec.state.value}: a running query is deciding it, or "
                         "a stopped one left it; restart the query (its recovery aborts it), or wait for it")
    return OperatorRefusedError(
        f"refusing to abort transactions of sink {sink.sink_id!r}: its log {location} has "
        f"{len(unfinished)} unfinished checkpoint(s): " + "; ".join(lines) +
        ". Nothing was aborted. (--allow-unfinished goes on and keeps every transaction those records name.)")


def _prefix_evidence(sink: Any, log_owner: Optional[Mapping[str, Any]], logged_ids: set[str]) -> str:
    """Invariant 1: why the prefix is this sink's, or OperatorRefusedError."""
    from twophase.log import TransactionLog
    from twophase.sinks.kafka import owner_key
    store = sink._registry_store()
    claim = TransactionLog(store, f"kafka-prefix:{sink.prefix}").owner()
    logged_prefixes = sorted({tid.rsplit("-", 3)[0] for tid in logged_ids if tid.count("-") >= 3})
    under = sorted(t for t in logged_ids if sink._parse_id(t) is not None)
    if claim is not None:
        claimed = str(claim.get("owner"))
        mine = str((log_owner or {}).get("owner") or sink.options.owner or "")
        accepted = {mine, redact_text(mine)} | ({owner_key(mine)} if mine else set())
        if not mine or claimed not in accepted:
            raise OperatorRefusedError(
                f"refusing: transactional prefix {sink.prefix!r} is claimed by the query with checkpoint "
                f"{redact_text(claimed)!r} (prefix registry {redact_text(store.location)}), not by this sink's "
                f"query ({redact_text(mine) or 'unknown: its log has no owner record'!r}); its transactions are "
                "that query's. Nothing was aborted. Check --prefix (the sink's transactionalIdPrefix)")
        return f"claimed by this sink's query in {redact_text(store.location)}"
    if under:
        return f"the log names {len(under)} transactional id(s) under it"
    seen = f"; the log's transactions use prefix(es) {', '.join(logged_prefixes)}" if logged_prefixes else ""
    raise OperatorRefusedError(
        f"refusing: nothing proves that transactional prefix {sink.prefix!r} is sink {sink.sink_id!r}'s: no claim "
        f"in the prefix registry {redact_text(store.location)} and no transaction under it in the log{seen}. "
        "Nothing was aborted. Give --prefix-registry (the query's option prefixRegistry) or the right --prefix")


def _last_activity(log: Any, records: Sequence[Any]) -> tuple[float, str]:
    """The newest time the log was written, and what was written then."""
    best, what = 0.0, "nothing"
    for rec in records:
        for state, ts in (rec.timestamps or {}).items():
            if ts and float(ts) > best:
                best, what = float(ts), f"checkpoint {rec.checkpoint_id} {state}"
    for name, key in (("owner", "claimed_at"), ("query", "bound_at")):
        with contextlib.suppress(Exception):
            body = getattr(log, name)() or {}
            if float(body.get(key) or 0) > best:
                best, what = float(body[key]), f"{name} record"
    return best, what


def _tp(t: str, p: int) -> str:
    return f"{t}-{p}"


def abort_lingering(sink: Any, *, dry_run: bool = False, query_stopped: bool = False,
                    min_idle_ms: int = DEFAULT_MIN_IDLE_MS, allow_unfinished: bool = False,
                    now: Optional[float] = None) -> AbortReport:
    """Abort the open transactions under ``sink``'s prefix that nothing may still commit (module invariants).

    Raises :class:`OperatorRefusedError` (nothing changed) when it cannot prove that safe."""
    from twophase.sinks._kafka_txn import stable_offsets
    log = sink.transaction_log()
    location = redact_text(log.location)
    report = AbortReport(sink.sink_id, sink.prefix, location, dry_run)
    lock = contextlib.nullcontext() if dry_run else log.locked()
    with lock:
        owner = log.owner()
        ids = log.checkpoint_ids()
        if owner is None and not ids:
            raise OperatorRefusedError(
                f"refusing: no transaction log of sink {sink.sink_id!r} at {location}; give the sink's log (--log, "
                "its option log.location, or --option checkpointLocation=...) and its --sink-id")
        if owner is not None and owner.get("sink_id") != sink.sink_id:
            raise OperatorRefusedError(f"refusing: the log at {location} belongs to sink {owner.get('sink_id')!r}, "
                                       f"not {sink.sink_id!r}; check --sink-id")
        if owner is not None and sink.options.owner:
            from twophase.sinks.kafka import owner_key
            mine = owner_key(sink.options.owner)
            if str(owner.get("owner")) not in (mine, redact_text(mine), sink.options.owner):
                raise OperatorRefusedError(
                    f"refusing: the log at {location} is owned by the query with checkpoint "
                    f"{redact_text(str(owner.get('owner')))!r}, not {redact_text(mine)!r}")
        records = log.records()
        unfinished = [r for r in records if not r.state.is_final]
        if unfinished and not allow_unfinished:
            raise _unfinished_refusal(unfinished, sink, location)
        protected: dict[str, int] = {}
        for rec in unfinished:
            for tid in _handle_ids(rec.handles):
                protected[tid] = rec.checkpoint_id
        logged_ids = set().union(*(_handle_ids(r.handles) for r in records)) if records else set()
        evidence = _prefix_evidence(sink, owner, logged_ids)
        now = time.time() if now is None else now
        last, what = _last_activity(log, records)

        client = sink._client()
        listed = client.list_transactions(sink.prefix + "-")
        if listed is not None:
            candidates = sorted({tid for tid, _pid, _state in listed if sink._parse_id(tid) is not None})
        else:  # Kafka < 3.0: every id the sink may have used
            candidates = sink.create_committer()._known_id_space()
        states = client.describe(candidates) if candidates else {}
        if states is None:
            raise OperatorRefusedError("refusing: this broker cannot describe transactions (Kafka < 3.0), so "
                                       "nothing shows which of the sink's ids are open; restart the query instead "
                                       "(its recovery fences them)")
        open_txns = [LingeringTransaction(tid, st.state, st.producer_id, st.epoch, st.start_ms, list(st.partitions))
                     for tid, st in sorted(states.items()) if st is not None and st.is_open]
        if not query_stopped:
            newest_txn = max(open_txns, key=lambda t: t.start_ms, default=None)
            if newest_txn is not None and newest_txn.start_ms / 1000 > last:
                last, what = newest_txn.start_ms / 1000, f"transaction {newest_txn.transactional_id} began"
            idle_s = now - last
            if idle_s * 1000 < min_idle_ms:
                raise OperatorRefusedError(
                    f"refusing: sink {sink.sink_id!r} was active {max(idle_s, 0):.0f}s ago ({what}), within "
                    f"--min-idle {min_idle_ms / 1000:.0f}s: its query may still be running, and aborting a "
                    "transaction it is about to commit loses that data. Stop the query and rerun with "
                    "--query-stopped, or wait until it has been idle for --min-idle. Nothing was aborted")
        _log.info("abort_lingering_plan", sink_id=sink.sink_id, prefix=sink.prefix, evidence=evidence,
                  open=len(open_txns), protected=len(protected), dry_run=dry_run)
        report.transactions = open_txns
        partitions = sorted({tp for t in open_txns for tp in t.partitions})
        before = stable_offsets(sink.options.connection_config(), partitions) if partitions else {}
        for t in open_txns:
            t.offsets_before = {_tp(*tp): list(before[tp]) for tp in t.partitions if tp in before}
        if not dry_run and open_txns:
            # invariant 4: the log again, right before fencing (another host's driver may have written)
            log.highest_committed(fresh=True)  # drops what the lock's read cache holds of unfinished records
            again = log.unfinished()
            if again and not allow_unfinished:
                raise _unfinished_refusal(again, sink, location)
            for rec in again:
                for tid in _handle_ids(rec.handles):
                    protected[tid] = rec.checkpoint_id
        for t in open_txns:
            if t.transactional_id in protected:
                t.action = "kept"
                t.detail = (f"named by checkpoint {protected[t.transactional_id]}, which is not finished "
                            "(restart the query to decide it)")
            elif dry_run:
                t.action = "would-abort"
            else:
                _fence(client, t)
        if not dry_run and partitions:
            after = stable_offsets(sink.options.connection_config(), partitions)
            for t in open_txns:
                t.offsets_after = {_tp(*tp): list(after[tp]) for tp in t.partitions if tp in after}
            report.still_held = {_tp(*tp): list(v) for tp, v in after.items() if v[0] < v[1]}
    _log.info("abort_lingering_done", sink_id=sink.sink_id, prefix=sink.prefix, dry_run=dry_run,
              results={t.transactional_id: t.action for t in report.transactions})
    return report


def _fence(client: Any, t: LingeringTransaction) -> None:
    """Invariants 4 and 5: fence ``t``'s id only if the broker still shows the transaction listed, then check
    that it is no longer open."""
    now_st = (client.describe([t.transactional_id]) or {}).get(t.transactional_id)
    if now_st is None or not now_st.is_open or (now_st.producer_id, now_st.epoch) != (t.producer_id, t.epoch):
        t.action = "changed"
        t.detail = (f"the broker shows {now_st} now, not the transaction listed (producer id {t.producer_id}, "
                    f"epoch {t.epoch}): something else is using the id; not touched, rerun to see it again")
        return
    try:
        pid, epoch = client.fence(t.transactional_id, FENCE_TIMEOUT_MS)
    except Exception as e:  # reported per id; the others go on
        t.action, t.detail = "failed", f"fencing failed: {redact_text(str(e))}"
        return
    deadline = time.monotonic() + VERIFY_WAIT_S
    after = (client.describe([t.transactional_id]) or {}).get(t.transactional_id)
    while after is not None and after.is_open and time.monotonic() < deadline:
        time.sleep(0.1)  # PrepareAbort -> CompleteAbort
        after = (client.describe([t.transactional_id]) or {}).get(t.transactional_id)
    t.state_after = None if after is None else after.state
    if after is not None and after.is_open:
        t.action = "failed"
        t.detail = f"still {after.state} after fencing (producer id {pid}, epoch {epoch})"
        return
    t.action = "aborted"
    t.detail = f"fenced: producer id {pid}, epoch {epoch}"


def _print_report(report: AbortReport, out: Any) -> None:
    out.write(f"sink {report.sink_id}  prefix {report.prefix}  log {report.log_location}"
              f"{'  (dry run: nothing changed)' if report.dry_run else ''}\n")
    if not report.transactions:
        out.write("no open transaction under the prefix\n")
    for t in report.transactions:
        age = f"{max(time.time() - t.start_ms / 1000, 0):.0f}s" if t.start_ms > 0 else "?"
        offsets = ", ".join(f"{tp} lso {v[0]}/hw {v[1]}" + (f" -> lso {t.offsets_after[tp][0]}"
                                                              if tp in t.offsets_after else "")
                            for tp, v in t.offsets_before.items())
        out.write(f"{t.transactional_id}\t{t.state} (producer id {t.producer_id}, epoch {t.epoch}, age {age})\t"
                  f"{t.action}\t{t.detail}{'  ' + offsets if offsets else ''}\n")
    for tp, (lso, hw) in report.still_held.items():
        out.write(f"note: {tp}: read_committed readers still stop at offset {lso} (high watermark {hw}): another "
                  "open transaction, not this sink's, holds it\n")


def abort_lingering_command(args: argparse.Namespace) -> int:
    """``twophase kafka abort-lingering``: 0 done (or nothing to do), 1 an abort failed or was not
    verified, 2 refused or a bad argument (the message says why and what to run instead)."""
    try:
        min_idle_ms = parse_duration_ms(args.min_idle)
    except ValueError as e:
        raise ConfigurationError(f"--min-idle {args.min_idle!r}: {e}") from None
    sink = sink_from_options(sink_options(args))
    report = abort_lingering(sink, dry_run=args.dry_run, query_stopped=args.query_stopped, min_idle_ms=min_idle_ms,
                             allow_unfinished=args.allow_unfinished)
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_report(report, sys.stdout)
    return 0 if report.ok else 1


__all__ = ["register", "list_transactions", "abort_lingering", "abort_lingering_command", "AbortReport",
           "LingeringTransaction", "sink_options", "sink_from_options"]
