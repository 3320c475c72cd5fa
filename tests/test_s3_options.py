"""Fast tests of the S3 sink's and S3 log store's pure parts (no server): options, names, ETags."""

from __future__ import annotations

import hashlib
import re
import pickle

import pyarrow as pa
import pytest

from twophase.sinks.delta import delta_storage_options
from twophase.naming import own_part_checkpoint
from twophase.sinks._s3 import multipart_etag
from twophase.sinks.s3 import S3Sink, S3SinkOptions, object_name
from twophase.errors import ConfigurationError
from twophase.log import open_store
from twophase.log_s3 import S3Config, S3LogStore, parse_s3_url
from twophase.sink import TransactionContext


def test_s3_options_parse_path_and_defaults() -> None:
    o = S3SinkOptions.from_options({"path": "s3://bkt/a/b/", "checkpointLocation": "/ck"})
    assert (o.bucket, o.prefix, o.format, o.part_size, o.owner) == ("bkt", "a/b", "parquet", 5 << 20, "/ck")


@pytest.mark.parametrize("raw, fragment", [
    ({"path": "/local/dir"}, "not an S3 URL"),
    ({"path": "s3:///x"}, "names no bucket"),
    ({"path": "s3://b/x", "partSize": "1m"}, "5 MiB"),
    ({"path": "s3://b/x", "partSize": "16m", "maxFileSize": "8m"}, "maxFileSize"),
    ({"path": "s3://b/x", "s3.accessKeyId": "k"}, "go together"),
    ({"path": "s3://b/x", "nope": "1"}, "unknown option"),
    ({"path": "s3://b/x", "format": "avro"}, "format"),
])
def test_s3_options_reject_bad_values_naming_the_option(raw, fragment) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        S3SinkOptions.from_options(raw)


def test_s3_options_check_partition_columns_against_the_schema() -> None:
    schema = pa.schema([("id", pa.int64()), ("p", pa.string())])
    with pytest.raises(ConfigurationError, match="not columns"):
        S3SinkOptions.from_options({"path": "s3://b/x", "partitionBy": "q"}, schema)
    with pytest.raises(ConfigurationError, match="every column"):
        S3SinkOptions.from_options({"path": "s3://b/x", "partitionBy": "id,p"}, schema)


def test_s3_multipart_etag_is_md5_of_part_md5s() -> None:
    parts = [b"a" * 10, b"b" * 3]
    etags = [{"PartNumber": i + 1, "ETag": f'"{hashlib.md5(p).hexdigest()}"'} for i, p in enumerate(parts)]
    want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-2"
    assert multipart_etag(etags) == want


def test_s3_object_names_carry_the_sink_and_the_checkpoint_id() -> None:
    name = object_name(TransactionContext("s", 42, "3", attempt_uid="0123456789ab"), 7, "parquet")
    assert own_part_checkpoint(name, "s") == 42 and "0123456789ab" in name
    assert own_part_checkpoint(name, "another sink") is None  # a sweep by another sink never matches it
    assert own_part_checkpoint("data.parquet", "s") is None


def test_s3_sink_and_log_store_pickle_without_a_client() -> None:
    sink = S3Sink.from_options({"path": "s3://b/x", "s3.endpoint": "http://127.0.0.1:1"})
    clone = pickle.loads(pickle.dumps(sink))
    assert clone.options == sink.options and clone._client is None
    store = S3LogStore("s3://b/x/log", S3Config(endpoint="http://127.0.0.1:1"))
    assert pickle.loads(pickle.dumps(store)).location == "s3://b/x/log"


def test_s3_log_store_is_registered_for_s3_locations() -> None:
    assert isinstance(open_store("s3://bucket/some/log"), S3LogStore)
    assert parse_s3_url("s3a://b/p/") == ("b", "p")


