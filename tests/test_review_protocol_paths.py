"""Adversarial review (session 12) of three paths added in the last hour: TwoPhaseCommitSink's early pending record
and data_source options, the Kafka TimeoutCache, the Azure scoped sweep. Each test names the defect it pins."""

from __future__ import annotations

import os
from typing import Any

import pytest

import twophase
from twophase.errors import ConfigurationError
from twophase.sink import TransactionContext, run_task, sink_token
from twophase.user_sink import PENDING_PREFIX

import pyarrow as pa

EVENTS: list[tuple[str, str]] = []


class _TxnSink(twophase.TwoPhaseCommitSink):
    """begin_transaction opens something outside (recorded in EVENTS); abort closes it."""

    def __init__(self, root: str = "", password: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        if password == "bad":
            pass
        elif password and not password.startswith("pw-"):
            raise ValueError(f"password {password!r} is not of the form pw-...")
        self.root = root
        self.password = password

    def begin_transaction(self, context: TransactionContext) -> Any:
        name = f"{sink_token(self.sink_id)}-{context.checkpoint_id}-{context.task_id}-{context.attempt_uid}"
        EVENTS.append(("begin", name))
        return {"name": name}

    def write(self, txn: Any, batch: Any) -> None:
        pass

    def pre_commit(self, txn: Any) -> None:
        pass

    def commit(self, txn: Any) -> None:
        EVENTS.append(("commit", txn["name"]))

    def abort(self, txn: Any) -> None:
        EVENTS.append(("abort", txn["name"]))


def test_review_user_sink_an_early_record_that_cannot_be_written_aborts_the_transaction_begun(tmp_path, monkeypatch):
    """F-U3 follow-up: the early pending record is written right after begin_transaction, inside the writer's
    constructor. When that write fails (the log store unreachable from the executor, a full disk), the task failed
    but nothing aborted the transaction begun: TaskDriver had no writer to abort, and no record names it for the
    sweep (an open transaction no one will ever close). The writer now aborts it before raising."""
    EVENTS.clear()
    sink = _TxnSink(str(tmp_path / "out"), sink_id="rv", log_location=str(tmp_path / "log"))
    store_type = type(sink.transaction_log().store)
    real_put = store_type.put

    def put(self: Any, name: str, data: bytes, *a: Any, **kw: Any) -> Any:
        if name.startswith(PENDING_PREFIX):
            raise OSError("No space left on device")
        return real_put(self, name, data, *a, **kw)

    monkeypatch.setattr(store_type, "put", put)
    with pytest.raises(OSError):
        run_task(sink, TransactionContext("rv", 0, "0"), [pa.RecordBatch.from_pydict({"id": [1]})])
    begun = [n for e, n in EVENTS if e == "begin"]
    assert len(begun) == 1
    assert ("abort", begun[0]) in EVENTS, f"the transaction begun was left open: {EVENTS}"


def test_review_data_source_a_constructor_error_never_echoes_a_secret_option(tmp_path):
    """data_source options are the constructor's keyword arguments: a constructor that refuses a secret option with
    its value in the message (ValueError, or ConfigurationError) must not put that value into the error Spark shows
    and logs. Before the fix sink_from_options passed the message as it was."""
    from twophase.spark._user_format import sink_from_options

    secret = "hunter2-very-secret"
    with pytest.raises(ConfigurationError) as e:
        sink_from_options(_TxnSink, "rv-sink", {"sinkId": "rv", "password": secret,
                                                "log_location": str(tmp_path / "log")})
    assert secret not in str(e.value), str(e.value)
    assert "password" in str(e.value)
