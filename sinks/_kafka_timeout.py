"""``kafka.transaction.timeout.ms`` when the user gives none: the largest the brokers accept, up to 1 hour.

Kafka's brokers refuse a producer whose transaction timeout is above their ``transaction.max.timeout.ms``
(15 minutes by default; on managed clusters it often cannot be raised). Flink's fixed 1-hour default makes
a default cluster refuse every job. twophase instead probes, once per process and cluster, with
InitProducerId on the sink's own ``<prefix>-timeout-check`` id (the start check's existing probe; no
DescribeConfigs, which needs an ACL the sink does not otherwise need), from 1 hour down a fixed ladder,
and takes the first timeout accepted. The choice is logged with what it means: a prepared batch must be
committed within it, so the longest batch plus any driver outage must fit; past it the brokers abort the
transactions and the restart raises DataLossError naming the checkpoint (never a silent skip).

An explicit ``kafka.transaction.timeout.ms`` is never changed: refused by the brokers, it stays the start
check's clear error (``KafkaSink._timeout_refused``).
"""

from __future__ import annotations

from typing import Any, Hashable, Optional

from twophase._logging import get_logger
from twophase.errors import ConfigurationError

_log = get_logger(__name__)

#: the timeouts tried, largest first: 1 h (the default), 30, 20, 15 (Kafka's default maximum), 10, 5, 2, 1 min
LADDER_MS: tuple[int, ...] = (3_600_000, 1_800_000, 1_200_000, 900_000, 600_000, 300_000, 120_000, 60_000)

_CHOSEN: dict[Hashable, int] = {}


def choose_default_timeout(client: Any, probe_id: str, *, key: Hashable, sink_id: str = "") -> int:
    """The largest of :data:`LADDER_MS` the brokers accept for ``probe_id`` (cached per ``key``).

    Raises ConfigurationError if they accept none (a broker whose maximum is below one minute)."""
    chosen: Optional[int] = _CHOSEN.get(key)
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
    _CHOSEN[key] = chosen
    _log.info("kafka_transaction_timeout_chosen", sink_id=sink_id, transaction_timeout_ms=chosen,
              capped_by_brokers=chosen < LADDER_MS[0],
              meaning=f"a prepared batch must be committed within {chosen // 60000} min: the longest batch plus any "
                      "driver outage must fit, else the brokers abort it and the restart raises DataLossError; for "
                      "more, raise the brokers' transaction.max.timeout.ms (the sink then takes up to 1 hour) or set "
                      "kafka.transaction.timeout.ms")
    return chosen


def chosen_timeout(*, key: Hashable) -> Optional[int]:
    """The timeout :func:`choose_default_timeout` chose for ``key`` in this process, if it ran (no request)."""
    return _CHOSEN.get(key)


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
