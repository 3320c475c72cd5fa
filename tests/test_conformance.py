"""The conformance suite (:mod:`twophase.testing`) against the sinks that need no server: files and
Delta on a local path. The same checks run against S3, Delta on S3 and Kafka in
``integration/test_conformance.py``. A new sink adds a harness here or there."""

from __future__ import annotations

import pytest

from harnesses import DeltaHarness, FileHarness
from twophase.testing import CONFORMANCE_CHECKS, SinkHarness


@pytest.fixture(params=["files", "delta"])
def harness(request, tmp_path) -> SinkHarness:
    return FileHarness(str(tmp_path / "out")) if request.param == "files" else DeltaHarness(str(tmp_path / "table"))


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS, ids=lambda c: c.__name__.removeprefix("conformance_"))
def test_sink_conformance(harness: SinkHarness, check) -> None:
    """Every sink invariant of :mod:`twophase.sink`, on this sink (see :mod:`twophase.testing`)."""
    check(harness)
