"""Spark's file sink formats and options on the file sink, without Spark: ORC, text, compressed JSON / CSV,
CSV header / sep / quote / nullValue, maxRecordsPerFile; options validated in one place."""

from __future__ import annotations

import bz2
import gzip
import io
import os

import pyarrow as pa
import pytest

from twophase.errors import ConfigurationError
from twophase.sink import TransactionContext, run_task
from twophase.sinks.files import FileSink
from twophase.testing import commit


def _write(tmp_path, options: dict, batches: list[pa.RecordBatch], tasks: int = 1) -> FileSink:
    sink = FileSink.from_options({"path": str(tmp_path / "out"), **options})
    sink.validate_destination()
    for t in range(tasks):
        commit(sink, run_task(sink, TransactionContext(sink.sink_id, 0, str(t)), batches).handle)
    return sink


def _files(sink: FileSink) -> list[str]:
    out = []
    for d, dirs, names in os.walk(sink.root):
        dirs[:] = [x for x in dirs if not x.startswith("_")]
        out += [os.path.join(d, n) for n in names if n.startswith("part-")]
    return sorted(out)


def _rows(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": list(range(start, start + n)),
                                       "name": [None if i % 5 == 0 else f"n,{i}" for i in range(start, start + n)]})


@pytest.mark.parametrize("compression, suffix", [(None, ".orc"), ("zstd", ".orc"), ("none", ".orc")])
def test_orc_round_trips(tmp_path, compression, suffix):
    import pyarrow.orc as orc
    opts = {"format": "orc", **({"compression": compression} if compression else {})}
    sink = _write(tmp_path, opts, [_rows(10)])
    (f,) = _files(sink)
    assert f.endswith(suffix)
    assert orc.read_table(f).to_pylist() == _rows(10).to_pylist()


@pytest.mark.parametrize("compression, suffix, opener", [(None, ".txt", open), ("gzip", ".txt.gz", gzip.open),
                                                          ("bzip2", ".txt.bz2", bz2.open)])
def test_text_one_line_per_row_and_compressed(tmp_path, compression, suffix, opener):
    b = pa.RecordBatch.from_pydict({"value": ["a", None, "c é"]})
    sink = _write(tmp_path, {"format": "text", **({"compression": compression} if compression else {})}, [b, b])
    (f,) = _files(sink)
    assert f.endswith(suffix)
    with opener(f, "rb") as fh:
        assert fh.read().decode() == "a\n\nc é\n" * 2  # a null is an empty line, as Spark writes it


def test_text_refuses_anything_but_one_string_column(tmp_path):
    with pytest.raises(ConfigurationError, match="exactly one string column"):
        _write(tmp_path, {"format": "text"}, [_rows(3)])


@pytest.mark.parametrize("fmt, compression, suffix", [("json", "gzip", ".json.gz"), ("csv", "bzip2", ".csv.bz2"),
                                                      ("json", None, ".json")])
def test_json_and_csv_compressed_as_spark_names_them(tmp_path, fmt, compression, suffix):
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    sink = _write(tmp_path, {"format": fmt, **({"compression": compression} if compression else {})},
                  [_rows(50), _rows(50, 50)])
    (f,) = _files(sink)
    assert f.endswith(suffix)
    data = {"gzip": gzip.decompress, "bzip2": bz2.decompress, None: lambda x: x}[compression](open(f, "rb").read())
    table = (pajson.read_json(io.BytesIO(data)) if fmt == "json" else pacsv.read_csv(io.BytesIO(data)))
    assert table.column("id").to_pylist() == list(range(100))


def test_csv_header_sep_and_null_value(tmp_path):
    import pyarrow.csv as pacsv
    sink = _write(tmp_path, {"format": "csv", "header": "false", "sep": ";", "nullValue": "\\N"}, [_rows(6)])
    (f,) = _files(sink)
    text = open(f).read()
    # no header, ';' between fields, a null is \N (quoted as every value of a column holding it: readers unquote)
    assert text.splitlines()[0] == '"0";"\\N"' and text.splitlines()[1] == '"1";"n,1"'
    back = pacsv.read_csv(f, read_options=pacsv.ReadOptions(column_names=["id", "name"]),
                          parse_options=pacsv.ParseOptions(delimiter=";"),
                          convert_options=pacsv.ConvertOptions(null_values=["\\N"], strings_can_be_null=True))
    assert back.to_pylist() == _rows(6).to_pylist()
    tab = _write(tmp_path / "t", {"format": "csv", "delimiter": "\\t"}, [_rows(2)])
    assert open(_files(tab)[0]).read().splitlines()[0] == '"id"\t"name"'  # header by default; \t is a tab


