"""twophase-s3 for PySpark's automatic discovery of Python data sources: no ``twophase.spark.register`` needed.

See :mod:`twophase.spark.discovery`.
"""

from twophase.spark.discovery import default_source

DefaultSource = default_source("twophase.sinks.s3_spark:S3DataSource", "twophase-s3", extra="s3")
