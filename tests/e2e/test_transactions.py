"""Kafka transactions with real clients against one broker: a confluent-kafka transactional
producer's commits are seen by ``read_committed`` consumers and its aborts are not (a
``read_uncommitted`` consumer sees both); an open transaction holds ``read_committed`` readers
at its first offset until it ends; a second producer with the same transactional id fences the
first, whose commit then fails; DescribeTransactions, ListTransactions and DescribeProducers
show an ongoing transaction and its end; consume-transform-produce with
``send_offsets_to_transaction`` (TxnOffsetCommit) processes every record exactly once across an
aborted transaction and a broker restart; kafka-python's and aiokafka's transactional producers
commit and abort the same way. Across a broker killed in the middle of a transaction, the
coordinator's log and the partitions' transaction state come back: the open transaction still
holds readers, and the producer that takes its transactional id over aborts it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from automq_ref.protocol.kio_codec import build, decode_response, encode_request, request_class
from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_bad_input import connect, receive_frame, send_frame
from tests.waiting import wait_until

PARTITIONS = 2
READ_S = 3.0  # how long a reader keeps polling once it has seen what it waits for, or not


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(broker: BrokerProcess) -> str:
    topic = unique("txn")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[
        topic
    ].result()
    return topic


def read(
    broker: BrokerProcess, topic: str, isolation: str, until: int | None = None
) -> list[bytes]:
    """Every value a consumer at ``isolation`` reads from the start of ``topic``: it stops once
    it has ``until`` values (or after READ_S with none new)."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": unique("reader"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, index, 0) for index in range(PARTITIONS)])
    values: list[bytes] = []
    quiet_until = time.monotonic() + READ_S
    while time.monotonic() < quiet_until and (until is None or len(values) < until):
        message = consumer.poll(0.3)
        if message is None:
            continue
        assert message.error() is None, message.error()
        value = message.value()
        assert value is not None
        values.append(value)
        quiet_until = time.monotonic() + READ_S
    consumer.close()
    return values


def transactional(broker: BrokerProcess, transactional_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60_000,
        }
    )
    producer.init_transactions(30)
    return producer


def send(producer: Producer, topic: str, values: list[bytes]) -> None:
    for number, value in enumerate(values):
        producer.produce(topic, value, partition=number % PARTITIONS)
    producer.flush(30)


def test_committed_is_read_and_aborted_is_not(broker: BrokerProcess) -> None:
    topic = create_topic(broker)
    producer = transactional(broker, unique("tid"))
    committed = [f"c{n}".encode() for n in range(10)]
    aborted = [f"a{n}".encode() for n in range(6)]
    producer.begin_transaction()
    send(producer, topic, committed[:5])
    producer.commit_transaction(30)
    producer.begin_transaction()
    send(producer, topic, aborted)
    producer.abort_transaction(30)
    producer.begin_transaction()
    send(producer, topic, committed[5:])
    producer.commit_transaction(30)

    assert sorted(read(broker, topic, "read_committed")) == sorted(committed)
    assert sorted(read(broker, topic, "read_uncommitted", 16)) == sorted(committed + aborted)


def test_an_open_transaction_holds_committed_readers(broker: BrokerProcess) -> None:
    topic = create_topic(broker)
    producer = transactional(broker, unique("tid"))
    producer.begin_transaction()
    send(producer, topic, [b"before"])
    producer.commit_transaction(30)
    producer.begin_transaction()
    send(producer, topic, [b"open-0", b"open-1"])

    assert read(broker, topic, "read_committed") == [b"before"]
    assert sorted(read(broker, topic, "read_uncommitted", 3)) == [b"before", b"open-0", b"open-1"]

    producer.commit_transaction(30)
    assert sorted(read(broker, topic, "read_committed", 3)) == [b"before", b"open-0", b"open-1"]


def test_a_new_instance_fences_the_old_one(broker: BrokerProcess) -> None:
    topic = create_topic(broker)
    transactional_id = unique("tid")
    zombie = transactional(broker, transactional_id)
    zombie.begin_transaction()
    send(zombie, topic, [b"zombie"])

    successor = transactional(broker, transactional_id)  # aborts the zombie's transaction
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(30)
    assert raised.value.args[0].fatal(), raised.value.args[0]

    successor.begin_transaction()
    send(successor, topic, [b"successor"])
    successor.commit_transaction(30)
    assert read(broker, topic, "read_committed") == [b"successor"]


def test_kafka_python_transactions(broker: BrokerProcess) -> None:
    topic = create_topic(broker)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=unique("kp-tid"))
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, b"kp-committed", partition=0)
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send(topic, b"kp-aborted", partition=1)
    producer.abort_transaction()
    producer.close()
    assert read(broker, topic, "read_committed") == [b"kp-committed"]


def test_aiokafka_transactions(broker: BrokerProcess) -> None:
    topic = create_topic(broker)

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap, transactional_id=unique("aio-tid")
        )
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b"aio-committed", partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"aio-aborted", partition=1)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    assert read(broker, topic, "read_committed") == [b"aio-committed"]


