"""The Kafka source's start check of its ACLs (sources/_kafka_acls.py) on Metadata answers (no broker; the real
authorizer: integration/kafka/test_kafka_security.py::test_kafka_security_source_needs_only_topic_read_and_...)."""

from __future__ import annotations

import pytest

pytest.importorskip("kafka")

from twophase.errors import ConfigurationError  # noqa: E402
from twophase.sources._kafka_acls import check_source_acls, missing_acls  # noqa: E402

READ, WRITE, DESCRIBE = 1 << 3, 1 << 4, 1 << 8


def test_missing_acls_from_the_authorized_operations_bits_and_a_refused_topic() -> None:
    described = [{"name": "ok", "error_code": 0, "topic_authorized_operations": READ | DESCRIBE | WRITE},
                 {"name": "no-read", "error_code": 0, "topic_authorized_operations": DESCRIBE},
                 {"name": "codes", "error_code": 0, "topic_authorized_operations": [3, 8, 4]},
                 {"name": "code-no-read", "error_code": 0, "topic_authorized_operations": [8]},
                 {"name": "unreadable", "error_code": 0, "topic_authorized_operations": ["x", "y"]},
                 {"name": "refused", "error_code": 29, "topic_authorized_operations": -2147483648},
                 {"name": "untold", "error_code": 0, "topic_authorized_operations": -2147483648},
                 {"name": "named", "error_code": 0, "authorized_operations": ["DESCRIBE", "WRITE"]}]
    topics = ["ok", "no-read", "codes", "code-no-read", "unreadable", "refused", "untold", "named", "absent"]
    assert missing_acls(described, topics) == {"no-read": ["READ"], "code-no-read": ["READ"],
                                               "refused": ["READ", "DESCRIBE"], "named": ["READ"]}


def test_check_source_acls_names_the_acls_and_the_command_and_skips_a_fake_consumer() -> None:
    class Manager:
        def __init__(self, topics):
            self.topics = topics

        async def send(self, request):
            return type("R", (), {"to_dict": lambda _: {"topics": self.topics}})()

        def run(self, coro):
            import asyncio
            return asyncio.run(coro())

    consumer = type("C", (), {})()
    check_source_acls(consumer, ["t"], "h:9092")            # not kafka-python's consumer: not asked
    consumer._manager = Manager([{"name": "t", "error_code": 29}])
    with pytest.raises(ConfigurationError, match=r"READ and DESCRIBE on topic 't'.*--operation Read --operation "
                                                 r"Describe --topic t.*DESCRIBE on its consumer group"):
        check_source_acls(consumer, ["t"], "h:9092")
    consumer._manager = Manager([{"name": "t", "error_code": 0, "topic_authorized_operations": READ | DESCRIBE}])
    check_source_acls(consumer, ["t"], "h:9092")
