"""SASL/OAUTHBEARER with OIDC client credentials (KIP-768), configured as Spark's Java Kafka clients take it.

Spark/Java options::

    kafka.sasl.mechanism=OAUTHBEARER
    kafka.sasl.oauthbearer.token.endpoint.url=https://idp.example/oauth2/token
    kafka.sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler
    kafka.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required
        clientId="..." clientSecret="..." scope="..." extension_logicalCluster="...";

become one :class:`OidcTokenProvider`, which serves both clients:

- librdkafka (executors' producer and consumer): :meth:`OidcTokenProvider.librdkafka_properties`, its
  built-in OIDC login (``sasl.oauthbearer.method=oidc``), which fetches and refreshes tokens itself;
- kafka-python (the driver's transaction requests and offset queries): the provider is kafka-python's
  ``AbstractTokenProvider``; :meth:`token` POSTs ``grant_type=client_credentials`` with HTTP Basic
  client authentication (as Java's ``OAuthBearerLoginCallbackHandler``) and caches the token until 80 %
  of its lifetime has passed.

The client secret never appears in a repr, an error or a log line; a pickled provider carries no token.

Amazon MSK's IAM authentication (``kafka.sasl.mechanism=AWS_MSK_IAM`` with Amazon's Java login module)
becomes a :class:`MskIamTokenProvider`: OAUTHBEARER with the token MSK accepts for IAM (a SigV4-presigned
``kafka-cluster:Connect`` request, made by Amazon's ``aws-msk-iam-sasl-signer-python`` from the default
credentials chain, a profile or an assumed role), for kafka-python and, through ``oauth_cb``, librdkafka.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping, Optional

from kafka.net.sasl.oauth import AbstractTokenProvider

from twophase._redact import MASK, redact_text, redact_values
from twophase.errors import ConfigurationError, TransientSinkError


class _CachedTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """A kafka-python token provider that caches its token until :attr:`REFRESH_AT` of its lifetime; equal by
    its settings; pickled without its token (executors make their own)."""

    #: refresh a token once this share of its lifetime has passed
    REFRESH_AT = 0.8

    def _reset(self) -> None:
        self._token: Optional[str] = None
        self._refresh_at = 0.0
        self._lock = threading.Lock()

    def _settings(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def _fetch(self) -> tuple[str, float]:
        """A new token and its lifetime in seconds."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._settings() == other._settings()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._settings())

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_token", "_refresh_at", "_lock")}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def token(self) -> str:
        """A valid token: the cached one, or a new one."""
        with self._lock:
            if self._token is None or time.monotonic() >= self._refresh_at:
                self._token, lifetime = self._fetch()
                self._refresh_at = time.monotonic() + self.REFRESH_AT * max(1.0, lifetime)
            return self._token


class OidcTokenProvider(_CachedTokenProvider):
    """OIDC client-credentials tokens for kafka-python, and the same settings as librdkafka properties."""

    def __init__(self, token_endpoint_url: str, client_id: str, client_secret: str, scope: Optional[str] = None,
                 extensions: Mapping[str, str] = {}, timeout_s: float = 30.0) -> None:
        if not urllib.parse.urlsplit(token_endpoint_url).scheme in ("http", "https"):
            raise ConfigurationError("option 'kafka.sasl.oauthbearer.token.endpoint.url' must be an http(s) URL, e.g. "
                                     "https://idp.example/oauth2/token")
        self.token_endpoint_url = token_endpoint_url
        self.client_id = client_id
        self.client_secret = client_secret
        self.scope = scope or None
        self._extensions = dict(extensions)
        self.timeout_s = timeout_s
        self._reset()

    def __repr__(self) -> str:
        return (f"OidcTokenProvider(token_endpoint_url={self.token_endpoint_url!r}, client_id={self.client_id!r}, "
                f"client_secret={MASK!r}, scope={self.scope!r})")

    def _settings(self) -> tuple[Any, ...]:
        return (self.token_endpoint_url, self.client_id, self.client_secret, self.scope,
                tuple(sorted(self._extensions.items())))

    def librdkafka_properties(self) -> dict[str, str]:
        """librdkafka's built-in OIDC login with the same settings."""
        props = {"sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": self.client_id,
                 "sasl.oauthbearer.client.secret": self.client_secret,
                 "sasl.oauthbearer.token.endpoint.url": self.token_endpoint_url}
        if self.scope:
            props["sasl.oauthbearer.scope"] = self.scope
        if self._extensions:
            props["sasl.oauthbearer.extensions"] = ",".join(f"{k}={v}" for k, v in sorted(self._extensions.items()))
        return props

    def extensions(self) -> dict[str, str]:
        return dict(self._extensions)

    def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        basic = base64.b64encode(f"{urllib.parse.quote(self.client_id)}:{urllib.parse.quote(self.client_secret)}"
                                 .encode()).decode()
        request = urllib.request.Request(self.token_endpoint_url, data=urllib.parse.urlencode(form).encode(),
                                         headers={"Authorization": f"Basic {basic}", "Accept": "application/json",
                                                  "Content-Type": "application/x-www-form-urlencoded"})
        where = f"OAUTHBEARER: token endpoint {self.token_endpoint_url} (client id {self.client_id!r})"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            raise TransientSinkError(f"{where} refused the client credentials (HTTP {e.code} "
                                     f"{redact_values(str(e.reason), [self.client_secret])})") from None
        except (OSError, ValueError) as e:
            raise TransientSinkError(f"{where} gave no token: {type(e).__name__}: "
                                     f"{redact_values(str(e), [self.client_secret])}") from None
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise TransientSinkError(f"{where} answered without an access_token")
        try:
            lifetime = float(body.get("expires_in", 3600))
        except (TypeError, ValueError):
            lifetime = 3600.0
        return token, max(1.0, lifetime)


