"""Secrets (S3 keys, SASL / SSL passwords, session tokens, JAAS configs) never appear in reprs, error
messages, log output, the transaction log or ``twophase log inspect`` output (:mod:`twophase._redact`).

Every test builds the real objects from raw Spark options carrying the secrets below and searches the
text each produces for every one of them; no server is needed."""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
from typing import Any, Iterable

import pyarrow as pa
import pytest

from twophase.sinks.delta import delta_storage_options
from twophase.sinks.delta import DeltaSink
from twophase.sinks.kafka import KafkaPythonWriter, KafkaSink, KafkaSinkOptions, KafkaTransaction
from twophase.sinks.s3 import S3Sink, S3SinkOptions
from twophase.sources.kafka import KafkaSourceOptions
from twophase import cli
from twophase._logging import get_logger
from twophase._redact import (MASK, is_secret_name, redact_json, redact_mapping, redact_text, redact_value,
                              safe_repr)
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConcurrentWriterError, ConfigurationError
from twophase.log import LocalLogStore, TransactionLog
from twophase.log_s3 import S3Config
from twophase.options import Option, parse_options, parse_positive_int
from twophase.sink import TransactionContext, run_task, sink_token
from twophase.states import CheckpointState

S3_SECRET = "S3SECRET-wJalrXUtnFEMI/K7MDENG+bPxRfiCY"
S3_TOKEN = "S3TOKEN-FQoGZXIvYXdzEBcaDOVxmpl"
SASL_PW = "SASLPW-hunter2-ohno"
JAAS_PW = "JAASPW-correct-horse"
SSL_PW = "SSLPW-keystore-pass"
STORAGE_SECRET = "STORAGESECRET-delta-object-store"
URL_PW = "URLPW-in-a-checkpoint-url"
AZURE_KEY = "QVpVUkVLRVktc2hhcmVkLWtleS1vZi10aGUtYWNjb3VudA=="
AZURE_SIG = "AZURESIG-c2lnbmF0dXJlLW9mLXRoZS1zYXM%3D"
AZURE_SAS = f"sv=2022-11-02&ss=b&srt=co&sp=rwdl&se=2030-01-01&sig={AZURE_SIG}"
OIDC_SECRET = "OIDCSECRET-client-credentials-7c2e"
#: an OAUTHBEARER access token as a token endpoint answers it (a JWT; the signature part is what must not leak)
JWT_SIG = "SIGNATUREofTheAccessTokenJWT-8f3a"
JWT = f"eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ.eyJzdWIiOiJhcHAiLCJleHAiOjF9.{JWT_SIG}"
SECRETS = (S3_SECRET, S3_TOKEN, SASL_PW, JAAS_PW, SSL_PW, STORAGE_SECRET, URL_PW, AZURE_KEY, AZURE_SIG, OIDC_SECRET,
           JWT_SIG)

S3_CREDS = {"s3.endpoint": "http://127.0.0.1:1", "s3.accessKeyId": "AKIDEXAMPLE", "s3.secretAccessKey": S3_SECRET,
            "s3.sessionToken": S3_TOKEN}
JAAS = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="{JAAS_PW}";'
KAFKA_JAAS = {"kafka.bootstrap.servers": "h1:9092", "kafka.security.protocol": "SASL_SSL",
              "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.jaas.config": JAAS, "kafka.ssl.password": SSL_PW}
KAFKA_PLAIN = {"kafka.bootstrap.servers": "h1:9092", "kafka.security.protocol": "SASL_PLAINTEXT",
               "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.plain.username": "bob",
               "kafka.sasl.plain.password": SASL_PW}
