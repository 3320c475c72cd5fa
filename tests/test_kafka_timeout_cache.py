"""The brokers' answers about transaction timeouts: one cache, one key, entries that expire or are forgotten on a
refusal (a long-lived driver notices brokers whose transaction.max.timeout.ms was lowered). No broker."""

from __future__ import annotations

import pyarrow as pa
import pytest

pytest.importorskip("kafka")

from twophase.sinks import _kafka_timeout as kt  # noqa: E402
from twophase.sinks.kafka import KafkaSink  # noqa: E402

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
BASE = {"kafka.bootstrap.servers": "h1:9092", "topic": "out", "checkpointLocation": "/tmp/ck-a"}


class Brokers:
    """accepts_timeout as a broker with ``max_ms`` as transaction.max.timeout.ms; counts the probes."""

    def __init__(self, max_ms: int) -> None:
        self.max_ms, self.asked = max_ms, 0

    def accepts_timeout(self, probe_id: str, timeout_ms: int) -> bool:
        self.asked += 1
        return timeout_ms <= self.max_ms


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_key_for_both_the_chosen_and_the_explicit_answers() -> None:
    cache = kt.TimeoutCache(clock=Clock())
    key = cache.key(("h1:9092",), "p")
    brokers = Brokers(900_000)
    assert kt.choose_default_timeout(brokers, "p-timeout-check", key=key, cache=cache) == 900_000
    asked = brokers.asked
    # the chosen timeout is also an accepted explicit one: no new request
    assert kt.timeout_accepted(brokers, "p-timeout-check", 900_000, key=key, cache=cache)
    assert brokers.asked == asked


def test_k1_a_chosen_timeout_expires_and_a_lowered_broker_maximum_is_noticed() -> None:
    clock = Clock()
    cache = kt.TimeoutCache(clock=clock)
    key = cache.key(("h1:9092",), "p")
    brokers = Brokers(3_600_000)
    assert kt.choose_default_timeout(brokers, "p-timeout-check", key=key, cache=cache) == 3_600_000
    brokers.max_ms = 900_000                       # the operator lowers transaction.max.timeout.ms
    clock.now += kt.TTL_S - 1
    assert kt.choose_default_timeout(brokers, "p-timeout-check", key=key, cache=cache) == 3_600_000  # cached
    clock.now += 2
    assert kt.choose_default_timeout(brokers, "p-timeout-check", key=key, cache=cache) == 900_000
    assert kt.chosen_timeout(key=key, cache=cache) == 900_000


def test_k1_an_explicit_timeout_is_asked_again_after_the_ttl() -> None:
    clock = Clock()
    cache = kt.TimeoutCache(clock=clock)
    key = cache.key(("h1:9092",), "p")
    brokers = Brokers(3_600_000)
    assert kt.timeout_accepted(brokers, "p-timeout-check", 1_800_000, key=key, cache=cache)
    brokers.max_ms = 900_000
    assert kt.timeout_accepted(brokers, "p-timeout-check", 1_800_000, key=key, cache=cache)  # within the TTL
    clock.now += kt.TTL_S + 1
    assert not kt.timeout_accepted(brokers, "p-timeout-check", 1_800_000, key=key, cache=cache)


def test_k1_a_refusal_forgets_the_key() -> None:
    cache = kt.TimeoutCache(clock=Clock())
    key = cache.key(("h1:9092",), "p")
    brokers = Brokers(3_600_000)
    kt.choose_default_timeout(brokers, "p-timeout-check", key=key, cache=cache)
    brokers.max_ms = 600_000
    assert not kt.timeout_accepted(brokers, "p-timeout-check", 1_800_000, key=key, cache=cache)
    assert kt.chosen_timeout(key=key, cache=cache) is None
    assert kt.choose_default_timeout(brokers, "p-timeout-check", key=key, cache=cache) == 600_000


