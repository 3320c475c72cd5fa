"""Requests the S3 log store and the S3 sinks spare per micro-batch in Spark, where every ``streamWriter()``
call builds the sink, its log and their clients anew (twice per batch: planner and commit worker).

The server here is a stub client that answers like radosgw 16 (If-Match compared with the bare ETag) or
like AWS (the quoted one, RFC 7232) and counts requests; the real servers run these paths in
``integration/s3`` (radosgw, moto).
"""

from __future__ import annotations

import hashlib
import io
from typing import Any, Optional

import pytest
from botocore.exceptions import ClientError

import twophase.log_s3 as log_s3
from twophase.errors import ConfigurationError
from twophase.log_s3 import S3Config, S3LogStore
from twophase.sinks import _s3


def _error(code: str, status: int, op: str) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, op)


class StubS3:
    """One bucket of objects; ``bare_if_match``: compare If-Match unquoted (radosgw 16) or quoted (AWS)."""

    def __init__(self, bare_if_match: bool) -> None:
        self.bare = bare_if_match
        self.objects: dict[str, bytes] = {}
        self.calls: list[str] = []
        self.buckets = {"b"}

    def _etag(self, key: str) -> str:
        return '"' + hashlib.md5(self.objects[key]).hexdigest() + '"'

    def put_object(self, Bucket: str, Key: str, Body: bytes, IfMatch: Optional[str] = None,
                   IfNoneMatch: Optional[str] = None) -> dict[str, Any]:
        self.calls.append("PutObject")
        if IfNoneMatch == "*" and Key in self.objects:
            raise _error("PreconditionFailed", 412, "PutObject")
        if IfMatch is not None:
            if Key not in self.objects:
                raise _error("NoSuchKey", 404, "PutObject")
            want = self._etag(Key).strip('"') if self.bare else self._etag(Key)
            if IfMatch != want:
                raise _error("PreconditionFailed", 412, "PutObject")
        self.objects[Key] = Body
        return {"ETag": self._etag(Key)}

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        self.calls.append("GetObject")
        if Key not in self.objects:
            raise _error("NoSuchKey", 404, "GetObject")
        return {"Body": io.BytesIO(self.objects[Key]), "ETag": self._etag(Key)}

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        self.calls.append("HeadObject")
        if Key not in self.objects:
            raise _error("404", 404, "HeadObject")
        return {"ETag": self._etag(Key)}

    def head_bucket(self, Bucket: str) -> dict[str, Any]:
        self.calls.append("HeadBucket")
        if Bucket not in self.buckets:
            raise _error("404", 404, "HeadBucket")
        return {}


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_s3, "_UNQUOTED_IF_MATCH", {})
    monkeypatch.setattr(_s3, "_checked_buckets", {})


def _store(server: StubS3, endpoint: str = "http://rgw:7480") -> S3LogStore:
    store = S3LogStore("s3://b/log", S3Config(endpoint, "us-east-1", "AKID", "secret"))
    store._client = server
    return store


def test_s3_log_inv3_if_match_form_is_learned_once_per_endpoint_not_per_store() -> None:
    server = StubS3(bare_if_match=True)
    first = _store(server)
    v1 = first.put_if_version("r", b"PENDING", None)
    server.calls.clear()
    v2 = first.put_if_version("r", b"COMPLETED", v1)
    assert v2 is not None and server.calls == ["PutObject", "GetObject", "PutObject"]  # learned: 412, GET, again
    server.calls.clear()
    second = _store(server)  # the next batch's store, same process and endpoint
    assert second.put_if_version("r", b"COMMITTED", v2) is not None
    assert server.calls == ["PutObject"]
    other = _store(server, endpoint="http://elsewhere:9000")  # another endpoint learns for itself
    assert other._unquoted_if_match is False


def test_s3_log_inv3_a_wrongly_remembered_form_flips_back_and_a_real_conflict_is_refused() -> None:
    server = StubS3(bare_if_match=False)  # AWS: the quoted ETag
    log_s3._UNQUOTED_IF_MATCH["http://rgw:7480"] = True
    store = _store(server)
    v1 = store.put_if_version("r", b"a", None)
    assert store.put_if_version("r", b"b", v1) is not None  # 412, GET (unchanged), quoted: done
    assert log_s3._UNQUOTED_IF_MATCH["http://rgw:7480"] is False
    server.calls.clear()
    assert store.put_if_version("r", b"c", v1) is None  # v1 is stale: refused, no flip
    assert server.calls == ["PutObject", "GetObject"]
    assert log_s3._UNQUOTED_IF_MATCH["http://rgw:7480"] is False