def test_max_records_per_file_caps_every_file_and_keeps_every_record(tmp_path):
    import pyarrow.parquet as pq
    b = pa.RecordBatch.from_pydict({"id": list(range(40)), "grp": ["a" if i % 4 else "b" for i in range(40)]})
    sink = _write(tmp_path, {"maxRecordsPerFile": "7", "partitionBy": "grp"}, [b.slice(0, 25), b.slice(25)])
    counts = [pq.read_metadata(f).num_rows for f in _files(sink)]
    assert max(counts) <= 7 and sum(counts) == 40
    ids = sorted(i for f in _files(sink) for i in pq.read_table(f).column("id").to_pylist())
    assert ids == list(range(40))
    assert len([c for c in counts if c == 7]) >= 4  # files fill up to the cap across batches


@pytest.mark.parametrize("options, match", [
    ({"format": "json", "compression": "snappy"}, r"'compression'='snappy' does not apply to format=json"),
    ({"format": "parquet", "compression": "bzip2"}, "format=parquet"),
    ({"format": "parquet", "header": "true"}, r"\['header'\] apply to format=csv only"),
    ({"format": "csv", "sep": ";;"}, "'sep' must be one character"),
    ({"format": "csv", "sep": ";", "delimiter": ","}, "disagree"),
    ({"format": "csv", "quote": "'"}, "'quote'"),
    ({"maxRecordsPerFile": "0"}, "maxRecordsPerFile"),
    ({"format": "avro"}, "'format'"),
])
def test_format_options_refused_naming_the_option(tmp_path, options, match):
    with pytest.raises(ConfigurationError, match=match):
        FileSink.from_options({"path": str(tmp_path), **options})


def test_s3_sink_takes_the_same_format_options():
    from twophase.sinks.s3 import S3SinkOptions
    o = S3SinkOptions.from_options({"path": "s3://b/p", "format": "csv", "compression": "gzip", "sep": "|",
                                    "maxRecordsPerFile": "100"})
    assert o.format_options.extension == "csv.gz" and o.format_options.sep == "|"
    assert o.format_options.max_records_per_file == 100
    with pytest.raises(ConfigurationError, match="format=csv only"):
        S3SinkOptions.from_options({"path": "s3://b/p", "nullValue": "x"})


@pytest.mark.parametrize("url, match", [("s3a://bucket/out", "format twophase-file takes this path itself"),
                                        ("s3://bucket/out", "format twophase-file takes this path itself"),
                                        ("s3n://bucket/out", "twophase-s3"),
                                        ("gs://bucket/out", "gs:// is not supported"),
                                        ("abfss://c@acct.dfs.core.windows.net/out",
                                         "on Azure, format twophase-file takes this path itself"),
                                        ("hdfs://nn:8020/out", "hdfs:// is not supported")])
def test_file_sink_refuses_a_url_instead_of_writing_a_local_folder_named_after_it(tmp_path, url, match, monkeypatch):
    """Before: 's3a://bucket/out' became the local folder ./s3a:/bucket/out on each executor (data nowhere
    the user would look)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match=match):
        FileSink.from_options({"path": url})
    assert not os.listdir(tmp_path)
    assert FileSink.from_options({"path": f"file://{tmp_path}/x"}).root == f"{tmp_path}/x"


def test_s3_and_delta_take_s3a_urls_and_refuse_other_schemes():
    from twophase.sinks.delta import DeltaSinkOptions
    from twophase.sinks.s3 import S3SinkOptions
    assert S3SinkOptions.from_options({"path": "s3a://bucket/p"}).bucket == "bucket"
    assert DeltaSinkOptions.from_options({"path": "s3a://bucket/t"}).on_s3
    for path in ("gs://bucket/t", "hdfs://nn:8020/t"):  # no faithful server here: refused, naming what works
        with pytest.raises(ConfigurationError, match=r"is not supported; a table is a local path, s3://.*abfss://"):
            DeltaSinkOptions.from_options({"path": path})
    with pytest.raises(ConfigurationError, match="not an S3 URL"):
        S3SinkOptions.from_options({"path": "abfss://c@a.dfs.core.windows.net/t"})


@pytest.mark.parametrize("url", ["s3://bucket/out", "s3a://bucket/out", "S3A://bucket/out"])
def test_file_format_routes_s3_urls_to_the_s3_sink(url):
    """format("twophase-file") on S3 writes through the S3 sink (multipart uploads completed at the driver's
    commit), as on Azure through the Azure file sink: the store has no atomic rename or hard link."""
    from twophase.sinks.files import file_sink_from_options
    from twophase.sinks.s3 import S3Sink
    sink = file_sink_from_options({"path": url, "format": "json", "partitionBy": "p"})
    assert isinstance(sink, S3Sink)
    assert (sink.options.bucket, sink.options.prefix, sink.options.format) == ("bucket", "out", "json")
    assert sink.sink_id == S3Sink.from_options({"path": url}).sink_id  # the same log as format twophase-s3
    assert isinstance(file_sink_from_options({"path": "/tmp/x"}), FileSink)
