"""twophase-postgres without a server: option serverWaitTimeout's validation, and the watcher of waiting driver
statements (one thread for the process, not one per statement: issue 23, leftover 3)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pytest

pytest.importorskip("psycopg")

from twophase.errors import ConfigurationError  # noqa: E402
from twophase.sinks._postgres_waits import THREAD_NAME  # noqa: E402
from twophase.sinks.postgres import PostgresSink  # noqa: E402

URL = "postgresql://writer:PGPW-s3cr3t@127.0.0.1:1/app"


def _sink(tmp_path, **kw) -> PostgresSink:
    return PostgresSink(url=URL, table="public.t", sink_id="pg-waits", log_location=str(tmp_path), **kw)


def test_server_wait_timeout_defaults_to_ten_minutes_and_takes_seconds_as_strings(tmp_path) -> None:
    assert _sink(tmp_path).server_wait_timeout == 600
    assert _sink(tmp_path, serverWaitTimeout="2.5").server_wait_timeout == 2.5


@pytest.mark.parametrize("value", ["0", 0, "-1", "nan", "soon", None])
def test_server_wait_timeout_must_be_a_positive_number_of_seconds(tmp_path, value) -> None:
    with pytest.raises(ConfigurationError) as e:
        _sink(tmp_path, serverWaitTimeout=value)
    assert "serverWaitTimeout" in str(e.value) and "PGPW-s3cr3t" not in str(e.value)


def _watchers() -> int:
    return sum(1 for t in threading.enumerate() if t.name == THREAD_NAME)


def test_one_watcher_thread_serves_every_waiting_statement_of_every_sink(tmp_path, caplog, monkeypatch) -> None:
    """Before: waiting() started a thread per driver statement (one per COMMIT PREPARED): 12 open blocks, 12
    threads. Now one thread of the process warns for all of them, each block every WAIT_WARN_S seconds."""
    monkeypatch.setattr(PostgresSink, "WAIT_WARN_S", 0.2, raising=False)
    sinks = [_sink(tmp_path) for _ in range(3)]
    with caplog.at_level(logging.WARNING, logger="twophase"), contextlib.ExitStack() as stack:
        for i in range(12):
            stack.enter_context(sinks[i % 3].waiting(f"statement {i}"))
        time.sleep(0.7)
        assert _watchers() == 1
    waiting = [r.getMessage() for r in caplog.records if "postgres_statement_waiting" in r.getMessage()]
    for i in range(12):
        assert sum(f'doing="statement {i}"' in m for m in waiting) >= 2, (i, waiting)
    assert not any("PGPW-s3cr3t" in m for m in waiting)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="twophase"):
        time.sleep(0.5)  # the blocks ended: no warning for them any more
    assert not [r for r in caplog.records if "postgres_statement_waiting" in r.getMessage()]
    for _ in range(50):  # sequential statements reuse the thread
        with sinks[0].waiting("quick"):
            pass
    assert _watchers() == 1
