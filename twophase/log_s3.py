"""The transaction log on S3: a :class:`~twophase.log.LogStore` that needs no shared disk.

Importing this module registers the store for ``s3://`` and ``s3a://`` log locations
(``TransactionLog.open("s3://bucket/prefix/log", ...)``). It also holds what every S3-backed part
of twophase shares: :class:`S3Config` (endpoint, region, credentials; anything not given follows
boto3's usual environment: ``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``,
``AWS_PROFILE``, instance roles...) and :func:`parse_s3_url`.

The store keeps the invariants of every object-store log (:class:`~twophase.log_store.ObjectLogStore`,
``test_object_log_invN_*``, raced against the real S3 server) with these requests:

- ``put``: one PutObject (S3 replaces an object atomically).
- ``put_if_absent``: one PutObject with ``If-None-Match: *``; the loser gets 412 PreconditionFailed.
- ``put_if_version``: one PutObject with ``If-Match: <ETag read>`` (``If-None-Match: *`` for a new
  record); the ETag's form (quoted for AWS, bare for radosgw 16) is learned once per endpoint
  (``tests/test_s3_requests.py``). A 412 over this write's own bytes (a re-send of an applied request
  whose answer was lost) is success.
- ``lock``: the shared flock keyed by the location.
- ``list_versioned``: ListObjectsV2 with each object's ETag (S3 lists are strongly consistent).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

from twophase._logging import get_logger
from twophase._redact import safe_repr
from twophase.errors import ConfigurationError, MissingDependencyError, TransientSinkError
from twophase.options import Option, parse_duration_ms
from twophase.log_store import LogStore, ObjectLogStore, open_store, register_store

_log = get_logger(__name__)

S3_SCHEMES = ("s3", "s3a")


def is_s3_url(url: str) -> bool:
    """``s3://`` or ``s3a://`` (any case)."""
    return "://" in url and url.split("://", 1)[0].lower() in S3_SCHEMES


def parse_s3_url(url: str, *, option: str = "path") -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> (``bucket``, ``a/b``); raises ConfigurationError naming ``option``."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in S3_SCHEMES:
        raise ConfigurationError(f"option {option!r}={url!r} is not an S3 URL; write it as s3://bucket/prefix")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigurationError(f"option {option!r}={url!r} names no bucket; write it as s3://bucket/prefix")
    return bucket, prefix.strip("/")


