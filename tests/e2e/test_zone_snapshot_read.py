"""Reads in the client's zone on three broker processes (racks az1, az2, az3, the zone router on,
object WALs in one shared directory): records produced straight to the partitions' leaders by a
producer without a zone are consumed, every one in order, by a kafka-python and a confluent-kafka
consumer declaring zone az2 that bootstrap to node 2, which Metadata names leader of every
partition and which serves the partitions nodes 1 and 3 lead from its snapshot-read copies (kept
up through AutomqGetPartitionSnapshot and, when the main's delta overflows, the main's WAL
objects); node 2's log names every partition it served that way, the other brokers' none. The
ConfirmWal trace node 2 recorded for one of them is validated by TLC. A second test restarts broker
1 while a consumer in az2 reads: every acknowledged record still arrives once, in order.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from tests.e2e.test_cluster import (
    NODES,
    Cluster,
    agreed_leaders,
    create_topic,
    leaders,
    running_cluster,
    unique,
)
from tests.waiting import PATIENCE_S, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

PARTITIONS = 6
ROUNDS = 3
PER_ROUND = 20  # per partition and round
VALUE_BYTES = 2048
BIG_BYTES = 40 * 1024  # one record a round past the main's 32 KiB delta: the WAL is read


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the brokers record their snapshot-read partitions' ConfirmWal steps."""
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def zoned(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, traces: Path
) -> Iterator[Cluster]:
    failed_before = request.session.testsfailed
    channel = tmp_path_factory.mktemp("router-channel")
    wals = tmp_path_factory.mktemp("wals")
    overrides = (
        f"automq.zonerouter.channels=0@dir://{channel}?batchInterval=250",
        f"s3.wal.path=0@dir://{wals}?batchInterval=50",
        f"automq.zonerouter.snapshot.read.trace.dir={traces}",
    )
    with running_cluster(
        lambda: request.session.testsfailed > failed_before, overrides=overrides
    ) as cluster:
        yield cluster