def test_a_transaction_open_across_a_kill_is_aborted_by_the_next_instance(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        topic = create_topic(broker)
        transactional_id = unique("tid")
        producer = transactional(broker, transactional_id)
        producer.begin_transaction()
        send(producer, topic, [b"committed"])
        producer.commit_transaction(30)
        producer.begin_transaction()
        send(producer, topic, [b"left-open-0", b"left-open-1"])
        broker.kill()
        broker.start()

        assert read(broker, topic, "read_committed") == [b"committed"]
        successor = transactional(broker, transactional_id)  # aborts the open one
        successor.begin_transaction()
        send(successor, topic, [b"after"])
        successor.commit_transaction(30)
        assert sorted(read(broker, topic, "read_committed", 2)) == [b"after", b"committed"]
        assert len(read(broker, topic, "read_uncommitted", 4)) == 4
    finally:
        if broker.alive():
            broker.stop()


def _process(
    broker: BrokerProcess,
    source: str,
    sink: str,
    group: str,
    transactional_id: str,
    batches: int,
    commit: bool = True,
) -> int:
    """Consume-transform-produce: up to ``batches`` transactions, each a poll of the source's
    records sent upper-cased to the sink with the consumer's offsets
    (``send_offsets_to_transaction``), committed (or, ``commit=False``, aborted); how many
    records were processed."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([source])
    producer = transactional(broker, transactional_id)
    processed = 0
    try:
        for _ in range(batches):
            messages: list[Message] = []
            deadline = time.monotonic() + 20
            while not messages and time.monotonic() < deadline:
                messages = [m for m in consumer.consume(20, 1.0) if m.error() is None]
            if not messages:
                break
            producer.begin_transaction()
            for message in messages:
                value, partition = message.value(), message.partition()
                assert value is not None and partition is not None
                producer.produce(sink, value.upper(), partition=partition)
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            if commit:
                producer.commit_transaction(30)
            else:
                producer.abort_transaction(30)
            processed += len(messages)
    finally:
        consumer.close()
    return processed


def test_consume_transform_produce_is_exactly_once_across_a_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        source, sink = create_topic(broker), create_topic(broker)
        values = [f"record-{n}".encode() for n in range(60)]
        plain = Producer({"bootstrap.servers": broker.bootstrap})
        send(plain, source, values)
        group, transactional_id = unique("ctp"), unique("ctp-tid")
        assert _process(broker, source, sink, group, transactional_id, 2) > 0
        # A transaction aborted: its offsets are dropped with its records.
        _process(broker, source, sink, group, transactional_id, 1, commit=False)
        assert broker.stop() == 0
        broker.start()
        while _process(broker, source, sink, group, transactional_id, 10):
            pass
        assert sorted(read(broker, sink, "read_committed", len(values))) == sorted(
            v.upper() for v in values
        )
    finally:
        if broker.alive():
            broker.stop()


def _ask(broker: BrokerProcess, api_key: int, version: int, values: dict[str, object]) -> Any:
    """One request of ``api_key`` built from ``values``; the broker's decoded answer."""
    body = build(request_class(api_key, version), values)
    with connect(broker) as sock:
        send_frame(sock, encode_request(api_key, version, 1, "txn-test", body))
        frame = receive_frame(sock)
    assert frame is not None
    return decode_response(api_key, version, frame)[1]


def test_describe_and_list_transactions_and_producers(broker: BrokerProcess) -> None:
    topic = create_topic(broker)
    transactional_id = unique("described")
    producer = transactional(broker, transactional_id)
    producer.begin_transaction()
    send(producer, topic, [b"one", b"two"])

    # (An unknown id is answered with start time -1, as Kafka answers; kio cannot read that.)
    described = _ask(broker, 65, 0, {"transactional_ids": [transactional_id]})
    (state,) = described.transaction_states
    assert (state.error_code.value, state.transaction_state) == (0, "Ongoing")
    assert sorted((t.topic, sorted(t.partitions)) for t in state.topics) == [(topic, [0, 1])]
    producers = _ask(
        broker,
        61,
        0,
        {"topics": [{"name": topic, "partition_indexes": [0]}]},
    )
    (active,) = producers.topics[0].partitions[0].active_producers
    assert int(active.producer_id) == int(state.producer_id)
    assert int(active.current_txn_start_offset) == 0

    # The commit is answered once PrepareCommit is durable; CompleteCommit follows the markers.
    producer.commit_transaction(30)

    def completed() -> bool:
        listed = _ask(
            broker, 66, 1, {"state_filters": ["CompleteCommit"], "producer_id_filters": []}
        )
        return transactional_id in {s.transactional_id for s in listed.transaction_states}

    wait_until(completed, "the transaction listed CompleteCommit")
    producers = _ask(broker, 61, 0, {"topics": [{"name": topic, "partition_indexes": [0]}]})
    (active,) = producers.topics[0].partitions[0].active_producers
    assert int(active.current_txn_start_offset) == -1


def _offset_fetch(
    broker: BrokerProcess, group: str, topic: str, version: int, require_stable: bool
) -> list[tuple[int, int, int]] | None:
    """(partition, committed offset, error code) of each partition of ``topic`` as one
    OffsetFetch (``version``: v7 answers one group, v8 in the groups form) answers; None while
    the group itself is answered an error (its coordinator loading)."""
    topics: list[dict[str, object]] = [
        {"name": topic, "partition_indexes": list(range(PARTITIONS))}
    ]
    asked: dict[str, object] = {"require_stable": require_stable}
    if version >= 8:
        asked["groups"] = [{"group_id": group, "topics": topics}]
        (fetched,) = _ask(broker, 9, version, asked).groups
        error, found = fetched.error_code.value, fetched.topics
    else:
        answer = _ask(broker, 9, version, {**asked, "group_id": group, "topics": topics})
        error, found = answer.error_code.value, answer.topics
    if error != 0:
        return None
    return sorted(
        (int(p.partition_index), int(p.committed_offset), p.error_code.value)
        for t in found
        for p in t.partitions
    )


def _completed(broker: BrokerProcess, transactional_id: str) -> bool:
    """Whether ListTransactions shows the id CompleteCommit: every marker has landed."""
    listed = _ask(broker, 66, 1, {"state_filters": ["CompleteCommit"], "producer_id_filters": []})
    return transactional_id in {s.transactional_id for s in listed.transaction_states}


def test_offsets_of_an_open_transaction_are_unstable_to_require_stable(
    broker: BrokerProcess,
) -> None:
    """A TxnOffsetCommit whose transaction has not ended: OffsetFetch with require_stable
    answers its partition UNSTABLE_OFFSET_COMMIT (88), in v7 and per group in v8, and
    librdkafka's read_committed consumer (which sets it) retries until its timeout; without
    require_stable the last committed offset. Once the transaction commits, its offset."""
    topic, group = create_topic(broker), unique("stable")

    def consumer(isolation: str) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "isolation.level": isolation,
            }
        )

    committed_reader, uncommitted_reader = consumer("read_committed"), consumer("read_uncommitted")
    try:
        committed_reader.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        transactional_id = unique("tid")
        producer = transactional(broker, transactional_id)
        producer.begin_transaction()
        send(producer, topic, [b"x"])
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 7)], committed_reader.consumer_group_metadata(), 30
        )

        unstable = [(0, -1, 88), (1, -1, 0)]
        assert _offset_fetch(broker, group, topic, 7, True) == unstable
        assert _offset_fetch(broker, group, topic, 8, True) == unstable
        assert _offset_fetch(broker, group, topic, 7, False) == [(0, 3, 0), (1, -1, 0)]
        assert _offset_fetch(broker, group, topic, 8, False) == [(0, 3, 0), (1, -1, 0)]
        (seen,) = uncommitted_reader.committed([TopicPartition(topic, 0)], timeout=10)
        assert seen.offset == 3
        with pytest.raises(KafkaException):
            committed_reader.committed([TopicPartition(topic, 0)], timeout=2)

        producer.commit_transaction(30)
        wait_until(lambda: _completed(broker, transactional_id), "the transaction completed")
        assert _offset_fetch(broker, group, topic, 7, True) == [(0, 7, 0), (1, -1, 0)]
        assert _offset_fetch(broker, group, topic, 8, True) == [(0, 7, 0), (1, -1, 0)]
        (seen,) = committed_reader.committed([TopicPartition(topic, 0)], timeout=10)
        assert seen.offset == 7
    finally:
        committed_reader.close()
        uncommitted_reader.close()