@safe_repr
@dataclass(frozen=True)
class S3Config:
    """How to reach S3. Every field left None follows boto3's environment and config files.

    Its repr masks the secret key and session token (:mod:`twophase._redact`); pickles carry them."""

    endpoint: Optional[str] = None
    region: Optional[str] = None
    access_key_id: Optional[str] = None
    secret_access_key: Optional[str] = None
    session_token: Optional[str] = None
    #: boto3's connect / read timeouts (its defaults, 60 s each, when None)
    connect_timeout_ms: Optional[int] = None
    read_timeout_ms: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ConfigurationError("options 's3.accessKeyId' and 's3.secretAccessKey' go together; give both or neither")

    def client(self) -> Any:
        """The boto3 S3 client of this configuration in this process: created once, then shared.

        A boto3 client is thread-safe, and creating one costs 50-200 ms (a new session loads and parses
        botocore's service model), which Spark would pay several times per micro-batch: ``streamWriter()``
        builds the sink afresh twice per batch and every task opens its own. Shared per process id (a
        forked child never reuses its parent's connection pool), per configuration, per AWS_* variable of
        the environment (a client made before the environment changed is not reused) and, unless the
        keys are given (``s3.accessKeyId``), per version of the shared credentials and config files (a
        client keeps the keys it was made with: one made before a rotation of ``~/.aws/credentials`` would
        fail with ExpiredToken until the worker restarts); at most :data:`_CLIENTS_MAX` are kept, the
        least recently used dropped first."""
        env = tuple((k, v) for k, v in sorted(os.environ.items()) if k.startswith("AWS_"))
        key = (os.getpid(), self, env, () if self.access_key_id else _aws_files_version())
        with _CLIENTS_LOCK:
            found = _CLIENTS.pop(key, None)
            if found is not None:
                _CLIENTS[key] = found  # most recently used last
                return found
        made = self._new_client()
        with _CLIENTS_LOCK:
            made = _CLIENTS.setdefault(key, made)
            while len(_CLIENTS) > _CLIENTS_MAX:
                del _CLIENTS[next(iter(_CLIENTS))]
        return made

    def _new_client(self) -> Any:
        from twophase._versions import require
        require("boto3", what="a transaction log, prefix registry or sink on S3")
        try:
            import boto3
            from botocore.config import Config
        except ImportError as e:  # pragma: no cover - depends on the install
            raise MissingDependencyError("S3 support needs boto3: pip install 'twophase[s3]'") from e
        kwargs: dict[str, Any] = {}
        if self.endpoint:
            kwargs["endpoint_url"] = self.endpoint
        if self.region:
            kwargs["region_name"] = self.region
        if self.access_key_id:
            kwargs["aws_access_key_id"] = self.access_key_id
            kwargs["aws_secret_access_key"] = self.secret_access_key
            if self.session_token:
                kwargs["aws_session_token"] = self.session_token
        timeouts: dict[str, float] = {}
        if self.connect_timeout_ms:
            timeouts["connect_timeout"] = self.connect_timeout_ms / 1000
        if self.read_timeout_ms:
            timeouts["read_timeout"] = self.read_timeout_ms / 1000
        cfg = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=32,
                     s3={"addressing_style": "path"} if self.endpoint else None, **timeouts)
        return boto3.session.Session().client("s3", config=cfg, **kwargs)

    def resolved_endpoint(self) -> Optional[str]:
        return self.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _aws_files_version() -> tuple[Any, ...]:
    """What identifies the current contents of boto3's shared credentials and config files (their paths from
    AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE, else ~/.aws/...): a stat per file, so a rotation (a new
    file, or one rewritten) is seen by the next :meth:`S3Config.client` call."""
    out: list[Any] = []
    for var, default in (("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), ("AWS_CONFIG_FILE", "~/.aws/config")):
        path = os.path.expanduser(os.environ.get(var) or default)
        try:
            st = os.stat(path)
            out.append((path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            out.append((path, None))
    return tuple(out)


#: the per-process cache of :meth:`S3Config.client` (insertion order = least recently used first)
_CLIENTS: dict[tuple[Any, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()
_CLIENTS_MAX = 16


S3_CLIENT_OPTIONS: tuple[Option[Any], ...] = (
    Option("s3.endpoint", str, help="S3 endpoint URL (default: boto3's, e.g. AWS_ENDPOINT_URL)"),
    Option("s3.region", str, help="S3 region (default: boto3's, e.g. AWS_DEFAULT_REGION)"),
    Option("s3.accessKeyId", str, help="access key id (default: boto3's credential chain)"),
    Option("s3.secretAccessKey", str, help="secret access key (with s3.accessKeyId)"),
    Option("s3.sessionToken", str, help="session token for temporary credentials"),
    Option("s3.connectTimeout", parse_duration_ms,
           help="how long to wait for a connection to S3 (e.g. '5s'; default: boto3's 60 s)"),
    Option("s3.readTimeout", parse_duration_ms,
           help="how long to wait for S3 to answer a request (e.g. '30s'; default: boto3's 60 s); a "
                "server that pauses longer fails the request, which boto3 retries (5 attempts)"),
)

def s3_config_from(o: Mapping[str, Any]) -> S3Config:
    """The :class:`S3Config` of parsed ``s3.*`` options."""
    return S3Config(o.get("s3.endpoint"), o.get("s3.region"), o.get("s3.accessKeyId"), o.get("s3.secretAccessKey"),
                    o.get("s3.sessionToken"), connect_timeout_ms=o.get("s3.connectTimeout"),
                    read_timeout_ms=o.get("s3.readTimeout"))


def error_code(e: BaseException) -> str:
    """The S3 error code of a botocore ClientError (``NoSuchUpload``, ``412``...), else ''."""
    resp = getattr(e, "response", None) or {}
    code = str((resp.get("Error") or {}).get("Code") or "")
    status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code or (str(status) if status else "")


def http_status(e: BaseException) -> int:
    resp = getattr(e, "response", None) or {}
    return int((resp.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)


#: per endpoint (``S3Config.resolved_endpoint()``, '' for AWS): whether it compares If-Match against the bare
#: ETag (radosgw 16) rather than the quoted one (RFC 7232, AWS). Learned once per process, so a store made
#: per batch does not pay a 412 and a HEAD again; a 412 while the object still has the version asked for
#: proves the other form (and flips this, both ways).
_UNQUOTED_IF_MATCH: dict[str, bool] = {}


class S3LogStore(ObjectLogStore):
    """A :class:`~twophase.log_store.ObjectLogStore` under ``s3://bucket/prefix`` (see module doc)."""

    kind = "s3"
    display = "S3"

    def __init__(self, location: str, config: Optional[S3Config] = None) -> None:
        self.bucket, self.prefix = parse_s3_url(location, option="log.location")
        config = config or S3Config()
        self._endpoint = config.resolved_endpoint() or ""  # the key of _UNQUOTED_IF_MATCH
        self._unquoted_if_match = _UNQUOTED_IF_MATCH.get(self._endpoint, False)
        super().__init__(config)

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.config.client()
        return self._client

    def get_versioned(self, name: str) -> tuple[Optional[bytes], Optional[str]]:
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
            return got["Body"].read(), got["ETag"]
        except Exception as e:
            if error_code(e) in ("NoSuchKey", "404", "NotFound"):
                return None, None
            raise self._fail("read", name, e) from e

    def put_if_version(self, name: str, data: bytes, version: Optional[str]) -> Optional[str]:  # invariants 2, 3
        """If-Match takes the quoted ETag (RFC 7232, AWS); radosgw 16 compares it unquoted. On a 412 the object
        is read (one GET): holding exactly ``data`` it is this call's own write (botocore re-sent a request
        whose answer was lost, and the copy was refused: written, at the version read); still at
        ``version``, the other If-Match form is tried once; the form that worked is kept for the endpoint
        in this process (:data:`_UNQUOTED_IF_MATCH`). Anything else is another writer's: None."""
        flipped = False
        for _ in range(5):
            condition = ({"IfNoneMatch": "*"} if version is None
                         else {"IfMatch": version.strip('"') if self._unquoted_if_match else version})
            try:
                etag = self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data, **condition)["ETag"]
                if version is not None:
                    _UNQUOTED_IF_MATCH[self._endpoint] = self._unquoted_if_match
                return etag
            except Exception as e:
                code = error_code(e)
                if code in ("PreconditionFailed", "412"):
                    own, there = self._own_write(name, data)  # a GET: a record is small
                    if own is not None:  # botocore re-sent our applied write whose answer was lost
                        _log.info("log_write_answer_lost", location=self.location, name=name,
                                  consequence="the record holds this write's bytes: written")
                        return own
                    if version is not None and not flipped and there == version:
                        self._unquoted_if_match = not self._unquoted_if_match  # the other form: ask again
                        flipped = True
                        continue
                    return None
                if version is not None and code in ("NoSuchKey", "404"):  # If-Match on a deleted object
                    return None
                if code in ("ConditionalRequestConflict", "409"):  # a concurrent put is in flight: ask again
                    continue
                raise self._fail("write", name, e) from e
        raise TransientSinkError(f"S3 transaction log {self.location}: {name!r} stays contended; retry")

    def put(self, name: str, data: bytes) -> None:  # invariant 1
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
        except Exception as e:
            raise self._fail("write", name, e) from e

    def _list(self, key_prefix: str) -> Iterator[tuple[str, Optional[str]]]:  # invariant 5
        """ListObjectsV2, a page per 1000 names: each key with the ETag the listing reports."""
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=key_prefix):
            yield from ((o["Key"], o.get("ETag")) for o in page.get("Contents", ()))

    def delete(self, name: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name))
        except Exception as e:
            if error_code(e) not in ("NoSuchKey", "404"):
                raise self._fail("delete", name, e) from e


def open_log_store(location: str, *configs: Any) -> LogStore:
    """The log store for ``location`` with the client configs the caller has (an :class:`S3Config`, an
    ``AzureConfig``...; None ignored): :func:`twophase.log_store.open_store`, here for the sinks that
    import it from this module."""
    return open_store(location, *[c for c in configs if c is not None])


def _factory(location: str, *configs: Any) -> S3LogStore:
    return S3LogStore(location, next((c for c in configs if isinstance(c, S3Config)), None))


for _scheme in S3_SCHEMES:
    register_store(_scheme, _factory)