KAFKA_OAUTH = {"kafka.bootstrap.servers": "h1:9092", "kafka.security.protocol": "SASL_SSL",
               "kafka.sasl.mechanism": "OAUTHBEARER", "kafka.sasl.oauthbearer.token.endpoint.url": "http://127.0.0.1:1/t",
               "kafka.sasl.login.callback.handler.class":
                   "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
               "kafka.sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                                         f'clientId="app" clientSecret="{OIDC_SECRET}" scope="kafka";'}
KAFKA_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
DELTA_SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def assert_no_secret(text: Any, what: str = "", secrets: Iterable[str] = SECRETS) -> None:
    text = text if isinstance(text, str) else text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    leaked = [s for s in secrets if s in text]
    assert not leaked, f"{what} shows {leaked}: {text[:2000]}"


def texts(*objects: Any) -> str:
    return "\n".join(f"{repr(o)}\n{str(o)}" for o in objects)


def all_bytes_under(root: str) -> Iterable[tuple[str, bytes]]:
    for dirpath, _, files in os.walk(root):
        for n in files:
            with open(os.path.join(dirpath, n), "rb") as f:
                yield os.path.join(dirpath, n), f.read()


# --------------------------------------------------------------------------- the one place: names and text


@pytest.mark.parametrize("name", [
    "s3.secretAccessKey", "secret_access_key", "s3.sessionToken", "session_token", "AWS_SECRET_ACCESS_KEY",
    "aws_session_token", "kafka.sasl.jaas.config", "sasl_plain_password", "ssl_password", "ssl.key.password",
    "kafka.ssl.keystore.password", "ssl.truststore.password", "sasl_oauth_token_provider", "storage.azure_storage_sas_token",
    "private_key", "S3.SECRETACCESSKEY"])
def test_redact_secret_names_are_recognised_case_insensitively(name) -> None:
    assert is_secret_name(name)
    assert redact_value(name, "v") == MASK


@pytest.mark.parametrize("name", ["sink_token", "sink.id", "s3.accessKeyId", "sasl_plain_username", "ssl_keyfile",
                                  "kafka.bootstrap.servers", "transactional_id", "checkpoint_id", "owner"])
def test_redact_non_secret_names_keep_their_values(name) -> None:
    assert not is_secret_name(name)
    assert redact_value(name, "v") == "v"


def test_redact_sink_token_the_naming_digest_is_not_a_secret() -> None:
    # twophase.naming names every file with it: masking it would make logs about files useless
    token = sink_token("s")
    assert redact_mapping({"sink_token": token}) == {"sink_token": token}


def test_redact_text_masks_jaas_passwords_url_passwords_and_secret_pairs() -> None:
    out = redact_text(f"{JAAS} s3a://AKID:{S3_SECRET}@bucket/ck http://u:{URL_PW}@host:9000/x?"
                      f"X-Amz-Security-Token={S3_TOKEN}&x=1 {{'sasl_plain_password': '{SASL_PW}'}} "
                      f'{{"ssl_password": "{SSL_PW}"}} sink_token=abc')
    assert_no_secret(out, "redact_text")
    assert 'username="alice"' in out and "s3a://AKID:***@bucket/ck" in out and "http://u:***@host:9000" in out
    assert "sink_token=abc" in out and "x=1" in out


def test_redact_mapping_is_recursive_and_redact_json_keeps_data_keys() -> None:
    nested = {"producer": {"sasl_plain_password": SASL_PW, "acks": "all"}, "list": [{"session_token": S3_TOKEN}]}
    out = redact_mapping(nested)
    assert out == {"producer": {"sasl_plain_password": MASK, "acks": "all"}, "list": [{"session_token": MASK}]}
    assert nested["producer"]["sasl_plain_password"] == SASL_PW  # a copy: the original is untouched
    # data keyed by user names (a topic called 'tokens') keeps its values; embedded secrets still go
    assert redact_json({"tokens": {"0": 12}, "reason": JAAS}) == {"tokens": {"0": 12}, "reason": redact_text(JAAS)}


def test_redact_safe_repr_masks_secret_fields_of_any_dataclass() -> None:
    from dataclasses import dataclass

    @safe_repr
    @dataclass(frozen=True)
    class Creds:
        user: str
        api_token: str
        extra: dict

    c = Creds("u", S3_TOKEN, {"password": SASL_PW})
    assert repr(c).endswith(".Creds(user='u', api_token=***, extra={'password': '***'})") and str(c) == repr(c)
    assert c.api_token == S3_TOKEN


# --------------------------------------------------------------------------- reprs of options, sinks, S3Config


def test_s3_config_repr_hides_secret_key_and_session_token_but_pickles_them() -> None:
    cfg = S3Config(endpoint="http://127.0.0.1:1", access_key_id="AKIDEXAMPLE", secret_access_key=S3_SECRET,
                   session_token=S3_TOKEN)
    assert_no_secret(texts(cfg), "S3Config")
    assert "AKIDEXAMPLE" in repr(cfg) and "secret_access_key=***" in repr(cfg)
    clone = pickle.loads(pickle.dumps(cfg))  # executors need the credentials
    assert clone.secret_access_key == S3_SECRET and clone.session_token == S3_TOKEN
    assert delta_storage_options(cfg)["AWS_SECRET_ACCESS_KEY"] == S3_SECRET


def test_s3_sink_options_and_sink_reprs_hide_s3_secrets() -> None:
    sink = S3Sink.from_options({"path": "s3://bkt/out", "checkpointLocation": "/ck", **S3_CREDS})
    assert_no_secret(texts(sink.options, sink, sink.options.s3, sink.transaction_log().store.config), "S3 sink")
    assert "bkt" in repr(sink.options)
    clone = pickle.loads(pickle.dumps(sink))
    assert clone.options.s3.secret_access_key == S3_SECRET
    assert_no_secret(texts(clone, clone.options), "unpickled S3 sink")


def test_delta_sink_options_and_sink_reprs_hide_s3_and_storage_secrets(tmp_path) -> None:
    sink = DeltaSink.from_options({"path": str(tmp_path / "t"), "storage.aws_secret_access_key": STORAGE_SECRET,
                                   "storage.aws_region": "eu-west-1", **S3_CREDS}, DELTA_SCHEMA)
    assert_no_secret(texts(sink.options, sink, sink.options.s3), "Delta sink")
    assert "eu-west-1" in repr(sink.options)  # non-secret storage options stay visible
    assert sink.options.storage["aws_secret_access_key"] == STORAGE_SECRET


@pytest.mark.parametrize("kafka", [KAFKA_JAAS, KAFKA_PLAIN], ids=["jaas", "sasl-plain"])
def test_kafka_sink_options_and_sink_reprs_hide_sasl_and_ssl_passwords(kafka) -> None:
    sink = KafkaSink.from_options({**kafka, "topic": "out", "checkpointLocation": "/tmp/ck-r"}, KAFKA_SCHEMA)
    assert_no_secret(texts(sink.options, sink), "Kafka sink options")
    # the secrets are still there for the producer (and travel pickled to executors)
    cfg = pickle.loads(pickle.dumps(sink)).options.producer_config
    assert cfg["sasl_plain_password"] in (SASL_PW, JAAS_PW)


def test_kafka_sink_jaas_config_becomes_kafka_python_sasl_settings() -> None:
    cfg = KafkaSinkOptions.from_options({**KAFKA_JAAS, "topic": "out"}, KAFKA_SCHEMA).producer_config
    assert (cfg["sasl_plain_username"], cfg["sasl_plain_password"], cfg["sasl_mechanism"]) == ("alice", JAAS_PW, "PLAIN")
    assert "sasl_jaas_config" not in cfg


def test_kafka_sink_logged_on_s3_hides_s3_and_sasl_secrets() -> None:
    sink = KafkaSink.from_options({**KAFKA_JAAS, **S3_CREDS, "topic": "out", "checkpointLocation": "s3://b/ck",
                                   "log.location": "s3://b/log"}, KAFKA_SCHEMA)
    log = sink.transaction_log()  # an S3 log store; no request is sent
    assert log.location == "s3://b/log" and log.store.config.secret_access_key == S3_SECRET
    assert_no_secret(texts(sink.options, sink, log, log.store, log.store.config), "S3-logged Kafka sink")


@pytest.mark.parametrize("kafka", [KAFKA_JAAS, KAFKA_PLAIN], ids=["jaas", "sasl-plain"])
def test_kafka_source_options_repr_hides_sasl_and_ssl_passwords(kafka) -> None:
    o = KafkaSourceOptions.from_options({**kafka, "subscribe": "in"})
    assert o.consumer_config["sasl_plain_password"] in (SASL_PW, JAAS_PW)
    assert_no_secret(texts(o), "Kafka source options")


def test_redact_text_masks_json_web_tokens_and_authorization_header_credentials() -> None:
    out = redact_text(f'sasl token {JWT}; headers={{"Authorization": "Bearer {OIDC_SECRET}"}} '
                      f"Authorization: Basic {OIDC_SECRET} {{\"access_token\": \"{JWT}\"}}")
    assert_no_secret(out, "redact_text")
    assert out.count(MASK) == 4, out
    # words about authorization stay (a broker's refusal must still say what was refused)
    for text in ("TopicAuthorizationFailedError: topic t", "HTTP Basic client authentication",
                 "refused the client credentials (HTTP 401 Unauthorized)"):
        assert redact_text(text) == text


def test_kafka_oauthbearer_client_secret_and_token_never_in_reprs_logs_or_librdkafka_errors(caplog) -> None:
    """OAUTHBEARER (OIDC client credentials): the client secret is in no repr of the sink, the source, their options
    or the token provider, nor in a structured log line of the producer settings (kafka-python's or librdkafka's);
    a librdkafka error echoing the secret or a token is masked. The secret still pickles to executors."""
    from twophase._kafka import librdkafka_config
    from twophase._redact import redact_error
    caplog.set_level(logging.DEBUG, logger="twophase.test_redaction")
    sink = KafkaSink.from_options({**KAFKA_OAUTH, "topic": "out", "checkpointLocation": "/tmp/ck-o"}, KAFKA_SCHEMA)
    source = KafkaSourceOptions.from_options({**KAFKA_OAUTH, "subscribe": "in"})
    provider = sink.options.producer_config["sasl_oauth_token_provider"]
    assert_no_secret(texts(sink.options, sink, source, provider, sink.options.producer_config,
                           sink.options.connection_config()), "OAUTHBEARER reprs")
    assert pickle.loads(pickle.dumps(sink)).options.producer_config["sasl_oauth_token_provider"].client_secret \
        == OIDC_SECRET
    # the driver's TxnClient gets the provider (it authenticates with OAUTHBEARER too)
    assert sink.options.connection_config()["sasl_oauth_token_provider"] == provider
    rd = librdkafka_config(sink.options.producer_config, what="t")
    assert rd["sasl.oauthbearer.client.secret"] == OIDC_SECRET
    get_logger("twophase.test_redaction").warning("producer", librdkafka=rd, producer=dict(sink.options.producer_config))
    assert_no_secret(caplog.text, "log text")
    assert_no_secret(json.dumps(caplog.records[0].twophase, default=str), "structured log fields")
    error = Exception(f"OIDC token retrieval failed for client_secret {OIDC_SECRET}: token {JWT} rejected")
    assert_no_secret(redact_error(error, rd), "librdkafka error")


# --------------------------------------------------------------------------- error messages


@pytest.mark.parametrize("build, raw", [
    (S3SinkOptions.from_options, {"path": "s3://b/x", "s3.secretAccessKey": S3_SECRET}),  # without accessKeyId
    (S3SinkOptions.from_options, {"path": "s3://b/x", "s3.accessKeyId": "k", "s3.secretAccessKey": S3_SECRET,
                                  "s3.sessionToken": S3_TOKEN, "s3.SecretAccessKey": S3_SECRET}),  # given twice
    (lambda r: KafkaSinkOptions.from_options(r, KAFKA_SCHEMA),
     {**KAFKA_JAAS, "topic": "t", "kafka.sasl.jaas.config": JAAS.replace("PlainLoginModule", "NoSuchModule")}),
    (lambda r: KafkaSinkOptions.from_options(r, KAFKA_SCHEMA),
     {**KAFKA_JAAS, "topic": "t", "kafka.sasl.jaas.config": f'PlainLoginModule required password="{JAAS_PW}";'}),
    (lambda r: KafkaSinkOptions.from_options(r, KAFKA_SCHEMA),
     {**KAFKA_JAAS, "topic": "t", "kafka.sasl.jaas.config": f'not jaas at all password={JAAS_PW}'}),
    (KafkaSourceOptions.from_options,
     {**KAFKA_JAAS, "subscribe": "t", "kafka.sasl.plain.password": SASL_PW}),  # disagrees with the JAAS password
    (lambda r: KafkaSinkOptions.from_options(r, KAFKA_SCHEMA),
     {**KAFKA_PLAIN, "topic": "t", "kafka.ssl.keystore.password": SSL_PW}),  # not a kafka-python setting
], ids=["s3-secret-alone", "s3-secret-twice", "jaas-unknown-module", "jaas-no-username", "jaas-malformed",
        "jaas-vs-plain-password", "keystore-password-unknown"])
def test_configuration_error_for_a_bad_secret_option_names_it_without_its_value(build, raw) -> None:
    with pytest.raises(ConfigurationError) as e:
        build(raw)
    assert_no_secret(str(e.value), "error message")
    assert_no_secret(repr(e.value), "error repr")


def test_configuration_error_for_a_secret_option_that_fails_to_parse_shows_no_value() -> None:
    # the one place all sinks parse options: neither the value nor the parser's message (int() echoes it)
    declared = (Option("api.token", parse_positive_int, help="a numeric token"),)
    with pytest.raises(ConfigurationError) as e:
        parse_options({"api.token": S3_TOKEN}, declared, sink="test")
    assert "'api.token'" in str(e.value) and MASK in str(e.value)
    assert_no_secret(str(e.value), "parse error")
    # a non-secret option still shows what was wrong with it
    with pytest.raises(ConfigurationError, match="'log.retain'='lots'"):
        parse_options({"log.retain": "lots"}, declared, sink="test")


@pytest.mark.parametrize("build, raw", [
    (S3SinkOptions.from_options, {"path": "s3://b/x", "partSize": "1m", **S3_CREDS}),
    (S3SinkOptions.from_options, {"path": "s3://b/x", "nope": "1", **S3_CREDS}),
    (S3SinkOptions.from_options, {"path": "s3://b/x", "s3.connectTimeout": "soon", **S3_CREDS}),
    (lambda r: DeltaSink.from_options(r), {"path": "/tmp/t", "guarantee": "at-least-once",
                                           "storage.aws_secret_access_key": STORAGE_SECRET, **S3_CREDS}),
    (lambda r: KafkaSinkOptions.from_options(r, KAFKA_SCHEMA), {**KAFKA_JAAS, "topic": "t", "kafka.acks": "1"}),
    (lambda r: KafkaSinkOptions.from_options(r, KAFKA_SCHEMA), {**KAFKA_PLAIN, "topic": "t", "kafka.linger.ms": "x"}),
    (lambda r: KafkaSinkOptions.from_options(r, KAFKA_SCHEMA), {**KAFKA_PLAIN, **S3_CREDS, "topic": "t",
                                                                "log.location": "http://x/y"}),
    (KafkaSourceOptions.from_options, {**KAFKA_JAAS, "subscribe": "t", "assign": '{"t": [0]}'}),
    (KafkaSourceOptions.from_options, {**KAFKA_PLAIN, "subscribe": "t", "topic": "t"}),
], ids=["s3-part-size", "s3-unknown", "s3-timeout", "delta-guarantee", "kafka-acks", "kafka-linger",
        "kafka-log-location", "source-subscribe-and-assign", "source-sink-option"])
def test_configuration_error_for_an_unrelated_bad_option_shows_no_secret(build, raw) -> None:
    with pytest.raises(ConfigurationError) as e:
        build(raw)
    assert_no_secret(str(e.value), "error message")


def test_concurrent_writer_error_and_owner_record_hide_a_checkpoint_url_password(tmp_path) -> None:
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "s")
    log.claim(f"s3a://AKID:{URL_PW}@bucket/ck")
    log.claim(f"s3a://AKID:{URL_PW}@bucket/ck")  # the same owner again is accepted
    with pytest.raises(ConcurrentWriterError) as e:
        log.claim(f"s3a://AKID:{URL_PW}@bucket/other")
    assert_no_secret(str(e.value), "ConcurrentWriterError")
    for path, data in all_bytes_under(str(tmp_path / "log")):
        assert_no_secret(data, path)


