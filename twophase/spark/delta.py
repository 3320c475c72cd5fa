"""Spark format ``twophase-delta``: exactly-once appends to a Delta table, one Delta commit per micro-batch."""

from __future__ import annotations

from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from sinks.delta import DeltaSink
from twophase.spark.datasource import TwoPhaseSinkDataSource


class DeltaDataSource(TwoPhaseSinkDataSource):
    """``df.writeStream.format("twophase-delta").option("path", ...)`` — see :mod:`sinks.delta`.

    The stream's schema is checked against the table on the driver before each batch (option
    ``mergeSchema`` adds new columns).
    """

    short_name = "twophase-delta"

    def build_sink(self, schema: StructType) -> DeltaSink:
        return DeltaSink.from_options(dict(self.options), to_arrow_schema(schema))
