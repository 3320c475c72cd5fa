"""Installs that work: version floors checked in one place, the wheel's contents, PySpark's discovery modules."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from twophase import _versions
from twophase.errors import MissingDependencyError

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_floors_in_pyproject_are_those_checked_at_import():
    extras = _pyproject()["project"]["optional-dependencies"]
    declared = {}
    for reqs in extras.values():
        for r in reqs:
            m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(.*)", r)
            declared.setdefault(m.group(1).lower(), m.group(2))
    for dist, (low, cap, _extra) in _versions.REQUIREMENTS.items():
        assert f">={low}" in declared[dist], (dist, declared[dist])
        assert (f"<{cap}" in declared[dist]) == (cap is not None), (dist, declared[dist])


@pytest.mark.parametrize("version, ok", [("4.0.1", False), ("4.1.0", True), ("4.3.0", True), ("4.1.0.dev2", True),
                                          (None, False)])
def test_require_names_the_version_needed_and_the_fix(monkeypatch, version, ok):
    monkeypatch.setattr(_versions, "installed", lambda dist: version)
    if ok:
        assert _versions.require("pyspark", what="twophase's Spark formats") == version
        return
    with pytest.raises(MissingDependencyError) as e:
        _versions.require("pyspark", what="twophase's Spark formats")
    msg = str(e.value)
    assert "pyspark>=4.1" in msg and "pip install" in msg and "twophase[spark]" in msg
    assert (f"pyspark {version} is installed" in msg) if version else ("not installed" in msg)


def test_require_refuses_a_major_version_past_the_tested_range(monkeypatch):
    monkeypatch.setattr(_versions, "installed", lambda dist: "4.0.0")
    with pytest.raises(MissingDependencyError, match=r"kafka-python>=3.0,<4; kafka-python 4.0.0 is installed"):
        _versions.require("kafka-python", what="twophase-kafka")
    monkeypatch.setattr(_versions, "installed", lambda dist: "4.1.0")
    with pytest.raises(MissingDependencyError, match=r"pyspark>=4.2"):
        _versions.require("pyspark", minimum="4.2", what="twophase-kafka's Spark source")


def test_registry_skips_an_unusable_format_with_a_warning_naming_the_fix(monkeypatch, caplog):
    import twophase.spark as ts
    monkeypatch.setattr(ts, "_entries", lambda: [*ts.DATA_SOURCES, "twophase_missing_connector_xyz:Nope"])
    ts._loaded.cache_clear()
    try:
        names = {c.name() for c in ts.data_source_classes()}
        assert {"twophase-file", "twophase-kafka", "twophase-s3", "twophase-delta"} <= names
        assert "data_source_unavailable" in caplog.text and "twophase_missing_connector_xyz" in caplog.text
        assert "WARNING" in caplog.text
    finally:
        ts._loaded.cache_clear()


def test_discovery_module_of_an_unusable_format_is_a_stand_in_that_says_why():
    """PySpark imports every pyspark_* module when it looks up Python data sources; one that raised would break
    every lookup of the session. A stand-in keeps the name and raises the reason when used."""
    from pyspark.sql.datasource import DataSource

    from twophase.spark.discovery import default_source
    cls = default_source("twophase_missing_connector_xyz:Nope", "twophase-nope", extra="nope")
    assert issubclass(cls, DataSource) and cls.name() == "twophase-nope"
    with pytest.raises(MissingDependencyError, match=r"twophase\[nope\]"):
        cls({}).streamWriter(None, False)


def test_discovery_modules_define_each_format():
    import importlib
    for fmt in ("files", "kafka", "s3", "delta"):
        mod = importlib.import_module(f"pyspark_twophase_{fmt}")
        assert mod.DefaultSource.name() == ("twophase-file" if fmt == "files" else f"twophase-{fmt}")
        assert mod.DefaultSource.__module__.startswith("twophase.sinks.")  # the real one here, not a stand-in


def test_wheel_installs_discovery_modules_at_top_level_and_py_typed(tmp_path):
    """Built from the tracked and new files (not a stale build/ directory)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    src = tmp_path / "src"
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((ROOT / f).read_bytes())
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "w"), str(src)],
                         capture_output=True, text=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if out.returncode != 0 and "bdist_wheel" not in out.stderr and "Could not" in out.stderr:
        pytest.skip(f"no build backend reachable here: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = (tmp_path / "w").glob("twophase-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for fmt in ("files", "kafka", "s3", "delta"):
        assert f"pyspark_twophase_{fmt}.py" in names
    assert "twophase/py.typed" in names and "twophase/sinks/kafka.py" in names and "twophase/sources/kafka.py" in names
    assert not any(n.startswith(("sinks/", "sources/", "spark_discovery/")) for n in names)