# --------------------------------------------------------------------------- structured log output


def test_structured_logger_masks_secret_named_fields_and_embedded_secrets(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="twophase.test_redaction")
    log = get_logger("twophase.test_redaction")
    s3_opts = S3SinkOptions.from_options({"path": "s3://bkt/out", **S3_CREDS})
    kafka_opts = KafkaSinkOptions.from_options({**KAFKA_JAAS, "topic": "out"}, KAFKA_SCHEMA)
    log.warning("connecting", secret_access_key=S3_SECRET, session_token=S3_TOKEN, sasl_plain_password=SASL_PW,
                ssl_password=SSL_PW, jaas=JAAS, producer=dict(kafka_opts.producer_config), options=s3_opts,
                kafka_options=kafka_opts, checkpoint=f"s3a://AKID:{URL_PW}@bucket/ck",
                storage={"AWS_SECRET_ACCESS_KEY": STORAGE_SECRET}, sink_token="tok123", bootstrap="h1:9092")
    assert len(caplog.records) == 1
    record = caplog.records[0]
    assert_no_secret(caplog.text, "log text")
    assert_no_secret(record.getMessage(), "log message")
    assert_no_secret(json.dumps(record.twophase, default=str), "structured log fields")
    assert f"secret_access_key={json.dumps(MASK)}" in record.getMessage()
    assert "tok123" in record.getMessage() and "h1:9092" in record.getMessage()  # non-secrets stay