def produce(bootstrap: str, topic: str, round_: int) -> dict[int, list[bytes]]:
    """``PER_ROUND`` records to every partition, acknowledged by its leader (no zone)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    sent: dict[int, list[bytes]] = {index: [] for index in range(PARTITIONS)}
    failures: list[object] = []
    for number in range(PER_ROUND):
        for index in range(PARTITIONS):
            size = BIG_BYTES if number == PER_ROUND // 2 else VALUE_BYTES
            value = f"{round_}:{index}:{number}:".encode().ljust(size, b"x")
            sent[index].append(value)
            producer.produce(
                topic,
                value=value,
                partition=index,
                on_delivery=lambda error, _: failures.append(error) if error else None,
            )
        producer.poll(0)
    assert producer.flush(PATIENCE_S) == 0
    assert not failures, failures[:3]
    return sent


def confluent_read(
    bootstrap: str, topic: str, expected: dict[int, list[bytes]]
) -> dict[int, list[bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "automq_az=az2",
            "group.id": unique("unused"),  # required by the client; offsets are not committed
            "enable.auto.commit": False,
        }
    )
    got: dict[int, list[bytes]] = {index: [] for index in expected}
    try:
        consumer.assign([KafkaPartition(topic, index, OFFSET_BEGINNING) for index in expected])
        deadline = time.monotonic() + PATIENCE_S
        while any(len(got[i]) < len(expected[i]) for i in got):
            assert time.monotonic() < deadline, {i: len(got[i]) for i in got}
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            index = message.partition()
            assert index is not None
            assert message.offset() == len(got[index]), (index, message.offset())
            value = message.value()
            assert value is not None
            got[index].append(value)
    finally:
        consumer.close()
    return got


def test_a_consumer_in_az2_reads_every_partition_from_node_2(zoned: Cluster, traces: Path) -> None:
    topic = unique("snapread")
    create_topic(zoned.brokers[1].bootstrap, topic, PARTITIONS)
    leaders = agreed_leaders(zoned, topic)
    assert set(leaders.values()) == set(NODES), f"placement spreads the topic: {leaders}"
    consumer = KafkaConsumer(
        bootstrap_servers=zoned.brokers[2].bootstrap,
        client_id="automq_az=az2&automq_type=consumer",
        enable_auto_commit=False,
        fetch_max_wait_ms=200,
        max_partition_fetch_bytes=64 * 1024,
    )
    try:
        partitions = [TopicPartition(topic, index) for index in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        expected: dict[int, list[bytes]] = {index: [] for index in range(PARTITIONS)}
        got: dict[int, list[tuple[int, bytes]]] = {index: [] for index in range(PARTITIONS)}
        for round_ in range(ROUNDS):
            for index, values in produce(zoned.bootstrap(), topic, round_).items():
                expected[index].extend(values)
            deadline = time.monotonic() + PATIENCE_S
            while any(len(got[i]) < len(expected[i]) for i in got):
                assert time.monotonic() < deadline, {i: len(got[i]) for i in got}
                for part, records in consumer.poll(timeout_ms=500).items():
                    got[part.partition].extend((r.offset, r.value) for r in records)
        for index in range(PARTITIONS):
            offsets = [offset for offset, _ in got[index]]
            assert offsets == list(range(len(expected[index]))), index
            assert [value for _, value in got[index]] == expected[index], index
        # kafka-python fetches each partition from its leader as Metadata named it: node 2.
        cluster = consumer._client.cluster
        assert {cluster.leader_for_partition(p) for p in partitions} == {2}
    finally:
        consumer.close()
    # confluent-kafka (librdkafka: it validates positions with OffsetForLeaderEpoch) reads the
    # same records from node 2.
    assert confluent_read(zoned.brokers[2].bootstrap, topic, expected) == expected
    # Node 2 served the partitions nodes 1 and 3 lead from its snapshot-read copies, and no
    # other broker served any.
    for node in NODES:
        log = zoned.brokers[node].log_path.read_text(errors="replace")
        served = {
            index for index in range(PARTITIONS) if f"snapshot read serves {topic}-{index} " in log
        }
        want = {index for index, leader in leaders.items() if leader != 2} if node == 2 else set()
        assert served == want, (node, served, leaders)
    log = zoned.brokers[2].log_path.read_text(errors="replace")
    assert "reading its WAL objects" in log  # a delta overflowed: the WAL objects were read
    # The ConfirmWal steps node 2 took for a partition node 1 or 3 leads are a behaviour of
    # specs/ConfirmWal.tla (TLC).
    if shutil.which("java") is not None:
        index = min(index for index, leader in leaders.items() if leader != 2)
        [path] = traces.glob(f"node2-main{leaders[index]}-*-{topic}-{index}.ndjson")
        lines = tv.read_ndjson(path)
        assert {"ReplayRecord", "ApplySnapshot", "ServeRead"} <= {line.action for line in lines}
        verdict = tv.validate(lines, "ConfirmWal", timeout_s=600)
        assert verdict.accepted, verdict.message


def test_reads_in_az2_survive_a_main_restarting(zoned: Cluster) -> None:
    """Broker 1 restarts while a consumer in az2 reads through node 2: its partitions move away
    and (maybe) back, node 2 follows them to their new mains, and the consumer still gets every
    acknowledged record once, in order."""
    topic = unique("snapread-restart")
    create_topic(zoned.brokers[1].bootstrap, topic, PARTITIONS)
    agreed_leaders(zoned, topic)
    consumer = KafkaConsumer(
        bootstrap_servers=zoned.brokers[2].bootstrap,
        client_id="automq_az=az2&automq_type=consumer",
        enable_auto_commit=False,
        fetch_max_wait_ms=200,
    )
    try:
        partitions = [TopicPartition(topic, index) for index in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        expected: dict[int, list[bytes]] = {index: [] for index in range(PARTITIONS)}
        got: dict[int, list[tuple[int, bytes]]] = {index: [] for index in range(PARTITIONS)}
        for round_ in range(3):
            if round_ == 1:
                zoned.brokers[1].stop()
                zoned.brokers[1].start()
                agreed_leaders(zoned, topic)
            for index, values in produce(zoned.bootstrap(), topic, round_).items():
                expected[index].extend(values)
            deadline = time.monotonic() + 2 * PATIENCE_S
            while any(len(got[i]) < len(expected[i]) for i in got):
                assert time.monotonic() < deadline, {i: len(got[i]) for i in got}
                for part, records in consumer.poll(timeout_ms=500).items():
                    got[part.partition].extend((r.offset, r.value) for r in records)
        for index in range(PARTITIONS):
            assert [offset for offset, _ in got[index]] == list(range(len(expected[index])))
            assert [value for _, value in got[index]] == expected[index], index
    finally:
        consumer.close()


TXN_PER_PARTITION = 3  # records per partition and transaction


def txn_values(tag: str, partitions: int) -> dict[int, list[bytes]]:
    return {
        index: [f"{tag}:{index}:{n}".encode() for n in range(TXN_PER_PARTITION)]
        for index in range(partitions)
    }


def send_all(producer: Producer, topic: str, values: dict[int, list[bytes]]) -> None:
    failures: list[object] = []
    for index, records in values.items():
        for value in records:
            producer.produce(
                topic,
                value=value,
                partition=index,
                on_delivery=lambda error, _: failures.append(error) if error else None,
            )
    assert producer.flush(PATIENCE_S) == 0
    assert not failures, failures[:3]


def joined(*parts: dict[int, list[bytes]]) -> dict[int, list[bytes]]:
    return {index: [v for part in parts for v in part[index]] for index in parts[0]}


def az2_consumer(bootstrap: str, topic: str, partitions: int, isolation: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "automq_az=az2",
            "group.id": unique("unused"),
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 200,
        }
    )
    consumer.assign([KafkaPartition(topic, index, OFFSET_BEGINNING) for index in range(partitions)])
    return consumer


def drain(consumer: Consumer, got: dict[int, list[bytes]], want: int) -> dict[int, list[bytes]]:
    """Poll into ``got`` until it holds ``want`` values, then on for READ_S: all it reads."""
    deadline = time.monotonic() + PATIENCE_S
    quiet_until = None
    while quiet_until is None or time.monotonic() < quiet_until:
        assert time.monotonic() < deadline, {i: len(v) for i, v in got.items()}
        message = consumer.poll(0.3)
        if message is not None:
            assert message.error() is None, message.error()
            index, value = message.partition(), message.value()
            assert index is not None and value is not None
            got[index].append(value)
        if quiet_until is None and sum(map(len, got.values())) >= want:
            quiet_until = time.monotonic() + READ_S
    return got


READ_S = 3.0


def test_read_committed_in_az2_sees_what_the_leaders_would_answer(zoned: Cluster) -> None:
    """A transactional producer without a zone (appended at each leader at once) commits,
    aborts and leaves a transaction open, one declaring az1 (routed through node 1: its channel
    for the partitions of nodes 3 and 2, its own for node 1's) commits one in between, on
    partitions led by nodes 1, 3 and 2; a producer without transactions writes after them.
    Consumers declaring az2 read through node 2, which serves the partitions of nodes 1 and 3
    from its snapshot-read copies: READ_COMMITTED gets exactly the committed records and
    nothing past the open transaction until it commits, READ_UNCOMMITTED all of them. Node 2's
    partition moved to node 1 (node 2's new copy of it begins past the aborted transaction, so
    it asks node 1 for the entries a read overlaps), a new READ_COMMITTED reader gets the
    same. ListOffsets latest through the proxy answers the LSO at READ_COMMITTED."""
    topic = unique("snapread-txn")
    create_topic(zoned.brokers[1].bootstrap, topic, 3, assignment=[[1], [3], [2]])
    assert agreed_leaders(zoned, topic) == {0: 1, 1: 3, 2: 2}
    partitions = 3
    producer, in_az1 = (
        Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": unique("tid"),
                "transaction.timeout.ms": 120_000,
                **({"client.id": f"automq_az={zone}"} if zone else {}),
            }
        )
        for bootstrap, zone in ((zoned.bootstrap(), None), (zoned.brokers[1].bootstrap, "az1"))
    )
    producer.init_transactions(PATIENCE_S)
    in_az1.init_transactions(PATIENCE_S)
    committed_1, aborted_2, committed_3, open_4 = (
        txn_values(tag, partitions) for tag in ("c1", "a2", "c3", "o4")
    )
    for writer, values, commit in (
        (producer, committed_1, True),
        (producer, aborted_2, False),
        (in_az1, committed_3, True),
    ):
        writer.begin_transaction()
        send_all(writer, topic, values)
        if commit:
            writer.commit_transaction(PATIENCE_S)
        else:
            writer.abort_transaction(PATIENCE_S)
    producer.begin_transaction()
    send_all(producer, topic, open_4)
    plain_5 = txn_values("p5", partitions)
    send_all(Producer({"bootstrap.servers": zoned.bootstrap(), "acks": "all"}), topic, plain_5)

    node2 = zoned.brokers[2].bootstrap
    committed = az2_consumer(node2, topic, partitions, "read_committed")
    try:
        got: dict[int, list[bytes]] = {index: [] for index in range(partitions)}
        want = joined(committed_1, committed_3)
        assert drain(committed, got, 2 * partitions * TXN_PER_PARTITION) == want
        uncommitted = az2_consumer(node2, topic, partitions, "read_uncommitted")
        try:
            everything = joined(committed_1, aborted_2, committed_3, open_4, plain_5)
            seen: dict[int, list[bytes]] = {index: [] for index in range(partitions)}
            assert drain(uncommitted, seen, 5 * partitions * TXN_PER_PARTITION) == everything
            # ListOffsets latest answers the LSO at READ_COMMITTED, copies and leader alike:
            # the open transaction's first offset, after three transactions and their markers.
            for index in range(partitions):
                where = KafkaPartition(topic, index)
                _, stable = committed.get_watermark_offsets(where, PATIENCE_S, cached=False)
                _, high = uncommitted.get_watermark_offsets(where, PATIENCE_S, cached=False)
                assert (index, stable) == (index, 3 * (TXN_PER_PARTITION + 1)), high
                assert high == stable + 2 * TXN_PER_PARTITION, (index, stable, high)
        finally:
            uncommitted.close()
        producer.commit_transaction(PATIENCE_S)
        want = joined(committed_1, committed_3, open_4, plain_5)
        assert drain(committed, got, 4 * partitions * TXN_PER_PARTITION) == want
    finally:
        committed.close()
    log = zoned.brokers[2].log_path.read_text(errors="replace")
    for index in (0, 1):  # led by nodes 1 and 3: served from node 2's copies
        assert f"snapshot read serves {topic}-{index} " in log, index

    # Partition 2 moves to node 1: node 2's copy of it begins past every marker, so a read from
    # the start asks node 1 for the aborted transactions it overlaps.
    asked_before = log.count(f"aborted transactions of {topic}-2 below")
    admin = KafkaAdminClient(bootstrap_servers=zoned.bootstrap())
    try:
        moved = admin.alter_partition_reassignments({TopicPartition(topic, 2): [1]})
        assert moved == {TopicPartition(topic, 2): None}
    finally:
        admin.close()
    wait_until(lambda: leaders(zoned, topic) == {0: 1, 1: 3, 2: 1}, f"{topic}-2 moved to node 1")
    again = az2_consumer(node2, topic, partitions, "read_committed")
    try:
        got = {index: [] for index in range(partitions)}
        assert drain(again, got, 4 * partitions * TXN_PER_PARTITION) == want
    finally:
        again.close()
    log = zoned.brokers[2].log_path.read_text(errors="replace")
    assert f"snapshot read serves {topic}-2 " in log
    assert log.count(f"aborted transactions of {topic}-2 below") == asked_before + 1
