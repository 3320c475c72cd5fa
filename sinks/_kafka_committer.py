"""The Kafka sink's driver side (steps 4-5 of :mod:`twophase.sinks.kafka`): :class:`KafkaCommitter` ends prepared
transactions with EndTxn (commit / abort) over the driver's own connection, tells a fenced epoch's committed data
from lost data, checks a handle's age against the transaction timeout (invariant 7), and fences lingering ids.
Its one concern: deciding the transactions the writers prepared; the invariants are stated in
:mod:`twophase.sinks.kafka`."""

from __future__ import annotations

import time
from typing import Optional, Sequence

from twophase._logging import get_logger
from twophase.errors import ConfigurationError, TransientSinkError
from twophase.sink import CommitResult, CommitStatus, Guarantee, SinkCommitter

from twophase.sinks.kafka import SINK, KafkaCommittable, KafkaSink

_log = get_logger('twophase.sinks.kafka')  # the public module's logger name: users' log filters keep working


class KafkaCommitter(SinkCommitter[KafkaCommittable]):
    """Driver side (steps 4-5): EndTxn(commit / abort) over the driver's own connection; fences lingering ids."""

    committable_type = KafkaCommittable

    def __init__(self, sink: KafkaSink) -> None:
        self.sink = sink
        self.options = sink.options
        self.commit_parallelism = sink.options.commit_parallelism

    def commit(self, committable: KafkaCommittable, *, recovering: bool = False) -> CommitResult[KafkaCommittable]:
        """EndTxn(commit) with the committable's id, producer id and epoch (invariant 2).

        A fenced epoch is told apart with a read_committed reader: visible is ALREADY_COMMITTED, missing is
        LOST (the detail names the operator command). The broker answers a repeated EndTxn with the same
        epoch with success too, so a second commit of a still-current epoch is reported COMMITTED: both
        are idempotent, nothing is written twice. Transient errors raise (the commit is retried).
        """
        c = committable
        if c.guarantee == Guarantee.AT_LEAST_ONCE.value or not c.partitions:
            return CommitResult(c, CommitStatus.COMMITTED)
        from twophase.sinks._kafka_txn import EndTxnOutcome, verify_committed
        self._check_age(c, recovering=recovering)
        outcome = self.sink._client().end_txn(c.transactional_id, int(c.producer_id), int(c.epoch), commit=True)
        if outcome is EndTxnOutcome.OK:
            self.sink._forget(c.transactional_id, int(c.epoch))
            return CommitResult(c, CommitStatus.COMMITTED)
        missing = verify_committed(self.options.connection_config(), c.partitions)
        if not missing:
            _log.info("commit_already_done", transactional_id=c.transactional_id, checkpoint_id=c.checkpoint_id)
            self.sink._forget(c.transactional_id, int(c.epoch))
            return CommitResult(c, CommitStatus.ALREADY_COMMITTED)
        age = c.age()
        age_s = age.age_ms / 1000 if age is not None else 0.0
        try:
            location = self.sink.log_location()
        except ConfigurationError:
            location = "<log location>"
        return CommitResult(c, CommitStatus.LOST, (
            f"{SINK}: checkpoint {c.checkpoint_id} task {c.task_id}: the prepared transaction "
            f"{c.transactional_id!r} (producer id {c.producer_id}, epoch {c.epoch}) was "
            f"aborted by the broker (expired after kafka.transaction.timeout.ms={c.timeout_ms} ms, or "
            f"fenced) before the driver could commit it; {c.records} records in partitions "
            f"{', '.join(missing)} are lost (transaction age {age_s:.0f}s). This checkpoint can never commit: after "
            f"re-producing or giving up that data, record the loss with: twophase log resolve {location} "
            f"--sink-id {self.sink.sink_id} --checkpoint {c.checkpoint_id} --accept-loss"))

    def check_prepared(self, checkpoint_id: int, committables: Sequence[KafkaCommittable]) -> list[str]:
        """Before the decision: each prepared transaction the broker already ended or is about to expire.

        One DescribeTransactions per coordinator: a transaction no longer ``Ongoing`` with the committable's
        producer id and epoch was aborted by the broker (``kafka.transaction.timeout.ms`` passed: a batch, or
        a task re-run after a broker outage, outlived it) or fenced; one whose measured age (from before
        ``init_transactions``, so never below the broker's) is within ``min(2 s, 10 %)`` of its timeout is
        expired by the broker's next check, likely before the EndTxn arrives. Either would make the decided
        checkpoint LOST (DataLossError, an operator's ``twophase log resolve``); found before the decision,
        the coordinator declines the batch instead (aborted, re-run: nothing lost). A broker that cannot
        describe (or does not answer within the retry deadline) is not asked: the commit still tells
        committed from lost."""
        live = [c for c in committables
                if c.guarantee != Guarantee.AT_LEAST_ONCE.value and c.partitions and c.transactional_id]
        if not live:
            return []
        try:
            states = self.sink._client().describe([c.transactional_id for c in live])
        except TransientSinkError as e:
            _log.warning("prepared_check_skipped", checkpoint_id=checkpoint_id, error=str(e),
                         consequence="decided without it; the commit tells committed from lost")
            states = None
        now = time.time()                                # after the describe, which may have waited for a coordinator
        gone: dict[str, str] = {}
        for c in live:
            age = c.age(now)
            st = None if states is None else states.get(c.transactional_id)
            if states is not None and not (st is not None and st.state == "Ongoing"
                                           and (st.producer_id, st.epoch) == (int(c.producer_id), int(c.epoch))):
                gone[c.transactional_id] = (
                    f"task {c.task_id}: the prepared transaction {c.transactional_id!r} (producer id "
                    f"{c.producer_id}, epoch {c.epoch}) was already ended by the broker (now: {st}): expired after "
                    f"kafka.transaction.timeout.ms={c.timeout_ms} ms"
                    + (f" (age {age.age_ms / 1000:.1f}s)" if age is not None else "") + ", or fenced")
            elif age is not None and age.expiring:
                gone[c.transactional_id] = (
                    f"task {c.task_id}: the prepared transaction {c.transactional_id!r} is {age.age_ms / 1000:.1f}s old, "
                    f"at the end of kafka.transaction.timeout.ms={c.timeout_ms} ms (the broker aborts it at its next "
                    "check, likely before its EndTxn)")
        if gone:
            _log.warning("prepared_transactions_gone", checkpoint_id=checkpoint_id, transactional_ids=sorted(gone),
                         consequence="the checkpoint is declined before the decision (a Spark batch runs again, "
                         "the runtime fails over, a batch write must be re-run)")
        hint = ("raise kafka.transaction.timeout.ms (and the brokers' transaction.max.timeout.ms) if batches, with "
                "their task re-runs and broker outages, outlive it")
        found = [gone[c.transactional_id] for c in live if c.transactional_id in gone]
        return found[:-1] + [f"{found[-1]}; {hint}"] if found else []

    def _check_age(self, committable: KafkaCommittable, *, recovering: bool = False) -> None:
        """Invariant 7: the measured age of a committable at commit against its transaction timeout.

        A commit made by recovery (the driver restarted after an outage) measures the outage, not the batch:
        it warns with the age reached and never raises the alarm that would stop the next, healthy batch."""
        timeout = committable.timeout_ms
        age = committable.age()
        if age is None or not age.warns:
            return
        age_ms = age.age_ms
        if recovering:
            _log.warning("transaction_aged_by_outage", transactional_id=committable.transactional_id,
                         checkpoint_id=committable.checkpoint_id, age_ms=round(age_ms), transaction_timeout_ms=timeout,
                         meaning="recovery commits a batch decided before the driver stopped: its age is the outage; "
                                 "an outage longer than kafka.transaction.timeout.ms loses the batch (DataLossError)")
            return
        _log.warning("transaction_near_timeout", transactional_id=committable.transactional_id,
                     checkpoint_id=committable.checkpoint_id, age_ms=round(age_ms), transaction_timeout_ms=timeout,
                     hint="raise kafka.transaction.timeout.ms (and the brokers' transaction.max.timeout.ms) "
                          "or make batches shorter")
        if age.blocks:
            self.sink._raise_alarm(committable, age_ms, timeout)
            _log.error("transaction_timeout_danger", transactional_id=committable.transactional_id,
                       checkpoint_id=committable.checkpoint_id, age_ms=round(age_ms),
                       transaction_timeout_ms=timeout, next_batch="refused until the timeout is raised")

    def abort(self, committable: KafkaCommittable, *, recovering: bool = False) -> None:
        """EndTxn(abort); a fenced epoch means it is already ended (invariant 3)."""
        c = committable
        if c.guarantee == Guarantee.AT_LEAST_ONCE.value or not c.transactional_id:
            return
        if not c.partitions:
            self.sink._forget(c.transactional_id, c.epoch)
            return
        self.sink._client().end_txn(c.transactional_id, int(c.producer_id), int(c.epoch), commit=False)
        self.sink._forget(c.transactional_id, int(c.epoch))

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int] = None) -> int:
        """Fence open transactions of generation ``n mod 2`` under the prefix, n = min(up_to, highest committed).

        Clamping to the highest COMMITTED checkpoint (the coordinator passes it) keeps a re-run of an
        ABORTED checkpoint id (which Spark does after a failed batch) from being fenced by the recovery
        that precedes its commit. Nothing committed yet: nothing is fenced. A batch write's ids carry the run:
        its sweep fences runs ``<= up_to`` (a later run of the write may be in flight), unclamped.
        """
        if self.sink.guarantee is Guarantee.AT_LEAST_ONCE:
            return 0
        write_job = self.options.write_job
        if write_job:  # a batch write's ids are runs, never re-attempted: no clamp needed
            n = up_to_checkpoint
        elif highest_committed is None:
            return 0
        else:
            n = min(up_to_checkpoint, highest_committed)
        generation = n % 2
        kept = self.sink._live_above(n)  # invariant 4: undecided ids of newer checkpoints begun in this process
        client = self.sink._client()
        listed = client.list_transactions(self.sink.prefix + "-")
        if listed is not None:
            ids = sorted({tid for tid, _pid, _state in listed})
        else:
            ids = self._known_id_space(n)
        fenced = 0
        for tid in ids:
            parsed = self.sink._parse_id(tid)
            # a batch write's ids carry the run: only runs <= n (a later run may be in flight: write_job invariant 3)
            if parsed is None or (parsed[1] > n if write_job else parsed[1] != generation) or tid in kept:
                continue
            client.fence(tid, self.sink.effective_timeout_ms())
            fenced += 1
        if fenced:
            _log.info("lingering_aborted", sink_id=self.sink.sink_id, generation=generation, up_to=n, fenced=fenced,
                      listed=listed is not None)
        return fenced

    def _known_id_space(self, up_to: Optional[int] = None) -> list[str]:
        """Every id the sink may have used: tasks seen in the log x 2 generations x slots (Spark
        partitions 0..max seen; runtime handles ``{"task", "txns": [...]}`` name their tasks); for a batch
        write, x its runs ``0..up_to`` (else up to the highest run in its log) instead of generations.

        The one place the committer reads the transaction log, and only where the broker cannot list
        transactions (Kafka < 3.0): the log's handles are the only record of which task ids wrote
        under the prefix. It reads task ids only, never a record's state."""
        partitions, tasks, runs = 0, set(), -1
        for rec in self.sink.transaction_log().records():
            runs = max(runs, rec.checkpoint_id)
            for h in rec.handles.values():
                for inner in [h, *(h.get("txns") or ())]:
                    task = str(inner.get("task_id", ""))
                    if task.isdigit():
                        partitions = max(partitions, int(task) + 1)
                    elif task:
                        tasks.add(task)
        tasks |= {str(p) for p in range(partitions)}
        checkpoints = range((runs if up_to is None else up_to) + 1) if self.options.write_job else (0, 1)
        return [self.sink.transactional_id(t, g, a) for t in sorted(tasks) for g in checkpoints
                for a in range(self.options.attempt_slots)]