# --------------------------------------------------------------------------- the transaction log


def _log_files_and_inspect_have_no_secret(location: str, capsys, *, also: str = "") -> None:
    for path, data in all_bytes_under(also or location):
        assert_no_secret(data, path)
    for argv in (["log", "inspect", location], ["log", "inspect", location, "--json"]):
        capsys.readouterr()
        assert cli.main(argv) == 0
        out = capsys.readouterr()
        assert_no_secret(out.out + out.err, " ".join(argv))


def test_delta_sink_transaction_log_and_table_hold_no_secret(tmp_path, capsys) -> None:
    table = tmp_path / "t"
    sink = DeltaSink.from_options({"path": str(table), "checkpointLocation": f"s3a://AKID:{URL_PW}@b/ck",
                                   "storage.aws_secret_access_key": STORAGE_SECRET, **S3_CREDS}, DELTA_SCHEMA)
    sink.validate_destination()
    sink.transaction_log().claim(sink.options.owner)
    rows = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "v": pa.array(["a", "b"])}, schema=DELTA_SCHEMA)
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t)), [rows]) for t in range(2)]
    assert_no_secret(json.dumps([a.to_json() for a in acks]), "Delta acks")
    CheckpointCoordinator(sink).complete_batch(0, acks)
    assert sink.transaction_log().get(0).state is CheckpointState.COMMITTED
    _log_files_and_inspect_have_no_secret(sink.transaction_log().location, capsys, also=str(table))