def test_a_deleted_groups_transactional_offsets_stay_deleted_across_a_restart(
    tmp_path: Path,
) -> None:
    """A group deleted while a transaction holds its offsets: the transaction's commit shows
    nothing of the group, in the coordinator's memory and in its replay after a restart."""
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        topic, group = create_topic(broker), unique("deleted")
        metadata = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        transactional_id = unique("tid")
        producer = transactional(broker, transactional_id)
        producer.begin_transaction()
        send(producer, topic, [b"x"])
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 7)], metadata.consumer_group_metadata(), 30
        )
        metadata.close()
        assert _offset_fetch(broker, group, topic, 8, True) == [(0, -1, 88), (1, -1, 0)]
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_consumer_groups([group], request_timeout=30)[group].result()
        assert _offset_fetch(broker, group, topic, 8, True) == [(0, -1, 0), (1, -1, 0)]
        producer.commit_transaction(30)
        wait_until(lambda: _completed(broker, transactional_id), "the transaction completed")

        nothing = [(0, -1, 0), (1, -1, 0)]
        assert _offset_fetch(broker, group, topic, 8, False) == nothing
        assert broker.stop() == 0
        broker.start()
        wait_until(
            lambda: _offset_fetch(broker, group, topic, 8, False) is not None,
            "the group's coordinator loaded",
        )
        assert _offset_fetch(broker, group, topic, 8, False) == nothing
    finally:
        if broker.alive():
            broker.stop()
