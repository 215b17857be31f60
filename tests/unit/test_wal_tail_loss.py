"""Losing the un-fsynced tail of a WAL file after a kill, and a broker that acks before fsync.

The checker's modes reach the WAL through its seams (``automq_ref.checker.broken``): the WAL
openers must journal and acknowledge before fsync as the broker flags ask, and the production
WAL must refuse the flags themselves.

The undo journal must list exactly the writes since the last sync; ``lose_unsynced_tail`` must
leave synced bytes alone and give the same disk as ``MemoryBlockDevice.crash`` for the same
seed; the WAL must recover a prefix from what is left. Against a broker process: nothing
acknowledged is lost across kill + tail loss + restart, and the deliberately broken
``ack-before-fsync`` broker (``--broken``) loses acknowledged records under the same sequence.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.checker.broken import (
    ACK_BEFORE_FSYNC as ACK_BEFORE_FSYNC_MODE,
)
from automq_ref.checker.broken import (
    DISCARD_WAL_AT_START,
    WAL_UNDO_JOURNAL,
    AckBeforeFsync,
    seams_for,
    undo_journal,
)
from automq_ref.checker.cluster import BrokerProcess
from automq_ref.checker.faults import (
    MemoryBlockDevice,
    UndoJournalBlockDevice,
    lose_unsynced_tail,
    read_undo_journal,
    undo_journal_path,
)
from automq_ref.config import ConfigError, load_config
from automq_ref.io.storage.block_device import FileBlockDevice
from tests.unit.test_wal_block import open_wal, ready, recover_all
from tests.waiting import PATIENCE_S, wait_until

SIZE = 64 * 1024
UNSYNCED_GROUPS = 5  # enough sectors for the loss's seed below (7) to revert one of them


def open_journaled(path: Path) -> UndoJournalBlockDevice:
    return UndoJournalBlockDevice(FileBlockDevice(path, SIZE))


def pattern(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


# ------------------------------------------------------------------------- the journal


def test_journal_lists_exactly_the_writes_since_the_last_sync(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    device = open_journaled(path)
    journal = undo_journal_path(path)
    assert journal == tmp_path / "wal.undo"
    device.write([pattern(1, 4096)], 0)
    device.write([b"ab", bytearray(b"cd"), memoryview(b"ef")], 8192)
    assert read_undo_journal(journal) == [(0, bytes(4096)), (8192, bytes(6))]
    device.sync()
    assert read_undo_journal(journal) == []
    assert journal.stat().st_size == 0
    device.write([pattern(2, 1000)], 100)  # overlaps the synced first write
    device.write([pattern(3, 600)], 700)  # overlaps the unsynced one before it
    assert read_undo_journal(journal) == [
        (100, pattern(1, 4096)[100:1100]),
        (700, pattern(2, 1000)[600:] + pattern(1, 4096)[1100:1300]),
    ]
    device.close()
    # A new device on the same file starts a new journal: the old writes survived that kill.
    open_journaled(path).close()
    assert read_undo_journal(journal) == []


def test_a_torn_last_journal_entry_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    device = open_journaled(path)
    device.write([pattern(1, 512)], 0)
    device.write([pattern(2, 512)], 512)
    device.close()
    journal = undo_journal_path(path)
    whole = journal.read_bytes()
    journal.write_bytes(whole[:-10])
    assert read_undo_journal(journal) == [(0, bytes(512))]
    first_entry_bytes = len(whole) // 2
    journal.write_bytes(whole[:first_entry_bytes] + b"\xff" * 30)  # a damaged second entry
    assert read_undo_journal(journal) == [(0, bytes(512))]


def test_synced_writes_stay_and_unsynced_ones_revert(tmp_path: Path) -> None:
    for keep_probability, expect_new in ((0.0, False), (1.0, True)):
        path = tmp_path / f"wal-{keep_probability}"
        device = open_journaled(path)
        device.write([pattern(1, 8192)], 0)
        device.sync()
        device.write([pattern(2, 4096)], 4096)  # half over synced data, half over zeros
        device.write([pattern(3, 3000)], 20000)
        device.close()  # the kill: nothing was synced after the first write
        counts = lose_unsynced_tail(path, random.Random(1), keep_probability=keep_probability)
        image = path.read_bytes()
        assert image[:4096] == pattern(1, 8192)[:4096]
        if expect_new:
            assert image[4096:8192] == pattern(2, 4096)
            assert image[20000:23000] == pattern(3, 3000)
            assert counts["sectors_reverted"] == 0
        else:
            assert image[4096:8192] == pattern(1, 8192)[4096:]
            assert image[8192:] == bytes(SIZE - 8192)
            assert counts["bytes_reverted"] == 4096 + 3000
        # 8 sectors, and 3000 bytes from 20000 touch sectors 39..44 (6 of them).
        assert counts["writes"] == 2
        assert counts["sectors"] == 8 + 6
        assert not undo_journal_path(path).exists()
        assert lose_unsynced_tail(path, random.Random(1))["writes"] == 0


def test_tail_loss_matches_the_memory_device_crash_model(tmp_path: Path) -> None:
    """Sector-aligned, overlapping writes: the file after the loss is the memory device's
    crash image for the same seed (same sectors, same order of choices)."""
    partial = 0
    for seed in range(30):
        rng = random.Random(seed)
        path = tmp_path / f"wal-{seed}"
        device = open_journaled(path)
        memory = MemoryBlockDevice(SIZE)
        for phase in range(2):
            for _ in range(rng.randint(1, 6)):
                position = rng.randrange(0, SIZE // 512 - 8) * 512
                data = rng.randbytes(rng.randint(1, 8) * 512)
                device.write([data], position)
                memory.write([data], position)
            if phase == 0:
                device.sync()
                memory.sync()
        device.close()
        counts = lose_unsynced_tail(path, random.Random(seed))
        assert path.read_bytes() == bytes(memory.crash(random.Random(seed)).durable)
        partial += 0 < counts["sectors_reverted"] < counts["sectors"]
    assert partial > 20  # the rng mostly keeps some sectors and loses others


# ---------------------------------------------------------------------------- the WAL


async def test_the_wal_recovers_a_prefix_after_the_tail_is_lost(tmp_path: Path) -> None:
    """Synced records survive; of the acknowledged-but-unsynced ones a prefix comes back."""
    lost_some = kept_some = 0
    for seed in range(12):
        path = tmp_path / f"wal-{seed}"
        policy = AckBeforeFsync(interval_s=0.0)
        wal = await ready(await open_wal(path, wrap_device=undo_journal(path), sync_policy=policy))
        synced = [pattern(seed * 100 + index, 700) for index in range(5)]
        for data in synced:
            await wal.append(data)
        assert read_undo_journal(undo_journal_path(path)) == []
        policy.interval_s = 3600.0
        unsynced = [pattern(seed * 100 + 50 + index, 1500) for index in range(8)]
        for data in unsynced:
            await wal.append(data)  # acknowledged, never synced
        assert len(read_undo_journal(undo_journal_path(path))) == len(unsynced)
        # The kill: the file and its journal as they are now (the close below syncs them).
        crashed = tmp_path / f"crashed-{seed}"
        crashed.mkdir()
        shutil.copy(path, crashed / "wal")
        shutil.copy(undo_journal_path(path), crashed / "wal.undo")
        await wal.close()
        lose_unsynced_tail(crashed / "wal", random.Random(seed))
        reopened, recovered = await recover_all(crashed / "wal")
        await reopened.close()
        bodies = [record.body for record in recovered]
        assert bodies[:5] == synced
        assert bodies[5:] == unsynced[: len(bodies) - 5]
        lost_some += len(bodies) < 13
        kept_some += len(bodies) > 5
    assert lost_some and kept_some


def test_seams_for_gives_each_mode_its_seam(tmp_path: Path) -> None:
    assert seams_for(set()) == (None, None)
    opener, before_open = seams_for({WAL_UNDO_JOURNAL})
    assert opener is not None and before_open is None
    opener, before_open = seams_for({DISCARD_WAL_AT_START})
    assert opener is None and before_open is not None
    with pytest.raises(ValueError, match="unknown broken modes"):
        seams_for({"ack-never"})
    config = load_config(overrides=[f"log.dirs={tmp_path}"])
    config.wal_file.write_bytes(b"old WAL")
    before_open(config)
    assert not config.wal_file.exists()


async def test_the_undo_journal_opener_journals_the_wal_file(tmp_path: Path) -> None:
    config = load_config(overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216"])
    opener, _ = seams_for({WAL_UNDO_JOURNAL})
    assert opener is not None
    wal = await ready(await opener(config, 1))
    journal = undo_journal_path(config.wal_file)
    try:
        assert journal.exists()
        syncs = wal.sync_count
        await wal.append(b"x" * 100)
        # Acknowledged after its fdatasync, which empties the journal.
        assert wal.sync_count == syncs + 1
        assert read_undo_journal(journal) == []
        assert wal.header.capacity_bytes == 16777216 and wal.header.node_id == config.node_id
    finally:
        await wal.close()


async def test_the_ack_before_fsync_opener_acknowledges_unsynced_writes(tmp_path: Path) -> None:
    config = load_config(overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216"])
    opener, _ = seams_for({WAL_UNDO_JOURNAL, ACK_BEFORE_FSYNC_MODE})
    assert opener is not None
    wal = await ready(await opener(config, 1))
    try:
        syncs = wal.sync_count
        for index in range(3):
            await wal.append(pattern(index, 100))
        # Within the deferred-sync interval (a second since reset's header sync): none synced.
        assert wal.sync_count == syncs
        assert wal.write_count == 3
        assert len(read_undo_journal(undo_journal_path(config.wal_file))) == 3
    finally:
        await wal.close()
    assert read_undo_journal(undo_journal_path(config.wal_file)) == []  # close wrote a header


@pytest.mark.parametrize(
    "name", ["automq.ref.test.ack.before.fsync", "automq.ref.test.wal.undo.journal"]
)
def test_the_user_configuration_has_no_test_only_switch(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=name.replace(".", r"\.")):
        load_config(overrides=[f"log.dirs={tmp_path}", f"{name}=true"])


# ------------------------------------------------------------------- a broker process


def producer_for(broker: BrokerProcess) -> Producer:
    return Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
            "message.timeout.ms": 20000,
            "reconnect.backoff.ms": 50,
        }
    )


def create_topic(broker: BrokerProcess) -> str:
    topic = f"tail-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()
    return topic


def read_all(broker: BrokerProcess, topic: str) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"verify-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[str] = []
    deadline = time.monotonic() + PATIENCE_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return values
                raise AssertionError(error)
            values.append((message.value() or b"").decode())
    finally:
        consumer.close()
    raise AssertionError("did not reach the end of the partition")


def send_one(producer: Producer, topic: str, value: str, acknowledged: list[str]) -> None:
    """Produce ``value`` and wait for its delivery report."""

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is None:
            acknowledged.append((message.value() or b"").decode())

    producer.produce(topic, value.encode(), partition=0, on_delivery=delivered)
    producer.flush(PATIENCE_S)


def produce_until_killed(broker: BrokerProcess, topic: str, prefix: str) -> list[str]:
    """Send one value after another; once 50 are acknowledged, SIGKILL the broker 0.2 s later
    while the sends go on. Returns the acknowledged values."""
    producer = producer_for(broker)
    acknowledged: list[str] = []
    killed = threading.Event()

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is None:
            acknowledged.append((message.value() or b"").decode())

    def kill() -> None:
        broker.kill()
        killed.set()

    timer: threading.Timer | None = None
    deadline = time.monotonic() + PATIENCE_S
    count = 0
    while not killed.is_set():
        assert time.monotonic() < deadline, f"only {len(acknowledged)} sends acknowledged"
        producer.produce(topic, f"{prefix}-{count}".encode(), partition=0, on_delivery=delivered)
        producer.flush(0.2)
        count += 1
        if timer is None and len(acknowledged) >= 50:
            timer = threading.Timer(0.2, kill)
            timer.start()
    assert timer is not None
    timer.join()
    producer.purge()
    producer.poll(0)
    return acknowledged


def test_the_correct_broker_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    """Kill while a producer sends, lose the un-fsynced tail, restart: all acks are there."""
    broker = BrokerProcess(tmp_path / "data", broken=[WAL_UNDO_JOURNAL])
    broker.start()
    try:
        topic = create_topic(broker)
        acknowledged: list[str] = []
        losses: list[dict[str, int]] = []
        for round_ in range(2):
            acknowledged += produce_until_killed(broker, topic, str(round_))
            losses.append(lose_unsynced_tail(broker.data_dir / "wal", random.Random(round_)))
            broker.start()
        assert len(acknowledged) >= 100
        values = read_all(broker, topic)
        missing = set(acknowledged) - set(values)
        assert not missing, (sorted(missing)[:10], losses)
    finally:
        if broker.alive():
            broker.stop()


def test_a_broker_that_acks_before_fsync_loses_acknowledged_records(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", broken=[WAL_UNDO_JOURNAL, ACK_BEFORE_FSYNC_MODE])
    broker.start()
    try:
        topic = create_topic(broker)
        producer = producer_for(broker)
        acknowledged: list[str] = []
        # Usually within one deferred-sync interval, so at most the first of these groups is
        # synced; on a busy machine the interval can run out among them, and the last may be
        # synced. So, the broker being idle between sends, send on until its undo journal (the
        # writes since the last sync) holds several acknowledged groups.
        for index in range(40):
            send_one(producer, topic, f"v-{index}", acknowledged)
        journal = undo_journal_path(broker.data_dir / "wal")

        def unsynced_groups() -> bool:
            if len(read_undo_journal(journal)) >= UNSYNCED_GROUPS:
                return True
            send_one(producer, topic, f"v-{len(acknowledged)}", acknowledged)
            return False

        wait_until(unsynced_groups, f"{UNSYNCED_GROUPS} unsynced groups", interval_s=0)
        assert acknowledged == [f"v-{index}" for index in range(len(acknowledged))]
        broker.kill()  # right after the acknowledgements arrived
        producer.purge()
        counts = lose_unsynced_tail(broker.data_dir / "wal", random.Random(7))
        assert counts["sectors_reverted"] > 0, counts
        broker.start()
        values = read_all(broker, topic)
        missing = [value for value in acknowledged if value not in set(values)]
        assert missing, counts
        # What survived is a prefix of what was acknowledged (the WAL recovers a prefix).
        assert values == acknowledged[: len(values)]
    finally:
        if broker.alive():
            broker.stop()
