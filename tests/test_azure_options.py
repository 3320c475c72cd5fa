"""Azure options, URLs and the environment, settled in one place (:meth:`twophase.log_azure.AzureConfig.resolve`),
and what deltalake and the log store get from them. No server: Azurite runs in ``integration/azure/``."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from twophase.errors import ConfigurationError
from twophase.log import open_store
from twophase.log_azure import AzureConfig, AzureLogStore, parse_azure_url, parse_connection_string
from twophase.sinks.delta import DeltaSink, DeltaSinkOptions

KEY = "a2V5LWZvci10ZXN0cy1vbmx5LW5vdC1hLXJlYWwta2V5LWJ1dC1iYXNlNjQ="
OTHER_KEY = "b3RoZXIta2V5LWluLXRoZS1lbnZpcm9ubWVudA=="
ENV = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("url, account, container, prefix", [
    ("abfss://c@acct.dfs.core.windows.net/a/b/", "acct", "c", "a/b"),
    ("abfs://c@acct.dfs.core.windows.net/t", "acct", "c", "t"),
    ("wasbs://c@acct.blob.core.windows.net/t", "acct", "c", "t"),
    ("az://c/t/x", None, "c", "t/x"),
])
def test_azure_url_forms(url, account, container, prefix):
    u = parse_azure_url(url)
    assert (u.account, u.container, u.prefix) == (account, container, prefix)
    assert u.canonical("acct") == f"abfss://c@acct.dfs.core.windows.net/{prefix}"


@pytest.mark.parametrize("url, match", [("abfss://acct.dfs.core.windows.net/t", "names no storage account"),
                                        ("abfss://@acct.dfs.core.windows.net/t", "names no container"),
                                        ("s3://b/t", "is not an Azure URL")])
def test_azure_bad_urls_name_the_option(url, match):
    with pytest.raises(ConfigurationError, match=match) as e:
        parse_azure_url(url, option="log.location")
    assert "'log.location'" in str(e.value)


def test_every_url_form_is_one_table_with_one_sink_id():
    opts = {"azure.accountKey": KEY}
    ids = {DeltaSink.from_options({"path": p, "azure.accountName": "acct", **opts}).sink_id
           for p in ("abfss://c@acct.dfs.core.windows.net/t", "abfs://c@acct.dfs.core.windows.net/t/",
                     "wasbs://c@acct.blob.core.windows.net/t", "az://c/t")}
    assert ids == {"delta:abfss://c@acct.dfs.core.windows.net/t"}


def test_options_resolve_and_map_to_delta_rs_storage_options():
    o = DeltaSinkOptions.from_options({"path": "abfss://c@acct.dfs.core.windows.net/t", "azure.accountKey": KEY})
    assert o.on_azure and not o.on_s3 and o.azure.endpoint == "https://acct.blob.core.windows.net"
    assert o.storage_options() == {"account_name": "acct", "account_key": KEY}  # the default endpoint is not passed
    emu = DeltaSinkOptions.from_options({"path": "az://c/t", "azure.accountName": "devstoreaccount1", "azure.sasToken": "?sv=1&sig=x",
                                         "azure.endpoint": "http://127.0.0.1:10000/devstoreaccount1/",
                                         "storage.timeout": "30s"})
    assert emu.storage_options() == {"account_name": "devstoreaccount1", "sas_token": "sv=1&sig=x",
                                     "endpoint": "http://127.0.0.1:10000/devstoreaccount1", "allow_http": "true",
                                     "timeout": "30s"}


@pytest.mark.parametrize("raw, option", [
    ({"path": "az://c/t", "azure.accountKey": KEY}, "'azure.accountName'"),
    ({"path": "abfss://c@acct.dfs.core.windows.net/t"}, "'azure.accountKey' or 'azure.sasToken'"),
    ({"path": "abfss://c@acct.dfs.core.windows.net/t", "azure.accountKey": "not base64!"}, "'azure.accountKey'"),
    ({"path": "abfss://c@acct.dfs.core.windows.net/t", "azure.accountKey": KEY, "azure.sasToken": "sv=1&sig=x"},
     "'azure.sasToken'"),
    ({"path": "abfss://c@acct.dfs.core.windows.net/t", "azure.accountKey": KEY, "azure.endpoint": "127.0.0.1:10000"},
     "'azure.endpoint'"),
    ({"path": "abfss://c@acct.dfs.core.windows.net/t", "azure.accountKey": KEY, "azure.accountName": "other"},
     "'azure.accountName'"),
    ({"path": "abfss://c@acct.dfs.core.windows.net/t", "azure.accountKey": KEY, "azure.acountName": "x"},
     "azure.acountname"),  # Spark hands option names lower-cased
])
def test_bad_azure_options_are_configuration_errors_naming_the_option(raw, option):
    with pytest.raises(ConfigurationError) as e:
        DeltaSinkOptions.from_options(raw)
    assert option in str(e.value) and KEY not in str(e.value)


def test_environment_fallbacks(monkeypatch):
    url = parse_azure_url("az://c/t")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "envacct")
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "sv=2&sig=envsig")
    got = AzureConfig().resolve(url)
    assert (got.account_name, got.account_key, got.sas_token) == ("envacct", None, "sv=2&sig=envsig")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", OTHER_KEY)  # a key wins over a SAS token at the same level
    assert AzureConfig().resolve(url).account_key == OTHER_KEY
    assert AzureConfig(account_key=KEY).resolve(url).account_key == KEY  # an option wins over the environment
    # the environment's credentials are for envacct: not used for another account
    with pytest.raises(ConfigurationError, match="no credentials for Azure storage account 'acct'"):
        AzureConfig().resolve(parse_azure_url("abfss://c@acct.dfs.core.windows.net/t"))


def test_connection_string_fallback(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
                       "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;")
    got = AzureConfig().resolve(parse_azure_url("az://c/t"))
    assert (got.account_name, got.account_key, got.endpoint) == ("devstoreaccount1", KEY,
                                                                 "http://127.0.0.1:10000/devstoreaccount1")
    assert got.connection_string is None  # settled into fields: the string itself is not carried on
    assert parse_connection_string("A=1;SharedAccessSignature=sv=1&sig=a==;") == {"A": "1",
                                                                                  "SharedAccessSignature": "sv=1&sig=a=="}


def test_azure_log_store_is_registered_and_pickles_without_a_client():
    store = open_store("abfss://c@acct.dfs.core.windows.net/t/_twophase/x/log", AzureConfig(account_key=KEY))
    assert isinstance(store, AzureLogStore) and store.location == "abfss://c@acct.dfs.core.windows.net/t/_twophase/x/log"
    assert (store.container, store.prefix) == ("c", "t/_twophase/x/log")
    again = pickle.loads(pickle.dumps(store))
    assert again.location == store.location and again.config.account_key == KEY and again._client is None
    assert KEY not in repr(store.config)


def test_delta_sink_on_azure_opens_its_log_there_with_the_tables_account():
    sink = DeltaSink.from_options({"path": "az://c/t", "azure.accountName": "acct", "azure.accountKey": KEY},
                                  pa.schema([("id", pa.int64())]))
    log = sink.transaction_log()
    assert isinstance(log.store, AzureLogStore) and log.store.config.account_key == KEY
    assert log.store.location.startswith("abfss://c@acct.dfs.core.windows.net/t/_twophase/")
    assert type(pickle.loads(pickle.dumps(sink)).files).__name__ == "AzureFiles"
