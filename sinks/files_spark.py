"""Spark format ``twophase-file``: the exactly-once file sink (registered by :mod:`twophase.spark`)."""

from __future__ import annotations

from pyspark.sql.types import StructType

from twophase.sinks.files import FileSink
from twophase.sinks._spark_types import check_columns
from twophase.spark.datasource import TwoPhaseSinkDataSource


class FileDataSource(TwoPhaseSinkDataSource):
    """``df.writeStream.format("twophase-file").option("path", ...)`` — see :mod:`twophase.sinks.files`."""

    short_name = "twophase-file"
    spec_class = FileSink

    def build_sink(self, schema: StructType) -> FileSink:
        """Parse the options, then refuse (on the driver) every column the chosen format cannot round-trip."""
        sink = FileSink.from_options(dict(self.options), schema)
        self.check_sink_columns(self.short_name, sink, schema)
        return sink

    @classmethod
    def check_sink_columns(cls, what: str, sink: FileSink, schema: StructType) -> None:
        check_columns(what, schema, sink.options.format, partition_by=sink.options.partition_by)
