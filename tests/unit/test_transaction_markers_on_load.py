"""A transaction the transaction log left preparing has its markers written once the broker is
up again, whatever order the broker's partitions open in (automq_ref/kafka/transactions.py,
``TransactionCoordinator``). When a broker starts, the topic registry opens the partitions
placed on it all together, and the coordinator hears of each ``__transaction_state``
partition as it opens and loads its shard at once, while other partitions may still be opening;
the coordinator itself is started (given the registry its marker writers look partitions up in)
only once every partition has opened. A shard that loads a Prepare* in that window writes its
markers then: they must wait for the coordinator's start, not be abandoned (a checked
transactional run once lost a COMMIT marker so: the committed transaction stayed open at its
partition, whose last stable offset then never reached the high watermark again)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from automq_ref.config import load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.transaction_shard import TransactionShard
from automq_ref.kafka.transactions import TransactionCoordinator
from automq_ref.node import Node, Seams, start_node
from automq_ref.state_machines import transaction as tx

TOPIC = "t"
KEY = (TOPIC, 0)
TXN_ID = "txn"
WAIT_S = 5.0


async def start(tmp_path: Path) -> Node:
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "log.cleaner.enable=false",
            "transaction.state.log.num.partitions=1",
        ],
        environment={},
    )
    return await start_node(config, Seams())


async def commit_with_its_marker_held(node: Node, held: asyncio.Event) -> int:
    """A transaction of TXN_ID with one batch in ``t-0``, committed (its PrepareCommit durable,
    EndTxn answered), whose marker the partition does not write until ``held`` is set; the
    producer id."""
    coordinator = node.transactions
    init = await coordinator.init_producer_id(TXN_ID, 60_000, -1, -1)
    assert init.error is KafkaErrorCode.NONE
    producer_id, epoch = init.producer_id, init.producer_epoch
    added = await coordinator.add_partitions(TXN_ID, producer_id, epoch, [KEY])
    assert added == tx.PartitionsAnswer(((KEY, KafkaErrorCode.NONE),))
    partition = node.topics.partitions[KEY]
    guard = partition.begin_transaction_verification(producer_id, epoch)
    verified = await coordinator.verify(TXN_ID, producer_id, epoch, KEY)
    assert verified is KafkaErrorCode.NONE
    batch = build_record_batch(
        [(b"k", b"committed")],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=0,
        is_transactional=True,
    )
    result = partition.append_nowait(batch, 1 << 20, verification_guard=guard)
    assert result.error is KafkaErrorCode.NONE, result.message
    assert result.durable is not None
    await result.durable
    write_marker = Partition.write_marker

    async def held_marker(self: Partition, *args: object) -> KafkaErrorCode:
        if (self.topic, self.index) == KEY:
            await held.wait()
        return await write_marker(self, *args)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Partition, "write_marker", held_marker)
        ended = await coordinator.end_txn(TXN_ID, producer_id, epoch, commit=True)
        assert ended is KafkaErrorCode.NONE
        await asyncio.sleep(0.05)  # the marker's writer is under way, and waits
    return producer_id


async def test_markers_of_a_shard_loaded_before_the_coordinator_starts_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start(tmp_path)
    try:
        await node.topics.create_topic(TOPIC, 1, {})
        # Stopped before the marker lands: the transaction log's last record of the id is its
        # PrepareCommit, the partition holds the transaction open.
        await commit_with_its_marker_held(node, asyncio.Event())
    finally:
        await node.shutdown()

    # The next start: t-0 opens only once the transaction log's shard has loaded, so the
    # shard's markers are written while the coordinator is not started yet.
    loaded = asyncio.Event()
    load: Callable[[TransactionCoordinator, TransactionShard], Awaitable[None]]
    load = TransactionCoordinator._load
    open_partition = Partition.open

    async def signalled_load(self: TransactionCoordinator, shard: TransactionShard) -> None:
        await load(self, shard)
        loaded.set()

    async def late_open(*args: object, **kwargs: object) -> Partition:
        if TOPIC in args:
            async with asyncio.timeout(WAIT_S):
                await loaded.wait()
            await asyncio.sleep(0.05)  # the loaded shard's marker writers run meanwhile
        return await open_partition(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(TransactionCoordinator, "_load", signalled_load)
    monkeypatch.setattr(Partition, "open", late_open)
    node = await start(tmp_path)
    try:
        assert loaded.is_set()
        partition = node.topics.partitions[KEY]
        async with asyncio.timeout(WAIT_S):
            while partition.last_stable_offset < partition.high_watermark:
                await node.transactions.stepped(TXN_ID)
        metadata = node.transactions.describe([TXN_ID])[0][2]
        assert metadata is not None and metadata.state is tx.TransactionState.CompleteCommit
    finally:
        await node.shutdown()
