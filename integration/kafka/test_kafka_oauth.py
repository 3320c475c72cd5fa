"""SASL/OAUTHBEARER end to end against Apache Kafka's own OIDC validator (``OAuthBearerValidatorCallbackHandler``)
pointed at a JWKS endpoint the test serves (:mod:`integration.kafka.oauth_kafka`), with Spark's option names:

- the sink's librdkafka and kafka-python writers and the driver's raw transaction client (EndTxn, InitProducerId,
  DescribeTransactions) all authenticate with tokens from the test's token endpoint (client credentials); a
  read_committed consumer sees every record once; the source (both readers) reads them back;
- the client secret and every token the endpoint minted appear in no error, repr, log record or file the sink
  wrote (transaction log, prefix registry, checkpoint);
- a wrong client secret (the endpoint refuses it) and a token the broker cannot verify (signed by another key) fail
  at start with a ConfigurationError naming the cause and the option, never a hang."""

from __future__ import annotations

import logging
import os

import pytest

from integration.kafka.broker import committed_values, create_topic, key_value_batch, unique
from integration.kafka.oauth_kafka import CLIENTS, oauth_kafka_broker, spark_options

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

WRITERS = ("librdkafka", "kafka-python")
SECRET = CLIENTS["twophase-app"]


@pytest.fixture(scope="module")
def oauth():
    with oauth_kafka_broker() as k:
        yield k


def _secrets(k) -> list[str]:
    return [SECRET, *k.idp.tokens]


def _assert_nothing_secret(k, caplog, *texts: str, root: str = "") -> None:
    """No client secret or minted token in ``texts``, in any captured record (twophase's at every level, the client
    libraries' at INFO and above: kafka-python's DEBUG wire trace shows SASL bytes), nor in any file under ``root``."""
    secrets = _secrets(k)
    assert len(secrets) > 1 or not k.idp.tokens
    for text in texts:
        leaked = [s[:12] for s in secrets if s in text]
        assert not leaked, f"secret/token {leaked}... in {text[:500]}"
    for r in caplog.records:
        if r.name.startswith("kafka.") and r.levelno < logging.INFO:
            continue
        shown = f"{r.getMessage()} {r.__dict__}"
        assert not [s for s in secrets if s in shown], r.name
    if root:
        for dirpath, _, files in os.walk(root):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as f:
                    data = f.read()
                assert not [s for s in secrets if s.encode() in data], os.path.join(dirpath, name)


def _sink_options(k, tmp_path, topic, client, **kw):
    return {**spark_options(k, **kw), "topic": topic, "checkpointLocation": str(tmp_path / f"ck-{client}"),
            "prefixRegistry": str(tmp_path / "registry"), "transactionalIdPrefix": unique("oauth"),
            "kafkaClient": client, "kafka.bootstrap.timeout.ms": "10000"}


def test_kafka_oauthbearer_sink_every_client_commits_once_and_source_reads_back_without_showing_secrets(
        oauth, tmp_path, caplog):
    from twophase.coordinator import CheckpointCoordinator
    from twophase.sink import TransactionContext, run_task
    from twophase.sinks.kafka import KafkaSink
    from twophase.sources.kafka import KafkaSource
    from twophase.spark.datasource import prepare_sink

    caplog.set_level(logging.DEBUG)
    topic = create_topic(oauth.plaintext, unique("oauth"), 2)
    expected, texts = [], []
    for client in WRITERS:
        raw = _sink_options(oauth, tmp_path, topic, client)
        sink = KafkaSink.from_options(raw)
        granted = sum(r["granted"] for r in oauth.idp.requests)
        prepare_sink(sink, raw["checkpointLocation"], what="oauth test")  # the driver's start check (kafka-python)
        acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t), 0), [key_value_batch(f"{client}{t}", 5)])
                for t in range(2)]
        # the driver's EndTxn goes through TxnClient: it authenticates with OAUTHBEARER too
        assert CheckpointCoordinator(sink).complete_batch(0, acks, ["0", "1"]) == "COMMITTED"
        assert sum(r["granted"] for r in oauth.idp.requests) > granted, "no token was asked for"
        expected += [f"{client}{t}-{i}".encode() for t in range(2) for i in range(5)]
        texts += [repr(sink), str(sink), repr(sink.options), repr(acks), repr(sink.options.producer_config)]
    assert committed_values(oauth.plaintext, topic) == sorted(expected)

    for client in WRITERS:
        source = KafkaSource.from_options({**spark_options(oauth), "subscribe": topic, "kafkaClient": client,
                                           "startingOffsets": "earliest"})
        try:
            start = source.initial_offset()
            end = source.latest_offset(start)
            reader = source.reader()
            values = [v for split in source.splits(start, end) for batch in reader.read(split)
                      for v in batch.to_pydict()["value"]]
            texts += [repr(source), repr(getattr(source, "options", ""))]
        finally:
            source.close()
        assert sorted(values) == sorted(expected), client
    assert all(r["client_id"] == "twophase-app" for r in oauth.idp.requests)
    _assert_nothing_secret(oauth, caplog, *texts, root=str(tmp_path))


