"""``kafka.*`` options checked against the Kafka client a twophase sink or source actually uses (option kafkaClient).

One rule for the sink's producers and the source's consumers (:func:`split_client_options`): an option kafka-python
takes goes to :func:`twophase._kafka.kafka_python_config`; with kafkaClient=librdkafka, an option kafka-python does not
know is taken when the installed librdkafka takes it (:func:`librdkafka_verdict`: a producer or consumer configured,
never connected, closed at once) and goes to the executors' librdkafka clients only; refused, naming the option, the
client and the fix: a property the caller reserves (exactly-once settings, the source's own), librdkafka-only
connection / security names (:data:`twophase._kafka.RDKAFKA_CONNECTION_PREFIXES`: the driver's kafka-python
connections need them too), a name or value librdkafka refuses, a property of the other role. No error shows the
value of a secret-named option, nor the value of an option librdkafka refuses by its name (it may be a secret under a
name that does not say so, e.g. a PEM private key as ``kafka.ssl_key``; review 15).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Literal, Mapping, Optional

from twophase._kafka import RDKAFKA_CONNECTION_PREFIXES
from twophase.errors import ConfigurationError

Role = Literal["producer", "consumer"]
_OTHER = {"producer": "consumer", "consumer": "producer"}
_CLIENT_CLASS = {"producer": "KafkaProducer", "consumer": "KafkaConsumer"}
_PART = {"producer": "writer", "consumer": "reader"}


def client_versions() -> str:
    """``confluent-kafka X, librdkafka Y`` (informational, for error messages)."""
    try:
        import confluent_kafka
        version, lib = confluent_kafka.version(), confluent_kafka.libversion()
        return (f"confluent-kafka {version[0] if isinstance(version, tuple) else version}, "
                f"librdkafka {lib[0] if isinstance(lib, tuple) else lib}")
    except Exception:  # noqa: BLE001 - informational  # pragma: no cover
        return "confluent-kafka"


def librdkafka_verdict(name: str, value: str, role: Role) -> Optional[str]:
    """What the installed librdkafka says of property ``name=value`` for ``role``: None if it takes it, else its
    reason ("No such configuration property", "Invalid value ...", "a consumer property", "`acks` must be set to
    `all` ..."). A producer is configured as the sink's are (transactional) and a consumer with a group, neither
    connected (no bootstrap servers), and closed at once; their log lines are kept out of the logs. The reason never
    shows the value of a secret-named property (:mod:`twophase._redact`)."""
    from confluent_kafka import Consumer, KafkaException, Producer
    from twophase._redact import is_secret_name, redact_text, redact_values
    warnings: list[str] = []

    class _Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())
    quiet = logging.getLogger(f"twophase.kafka.librdkafka.option-check.{role}")
    quiet.propagate, seen = False, _Seen()
    quiet.addHandler(seen)
    reason: Optional[str] = None
    try:
        if role == "producer":
            client: Any = Producer({"transactional.id": "twophase-option-check", name: value, "logger": quiet})
            client.close(0) if hasattr(client, "close") else None
        else:
            client = Consumer({"group.id": "twophase-option-check", name: value, "logger": quiet})
            client.close()
        del client
    except KafkaException as e:
        reason = e.args[0].str() if e.args and hasattr(e.args[0], "str") else str(e)
    except (TypeError, ValueError) as e:
        reason = str(e)
    finally:
        quiet.removeHandler(seen)
    other = _OTHER[role]
    if reason is None and any(f"is a {other} property" in w for w in warnings):
        reason = f"a {other} property, ignored by a {role}"
    if reason is not None:
        reason = redact_text(reason)
        if is_secret_name(name):
            reason = redact_values(reason, [value])
    return reason


def split_client_options(kraw: Mapping[str, Any], client: str, *, what: str, role: Role,
                         kafka_python_takes: Callable[[str], bool],
                         reserved_any_client: Mapping[str, str] | None = None,
                         reserved_librdkafka: Mapping[str, str] | None = None,
                         driver_connections: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``kafka.*`` options as (those kafka-python takes; the librdkafka-only properties, as given), see the module.

    ``reserved_any_client`` (librdkafka name -> why) is refused with either client (the sink's exactly-once settings),
    ``reserved_librdkafka`` only with librdkafka (the source's own settings); ``driver_connections`` names what the
    driver's kafka-python connections do, for the connection-name error."""
    from twophase._redact import MASK, is_secret_name, redact_text
    from twophase._versions import require
    reserved_any_client = reserved_any_client or {}
    reserved_librdkafka = reserved_librdkafka or {}
    part, cls = _PART[role], _CLIENT_CLASS[role]
    taken: dict[str, Any] = {}
    extra: dict[str, str] = {}
    for key, value in kraw.items():
        name = key[len("kafka."):] if key.startswith("kafka.") else key
        if name in reserved_any_client:
            raise ConfigurationError(f"{what}: option {key!r} cannot be set (with either kafkaClient): "
                                     f"{reserved_any_client[name]}")
        if not key.startswith("kafka.") or kafka_python_takes(name):
            taken[key] = value
            continue
        if client == "kafka-python":
            hint = ""
            try:
                if librdkafka_verdict(name, str(value), role) is None:
                    hint = (f"; {name!r} is a librdkafka {role} property: set option kafkaClient=librdkafka (the "
                            f"default {part}, confluent-kafka) to use it")
            except ImportError:  # pragma: no cover - confluent-kafka not installed: no hint
                pass
            raise ConfigurationError(
                f"{what}: option {key!r} is not a kafka-python {role} setting ({name.replace('.', '_')!r}), and the "
                f"{part} in use is kafka-python (option kafkaClient=kafka-python){hint}; otherwise drop it, or use the "
                f"name of one of kafka-python's {cls} settings (kafka.<setting with dots>)")
        if name in reserved_librdkafka:
            raise ConfigurationError(f"{what}: option {key!r} (a librdkafka property, kafkaClient=librdkafka) cannot "
                                     f"be set: {reserved_librdkafka[name]}")
        if name.startswith(RDKAFKA_CONNECTION_PREFIXES):
            raise ConfigurationError(
                f"{what}: option {key!r} is a librdkafka-only connection setting (kafkaClient=librdkafka); the "
                f"driver's Kafka connections ({driver_connections}) need it too, so give it under its Spark / "
                "kafka-python name (e.g. kafka.sasl.plain.username, kafka.ssl.cafile, kafka.security.protocol), which "
                "twophase maps to librdkafka's")
        require("confluent-kafka", what=f"{what}'s option {key!r} (a librdkafka property: kafkaClient=librdkafka)")
        verdict = librdkafka_verdict(name, str(value), role)
        if verdict is not None:
            by_name = verdict.startswith(("No such configuration property", "Internal property"))
            shown = "" if by_name else "=" + (MASK if is_secret_name(key) else redact_text(repr(value)))
            if is_secret_name(key) and str(value):
                verdict = verdict.replace(str(value), MASK)
            raise ConfigurationError(
                f"{what}: option {key!r}{shown} is refused by the {part} in use, librdkafka (option "
                f"kafkaClient=librdkafka; {client_versions()}): {redact_text(verdict)}. It is not a kafka-python "
                f"setting either; fix the name or value against librdkafka's {role} properties (CONFIGURATION.md of "
                f"that version) or kafka-python's {cls} settings, or drop it")
        extra[name] = str(value)
    return taken, extra
