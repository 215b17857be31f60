"""A checked cluster's metadata log as text: ``metadata.txt`` in the report directory.

The cluster's etcd member is removed when a run ends, and with it the log every placement,
registration, fencing and controller decision went through; a finding in a cluster usually needs
that log to be explained (which broker a partition was assigned to, at which leader epoch, when).
So before etcd stops, :func:`dump_metadata` reads the log read-only (the snapshot, if the
controller wrote one, then every record after it) and writes one line per record: its index and
the record as the metadata record types print themselves.

Read-only as the Spark source's reader is: the log is not created if missing, and a write would
be refused before reaching etcd (fenced writes without a fence).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from automq_ref.formats.metadata_record import decode_record, decode_snapshot

log = logging.getLogger(__name__)

DUMP_TIMEOUT_S = 30.0


def dump_metadata(endpoint: str, cluster_id: str, path: Path) -> None:
    """Write the metadata log of ``cluster_id`` on the etcd at ``endpoint`` to ``path``; a
    failure is logged, never raised (the dump only helps explain a run)."""
    try:
        asyncio.run(asyncio.wait_for(_dump(endpoint, cluster_id, path), DUMP_TIMEOUT_S))
    except Exception as error:
        log.warning("no metadata dump: %s", error)


async def _dump(endpoint: str, cluster_id: str, path: Path) -> None:
    # Imported here: etcd's client loads gRPC, which the command line must not pay for.
    from automq_ref.io.metadata.etcd_client import EtcdClient
    from automq_ref.io.metadata.etcd_metadata_log import EtcdMetadataLog

    client = await EtcdClient.connect([endpoint], 5.0)
    metadata_log = EtcdMetadataLog(client, cluster_id, owns_client=True, fenced_writes=True)
    try:
        await metadata_log.refresh()
        snapshot = await metadata_log.snapshot()
        entries = await metadata_log.read(metadata_log.first_index)
    finally:
        await metadata_log.close()
    with path.open("w") as out:
        if snapshot is not None:
            records = decode_snapshot(snapshot.payload)
            out.write(f"snapshot covering indexes below {snapshot.index}: {len(records)} records\n")
            for record in records:
                out.write(f"  {record!r}\n")
        for entry in entries:
            out.write(f"{entry.index} {decode_record(entry.payload)!r}\n")
