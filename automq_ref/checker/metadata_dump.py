"""A checked cluster's metadata log as text: ``metadata.txt`` in the report directory.

The cluster's etcd member is removed when a run ends, and with it the log every placement,
registration, fencing and controller decision went through; a finding in a cluster usually needs
that log to be explained (which broker a partition was assigned to, at which leader epoch, when).
:func:`registrations` reads the same log while a run goes on, for each node's latest
registration (fenced or not), which the ``pause-past-session`` nemesis waits on.
So before etcd stops, :func:`dump_metadata` reads the log read-only (the snapshot, if the
controller wrote one, then every record after it) and writes one line per record: its index and
the record as the metadata record types print themselves.

Read-only as the Spark source's reader is: the log is not created if missing, and a write would
be refused before reaching etcd (fenced writes without a fence).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from automq_ref.formats.metadata_record import decode_record, decode_snapshot
from automq_ref.vocabulary.metadata_records import (
    BrokerRegistrationChangeRecord,
    RegisterBrokerRecord,
    UnregisterBrokerRecord,
)

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


@dataclass(frozen=True)
class Registration:
    """A node's latest registration in the log: its node epoch and whether it is fenced."""

    node_epoch: int
    fenced: bool


def registrations(
    endpoint: str, cluster_id: str, timeout_s: float = 5.0
) -> dict[int, Registration] | None:
    """Each registered node's latest registration (node id -> :class:`Registration`), read
    read-only from the log; None when it could not be read within ``timeout_s``. The
    ``pause-past-session`` nemesis watches it to know when the controller fenced the broker it
    paused."""
    try:
        return asyncio.run(asyncio.wait_for(_registrations(endpoint, cluster_id), timeout_s))
    except Exception as error:
        log.debug("no registrations read: %s", error)
        return None


async def _registrations(endpoint: str, cluster_id: str) -> dict[int, Registration]:
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
    records = list(decode_snapshot(snapshot.payload)) if snapshot is not None else []
    records += [decode_record(entry.payload) for entry in entries]
    return latest_registrations(records)


def latest_registrations(records: Iterable[object]) -> dict[int, Registration]:
    """Replay registrations in log order: a registration starts fenced (its first heartbeat
    unfences it); a change or unregistration naming another epoch of the node is ignored,
    as the controller's image does."""
    nodes: dict[int, Registration] = {}
    for record in records:
        if isinstance(record, RegisterBrokerRecord):
            nodes[record.node_id] = Registration(record.node_epoch, True)
        elif isinstance(record, BrokerRegistrationChangeRecord):
            known = nodes.get(record.node_id)
            if known is not None and known.node_epoch == record.node_epoch:
                nodes[record.node_id] = Registration(record.node_epoch, record.fenced)
        elif isinstance(record, UnregisterBrokerRecord):
            known = nodes.get(record.node_id)
            if known is not None and known.node_epoch == record.node_epoch:
                del nodes[record.node_id]
    return nodes
