"""``kafka.transaction.timeout.ms`` when the user gives none: the largest the brokers accept, up to 1 hour.

Kafka's brokers refuse a producer whose transaction timeout is above their ``transaction.max.timeout.ms``
(15 minutes by default; on managed clusters it often cannot be raised). Flink's fixed 1-hour default makes
a default cluster refuse every job. twophase instead probes, once per process and cluster, with
InitProducerId on the sink's own ``<prefix>-timeout-check`` id (the start check's existing probe; no
DescribeConfigs, which needs an ACL the sink does not otherwise need), from 1 hour down a fixed ladder,
and takes the first timeout accepted. The choice is logged with what it means: a prepared batch must be
committed within it, so the longest batch plus any driver outage must fit; past it the brokers abort the
transactions and the restart raises DataLossError naming the checkpoint (never a silent skip).

One cache (:data:`CACHE`, keyed by :meth:`TimeoutCache.key`: the bootstrap servers and the id prefix) holds both
what was chosen and which explicit timeouts the brokers accepted. Its entries expire after
:data:`TTL_S` (10 minutes) and are forgotten when a broker refuses a timeout, so a long-lived driver notices
brokers whose ``transaction.max.timeout.ms`` was lowered since it last asked.

An explicit ``kafka.transaction.timeout.ms`` is never changed: refused by the brokers, it stays the start
check's clear error (``KafkaSink._timeout_refused``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Optional

from twophase._logging import get_logger
from twophase.errors import ConfigurationError

_log = get_logger(__name__)

#: the timeouts tried, largest first: 1 h (the default), 30, 20, 15 (Kafka's default maximum), 10, 5, 2, 1 min
LADDER_MS: tuple[int, ...] = (3_600_000, 1_800_000, 1_200_000, 900_000, 600_000, 300_000, 120_000, 60_000)

#: how long a broker's answer is trusted before it is asked again (a lowered transaction.max.timeout.ms)
TTL_S = 600.0


@dataclass
class _Entry:
    accepted: dict[int, float] = field(default_factory=dict)  # timeout -> when the brokers accepted it
    chosen: Optional[int] = None                               # the default chosen (of ``accepted``), if any


class TimeoutCache:
    """What the brokers of one (servers, prefix) accepted, each answer trusted for ``ttl_s``."""

    def __init__(self, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._entries: dict[Hashable, _Entry] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(bootstrap_servers: Iterable[str], prefix: str) -> Hashable:
        """The one key of the cache: the brokers (as given, order kept) and the transactional id prefix."""
        return (tuple(bootstrap_servers), prefix)

    def accepted(self, key: Hashable, timeout_ms: int) -> bool:
        """Whether the brokers accepted ``timeout_ms`` less than ``ttl_s`` ago."""
        with self._lock:
            entry = self._entries.get(key)
            at = entry.accepted.get(timeout_ms) if entry else None
            return at is not None and self.clock() - at < self.ttl_s

    def record(self, key: Hashable, timeout_ms: int, *, chosen: bool = False) -> None:
        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
            entry.accepted[timeout_ms] = self.clock()
            if chosen:
                entry.chosen = timeout_ms

    def chosen(self, key: Hashable, *, fresh: bool = True) -> Optional[int]:
        """The default chosen for ``key``; with ``fresh``, only if its acceptance has not expired."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.chosen is None:
                return None
        if fresh and not self.accepted(key, entry.chosen):
            return None
        return entry.chosen

    def forget(self, key: Hashable) -> None:
        """Drop every answer for ``key`` (a broker refused a timeout: ask again next time)."""
        with self._lock:
            self._entries.pop(key, None)


#: the process's cache (the driver's start checks; an executor's producers)
CACHE = TimeoutCache()


