"""twophase-delta for PySpark's automatic discovery of Python data sources: no ``twophase.spark.register`` needed.

See :mod:`twophase.spark.discovery`.
"""

from twophase.spark.discovery import default_source

DefaultSource = default_source("twophase.sinks.delta_spark:DeltaDataSource", "twophase-delta", extra="delta")