class _FakeS3Client:
    """The calls the S3 sink's task side makes; enough for a pre_commit without a server."""

    def __init__(self) -> None:
        self.uploads: dict[str, list] = {}

    def create_multipart_upload(self, Bucket: str, Key: str) -> dict:
        upload_id = f"up-{len(self.uploads)}"
        self.uploads[upload_id] = []
        return {"UploadId": upload_id}

    def upload_part(self, Bucket: str, Key: str, UploadId: str, PartNumber: int, Body: bytes) -> dict:
        import hashlib
        self.uploads[UploadId].append(Body)
        return {"ETag": f'"{hashlib.md5(Body).hexdigest()}"'}


def test_s3_sink_pre_commit_handle_and_transaction_log_hold_no_secret(tmp_path, capsys) -> None:
    log_dir = str(tmp_path / "log")
    sink = S3Sink.from_options({"path": "s3://bkt/out", "format": "json", "log.location": log_dir,
                                "checkpointLocation": f"s3a://AKID:{URL_PW}@b/ck", **S3_CREDS})
    sink._client = _FakeS3Client()
    log = sink.transaction_log()
    log.claim(sink.options.owner)
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [pa.record_batch({"x": pa.array([1, 2])})])
    assert ack.handle["uploads"] and ack.records == 2
    assert_no_secret(json.dumps(ack.to_json()), "S3 ack")
    log.transition(0, CheckpointState.PENDING)
    log.transition(0, CheckpointState.COMPLETED, handles={"0": ack.handle})
    _log_files_and_inspect_have_no_secret(log_dir, capsys)