#: Java's login callback handlers for OIDC client credentials (the class moved in Kafka 3.4)
CALLBACK_HANDLERS = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
                     "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler")


_MSK_HOST = re.compile(r"\.kafka(?:-serverless)?\.([a-z]{2}(?:-[a-z]+)+-\d)\.amazonaws\.com(?:\.cn)?(?::\d+)?$")


def msk_region(bootstrap_servers: Any, *, what: str) -> str:
    """The AWS region of MSK brokers: ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else the brokers' host names
    (``b-1.c.x.c2.kafka.eu-west-1.amazonaws.com``)."""
    env = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if env:
        return env
    hosts = [bootstrap_servers] if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
    for host in hosts:
        m = _MSK_HOST.search(str(host).strip())
        if m:
            return m.group(1)
    raise ConfigurationError(f"{what}: MSK IAM: the AWS region is not known: set AWS_REGION in the driver's and "
                             "executors' environment (spark.executorEnv.AWS_REGION), or use the brokers' MSK host names")


class MskIamTokenProvider(_CachedTokenProvider):
    """MSK IAM tokens (OAUTHBEARER) for kafka-python, and the same through librdkafka's ``oauth_cb``.

    A token is made locally (a presigned request; no call to AWS unless a role is assumed) and cached until
    80 % of its lifetime. Credentials come from the process's AWS chain (environment, profile, instance or
    task role) on each host; nothing secret is held by the provider, so it pickles to executors as is.
    """

    def __init__(self, region: str, *, profile: Optional[str] = None, role_arn: Optional[str] = None,
                 role_session_name: Optional[str] = None) -> None:
        if profile and role_arn:
            raise ConfigurationError("MSK IAM: give awsProfileName or awsRoleArn in kafka.sasl.jaas.config, not both")
        self.region, self.profile, self.role_arn = region, profile or None, role_arn or None
        self.role_session_name = role_session_name or None
        self._expires_ms = 0
        self._reset()

    def __repr__(self) -> str:
        return (f"MskIamTokenProvider(region={self.region!r}, profile={self.profile!r}, role_arn={self.role_arn!r})")

    def _settings(self) -> tuple[Any, ...]:
        return (self.region, self.profile, self.role_arn, self.role_session_name)

    def librdkafka_properties(self) -> dict[str, Any]:
        """librdkafka's OAUTHBEARER with this provider as its token callback."""
        return {"oauth_cb": self.librdkafka_token}

    def librdkafka_token(self, _config: Any = None) -> tuple[str, float]:
        """confluent-kafka's ``oauth_cb``: ``(token, expiry in seconds since the epoch)``."""
        token = self.token()
        return token, self._expires_ms / 1000.0

    def _fetch(self) -> tuple[str, float]:
        token, self._expires_ms = self._generate()
        return token, self._expires_ms / 1000.0 - time.time()

    def _generate(self) -> tuple[str, int]:
        from twophase._versions import require
        require("aws-msk-iam-sasl-signer-python", what="MSK IAM authentication (kafka.sasl.mechanism=AWS_MSK_IAM)")
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
        try:
            if self.role_arn:
                return MSKAuthTokenProvider.generate_auth_token_from_role_arn(
                    self.region, self.role_arn, **({"sts_session_name": self.role_session_name}
                                                   if self.role_session_name else {}))
            if self.profile:
                return MSKAuthTokenProvider.generate_auth_token_from_profile(self.region, self.profile)
            return MSKAuthTokenProvider.generate_auth_token(self.region)
        except Exception as e:  # noqa: BLE001 - botocore's many credential errors: one message naming the way out
            raise TransientSinkError(f"MSK IAM: no token for region {self.region!r}: {type(e).__name__}: {redact_text(str(e))} (the AWS "
                                     "credentials chain of this host: environment, profile, instance or task role)",
                                     retriable=False) from None
