"""Streams written to objects and committed through the controller machine, for the tests of the
read path from objects (stream readers over the block cache): the first segment of every stream
shares one stream set object, each later segment is a stream object of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from automq_ref.formats.object_file import ObjectWriter
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.io.storage.local_object_store import LocalDirectoryObjectStore
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import (
    NO_OBJECT,
    CommitRange,
    CommitStreamObjectEntry,
)
from automq_ref.vocabulary.naming import object_key

NAMESPACE = "_kafka_block_cache"


@dataclass(slots=True)
class WrittenStreams:
    image: sm.StreamMetadataImage
    batches: dict[int, list[StreamRecordBatch]]  # stream id -> its batches, in offset order


class FakeClock:
    """Monotonic seconds the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore(LocalDirectoryObjectStore):
    """A directory store that counts its ranged GETs and can make them wait (``delay_s``)."""

    def __init__(self, root: Path, delay_s: float = 0.0) -> None:
        super().__init__(root, fsync=False)
        self.delay_s = delay_s
        self.gets: list[tuple[str, int, int]] = []

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        self.gets.append((key, start, end_exclusive))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return await super().get_range(key, start, end_exclusive)


def _apply(
    image: sm.StreamMetadataImage, event: sm.StreamMetadataEvent
) -> sm.StreamMetadataTransition:
    transition = sm.step(image, event)
    response = sm.response_of(transition)
    assert response.ok, response
    return transition


async def write_streams(
    store: LocalDirectoryObjectStore,
    segments: Sequence[Sequence[Sequence[bytes]]],
    *,
    block_size_bytes: int,
) -> WrittenStreams:
    """Stream ``i`` gets the payloads of ``segments[i]``, segment by segment (each payload one
    batch of 1 or 2 offsets); segment ``k`` of every stream is uploaded in round ``k``."""
    image = _apply(sm.EMPTY_IMAGE, sm.RegisterNode(1, 1)).state
    for stream_id in range(len(segments)):
        image = _apply(image, sm.CreateStream(1, 1)).state
        image = _apply(image, sm.OpenStream(1, 1, stream_id, 0)).state
    batches: dict[int, list[StreamRecordBatch]] = {s: [] for s in range(len(segments))}
    next_offsets = [0] * len(segments)
    rounds = max((len(stream) for stream in segments), default=0)
    for round_number in range(rounds):
        written: dict[int, list[StreamRecordBatch]] = {}
        for stream_id, stream in enumerate(segments):
            if round_number >= len(stream) or not stream[round_number]:
                continue
            for payload in stream[round_number]:
                count = 1 + len(payload) % 2
                batch = StreamRecordBatch(stream_id, 0, next_offsets[stream_id], count, payload)
                next_offsets[stream_id] += count
                written.setdefault(stream_id, []).append(batch)
                batches[stream_id].append(batch)
        if not written:
            continue
        shared = round_number == 0
        count = 1 if shared else len(written)
        transition = _apply(image, sm.PrepareObject(1, 1, count, 60_000, 0))
        image = transition.state
        first_id = sm.response_of(transition).first_object_id
        assert first_id is not None
        if shared:
            writer = ObjectWriter(block_size_bytes)
            for stream_id in sorted(written):
                for batch in written[stream_id]:
                    writer.write(batch)
            done = writer.close()
            await store.put(object_key(NAMESPACE, first_id), done.chunks)
            commit = sm.CommitStreamSetObject(
                1,
                1,
                first_id,
                NO_OBJECT,
                done.size_bytes,
                tuple(
                    CommitRange(s, 0, run[0].base_offset, run[-1].last_offset)
                    for s, run in sorted(written.items())
                ),
                (),
                (),
                False,
                1,
            )
        else:
            entries: list[CommitStreamObjectEntry] = []
            for number, (stream_id, run) in enumerate(sorted(written.items())):
                writer = ObjectWriter(block_size_bytes)
                for batch in run:
                    writer.write(batch)
                done = writer.close()
                object_id = first_id + number
                await store.put(object_key(NAMESPACE, object_id), done.chunks)
                entries.append(
                    CommitStreamObjectEntry(
                        object_id,
                        stream_id,
                        run[0].base_offset,
                        run[-1].last_offset,
                        done.size_bytes,
                    )
                )
            commit = sm.CommitStreamSetObject(
                1, 1, NO_OBJECT, NO_OBJECT, 0, (), tuple(entries), (), False, 1
            )
        image = _apply(image, commit).state
    return WrittenStreams(image, batches)
