"""Azurite, Microsoft's Azure Storage emulator, as the real Blob server of the Azure integration tests.

``scripts/azurite.sh`` installs it from npm (cached) and starts its blob service on a free loopback port;
:func:`azure_server_fixture` runs it for the test session (the ``azure_server`` fixture of
``integration/conftest.py``) and stops it at the end. ``TWOPHASE_AZURE_ENDPOINT`` (with
``AZURE_STORAGE_ACCOUNT_NAME`` / ``AZURE_STORAGE_ACCOUNT_KEY``) names an external server instead (a
real account: then every test makes and removes its own containers there).

The tests skip only when node or npm is missing (the script exits 3); any other failure to start fails them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "azurite.sh"
#: Azurite's published development account (its README; the same in every install, not a secret)
DEV_ACCOUNT = "devstoreaccount1"


@dataclass(frozen=True)
class AzureServer:
    endpoint: str  # the account's Blob endpoint (Azurite: http://127.0.0.1:PORT/devstoreaccount1)
    account: str
    key: str
    kind: str

    def options(self) -> dict[str, str]:
        """The sink options that reach this server."""
        return {"azure.endpoint": self.endpoint, "azure.accountName": self.account, "azure.accountKey": self.key}

    def config(self) -> Any:
        from twophase.log_azure import AzureConfig
        return AzureConfig(self.account, self.key, endpoint=self.endpoint).resolve()

    def service(self) -> Any:
        from azure.storage.blob import BlobServiceClient
        return BlobServiceClient(self.endpoint, credential={"account_name": self.account, "account_key": self.key})

    def new_container(self) -> str:
        name = f"tp-{uuid.uuid4().hex[:12]}"
        self.service().create_container(name)
        return name

    def url(self, container: str, path: str) -> str:
        return f"abfss://{container}@{self.account}.dfs.core.windows.net/{path}"

    def blob_names(self, container: str, prefix: str, *, uncommitted: bool) -> set[str]:
        """Names of the blobs under ``prefix/`` (the prefix stripped), with names that have only staged blocks
        (``include=uncommittedblobs``) if asked."""
        c = self.service().get_container_client(container)
        include = ["uncommittedblobs"] if uncommitted else None
        return {b.name[len(prefix) + 1:] for b in c.list_blobs(name_starts_with=f"{prefix}/", include=include)}

    def storage_options(self) -> dict[str, str]:
        """deltalake's storage options for reading back what the sink wrote."""
        out = {"account_name": self.account, "account_key": self.key, "endpoint": self.endpoint}
        if self.endpoint.startswith("http://"):
            out["allow_http"] = "true"
        return out


_START_FAILURE: list[str] = []  # pytest retries a failed session fixture per test: fail fast instead


def azure_server_fixture() -> Iterator[AzureServer]:
    """Body of the session fixture ``azure_server``."""
    if _START_FAILURE:
        pytest.fail(_START_FAILURE[0])
    if os.environ.get("TWOPHASE_AZURE_ENDPOINT"):
        yield AzureServer(os.environ["TWOPHASE_AZURE_ENDPOINT"], os.environ["AZURE_STORAGE_ACCOUNT_NAME"],
                          os.environ["AZURE_STORAGE_ACCOUNT_KEY"], os.environ.get("TWOPHASE_AZURE_KIND", "external"))
        return
    if not (shutil.which("node") and shutil.which("npm")) and not (
            Path(os.environ.get("TWOPHASE_AZURITE_HOME", Path.home() / ".cache" / "twophase-azurite"))
            / "node_modules" / ".bin" / "azurite-blob").exists():
        pytest.skip("Azurite needs node and npm (apt-get install nodejs npm), which are not installed")
    directory = f"/tmp/twophase-azurite-{os.getpid()}"
    started = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT), "start", directory], capture_output=True, text=True, timeout=600)
    if proc.returncode == 3:
        pytest.skip(f"Azurite cannot be installed: {proc.stderr.strip()[-300:]}")
    if proc.returncode != 0:
        _START_FAILURE.append(f"could not start Azurite: {proc.stderr[-2000:]}")
        pytest.fail(_START_FAILURE[0])
    line = [x for x in proc.stdout.strip().splitlines() if x.startswith("TWOPHASE_AZURE_ENDPOINT=")][-1]
    env = dict(kv.split("=", 1) for kv in shlex.split(line))
    print(f"Azurite at {env['TWOPHASE_AZURE_ENDPOINT']} up in {time.monotonic() - started:.1f}s")
    try:
        yield AzureServer(env["TWOPHASE_AZURE_ENDPOINT"], env["AZURE_STORAGE_ACCOUNT_NAME"],
                          env["AZURE_STORAGE_ACCOUNT_KEY"], env["TWOPHASE_AZURE_KIND"])
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", directory], capture_output=True, timeout=60)


def claimed_coordinator(sink: Any, owner: str = "test") -> Any:
    """A coordinator of ``sink`` whose log ``owner`` claimed, sweeping after each commit as Spark's does."""
    from twophase.coordinator import CheckpointCoordinator
    log = sink.transaction_log()
    log.claim(owner)
    return CheckpointCoordinator(sink, log, sweep_after_commit=True)
