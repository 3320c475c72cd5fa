"""Spark's own S3A filesystem (hadoop-aws) on the project's S3 server: the jars ``scripts/hadoop_aws.sh fetch``
puts under .venv/jvm/ and the settings that point S3A at a loopback radosgw (path-style, no TLS, static keys).

Used by ``integration/s3/test_s3a_reader.py`` and ``bench/bench_s3_spark.py``."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
POM = ROOT / "scripts" / "jvm" / "hadoop-aws" / "pom.xml"


def hadoop_version() -> str:
    return re.search(r"<hadoop.version>(.*?)</hadoop.version>", POM.read_text()).group(1)


def jars() -> Optional[list[str]]:
    """The fetched hadoop-aws jars, or None when ``scripts/hadoop_aws.sh fetch`` has not run (or PySpark
    bundles another Hadoop than the pom names)."""
    import pyspark
    bundled = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar"))
    if not any(p.endswith(f"-{hadoop_version()}.jar") for p in bundled):
        return None
    d = ROOT / ".venv" / "jvm" / f"hadoop-aws-{hadoop_version()}"
    if not (d / ".complete").exists():
        return None
    return sorted(str(p) for p in d.glob("*.jar"))


def s3a_settings(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """The ``spark.hadoop.fs.s3a.*`` settings that point S3A at a loopback radosgw on ``endpoint``
    (``http://host:port``): path-style access, no TLS, the simple (static keys) credentials provider.
    Also used by ``integration/delta_spark/s3a_delta.py`` (delta-spark in .venv-delta)."""
    h = "spark.hadoop.fs.s3a."
    return {
        h + "endpoint": endpoint,
        h + "endpoint.region": "us-east-1",
        h + "path.style.access": "true",
        h + "connection.ssl.enabled": "false",
        h + "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        h + "access.key": access_key,
        h + "secret.key": secret_key,
        # radosgw answers XAmzContentSHA256Mismatch to the SDK's signed (aws-chunked) payloads over plain
        # HTTP: sign the headers only (UNSIGNED-PAYLOAD), and no optional request checksums
        h + "checksum.generation": "false",
        h + "request.md5.header": "true",
        h + "signing-algorithm": "AWS4UnsignedPayloadSignerType",
    }


def spark_conf(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """Spark settings for s3a:// on ``endpoint``: the jars and :func:`s3a_settings`."""
    found = jars()
    if found is None:
        raise RuntimeError("hadoop-aws is not fetched: run `bash scripts/hadoop_aws.sh fetch`")
    return {"spark.jars": ",".join(found), **s3a_settings(endpoint, access_key, secret_key)}