class _FakeTransactionManager:
    class producer_id_and_epoch:  # noqa: N801 - the attribute kafka-python's manager has
        producer_id, epoch = 4711, 3

    def has_error(self) -> bool:
        return False


class _FakeProducer:
    _transaction_manager = _FakeTransactionManager()

    def flush(self) -> None:
        pass

    def close(self, timeout: float = 0) -> None:
        pass


@pytest.mark.parametrize("kafka", [KAFKA_JAAS, KAFKA_PLAIN, KAFKA_OAUTH], ids=["jaas", "sasl-plain", "oauthbearer"])
def test_kafka_sink_pre_commit_handle_and_transaction_log_hold_no_secret(kafka, tmp_path, capsys) -> None:
    log_dir = str(tmp_path / "log")
    sink = KafkaSink.from_options({**kafka, **S3_CREDS, "topic": "out", "log.location": log_dir,
                                   "checkpointLocation": str(tmp_path / "ck")}, KAFKA_SCHEMA)
    log = sink.transaction_log()
    log.claim(sink.options.owner)
    ctx = TransactionContext(sink.sink_id, 0, "0")
    txn = KafkaTransaction(ctx, sink.transactional_id("0", 0, 0), _FakeProducer(), time.time())
    handle = KafkaPythonWriter(sink, ctx, transaction=txn).prepare_commit().to_json()
    assert handle["producer_id"] == 4711 and handle["transactional_id"]
    assert_no_secret(json.dumps(handle), "Kafka handle")
    log.transition(0, CheckpointState.PENDING)
    log.transition(0, CheckpointState.COMPLETED, handles={"0": handle})
    _log_files_and_inspect_have_no_secret(log_dir, capsys)


