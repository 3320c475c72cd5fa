"""The native path on s3a:// is experimental: unreachable without TWOPHASE_EXPERIMENTAL_S3A=1; with it, the
options select the S3A target, whose repr and NativeOptions' never show the secret key (no server, no Spark)."""

from __future__ import annotations

import pytest

from twophase.errors import ConfigurationError
from twophase.spark.native import load_target, native_options

OPTS = {"path": "s3a://bucket/out", "checkpointLocation": "/tmp/ck", "partitionBy": "k",
        "s3.endpoint": "http://127.0.0.1:1", "s3.accessKeyId": "AKID", "s3.secretAccessKey": "sekrit-value",
        "s3.region": "us-east-1"}


def test_native_s3a_refused_without_the_experimental_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TWOPHASE_EXPERIMENTAL_S3A", raising=False)
    with pytest.raises(ConfigurationError, match="s3a:// URL"):
        native_options("parquet", {k: v for k, v in OPTS.items() if not k.startswith("s3.")})
    with pytest.raises(ConfigurationError):
        native_options("parquet", OPTS)


def test_native_s3a_target_names_its_files_and_magic_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWOPHASE_EXPERIMENTAL_S3A", "1")
    o = native_options("parquet", OPTS)
    assert "sekrit-value" not in repr(o)
    t = load_target(o)
    from twophase.sink import sink_token
    token = sink_token(t.sink.sink_id)
    assert t.sink.sink_id == "s3:s3://bucket/out"  # twophase-s3's default id on the same path
    s = t.attempt_settings(3, "abcdefabcdef")
    assert s["fs.s3a.committer.uuid"] == f"{token}-00000003-abcdefabcdef"
    assert s["twophase.s3a.file.prefix"] == f"part-{token}-00000003-"
    assert s["fs.s3a.committer.abort.pending.uploads"] == "false"
    assert s["twophase.s3a.attempt"] == "abcdefabcdef"
    # f0620bb: the pending uploads travel in Spark's task commit messages; no manifest is written to S3
    assert not any("manifest" in k for k in s)
    assert t.save_mode == "append" and t.save_path("x") == "s3a://bucket/out"
    assert "sekrit-value" not in repr(t.sink.options)
