"""Spark's own S3A filesystem (hadoop-aws at the Hadoop version PySpark bundles) against the project's S3
server: S3A writes and reads there, and reads twophase-s3's output back with the rows twophase wrote (an
oracle: a reader that is not twophase's). Skipped when ``scripts/hadoop_aws.sh fetch`` has not run."""

from __future__ import annotations

import pytest

from _support import S3Server
import s3a

pytestmark = [pytest.mark.s3,
              pytest.mark.skipif(s3a.jars() is None, reason="hadoop-aws jars not fetched (bash scripts/hadoop_aws.sh fetch, "
                                 "run by scripts/setup.sh) or PySpark bundles another Hadoop than scripts/jvm/hadoop-aws/pom.xml")]


@pytest.fixture(scope="module")
def spark(s3_server: S3Server):
    from pyspark.sql import SparkSession
    import twophase.spark
    from integration.spark_session import own_spark

    b = SparkSession.builder.master("local[2]").appName("twophase-s3a").config("spark.ui.enabled", "false")
    b = b.config("spark.sql.shuffle.partitions", "2")
    for k, v in s3a.spark_conf(s3_server.endpoint, s3_server.access_key, s3_server.secret_key).items():
        b = b.config(k, v)
    session = own_spark(b)
    twophase.spark.register(session)
    yield session
    session.stop()


def test_s3a_writes_and_reads_the_project_s3_server(spark, s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    spark.range(0, 500, numPartitions=2).write.parquet(f"s3a://{bucket}/plain")
    assert sorted(r.id for r in spark.read.parquet(f"s3a://{bucket}/plain").collect()) == list(range(500))
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket, Prefix="plain/")["Contents"]]
    assert "plain/_SUCCESS" in keys and sum(k.endswith(".parquet") for k in keys) == 2


def test_s3a_reads_twophase_s3_output_row_for_row(spark, s3_server: S3Server) -> None:
    from pyspark.sql import functions as F
    bucket = s3_server.new_bucket()
    df = spark.range(0, 3000, numPartitions=3).select("id", (F.col("id") % 7).alias("k"),
                                                       F.concat(F.lit("v"), F.col("id").cast("string")).alias("s"))
    w = df.write.format("twophase-s3").mode("append").option("path", f"s3://{bucket}/out").option("writeId", "w1")
    for k, v in s3_server.options().items():
        w = w.option(k, v)
    w.save()
    # twophase's transaction log (_twophase/) is a hidden directory to Spark's file listing
    got = spark.read.parquet(f"s3a://{bucket}/out").select("id", "k", "s").collect()
    assert len(got) == 3000
    assert sorted((r.id, r.k, r.s) for r in got) == [(i, i % 7, f"v{i}") for i in range(3000)]
