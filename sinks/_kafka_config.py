"""Spark-style ``kafka.*`` options to kafka-python keyword arguments (shared by the Kafka sink and source)."""

from __future__ import annotations

from typing import Any, Mapping

from twophase.errors import ConfigurationError


def kafka_python_config(raw: Mapping[str, Any], defaults: Mapping[str, Any], *, what: str,
                        reserved: Mapping[str, str] = {}) -> dict[str, Any]:
    """Map ``kafka.a.b`` options to kafka-python ``a_b`` arguments, typed like ``defaults``.

    A key in ``reserved`` (``a.b`` -> why and what to use instead) or a key kafka-python does not
    know is a :class:`ConfigurationError` naming the option.
    """
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not key.startswith("kafka."):
            continue
        name = key[len("kafka."):]
        if name in reserved:
            raise ConfigurationError(f"{what}: option {key!r} cannot be set: {reserved[name]}")
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
            raise ConfigurationError(f"{what}: option {key!r}={value!r} must be a number") from None
    return out
