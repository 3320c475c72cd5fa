"""Batch writes (``df.write.format("twophase-…")``, SQL ``INSERT INTO``) with the streaming commit protocol.

A batch write is one Spark job: the driver plans it (``DataSource.writer()``), executors run
``write()`` (begin, write, pre-commit) and the driver calls ``commit(messages)`` or ``abort(messages)``
once. twophase gives each *write* its own sink id and transaction log
(:meth:`~twophase.sink.SinkSpec.write_job_spec`), keyed by the write's *key*:

- option ``writeId`` (stable across re-runs of one backfill): a re-run of a write that committed
  writes nothing (idempotent, like Delta's ``txnAppId``/``txnVersion``), and a re-run of a write whose
  driver died finishes its commit (it was decided) or replaces it (it was not);
- without it, a fresh key per job: the job is still all-or-nothing, but re-running it after a failure
  that came after its commit writes its data twice, as Spark's own writers do. Give a ``writeId`` to
  make re-runs safe.

Layout, in the destination sink's own log store (next to the streaming query's log, never in it)::

    write-jobs/open/<key>.json     a write whose runs are not all final: the registry, one listing
    write-jobs/<key>/              the write's transaction log (owner.json, checkpoints/<run>.json)

Each *run* (Spark job) of a write is one checkpoint id of the write's log: 0, then 1 if run 0 died or
failed, and so on. Where each step runs:

==========================  ======================  ===============================================
step                        where                   what
==========================  ======================  ===============================================
:func:`plan_write_job`      driver, ``writer()``    validate; recover other writes' decided runs;
                                                    finish or take over this write's earlier run;
                                                    record the run PENDING
``run_task``                executors, ``write()``  the sinks' task side, unchanged
:func:`commit_write_job`    driver, ``commit()``    COMPLETED, commit, COMMITTED, sweep
:func:`abort_write_job`     driver, ``abort()``     abort the handles, ABORTED, sweep
==========================  ======================  ===============================================

Invariants (``test_write_job_invN_*``):

1. At most one run of a write commits: a run is recorded PENDING (a compare-and-swap on an absent
   record) only once every earlier run of the write is final; a write with a COMMITTED run plans no
   run; a run taken over by a newer one is declined at its commit, never reopened.
2. A run whose driver died after its decision (COMPLETED) is committed whole by the next run of the
   same write, by the next batch write to the same destination (through the registry) or by
   ``twophase log write-jobs --recover``: a decided write never stays half-visible once any of them runs.
3. A run's sweeps reach only its own write's names (its own token) and only runs <= its own.
4. A run is taken over only with proof that it is dead or unwanted: a new run of the same write id
   (the user re-ran it), or ``batch.abandonAfter`` elapsed since it was planned (another write). If it
   was alive after all, it fails at its commit, loudly, with nothing of it visible.
"""

from __future__ import annotations

import hashlib
import re
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from twophase._logging import get_logger
from twophase.coordinator import CheckpointCoordinator
from twophase.decisions import CommitOutcome
from twophase.errors import CommitFailedError, ConcurrentWriterError, ConfigurationError
from twophase.log import CheckpointRecord, TransactionLog, decode_record, encode_record
from twophase.options import Option, parse_duration_ms
from twophase.sink import Ack, Guarantee, SinkSpec
from twophase.states import CheckpointState

_log = get_logger(__name__)

REGISTRY = "write-jobs/open/"
#: default of ``batch.abandonAfter``: another write's run planned longer ago than this is taken as dead
DEFAULT_ABANDON_AFTER_MS = 24 * 3600 * 1000

