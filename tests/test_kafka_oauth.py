"""SASL/OAUTHBEARER (OIDC client credentials) as Spark's Kafka options give it: one provider for kafka-python and
librdkafka, a real HTTP token endpoint, and the client secret never shown."""

from __future__ import annotations

import base64
import json
import pickle
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from twophase.errors import ConfigurationError, TransientSinkError

SECRET = "s3cr3t-Client-Value"
JAAS = ('org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId="app" '
        f'clientSecret="{SECRET}" scope="kafka.rw" extension_logicalCluster="lkc-1";')
HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"


class _TokenEndpoint(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        type(self).requests.append({"auth": self.headers.get("Authorization"), "form": urllib.parse.parse_qs(body)})
        payload = json.dumps({"access_token": f"tok-{len(type(self).requests)}", "expires_in": 3600}).encode()
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint():
    _TokenEndpoint.requests = []
    _TokenEndpoint.status = 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TokenEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/oauth2/token"
    server.shutdown()


def _options(url: str, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": "h:9093", "subscribe": "t", "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "OAUTHBEARER", "kafka.sasl.oauthbearer.token.endpoint.url": url,
            "kafka.sasl.login.callback.handler.class": HANDLER, "kafka.sasl.jaas.config": JAAS, **extra}


def test_kafka_oauthbearer_spark_options_give_one_provider_for_both_clients(endpoint):
    from twophase._kafka import librdkafka_config
    from twophase._kafka_oauth import OidcTokenProvider
    from twophase.sources.kafka import KafkaSourceOptions
    o = KafkaSourceOptions.from_options(_options(endpoint))
    provider = o.consumer_config["sasl_oauth_token_provider"]
    assert isinstance(provider, OidcTokenProvider) and o.consumer_config["sasl_mechanism"] == "OAUTHBEARER"
    # kafka-python (the driver): a real token from the endpoint, client credentials in HTTP Basic, cached
    assert provider.token() == "tok-1" and provider.token() == "tok-1"
    assert len(_TokenEndpoint.requests) == 1
    req = _TokenEndpoint.requests[0]
    assert base64.b64decode(req["auth"].split()[1]).decode() == f"app:{SECRET}"
    assert req["form"] == {"grant_type": ["client_credentials"], "scope": ["kafka.rw"]}
    assert provider.extensions() == {"logicalCluster": "lkc-1"}
    # librdkafka (the executors): its built-in OIDC login with the same settings
    cfg = librdkafka_config(o.consumer_config, what="t", consumer=True)
    assert {k: v for k, v in cfg.items() if k.startswith("sasl.")} == {
        "sasl.mechanisms": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "app",
        "sasl.oauthbearer.client.secret": SECRET, "sasl.oauthbearer.token.endpoint.url": endpoint,
        "sasl.oauthbearer.scope": "kafka.rw", "sasl.oauthbearer.extensions": "logicalCluster=lkc-1"}
    from confluent_kafka import Consumer  # librdkafka accepts the properties (it validates them when created)
    Consumer({**{k: v for k, v in cfg.items() if k != "security.protocol"}, "group.id": "g"}).close()
    # the options travel to executors pickled: the provider with its settings, without its token
    again = pickle.loads(pickle.dumps(o))
    assert again == o and again.consumer_config["sasl_oauth_token_provider"]._token is None


def test_kafka_oauthbearer_sink_options_map_too(endpoint):
    from twophase._kafka import librdkafka_config
    from twophase.sinks.kafka import KafkaSinkOptions
    raw = {k: v for k, v in _options(endpoint).items() if k != "subscribe"}
    import pyarrow as pa
    o = KafkaSinkOptions.from_options({**raw, "topic": "out", "checkpointLocation": "/tmp/x"},
                                      pa.schema([("value", pa.binary())]))
    assert librdkafka_config(o.producer_config, what="t")["sasl.oauthbearer.method"] == "oidc"


def test_kafka_oauthbearer_secret_never_shown(endpoint, caplog):
    from twophase.sources.kafka import KafkaSourceOptions
    o = KafkaSourceOptions.from_options(_options(endpoint))
    assert SECRET not in repr(o) and SECRET not in repr(o.consumer_config["sasl_oauth_token_provider"])
    _TokenEndpoint.status = 401
    with pytest.raises(TransientSinkError, match="HTTP 401") as e:
        o.consumer_config["sasl_oauth_token_provider"].token()
    assert SECRET not in str(e.value)
    with pytest.raises(ConfigurationError) as bad:
        KafkaSourceOptions.from_options(_options(endpoint, **{"kafka.sasl.oauthbearer.token.endpoint.url": ""}))
    assert SECRET not in str(bad.value)
    assert SECRET not in caplog.text


@pytest.mark.parametrize("extra, match", [
    ({"kafka.sasl.login.callback.handler.class": "com.example.MyHandler"}, "callback.handler.class"),
    ({"kafka.sasl.oauthbearer.jwks.endpoint.url": "https://x"}, "jwks.endpoint.url.*not supported"),
    ({"kafka.sasl.mechanism": "PLAIN"}, "are for kafka.sasl.mechanism=OAUTHBEARER"),
    ({"kafka.sasl.jaas.config": 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                                'clientId="app";'}, "clientSecret"),
    ({"kafka.sasl.oauthbearer.token.endpoint.url": "file:///etc/passwd"}, "http\\(s\\) URL"),
])
def test_kafka_oauthbearer_bad_options_refused_naming_the_option(endpoint, extra, match):
    from twophase.sources.kafka import KafkaSourceOptions
    with pytest.raises(ConfigurationError, match=match):
        KafkaSourceOptions.from_options(_options(endpoint, **extra))
