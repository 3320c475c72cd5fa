"""Review item U-d: an attribute of a bound TwoPhaseCommitSink that cannot be pickled (a client a hook made lazily)
travels as None; the warning ``attribute_not_pickled`` is logged once per process, not once per task and batch."""

from __future__ import annotations

import logging
import pickle
import threading
from typing import Any

import twophase
from twophase.user_sink import _NOT_PICKLED_WARNED


class _LazySink(twophase.TwoPhaseCommitSink):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.client = None

    def begin_transaction(self, context: Any) -> Any:
        return {}

    def write(self, txn: Any, batch: Any) -> None:
        pass

    def pre_commit(self, txn: Any) -> None:
        pass

    def commit(self, txn: Any) -> None:
        pass

    def abort(self, txn: Any) -> None:
        pass


def test_user_sink_attribute_not_pickled_is_warned_once_per_process(tmp_path, caplog):
    sink = _LazySink(sink_id="u-d-warn-once", log_location=str(tmp_path / "log"))
    sink.bind_owner(str(tmp_path / "ck"))
    sink.client = threading.Lock()  # made lazily by a hook after the sink was bound
    _NOT_PICKLED_WARNED.discard(("_LazySink", "u-d-warn-once", "client"))
    with caplog.at_level(logging.DEBUG):
        copies = [pickle.loads(pickle.dumps(sink)) for _ in range(5)]  # five tasks
    assert all(c.client is None for c in copies)
    warned = [r for r in caplog.records if "attribute_not_pickled" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert warned[0].levelno == logging.WARNING
    assert "client" in warned[0].getMessage()
