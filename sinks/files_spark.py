"""Spark format ``twophase-file``: the exactly-once file sink (registered by :mod:`twophase.spark`): a local or
mounted path (:mod:`twophase.sinks.files`), or an Azure path (``abfss://``..., :mod:`twophase.sinks.azure_files`)."""

from __future__ import annotations

from pyspark.sql.types import StructType

from twophase.sinks.azure_files import AzureFilesSink
from twophase.sinks.files import FileSink, file_sink_from_options
from twophase.sink import SinkSpec
from twophase.sinks._spark_types import check_columns
from twophase.spark.datasource import TwoPhaseSinkDataSource


class FileDataSource(TwoPhaseSinkDataSource):
    """``df.writeStream.format("twophase-file").option("path", ...)`` — see :mod:`twophase.sinks.files`."""

    short_name = "twophase-file"
    spec_class = FileSink
    also_builds = (AzureFilesSink,)

    def build_sink(self, schema: StructType) -> SinkSpec:
        """Parse the options (an Azure path takes the Azure file sink), then refuse (on the driver) every column
        the chosen format cannot round-trip."""
        sink = file_sink_from_options(dict(self.options), schema)
        self.check_sink_columns(self.short_name, sink, schema)
        return sink

    @classmethod
    def check_sink_columns(cls, what: str, sink: SinkSpec, schema: StructType) -> None:
        check_columns(what, schema, sink.options.format, partition_by=sink.options.partition_by)  # type: ignore[attr-defined]
