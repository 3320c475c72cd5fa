"""Amazon MSK IAM authentication as Spark's Kafka clients take it (Amazon's Java login module and callback
handler) mapped to SASL/OAUTHBEARER with MSK's IAM token, for kafka-python and librdkafka. No MSK cluster
runs here: the token is made for real (Amazon's signer, static test credentials) and checked for what MSK
verifies: a SigV4-presigned ``kafka-cluster:Connect`` request of the region, valid for its lifetime."""

from __future__ import annotations

import base64
import pickle
import time
import urllib.parse

import pytest

from twophase._kafka import kafka_python_config, librdkafka_config
from twophase._kafka_oauth import MskIamTokenProvider, msk_region
from twophase.errors import ConfigurationError

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HOST = "b-1.demo.abc123.c2.kafka.eu-west-1.amazonaws.com:9098"
JAAS = "software.amazon.msk.auth.iam.IAMLoginModule required;"
HANDLER = "software.amazon.msk.auth.iam.IAMClientCallbackHandler"
DEFAULTS = {"security_protocol": "PLAINTEXT", "sasl_mechanism": None, "bootstrap_servers": None}


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch):
    for k in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")


def spark_options(**extra):
    return {"kafka.bootstrap.servers": HOST, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "AWS_MSK_IAM",
            "kafka.sasl.jaas.config": JAAS, "kafka.sasl.client.callback.handler.class": HANDLER, **extra}


def test_msk_iam_spark_options_map_to_oauthbearer_with_an_iam_token_for_both_clients():
    cfg = kafka_python_config(spark_options(), DEFAULTS, what="twophase-kafka")
    provider = cfg["sasl_oauth_token_provider"]
    assert cfg["sasl_mechanism"] == "OAUTHBEARER" and isinstance(provider, MskIamTokenProvider)
    assert provider.region == "eu-west-1"  # from the brokers' host names
    token = provider.token()
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert url.startswith("https://kafka.eu-west-1.amazonaws.com/")
    assert query["Action"] == ["kafka-cluster:Connect"]
    assert query["X-Amz-Credential"][0].startswith("AKIAIOSFODNN7EXAMPLE/") and "/eu-west-1/kafka-cluster/" in \
        query["X-Amz-Credential"][0]
    assert SECRET not in url and SECRET not in repr(provider) and SECRET not in repr(cfg)
    assert provider.token() == token  # cached until 80 % of its lifetime
    rd = librdkafka_config(cfg, what="twophase-kafka")
    assert rd["sasl.mechanisms"] == "OAUTHBEARER" and rd["security.protocol"] == "SASL_SSL"
    got, expiry = rd["oauth_cb"]("")
    assert got == token and time.time() < expiry <= time.time() + 3600
    clone = pickle.loads(pickle.dumps(provider))  # to the executors: no token, the same settings
    assert clone == provider and clone._token is None


def test_msk_iam_region_from_the_environment_first(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "us-east-2")
    assert msk_region([HOST], what="w") == "us-east-2"
    monkeypatch.delenv("AWS_REGION")
    assert msk_region(["b-2.x.kafka-serverless.ap-south-1.amazonaws.com:9098"], what="w") == "ap-south-1"
    with pytest.raises(ConfigurationError, match="AWS_REGION"):
        msk_region(["broker.internal:9098"], what="w")


@pytest.mark.parametrize("options,error", [
    ({"kafka.security.protocol": "SASL_PLAINTEXT"}, "SASL_SSL"),
    ({"kafka.sasl.client.callback.handler.class": "com.example.Handler"}, "IAMClientCallbackHandler"),
    ({"kafka.sasl.jaas.config": JAAS.replace("required;", 'required awsMaxRetries="3";')}, "awsMaxRetries"),
    ({"kafka.sasl.jaas.config": JAAS.replace("required;", 'required awsProfileName="a" awsRoleArn="arn:aws:iam::1:role/r";')},
     "not both"),
])
def test_msk_iam_refused_settings_name_the_way(options, error):
    with pytest.raises(ConfigurationError, match=error):
        kafka_python_config(spark_options(**options), DEFAULTS, what="twophase-kafka")


def test_msk_iam_profile_and_role_are_kept():
    role = 'required awsRoleArn="arn:aws:iam::123456789012:role/msk" awsRoleSessionName="etl";'
    cfg = kafka_python_config(spark_options(**{"kafka.sasl.jaas.config": JAAS.replace("required;", role)}),
                              DEFAULTS, what="twophase-kafka")
    p = cfg["sasl_oauth_token_provider"]
    assert (p.role_arn, p.role_session_name, p.profile) == ("arn:aws:iam::123456789012:role/msk", "etl", None)


def test_msk_iam_librdkafka_asks_the_provider_for_its_token_when_the_producer_is_made():
    """librdkafka calls ``oauth_cb`` in the producer's constructor, before any broker is reached (so the
    transactional producer's first request already carries the token)."""
    import confluent_kafka
    provider = MskIamTokenProvider("eu-west-1")
    calls = []

    def counted(config):
        calls.append(config)
        return provider.librdkafka_token(config)
    producer = confluent_kafka.Producer({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_SSL",
                                         "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": counted,
                                         "transactional.id": "msk-test", "log_level": 0})
    assert len(calls) == 1
    del producer
