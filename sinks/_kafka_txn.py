"""Driver-side Kafka transaction requests that kafka-python's producer does not expose.

The producer that wrote a transaction is gone when the driver commits it, so the driver speaks the
transaction-coordinator protocol itself, over kafka-python's admin client connection:

- ``EndTxn(transactional_id, producer_id, epoch, committed)`` commits or aborts a transaction that
  another process prepared. Measured against noida-db (and the Kafka coordinator's retry rule): a
  commit with the exact (id, producer id, epoch) commits the flushed records; a repeated commit with
  the same triple answers success; a commit after the id was re-initialised (fenced) or the broker
  aborted the transaction answers INVALID_PRODUCER_EPOCH / PRODUCER_FENCED.
- ``InitProducerId(transactional_id)`` fences: it bumps the epoch and aborts whatever transaction
  the id had open (this is how ``init_transactions`` fences zombies).
- ``ListTransactions`` lists the transactional ids a broker coordinates (KIP-664, Kafka 3.0+);
  ``None`` is returned where the broker does not support it.

Outcomes of EndTxn are classified into :class:`EndTxnOutcome` so the sink decides in one place.
"""

from __future__ import annotations

import enum
import threading
import time
from typing import Any, Iterable, Mapping, Optional

from twophase._logging import get_logger
from twophase.errors import ConfigurationError, MissingDependencyError, TransientSinkError

try:
    import kafka.errors as Errors
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
    from kafka.protocol.metadata import CoordinatorType
    from kafka.protocol.producer import EndTxnRequest, InitProducerIdRequest
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError("the Kafka sink and source need kafka-python: pip install 'twophase[kafka]'") from e

_log = get_logger(__name__)

#: EndTxn / InitProducerId error codes worth retrying (coordinator moving, loading, or busy)
_RETRIABLE = (Errors.ConcurrentTransactionsError, Errors.CoordinatorLoadInProgressError,
              Errors.NotCoordinatorError, Errors.CoordinatorNotAvailableError, Errors.RequestTimedOutError)
#: errors meaning "this (producer id, epoch) no longer owns the transactional id"
_FENCED = (Errors.InvalidProducerEpochError, Errors.ProducerFencedError, Errors.InvalidTxnStateError,
           Errors.InvalidProducerIdMappingError)


class EndTxnOutcome(str, enum.Enum):
    """What the coordinator answered to an EndTxn."""

    OK = "OK"            # done (or done before: a repeated EndTxn with the same epoch)
    FENCED = "FENCED"    # the epoch is stale: fenced, expired or otherwise ended by someone else


