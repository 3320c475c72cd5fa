"""What both Kafka writers share (steps 1-3 of :mod:`twophase.sinks.kafka`): :class:`_KafkaWriterBase` picks a
task's transactional id among its attempt slots (invariant 4: DescribeTransactions, never an id with an open
transaction, a race with another attempt detected after ``init_transactions``), checks before pre-commit that
the id is still ours, and names unacknowledged records (invariant 6). Its one concern: a writer's ownership of its
transactional id, whatever the producer library."""

from __future__ import annotations

from typing import Any, Optional

import pyarrow as pa

from twophase._logging import get_logger
from twophase.errors import TransientSinkError
from twophase.sink import SinkWriter, TransactionContext

from twophase.sinks.kafka import SINK, KafkaCommittable, KafkaSink

_log = get_logger('twophase.sinks.kafka')  # the public module's logger name: users' log filters keep working


class _KafkaWriterBase(SinkWriter[KafkaCommittable]):
    """Task side (steps 1-3): one producer and its Kafka transaction, for one task attempt and checkpoint.

    The transaction begins when the writer is created (step 1); ``transaction`` may be given instead,
    already begun (tests drive a writer over a fake producer). The two producers (option
    ``kafkaClient``) share the id probing (invariant 4) and the pre-commit ownership check."""

    def __init__(self, sink: KafkaSink, context: TransactionContext, *,
                 transaction: Any = None) -> None:
        super().__init__(context)
        self.sink = sink
        self.options = sink.options
        self.txn = transaction if transaction is not None else self._begin(context)

    def write(self, batch: pa.RecordBatch) -> int:  # step 2
        try:
            return self._write(batch)
        except Exception as e:
            if type(e).__name__ != "KafkaException":
                raise
            # librdkafka's: the transaction failed (records expired, fenced) and every further record is
            # refused (kafka-python reports failures through the send callbacks, counted at prepare_commit)
            txn = self.txn
            raise TransientSinkError(
                f"{SINK}: task {txn.context.task_id} of checkpoint {txn.context.checkpoint_id}: transaction "
                f"{txn.transactional_id!r} failed after {txn.records} records ({txn.acked()} acknowledged, "
                f"{len(txn.errors)} failed, first error: {(txn.errors or txn.fatal or [e])[0]!r}); the task fails "
                "rather than commit short (raise kafka.delivery.timeout.ms if the brokers are often slow)") from e

    @property
    def transactional_id(self) -> Optional[str]:
        return self.txn.transactional_id

    @property
    def producer(self) -> Any:
        return self.txn.producer

    @staticmethod
    def _check_no_race(context: TransactionContext, tid: str, seen: Any, producer_id: int, epoch: int) -> None:
        """Invariant 4's one interleaving: someone initialised ``tid`` between our probe (``seen``, from
        :meth:`_choose_id`) and our ``init_transactions``; then this attempt fails instead of going on."""
        if seen is False:  # the broker cannot describe: no probe to compare with
            return
        expected = 0 if seen is None else seen.epoch + 1
        if epoch != expected and not (seen is not None and producer_id != seen.producer_id):
            _log.error("transactional_id_race", transactional_id=tid, checkpoint_id=context.checkpoint_id,
                       task=context.task_id, probed_epoch=None if seen is None else seen.epoch, epoch=epoch)
            raise TransientSinkError(
                f"{SINK}: transactional id {tid!r} was initialised by another attempt while this one "
                f"started (epoch {epoch}, expected {expected}); failing this attempt")

    def _choose_id(self, context: TransactionContext) -> tuple[str, Any]:
        """Invariant 4: the first candidate id with no open transaction, and what the probe saw of it
        (``None``: unknown id; ``False``: the broker cannot describe, so no probe)."""
        candidates = self.sink._candidate_ids(context)
        states = self.sink._client().describe(candidates)
        if states is None:
            return candidates[0], False
        idle = [t for t in candidates if states[t] is None or states[t].state != "Empty" and not states[t].is_open]
        empty = [t for t in candidates if states[t] is not None and states[t].state == "Empty"]
        for tid in idle + empty:
            return tid, states[tid]
        raise TransientSinkError(
            f"{SINK}: every transactional id slot of task {context.task_id} for checkpoint {context.checkpoint_id} "
            f"has an open transaction ({', '.join(candidates)}); they may hold prepared data, so none is "
            f"re-initialised. Raise option 'transactionalIdAttempts' (now {self.options.attempt_slots}); lingering "
            "ones are aborted once a checkpoint of that generation commits")

    def _check_still_ours(self, pe: Any) -> None:
        """Invariant 4: at pre_commit the id must be Ongoing with our producer id and epoch."""
        tid = self.txn.transactional_id
        states = self.sink._client().describe([tid])
        if states is None:
            return
        st = states.get(tid)
        if st is None or st.state != "Ongoing" or (st.producer_id, st.epoch) != (pe.producer_id, pe.epoch):
            raise TransientSinkError(
                f"{SINK}: transaction {tid!r} (producer id {pe.producer_id}, epoch {pe.epoch}) is no "
                f"longer ours at pre-commit (broker: {st}); another attempt initialised the id")

    def _not_acknowledged(self, acked: int, errors: list[Any]) -> TransientSinkError:
        """Invariant 6: the error that fails a task whose records were not all acknowledged."""
        txn = self.txn
        first = errors[0] if errors else None
        _log.warning("records_not_acknowledged", transactional_id=txn.transactional_id,
                     checkpoint_id=txn.context.checkpoint_id, task=txn.context.task_id, records=txn.records,
                     acknowledged=acked, failed=len(errors), error=repr(first))
        return TransientSinkError(
            f"{SINK}: task {txn.context.task_id} of checkpoint {txn.context.checkpoint_id}: only {acked} of "
            f"{txn.records} records sent in transaction {txn.transactional_id!r} were acknowledged "
            f"({len(errors)} failed, first error: {first!r}); the transaction is aborted and the task "
            "fails rather than commit short (raise kafka.delivery.timeout.ms if the brokers are often slow)")