def test_s3_log_inv4_lock_is_reentrant_and_exclusive() -> None:
    import threading
    store = S3LogStore("s3://b/lock-test")
    other = S3LogStore("s3://b/lock-test")  # same location: same lock file, another open file description
    nested_done = threading.Event()

    def nested() -> None:
        with store.lock():
            with store.lock():
                nested_done.set()

    t = threading.Thread(target=nested, daemon=True)
    t.start()
    t.join(5)
    assert nested_done.is_set(), "a nested lock() of the same store deadlocked"
    acquired = threading.Event()

    def grab() -> None:
        with other.lock():
            acquired.set()

    with store.lock():
        threading.Thread(target=grab, daemon=True).start()
        assert not acquired.wait(0.3), "another store of the same location took the lock while it was held"
    assert acquired.wait(5), "the lock was not handed over after release"


def test_s3_options_client_timeouts_reach_boto3_and_delta() -> None:
    """s3.connectTimeout / s3.readTimeout: parsed as durations, given to boto3 and to deltalake's object_store."""
    o = S3SinkOptions.from_options({"path": "s3://b/p", "s3.readTimeout": "4s", "s3.connectTimeout": "2 seconds"})
    assert (o.s3.connect_timeout_ms, o.s3.read_timeout_ms) == (2000, 4000)
    cfg = o.s3.client().meta.config
    assert (cfg.connect_timeout, cfg.read_timeout) == (2.0, 4.0)
    storage = delta_storage_options(o.s3)
    assert (storage["connect_timeout"], storage["timeout"]) == ("2000ms", "4000ms")
    with pytest.raises(ConfigurationError, match="s3.readTimeout"):
        S3SinkOptions.from_options({"path": "s3://b/p", "s3.readTimeout": "soon"})


@pytest.mark.parametrize("raw, needle", [
    ({"path": "s3://b/x", "maxFileSize": "50g"}, "'maxFileSize'=53687091200 needs more than 9000 parts of 'partSize'"),
    ({"path": "s3://b/x", "maxFileSize": "80g", "partSize": "6m"}, "raise 'partSize' to at least 10m"),
])
def test_s3_options_a_roll_size_past_s3s_part_limit_is_refused_naming_both_options(raw, needle):
    """S3 refuses part 10,001 of an upload in the middle of a task: the options say so before anything runs."""
    with pytest.raises(ConfigurationError, match=re.escape(needle)):
        S3SinkOptions.from_options(raw)
    S3SinkOptions.from_options({"path": "s3://b/x", "maxFileSize": "40g", "partSize": "5m"})  # 8192 parts: fine
    from twophase.sinks.delta import DeltaSinkOptions
    with pytest.raises(ConfigurationError, match="'targetFileSize'"):
        DeltaSinkOptions.from_options({"path": "s3://b/t", "targetFileSize": "50g"})
    DeltaSinkOptions.from_options({"path": "/tmp/t", "targetFileSize": "50g"})  # local: no parts


@pytest.mark.parametrize("part_size", ["6g", "5121m", str((5 << 30) + 1)])
def test_s3_options_a_part_size_past_s3s_5_gib_part_limit_is_refused_naming_it(part_size: str) -> None:
    """S3 refuses a part above 5 GiB (EntityTooLarge) in the middle of a task, after the task encoded it: the
    options refuse it before anything runs, naming 'partSize' and the limit (the S3 sink, and Delta on S3)."""
    from twophase.sinks.delta import DeltaSinkOptions
    with pytest.raises(ConfigurationError, match=r"'partSize'=\d+ is above S3's maximum part size of 5 GiB"):
        S3SinkOptions.from_options({"path": "s3://b/x", "partSize": part_size, "maxFileSize": "100g"})
    with pytest.raises(ConfigurationError, match=r"'partSize'=\d+ is above S3's maximum part size of 5 GiB"):
        DeltaSinkOptions.from_options({"path": "s3://b/t", "partSize": part_size, "targetFileSize": "100g"})
    assert S3SinkOptions.from_options({"path": "s3://b/x", "partSize": "5g", "maxFileSize": "10g"}).part_size == 5 << 30