# --------------------------------------------------------------------------- twophase log inspect


def test_log_inspect_masks_secrets_even_when_a_record_holds_them(tmp_path, capsys) -> None:
    """Defence in depth: a log written by an older or buggy sink that did record a secret is still shown
    without it (handles by field name, every string for embedded secrets); data keyed by names is kept."""
    location = str(tmp_path / "log")
    log = TransactionLog(LocalLogStore(location), "s")
    log.claim("/ck")
    log.transition(1, CheckpointState.PENDING)
    log.transition(1, CheckpointState.COMPLETED, task_state={"tokens": {"0": 12}},
                   handles={"0": {"txn": "t-0", "records": 3, "sasl_plain_password": SASL_PW,
                                  "client": {"aws_session_token": S3_TOKEN},
                                  "endpoint": f"http://u:{URL_PW}@h:9000"}})
    log.transition(1, CheckpointState.LOST, reason=f"broker refused {JAAS}")
    capsys.readouterr()
    assert cli.main(["log", "inspect", location, "--json"]) == 0
    out = capsys.readouterr().out
    assert_no_secret(out, "inspect --json")
    info = json.loads(out)
    [c] = info["checkpoints"]
    assert c["handles"]["0"]["txn"] == "t-0" and c["handles"]["0"]["sasl_plain_password"] == MASK
    assert c["records"] == 3 and c["task_state"] == {"tokens": {"0": 12}}
    assert cli.main(["log", "inspect", location]) == 0
    table = capsys.readouterr().out
    assert_no_secret(table, "inspect table")
    assert "broker refused" in table and "LOST" in table


# --------------------------------------------------------------------------- Azure: keys, SAS tokens, connection strings


def test_azure_key_sas_and_connection_string_never_in_reprs_errors_or_storage_option_text(monkeypatch):
    from twophase.log_azure import AzureConfig, parse_azure_url
    from twophase.sinks.delta import DeltaSinkOptions
    for name in ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    conn = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    keyed = DeltaSinkOptions.from_options({"path": "abfss://c@acct.dfs.core.windows.net/t"}, DELTA_SCHEMA)
    assert keyed.azure.account_key == AZURE_KEY  # from the connection string
    sas = DeltaSinkOptions.from_options({"path": "az://c/t", "azure.accountName": "other", "azure.sasToken": AZURE_SAS},
                                        DELTA_SCHEMA)
    cfg = AzureConfig(connection_string=conn)
    assert_no_secret(texts(keyed, sas, keyed.azure, sas.azure, cfg, DeltaSink(keyed), DeltaSink(sas)), "reprs")
    assert_no_secret(redact_mapping(keyed.storage_options() or {}), "storage options, redacted")
    assert_no_secret(redact_mapping(sas.storage_options() or {}), "storage options, redacted")
    url = f"https://acct.blob.core.windows.net/c/t/x.parquet?{AZURE_SAS}"
    assert_no_secret(redact_text(f"GET {url} failed; {conn}"), "text")
    assert_no_secret(keyed.azure.error_text(RuntimeError(f"auth failed for {AZURE_KEY} at {url}")), "client error")
    assert_no_secret(sas.azure.error_text(RuntimeError(f"bad token {AZURE_SAS}")), "client error")
    assert is_secret_name("AZURE_STORAGE_CONNECTION_STRING") and is_secret_name("azure.sasToken") \
        and is_secret_name("azure.accountKey") and is_secret_name("account_key") and not is_secret_name("azure.accountName")
    with pytest.raises(ConfigurationError) as e:
        DeltaSinkOptions.from_options({"path": "abfss://c@acct.dfs.core.windows.net/t", "azure.accountKey": AZURE_KEY,
                                       "azure.sasToken": AZURE_SAS})
    assert_no_secret(str(e.value), "error")
    with pytest.raises(ConfigurationError) as e:
        AzureConfig().resolve(parse_azure_url("abfss://c@elsewhere.dfs.core.windows.net/t"))
    assert_no_secret(str(e.value), "error")


