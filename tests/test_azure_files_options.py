"""twophase-file on an Azure path: routing to the Azure file sink, its options (validated in one place), its
identity and log location, pickling. No server: the sink's invariants run against Azurite in
``integration/azure/test_azure_files_sink.py``."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from twophase.errors import ConfigurationError
from twophase.log_azure import AzureLogStore
from twophase.sinks.azure_files import AzureFilesCommittable, AzureFilesOptions, AzureFilesSink
from twophase.sinks.files import FileSink, file_sink_from_options

KEY = "a2V5LWZvci10ZXN0cy1vbmx5LW5vdC1hLXJlYWwta2V5LWJ1dC1iYXNlNjQ="
ENV = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING")
SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string())])


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("path", ["abfss://c@acct.dfs.core.windows.net/out", "abfs://c@acct.dfs.core.windows.net/out",
                                  "wasbs://c@acct.blob.core.windows.net/out", "az://c/out"])
def test_twophase_file_routes_every_azure_url_form_to_the_azure_file_sink(path):
    sink = file_sink_from_options({"path": path, "azure.accountName": "acct", "azure.accountKey": KEY}, SCHEMA)
    assert isinstance(sink, AzureFilesSink)
    assert (sink.options.container, sink.options.prefix) == ("c", "out")
    assert sink.sink_id == "file:abfss://c@acct.dfs.core.windows.net/out"  # one path, one sink id, whatever form


def test_twophase_file_keeps_local_paths_and_refuses_gs_and_hdfs(tmp_path):
    assert isinstance(file_sink_from_options({"path": str(tmp_path / "x")}), FileSink)
    for url, match in (("gs://b/out", "gs:// is not supported"), ("hdfs://nn:8020/out", "hdfs:// is not supported")):
        with pytest.raises(ConfigurationError, match=match):
            file_sink_from_options({"path": url})
    with pytest.raises(ConfigurationError, match="file_sink_from_options builds its Azure sink"):
        FileSink.from_options({"path": "abfss://c@acct.dfs.core.windows.net/out"})


def test_spark_format_twophase_file_builds_the_azure_sink_and_is_found_by_it():
    pytest.importorskip("pyspark")
    from twophase.spark import data_source_for
    from twophase.sinks.files_spark import FileDataSource
    sink = AzureFilesSink.from_options({"path": "az://c/out", "azure.accountName": "acct", "azure.accountKey": KEY})
    assert data_source_for(sink) is FileDataSource


@pytest.mark.parametrize("change, option", [
    ({"blockSize": "1k"}, "'blockSize'"),
    ({"blockSize": "5000m"}, "'blockSize'"),
    ({"blockSize": "64k", "maxFileSize": "10g"}, "'maxFileSize'"),
    ({"azure.accountKey": "not base64!"}, "'azure.accountKey'"),
    ({"azure.endpoint": "ftp://x"}, "'azure.endpoint'"),
    ({"partSize": "5m"}, "partsize"),  # an S3 option: unknown here, refused by parse_options
    ({"format": "avro"}, "'format'"),
    ({"nullValue": "x"}, "format=csv only"),
    ({"partitionBy": "nope"}, "'partitionBy'"),
])
def test_azure_files_bad_options_are_configuration_errors_naming_the_option(change, option):
    raw = {"path": "abfss://c@acct.dfs.core.windows.net/out", "azure.accountKey": KEY, **change}
    with pytest.raises(ConfigurationError) as e:
        file_sink_from_options(raw, SCHEMA)
    assert option in str(e.value) and KEY not in str(e.value)


def test_azure_files_without_credentials_names_the_options():
    with pytest.raises(ConfigurationError, match="'azure.accountKey' or 'azure.sasToken'"):
        file_sink_from_options({"path": "abfss://c@acct.dfs.core.windows.net/out"})


def test_azure_files_take_the_format_options_twophase_s3_takes():
    o = AzureFilesOptions.from_options({"path": "az://c/p", "azure.accountName": "a", "azure.accountKey": KEY,
                                        "format": "csv", "compression": "gzip", "sep": "|", "maxRecordsPerFile": "100",
                                        "partitionBy": "p", "maxFileSize": "64m", "blockSize": "4m"}, SCHEMA)
    assert o.format_options.extension == "csv.gz" and o.format_options.sep == "|"
    assert o.format_options.max_records_per_file == 100
    assert (o.partition_by, o.max_file_size, o.block_size) == (("p",), 64 << 20, 4 << 20)


def test_azure_files_log_defaults_to_the_container_beside_the_data_and_pickles_without_a_client():
    sink = AzureFilesSink.from_options({"path": "az://c/out", "azure.accountName": "acct", "azure.accountKey": KEY})
    log = sink.transaction_log()
    assert isinstance(log.store, AzureLogStore) and log.store.config.account_key == KEY
    assert log.location.startswith("abfss://c@acct.dfs.core.windows.net/out/_twophase/")
    local = AzureFilesSink.from_options({"path": "az://c/out", "azure.accountName": "acct", "azure.accountKey": KEY,
                                         "log.location": "/tmp/somewhere/log"})
    assert local.transaction_log().location.endswith("/tmp/somewhere/log")
    again = pickle.loads(pickle.dumps(sink))
    assert again.options == sink.options and again.store._client is None and KEY not in repr(sink.options)


def test_azure_files_committable_round_trips_and_a_batch_write_gets_its_own_sink():
    c = AzureFilesCommittable(checkpoint_id=3, task_id="0", attempt_uid="ab", records=2,
                              blobs=[{"container": "c", "name": "out/x", "block_ids": ["00000000"], "bytes": 5,
                                      "records": 2}])
    assert AzureFilesCommittable.from_json(c.to_json()) == c
    sink = AzureFilesSink.from_options({"path": "az://c/out", "azure.accountName": "acct", "azure.accountKey": KEY})
    job = sink.write_job_spec("k1")
    assert isinstance(job, AzureFilesSink) and job.sink_id.startswith(f"{sink.sink_id}#write:k1@")
    assert job.transaction_log().location == f"{sink.transaction_log().location}/write-jobs/k1"
