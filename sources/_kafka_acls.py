"""The ACLs the Kafka source needs, checked once at start on the driver.

The source joins no consumer group and commits nothing to Kafka: it needs **READ** (Fetch, on the executors) and
**DESCRIBE** (Metadata, ListOffsets, on the driver) on each topic it reads, and nothing on the cluster or
transactional ids. librdkafka's reader (the default) also needs **DESCRIBE on its group** (``kafka.group.id`` or the
generated ``<groupIdPrefix or spark-kafka-source>-<uuid>``): it sends FindCoordinator for its ``group.id`` though it
only assigns partitions, and answers GROUP_AUTHORIZATION_FAILED to the reader (seen on Apache Kafka 4.4.0 with
StandardAuthorizer); kafka-python's reader uses no group. Under Kafka's
``StandardAuthorizer`` a missing one showed as a misleading "topic does not exist" (DESCRIBE) or only as a failed
task on the executors (READ). The driver asks once, with a Metadata request that includes the topic's authorized
operations (KIP-430, Kafka 2.3+), and names what is missing; a broker that does not tell (older, or no authorizer)
is not refused here."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from twophase.errors import ConfigurationError

SOURCE = "twophase-kafka source"

#: Kafka's AclOperation codes (the bits of a Metadata response's topic_authorized_operations)
_OPERATIONS = {"READ": 3, "WRITE": 4, "DESCRIBE": 8}
#: the operations the source needs on every topic it reads
NEEDED = ("READ", "DESCRIBE")
#: TOPIC_AUTHORIZATION_FAILED
_TOPIC_AUTHORIZATION_FAILED = 29


def _operations(topic: Mapping[str, Any]) -> Optional[frozenset[str]]:
    """The operations a Metadata topic entry says the principal may do, or None where the broker did not say."""
    ops = topic.get("authorized_operations", topic.get("topic_authorized_operations"))
    if ops is None:
        return None
    if isinstance(ops, int):
        if ops < 0:    # -2147483648: not asked / not provided
            return None
        return frozenset(name for name, code in _OPERATIONS.items() if ops & (1 << code))
    names = {code: name for name, code in _OPERATIONS.items()}
    out = set()
    for o in ops:   # AclOperation enums, their names, or their codes
        if hasattr(o, "name"):
            out.add(str(o.name).upper())
        elif isinstance(o, int):
            out.add(names.get(o, str(o)))
        else:
            out.add(str(o).upper())
    return frozenset(out)


def missing_acls(described: Iterable[Mapping[str, Any]], topics: Iterable[str]) -> dict[str, list[str]]:
    """Per topic of ``topics``, the operations of :data:`NEEDED` the principal lacks (from the topic entries of
    a Metadata response, ``described``); a topic the broker says nothing of is not listed."""
    by_name = {t.get("name", t.get("topic")): t for t in described}
    out: dict[str, list[str]] = {}
    for topic in topics:
        entry = by_name.get(topic)
        if entry is None:
            continue
        if entry.get("error_code", 0) == _TOPIC_AUTHORIZATION_FAILED:
            out[topic] = list(NEEDED)
            continue
        ops = _operations(entry)
        # a topic the broker described is one the principal may DESCRIBE: operations without DESCRIBE are a form
        # this check does not read (never a reason to refuse the query)
        if ops is not None and "ALL" not in ops and "DESCRIBE" in ops:
            lacking = [op for op in NEEDED if op not in ops]
            if lacking:
                out[topic] = lacking
    return out


def acl_error(missing: Mapping[str, list[str]], bootstrap: Any) -> ConfigurationError:
    """The start error naming the ACLs the principal lacks and the command that grants them."""
    parts = "; ".join(f"{' and '.join(ops)} on topic {topic!r}" for topic, ops in sorted(missing.items()))
    topics = " ".join(f"--topic {t}" for t in sorted(missing))
    return ConfigurationError(
        f"{SOURCE}: the brokers at {bootstrap} do not allow this principal {parts}. The source needs the ACLs READ "
        "and DESCRIBE on each topic it reads, e.g. kafka-acls --add --allow-principal User:<user> --operation Read "
        f"--operation Describe {topics}; with kafkaClient=librdkafka (the default) also DESCRIBE on its consumer "
        "group, which librdkafka looks up though the source never joins it nor commits to it (kafka.group.id, or the "
        "prefix groupIdPrefix / spark-kafka-source: --operation Describe --group spark-kafka-source "
        "--resource-pattern-type prefixed); no cluster or transactional-id ACL")


def describe_topics(consumer: Any, topics: list[str]) -> Optional[list[dict[str, Any]]]:
    """The topic entries of a Metadata request (with the topics' authorized operations) sent over the driver's
    kafka-python consumer, or None where it is not a kafka-python consumer (a test's fake)."""
    manager = getattr(consumer, "_manager", None)
    if manager is None or not hasattr(manager, "run") or not hasattr(manager, "send"):
        return None
    from kafka.protocol.metadata import MetadataRequest
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
                              allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                              include_topic_authorized_operations=True)

    async def go() -> Any:
        return await manager.send(request)
    return list(manager.run(go).to_dict().get("topics") or [])


def check_source_acls(consumer: Any, topics: Iterable[str], bootstrap: Any) -> None:
    """Raise :func:`acl_error` if the brokers say the principal lacks READ or DESCRIBE on one of ``topics``
    (asked over ``consumer``, the driver's kafka-python consumer)."""
    topics = sorted(set(topics))
    if not topics:
        return
    try:
        described = describe_topics(consumer, topics)
    except Exception as e:  # noqa: BLE001 - best effort: a broker that cannot answer this is named by the offset queries
        from twophase._logging import get_logger
        from twophase._redact import redact_text
        get_logger("twophase.sources.kafka").debug("kafka_source_acl_check_skipped", topics=topics,
                                                   error=redact_text(f"{type(e).__name__}: {e}"))
        return
    if described is None:
        return
    missing = missing_acls(described, topics)
    if missing:
        raise acl_error(missing, bootstrap)