def test_k1_the_sinks_start_check_asks_again_once_the_brokers_refused(monkeypatch) -> None:
    """A producer refused INVALID_TRANSACTION_TIMEOUT (``_timeout_refused``) forgets the process's answers, so the
    next start check of a long-lived driver probes the brokers again instead of trusting the old choice."""
    clock = Clock()
    monkeypatch.setattr(kt, "CACHE", kt.TimeoutCache(clock=clock))
    import twophase.sinks.kafka as kafka_sink
    monkeypatch.setattr(kafka_sink, "_TIMEOUT_CACHE", kt.CACHE)
    brokers = Brokers(3_600_000)
    first = KafkaSink.from_options(BASE, SCHEMA)
    first._check_transaction_timeout(brokers)
    assert first.options.transaction_timeout_ms == 3_600_000
    brokers.max_ms = 900_000
    first._timeout_refused()                        # an executor's producer was refused
    second = KafkaSink.from_options(BASE, SCHEMA)   # the query restarted in the same driver, within the TTL
    second._check_transaction_timeout(brokers)
    assert second.options.transaction_timeout_ms == 900_000


# ---- K2: delivery.timeout.ms <= transaction.timeout.ms (librdkafka refuses a producer otherwise)

def test_k2_an_explicit_delivery_timeout_above_an_explicit_transaction_timeout_is_refused_naming_both() -> None:
    from twophase.errors import ConfigurationError
    raw = {**BASE, "kafka.transaction.timeout.ms": "60000", "kafka.delivery.timeout.ms": "120000"}
    with pytest.raises(ConfigurationError, match=r"kafka\.delivery\.timeout\.ms=120000.*kafka\.transaction\.timeout"
                                                 r"\.ms=60000"):
        KafkaSink.from_options(raw, SCHEMA)
    ok = KafkaSink.from_options({**raw, "kafka.delivery.timeout.ms": "60000"}, SCHEMA)
    assert ok.delivery_timeout_ms(300_000) == 60_000


def test_k2_an_explicit_delivery_timeout_above_the_chosen_transaction_timeout_is_refused_at_start(monkeypatch) -> None:
    from twophase.errors import ConfigurationError
    monkeypatch.setattr(kt, "CACHE", kt.TimeoutCache(clock=Clock()))
    import twophase.sinks.kafka as kafka_sink
    monkeypatch.setattr(kafka_sink, "_TIMEOUT_CACHE", kt.CACHE)
    sink = KafkaSink.from_options({**BASE, "kafka.delivery.timeout.ms": "300000"}, SCHEMA)
    with pytest.raises(ConfigurationError, match=r"kafka\.delivery\.timeout\.ms=300000.*brokers accept \(120000 ms"):
        sink._check_transaction_timeout(Brokers(120_000))


def test_k2_an_unset_delivery_timeout_is_clamped_to_the_transaction_timeout(monkeypatch) -> None:
    monkeypatch.setattr(kt, "CACHE", kt.TimeoutCache(clock=Clock()))
    import twophase.sinks.kafka as kafka_sink
    monkeypatch.setattr(kafka_sink, "_TIMEOUT_CACHE", kt.CACHE)
    sink = KafkaSink.from_options(BASE, SCHEMA)
    sink._check_transaction_timeout(Brokers(120_000))
    assert sink.delivery_timeout_ms(kafka_sink.LIBRDKAFKA_DELIVERY_TIMEOUT_MS) == 120_000  # librdkafka's 300 s
    assert sink.delivery_timeout_ms(120_000) == 120_000
    kt.CACHE.forget(sink._timeout_key())           # other brokers (a new cache entry)
    big = KafkaSink.from_options(BASE, SCHEMA)
    big._check_transaction_timeout(Brokers(3_600_000))
    assert big.delivery_timeout_ms(300_000) == 300_000


def test_k2_librdkafka_takes_the_clamped_delivery_timeout_with_the_chosen_transaction_timeout() -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    import twophase.sinks.kafka as kafka_sink
    sink = KafkaSink.from_options({**BASE, "kafka.transaction.timeout.ms": "60000"}, SCHEMA)
    producer = confluent_kafka.Producer({
        "bootstrap.servers": "127.0.0.1:1", "transactional.id": "t", "transaction.timeout.ms": 60_000,
        "delivery.timeout.ms": sink.delivery_timeout_ms(kafka_sink.LIBRDKAFKA_DELIVERY_TIMEOUT_MS),
        "logger": __import__("logging").getLogger("test.rdkafka")})
    del producer
