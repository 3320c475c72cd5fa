"""twophase-kafka for PySpark's automatic discovery of Python data sources: no ``twophase.spark.register`` needed.

See :mod:`twophase.spark.discovery`.
"""

from twophase.spark.discovery import default_source

DefaultSource = default_source("twophase.sinks.kafka_spark:KafkaDataSource", "twophase-kafka", extra="kafka")