def choose_default_timeout(client: Any, probe_id: str, *, key: Hashable, sink_id: str = "",
                           cache: Optional[TimeoutCache] = None) -> int:
    """The largest of :data:`LADDER_MS` the brokers accept for ``probe_id`` (cached per ``key`` for ``TTL_S``).

    Raises ConfigurationError if they accept none (a broker whose maximum is below one minute)."""
    cache = CACHE if cache is None else cache
    chosen: Optional[int] = cache.chosen(key)
    if chosen is not None:
        return chosen
    for timeout in LADDER_MS:
        if client.accepts_timeout(probe_id, timeout):
            chosen = timeout
            break
    if chosen is None:
        raise ConfigurationError(
            "twophase-kafka: the brokers accept no transaction timeout of one minute or more (their "
            "transaction.max.timeout.ms is below 60000): raise it on the brokers, or set kafka.transaction.timeout.ms "
            "to a value they accept that still outlives the longest batch")
    cache.record(key, chosen, chosen=True)
    _log.info("kafka_transaction_timeout_chosen", sink_id=sink_id, transaction_timeout_ms=chosen,
              capped_by_brokers=chosen < LADDER_MS[0],
              meaning=f"a prepared batch must be committed within {chosen // 60000} min: the longest batch plus any "
                      "driver outage must fit, else the brokers abort it and the restart raises DataLossError; for "
                      "more, raise the brokers' transaction.max.timeout.ms (the sink then takes up to 1 hour) or set "
                      "kafka.transaction.timeout.ms")
    return chosen


def timeout_accepted(client: Any, probe_id: str, timeout_ms: int, *, key: Hashable,
                     cache: Optional[TimeoutCache] = None) -> bool:
    """Whether the brokers accept an explicit ``timeout_ms`` (asked at most once per ``TTL_S``; a refusal
    forgets every answer for ``key``)."""
    cache = CACHE if cache is None else cache
    if cache.accepted(key, timeout_ms):
        return True
    if not client.accepts_timeout(probe_id, timeout_ms):
        cache.forget(key)
        return False
    cache.record(key, timeout_ms)
    return True


def chosen_timeout(*, key: Hashable, cache: Optional[TimeoutCache] = None) -> Optional[int]:
    """The timeout :func:`choose_default_timeout` last chose for ``key`` in this process, if it ran (no request;
    possibly older than ``TTL_S``: the best known without asking)."""
    return (CACHE if cache is None else cache).chosen(key, fresh=False)


def check_timeout_against_trigger(timeout_ms: int, interval_ms: int, *, chosen: bool = False) -> None:
    """A transaction timeout shorter than two trigger intervals loses prepared batches: refuse it."""
    if timeout_ms >= 2 * interval_ms:
        return
    what = (f"the largest transaction timeout the brokers accept ({timeout_ms} ms, chosen because "
            "kafka.transaction.timeout.ms is not set)" if chosen else f"kafka.transaction.timeout.ms={timeout_ms}")
    raise ConfigurationError(
        f"twophase-kafka: {what} is shorter than two trigger intervals ({interval_ms} ms): the broker would abort "
        "prepared transactions before the driver commits them (data loss). Raise kafka.transaction.timeout.ms "
        "(<= the brokers' transaction.max.timeout.ms) or shorten the trigger")


def check_delivery_timeout(delivery_ms: int, timeout_ms: int, *, chosen: bool = False) -> None:
    """An explicit ``kafka.delivery.timeout.ms`` above the transaction timeout is refused: librdkafka requires
    ``delivery.timeout.ms <= transaction.timeout.ms`` (a record may not outlive its transaction). One the user did
    not set is clamped instead (:func:`delivery_timeout_for`)."""
    if delivery_ms <= timeout_ms:
        return
    what = (f"the largest transaction timeout the brokers accept ({timeout_ms} ms, chosen because "
            "kafka.transaction.timeout.ms is not set)" if chosen else f"kafka.transaction.timeout.ms={timeout_ms}")
    raise ConfigurationError(
        f"twophase-kafka: kafka.delivery.timeout.ms={delivery_ms} is above {what}: a record must be delivered "
        "within its transaction (librdkafka refuses delivery.timeout.ms > transaction.timeout.ms). Lower "
        f"kafka.delivery.timeout.ms to at most {timeout_ms}, or raise kafka.transaction.timeout.ms (<= the brokers' "
        "transaction.max.timeout.ms)")


def delivery_timeout_for(explicit_ms: Optional[int], client_default_ms: int, timeout_ms: int) -> int:
    """The delivery timeout a transactional producer gets: the user's (checked by :func:`check_delivery_timeout`),
    else the client's default clamped to the transaction timeout."""
    return explicit_ms if explicit_ms is not None else min(client_default_ms, timeout_ms)