def test_s3_sink_bucket_check_is_remembered_per_endpoint_and_key_and_a_failure_never() -> None:
    server = StubS3(bare_if_match=True)
    cfg = S3Config("http://rgw:7480", "us-east-1", "AKID", "secret")
    for _ in range(3):
        _s3.check_bucket(server, "b", sink="twophase-s3", url="s3://b/out", config=cfg)
    assert server.calls == ["HeadBucket"]
    _s3.check_bucket(server, "b", sink="twophase-s3", url="s3://b/out",
                     config=S3Config("http://rgw:7480", "us-east-1", "OTHER", "secret"))
    _s3.check_bucket(server, "b", sink="twophase-s3", url="s3://b/out")  # no config: always asks
    assert server.calls == ["HeadBucket"] * 3
    for _ in range(2):
        with pytest.raises(ConfigurationError, match="does not exist"):
            _s3.check_bucket(server, "gone", sink="twophase-s3", url="s3://gone/out", config=cfg)
    assert server.calls == ["HeadBucket"] * 5


def test_s3_sink_bucket_check_is_asked_again_after_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    server = StubS3(bare_if_match=True)
    cfg = S3Config("http://rgw:7480", "us-east-1", "AKID", "secret")
    now = [1000.0]
    monkeypatch.setattr(_s3.time, "monotonic", lambda: now[0])
    _s3.check_bucket(server, "b", sink="twophase-s3", url="s3://b/out", config=cfg)
    now[0] += _s3.BUCKET_CHECK_TTL_S - 1
    _s3.check_bucket(server, "b", sink="twophase-s3", url="s3://b/out", config=cfg)
    now[0] += 2
    _s3.check_bucket(server, "b", sink="twophase-s3", url="s3://b/out", config=cfg)
    assert server.calls == ["HeadBucket", "HeadBucket"]


def test_s3_client_is_made_once_per_process_configuration_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A boto3 client costs 50-200 ms to make; Spark builds the sink afresh twice per batch and per task."""
    made: list[S3Config] = []
    monkeypatch.setattr(log_s3, "_CLIENTS", {})
    monkeypatch.setattr(S3Config, "_new_client", lambda self: made.append(self) or object())
    cfg = S3Config("http://rgw:7480", "us-east-1", "AKID", "secret")
    first = cfg.client()
    assert S3Config("http://rgw:7480", "us-east-1", "AKID", "secret").client() is first  # an equal config
    assert S3LogStore("s3://b/log", cfg).client is first and len(made) == 1
    other = S3Config("http://rgw:7480", "us-east-1", "OTHER", "secret").client()
    assert other is not first and len(made) == 2
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "rotated")  # the environment's credentials changed: a new client
    assert cfg.client() is not first and len(made) == 3
    monkeypatch.setattr(log_s3.os, "getpid", lambda: -1)  # a forked child never reuses its parent's pool
    assert cfg.client() is not first and len(made) == 4


def test_s3_client_cache_keeps_at_most_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_s3, "_CLIENTS", {})
    monkeypatch.setattr(S3Config, "_new_client", lambda self: object())
    first = S3Config("http://rgw:7480", "us-east-1", "K0", "s")
    c0 = first.client()
    for i in range(1, log_s3._CLIENTS_MAX + 1):
        first.client()  # kept recently used: the others are dropped first
        S3Config("http://rgw:7480", "us-east-1", f"K{i}", "s").client()
    assert len(log_s3._CLIENTS) == log_s3._CLIENTS_MAX and first.client() is c0


def test_s3_client_is_made_again_when_the_shared_credentials_file_changes(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path) -> None:
    """Credentials rotated in the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials)
    or the config file reach the next client: a cached client keeps the keys it was made with (requests then
    fail with ExpiredToken until the worker restarts). Unchanged files keep the cached client; explicit keys
    (s3.accessKeyId) do not depend on the files."""
    import os
    made: list[S3Config] = []
    monkeypatch.setattr(log_s3, "_CLIENTS", {})
    monkeypatch.setattr(S3Config, "_new_client", lambda self: made.append(self) or object())
    creds, conf = tmp_path / "credentials", tmp_path / "config"
    creds.write_text("[default]\naws_access_key_id = A1\naws_secret_access_key = s1\n")
    conf.write_text("[default]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(conf))
    cfg = S3Config("http://rgw:7480")
    first = cfg.client()
    assert cfg.client() is first and len(made) == 1
    creds.write_text("[default]\naws_access_key_id = A2\naws_secret_access_key = s2\n")
    os.utime(creds, ns=(os.stat(creds).st_atime_ns, os.stat(creds).st_mtime_ns + 1_000_000_000))
    second = cfg.client()
    assert second is not first and len(made) == 2
    assert cfg.client() is second
    os.utime(conf, ns=(os.stat(conf).st_atime_ns, os.stat(conf).st_mtime_ns + 1_000_000_000))
    assert cfg.client() is not second and len(made) == 3
    explicit = S3Config("http://rgw:7480", "us-east-1", "AKID", "secret")
    e = explicit.client()
    creds.write_text("[default]\naws_access_key_id = A3\naws_secret_access_key = s3\n")
    os.utime(creds, ns=(os.stat(creds).st_atime_ns, os.stat(creds).st_mtime_ns + 2_000_000_000))
    assert explicit.client() is e
