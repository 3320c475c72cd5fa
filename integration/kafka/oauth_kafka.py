"""SASL/OAUTHBEARER against Apache Kafka's own OIDC validator, with an identity provider served by the test.

:class:`LocalIdp` is a tiny OIDC provider on a free loopback port: ``POST /token`` (the client-credentials grant,
client authentication by HTTP Basic as Java's ``OAuthBearerLoginCallbackHandler`` and librdkafka send it) answers a
JWT signed RS256 with a key made here with ``cryptography``; ``GET /jwks`` serves that key's public half. Every
token it minted is kept in :attr:`LocalIdp.tokens`, so the tests can look for them (and the client secret) in logs,
errors and the transaction log.

:func:`oauth_kafka_broker` starts a single KRaft node (``scripts/kafka_server.sh``) with, beside its PLAINTEXT
listener, a listener ``OAUTH`` (``SASL_PLAINTEXT``, mechanism OAUTHBEARER) validated by Kafka's
``OAuthBearerValidatorCallbackHandler`` against the IdP's JWKS URL. Kafka 4.x refuses any OAuth URL not listed in
the JVM system property ``org.apache.kafka.sasl.oauthbearer.allowed.urls``; it is given through
``JAVA_TOOL_OPTIONS`` (scripts/kafka_server.sh takes no JVM options). The broker's principal is the token's ``sub``
claim (``User:<client id>``)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from integration.kafka.apache_kafka import SCRIPT

#: the OIDC client of the tests (client id -> secret); the secret is what the tests look for in every text
CLIENTS = {"twophase-app": "oidc-client-secret-9b1e4f7d"}
AUDIENCE = "kafka-broker"
OAUTH_JAAS = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required"
LOGIN_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _int_b64url(n: int) -> str:
    return _b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))


class LocalIdp:
    """Token endpoint and JWKS of an RSA key made at start (see the module doc)."""

    def __init__(self, lifetime_s: int = 3600) -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        #: the key tokens are signed with: :attr:`key` (whose public half the JWKS serves) unless a test swaps it
        self.signing_key = self.key
        self.kid = f"twophase-test-{os.getpid()}"
        self.lifetime_s = lifetime_s
        self.tokens: list[str] = []
        self.requests: list[dict[str, Any]] = []     # (client_id, granted) per token request
        self._lock = threading.Lock()
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path.split("?")[0] != "/jwks":
                    return self._send(404, {"error": "not_found"})
                self._send(200, idp.jwks())

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                form = urllib.parse.parse_qs(body)
                client_id, secret = idp._client_credentials(self.headers.get("Authorization"), form)
                ok = (self.path.split("?")[0] == "/token" and form.get("grant_type") == ["client_credentials"]
                      and client_id in CLIENTS and CLIENTS[client_id] == secret)
                with idp._lock:
                    idp.requests.append({"client_id": client_id, "granted": ok})
                if not ok:
                    return self._send(401, {"error": "invalid_client"})
                scope = (form.get("scope") or [""])[0]
                self._send(200, {"access_token": idp.mint(client_id, scope), "token_type": "Bearer",
                                 "expires_in": idp.lifetime_s})

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-idp", daemon=True)
        self._thread.start()
        base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.issuer = base
        self.token_url = f"{base}/token"
        self.jwks_url = f"{base}/jwks"

    @staticmethod
    def _client_credentials(authorization: Any, form: dict[str, list[str]]) -> tuple[str, str]:
        if authorization and authorization.startswith("Basic "):
            cid, _, secret = base64.b64decode(authorization[6:]).decode().partition(":")
            return urllib.parse.unquote(cid), urllib.parse.unquote(secret)
        return (form.get("client_id") or [""])[0], (form.get("client_secret") or [""])[0]

    def jwks(self) -> dict[str, Any]:
        pub = self.key.public_key().public_numbers()
        return {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": self.kid, "n": _int_b64url(pub.n),
                          "e": _int_b64url(pub.e)}]}

    def mint(self, subject: str, scope: str = "") -> str:
        """A JWT for ``subject`` signed with the IdP's key (RS256)."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        claims = {"iss": self.issuer, "sub": subject, "aud": AUDIENCE, "iat": now, "nbf": now - 5,
                  "exp": now + self.lifetime_s, **({"scope": scope} if scope else {})}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self.signing_key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        token = f"{signing_input}.{_b64url(signature)}"
        with self._lock:
            self.tokens.append(token)
        return token

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclasses.dataclass(frozen=True)
class OAuthKafka:
    plaintext: str       #: bootstrap of the unauthenticated listener (topic set-up, checks, ACLs)
    oauth: str           #: bootstrap of the SASL_PLAINTEXT listener with OAUTHBEARER
    idp: LocalIdp
    server_log: str      #: the broker's log file (for the errors a test expects the broker to print)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def spark_options(k: OAuthKafka, *, client_id: str = "twophase-app", secret: str = "") -> dict[str, str]:
    """The ``kafka.*`` options of the OAUTHBEARER listener, with Spark's (Java clients') names."""
    secret = secret or CLIENTS[client_id]
    return {"kafka.bootstrap.servers": k.oauth, "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "OAUTHBEARER", "kafka.sasl.oauthbearer.token.endpoint.url": k.idp.token_url,
            "kafka.sasl.login.callback.handler.class": LOGIN_HANDLER,
            "kafka.sasl.jaas.config": f'{OAUTH_JAAS} clientId="{client_id}" clientSecret="{secret}" scope="kafka";'}


@contextlib.contextmanager
def oauth_kafka_broker(*settings: str) -> Iterator[OAuthKafka]:
    """A fresh Apache Kafka whose ``OAUTH`` listener validates tokens with Kafka's OIDC validator against a
    :class:`LocalIdp` started here (see the module doc)."""
    idp = LocalIdp()
    try:
        with tempfile.TemporaryDirectory(prefix="twophase-oauth-kafka-") as d:
            plain, oauth = _free_port(), _free_port()
            extra = f"OAUTH://127.0.0.1:{oauth}"
            props = [
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{plain},{extra}",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,OAUTH:SASL_PLAINTEXT",
                "listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER",
                f"listener.name.oauth.oauthbearer.sasl.jaas.config={OAUTH_JAAS};",
                f"listener.name.oauth.oauthbearer.sasl.server.callback.handler.class={VALIDATOR}",
                f"sasl.oauthbearer.jwks.endpoint.url={idp.jwks_url}",
                f"sasl.oauthbearer.expected.audience={AUDIENCE}",
                f"sasl.oauthbearer.expected.issuer={idp.issuer}",
            ]
            allowed = f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={idp.jwks_url},{idp.token_url}"
            env = {**os.environ, "KAFKA_EXTRA_LISTENERS": extra,
                   "JAVA_TOOL_OPTIONS": f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {allowed}".strip()}
            res = subprocess.run(["bash", str(SCRIPT), "start", d, str(plain), *props, *settings],
                                 capture_output=True, text=True, timeout=600, env=env)
            try:
                if res.returncode != 0:
                    raise RuntimeError(f"scripts/kafka_server.sh start failed: {res.stderr[-3000:]}")
                yield OAuthKafka(plaintext=res.stdout.strip().splitlines()[-1], oauth=f"127.0.0.1:{oauth}", idp=idp,
                                 server_log=os.path.join(d, "server.log"))
            finally:
                subprocess.run(["bash", str(SCRIPT), "stop", d], capture_output=True, timeout=60, env=env)
    finally:
        idp.close()
