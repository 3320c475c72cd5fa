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
- ``DescribeTransactions`` tells, per transactional id, its state (``Empty``, ``Ongoing``,
  ``PrepareCommit``, ``CompleteCommit``, ...), producer id and epoch (KIP-664); the sink probes ids
  with it before it initialises one (:meth:`TxnClient.describe`; ``None`` where unsupported).
- ``InitProducerId`` with a transaction timeout above the broker's ``transaction.max.timeout.ms``
  answers INVALID_TRANSACTION_TIMEOUT: :meth:`TxnClient.accepts_timeout` asks that once, on the driver.

Outcomes of EndTxn are classified into :class:`EndTxnOutcome` so the sink decides in one place.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from twophase._logging import get_logger
from twophase.errors import ConfigurationError, MissingDependencyError, TransientSinkError

from twophase._versions import require

require("kafka-python", what="twophase-kafka (the driver's transaction requests and offset queries)")
try:
    import kafka.errors as Errors
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
    from kafka.protocol.metadata import CoordinatorType
    from kafka.protocol.admin.transactions import DescribeTransactionsRequest
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

#: errors after which the coordinator is looked up again: it moved (NOT_COORDINATOR), is being elected, or the
#: broker we knew as the coordinator does not answer (SIGKILLed, partitioned: its partition of
#: __transaction_state gets a new leader, and only FindCoordinator names it)
_ASK_AGAIN_WHERE = (Errors.NotCoordinatorError, Errors.CoordinatorNotAvailableError, Errors.KafkaConnectionError,
                    Errors.NodeNotReadyError, Errors.KafkaTimeoutError, Errors.RequestTimedOutError)


class EndTxnOutcome(str, enum.Enum):
    """What the coordinator answered to an EndTxn."""

    OK = "OK"            # done (or done before: a repeated EndTxn with the same epoch)
    FENCED = "FENCED"    # the epoch is stale: fenced, expired or otherwise ended by someone else


#: states in which a transactional id has a transaction open (its data may still be committed)
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})


@dataclass(frozen=True)
class TxnState:
    """What DescribeTransactions says about one transactional id."""

    state: str
    producer_id: int
    epoch: int
    start_ms: int = -1
    #: the topic-partitions the open transaction wrote to (DescribeTransactions' ``topics``), sorted
    partitions: tuple[tuple[str, int], ...] = ()

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES


