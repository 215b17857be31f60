"""Planning reads from a broker's metadata log and objects, without the broker and without Spark.

Three layers: the read-only metadata log reader (a broker holds the lock and keeps appending);
a hand-built image and objects (a trimmed stream, a stream set object shared by two streams,
several blocks per object, a stream object) checked offset by offset; and a real broker that
uploads small objects often, whose committed ranges must cover exactly the offsets produced.
The replay of a partition's transactions (for ``read_committed``) on a real broker's topic
written with transactions: while the broker runs (no checkpoint yet: every batch from the log
start) and after a graceful stop (from the checkpoint it wrote, no batch read), the same last
stable offset and aborted ranges, which are the writer's.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from automq_ref.checker.cluster import BrokerProcess
from automq_ref.formats.json_document import Json
from automq_ref.formats.meta_stream import encode_checkpoint_record
from automq_ref.formats.metadata_record import encode_record
from automq_ref.formats.object_file import ObjectWriter
from automq_ref.formats.partition_checkpoint import TransactionRow, encode_checkpoint
from automq_ref.formats.record_batch import build_record_batch
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.formats.topic_record import Topic
from automq_ref.io.metadata.metadata_log import (
    FileMetadataLog,
    LogEntry,
    MetadataLogCorrupt,
    MetadataLogError,
    encode_batch,
    read_log_directory,
)
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.spark import image as im
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import object_key, partition_key, topic_key
from tests.waiting import PATIENCE_S, wait_until

# ------------------------------------------------------------- the read-only log reader


async def test_read_log_directory_reads_a_locked_log_and_changes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "metadata"
    async with FileMetadataLog(directory) as log:
        await log.append([b"a", b"b"], expected_next_index=0)
        await log.append([b"c"], expected_next_index=2)
        before = {p.name: p.read_bytes() for p in directory.iterdir()}
        assert read_log_directory(directory) == (
            None,
            [LogEntry(0, b"a"), LogEntry(1, b"b"), LogEntry(2, b"c")],
        )
        # A batch being appended (here: half of one) ends the read quietly.
        segment = max(directory.glob("segment-*.log"))
        partial = encode_batch(3, [b"d" * 100])[:60]
        with segment.open("ab") as file:
            file.write(partial)
        assert [e.index for e in read_log_directory(directory)[1]] == [0, 1, 2]
        after = {p.name: p.read_bytes() for p in directory.iterdir()}
        assert after[segment.name] == before[segment.name] + partial
        os.truncate(segment, len(before[segment.name]))
        await log.install_snapshot(2, b"snapshot-payload")
        await log.append([b"d"], expected_next_index=3)
        snapshot, entries = read_log_directory(directory)
        assert snapshot is not None and (snapshot.index, snapshot.payload) == (
            2,
            b"snapshot-payload",
        )
        assert entries == [LogEntry(2, b"c"), LogEntry(3, b"d")]


async def test_read_log_directory_refuses_damage_before_valid_batches(tmp_path: Path) -> None:
    directory = tmp_path / "metadata"
    async with FileMetadataLog(directory) as log:
        for index in range(3):
            await log.append([b"record-%d" % index], expected_next_index=index)
    segment = max(directory.glob("segment-*.log"))
    data = bytearray(segment.read_bytes())
    data[len(encode_batch(0, [b"record-0"])) + 30] ^= 0xFF  # inside the second batch
    segment.write_bytes(bytes(data))
    with pytest.raises(MetadataLogCorrupt, match="a valid batch follows"):
        read_log_directory(directory)


def test_read_log_directory_of_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert read_log_directory(tmp_path / "empty") == (None, [])
    with pytest.raises(MetadataLogError, match="no metadata log"):
        read_log_directory(tmp_path / "missing")


# ---------------------------------------------------------- a hand-built image and objects

TOPIC = Topic("hand", uuid.UUID(int=7), 1, {})
META, DATA, OTHER = 10, 11, 12
META_OBJECT, SET_OBJECT, STREAM_OBJECT = 100, 101, 102


def kafka_batch(base: int, count: int) -> bytes:
    return build_record_batch(
        [(f"k{base + i}".encode(), f"v{base + i}".encode()) for i in range(count)],
        base_offset=base,
        base_timestamp=1_700_000_000_000,
    )


def data_records(stream_id: int, start: int, end: int, per_batch: int) -> list[StreamRecordBatch]:
    records = []
    for base in range(start, end, per_batch):
        count = min(per_batch, end - base)
        records.append(StreamRecordBatch(stream_id, 0, base, count, kafka_batch(base, count)))
    return records


async def put_object(
    store: LocalDirectoryObjectStore, object_id: int, batches: Sequence[StreamRecordBatch]
) -> int:
    writer = ObjectWriter(block_size_threshold_bytes=100)  # one record per block
    for batch in batches:
        writer.write(batch)
    written = writer.close()
    await store.put(object_key(im.NAMESPACE, object_id), written.chunks)
    return written.size_bytes


async def write_hand_built_broker(
    root: Path, *, claimed_end: int = 12, checkpoint: Json = None
) -> None:
    """log.dirs with: topic 'hand' (1 partition, log start 5); its data stream 11 holds [0, 12)
    in a stream set object shared with stream 12, and [12, 20) in a stream object; its
    MetaStream ends with ``checkpoint`` as its CHECKPOINT record when given."""
    meta_records = [
        StreamRecordBatch(META, 0, 0, 1, b'{"k":"LOG","v":{"data":99}}'),
        StreamRecordBatch(META, 0, 1, 1, b'{"k":"LOG","v":{"data":11}}'),  # the last one wins
        StreamRecordBatch(META, 0, 2, 1, b'{"k":"LEADER_EPOCHS","v":[[0,0]]}'),
    ]
    if checkpoint is not None:
        meta_records.append(StreamRecordBatch(META, 0, 3, 1, encode_checkpoint_record(checkpoint)))
    async with LocalDirectoryObjectStore(root / "objects") as store:
        sizes = {
            META_OBJECT: await put_object(store, META_OBJECT, meta_records),
            SET_OBJECT: await put_object(
                store, SET_OBJECT, data_records(DATA, 0, 12, 3) + data_records(OTHER, 0, 4, 2)
            ),
            STREAM_OBJECT: await put_object(store, STREAM_OBJECT, data_records(DATA, 12, 20, 4)),
        }
    records: list[sm.MetadataRecord] = [
        sm.S3StreamRecord(META, 0, 0, 0, sm.StreamState.CLOSED),
        sm.S3StreamRecord(DATA, 0, 0, 0, sm.StreamState.CLOSED),
        sm.S3StreamRecord(OTHER, 0, 0, 0, sm.StreamState.CLOSED),
        *(sm.S3ObjectRecord(i, size, sm.S3ObjectState.COMMITTED, 0) for i, size in sizes.items()),
        sm.S3StreamObjectRecord(META, 0, len(meta_records), META_OBJECT),
        sm.S3StreamSetObjectRecord(
            0,
            SET_OBJECT,
            1,
            (sm.StreamOffsetRange(DATA, 0, claimed_end), sm.StreamOffsetRange(OTHER, 0, 4)),
            0,
        ),
        sm.S3StreamObjectRecord(DATA, 12, 20, STREAM_OBJECT),
        sm.S3StreamRecord(DATA, 0, 0, 5, sm.StreamState.CLOSED),  # DeleteRecords to 5
        sm.KVRecord(partition_key(TOPIC.topic_id, 0), str(META).encode()),
        sm.KVRecord(topic_key(TOPIC.name), TOPIC.encode()),
    ]
    async with FileMetadataLog(root / "metadata") as log:
        await log.append([encode_record(r) for r in records], expected_next_index=0)


def offsets_read(uri: str, ranges: Sequence[im.ObjectRange]) -> Iterator[tuple[int, bytes | None]]:
    for object_range in ranges:
        for batch in im.read_batches(uri, object_range):
            for record in batch.records():
                if object_range.start_offset <= record.offset < object_range.end_offset:
                    yield record.offset, record.value


def test_hand_built_layout(tmp_path: Path) -> None:
    asyncio.run(write_hand_built_broker(tmp_path))
    location = im.locate(tmp_path)
    assert location == im.locate(tmp_path / "metadata")
    assert location.object_store_uri == (tmp_path / "objects").resolve().as_uri()
    layout = im.read_layout(location)
    assert set(layout.topics) == {"hand"}
    partition = layout.partitions[("hand", 0)]
    assert (partition.meta_stream_id, partition.data_stream_id) == (META, DATA)
    assert (partition.log_start_offset, partition.committed_end_offset) == (5, 20)
    set_range, stream_range = partition.objects
    assert (set_range.object_id, set_range.is_stream_object) == (SET_OBJECT, False)
    assert (set_range.start_offset, set_range.end_offset) == (5, 12)
    assert (stream_range.object_id, stream_range.is_stream_object) == (STREAM_OBJECT, True)
    assert (stream_range.start_offset, stream_range.end_offset) == (12, 20)
    # One 3-record batch per block: the block holding 0..2 is not planned.
    assert set_range.blocks[0].start_offset <= 5 < set_range.blocks[0].end_offset
    assert all(block.stream_id == DATA for block in set_range.blocks)
    assert set_range.blocks[-1].end_offset == 12
    assert len(set_range.byte_ranges) == 1 and set_range.byte_ranges[0][0] > 0
    assert sum(end - start for start, end in set_range.byte_ranges) == set_range.size_bytes
    uri = location.object_store_uri
    assert list(offsets_read(uri, partition.objects)) == [
        (offset, f"v{offset}".encode()) for offset in range(5, 20)
    ]
    clipped = partition.ranges(7, 14)
    assert [(r.start_offset, r.end_offset) for r in clipped] == [(7, 12), (12, 14)]
    assert len(clipped[1].blocks) < len(stream_range.blocks)
    assert [offset for offset, _ in offsets_read(uri, clipped)] == list(range(7, 14))
    assert partition.ranges(20, 30) == []


def test_transactions_start_from_the_checkpoint_that_fits(tmp_path: Path) -> None:
    """A checkpoint up to 12: producer 1's transaction open since 8, aborted ranges [0, 3]
    (wholly below the log start 5) and [6, 7]. The batches after it (non-transactional)
    change nothing. The same checkpoint naming another data stream, or reaching past what the
    objects hold, is not used: the replay reads every batch from the log start instead."""
    rows = [TransactionRow(1, 0, 8, 0, -1)]
    aborted = [(1, 0, 3), (1, 6, 7)]
    cases = [
        (DATA, 12, im.TransactionState(8, ((1, 6, 7),), 12, None)),
        (DATA + 50, 12, im.TransactionState(20, (), 5, "written for data stream 61, not 11")),
        (DATA, 21, im.TransactionState(20, (), 5, "covers up to 21, past the committed end 20")),
    ]
    for number, (stream, end, state) in enumerate(cases):
        root = tmp_path / str(number)
        value = encode_checkpoint(stream, None, end, [], [], rows, aborted)
        asyncio.run(write_hand_built_broker(root, checkpoint=value))
        layout = im.read_layout(im.locate(root), transactions=lambda topic, index: True)
        assert layout.partitions[("hand", 0)].transactions == state
        assert im.read_layout(im.locate(root)).partitions[("hand", 0)].transactions is None


def test_objects_that_contradict_the_metadata_are_refused(tmp_path: Path) -> None:
    asyncio.run(write_hand_built_broker(tmp_path, claimed_end=14))  # the object holds [0, 12)
    with pytest.raises(im.ImageError, match="does not hold offsets"):
        im.read_layout(im.locate(tmp_path))


def test_locate_errors(tmp_path: Path) -> None:
    with pytest.raises(im.ImageError, match="no metadata log"):
        im.locate(tmp_path)
    (tmp_path / "metadata").mkdir()
    with pytest.raises(im.ImageError, match="name the object store"):
        im.locate(tmp_path)
    with pytest.raises(im.ImageError, match="no directory"):
        im.locate(tmp_path, object_store_uri=(tmp_path / "nowhere").as_uri())
    with pytest.raises(im.ImageError, match=r"log\.dirs"):
        im.locate()
    assert not (tmp_path / "nowhere").exists()


def test_namespace_is_the_brokers() -> None:
    from automq_ref.vocabulary.naming import NAMESPACE

    assert im.NAMESPACE == NAMESPACE


# ------------------------------------------------------------------------ a real broker

SMALL_OBJECTS = (
    "s3.wal.upload.threshold=2048",
    "s3.wal.upload.interval.ms=200",
    "s3.stream.object.split.size=1200",
)


def produce(bootstrap: str, topic: str, partitions: int, count: int) -> dict[int, list[bytes]]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for index in range(count):
        value = f"{topic}-{index}-".encode() * (1 + index % 9)
        producer.produce(topic, value=value, partition=index % partitions)
        sent[index % partitions].append(value)
        if index % 7 == 0:
            assert producer.flush(10) == 0  # many small batches
    assert producer.flush(10) == 0
    return sent


def test_committed_ranges_cover_exactly_what_was_produced(tmp_path: Path) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = BrokerProcess(tmp_path / "data", *SMALL_OBJECTS)
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for name, partitions in (("alpha", 3), ("beta", 1)):
            admin.create_topics([NewTopic(name, num_partitions=partitions)])[name].result()
        sent = {"alpha": produce(broker.bootstrap, "alpha", 3, 240)}
        sent["beta"] = produce(broker.bootstrap, "beta", 1, 60)
        for future in admin.delete_records([TopicPartition("beta", 0, 17)]).values():
            future.result()
        # While the broker runs (holding the log's lock): a prefix of each partition is
        # committed, contiguous from the log start, and never more than was produced.
        deadline = time.monotonic() + PATIENCE_S
        while True:
            running = im.read_layout(im.locate(broker.data_dir))
            if all(p.committed_end_offset > 0 for p in running.partitions.values()):
                break
            assert time.monotonic() < deadline, "nothing was uploaded"
            time.sleep(0.3)
        for (topic, index), partition in running.partitions.items():
            assert partition.committed_end_offset <= len(sent[topic][index])
            check_contiguous(partition)
    finally:
        assert broker.stop() == 0  # graceful: uploads and commits everything
    layout = im.read_layout(im.locate(tmp_path / "data"))
    assert set(layout.topics) >= {"alpha", "beta"}
    kinds: set[bool] = set()
    for topic, by_partition in sent.items():
        for index, values in by_partition.items():
            partition = layout.partitions[(topic, index)]
            start = 17 if topic == "beta" else 0
            assert (partition.log_start_offset, partition.committed_end_offset) == (
                start,
                len(values),
            )
            check_contiguous(partition)
            kinds |= {r.is_stream_object for r in partition.objects}
            got = list(offsets_read(layout.location.object_store_uri, partition.objects))
            assert got == list(enumerate(values))[start:]
    assert kinds == {True, False}, "expected both stream objects and stream set objects"


def check_contiguous(partition: im.PartitionLayout) -> None:
    cursor = partition.log_start_offset
    for object_range in partition.objects:
        assert object_range.start_offset == cursor
        assert object_range.blocks[0].start_offset <= cursor
        assert object_range.blocks[-1].end_offset >= object_range.end_offset
        cursor = object_range.end_offset
    assert cursor == partition.committed_end_offset


def test_transactions_replayed_while_running_and_from_the_checkpoint(tmp_path: Path) -> None:
    from automq_ref.spark.kafka_client import KafkaClient
    from tests.spark.transactions import write_transactions

    broker = BrokerProcess(tmp_path / "data", *SMALL_OBJECTS)
    broker.start()
    try:
        txn = write_transactions(broker.bootstrap, "txn")
        keys = [("txn", 0), ("txn", 1)]
        with KafkaClient(broker.bootstrap) as client:
            ends = {p: o for (_, p), o in client.latest_offsets(keys).items()}

        def caught_up() -> im.Layout | None:
            layout = im.read_layout(
                im.locate(broker.data_dir), lambda t: t == "txn", transactions=lambda t, p: True
            )
            done = all(layout.partitions[key].committed_end_offset == ends[key[1]] for key in keys)
            return layout if done else None

        wait_until(caught_up, "the objects to hold every offset written")
        running = caught_up()
        assert running is not None
    finally:
        assert broker.stop() == 0  # graceful: a checkpoint per partition, the open txn in it
    stopped = im.read_layout(
        im.locate(tmp_path / "data"), lambda t: t == "txn", transactions=lambda t, p: True
    )
    for key in keys:
        partition = key[1]
        before = running.partitions[key].transactions
        after = stopped.partitions[key].transactions
        assert before is not None and after is not None
        assert (before.replayed_from, before.checkpoint_ignored) == (0, None)
        assert (after.replayed_from, after.checkpoint_ignored) == (ends[partition], None)
        assert before.stable_offset == after.stable_offset == txn.stable[partition]
        assert before.aborted == after.aborted
        [(_, first, marker)] = after.aborted
        aborted = [o for p, o, _ in txn.aborted if p == partition]
        later = [o for p, o, v in txn.committed if p == partition and v.startswith(b"committed-2")]
        assert first == min(aborted) and max(aborted) < marker < min(later)
