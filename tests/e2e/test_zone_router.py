"""The zone router's produce path on three broker processes (racks az1, az2, az3 on one etcd,
the router on with its channels and the brokers' object WALs in the test's object store): a
confluent-kafka producer declaring zone az2, bootstrapped to broker 2, produces to a topic
whose partitions all three brokers lead. Broker 2 is told to lead everything; it routes the
records of the partitions brokers 1 and 3 lead through its RouterChannel, and appends its own
through the channel too (``router_channel`` local write mode, the default). The cluster runs
twice: on directories, and on one S3 bucket (moto) holding the channels, the WALs and the
objects.

Checked: every acknowledged record is read back at its offset and in the producer's order by a
consumer without a zone (it reads from the real leaders); the leaders' WALs hold link records
and never the records themselves, the uploads hold all of them; a leader killed right after
acknowledging routed records loses none of them (its WAL held only links: its own restart, or
the failover's takeover, reads the data back from broker 2's channel).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, Message, Producer

from automq_ref.formats.stream_record_batch import decode as decode_batch
from automq_ref.formats.wal_object import WAL_OBJECT_HEADER_SIZE, WalObjectHeader
from automq_ref.formats.wal_record import WAL_RECORD_HEADER_SIZE, decode_wal_record
from automq_ref.formats.zone_router import LinkRecord
from automq_ref.io.storage.object_store import open_object_store
from automq_ref.vocabulary.naming import NAMESPACE, parse_wal_object_key, wal_objects_prefix
from tests.conftest import MotoS3
from tests.e2e.test_cluster import (
    NODES,
    Ack,
    Cluster,
    _field,
    _last_line,
    agreed_leaders,
    check,
    create_topic,
    read_all,
    running_cluster,
    unique,
)
from tests.waiting import PATIENCE_S, wait_until

PARTITIONS = 6
NAME = "zr"


@dataclass(frozen=True)
class Routed:
    """The cluster and the object stores (URIs) of its WALs and of its uploads."""

    cluster: Cluster
    wals: str
    objects: str


@pytest.fixture(scope="module", params=["directory", "s3"])
def routed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Routed]:
    """The cluster with its channels, WALs and objects in directories, or in one S3 bucket
    (moto)."""
    failed_before = request.session.testsfailed
    if request.param == "s3":
        moto: MotoS3 = request.getfixturevalue("moto_s3")
        bucket = unique("zone-router")
        urllib.request.urlopen(
            urllib.request.Request(f"{moto.endpoint_url}/{bucket}", data=b"", method="PUT"),
            timeout=10,
        ).read()
        location = (
            f"s3://{bucket}?region={moto.region}&endpoint={moto.endpoint_url}&pathStyle=true"
            f"&accessKey={moto.access_key_id}&secretKey={moto.secret_access_key}"
        )
        channels = wals = objects = location
        store: str | None = f"0@{location}"
    else:
        shared = tmp_path_factory.mktemp("zone-router")
        for name in ("channel", "wal", "objects"):
            (shared / name).mkdir()
        channels = f"dir://{shared / 'channel'}"
        wals = f"dir://{shared / 'wal'}"
        objects = (shared / "objects").as_uri()
        store = objects
    separator = "&" if "?" in channels else "?"
    overrides = (
        f"automq.zonerouter.channels=0@{channels}{separator}batchInterval=20",
        f"s3.wal.path=0@{wals}{separator}batchInterval=20",
        "automq.zonerouter.route.epoch.bump.interval.ms=2000",
    )
    with running_cluster(
        lambda: request.session.testsfailed > failed_before, store=store, overrides=overrides
    ) as cluster:
        yield Routed(cluster, wals.replace("dir://", "file://"), objects)


class Acks:
    def __init__(self) -> None:
        self.acks: list[Ack] = []
        self.failures: list[str] = []

    def delivered(self, error: KafkaError | None, message: Message) -> None:
        value = message.value() or b""
        if error is not None:
            self.failures.append(f"{value!r}: {error}")
            return
        offset = message.offset()
        assert offset is not None
        self.acks.append(Ack(message.partition() or 0, offset, value, time.monotonic()))


def produce_in_az2(cluster: Cluster, topic: str, rounds: int, start: int, acks: Acks) -> None:
    producer = Producer(
        {
            "bootstrap.servers": cluster.brokers[2].bootstrap,
            "client.id": "automq_az=az2",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "compression.type": "none",
            "message.timeout.ms": int(PATIENCE_S * 1000),
        }
    )
    for sequence in range(start, start + rounds):
        for partition in range(PARTITIONS):
            value = f"{NAME}-{partition}-{sequence:08d}".encode()
            producer.produce(topic, value=value, partition=partition, on_delivery=acks.delivered)
        producer.poll(0)
    assert producer.flush(PATIENCE_S) == 0, "records not delivered"


def stored_bytes(uri: str) -> bytes:
    """Every object of the store at ``uri`` but WAL and channel objects, concatenated: what
    was uploaded."""

    async def read() -> bytes:
        async with open_object_store(uri) as store:
            listed = [info.key for info in await store.list("")]
            uploaded = [key for key in listed if "/wal/" not in key]
            return b"".join([await store.get(key) for key in uploaded])

    return asyncio.run(read())


def wal_records(wals: str, node_id: int) -> list[tuple[int, bytes]]:
    """(count, payload) of every batch in node ``node_id``'s WAL objects, read raw."""

    async def read() -> list[tuple[int, bytes]]:
        found = []
        async with open_object_store(wals) as store:
            prefix = wal_objects_prefix(NAMESPACE, node_id)
            listed = [
                (parse_wal_object_key(prefix, info.key), info.key)
                for info in await store.list(prefix)
            ]
            for _, key in sorted(listed):
                blob = await store.get(key)
                header = WalObjectHeader.decode(blob)
                position = WAL_OBJECT_HEADER_SIZE
                while position < WAL_OBJECT_HEADER_SIZE + header.data_length:
                    offset = header.start_offset + position - WAL_OBJECT_HEADER_SIZE
                    record, body = decode_wal_record(blob, position, offset)
                    if record.body_length:
                        batch = decode_batch(bytes(body))[0]
                        found.append((batch.count, bytes(batch.payload)))
                    position += WAL_RECORD_HEADER_SIZE + record.body_length
        return found

    return asyncio.run(read())


