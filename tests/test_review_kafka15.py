"""Review 15 of 35d47d4 (TxnClient.describe trusts "unknown" only from a coordinator another broker named) and of
6a391ce / 960822a (the Kafka source's librdkafka-only ``kafka.*`` options).

A: drives the real :meth:`TxnClient.describe` over the fake admin of tests/test_kafka_describe_stale_coordinator.py
(a protocol unit, the one place a fake is allowed). B: the source's options, librdkafka configured, never connected
(no broker)."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("kafka")

from tests.test_kafka_describe_stale_coordinator import NEW, OPEN, OTHER, STALE, _Admin, _client  # noqa: E402
from twophase.errors import TransientSinkError  # noqa: E402


# ---- A: the "one broker in the metadata" exception

def test_single_broker_metadata_of_a_multi_broker_cluster_never_confirms_a_stale_unknown() -> None:
    """Review 15 finding A1: the single-broker exception trusted the client's cached broker count. A client whose
    metadata was last refreshed while the other brokers were fenced (up to metadata.max.age.ms = 5 min earlier, or
    a driver started then: a 2-broker cluster with dedicated controllers, one broker restarted) lists only the
    resumed stale broker, which names itself: its "unknown" was trusted and the attempt-slot probe's InitProducerId
    aborts the transaction open on the new coordinator. Now the metadata is refreshed before a lone broker's own
    naming stands."""
    tid = "t-rv15-single"
    admin = _Admin({NEW: {tid: OPEN}}, cached={tid: STALE}, nodes=(STALE,))   # the client's metadata: STALE only
    admin.refreshed_nodes = (STALE, NEW)    # what a metadata refresh answers (STALE's view at its pause: NEW alive)
    try:
        out = _client(admin, deadline_s=1.0).describe([tid])
    except TransientSinkError:
        return
    assert out[tid] is not None, f"the stale broker's own naming confirmed 'unknown' (asked: {admin.asked})"


def test_single_broker_metadata_still_single_after_a_refresh_stands() -> None:
    """A real single-broker cluster: the refresh lists the one broker again; its own naming stands (one refresh)."""
    tid = "t-rv15-one"
    admin = _Admin({NEW: {}}, cached={tid: NEW}, nodes=(NEW,))
    admin.stale = set()
    assert _client(admin).describe([tid]) == {tid: None}
    assert admin.refreshes == 1


def test_a_coordinator_named_outside_the_metadata_is_asked_and_its_known_state_trusted() -> None:
    """Metadata missing the new coordinator (STALE and OTHER listed): OTHER names NEW, NEW is asked (not in the
    metadata: kafka-python connects to the coordinator's host from the FindCoordinator answer)."""
    tid = "t-rv15-outside"
    admin = _Admin({NEW: {tid: OPEN}}, cached={tid: STALE}, nodes=(STALE, OTHER))
    out = _client(admin).describe([tid])
    assert out[tid] == OPEN
    assert admin.elsewhere[0] == OTHER and admin.asked[-1] == (NEW, (tid,))


def test_a_truly_unknown_id_is_confirmed_by_a_lookup_that_never_asks_the_doubting_broker_first() -> None:
    """Healthy cluster, NEW the coordinator, the id truly unknown: one lookup, asked of a broker other than NEW."""
    tid = "t-rv15-free"
    admin = _Admin({}, cached={tid: NEW}, nodes=(STALE, NEW, OTHER))
    admin.stale = set()
    assert _client(admin).describe([tid]) == {tid: None}
    assert admin.elsewhere == [STALE]          # the first broker not heard, which names NEW


def test_every_other_broker_paused_during_the_lookup_never_confirms() -> None:
    """Cached STALE says unknown; both other brokers paused during the lookup: only STALE answers (naming itself)."""
    tid = "t-rv15-paused"
    admin = _Admin({NEW: {tid: OPEN}}, cached={tid: STALE}, nodes=(STALE, NEW, OTHER))
    admin.down = {NEW, OTHER}
    with pytest.raises(TransientSinkError, match="trusted only from a coordinator another broker named"):
        _client(admin, deadline_s=1.0).describe([tid])


# ---- B: librdkafka-only options

pytest.importorskip("confluent_kafka")

BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}


