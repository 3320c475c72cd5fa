"""Spark format ``twophase-file``: the exactly-once file sink."""

from __future__ import annotations

from pyspark.sql.types import StructType

from sinks.files import FileSink
from twophase.spark.datasource import TwoPhaseSinkDataSource


class FileDataSource(TwoPhaseSinkDataSource):
    """``df.writeStream.format("twophase-file").option("path", ...)`` — see :mod:`sinks.files`."""

    short_name = "twophase-file"

    def build_sink(self, schema: StructType) -> FileSink:
        return FileSink.from_options(dict(self.options), schema)
