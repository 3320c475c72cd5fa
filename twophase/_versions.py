"""The versions of the libraries twophase needs, checked in one place.

Each connector calls :func:`require` before it imports the library, so an installed version outside the
tested range is a :class:`~twophase.errors.MissingDependencyError`. The error names the version needed and
the pip command. Without this check the user gets a raw ImportError from deep inside, or an
AttributeError at the first batch. The floors match ``pyproject.toml`` (a test checks that they agree).

| library | range | why |
|---|---|---|
| pyspark | >= 4.1 | ``DataSourceStreamArrowWriter`` (the sinks' Arrow stream writers) |
| pyspark (Kafka source) | >= 4.2 | ``pyspark.sql.streaming.datasource`` (``SupportsTriggerAvailableNow``) |
| kafka-python | >= 3.0, < 4 | the 3.x module layout (``kafka.net``, protocol classes) the driver's requests use |
| confluent-kafka | >= 2.4 | the executors' producer and consumer (statistics with ``eos``, OIDC) |
| deltalake | >= 1.0 | ``DeltaTable.transaction_version`` (idempotent commits by application id) |
| boto3 | >= 1.34 | conditional writes (``IfNoneMatch``) for the log on S3 |
| azure-storage-blob | >= 12.19 | conditional Put Blob / Put Block List (``match_condition``), listing uncommitted blobs |
| psycopg | >= 3.1 | twophase-postgres (``Cursor.copy``, two-phase commit by SQL) |
| datafusion | >= 40 | a Delta table's CHECK constraints and generated columns, evaluated as delta-rs does |
"""

from __future__ import annotations

import functools
import importlib
import re
from importlib import metadata
from typing import Optional

from twophase.errors import MissingDependencyError

#: distribution -> (lowest, first version not supported or None, extra of twophase that installs it)
REQUIREMENTS: dict[str, tuple[str, Optional[str], str]] = {
    "pyspark": ("4.1", None, "spark"),
    "kafka-python": ("3.0", "4", "kafka"),
    "confluent-kafka": ("2.4", None, "kafka"),
    "deltalake": ("1.0", None, "delta"),
    "boto3": ("1.34", None, "s3"),
    "datafusion": ("40", None, "delta"),
    "azure-storage-blob": ("12.19", None, "azure"),
    "aws-msk-iam-sasl-signer-python": ("1.0", None, "msk"),
    "psycopg": ("3.1", None, "postgres"),
}


def _key(version: str) -> tuple[int, ...]:
    """The numeric release of ``version`` (``4.1.0.dev1`` -> (4, 1, 0)); enough for floors and caps."""
    parts = []
    for p in version.split("."):
        m = re.match(r"\d+", p)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


#: distribution -> module, for installs without distribution metadata (a Spark distribution's python/ on
#: PYTHONPATH, a vendored copy): the module's ``__version__`` is used then
MODULES = {"pyspark": "pyspark", "kafka-python": "kafka", "confluent-kafka": "confluent_kafka",
           "deltalake": "deltalake", "boto3": "boto3", "datafusion": "datafusion",
           "azure-storage-blob": "azure.storage.blob",
           "aws-msk-iam-sasl-signer-python": "aws_msk_iam_sasl_signer", "psycopg": "psycopg"}


@functools.lru_cache(maxsize=None)
def installed(dist: str) -> Optional[str]:
    """The installed version of ``dist`` (distribution metadata, else the module's ``__version__``), or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
    try:
        module = importlib.import_module(MODULES[dist])
    except ImportError:
        return None
    version = getattr(module, "__version__", None)
    return str(version) if version else None


def require(dist: str, *, minimum: Optional[str] = None, what: str) -> str:
    """The installed version of ``dist``; a :class:`MissingDependencyError` naming ``what`` needs it, the
    version range and the pip command if it is missing or outside the range (``minimum`` raises the floor
    of :data:`REQUIREMENTS` for one feature)."""
    low, cap, extra = REQUIREMENTS[dist]
    low = minimum or low
    version = installed(dist)
    wanted = f"{dist}>={low}" + (f",<{cap}" if cap else "")
    fix = f"pip install '{wanted}' (or pip install 'twophase[{extra}]')"
    if version is None:
        raise MissingDependencyError(f"{what} needs {wanted}, which is not installed: {fix}")
    if _key(version) < _key(low) or (cap is not None and _key(version) >= _key(cap)):
        raise MissingDependencyError(f"{what} needs {wanted}; {dist} {version} is installed: {fix}")
    return version