def test_azure_log_records_and_logs_of_a_sink_on_azure_carry_no_secret(tmp_path, caplog):
    """The log of a Delta sink on Azure kept locally (log.location): its records, its owner and the log lines
    of the sink's set-up carry neither the key nor the SAS."""
    from twophase.sinks.delta import DeltaSinkOptions
    caplog.set_level(logging.DEBUG)
    opts = DeltaSinkOptions.from_options({"path": "az://c/t", "azure.accountName": "acct", "azure.accountKey": AZURE_KEY,
                                          "log.location": str(tmp_path / "log"), "checkpointLocation": "/ck"},
                                         DELTA_SCHEMA)
    sink = DeltaSink(opts)
    log = sink.transaction_log()
    log.claim("/ck")
    log.transition(0, CheckpointState.PENDING)
    get_logger("twophase.test").info("sink_built", sink=repr(sink.options), options=redact_mapping(
        {"azure.accountKey": AZURE_KEY, "azure.sasToken": AZURE_SAS}))
    for path, data in all_bytes_under(str(tmp_path / "log")):
        assert_no_secret(data, path)
    assert_no_secret(caplog.text, "log output")



def test_user_sink_hook_errors_pass_through_the_redaction() -> None:
    """A user hook's exception that quotes a URL with a password or a ``password=`` setting reaches the driver
    as SinkHookError without the secret (twophase/_redact.py is the one place)."""
    from twophase.errors import SinkHookError
    from twophase.user_sink import TwoPhaseCommitSink

    class Leaky(TwoPhaseCommitSink):
        def begin_transaction(self, context):
            raise RuntimeError(f"cannot connect to postgresql://app:{URL_PW}@db:5432/x password={URL_PW}")
        def write(self, txn, batch): ...
        def pre_commit(self, txn): ...
        def commit(self, txn): ...
        def abort(self, txn): ...

    sink = Leaky(sink_id="leaky", log_location="/tmp/unused-leaky-log")
    with pytest.raises(SinkHookError) as e:
        sink.call_hook("begin_transaction", None)
    assert "Leaky.begin_transaction of sink 'leaky'" in str(e.value)
    assert_no_secret(str(e.value), "SinkHookError")


@pytest.mark.parametrize("url", [
    "postgresql://writer:PGPW-s3cr3t%2Fx@127.0.0.1:1/app",
    "postgresql://writer@127.0.0.1:1/app?password=PGPW-s3cr3t%2Fx&sslmode=disable",
    "host=127.0.0.1 port=1 user=writer password=PGPW-s3cr3t%2Fx dbname=app",
    # session 14: a password with ',', ';' or '&' (valid in a conninfo value, or a URI query value) was masked only
    # up to that character: 'password=***,PGPW-s3cr3t' in the repr and in every error
    "host=127.0.0.1 port=1 user=writer password=ab,PGPW-s3cr3t dbname=app",
    "host=127.0.0.1 port=1 user=writer password=a&b;PGPW-s3cr3t dbname=app",
    "postgresql://writer@127.0.0.1:1/app?password=ab;PGPW-s3cr3t,x&sslmode=disable",
    "postgresql://writer@127.0.0.1:1/app?sslmode=disable&password=ab%2C,PGPW-s3cr3t",
    "host=127.0.0.1 port=1 user=writer password='a b,PGPW-s3cr3t' dbname=app",
])
def test_postgres_sink_url_password_never_in_repr_errors_or_pickled_text(url, tmp_path) -> None:
    """twophase-postgres: the libpq URL's password (userinfo, query parameter or key=value conninfo) is masked
    in the sink's repr and in a connection error; the pickled sink still carries it (executors connect)."""
    psycopg = pytest.importorskip("psycopg")  # noqa: F841
    from twophase.sinks.postgres import PostgresSink
    sink = PostgresSink(url=url, table="public.t", sink_id="pg", log_location=str(tmp_path))
    assert "PGPW-s3cr3t" not in repr(sink) and "PGPW-s3cr3t" not in str(sink)
    assert "PGPW-s3cr3t" not in redact_text(url)
    with pytest.raises(ConfigurationError) as e:
        sink.validate_destination()  # nothing listens on port 1
    assert "PGPW-s3cr3t" not in str(e.value) and "option 'url'" in str(e.value), str(e.value)
    assert pickle.loads(pickle.dumps(sink)).url == url
