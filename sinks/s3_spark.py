"""Spark format ``twophase-s3``: exactly-once objects on S3 through multipart uploads."""

from __future__ import annotations

from pyspark.sql.types import StructType

from twophase.sinks.s3 import S3Sink
from twophase.sinks._spark_types import check_columns
from twophase.spark.datasource import TwoPhaseSinkDataSource


class S3DataSource(TwoPhaseSinkDataSource):
    """``df.writeStream.format("twophase-s3").option("path", "s3://bucket/prefix")`` — see :mod:`twophase.sinks.s3`."""

    short_name = "twophase-s3"
    spec_class = S3Sink

    def build_sink(self, schema: StructType) -> S3Sink:
        """Parse the options, then refuse (on the driver) every column the chosen format cannot round-trip."""
        sink = S3Sink.from_options(dict(self.options), schema)
        self.check_sink_columns(self.short_name, sink, schema)
        return sink

    @classmethod
    def check_sink_columns(cls, what: str, sink: S3Sink, schema: StructType) -> None:
        check_columns(what, schema, sink.options.format, partition_by=sink.options.partition_by)
