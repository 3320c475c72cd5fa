"""PySpark's automatic discovery of Python data sources, for every twophase format.

PySpark looks for top-level modules named ``pyspark_*`` that define a ``DefaultSource`` (a
``pyspark.sql.datasource.DataSource``). It does so once per session, at the first data source lookup
(``pyspark/sql/worker/lookup_data_sources.py``), and registers each module's source under its
``name()``. twophase ships ``pyspark_twophase_files`` (format ``twophase-file``), ``pyspark_twophase_kafka``, ``pyspark_twophase_s3``
and ``pyspark_twophase_delta``. After ``pip install 'twophase[kafka]'``, ``format("twophase-kafka")`` works
in a fresh SparkSession without ``twophase.spark.register``.

An exception raised while importing one such module breaks the lookup of *every* Python data source of
the session. So :func:`default_source` never raises: if the connector cannot be imported (extra missing,
version outside the tested range), ``DefaultSource`` is a stand-in of the same name. Using it raises the
import's :class:`~twophase.errors.MissingDependencyError`, with the fix, at the user's call instead of a
"data source not found".
"""

from __future__ import annotations

import importlib
from typing import Any

from pyspark.sql.datasource import DataSource

from twophase.errors import MissingDependencyError


def default_source(spec: str, name: str, extra: str) -> type:
    """The data source class ``spec`` (``"module:Class"``), or a stand-in named ``name`` that raises why not."""
    module, _, cls = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except Exception as e:  # noqa: BLE001 - any failure here would break every Python data source lookup
        reason = str(e) if isinstance(e, MissingDependencyError) else (
            f"{name} cannot be used: {type(e).__name__}: {e}; pip install 'twophase[{extra}]'")
        return _unavailable(name, reason)


def _unavailable(format_name: str, reason: str) -> type:
    def fail(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise MissingDependencyError(reason)

    return type("UnavailableTwoPhaseSource", (DataSource,), {
        "name": classmethod(lambda cls: format_name), "schema": fail, "reader": fail, "writer": fail,
        "streamReader": fail, "streamWriter": fail, "simpleStreamReader": fail, "__doc__": reason})
