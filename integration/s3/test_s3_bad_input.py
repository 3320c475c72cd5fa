"""Bad input to twophase-s3 on real Spark: a clear error on the driver, nothing committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from _support import S3Server, write_input

pytestmark = [pytest.mark.spark, pytest.mark.s3]


@pytest.fixture(scope="module")
def spark():
    from integration.spark_session import make_spark
    s = make_spark(f"twophase-{__name__}")
    yield s  # on the shared context: not stopped (integration/spark_session.py)


def run_stream(spark, tmp: Path, fmt: str, options: dict[str, str]) -> str:
    """Start the stream; return the error text it fails with (the test fails if it succeeds)."""
    write_input(tmp / "in", files=2, rows=10)
    df = spark.readStream.schema("id long, p string, v double").json(str(tmp / "in"))
    try:
        q = (df.writeStream.format(fmt).options(**options).option("checkpointLocation", str(tmp / "ck"))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        err = q.exception()
    except Exception as e:  # errors in streamWriter may surface at start()
        return str(e)
    assert err is not None, "the query succeeded but should have failed"
    return str(err)


def objects(server: S3Server, bucket: str) -> list[str]:
    return [o["Key"] for o in server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_s3_missing_bucket_is_a_configuration_error(spark, s3_server: S3Server, tmp_path) -> None:
    msg = run_stream(spark, tmp_path, "twophase-s3", {"path": "s3://no-such-bucket-twophase/out", **s3_server.options()})
    assert "ConfigurationError" in msg and "bucket 'no-such-bucket-twophase'" in msg and "does not exist" in msg


def test_s3_wrong_credentials_are_a_configuration_error_and_nothing_is_written(spark, s3_server: S3Server,
                                                                                 tmp_path) -> None:
    if s3_server.kind == "moto":
        pytest.skip("moto's server does not check credentials")
    bucket = s3_server.new_bucket()
    opts = {**s3_server.options(), "s3.secretAccessKey": "wrong-secret"}
    msg = run_stream(spark, tmp_path, "twophase-s3", {"path": f"s3://{bucket}/out", **opts})
    assert "ConfigurationError" in msg and "refused the credentials" in msg
    assert objects(s3_server, bucket) == []
    assert s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_s3_part_size_below_minimum_is_refused(spark, s3_server: S3Server, tmp_path) -> None:
    bucket = s3_server.new_bucket()
    msg = run_stream(spark, tmp_path, "twophase-s3", {"path": f"s3://{bucket}/out", "partSize": "1m",
                                                       **s3_server.options()})
    assert "partSize" in msg and "5 MiB" in msg
    assert objects(s3_server, bucket) == []