def test_a_producer_in_az2_writes_through_node_2_to_every_leader(routed: Routed) -> None:
    cluster = routed.cluster
    topic = unique("routed")
    create_topic(cluster.brokers[1].bootstrap, topic, PARTITIONS)
    leaders = agreed_leaders(cluster, topic)
    assert set(leaders.values()) == set(NODES), f"placement spreads the topic: {leaders}"

    acks = Acks()
    produce_in_az2(cluster, topic, 40, 0, acks)
    assert not acks.failures, acks.failures[:3]
    assert len(acks.acks) == 40 * PARTITIONS

    # A consumer without a zone reads from the real leaders.
    log = read_all(cluster.bootstrap(), topic, PARTITIONS)
    check(log, acks.acks, [NAME])
    assert sum(len(records) for records in log.values()) == 40 * PARTITIONS

    # The WALs never hold the records (only link records to node 2's channel); the uploads,
    # which the route epochs' commits make within seconds, hold every one of them.
    for node in NODES:
        records = wal_records(routed.wals, node)
        assert not any(f"{NAME}-".encode() in payload for _, payload in records), node
    values = {ack.value for ack in acks.acks}

    def uploaded() -> bool:
        stored = stored_bytes(routed.objects)
        return all(value in stored for value in values)

    wait_until(uploaded, "every acknowledged record in the uploaded objects")


def test_a_killed_leader_keeps_routed_records(routed: Routed) -> None:
    cluster = routed.cluster
    topic = unique("killed")
    create_topic(cluster.brokers[1].bootstrap, topic, PARTITIONS)
    leaders = agreed_leaders(cluster, topic)
    led_by_1 = [index for index, leader in leaders.items() if leader == 1]
    assert led_by_1, leaders

    acks = Acks()
    produce_in_az2(cluster, topic, 30, 0, acks)
    assert not acks.failures, acks.failures[:3]
    # Killed at once: what it acknowledged last is in its WAL, not uploaded yet.
    cluster.brokers[1].kill()
    records = wal_records(routed.wals, 1)
    links = [LinkRecord.decode(payload) for count, payload in records if count < 0]
    assert links, f"node 1's WAL holds no link record ({len(records)} records)"
    assert all(link.channel_offset.channel_owner == 2 for link in links)
    assert not any(NAME.encode() + b"-" in payload for _, payload in records), (
        "node 1's WAL holds routed records themselves"
    )

    # Recovered by a failover, or by its own restart: nothing acknowledged is lost.
    cluster.heal()
    wait_until(lambda: agreed_leaders(cluster, topic) is not None, "leaders again")
    log = read_all(cluster.bootstrap(), topic, PARTITIONS)
    check(log, acks.acks, [NAME])
    recovered = _last_line(cluster.brokers[1], "WAL recovered")
    print(recovered)
    failed_over = any(
        "failover started" in cluster.brokers[node].log_path.read_text() for node in (2, 3)
    )
    assert failed_over or _field(recovered, "links") > 0, recovered

    # The router works on after it.
    more = Acks()
    produce_in_az2(cluster, topic, 10, 30, more)
    assert not more.failures, more.failures[:3]
    log = read_all(cluster.bootstrap(), topic, PARTITIONS)
    check(log, [*acks.acks, *more.acks], [NAME])
