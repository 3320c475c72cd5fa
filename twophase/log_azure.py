"""The transaction log on Azure Blob Storage (and ADLS Gen2 through its Blob API), and what every
Azure-backed part of twophase shares.

Importing this module registers the store for ``abfss://``, ``abfs://``, ``az://`` and ``wasbs://`` log
locations (``TransactionLog.open("abfss://container@account.dfs.core.windows.net/prefix/log", ...)``).
It also holds :class:`AzureConfig` (account, key or SAS token, endpoint; every option has an environment
fallback, settled in ONE place, :meth:`AzureConfig.resolve`), :func:`parse_azure_url` and
:data:`AZURE_CLIENT_OPTIONS` (``azure.accountName``, ``azure.accountKey``, ``azure.sasToken``,
``azure.endpoint``).

URL forms (all name a container and a prefix in it; every form is kept as
``abfss://<container>@<account>.dfs.core.windows.net/<prefix>``, so one table has one sink id):

- ``abfss://container@account.dfs.core.windows.net/path`` (and ``abfs://``, Hadoop's ADLS Gen2 form)
- ``wasbs://container@account.blob.core.windows.net/path`` (Hadoop's older Blob form)
- ``az://container/path`` (fsspec / delta-rs; the account from ``azure.accountName`` or the environment)

Requests go to the Blob API (``https://<account>.blob.core.windows.net``, or ``azure.endpoint``: for
Azurite ``http://127.0.0.1:10000/devstoreaccount1``), which ADLS Gen2 accounts also serve. Credentials:
a shared key or a SAS token (Azure AD identities would need azure-identity; not supported yet).

The store keeps the invariants of every object-store log (:class:`~twophase.log_store.ObjectLogStore`,
``test_object_log_invN_*``, raced against Azurite) with these Blob requests:

- ``put``: one Put Blob (a block blob under 64 MiB is written by one request, replaced atomically).
- ``put_if_absent``: one Put Blob with ``If-None-Match: *``; the loser gets 409 BlobAlreadyExists.
- ``put_if_version``: one Put Blob with ``If-Match: <ETag read>``; a changed or deleted blob gets 412. A
  409/412 over this write's own bytes (a re-send of an applied request whose answer was lost) is success.
- ``lock``: the shared flock keyed by the location.
- ``list_versioned``: List Blobs with each blob's ETag, quoted as the Put and Get responses quote it (the
  listing's XML gives it bare), so listed and read versions compare equal.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Optional

from twophase._logging import get_logger
from twophase._redact import redact_text, redact_values, safe_repr
from twophase.errors import ConfigurationError, MissingDependencyError
from twophase.log_store import ObjectLogStore, register_store
from twophase.options import Option

_log = get_logger(__name__)

AZURE_SCHEMES = ("abfss", "abfs", "az", "wasbs")

#: environment fallbacks of the ``azure.*`` options (the names the Azure CLI and SDKs use)
ENV_ACCOUNT, ENV_KEY, ENV_SAS, ENV_CONNECTION = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
                                                 "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING")


@dataclass(frozen=True)
class AzureUrl:
    """A parsed Azure URL: ``account`` (None for ``az://container/path``), ``container``, ``prefix``
    (no leading or trailing ``/``) and ``host`` (the URL's host, '' for ``az://``)."""

    account: Optional[str]
    container: str
    prefix: str
    host: str = ""

    def canonical(self, account: str) -> str:
        """``abfss://container@account.dfs.core.windows.net/prefix`` (the host of the URL if it had one)."""
        host = self.host or f"{account}.dfs.core.windows.net"
        host = host.replace(".blob.", ".dfs.", 1) if host.startswith(f"{account}.blob.") else host
        return f"abfss://{self.container}@{host}" + (f"/{self.prefix}" if self.prefix else "")


def is_azure_url(url: str) -> bool:
    return "://" in url and url.split("://", 1)[0].lower() in AZURE_SCHEMES


def parse_azure_url(url: str, *, option: str = "path") -> AzureUrl:
    """Parse an ``abfss://``, ``abfs://``, ``wasbs://`` or ``az://`` URL; a ConfigurationError names ``option``."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    how = ("write it as abfss://container@account.dfs.core.windows.net/path or az://container/path")
    if not sep or scheme not in AZURE_SCHEMES:
        raise ConfigurationError(f"option {option!r}={url!r} is not an Azure URL; {how}")
    authority, _, path = rest.partition("/")
    prefix = path.strip("/")
    if scheme == "az":
        container, at, host = authority.partition("@")
    else:
        container, at, host = authority.partition("@")
        if not at or not host:
            raise ConfigurationError(f"option {option!r}={url!r} names no storage account; {how}")
    if not container:
        raise ConfigurationError(f"option {option!r}={url!r} names no container; {how}")
    account = host.split(".", 1)[0] if host else None
    if host and not account:
        raise ConfigurationError(f"option {option!r}={url!r} names no storage account; {how}")
    return AzureUrl(account, container, prefix, host)


def parse_connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` of an Azure Storage connection string (values may contain ``=``)."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        k, sep, v = part.partition("=")
        if sep and k.strip():
            out[k.strip()] = v.strip()
    return out


@safe_repr
@dataclass(frozen=True)
class AzureConfig:
    """How to reach an Azure storage account. Fields left None are settled by :meth:`resolve` (environment,
    connection string, the URL's account). Its repr masks the key, the SAS token and the connection
    string (:mod:`twophase._redact`); pickles carry them (executors need them)."""

    account_name: Optional[str] = None
    account_key: Optional[str] = None
    sas_token: Optional[str] = None
    #: the Blob endpoint, ``https://<account>.blob.core.windows.net`` when not given
    endpoint: Optional[str] = None
    connection_string: Optional[str] = None
    #: True once :meth:`resolve` settled every field (account, one credential, endpoint)
    resolved: bool = False

    def __post_init__(self) -> None:
        if self.resolved:
            return
        if self.account_key and self.sas_token:
            raise ConfigurationError("options 'azure.accountKey' and 'azure.sasToken' exclude each other; give one")
        if self.account_key is not None:
            _check_key(self.account_key, "option 'azure.accountKey'")
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigurationError(f"option 'azure.endpoint'={self.endpoint!r} is not an http(s) URL; give the "
                                     "account's Blob endpoint, e.g. https://<account>.blob.core.windows.net or, "
                                     "for Azurite, http://127.0.0.1:10000/devstoreaccount1")

    @property
    def secrets(self) -> tuple[Optional[str], ...]:
        return (self.account_key, self.sas_token, self.connection_string)

    def resolve(self, url: Optional[AzureUrl] = None, *, option: str = "path",
                env: Optional[Mapping[str, str]] = None) -> "AzureConfig":
        """This config with every field settled, for the account ``url`` names (THE place the options, their
        environment fallbacks and the URL meet). Options win; then ``AZURE_STORAGE_ACCOUNT_NAME`` /
        ``_ACCOUNT_KEY`` / ``_SAS_TOKEN``; then ``AZURE_STORAGE_CONNECTION_STRING``. Environment
        credentials of another account are not used. Raises ConfigurationError naming the option."""
        if self.resolved and (url is None or url.account in (None, self.account_name)):
            return self
        env = os.environ if env is None else env
        conn = parse_connection_string(self.connection_string or env.get(ENV_CONNECTION, "") or "")
        account = url.account if url is not None else None
        given = self.account_name
        if account and given and account != given:
            raise ConfigurationError(f"option {option!r} names storage account {account!r} but option "
                                     f"'azure.accountName' is {given!r}; drop one or make them agree")
        account = account or given or env.get(ENV_ACCOUNT) or conn.get("AccountName")
        if not account:
            raise ConfigurationError(f"option {option!r} names no storage account (az://container/path); set option "
                                     f"'azure.accountName' or {ENV_ACCOUNT}, or write the path as "
                                     "abfss://container@account.dfs.core.windows.net/path")
        key, sas, endpoint = self.account_key, self.sas_token, self.endpoint
        if not key and not sas:
            if env.get(ENV_ACCOUNT, account) == account:
                key = env.get(ENV_KEY) or None
                sas = None if key else (env.get(ENV_SAS) or None)
                if key:
                    _check_key(key, ENV_KEY)
            if not key and not sas and conn.get("AccountName", account) == account:
                key = conn.get("AccountKey") or None
                sas = None if key else (conn.get("SharedAccessSignature") or None)
        if not key and not sas:
            raise ConfigurationError(f"no credentials for Azure storage account {account!r} (option {option!r}): set "
                                     f"option 'azure.accountKey' or 'azure.sasToken', or {ENV_KEY}, {ENV_SAS} or "
                                     f"{ENV_CONNECTION}")
        if not endpoint and conn.get("BlobEndpoint") and conn.get("AccountName", account) == account:
            endpoint = conn["BlobEndpoint"]
        if not endpoint and conn.get("AccountName") == account and conn.get("EndpointSuffix"):
            endpoint = f"{conn.get('DefaultEndpointsProtocol', 'https')}://{account}.blob.{conn['EndpointSuffix']}"
        if not endpoint:
            host = url.host if url is not None and url.host else f"{account}.blob.core.windows.net"
            endpoint = "https://" + (host.replace(".dfs.", ".blob.", 1) if host.startswith(f"{account}.dfs.") else host)
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigurationError(f"the Azure Blob endpoint {endpoint!r} (from {ENV_CONNECTION}) is not an http(s) URL")
        return replace(self, account_name=account, account_key=key, sas_token=(sas or "").lstrip("?") or None,
                       endpoint=endpoint.rstrip("/"), connection_string=None, resolved=True)

    def error_text(self, e: BaseException) -> str:
        """``str(e)`` of a client error with this config's secrets and any embedded ones masked."""
        return redact_values(redact_text(str(e)), [s for s in self.secrets if s])

    def service_client(self, **client_options: Any) -> Any:
        """A new ``BlobServiceClient`` for the resolved account (thread-safe; one per process is enough).
        Retries: 5, after about 1, 3, 5, 9, 17 s (the SDK's default waits start at 15 s); ``client_options``
        override the SDK's settings (:func:`twophase.sinks._azure.check_container` asks once, quickly)."""
        if not self.resolved:
            return self.resolve().service_client(**client_options)
        _require()
        from azure.storage.blob import BlobServiceClient
        credential: Any = ({"account_name": self.account_name, "account_key": self.account_key} if self.account_key
                           else self.sas_token)
        settings: dict[str, Any] = {"retry_total": 5, "initial_backoff": 1, "increment_base": 2, **client_options}
        return BlobServiceClient(account_url=self.endpoint, credential=credential, **settings)

    def container_client(self, container: str, **client_options: Any) -> Any:
        return self.service_client(**client_options).get_container_client(container)


def _check_key(key: str, where: str) -> None:
    try:
        base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigurationError(f"{where} is not a storage account key (base64 text); copy the key of the "
                                 "account's 'Access keys' page, or use a SAS token") from None


def _require() -> None:
    from twophase._versions import require
    require("azure-storage-blob", what="a transaction log or Delta table on Azure Blob Storage")
    try:
        import azure.storage.blob  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the install
        raise MissingDependencyError("Azure support needs azure-storage-blob: pip install 'twophase[azure]'") from e


AZURE_CLIENT_OPTIONS: tuple[Option[Any], ...] = (
    Option("azure.accountName", str, help=f"storage account (default: the path's, else {ENV_ACCOUNT})"),
    Option("azure.accountKey", str, help=f"shared key of the account (default: {ENV_KEY} or {ENV_CONNECTION})"),
    Option("azure.sasToken", str, help=f"SAS token instead of a key (default: {ENV_SAS})"),
    Option("azure.endpoint", str, help="Blob endpoint URL (default: https://<account>.blob.core.windows.net; "
                                       "Azurite: http://127.0.0.1:10000/devstoreaccount1)"),
)


def azure_config_from(o: Mapping[str, Any]) -> AzureConfig:
    """The (unresolved) :class:`AzureConfig` of parsed ``azure.*`` options."""
    return AzureConfig(o.get("azure.accountName"), o.get("azure.accountKey"), o.get("azure.sasToken"),
                       o.get("azure.endpoint"))


def azure_error_code(e: BaseException) -> str:
    """The Azure error code of an azure-core HttpResponseError (``BlobNotFound``...), else its HTTP status, else ''."""
    code = getattr(e, "error_code", None)
    code = getattr(code, "value", code)
    if code:
        return str(code)
    status = getattr(e, "status_code", None)
    return str(status) if status else ""


def http_status(e: BaseException) -> int:
    return int(getattr(e, "status_code", 0) or 0)


def quoted_etag(etag: Optional[str]) -> Optional[str]:
    """An ETag in the quoted form response headers use (a listing's XML gives it bare)."""
    return None if etag is None else '"' + str(etag).strip('"') + '"'


class AzureLogStore(ObjectLogStore):
    """A :class:`~twophase.log_store.ObjectLogStore` in an Azure Blob container (see module doc)."""

    kind = "azure"
    display = "Azure Blob"

    def __init__(self, location: str, config: Optional[AzureConfig] = None) -> None:
        url = parse_azure_url(location, option="log.location")
        cfg = (config or AzureConfig())
        if cfg.resolved and url.account and cfg.account_name != url.account:
            cfg = AzureConfig()  # the table's account is not the log's: the environment's credentials
        self.config: AzureConfig = cfg.resolve(url, option="log.location")
        self.container, self.prefix = url.container, url.prefix
        self._location = url.canonical(self.config.account_name or "")
        super().__init__(self.config)

    @property
    def location(self) -> str:
        return self._location

    @property
    def client(self) -> Any:
        """The container's client (made on first use in each process)."""
        if self._client is None:
            self._client = self.config.container_client(self.container)
        return self._client

    def _error_text(self, e: BaseException) -> str:
        return self.config.error_text(e)

    def _download(self, key: str) -> Any:
        return self.client.get_blob_client(key).download_blob()

    def get_versioned(self, name: str) -> tuple[Optional[bytes], Optional[str]]:
        try:
            got = self._download(self._key(name))
            return got.readall(), quoted_etag(got.properties.etag)
        except Exception as e:
            if http_status(e) == 404:
                return None, None
            raise self._fail("read", name, e) from e

    def put_if_version(self, name: str, data: bytes, version: Optional[str]) -> Optional[str]:
        """One Put Blob, ``If-None-Match: *`` for a new record, else ``If-Match: version``. A 409/412 over a blob
        holding exactly ``data`` is this call's own write (the SDK re-sent a Put Blob whose answer was lost):
        written, at the version read."""
        from azure.core import MatchConditions
        blob = self.client.get_blob_client(self._key(name))
        try:
            if version is None:
                got = blob.upload_blob(data, overwrite=False)  # the SDK sends If-None-Match: *
            else:
                got = blob.upload_blob(data, overwrite=True, etag=version, match_condition=MatchConditions.IfNotModified)
            return quoted_etag(got["etag"])
        except Exception as e:
            status = http_status(e)
            if status in (409, 412):  # 409 BlobAlreadyExists, 412 ConditionNotMet: whose bytes are there?
                own, _ = self._own_write(name, data)
                if own is not None:  # the SDK re-sent our applied Put Blob whose answer was lost
                    _log.info("log_write_answer_lost", location=self.location, name=name,
                              consequence="the record holds this write's bytes: written")
                return own  # else another writer created or changed it: None
            if version is not None and status == 404:
                return None  # deleted by another writer
            raise self._fail("write", name, e) from e

    def put(self, name: str, data: bytes) -> None:
        try:
            self.client.get_blob_client(self._key(name)).upload_blob(data, overwrite=True)
        except Exception as e:
            raise self._fail("write", name, e) from e

    def _list(self, key_prefix: str) -> Iterator[tuple[str, Optional[str]]]:
        for b in self.client.list_blobs(name_starts_with=key_prefix):
            yield b.name, quoted_etag(b.etag)

    def delete(self, name: str) -> None:
        try:
            self.client.get_blob_client(self._key(name)).delete_blob()
        except Exception as e:
            if http_status(e) != 404:
                raise self._fail("delete", name, e) from e


def _factory(location: str, *configs: Any) -> AzureLogStore:
    return AzureLogStore(location, next((c for c in configs if isinstance(c, AzureConfig)), None))


for _scheme in AZURE_SCHEMES:
    register_store(_scheme, _factory)