#: the options of a batch write, beside the sink's own (refused on a streaming query)
WRITE_JOB_OPTIONS: tuple[Option[Any], ...] = (
    Option("writeId", str, help="a stable id of this write: a re-run of a committed write writes nothing, a re-run of a "
                                "write whose driver died finishes or replaces it (like Delta's txnAppId/txnVersion)"),
    Option("batch.abandonAfter", parse_duration_ms, DEFAULT_ABANDON_AFTER_MS,
           help="another batch write's run planned longer ago than this and never finished is taken as dead: "
                "aborted and swept (e.g. 30min; a run that is alive after all fails at its commit)"),
)

_SAFE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def write_key(write_id: Optional[str]) -> str:
    """The key of a write: ``writeId`` itself when it is a safe name, else a digest of it; a fresh,
    time-ordered key when there is no write id."""
    if write_id is None:
        return f"job-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:12]}"
    if not write_id.strip():
        raise ConfigurationError("option 'writeId' is empty: give a stable id of this write (e.g. 'backfill-2026-11-01'), "
                                 "or leave the option out")
    if _SAFE_KEY.match(write_id):
        return write_id
    return "id-" + hashlib.sha256(write_id.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class WriteJob:
    """A planned run of a batch write (picklable: Spark sends it to executors inside the writer).

    ``skip``: the write committed already (an earlier run, or this plan's recovery of one): the run writes
    nothing and commits nothing.
    """

    base: SinkSpec[Any]
    spec: SinkSpec[Any]
    key: str
    write_id: Optional[str]
    checkpoint_id: int
    skip: bool = False


def _registry_name(key: str) -> str:
    return f"{REGISTRY}{key}.json"


def _forget(base_log: TransactionLog, key: str) -> None:
    base_log.store.delete(_registry_name(key))


def open_writes(base: SinkSpec[Any], log: Optional[TransactionLog] = None) -> list[dict[str, Any]]:
    """The registry: every write of ``base`` whose runs were not all final when last seen (``log``: base's log,
    when the caller holds it already)."""
    log = log if log is not None else base.transaction_log()
    out = []
    for name in log.store.list(REGISTRY):
        if name.endswith(".json"):
            data = log.store.get(name)
            if data is not None:
                out.append(decode_record(data, f"{log.location}/{name}"))
    return out


def recover_writes(base: SinkSpec[Any], *, abandon_after_s: float, exclude: Optional[str] = None,
                   now: Optional[float] = None, base_log: Optional[TransactionLog] = None) -> dict[str, list[str]]:
    """Finish what other batch writes of ``base`` left (invariants 2 and 4): commit decided runs, take
    over runs planned more than ``abandon_after_s`` ago, forget writes whose runs are all final.
    Returns the keys ``{"committed": [...], "abandoned": [...], "running": [...]}``."""
    now = time.time() if now is None else now
    base_log = base_log if base_log is not None else base.transaction_log()
    report: dict[str, list[str]] = {"committed": [], "abandoned": [], "running": []}
    for entry in open_writes(base, base_log):
        key = str(entry.get("key", ""))
        if not key or key == exclude:
            continue
        spec = base.write_job_spec(key)
        coord = CheckpointCoordinator(spec, spec.transaction_log(), sweep_after_commit=True)
        unfinished = coord.log.view().unfinished
        if any(r.state is CheckpointState.COMPLETED for r in unfinished):
            coord.recover()
            report["committed"].append(key)
            _log.warning("write_job_committed_by_recovery", sink_id=spec.sink_id, write_id=entry.get("write_id"),
                         planned_at=entry.get("planned_at"),
                         consequence="the data of a batch write whose driver died after its decision is now committed "
                                     "whole; a re-run of that job without option writeId would write it again")
        else:
            for rec in unfinished:  # PENDING runs (at most one, by invariant 1)
                age = now - float(rec.timestamps.get(CheckpointState.PENDING.value, entry.get("planned_at", now)))
                if age < abandon_after_s:
                    report["running"].append(key)
                    continue
                coord.take_over_write_job(rec.checkpoint_id, f"abandoned: planned {age:.0f} s ago, longer than "
                                                             f"batch.abandonAfter ({abandon_after_s:.0f} s)")
                report["abandoned"].append(key)
                _log.warning("write_job_abandoned", sink_id=spec.sink_id, write_id=entry.get("write_id"),
                             run=rec.checkpoint_id, age_s=round(age))
        if key not in report["running"]:
            _forget(base_log, key)
    return report


def plan_write_job(base: SinkSpec[Any], *, write_id: Optional[str] = None,
                   abandon_after_ms: int = DEFAULT_ABANDON_AFTER_MS) -> WriteJob:
    """Plan one run of a batch write to ``base`` (driver, before any data moves); see the module docstring."""
    base.validate_destination()
    key = write_key(write_id)
    if base.guarantee is Guarantee.AT_LEAST_ONCE:  # no log: each task commits at its end
        return WriteJob(base, base, key, write_id, 0)
    spec = base.write_job_spec(key)
    base_log = base.transaction_log()
    recover_writes(base, abandon_after_s=abandon_after_ms / 1000, exclude=key, base_log=base_log)
    log = spec.transaction_log()
    log.claim(f"write:{write_id if write_id is not None else key}")
    coord = CheckpointCoordinator(spec, log, sweep_after_commit=True)
    view = log.view()
    if view.highest_committed is not None:
        _log.warning("write_job_already_committed", sink_id=spec.sink_id, write_id=write_id, run=view.highest_committed,
                     consequence="this job's rows are not written: this write id committed before; rows that are not "
                                 "a re-run of that write need a new writeId")
        _forget(base_log, key)
        return WriteJob(base, spec, key, write_id, view.highest_committed, skip=True)
    if any(r.state is CheckpointState.COMPLETED for r in view.unfinished):
        report = coord.recover()
        _log.warning("write_job_finished_earlier_run", sink_id=spec.sink_id, write_id=write_id, runs=report.committed,
                     consequence="an earlier run of this write was decided when its driver died: it is committed "
                                 "now, and this run writes nothing")
        _forget(base_log, key)
        return WriteJob(base, spec, key, write_id, max(report.committed), skip=True)
    for rec in view.unfinished:  # an earlier run of the same write id that never decided: replaced (invariant 4)
        coord.take_over_write_job(rec.checkpoint_id, f"taken over by a new run of write id {write_id!r}")
        _log.warning("write_job_taken_over", sink_id=spec.sink_id, write_id=write_id, run=rec.checkpoint_id,
                     consequence="that run is aborted; if its job is still running it fails at its commit")
    run = (max(view.ids) + 1) if view.ids else 0
    base_log.store.put(_registry_name(key), encode_record(
        {"key": key, "write_id": write_id, "sink_id": spec.sink_id, "run": run, "planned_at": time.time(),
         "host": socket.gethostname()}))
    try:
        coord.trigger(run, ())
    except ConcurrentWriterError as e:
        raise ConcurrentWriterError(f"another run of batch write {write_id or key!r} was planned at the same moment "
                                    f"(run {run}); run one job per writeId at a time: {e}") from e
    _log.info("write_job_planned", sink_id=spec.sink_id, write_id=write_id, run=run)
    return WriteJob(base, spec, key, write_id, run)


#: commit_write_job: attempts at committing a decided (COMPLETED) run before the error goes to Spark, and the
#: pause before the first retry (doubled each time)
COMMIT_ATTEMPTS = 4
COMMIT_RETRY_PAUSE_S = 0.5


def _record(job: WriteJob) -> Optional[CheckpointRecord]:
    """The run's record as the log has it now (a fresh read, outside any lock span)."""
    return job.spec.transaction_log().get(job.checkpoint_id)


def _forget_if_final(job: WriteJob) -> bool:
    """Forget the write in the registry only if every run of it is final (read under the write log's lock):
    a decided (COMPLETED) or running run stays known, for the next run or the next write to finish
    (invariant 5). Returns whether it was forgotten."""
    log = job.spec.transaction_log()
    with log.locked():
        view = log.view()
        if view.unfinished or job.checkpoint_id not in view.ids:
            return False
        _forget(job.base.transaction_log(), job.key)
        return True


def commit_write_job(job: WriteJob, acks: Sequence[Optional[Ack]]) -> Optional[CommitOutcome]:
    """Spark's driver commit of the run: complete, commit, sweep; then forget the write in the registry.

    A run that is decided (COMPLETED) only goes forward (invariant 5): an error after the decision (an S3
    5xx, EIO while linking one file) is retried here; if it persists, the write stays in the registry and
    the error says who finishes it."""
    if job.skip or job.spec.guarantee is Guarantee.AT_LEAST_ONCE:
        return None
    outcome: Optional[CommitOutcome] = None
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            coord = CheckpointCoordinator(job.spec, sweep_after_commit=True)
            outcome = coord.complete_write_job(job.checkpoint_id, acks, [str(i) for i in range(len(acks))])
            break
        except Exception as e:  # noqa: BLE001 - a decided run is retried whatever the sink raised
            rec = _record(job)
            if rec is None or rec.state is not CheckpointState.COMPLETED:
                _forget_if_final(job)
                raise
            if attempt == COMMIT_ATTEMPTS:
                _log.error("write_job_commit_failed_after_decision", sink_id=job.spec.sink_id, write_id=job.write_id,
                           run=job.checkpoint_id, attempts=attempt, error=str(e),
                           consequence="the run is decided (COMPLETED) and stays known in the registry: it is "
                                       "committed whole by Spark's abort of this job, by a re-run with the same "
                                       "writeId, or by the next batch write to this destination")
                raise CommitFailedError(
                    f"run {job.checkpoint_id} of batch write {job.write_id or job.key!r} is decided (COMPLETED) but "
                    f"committing it failed {attempt} times: {e}. It is never aborted: it is committed whole by a "
                    "re-run of this write with the same option writeId, or by the next batch write to this "
                    "destination (re-run without writeId and it would be written twice)") from e
            pause = COMMIT_RETRY_PAUSE_S * 2 ** (attempt - 1)
            _log.warning("write_job_commit_retry", sink_id=job.spec.sink_id, write_id=job.write_id,
                         run=job.checkpoint_id, attempt=attempt, pause_s=pause, error=str(e),
                         consequence="the run is decided: its commit is retried, never abandoned")
            time.sleep(pause)
    _forget_if_final(job)
    _log.info("write_job_committed", sink_id=job.spec.sink_id, write_id=job.write_id, run=job.checkpoint_id,
              outcome=str(outcome), tasks=len(acks))
    return outcome


def abort_write_job(job: WriteJob, acks: Sequence[Optional[Ack]], reason: str) -> Optional[CommitOutcome]:
    """Spark's driver abort of the run: abort every prepared handle, record ABORTED, sweep; forget the write.

    Spark also calls it when its commit threw: a run that is decided (COMPLETED) is committed here instead
    (invariant 5), and the outcome returned; if that fails too, the write stays in the registry."""
    if job.skip or job.spec.guarantee is Guarantee.AT_LEAST_ONCE:
        return None
    try:
        outcome = CheckpointCoordinator(job.spec, sweep_after_commit=True).abort_write_job(
            job.checkpoint_id, acks, reason)
    finally:
        _forget_if_final(job)
    if outcome is not None:
        _log.warning("write_job_committed_at_abort", sink_id=job.spec.sink_id, write_id=job.write_id,
                     run=job.checkpoint_id, outcome=str(outcome), reason=reason,
                     consequence="the run was decided before the error Spark reports: its rows are committed, "
                                 "whole; do not re-run it without option writeId")
        return outcome
    _log.warning("write_job_aborted", sink_id=job.spec.sink_id, write_id=job.write_id, run=job.checkpoint_id,
                 reason=reason)
    return None