@pytest.mark.parametrize("alias, value, owned", [("auto.commit.enable", "true", "enable.auto.commit"),
                                                 ("enable.auto.offset.store", "true", None),
                                                 ("enable.partition.eof", "false", None)])
def test_source_owned_librdkafka_properties_are_refused_or_overridden(alias, value, owned) -> None:
    from twophase.errors import ConfigurationError
    from twophase.sources.kafka import KafkaSourceOptions
    try:
        o = KafkaSourceOptions.from_options({**BASE, f"kafka.{alias}": value})
    except ConfigurationError:
        return
    cfg = list(o.librdkafka_consumer_config().items())
    keys = [k for k, _ in cfg]
    assert owned is not None and keys.index(owned) > keys.index(alias) and dict(cfg)[owned] is False


@pytest.mark.parametrize("debug", ["conf", "all", "security,broker"])
def test_librdkafka_debug_logs_of_the_reader_carry_no_secret(debug) -> None:
    """kafka.debug (librdkafka-only) makes the reader log its configuration: the SASL password never appears."""
    from confluent_kafka import Consumer

    from twophase.sources._kafka_source_options import LIBRDKAFKA_LOGGER
    from twophase.sources.kafka import KafkaSourceOptions
    lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
    log = logging.getLogger(LIBRDKAFKA_LOGGER)
    keep, level = _Keep(), log.level
    log.addHandler(keep)
    log.setLevel(logging.DEBUG)
    try:
        o = KafkaSourceOptions.from_options({
            **BASE, "kafka.debug": debug, "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                      'username="u" password="S3cr3tPW-rv15";'})
        c = Consumer(o.librdkafka_consumer_config())
        c.poll(0.5)
        c.close()
    finally:
        log.removeHandler(keep)
        log.setLevel(level)
    assert lines and not [line for line in lines if "S3cr3tPW-rv15" in line]
    assert "S3cr3tPW-rv15" not in repr(o)


@pytest.mark.parametrize("name", ["kafka.ssl_key", "kafka.ssl_certificate"])
def test_a_private_key_under_a_refused_librdkafka_name_is_not_echoed(name) -> None:
    """Review 15 finding B1: an option librdkafka refuses by its name (internal ``ssl_key``, unknown names) was
    echoed with its value, a PEM private key here, in the ConfigurationError (Spark logs it); the value does not
    matter to a name refused, so it is not shown."""
    from twophase.errors import ConfigurationError
    from twophase.sources.kafka import KafkaSourceOptions
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw-rv15\n-----END PRIVATE KEY-----"
    with pytest.raises(ConfigurationError) as e:
        KafkaSourceOptions.from_options({**BASE, name: pem})
    assert "MIIEvQ" not in str(e.value) and repr(name) in str(e.value)


def test_an_invalid_value_of_a_known_librdkafka_property_is_still_shown() -> None:
    from twophase.errors import ConfigurationError
    from twophase.sources.kafka import KafkaSourceOptions
    with pytest.raises(ConfigurationError, match="abc"):
        KafkaSourceOptions.from_options({**BASE, "kafka.fetch.wait.max.ms": "abc"})


@pytest.mark.parametrize("name, value", [("kafka.enable.ssl.certificate.verification", "false"),
                                         ("kafka.enable.sasl.oauthbearer.unsecure.jwt", "true"),
                                         ("kafka.https.ca.location", "/tmp/ca.pem"),
                                         ("kafka.ssl_engine_id", "dynamic")])   # the sink refuses ssl_ already
def test_librdkafka_only_security_names_without_the_ssl_sasl_prefix_are_refused(name, value) -> None:
    """Review 15 finding B2: the connection / security names librdkafka alone has are refused (the driver's
    kafka-python connections must use the same settings), but those not starting with ssl./sasl./security. were
    taken: kafka.enable.ssl.certificate.verification=false turned TLS verification off on the executors' readers
    only, silently."""
    from twophase.errors import ConfigurationError
    from twophase.sources.kafka import KafkaSourceOptions
    with pytest.raises(ConfigurationError, match="librdkafka-only connection setting"):
        KafkaSourceOptions.from_options({**BASE, name: value})
