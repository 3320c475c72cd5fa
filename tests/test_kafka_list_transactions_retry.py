"""TxnClient.list_transactions (the sweep's ListTransactions, sent to every broker of the metadata): a broker that
does not answer (SIGKILLed and not yet fenced: a lost connection; SIGSTOPped: a request timeout) or a coordinator
partition still loading is asked again with fresh metadata until the retry deadline, never skipped and never a
failed batch at the first error (found by the nemesis on the 3-broker cluster: kafka/leader_kill seed 22.0,
kafka/broker_pause seed 22.11; integration test: test_kafka_cluster_broker_killed_the_next_batch_start_...)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("kafka")

import kafka.errors as Errors  # noqa: E402

from twophase.errors import TransientSinkError  # noqa: E402
from twophase.sinks._kafka_txn import TxnClient  # noqa: E402


class _Admin:
    """Answers each ListTransactions with the next of ``answers`` (an error class, or ``{broker: [rows]}``)."""

    def __init__(self, answers: list) -> None:
        self.answers, self.calls, self.refreshes = list(answers), 0, 0
        self._manager = SimpleNamespace(cluster=SimpleNamespace(request_update=self._refresh))

    def _refresh(self) -> None:
        self.refreshes += 1

    def list_transactions(self, state_filters=None):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, type) and issubclass(answer, Exception):
            raise answer()
        return answer


def _client(answers: list, deadline_s: float = 10.0) -> TxnClient:
    client = TxnClient.__new__(TxnClient)
    client.config, client.retry_deadline_s = {}, deadline_s
    client.admin = _Admin(answers)
    return client


def _row(tid: str) -> SimpleNamespace:
    return SimpleNamespace(transactional_id=tid, producer_id=5, state=SimpleNamespace(value="Ongoing"))


@pytest.mark.parametrize("error", [Errors.KafkaConnectionError, Errors.RequestTimedOutError,
                                   Errors.CoordinatorLoadInProgressError, Errors.NodeNotReadyError])
def test_list_transactions_asks_again_with_fresh_metadata(error: type) -> None:
    client = _client([error, error, {1: [_row("p-0-0"), _row("other-0-0")], 2: []}])
    assert client.list_transactions("p-") == [("p-0-0", 5, "Ongoing")]
    assert client.admin.calls == 3 and client.admin.refreshes == 2


def test_list_transactions_gives_up_after_the_retry_deadline_naming_the_request() -> None:
    client = _client([Errors.KafkaConnectionError] * 200, deadline_s=0.2)
    with pytest.raises(TransientSinkError, match="ListTransactions.*KafkaConnectionError"):
        client.list_transactions("p-")


def test_list_transactions_unsupported_is_none_at_once() -> None:
    client = _client([Errors.UnsupportedVersionError])
    assert client.list_transactions("p-") is None and client.admin.calls == 1
