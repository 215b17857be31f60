"""What the security tests (TLS, SASL, SCRAM, listeners, ACLs) share: a node started in process
on the listeners a test names, an ACL for alice, and round trips through each client library
(produce two records, read them back from the beginning) with the security settings the test
passes in."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaConsumer, KafkaProducer

from automq_ref.config import load_config
from automq_ref.node import Node, start_node

TIMEOUT_S = 30


async def started(directory: Path, *overrides: str) -> Node:
    """A listening node with its data under ``directory``; ``overrides`` name its listeners."""
    config = load_config(
        overrides=[
            f"log.dirs={directory / 'data'}",
            "s3.wal.capacity=16777216",
            "group.initial.rebalance.delay.ms=0",
            *overrides,
        ],
        environment={},
    )
    node = await start_node(config)
    await node.listen()
    return node


def bootstrap_of(node: Node) -> str:
    host, port = node.advertised_address
    return f"{host}:{port}"


def alice_may(
    operation: AclOperation, resource: ResourceType = ResourceType.TOPIC, name: str = "orders"
) -> AclBinding:
    """An ACL allowing ``User:alice`` ``operation`` on ``resource`` ``name`` (LITERAL, any host)."""
    return AclBinding(
        resource,
        name,
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        operation,
        AclPermissionType.ALLOW,
    )


def write(directory: Path, name: str, text: str) -> str:
    path = directory / name
    path.write_text(text)
    return str(path)


def confluent_round_trip(
    settings: dict[str, Any], topic: str, values: Sequence[bytes] = (b"three", b"four")
) -> list[bytes]:
    """confluent-kafka with ``settings`` (bootstrap and security): what a new group reads."""
    producer = Producer(settings)
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        {**settings, "group.id": f"round-trip-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    found: list[bytes] = []
    try:
        for _ in range(TIMEOUT_S * 2):
            message = consumer.poll(0.5)
            got = None if message is None or message.error() else message.value()
            if got is not None:
                found.append(got)
            if len(found) == len(values):
                break
    finally:
        consumer.close()
    return found


async def aiokafka_round_trip(
    options: dict[str, Any], topic: str, values: Sequence[bytes] = (b"one", b"two")
) -> list[bytes]:
    """aiokafka with ``options`` (its keyword arguments, bootstrap and security)."""
    producer = AIOKafkaProducer(**options)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **options)
    await consumer.start()
    try:
        found: list[bytes] = []
        while len(found) < len(values):
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), TIMEOUT_S)
            found += [record.value for records in batches.values() for record in records]
        return found
    finally:
        await consumer.stop()


def kafka_python_round_trip(
    options: dict[str, Any], topic: str, values: Sequence[bytes] = (b"five", b"six")
) -> list[bytes]:
    """kafka-python with ``options`` (its keyword arguments, bootstrap and security)."""
    producer = KafkaProducer(**options)
    for value in values:
        producer.send(topic, value)
    producer.flush(TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer(
        topic, auto_offset_reset="earliest", consumer_timeout_ms=10_000, **options
    )
    try:
        return [record.value for record, _ in zip(consumer, range(len(values)), strict=False)]
    finally:
        consumer.close()


def kcat_round_trip(kcat: str, bootstrap: str, settings: Sequence[str], topic: str) -> list[str]:
    """Ten lines through kcat, ``settings`` as its ``-X`` properties; the lines read back."""
    options = [item for setting in settings for item in ("-X", setting)]
    lines = "".join(f"kcat-{index}\n" for index in range(10))
    subprocess.run(
        [kcat, "-b", bootstrap, *options, "-P", "-t", topic],
        input=lines,
        text=True,
        check=True,
        timeout=TIMEOUT_S,
    )
    consumed = subprocess.run(
        [kcat, "-b", bootstrap, *options, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
        capture_output=True,
        text=True,
        check=True,
        timeout=TIMEOUT_S,
    )
    return consumed.stdout.splitlines()
