"""Objects and metadata after a long produce, with and without object compaction.

    python -m bench.compaction_bench [--uploads 300] [--streams 50] [--every 5]

One node (block WAL file, local-directory object store, controller on a file metadata log, all in
a temporary directory) produces ``--uploads`` LogCache uploads: before each, every stream gets
1-3 records of 1 KiB and a few hot streams get enough to pass the stream object split size (64 KiB
here), so an upload is one stream set object plus stream objects for the hot streams, as in
AutoMQ. With compaction on, every ``--every`` uploads the node runs a stream set object pass
and a stream-object pass (MINOR, MAJOR every sixth time) over its streams, then the object
lifecycle (time moved past the retention) deletes what compaction replaced. The clock is the
bench's own, so force splits happen when the data is older than 120 simulated minutes (each
upload advances it by 10 s).

Reported per run: stream set objects of the node, stream objects (all and the most of any one
stream), objects in the image and in the store, metadata entries (SSO ranges + stream objects:
what every broker's image holds for these streams), bytes stored, and bytes compaction wrote
per byte produced. The last line is a JSON object with both runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from automq_ref.io.storage.compaction import CompactionSettings, ObjectCompactor
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import object_compaction as oc
from tests.storage_fixtures import NODE_ID, start_storage

NAMESPACE = "_kafka_bench"
RECORD_BYTES = 1024
HOT_STREAMS = 3
SPLIT_BYTES = 64 * 1024
PARAMS = lc.LogCacheParams(
    upload_threshold_bytes=1 << 30,
    upload_interval_ms=-1,
    stream_object_split_bytes=SPLIT_BYTES,
    capacity_bytes=1 << 30,
)


class BenchClock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def now_ms(self) -> int:
        return self.now

    def monotonic_s(self) -> float:
        return self.now / 1000


async def run(directory: Path, *, uploads: int, streams: int, every: int, compact: bool) -> Any:
    clock = BenchClock()
    directory.mkdir(parents=True, exist_ok=True)
    wal = await BlockWal.open_file(
        directory / "wal", node_id=NODE_ID, node_epoch=1, capacity_bytes=512 * 1024 * 1024
    )
    store = LocalDirectoryObjectStore(directory / "objects", fsync=False)
    running = await start_storage(
        directory,
        wal,
        store,
        params=PARAMS,
        namespace=NAMESPACE,
        clock=clock,
        runs_lifecycle=lambda: False,
    )
    storage = running.storage
    compactor = ObjectCompactor(
        store=store,
        namespace=NAMESPACE,
        client=running.client,
        view=running.view,
        node_id=NODE_ID,
        node_epoch=storage.node_epoch,
        clock=clock,
        settings=CompactionSettings(open_grace_ms=0),
    )
    rng = random.Random(1)
    stream_ids = [await storage.create_stream() for _ in range(streams)]
    for stream_id in stream_ids:
        await storage.open_stream(stream_id, 0)
    produced = 0
    started = time.monotonic()
    passes = 0
    for upload in range(uploads):
        appends = []
        for number, stream_id in enumerate(stream_ids):
            count = (SPLIT_BYTES // RECORD_BYTES + 2) if number < HOT_STREAMS else rng.randint(1, 3)
            for _ in range(count):
                payload = rng.randbytes(RECORD_BYTES)
                appends.append(storage.append(stream_id, 0, payload, 1))
                produced += RECORD_BYTES
        await asyncio.gather(*appends)
        await storage.force_upload(lc.ALL_STREAMS)
        clock.now += 10_000
        if compact and upload % every == every - 1:
            passes += 1
            await compactor.compact_stream_set_objects()
            kind = (
                oc.StreamObjectCompactionKind.MAJOR
                if passes % 6 == 0
                else oc.StreamObjectCompactionKind.MINOR
            )
            await compactor.compact_stream_objects(kind, stream_ids)
            clock.now += 120_000  # past the retention: the lifecycle deletes the sources
            await storage.run_object_lifecycle()
            clock.now -= 120_000
    elapsed = time.monotonic() - started
    image = running.view.image
    node = image.nodes[NODE_ID]
    per_stream = [len(image.streams[s].stream_objects) for s in stream_ids]
    keys = await store.list("")
    result = {
        "compaction": compact,
        "uploads": uploads,
        "streams": streams,
        "stream_set_objects": len(node.stream_set_objects),
        "stream_objects": sum(per_stream),
        "max_stream_objects_per_stream": max(per_stream),
        "objects_in_image": len(image.objects),
        "objects_in_store": len(keys),
        "metadata_entries": sum(len(o.ranges) for o in node.stream_set_objects.values())
        + sum(per_stream),
        "stored_mb": round(sum(info.size_bytes for info in keys) / 1e6, 2),
        "produced_mb": round(produced / 1e6, 2),
        "compaction_written_per_produced": round(compactor.totals.written_bytes / produced, 2),
        "seconds": round(elapsed, 1),
    }
    await running.stop(close_store=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uploads", type=int, default=300)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--every", type=int, default=5)
    args = parser.parse_args()
    results = []
    for compact in (False, True):
        with tempfile.TemporaryDirectory(prefix="compaction-bench-") as directory:
            results.append(
                asyncio.run(
                    run(
                        Path(directory),
                        uploads=args.uploads,
                        streams=args.streams,
                        every=args.every,
                        compact=compact,
                    )
                )
            )
    columns = list(results[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for result in results:
        print("| " + " | ".join(str(result[c]) for c in columns) + " |")
    print(json.dumps({"without": results[0], "with": results[1]}))


if __name__ == "__main__":
    main()
