"""Spark integration: ``register(spark)`` makes every twophase format available to a SparkSession.

Formats: ``twophase-file`` (exactly-once files); further sinks and sources register here when their
module is importable (``twophase-kafka``, ``twophase-s3``, ``twophase-delta``).
"""

from __future__ import annotations

import importlib
from typing import Any

from twophase._logging import get_logger
from twophase.errors import MissingDependencyError

_log = get_logger(__name__)

#: "module:Class" of every Spark data source twophase offers; optional ones are skipped if their extra is missing
DATA_SOURCES: tuple[str, ...] = (
    "twophase.spark.file:FileDataSource",
    "twophase.spark.kafka:KafkaDataSource",
    "twophase.spark.s3:S3DataSource",
    "twophase.spark.delta:DeltaDataSource",
)


def data_source_classes() -> list[type]:
    """The importable twophase data source classes."""
    out = []
    for spec in DATA_SOURCES:
        module, _, cls = spec.partition(":")
        try:
            out.append(getattr(importlib.import_module(module), cls))
        except ModuleNotFoundError as e:
            _log.debug("data_source_unavailable", source=spec, error=str(e))
    return out


def register(spark: Any) -> list[str]:
    """Register every available twophase format with ``spark``; returns their names."""
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise MissingDependencyError("twophase.spark needs PySpark: pip install 'twophase[spark]'") from e
    names = []
    for cls in data_source_classes():
        spark.dataSource.register(cls)
        names.append(cls.name())
    _log.info("registered", formats=names)
    return names


# Bound here, after the submodule of the same name is imported: a lazy import inside a wrapper function
# replaced this attribute with the submodule on first use, so a second call raised "'module' object is
# not callable". The submodule needs no PySpark at import time.
from twophase.spark.foreach_batch import foreach_batch  # noqa: E402