class _BootstrapErrors(logging.Handler):
    """Keeps the most telling error of kafka-python's failed bootstrap connections (its KafkaTimeoutError names
    none): an authentication or TLS failure wins over the disconnects that follow it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.error: Optional[BaseException] = None
        self.disconnected = False

    def emit(self, record: logging.LogRecord) -> None:
        for arg in record.args if isinstance(record.args, tuple) else ():
            if isinstance(arg, BaseException):
                self.disconnected = self.disconnected or "disconnected" in str(arg)
                if _rank(arg) > _rank(self.error):
                    self.error = arg


def _rank(error: Optional[BaseException]) -> int:
    if error is None:
        return 0
    if isinstance(error, (Errors.SaslAuthenticationFailedError, Errors.UnsupportedSaslMechanismError)) \
            or _is_tls(error):
        return 3
    if isinstance(error, (Errors.KafkaTimeoutError, Errors.RequestTimedOutError)) or "disconnected" in str(error):
        return 1  # says nothing of why: the summary of the bootstrap, or what follows a refused login
    return 2


def _is_tls(error: BaseException) -> bool:
    return "SSL" in str(error) or "certificate" in str(error).lower()


def bootstrap_error(config: Mapping[str, Any], timeout_ms: int, cause: Optional[BaseException], *,
                    disconnected: bool = False) -> ConfigurationError:
    """The start error when no broker could be bootstrapped: an authentication or TLS failure (seen on the
    connection attempts) is named with the options that fix it; else the address or timeout. The broker's
    reason is shown with secrets masked (:func:`twophase._redact.redact_error`)."""
    from twophase._redact import redact_error
    where = f"kafka.bootstrap.servers={config.get('bootstrap_servers')!r}"
    protocol = str(config.get("security_protocol") or "PLAINTEXT")
    reason = "" if cause is None else f" ({type(cause).__name__}: {redact_error(cause, config)})"
    if isinstance(cause, (Errors.SaslAuthenticationFailedError, Errors.UnsupportedSaslMechanismError)):
        return ConfigurationError(
            f"twophase-kafka: the brokers at {where} refused SASL authentication (kafka.security.protocol={protocol}, "
            f"kafka.sasl.mechanism={config.get('sasl_mechanism')}){reason}; check the user name and password in "
            "kafka.sasl.jaas.config (the password is not shown) and that the brokers enable this kafka.sasl.mechanism "
            "for the user")
    if cause is not None and "OAUTHBEARER: token endpoint" in str(cause):   # twophase._kafka_oauth's provider
        return ConfigurationError(
            f"twophase-kafka: no OAUTHBEARER token for the brokers at {where}{reason}; check clientId and "
            "clientSecret in kafka.sasl.jaas.config (the secret is not shown), scope, and "
            "kafka.sasl.oauthbearer.token.endpoint.url")
    if cause is not None and _is_tls(cause):
        return ConfigurationError(
            f"twophase-kafka: the TLS handshake with the brokers at {where} failed (kafka.security.protocol="
            f"{protocol}){reason}; check kafka.ssl.cafile (a PEM file of the CA that signed the brokers' "
            "certificates; or kafka.ssl.truststore.type=PEM with kafka.ssl.truststore.location), "
            "kafka.ssl.check.hostname, that this port is the brokers' SSL / SASL_SSL listener, and where the brokers "
            "require client certificates kafka.ssl.certfile / kafka.ssl.keyfile (or kafka.ssl.keystore.type=PEM with "
            "kafka.ssl.keystore.location)")
    # a connection refused after others were closed mid-handshake (seen under load with a wrong SCRAM password:
    # the broker's answer lost, then a refused reconnect) says no more than the disconnects
    if protocol.startswith("SASL_") and disconnected and (_rank(cause) <= 1 or "ECONNREFUSED" in str(cause)):
        return ConfigurationError(  # the broker's answer to a failed login may be lost as it closes the connection
            f"twophase-kafka: the brokers at {where} closed every connection during the handshake "
            f"(kafka.security.protocol={protocol}, kafka.sasl.mechanism={config.get('sasl_mechanism')}) within "
            f"{timeout_ms} ms{reason}: most often refused SASL authentication; check the user name and password in "
            "kafka.sasl.jaas.config (the password is not shown), that the brokers enable this kafka.sasl.mechanism, "
            "and that this port is the brokers' SASL listener")
    hint = ("; check the address (host:port), that kafka.security.protocol matches the brokers' listener, "
            if cause is not None and protocol != "PLAINTEXT" else "; check the address (host:port) ")
    return ConfigurationError(
        f"twophase-kafka: no Kafka broker answers at {where} within {timeout_ms} ms{reason}{hint}"
        "or raise kafka.bootstrap.timeout.ms")


def bootstrapped(client_class: Any, kwargs: Mapping[str, Any]) -> Any:
    """``client_class(**kwargs)`` (a kafka-python client, which bootstraps in its constructor); a failed bootstrap
    is :func:`bootstrap_error` with the reason seen on the connection attempts."""
    seen = _BootstrapErrors()
    logging.getLogger("kafka.net.manager").addHandler(seen)
    try:
        return client_class(**kwargs)
    except (Errors.KafkaTimeoutError, Errors.KafkaConnectionError, Errors.NodeNotReadyError) as e:
        raise bootstrap_error(kwargs, kwargs.get("bootstrap_timeout_ms", 30000), seen.error,
                              disconnected=seen.disconnected) from e
    finally:
        logging.getLogger("kafka.net.manager").removeHandler(seen)


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
        self.admin = bootstrapped(KafkaAdminClient, kwargs)

    def close(self) -> None:
        self.admin.close()

    # ---- coordinator plumbing

    async def _coordinator(self, transactional_id: str) -> int:
        return await self.admin._find_coordinator_id(transactional_id, CoordinatorType.TRANSACTION)

    async def _find_coordinator_elsewhere(self, transactional_id: str,
                                          heard: Iterable[Any] = ()) -> Optional[tuple[Any, bool]]:
        """FindCoordinator for ``transactional_id`` asked of one broker at a time, to learn who names the
        coordinator (kafka-python's own lookup does not say which broker answered): ``(named, independent)``,
        ``named`` cached as the id's coordinator, ``independent`` when a broker other than ``named`` named it (or
        ``named`` is the only broker of the metadata, still alone after a metadata refresh: no other could have
        taken its partitions over); None if the
        lookup failed on every broker (each one down, paused, timed out, answering an error or an empty
        coordinator list: a failed lookup, never a confirmation).

        A broker resumed after a pause may name itself as the coordinator of a partition it no longer leads
        (issue 22), so an answer naming another broker than the one asked is preferred: the brokers are asked in
        turn (those not in ``heard``, the ones that already called the id unknown, first) until one names another;
        if every answer named its own sender, the first such answer is used (its "unknown" is not trusted by
        :meth:`describe`, its known state is)."""
        from kafka.protocol.metadata import FindCoordinatorRequest
        manager = self.admin._manager
        heard = set(heard)
        brokers = sorted(b.node_id for b in manager.cluster.brokers())
        order = [n for n in brokers if n not in heard] + [n for n in brokers if n in heard]
        v4 = manager.broker_version_data.api_version(FindCoordinatorRequest) >= 4
        self_named: Optional[Any] = None
        for namer in order:
            if v4:
                request = FindCoordinatorRequest(key_type=CoordinatorType.TRANSACTION.value,
                                                 coordinator_keys=[transactional_id], min_version=4)
            else:
                request = FindCoordinatorRequest(key=transactional_id, key_type=CoordinatorType.TRANSACTION.value,
                                                 max_version=3)
            try:
                response = await manager.send(request, node_id=namer)
                rows = list(response.coordinators) if hasattr(response, "coordinators") else [response]
                if not rows:
                    raise Errors.CoordinatorNotAvailableError("FindCoordinator answered no coordinator")
                error = Errors.for_code(rows[0].error_code)
                if error is not Errors.NoError:
                    raise error(f"FindCoordinator answered {error.__name__}")
            except (Errors.KafkaError, OSError) as e:
                _log.info("find_coordinator_elsewhere_failed", transactional_id=transactional_id, node=namer,
                          error=type(e).__name__)
                continue
            if rows[0].node_id != namer:
                node = manager.cluster.add_coordinator(rows[0], CoordinatorType.TRANSACTION, transactional_id,
                                                       synthesize_node_id=False)
                return node, True
            if self_named is None:
                self_named = rows[0]
        if self_named is None:
            return None
        node = manager.cluster.add_coordinator(self_named, CoordinatorType.TRANSACTION, transactional_id,
                                               synthesize_node_id=False)
        if len(brokers) != 1:
            return node, False
        # one broker in the metadata: it may be a view from while the others were fenced (kept up to
        # metadata_max_age_ms), not a single-broker cluster; its own naming stands only if a fresh metadata still
        # lists it alone (review 15: a stale broker's list taken at its pause names the brokers alive then)
        try:
            await manager.cluster.refresh_metadata()
        except (Errors.KafkaError, OSError) as e:
            _log.info("find_coordinator_elsewhere_metadata_failed", transactional_id=transactional_id,
                      error=type(e).__name__)
            return node, False
        return node, sorted(b.node_id for b in manager.cluster.brokers()) == brokers

    def _forget_coordinator(self, transactional_id: str) -> None:
        coords = getattr(self.admin._manager.cluster, "_coordinators", None)
        if isinstance(coords, dict):
            coords.pop((CoordinatorType.TRANSACTION, transactional_id), None)

    def _call(self, transactional_id: str, build: Any, what: str) -> type:
        """Send ``build()`` to the id's coordinator, retrying retriable errors; returns the error class."""
        return self._call_response(transactional_id, build, what)[0]

    def _call_response(self, transactional_id: str, build: Any, what: str) -> tuple[type, Any]:
        """:meth:`_call`, also returning the final response (None if the last attempt raised)."""
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
                    *_RETRIABLE) as e:  # FindCoordinator raises (e.g. CoordinatorNotAvailable while Kafka creates
                error, response = type(e), None  # __transaction_state on a new cluster): retried like an error
            if error in _RETRIABLE or error in (Errors.KafkaConnectionError, Errors.NodeNotReadyError,
                                                Errors.KafkaTimeoutError):
                if error in _ASK_AGAIN_WHERE:  # the coordinator moved, or its broker is gone: FindCoordinator again
                    self._forget_coordinator(transactional_id)
                if time.monotonic() > deadline:
                    raise TransientSinkError(f"twophase-kafka: {what} for transactional id {transactional_id!r} "
                                             f"still failing with {error.__name__} after {self.retry_deadline_s}s")
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            return error, response

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
        """InitProducerId for ``transactional_id``: bump its epoch, aborting what it had open (retried by
        :meth:`_call` like every other request: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, a lost
        connection)."""
        def build() -> Any:
            return InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=timeout_ms,
                                         producer_id=-1, producer_epoch=-1, max_version=4)

        error, response = self._call_response(transactional_id, build, "fencing (InitProducerId)")
        if error is Errors.NoError:
            return response.producer_id, response.producer_epoch
        raise TransientSinkError(f"twophase-kafka: fencing transactional id {transactional_id!r} failed: "
                                 f"{error.__name__}")

    #: pause before asking again about an id whose "unknown" could not be confirmed (issue 22: a broker resumed
    #: after a pause may answer for a __transaction_state partition it no longer leads until its metadata catches up)
    UNKNOWN_RECHECK_PAUSE_S = 0.3

    def describe(self, transactional_ids: Iterable[str]) -> Optional[dict[str, Optional[TxnState]]]:
        """``{id: TxnState or None (unknown to the coordinator)}``; None if the broker cannot describe.

        Retriable coordinator errors are retried for ``retry_deadline_s``, then TransientSinkError.

        "Unknown" (TRANSACTIONAL_ID_NOT_FOUND) is trusted only when confirmed (issue 22): a broker resumed after
        a pause (SIGSTOP, a long GC) may still believe it leads the id's ``__transaction_state`` partition, name
        itself as the coordinator and call unknown an id whose transaction another broker, the coordinator
        meanwhile, holds open; the attempt-slot probe (invariant 4) would take that id as free and its
        InitProducerId abort the open transaction. The rule: **"unknown" from node X is trusted only when X was
        named coordinator by a broker other than X** (FindCoordinator asked of one broker at a time,
        :meth:`_find_coordinator_elsewhere`; a single-broker cluster's own naming stands, when a metadata
        refresh still lists that broker alone: no broker could have taken its partitions over), in a round after
        a first "unknown". So after a first "unknown"
        (from the cached or kafka-python-looked-up coordinator, whose namer is not known) the coordinator is
        forgotten, looked up broker by broker and the id asked again. A known state is trusted from any node.
        A round whose lookup failed on every broker, or in which only self-named coordinators answered
        "unknown", confirms nothing: the id is asked again after :attr:`UNKNOWN_RECHECK_PAUSE_S`, and at the
        deadline TransientSinkError (the task fails and is re-run), never "unknown".

        Covered: one stale broker at a time, in any cluster size: it names only itself, so its "unknown" needs
        another broker's naming; in a 2-broker cluster whose only other broker is paused (the lookup fails) or
        stale too (it names itself: asked first as the one not yet heard, its known state is trusted; two
        self-named "unknown"s are not) "unknown" waits until the stale one catches up and names the other (seconds
        after a resume; TransientSinkError if not within the deadline). Not covered: two brokers stale at
        once, paused together while a third took the partition over, one's stale metadata naming the other
        (which answers "unknown"): it takes three or more brokers and two overlapping pauses that both began while
        the same one led the partition (a 2-broker cluster cannot get there: with both fenced the partition has no
        leader, so no transaction was opened elsewhere).

        Known ids cost nothing more; unknown ids (a query's first two checkpoints, a batch write's run) cost one
        round of lookups (usually one FindCoordinator) and a second DescribeTransactions.
        """
        ids = list(transactional_ids)
        if not ids:
            return {}
        deadline = time.monotonic() + self.retry_deadline_s
        out: dict[str, Optional[TxnState]] = {}
        doubted: dict[str, list[Any]] = {}   # id -> the nodes that called it unknown, in order
        unconfirmed: dict[str, str] = {}     # id -> why its last confirmation round confirmed nothing
        pending = list(ids)
        while True:
            asking = list(pending)
            confirming = [t for t in asking if t in doubted]

            async def go() -> tuple[dict[str, Any], dict[str, bool]]:
                named_by: dict[str, bool] = {}   # id -> whether another broker named its coordinator
                for tid in confirming:
                    found = await self._find_coordinator_elsewhere(tid, doubted[tid])
                    if found is not None:
                        named_by[tid] = found[1]
                ask = [t for t in asking if t not in doubted or t in named_by]
                coords = await self.admin._find_coordinator_ids(ask, key_type=CoordinatorType.TRANSACTION) \
                    if ask else {}
                by_node: dict[int, list[str]] = {}
                for tid, node in coords.items():
                    by_node.setdefault(node, []).append(tid)
                rows: dict[str, Any] = {}
                for node, tids in by_node.items():
                    response = await self.admin._manager.send(
                        DescribeTransactionsRequest(transactional_ids=tids), node_id=node)
                    for row in response.transaction_states:
                        rows[row.transactional_id] = (node, row)
                for tid, node in coords.items():
                    rows.setdefault(tid, (node, None))
                return rows, named_by
            try:
                rows, named_by = self.admin._manager.run(go)
            except (Errors.UnsupportedVersionError, Errors.IncompatibleBrokerVersion, NotImplementedError) as e:
                _log.info("describe_transactions_unsupported", error=str(e))
                return None
            except (Errors.KafkaConnectionError, Errors.NodeNotReadyError, Errors.KafkaTimeoutError,
                    Errors.RequestTimedOutError, *_RETRIABLE) as e:
                if time.monotonic() > deadline:
                    raise TransientSinkError(f"twophase-kafka: DescribeTransactions still failing with "
                                             f"{type(e).__name__} after {self.retry_deadline_s}s") from e
                for tid in asking:
                    self._forget_coordinator(tid)
                time.sleep(0.1)
                continue
            pause = 0.0
            for tid in asking:
                if tid not in rows:      # a confirmation round whose lookup failed on every broker
                    unconfirmed[tid] = "FindCoordinator failed on every broker"
                    pause = max(pause, self.UNKNOWN_RECHECK_PAUSE_S)
                    continue
                node, row = rows[tid]
                error = Errors.for_code(row.error_code) if row is not None else Errors.TransactionalIdNotFoundError
                if error is Errors.NoError:
                    parts = tuple(sorted((str(t.topic), int(p)) for t in (getattr(row, "topics", None) or ())
                                         for p in (t.partitions or ())))
                    out[tid] = TxnState(str(row.transaction_state), int(row.producer_id), int(row.producer_epoch),
                                        int(row.transaction_start_time_ms), parts)
                    if tid in doubted:
                        _log.warning("describe_unknown_not_confirmed", transactional_id=tid, unknown_at=doubted[tid],
                                     known_at=node, state=out[tid].state,
                                     consequence="a stale coordinator's answer was not trusted")
                elif error is Errors.TransactionalIdNotFoundError:
                    independent = named_by.get(tid)
                    if independent:
                        out[tid] = None      # confirmed: named coordinator by another broker (issue 22)
                        continue
                    doubted.setdefault(tid, []).append(node)
                    self._forget_coordinator(tid)
                    if independent is False:  # only self-named coordinators answered: wait for them to catch up
                        unconfirmed[tid] = f"only node {node}, which named itself coordinator, answered unknown"
                        pause = max(pause, self.UNKNOWN_RECHECK_PAUSE_S)
                elif error in _RETRIABLE:
                    self._forget_coordinator(tid)
                    pause = max(pause, 0.1)
                else:
                    raise TransientSinkError(f"twophase-kafka: DescribeTransactions({tid!r}) failed: {error.__name__}")
            pending = [t for t in ids if t not in out]
            if not pending:
                return {t: out[t] for t in ids}
            if time.monotonic() > deadline:
                why = "; ".join(f"{t!r}: {unconfirmed[t]}" for t in pending if t in unconfirmed)
                raise TransientSinkError(
                    f"twophase-kafka: DescribeTransactions of {', '.join(map(repr, pending))} still retrying after "
                    f"{self.retry_deadline_s}s" + (f" (an \"unknown transactional id\" answer is trusted only from a "
                                                   f"coordinator another broker named; {why})" if why else ""))
            if pause:
                time.sleep(pause)

    def accepts_timeout(self, transactional_id: str, timeout_ms: int) -> bool:
        """Whether the broker takes ``timeout_ms`` as a transaction timeout (InitProducerId on
        ``transactional_id``, which must be an id nothing else uses: it is initialised)."""
        try:
            self.fence(transactional_id, timeout_ms)
        except TransientSinkError as e:
            if "InvalidTransactionTimeout" in str(e):
                return False
            raise
        return True

    def list_transactions(self, prefix: str, states: Iterable[str] = ("Ongoing",)) -> Optional[list[tuple[str, int, str]]]:
        """``[(transactional_id, producer_id, state)]`` under ``prefix``; None if the broker cannot list.

        Every broker of the metadata must answer (each lists the transactions of the coordinator partitions it
        leads): a broker that does not (SIGKILLed, not yet fenced by the controller) or answers
        COORDINATOR_LOAD_IN_PROGRESS (it is loading a partition it just took over) is asked again, with fresh
        metadata, for ``retry_deadline_s`` (then TransientSinkError), never skipped: a listing without it would
        miss the open transactions it coordinates. Before: one broker down failed the sweep at the next batch."""
        deadline = time.monotonic() + self.retry_deadline_s
        delay = 0.05
        while True:
            try:
                listing = self.admin.list_transactions(state_filters=list(states))
                break
            except (Errors.UnsupportedVersionError, Errors.IncompatibleBrokerVersion, NotImplementedError) as e:
                _log.info("list_transactions_unsupported", error=str(e))
                return None
            except (Errors.KafkaConnectionError, Errors.NodeNotReadyError, Errors.KafkaTimeoutError,
                    *_RETRIABLE) as e:
                if time.monotonic() > deadline:
                    raise TransientSinkError(f"twophase-kafka: ListTransactions still failing with "
                                             f"{type(e).__name__} after {self.retry_deadline_s}s") from e
                _log.info("list_transactions_retry", error=type(e).__name__)
                self.admin._manager.cluster.request_update()   # a fenced broker leaves the metadata
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
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


def stable_offsets(config: Mapping[str, Any], partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """``{(topic, partition): (last stable offset, high watermark)}``: the end offsets a read_committed
    and a read_uncommitted reader see. An open transaction holds the LSO at its first record; when no
    transaction is open on the partition both are equal."""
    tps = sorted({(str(t), int(p)) for t, p in partitions})
    if not tps:
        return {}
    consumer_keys = set(KafkaConsumer.DEFAULT_CONFIG)
    kwargs = {k: v for k, v in config.items() if k in consumer_keys}
    ends: dict[str, dict[TopicPartition, int]] = {}
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = KafkaConsumer(**kwargs, isolation_level=isolation, enable_auto_commit=False, group_id=None)
        try:
            ends[isolation] = consumer.end_offsets([TopicPartition(t, p) for t, p in tps])
        finally:
            consumer.close()
    return {(t, p): (int(ends["read_committed"].get(TopicPartition(t, p), -1)),
                     int(ends["read_uncommitted"].get(TopicPartition(t, p), -1))) for t, p in tps}


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
