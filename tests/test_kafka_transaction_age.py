"""Invariant 7's one age arithmetic (:class:`twophase.sinks.kafka.TransactionAge`) as both of its users apply it:
the commit's warning and alarm (``KafkaCommitter._check_age``: above 25 % warns, above 50 % raises the alarm) and
the check before the decision (``KafkaCommitter.check_prepared``: within ``min(2 s, 10 %)`` of the timeout the
batch is declined). Pure arithmetic over a committable; the broker's part is
integration/kafka/test_kafka_sink.py (check_prepared) and tests/test_kafka_driver_state.py (the alarm)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("kafka")

from twophase.errors import TransientSinkError  # noqa: E402
from twophase.sinks._kafka_committer import KafkaCommitter  # noqa: E402
from twophase.sinks.kafka import KafkaCommittable, TransactionAge  # noqa: E402

NOW = 1_800_000_000.0


def _committable(age_s: float, timeout_ms: Any = 60_000) -> KafkaCommittable:
    return KafkaCommittable(checkpoint_id=3, task_id="0", attempt_uid="a", transactional_id="p-0-1-0",
                            partitions=[{"topic": "t", "partition": 0, "first_offset": 0}],
                            began_at=NOW - age_s, timeout_ms=timeout_ms, producer_id=7, epoch=0)


@pytest.mark.parametrize("timeout_ms, age_ms, warns, blocks, expiring", [
    (60_000, 15_000, False, False, False),     # 25 % exactly: no warning yet
    (60_000, 15_001, True, False, False),
    (60_000, 30_001, True, True, False),
    (60_000, 57_999, True, True, False),       # margin min(2 s, 6 s) = 2 s
    (60_000, 58_000, True, True, True),
    (10_000, 8_999, True, True, False),        # margin min(2 s, 1 s) = 1 s
    (10_000, 9_000, True, True, True),
    (0, 10**9, False, False, False),           # no timeout recorded: never near
])
def test_transaction_age_thresholds(timeout_ms: int, age_ms: int, warns: bool, blocks: bool, expiring: bool) -> None:
    age = TransactionAge(age_ms, timeout_ms)
    assert (age.warns, age.blocks, age.expiring) == (warns, blocks, expiring)


def test_committable_age_measures_from_began_at() -> None:
    assert _committable(12.5).age(NOW) == TransactionAge(12_500.0, 60_000.0)
    assert KafkaCommittable(checkpoint_id=1, task_id="0", attempt_uid="a").age(NOW) is None


def _committer(alarms: list) -> KafkaCommitter:
    def describe(ids: Any) -> Any:
        raise TransientSinkError("no coordinator")          # check_prepared then judges by age alone
    client = SimpleNamespace(describe=describe)
    committer = KafkaCommitter.__new__(KafkaCommitter)
    committer.sink = SimpleNamespace(_client=lambda: client,
                                     _raise_alarm=lambda c, age_ms, timeout: alarms.append((c.checkpoint_id, timeout)))
    return committer


def test_check_prepared_and_check_age_share_the_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    import twophase.sinks.kafka as kafka_sink
    monkeypatch.setattr(kafka_sink.time, "time", lambda: NOW)
    alarms: list = []
    committer = _committer(alarms)
    assert committer.check_prepared(3, [_committable(8.9, 10_000)]) == []
    (reason,) = committer.check_prepared(3, [_committable(9.0, 10_000)])
    assert "9.0s old" in reason and "kafka.transaction.timeout.ms=10000" in reason
    committer._check_age(_committable(30.0))                # 50 % exactly: warns, no alarm
    assert alarms == []
    committer._check_age(_committable(30.5))
    assert alarms == [(3, 60_000)]
    committer._check_age(_committable(59.0), recovering=True)   # recovery measures the outage: never the alarm
    assert alarms == [(3, 60_000)]