class TxnClient:
    """One admin connection used for EndTxn, InitProducerId, ListTransactions and commit verification.

    Thread-safe (kafka-python's admin runs its IO on one thread; callers block on events), so the
    sink commits the handles of a checkpoint from several threads over one connection.
    """

    def __init__(self, config: Mapping[str, Any], *, retry_deadline_s: float = 60.0) -> None:
        self.config = dict(config)
        self.retry_deadline_s = retry_deadline_s
        admin_keys = set(KafkaAdminClient.DEFAULT_CONFIG)
        kwargs = {k: v for k, v in self.config.items() if k in admin_keys}
        try:
            self.admin = KafkaAdminClient(**kwargs)
        except (Errors.KafkaTimeoutError, Errors.KafkaConnectionError, Errors.NodeNotReadyError) as e:
            raise ConfigurationError(
                f"twophase-kafka: no Kafka broker answers at kafka.bootstrap.servers="
                f"{self.config.get('bootstrap_servers')!r} within {kwargs.get('bootstrap_timeout_ms', 30000)} ms; "
                "check the address (host:port) or raise kafka.bootstrap.timeout.ms") from e

    def close(self) -> None:
        self.admin.close()

    # ---- coordinator plumbing

    async def _coordinator(self, transactional_id: str) -> int:
        return await self.admin._find_coordinator_id(transactional_id, CoordinatorType.TRANSACTION)

    def _forget_coordinator(self, transactional_id: str) -> None:
        coords = getattr(self.admin._manager.cluster, "_coordinators", None)
        if isinstance(coords, dict):
            coords.pop((CoordinatorType.TRANSACTION, transactional_id), None)

    def _call(self, transactional_id: str, build: Any, what: str) -> type:
        """Send ``build()`` to the id's coordinator, retrying retriable errors; returns the error class."""
        deadline = time.monotonic() + self.retry_deadline_s
        delay = 0.05
        while True:
            async def go() -> Any:
                node = await self._coordinator(transactional_id)
                return await self.admin._manager.send(build(), node_id=node)
            try:
                response = self.admin._manager.run(go)
                error = Errors.for_code(response.error_code)
            except (Errors.KafkaConnectionError, Errors.NodeNotReadyError, Errors.KafkaTimeoutError,
                    Errors.RequestTimedOutError) as e:
                error = type(e)
            if error in _RETRIABLE or error in (Errors.KafkaConnectionError, Errors.NodeNotReadyError,
                                                Errors.KafkaTimeoutError):
                if error in (Errors.NotCoordinatorError, Errors.CoordinatorNotAvailableError):
                    self._forget_coordinator(transactional_id)
                if time.monotonic() > deadline:
                    raise TransientSinkError(f"twophase-kafka: {what} for transactional id {transactional_id!r} "
                                             f"still failing with {error.__name__} after {self.retry_deadline_s}s")
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            return error

    # ---- the requests

    def end_txn(self, transactional_id: str, producer_id: int, epoch: int, *, commit: bool) -> EndTxnOutcome:
        """Commit or abort the transaction of ``(transactional_id, producer_id, epoch)``."""
        def build() -> Any:
            return EndTxnRequest(transactional_id=transactional_id, producer_id=producer_id,
                                 producer_epoch=epoch, committed=commit, max_version=3)
        error = self._call(transactional_id, build, "commit" if commit else "abort")
        if error is Errors.NoError:
            return EndTxnOutcome.OK
        if error in _FENCED:
            return EndTxnOutcome.FENCED
        raise TransientSinkError(f"twophase-kafka: EndTxn({'commit' if commit else 'abort'}) for "
                                 f"{transactional_id!r} failed: {error.__name__}")

    def fence(self, transactional_id: str, timeout_ms: int) -> tuple[int, int]:
        """InitProducerId for ``transactional_id``: bump its epoch, aborting what it had open."""
        result: dict[str, int] = {}

        def build() -> Any:
            return InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=timeout_ms,
                                         producer_id=-1, producer_epoch=-1, max_version=4)

        deadline = time.monotonic() + self.retry_deadline_s
        while True:
            async def go() -> Any:
                node = await self._coordinator(transactional_id)
                return await self.admin._manager.send(build(), node_id=node)
            response = self.admin._manager.run(go)
            error = Errors.for_code(response.error_code)
            if error is Errors.NoError:
                result["pid"], result["epoch"] = response.producer_id, response.producer_epoch
                return result["pid"], result["epoch"]
            if error in _RETRIABLE and time.monotonic() < deadline:
                if error in (Errors.NotCoordinatorError, Errors.CoordinatorNotAvailableError):
                    self._forget_coordinator(transactional_id)
                time.sleep(0.05)
                continue
            raise TransientSinkError(f"twophase-kafka: fencing transactional id {transactional_id!r} failed: "
                                     f"{error.__name__}")

    def list_transactions(self, prefix: str, states: Iterable[str] = ("Ongoing",)) -> Optional[list[tuple[str, int, str]]]:
        """``[(transactional_id, producer_id, state)]`` under ``prefix``; None if the broker cannot list."""
        try:
            listing = self.admin.list_transactions(state_filters=list(states))
        except (Errors.UnsupportedVersionError, Errors.IncompatibleBrokerVersion, NotImplementedError) as e:
            _log.info("list_transactions_unsupported", error=str(e))
            return None
        out = []
        for rows in listing.values():
            for row in rows:
                if row.transactional_id.startswith(prefix):
                    out.append((row.transactional_id, row.producer_id, str(row.state.value)))
        return out

    def topic_partitions(self, topic: str) -> Optional[int]:
        """Number of partitions of ``topic``, or None if it does not exist."""
        try:
            described = self.admin.describe_topics([topic])
        except Errors.UnknownTopicOrPartitionError:
            return None
        for t in described:
            if t.get("name") == topic and t.get("error_code", 0) == 0:
                return len(t.get("partitions") or [])
        return None


def verify_committed(config: Mapping[str, Any], partitions: Iterable[Mapping[str, Any]],
                     *, timeout_s: float = 15.0) -> list[str]:
    """Which of ``partitions`` (``{topic, partition, first_offset}``) do NOT show their first record
    to a read_committed reader; [] means every one is visible (the transaction was committed)."""
    consumer_keys = set(KafkaConsumer.DEFAULT_CONFIG)
    kwargs = {k: v for k, v in config.items() if k in consumer_keys}
    consumer = KafkaConsumer(**kwargs, isolation_level="read_committed", enable_auto_commit=False,
                             group_id=None, auto_offset_reset="earliest")
    missing = []
    try:
        for p in partitions:
            tp = TopicPartition(p["topic"], int(p["partition"]))
            first = int(p["first_offset"])
            consumer.assign([tp])
            lso = consumer.end_offsets([tp]).get(tp, 0)
            if lso <= first:
                missing.append(f"{tp.topic}-{tp.partition}@{first}")
                continue
            consumer.seek(tp, first)
            seen: Optional[int] = None
            deadline = time.monotonic() + timeout_s
            while seen is None and time.monotonic() < deadline and consumer.position(tp) < lso:
                for records in consumer.poll(timeout_ms=500, max_records=1).values():
                    if records:
                        seen = records[0].offset
            if seen != first:
                missing.append(f"{tp.topic}-{tp.partition}@{first}")
    finally:
        consumer.close()
    return missing


_CLIENTS: dict[tuple, TxnClient] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(config: Mapping[str, Any]) -> TxnClient:
    """A process-wide :class:`TxnClient` per connection config (the commit worker is long-lived)."""
    key = tuple(sorted((k, repr(v)) for k, v in config.items()))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = TxnClient(config)
        return client
