"""twophase-kafka column types, as Spark's Kafka sink takes them: key/value string or binary, topic string,
partition int, headers array<struct<key: string, value: binary>>. They round-trip byte for byte (nulls,
empty values, non-ASCII text); any other type is refused on the driver with the column, its type and the
fix (see sinks/_spark_types.py). One SparkSession for the module.
"""

from __future__ import annotations

import pytest

from integration.kafka.broker import create_topic, read_topic, unique
from integration.spark_session import make_spark

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

DDL = "id int, ks string, kb binary, vs string, vb binary, p int, h array<struct<key:string,value:binary>>"
ROWS = [
    (0, "k-é😀", b"\x00\xff", "v-é😀", b"\x00\x01", 0, [("h1", b"\x00x"), ("h2", b"")]),
    (1, None, None, "", b"", 1, []),
    (2, "", b"", None, None, 1, None),
]


@pytest.fixture(scope="module")
def spark():
    s = make_spark("twophase-kafka-types-tests")
    yield s  # on the shared context: not stopped (integration/spark_session.py)


@pytest.fixture(scope="module")
def source(spark, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("kafka-types") / "in")
    spark.createDataFrame(ROWS, DDL).coalesce(1).write.parquet(path)
    return path


def _run(spark, source, exprs, options, timeout=180) -> str:
    df = spark.readStream.schema(DDL).parquet(source).selectExpr(*exprs)
    w = df.writeStream.format("twophase-kafka").trigger(availableNow=True)
    for k, v in options.items():
        w = w.option(k, v)
    try:
        q = w.start()
        assert q.awaitTermination(timeout), "query did not finish"
        err = q.exception()
    except AssertionError:
        raise
    except Exception as e:
        return str(e)
    return "" if err is None else str(err)


@pytest.mark.parametrize("exprs, fragments", [
    (["cast(id as bigint) as value"], ["column 'value' is bigint", "string or binary", "cast"]),
    (["id as key", "vs as value"], ["column 'key' is int", "string or binary"]),
    (["vs as value", "id as topic"], ["column 'topic' is int", "cast it to string"]),
    (["vs as value", "cast(p as bigint) as partition"], ["column 'partition' is bigint", "cast it to int"]),
    (["vs as value", "array(named_struct('key', 'a', 'value', 1)) as headers"],
     ["column 'headers' is array<struct<key:string,value:int>>", "array<struct<key:string,value:binary>>"]),
], ids=["value-bigint", "key-int", "topic-int", "partition-bigint", "headers-int-value"])
def test_kafka_types_refused_on_the_driver(spark, source, tmp_path, exprs, fragments):
    # no broker is needed: the check runs before the sink connects
    msg = _run(spark, source, exprs, {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "never",
                                      "checkpointLocation": str(tmp_path / "ck"),
                                      "prefixRegistry": str(tmp_path / "registry")})
    assert "ConfigurationError" in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)


@pytest.mark.parametrize("key, value", [("ks", "vb"), ("kb", "vs")], ids=["string-key-binary-value",
                                                                             "binary-key-string-value"])
def test_kafka_types_round_trip(spark, source, tmp_path, registry, kafka_bootstrap, key, value):
    topic = create_topic(kafka_bootstrap, unique("types"), 2)
    msg = _run(spark, source, [f"{key} as key", f"{value} as value", "p as partition", "h as headers",
                               f"'{topic}' as topic"],
               {"kafka.bootstrap.servers": kafka_bootstrap, "checkpointLocation": str(tmp_path / "ck"),
                "prefixRegistry": registry})
    assert msg == "", msg

    def as_bytes(v):
        return v.encode() if isinstance(v, str) else v

    cols = {n: i for i, n in enumerate(["id", "ks", "kb", "vs", "vb", "p", "h"])}
    want = [(as_bytes(r[cols[key]]), as_bytes(r[cols[value]]), r[cols["p"]], [tuple(h) for h in r[cols["h"]] or []])
            for r in ROWS]
    got = [(rec.key, rec.value, rec.partition, [(k, bytes(v)) for k, v in rec.headers or []])
           for rec in read_topic(kafka_bootstrap, topic)]
    assert sorted(got, key=repr) == sorted(want, key=repr)  # nulls stay null, empty stays empty