@pytest.mark.parametrize("side", ["sink", "source"])
def test_kafka_oauthbearer_wrong_client_secret_fails_at_start_naming_the_token_endpoint(oauth, side, tmp_path,
                                                                                       caplog):
    """The token endpoint refuses the client credentials: a ConfigurationError at start (the sink's start check,
    the source's first offset query) naming the endpoint's refusal and kafka.sasl.jaas.config; the secret is in no
    error text and no log record."""
    from twophase.errors import ConfigurationError
    from twophase.sinks.kafka import KafkaSink
    from twophase.sources.kafka import KafkaSource

    caplog.set_level(logging.DEBUG)
    wrong = "wrong-oidc-secret-4a7c1e"
    if side == "sink":
        raw = {**_sink_options(oauth, tmp_path, unique("oauth"), "librdkafka", secret=wrong),
               "kafka.bootstrap.timeout.ms": "5000"}
        with pytest.raises(ConfigurationError) as e:
            KafkaSink.from_options(raw).validate_destination()
    else:
        source = KafkaSource.from_options({**spark_options(oauth, secret=wrong), "subscribe": unique("oauth"),
                                           "kafka.bootstrap.timeout.ms": "5000"})
        try:
            with pytest.raises(ConfigurationError) as e:
                source.initial_offset()
        finally:
            source.close()
    text = str(e.value)
    assert "token endpoint" in text and oauth.idp.token_url in text and "kafka.sasl.jaas.config" in text, text
    assert wrong not in text and SECRET not in text
    for r in caplog.records:
        assert wrong not in f"{r.getMessage()} {r.__dict__}", r.name


def test_kafka_oauthbearer_token_the_broker_cannot_verify_fails_at_start_naming_authentication(oauth, tmp_path,
                                                                                            caplog):
    """Kafka's validator really checks the signature against the JWKS: an endpoint that signs with a key the JWKS
    does not hold gets the SASL handshake refused, and the start check says so (ConfigurationError naming the
    authentication and kafka.sasl.jaas.config), the token in no error text."""
    from cryptography.hazmat.primitives.asymmetric import rsa
    from twophase.errors import ConfigurationError
    from twophase.sinks.kafka import KafkaSink

    caplog.set_level(logging.DEBUG)
    k = oauth
    k.idp.signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # not the JWKS's key
    try:
        raw = {**_sink_options(k, tmp_path, unique("oauth"), "librdkafka"), "kafka.bootstrap.timeout.ms": "5000"}
        with pytest.raises(ConfigurationError) as e:
            KafkaSink.from_options(raw).validate_destination()
        text = str(e.value)
        assert "authenticat" in text.lower() and "kafka.sasl.jaas.config" in text, text
        assert k.idp.tokens, "the client never asked the endpoint for a token"
        _assert_nothing_secret(k, caplog, text, repr(e.value.__cause__))
    finally:
        k.idp.signing_key = k.idp.key
