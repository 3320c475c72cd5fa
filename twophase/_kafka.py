"""Spark-style ``kafka.*`` options to kafka-python keyword arguments (shared by the Kafka sink and source), and
those to librdkafka properties (the sink's default producer)."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from twophase._redact import MASK, is_secret_name, redact_text
from twophase.errors import ConfigurationError


#: option kafkaClient of the sink and the source: the executors' client library
CLIENTS = ("librdkafka", "kafka-python")
#: librdkafka-only names of connection and security settings, refused by the sink and the source alike: the driver's
#: kafka-python connections (EndTxn, fencing, offsets, topic checks) must use them too, so they are taken under their
#: Spark / kafka-python names only; TLS and OAUTHBEARER switches named without ``ssl.`` / ``sasl.`` (review 15) would
#: otherwise weaken the executors' connections alone, silently
RDKAFKA_CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.", "ssl_", "bootstrap.", "metadata.broker.list",
                               "enable.ssl.", "enable.sasl.", "https.")


def kafka_python_config(raw: Mapping[str, Any], defaults: Mapping[str, Any], *, what: str,
                        reserved: Mapping[str, str] = {}) -> dict[str, Any]:
    """Map ``kafka.a.b`` options to kafka-python ``a_b`` arguments, typed like ``defaults``.

    A key in ``reserved`` (``a.b`` -> why and what to use instead) or a key kafka-python does not
    know is a :class:`ConfigurationError` naming the option.
    """
    out: dict[str, Any] = {}
    jaas: Optional[str] = None
    oauth: dict[str, str] = {}
    raw = _pem_stores(raw, what=what)
    for key, value in raw.items():
        if not key.startswith("kafka."):
            continue
        name = key[len("kafka."):]
        if name == "sasl.jaas.config":
            jaas = str(value)
            continue
        if name.startswith("sasl.oauthbearer.") or name in ("sasl.login.callback.handler.class",
                                                               "sasl.client.callback.handler.class"):
            oauth[name] = str(value).strip()
            continue
        if name in reserved:
            raise ConfigurationError(f"{what}: option {key!r} cannot be set: {reserved[name]}")
        if name.startswith(("ssl.keystore.", "ssl.truststore.")):
            raise ConfigurationError(
                f"{what}: option {key!r}: JKS / PKCS12 key and trust stores are not read by twophase's Kafka clients; "
                "convert them to PEM files (keytool -importkeystore -deststoretype PKCS12, then openssl pkcs12) and give "
                "kafka.ssl.cafile (the CA certificates), kafka.ssl.certfile and kafka.ssl.keyfile (the client's "
                "certificate and key) and kafka.ssl.password (the key's password, if it is encrypted)")
        arg = name.replace(".", "_")
        if arg == "bootstrap_servers":
            out[arg] = [s.strip() for s in str(value).split(",") if s.strip()]
            continue
        if arg not in defaults:
            raise ConfigurationError(f"{what}: option {key!r} is not a kafka-python setting ({arg!r}); "
                                     "see kafka-python's KafkaProducer / KafkaConsumer for the settings they take")
        default = defaults.get(arg)
        try:
            if isinstance(default, bool):
                out[arg] = str(value).strip().lower() in ("true", "1", "yes")
            elif isinstance(default, int) or (default is None and arg.endswith(("_ms", "_bytes", "_size", "_records"))):
                out[arg] = int(str(value).strip())
            elif isinstance(default, float):
                out[arg] = float(value)
            else:
                out[arg] = str(value)
        except ValueError:
            shown = MASK if is_secret_name(key) else redact_text(repr(value))
            raise ConfigurationError(f"{what}: option {key!r}={shown} must be a number") from None
    jaas_options = _apply_jaas(out, jaas, what=what) if jaas is not None else {}
    if str(out.get("sasl_mechanism") or "").upper() == "AWS_MSK_IAM":
        _apply_msk_iam(out, oauth, jaas_options, what=what)
    elif oauth or str(out.get("sasl_mechanism") or "").upper() == "OAUTHBEARER":
        _apply_oauthbearer(out, oauth, jaas_options, what=what)
    return out


def _pem_stores(raw: Mapping[str, Any], *, what: str) -> Mapping[str, Any]:
    """Spark's (Java clients') PEM stores -> twophase's PEM file options: ``kafka.ssl.truststore.type=PEM`` with
    ``kafka.ssl.truststore.location`` is ``kafka.ssl.cafile``; ``kafka.ssl.keystore.type=PEM`` with
    ``kafka.ssl.keystore.location`` (one file: the private key and the certificate chain) is ``kafka.ssl.certfile``
    and ``kafka.ssl.keyfile``; ``kafka.ssl.key.password`` (the key's password) is ``kafka.ssl.password``. Other store
    settings (JKS / PKCS12, inline PEM) stay refused by :func:`kafka_python_config`."""
    kinds = {store: str(raw.get(f"kafka.ssl.{store}.type", "")).strip().upper() for store in ("truststore", "keystore")}
    if "kafka.ssl.key.password" not in raw and "PEM" not in kinds.values():
        return raw
    out = dict(raw)
    moves = [("kafka.ssl.key.password", ("kafka.ssl.password",))]
    if kinds["truststore"] == "PEM":
        moves.append(("kafka.ssl.truststore.location", ("kafka.ssl.cafile",)))
        out.pop("kafka.ssl.truststore.type")
    if kinds["keystore"] == "PEM":
        moves.append(("kafka.ssl.keystore.location", ("kafka.ssl.certfile", "kafka.ssl.keyfile")))
        out.pop("kafka.ssl.keystore.type")
    for source, targets in moves:
        if source not in out:
            continue
        value = out.pop(source)
        for target in targets:
            if target in out and str(out[target]) != str(value):
                raise ConfigurationError(f"{what}: options {source!r} and {target!r} disagree; give one of them")
            out[target] = value
    return out


_MSK_HOW = ("MSK IAM is taken as Spark's Kafka clients take it: kafka.security.protocol=SASL_SSL, "
            "kafka.sasl.mechanism=AWS_MSK_IAM, kafka.sasl.jaas.config='software.amazon.msk.auth.iam.IAMLoginModule "
            "required;' (optionally awsProfileName=\"...\" or awsRoleArn=\"...\" awsRoleSessionName=\"...\") and "
            "kafka.sasl.client.callback.handler.class=software.amazon.msk.auth.iam.IAMClientCallbackHandler")
_MSK_HANDLER = "software.amazon.msk.auth.iam.IAMClientCallbackHandler"


def _apply_msk_iam(out: dict[str, Any], oauth: Mapping[str, str], jaas: Mapping[str, str], *, what: str) -> None:
    """``kafka.sasl.mechanism=AWS_MSK_IAM`` (Amazon's Java IAM login module and callback handler) -> SASL/OAUTHBEARER
    with MSK's IAM tokens (the same signed request, made by ``aws-msk-iam-sasl-signer-python``): one
    :class:`twophase._kafka_oauth.MskIamTokenProvider` in kafka-python's ``sasl_oauth_token_provider`` and
    librdkafka's ``oauth_cb``. The region is the brokers' (``*.kafka.<region>.amazonaws.com``) unless
    ``AWS_REGION`` is set."""
    from twophase._kafka_oauth import MskIamTokenProvider, msk_region
    handler = oauth.get("sasl.client.callback.handler.class")
    others = sorted(k for k in oauth if k != "sasl.client.callback.handler.class")
    if (handler is not None and handler != _MSK_HANDLER) or others:
        raise ConfigurationError(f"{what}: with kafka.sasl.mechanism=AWS_MSK_IAM only Amazon's callback handler "
                                 f"({_MSK_HANDLER}) is taken; got {['kafka.' + k for k in others] or handler!r}. " + _MSK_HOW)
    if str(out.get("security_protocol") or "").upper() != "SASL_SSL":
        raise ConfigurationError(f"{what}: MSK IAM authentication runs over TLS: set kafka.security.protocol=SASL_SSL "
                                 "(the brokers' IAM port, 9098 in a VPC, 9198 public)")
    unknown = sorted(k for k in jaas if k not in ("awsProfileName", "awsRoleArn", "awsRoleSessionName", "awsDebugCreds"))
    if unknown:
        raise ConfigurationError(f"{what}: option 'kafka.sasl.jaas.config' (IAMLoginModule) has options {unknown} that "
                                 "twophase does not take; " + _MSK_HOW)
    out["sasl_mechanism"] = "OAUTHBEARER"
    out["sasl_oauth_token_provider"] = MskIamTokenProvider(
        msk_region(out.get("bootstrap_servers") or (), what=what), profile=jaas.get("awsProfileName"),
        role_arn=jaas.get("awsRoleArn"), role_session_name=jaas.get("awsRoleSessionName"))


_OIDC_HOW = ("OAUTHBEARER needs OIDC client credentials as Spark's Kafka clients take them: "
             "kafka.sasl.mechanism=OAUTHBEARER, kafka.sasl.oauthbearer.token.endpoint.url=https://..., and "
             "kafka.sasl.jaas.config='org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
             "clientId=\"...\" clientSecret=\"...\" scope=\"...\";'")


def _apply_oauthbearer(out: dict[str, Any], oauth: Mapping[str, str], jaas: Mapping[str, str], *, what: str) -> None:
    """SASL/OAUTHBEARER with OIDC client credentials -> one :class:`twophase._kafka_oauth.OidcTokenProvider` in
    kafka-python's ``sasl_oauth_token_provider`` (librdkafka gets the same settings from it)."""
    from twophase._kafka_oauth import CALLBACK_HANDLERS, OidcTokenProvider
    if str(out.get("sasl_mechanism") or "").upper() != "OAUTHBEARER":
        raise ConfigurationError(f"{what}: options {sorted('kafka.' + k for k in oauth)} are for "
                                 "kafka.sasl.mechanism=OAUTHBEARER; set it, or drop them")
    out["sasl_mechanism"] = "OAUTHBEARER"
    handler = oauth.get("sasl.login.callback.handler.class")
    if handler is not None and handler not in CALLBACK_HANDLERS:
        raise ConfigurationError(f"{what}: option 'kafka.sasl.login.callback.handler.class'={handler!r}: only Kafka's "
                                 f"OIDC client-credentials handler ({CALLBACK_HANDLERS[0]}) is supported. " + _OIDC_HOW)
    unknown = sorted(k for k in oauth if k not in ("sasl.login.callback.handler.class",
                                                     "sasl.oauthbearer.token.endpoint.url"))
    if unknown:
        raise ConfigurationError(f"{what}: option(s) {['kafka.' + k for k in unknown]} are not supported; the token "
                                 "endpoint's answer is taken as is (no local JWT validation). " + _OIDC_HOW)
    url = oauth.get("sasl.oauthbearer.token.endpoint.url")
    if not url or "clientId" not in jaas or "clientSecret" not in jaas:
        raise ConfigurationError(f"{what}: {_OIDC_HOW} (value of kafka.sasl.jaas.config not shown: it holds a secret)")
    extensions = {k[len("extension_"):]: v for k, v in jaas.items() if k.startswith("extension_")}
    out["sasl_oauth_token_provider"] = OidcTokenProvider(url, jaas["clientId"], jaas["clientSecret"],
                                                         jaas.get("scope"), extensions)


_JAAS = re.compile(r"\s*(?P<module>[\w.$]+)\s+(?:required|requisite|sufficient|optional)\b(?P<opts>.*?)\s*;?\s*", re.S)
_JAAS_OPTION = re.compile(r"""\s*(?P<name>\w+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;"]+))""", re.S)
_JAAS_MODULES = {"PlainLoginModule": "PLAIN", "ScramLoginModule": None, "OAuthBearerLoginModule": "OAUTHBEARER",
                 "IAMLoginModule": "AWS_MSK_IAM"}


def _apply_jaas(out: dict[str, Any], jaas: str, *, what: str) -> dict[str, str]:
    """``kafka.sasl.jaas.config`` (as Spark's Kafka source takes it) for the PLAIN and SCRAM login modules
    -> kafka-python's ``sasl_plain_username`` / ``sasl_plain_password``; for OAuthBearerLoginModule the
    parsed options are returned for :func:`_apply_oauthbearer`. Errors never show the value (it holds a
    password); see :mod:`twophase._redact`."""
    key = "kafka.sasl.jaas.config"
    m = _JAAS.fullmatch(jaas)
    opts: dict[str, str] = {}
    if m:
        rest = m.group("opts")
        while rest.strip():
            o = _JAAS_OPTION.match(rest)
            if o is None:
                m = None
                break
            opts[o.group("name")] = o.group("quoted").replace('\\"', '"') if o.group("quoted") is not None \
                else o.group("bare")
            rest = rest[o.end():]
    if m is None:
        raise ConfigurationError(f"{what}: option {key!r} is not a JAAS login module entry like "
                                 "'org.apache.kafka.common.security.plain.PlainLoginModule required "
                                 "username=\"...\" password=\"...\";' (value not shown: it holds a secret)")
    module = m.group("module").rsplit(".", 1)[-1]
    if module not in _JAAS_MODULES:
        raise ConfigurationError(f"{what}: option {key!r} names the login module {module!r}; twophase takes "
                                 "PlainLoginModule, ScramLoginModule, OAuthBearerLoginModule (OIDC client "
                                 "credentials) or Amazon MSK's IAMLoginModule here (for GSSAPI use kafka.sasl.mechanism=GSSAPI and "
                                 "kafka.sasl.kerberos.service.name)")
    if module in ("OAuthBearerLoginModule", "IAMLoginModule"):
        out.setdefault("sasl_mechanism", _JAAS_MODULES[module])
        return opts
    if "username" not in opts or "password" not in opts:
        raise ConfigurationError(f"{what}: option {key!r} needs username=\"...\" and password=\"...\"")
    for arg, value in (("sasl_plain_username", opts["username"]), ("sasl_plain_password", opts["password"])):
        if arg in out and out[arg] != value:
            raise ConfigurationError(f"{what}: options {key!r} and 'kafka.{arg.replace('_', '.')}' disagree; "
                                     "give one of them")
        out[arg] = value
    mechanism = _JAAS_MODULES[module]
    if mechanism is None and not str(out.get("sasl_mechanism") or "").upper().startswith("SCRAM-"):
        raise ConfigurationError(f"{what}: option {key!r} uses ScramLoginModule: set kafka.sasl.mechanism to "
                                 "SCRAM-SHA-256 or SCRAM-SHA-512")
    out.setdefault("sasl_mechanism", mechanism)
    return {}


#: kafka-python producer argument -> librdkafka property (the names are Kafka's/Java's for almost all)
_RDKAFKA_NAMES = {
    "client_id": "client.id", "acks": "acks", "compression_type": "compression.type", "linger_ms": "linger.ms",
    "batch_size": "batch.size", "request_timeout_ms": "request.timeout.ms",
    "delivery_timeout_ms": "delivery.timeout.ms", "retries": "retries", "retry_backoff_ms": "retry.backoff.ms",
    "max_in_flight_requests_per_connection": "max.in.flight.requests.per.connection",
    "max_request_size": "message.max.bytes", "receive_buffer_bytes": "socket.receive.buffer.bytes",
    "send_buffer_bytes": "socket.send.buffer.bytes", "connections_max_idle_ms": "connections.max.idle.ms",
    "reconnect_backoff_ms": "reconnect.backoff.ms", "reconnect_backoff_max_ms": "reconnect.backoff.max.ms",
    "metadata_max_age_ms": "metadata.max.age.ms", "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanisms", "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password", "sasl_kerberos_service_name": "sasl.kerberos.service.name",
    "ssl_cafile": "ssl.ca.location", "ssl_certfile": "ssl.certificate.location", "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password", "ssl_crlfile": "ssl.crl.location", "ssl_ciphers": "ssl.cipher.suites",
    "enable_idempotence": "enable.idempotence",
}
#: kafka-python consumer argument -> librdkafka property (the source's reader); the common ones above apply too
_RDKAFKA_CONSUMER_NAMES = {
    "fetch_max_bytes": "fetch.max.bytes", "max_partition_fetch_bytes": "max.partition.fetch.bytes",
    "fetch_min_bytes": "fetch.min.bytes", "fetch_max_wait_ms": "fetch.wait.max.ms", "check_crcs": "check.crcs",
    "isolation_level": "isolation.level", "client_rack": "client.rack",
    "receive_message_max_bytes": "receive.message.max.bytes",
}
#: settings only the driver's kafka-python connections use (bootstrap, topic checks); the producer ignores them
_DRIVER_ONLY = {"bootstrap_timeout_ms", "api_version", "allow_auto_create_topics", "max_block_ms", "client_dns_lookup"}
#: consumer settings set by the source itself (no group, no commits), never the user's
_SOURCE_OWN = {"enable_auto_commit", "group_id"}


def librdkafka_config(cfg: Mapping[str, Any], *, what: str, consumer: bool = False) -> dict[str, Any]:
    """The librdkafka (confluent-kafka) producer properties, or with ``consumer=True`` consumer properties,
    of validated kafka-python settings ``cfg`` (what :func:`kafka_python_config` returned). A setting
    librdkafka has no counterpart for is a :class:`ConfigurationError` naming the option and
    ``kafkaClient=kafka-python``."""
    out: dict[str, Any] = {}
    names = {**_RDKAFKA_NAMES, **_RDKAFKA_CONSUMER_NAMES} if consumer else _RDKAFKA_NAMES
    for arg, value in cfg.items():
        if consumer and arg in _SOURCE_OWN:
            continue
        if arg == "bootstrap_servers":
            out["bootstrap.servers"] = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
        elif arg == "ssl_check_hostname":
            out["ssl.endpoint.identification.algorithm"] = "https" if value else "none"
        elif arg == "sasl_oauth_token_provider":
            from twophase._kafka_oauth import MskIamTokenProvider, OidcTokenProvider
            if not isinstance(value, (OidcTokenProvider, MskIamTokenProvider)):  # pragma: no cover - only ours
                raise ConfigurationError(f"{what}: OAUTHBEARER: only OIDC client credentials and MSK IAM map to librdkafka")
            out.update(value.librdkafka_properties())
        elif arg in names:
            out[names[arg]] = value
        elif arg in _DRIVER_ONLY or arg == "transaction_timeout_ms":
            continue
        else:
            raise ConfigurationError(f"{what}: option 'kafka.{arg.replace('_', '.')}' has no librdkafka counterpart "
                                     "in twophase; drop it, or set option kafkaClient=kafka-python")
    return out
