"""A retried idempotent batch (automq_ref/kafka/log_state.py, automq_ref/kafka/partition.py) is
answered with its original offset only once that original append is durable, as Kafka answers a
duplicate only once the original's offsets are committed: a retry that overtakes its WAL write
waits for it, and a retry of a batch whose WAL write failed is not acknowledged. Acknowledging
it would confirm records that no broker holds, and the producer's next sequence would then meet
a log without them: OUT_OF_ORDER_SEQUENCE_NUMBER, a fatal error for the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from automq_ref.errors import KafkaErrorCode
from automq_ref.io.storage.s3stream import StorageError
from automq_ref.io.storage.wal import WalIOError
from automq_ref.kafka.log_state import ProduceResult
from automq_ref.kafka.partition import Partition
from automq_ref.node import Node, start_node
from tests.unit.test_partition_checkpoint import NOW, batch, config_for, topic


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    node = await start_node(config_for(tmp_path))
    try:
        yield node
    finally:
        await node.shutdown()


class HeldWal:
    """The node's WAL with each write's completion held until :meth:`release`, which passes
    on the write's result, or ``error`` instead (a write that failed)."""

    def __init__(self, wal: Any) -> None:
        self._wal = wal
        self._held: list[tuple[asyncio.Future[Any], asyncio.Future[Any]]] = []

    def submit(self, body: Any) -> asyncio.Future[Any]:
        held: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._held.append((self._wal.submit(body), held))
        return held

    async def release(self, error: BaseException | None = None) -> None:
        for written, held in self._held:
            result = await written
            if error is None:
                held.set_result(result)
            else:
                held.set_exception(error)
        self._held.clear()

    async def release_each(self, errors: list[BaseException | None]) -> None:
        """Complete the held writes in order, the n-th with ``errors[n]`` (None: its result)."""
        for (written, held), error in zip(self._held, errors, strict=True):
            result = await written
            if error is None:
                held.set_result(result)
            else:
                held.set_exception(error)
        self._held.clear()


def hold_wal(partition: Partition, monkeypatch: pytest.MonkeyPatch) -> HeldWal:
    storage = partition.storage
    held = HeldWal(storage._wal)
    monkeypatch.setattr(storage, "_wal", held)
    return held


async def answer(result: ProduceResult) -> tuple[KafkaErrorCode, int]:
    """What the Produce handler answers for an append: its error, or once durable its offset
    (a WAL write that failed: KAFKA_STORAGE_ERROR)."""
    if result.error is not KafkaErrorCode.NONE:
        return result.error, -1
    assert result.durable is not None
    try:
        await result.durable
    except StorageError:
        return KafkaErrorCode.KAFKA_STORAGE_ERROR, -1
    return KafkaErrorCode.NONE, result.base_offset


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_retry_waits_for_its_original_to_be_durable(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "retried-early")
    assert await answer(partition.append_nowait(batch(2, NOW, 0), 1 << 20)) == (
        KafkaErrorCode.NONE,
        0,
    )
    wal = hold_wal(partition, monkeypatch)
    original = partition.append_nowait(batch(1, NOW, 2), 1 << 20)
    retry = partition.append_nowait(batch(1, NOW, 2), 1 << 20)
    assert (retry.error, retry.base_offset) == (KafkaErrorCode.NONE, original.base_offset)
    assert partition.log_end_offset == original.base_offset + 1  # not appended again
    answered = asyncio.ensure_future(answer(retry))
    await settle()
    assert not answered.done(), "a duplicate answered before its original was durable"
    await wal.release()
    assert await answer(original) == (KafkaErrorCode.NONE, 2)
    assert await answered == (KafkaErrorCode.NONE, 2)
    assert partition.high_watermark == 3


async def test_a_retry_of_a_write_that_failed_is_not_acknowledged(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "retried-lost")
    await answer(partition.append_nowait(batch(2, NOW, 0), 1 << 20))
    wal = hold_wal(partition, monkeypatch)
    original = partition.append_nowait(batch(1, NOW, 2), 1 << 20)
    early = partition.append_nowait(batch(1, NOW, 2), 1 << 20)  # before the failure is known
    await wal.release(WalIOError("disk gone"))
    assert await answer(original) == (KafkaErrorCode.KAFKA_STORAGE_ERROR, -1)
    assert await answer(early) == (KafkaErrorCode.KAFKA_STORAGE_ERROR, -1)
    late = partition.append_nowait(batch(1, NOW, 2), 1 << 20)  # after it
    assert await answer(late) == (KafkaErrorCode.KAFKA_STORAGE_ERROR, -1)
    # Until it is reopened the partition refuses every produce, a retry of a durable batch too
    # (its stream closed here at the failure): the client retries at the next leader, whose
    # log holds that batch, and gets its original offset there.
    assert await answer(partition.append_nowait(batch(2, NOW, 0), 1 << 20)) == (
        KafkaErrorCode.KAFKA_STORAGE_ERROR,
        -1,
    )


async def test_a_retry_after_its_original_answer_was_dropped_is_acknowledged(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection that sent the original closed before the answer (its task cancelled,
    as the server cancels a closed connection's answers); the write became durable all the
    same, so the producer's retry, on a new connection, gets the original offset."""
    partition = await topic(node, "retried-after-disconnect")
    await answer(partition.append_nowait(batch(2, NOW, 0), 1 << 20))
    wal = hold_wal(partition, monkeypatch)
    original = partition.append_nowait(batch(1, NOW, 2), 1 << 20)
    dropped = asyncio.ensure_future(answer(original))
    await settle()
    dropped.cancel()
    await settle()
    await wal.release()
    retry = partition.append_nowait(batch(1, NOW, 2), 1 << 20)
    assert await answer(retry) == (KafkaErrorCode.NONE, 2)
    assert partition.high_watermark == 3
    # Nothing was lost: the partition's close writes its checkpoint.
    assert not partition._lost_append


async def test_a_write_that_lands_after_an_earlier_one_failed_is_not_acknowledged(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two appends in flight; the WAL fails the first and writes the second. The stream has a
    gap before the second record (its offsets were assigned after the failed one's), so the
    second is no part of the stream either: acknowledging it would confirm a record no upload
    can commit (the controller takes a stream's ranges only without gaps)."""
    partition = await topic(node, "gap")
    await answer(partition.append_nowait(batch(2, NOW, 0), 1 << 20))
    wal = hold_wal(partition, monkeypatch)
    first = partition.append_nowait(batch(1, NOW, 2), 1 << 20)
    second = partition.append_nowait(batch(1, NOW, 3), 1 << 20)
    await wal.release_each([WalIOError("one write lost"), None])
    assert await answer(first) == (KafkaErrorCode.KAFKA_STORAGE_ERROR, -1)
    assert await answer(second) == (KafkaErrorCode.KAFKA_STORAGE_ERROR, -1)
