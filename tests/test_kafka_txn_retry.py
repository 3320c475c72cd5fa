"""TxnClient's requests go through one retry loop (``_call``): a retriable coordinator error is retried."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("kafka")

import kafka.errors as Errors  # noqa: E402

from twophase.errors import TransientSinkError  # noqa: E402
from twophase.sinks._kafka_txn import TxnClient  # noqa: E402


class _Manager:
    """Answers each request with the next of ``answers`` (an error class or a response)."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)
        self.sent = 0
        self.cluster = SimpleNamespace(_coordinators={})

    def run(self, go):
        self.sent += 1
        answer = self.answers.pop(0)
        if isinstance(answer, type) and issubclass(answer, Exception):
            raise answer()
        return answer


def _client(answers: list, deadline_s: float = 10.0) -> TxnClient:
    client = TxnClient.__new__(TxnClient)
    client.config, client.retry_deadline_s = {}, deadline_s
    client.admin = SimpleNamespace(_manager=_Manager(answers))
    return client


def _init_pid(error: type, pid: int = 7, epoch: int = 3) -> SimpleNamespace:
    return SimpleNamespace(error_code=error.errno, producer_id=pid, producer_epoch=epoch)


@pytest.mark.parametrize("error", [Errors.CoordinatorLoadInProgressError, Errors.NotCoordinatorError,
                                   Errors.ConcurrentTransactionsError])
def test_fence_retries_a_retriable_coordinator_error(error: type) -> None:
    client = _client([_init_pid(error), _init_pid(error), _init_pid(Errors.NoError)])
    assert client.fence("p-0-0", 60_000) == (7, 3)
    assert client.admin._manager.sent == 3


def test_fence_retries_a_lost_connection() -> None:
    client = _client([Errors.KafkaConnectionError, _init_pid(Errors.NoError, 9, 1)])
    assert client.fence("p-0-0", 60_000) == (9, 1)


def test_fence_gives_up_after_the_retry_deadline_naming_the_request() -> None:
    client = _client([_init_pid(Errors.CoordinatorLoadInProgressError)] * 200, deadline_s=0.2)
    with pytest.raises(TransientSinkError, match="fencing.*CoordinatorLoadInProgress"):
        client.fence("p-0-0", 60_000)


def test_fence_refused_timeout_is_not_retried_and_named() -> None:
    client = _client([_init_pid(Errors.InvalidTransactionTimeoutError)])
    with pytest.raises(TransientSinkError, match="InvalidTransactionTimeout"):
        client.fence("p-0-0", 60_000)
    assert client.admin._manager.sent == 1
    assert client.accepts_timeout.__func__  # accepts_timeout reads the name from this message
    assert _client([_init_pid(Errors.InvalidTransactionTimeoutError)]).accepts_timeout("p-t", 60_000) is False
