"""Spark format ``twophase-delta``: exactly-once appends to a Delta table, one Delta commit per micro-batch."""

from __future__ import annotations

from pyspark.sql.types import StructType

from twophase.sinks.delta import DeltaSink
from twophase.sinks._spark_types import arrow_schema, check_columns, check_partition_columns
from twophase.spark.datasource import TwoPhaseSinkDataSource


class DeltaDataSource(TwoPhaseSinkDataSource):
    """``df.writeStream.format("twophase-delta").option("path", ...)`` — see :mod:`twophase.sinks.delta`.

    The stream's schema is checked on the driver before each batch: every column type must round-trip
    through Delta (:func:`twophase.sinks._spark_types.check_columns`; ``timestamp_ntz`` columns get the table
    feature ``timestampNtz`` from deltalake), then against the table (option ``mergeSchema`` adds new
    columns). ``timestamp`` columns are Delta ``timestamp`` (UTC instants) whatever the session time zone.
    """

    short_name = "twophase-delta"
    spec_class = DeltaSink

    def build_sink(self, schema: StructType) -> DeltaSink:
        check_columns(self.short_name, schema, "delta")  # before the Arrow conversion, which has no form for some types
        sink = DeltaSink.from_options(dict(self.options), arrow_schema(schema))
        check_partition_columns(self.short_name, schema, "delta", sink.options.partition_by)
        return sink

    @classmethod
    def check_sink_columns(cls, what: str, sink: DeltaSink, schema: StructType) -> None:
        """Refuse columns Delta cannot hold exactly; a sink built without a schema (``foreach_batch(DeltaSink.
        from_options(options))``) takes the batch's, as this format's sink does: the table is then created from
        the first batch's columns, or checked against them, on the driver (``validate_destination``)."""
        check_columns(what, schema, "delta", partition_by=sink.partition_by or sink.options.partition_by)
        if sink.options.schema is None:
            sink.adopt_schema(arrow_schema(schema))
