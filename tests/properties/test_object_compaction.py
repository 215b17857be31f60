"""Object compaction never changes what any offset range of any stream reads.

A program of steps runs against one node (its block WAL in memory, its objects in a directory,
an in-process controller): appends of random sizes to three streams, uploads (each a stream set
object plus stream objects for the larger runs), trims, stream-object passes (CLEANUP, MINOR,
MAJOR), stream-set-object passes (merge, or force split of everything), the lifecycle deleting
what compaction replaced, and crashes of a compaction between the upload of its output and its
commit. After every step, every stream's committed offsets, from its start and from offsets
inside it to random ends, read back exactly what was appended, both from the objects the image
names and through S3Storage.

A crash leaves the image as it was (the uploaded output is a prepared object nobody names, so it
is never read) and the same pass run again at once succeeds: the sources the lost commit named
are replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import event, given
from hypothesis import strategies as st

from automq_ref.state_machines import object_compaction as oc
from automq_ref.state_machines import stream_metadata as sm
from tests.storage_fixtures import NODE_ID
from tests.unit.test_object_compaction import SETTINGS, Harness, open_harness

STREAMS = 3

append = st.tuples(
    st.just("append"), st.integers(0, STREAMS - 1), st.integers(1, 2500), st.integers(1, 4)
)
upload = st.tuples(st.just("upload"))
# Appends and uploads dominate, so that compaction finds several objects to work on.
step = st.one_of(
    append,
    append,
    append,
    append,
    upload,
    upload,
    st.tuples(st.just("trim"), st.integers(0, STREAMS - 1), st.floats(0, 1)),
    st.tuples(
        st.just("streams"), st.sampled_from(list(oc.StreamObjectCompactionKind)), st.booleans()
    ),
    st.tuples(st.just("sets"), st.booleans(), st.booleans()),
    st.tuples(st.just("reclaim")),
)


def crashed_sources_gone(h: Harness, event: sm.StreamMetadataEvent) -> bool:
    """Whether the objects the lost commit would have replaced are gone now."""
    image = h.image
    if isinstance(event, sm.CommitStreamSetObject):
        present = image.nodes[NODE_ID].stream_set_objects
        return not set(event.compacted_object_ids) & set(present)
    assert isinstance(event, sm.CommitStreamObject)
    stream = image.streams[event.stream_id]
    return not set(event.source_object_ids) & set(stream.stream_objects)


async def run_step(h: Harness, action: tuple[object, ...]) -> None:
    name = action[0]
    if name == "append":
        _, index, size, count = action
        assert isinstance(index, int) and isinstance(size, int) and isinstance(count, int)
        await h.append(h.streams[index], size, count)
    elif name == "upload":
        await h.upload()
        h.clock.now += 1000
    elif name == "trim":
        _, index, fraction = action
        assert isinstance(index, int) and isinstance(fraction, float)
        stream_id = h.streams[index]
        start, end = h.starts[stream_id], h.running.storage.confirm_offset(stream_id)
        await h.trim(stream_id, start + int(fraction * (end - start)))
    elif name == "reclaim":
        await h.reclaim()
    else:
        crash = bool(action[2])
        if name == "sets":
            force = bool(action[1])
            h.compactor.settings = replace(
                h.compactor.settings, force_split_ms=-1 if force else 1 << 40
            )
        h.client.armed = crash
        before = h.image
        crashed = h.client.crashed
        with contextlib.suppress(ConnectionError):  # the crash
            await compaction_pass(h, action)
        h.client.armed = False
        if h.client.crashed > crashed:
            lost = h.client.lost[-1]
            # The lost commit changed nothing anyone reads by; its output is never named.
            assert (
                h.image.nodes[NODE_ID].stream_set_objects
                == before.nodes[NODE_ID].stream_set_objects
            )
            assert all(
                h.image.streams[s].stream_objects == before.streams[s].stream_objects
                for s in h.streams
            )
            await check(h)
            # A retry at once succeeds.
            await compaction_pass(h, action)
            assert crashed_sources_gone(h, lost)


async def compaction_pass(h: Harness, action: tuple[object, ...]) -> None:
    if action[0] == "sets":
        await h.compactor.compact_stream_set_objects()
    else:
        kind = action[1]
        assert isinstance(kind, oc.StreamObjectCompactionKind)
        for stream_id in h.streams:
            await h.compactor.compact_stream(stream_id, kind)


RNG = random.Random(0)


async def check(h: Harness) -> None:
    await h.check_reads(RNG, samples=2)


async def run_program(directory: Path, split_bytes: int, program: list[tuple[object, ...]]) -> None:
    h = await open_harness(directory, replace(SETTINGS, stream_set_split_bytes=split_bytes))
    try:
        for _ in range(STREAMS):
            await h.add_stream()
        for action in program:
            await run_step(h, action)
            await check(h)
        # Everything uploaded and compacted once more: still the same reads.
        await h.upload()
        await h.compactor.compact_stream_set_objects()
        for stream_id in h.streams:
            await h.compactor.compact_stream(stream_id, oc.StreamObjectCompactionKind.MAJOR)
        await h.reclaim()
        await check(h)
        totals = h.compactor.totals
        event(f"objects replaced: {min(totals.replaced, 10)}")
        event(f"crashes: {min(h.client.crashed, 2)}")
    finally:
        await h.running.stop(close_store=True)


@given(
    split_bytes=st.sampled_from([0, 1500, 6000, 1 << 20]),
    program=st.lists(step, min_size=12, max_size=50),
)
def test_compaction_never_changes_what_any_range_reads(
    split_bytes: int, program: list[tuple[object, ...]]
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="object-compaction-"))
    try:
        asyncio.run(run_program(directory, split_bytes, program))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
