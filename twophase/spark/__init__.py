"""Spark integration: the generic adapter and the registry of formats.

``register(spark)`` makes every twophase format available to a SparkSession. Each connector owns its
Spark data source class (``twophase.sinks.<name>_spark``); this package never imports a concrete
connector except through the registry below: the built-in entries of :data:`DATA_SOURCES` and the
entry points of group ``twophase.spark_formats`` (``name = "package.module:DataSourceClass"``), by
which a connector of another distribution registers itself. An entry whose module cannot be imported
(its extra is not installed, or a library is outside the tested versions, see :mod:`twophase._versions`)
is skipped with a WARNING naming the fix; using that format then fails with the same message.

Without ``register()``: PySpark finds Python data sources by itself in top-level modules named
``pyspark_*`` that define ``DefaultSource``; twophase installs one per format
(``pyspark_twophase_files``, ``_kafka``, ``_s3``, ``_delta``; see :mod:`twophase.spark.discovery`).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Optional

from twophase._logging import get_logger
from twophase.errors import MissingDependencyError

_log = get_logger(__name__)

#: "module:Class" of every Spark data source twophase offers; optional ones are skipped if their extra is missing
DATA_SOURCES: tuple[str, ...] = (
    "twophase.sinks.files_spark:FileDataSource",
    "twophase.sinks.kafka_spark:KafkaDataSource",
    "twophase.sinks.s3_spark:S3DataSource",
    "twophase.sinks.delta_spark:DeltaDataSource",
)

#: entry-point group by which other distributions add formats
ENTRY_POINT_GROUP = "twophase.spark_formats"


def _entries() -> list[str]:
    from importlib.metadata import entry_points
    extra = [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return [*DATA_SOURCES, *(e for e in extra if e not in DATA_SOURCES)]


@functools.lru_cache(maxsize=1)
def _loaded() -> tuple[type, ...]:
    """Import every registered format once per process (``foreach_batch`` asks before every batch)."""
    out = []
    for spec in _entries():
        module, _, cls = spec.partition(":")
        try:
            out.append(getattr(importlib.import_module(module), cls))
        except (ImportError, MissingDependencyError) as e:  # its extra is missing or of the wrong version
            _log.warning("data_source_unavailable", source=spec, reason=str(e))
    return tuple(out)


def data_source_classes() -> list[type]:
    """The importable twophase data source classes (built-in and registered by entry point)."""
    return list(_loaded())


def data_source_for(sink: Any) -> Optional[type]:
    """The registered data source class whose ``spec_class`` (or one of its ``also_builds``) is ``type(sink)``
    (None if none is)."""
    for cls in data_source_classes():
        if getattr(cls, "spec_class", None) is type(sink) or type(sink) in getattr(cls, "also_builds", ()):
            return cls
    return None


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
from twophase.spark.native import native_sink  # noqa: E402


def data_source(sink_class: type, name: str) -> type:
    """A PySpark data source class for a user's :class:`~twophase.TwoPhaseCommitSink` subclass, format ``name``:
    ``spark.dataSource.register(twophase.spark.data_source(MySink, name="my-sink"))``, then
    ``df.writeStream.format("my-sink").option("sink_id", ...)...`` or ``df.write.format("my-sink")...save()``; the
    options are the constructor's keyword arguments (strings). See :mod:`twophase.spark._user_format`."""
    from twophase.spark._user_format import data_source as make
    return make(sink_class, name)
