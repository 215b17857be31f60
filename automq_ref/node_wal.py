"""The WAL's part of the composition root, called by node.py only: this broker's WAL opened,
and a failed broker's taken over, by the form of their ``s3.wal.path``.

The object WAL's store is wrapped for the network bandwidth limiter here (its PUTs and its
recovery's GETs at BYPASS: they take tokens, never wait); the block WALs write to a disk, which
the limiter does not count.
"""

from __future__ import annotations

from automq_ref.config import BrokerConfig
from automq_ref.io.network_limiter import NetworkLimiters
from automq_ref.io.storage.object_store import ThrottledStore, open_object_store
from automq_ref.io.storage.wal import WriteAheadLog
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.io.storage.wal_object import ObjectWal
from automq_ref.node_zones import object_wal_config
from automq_ref.state_machines.network_limiter import Priority
from automq_ref.vocabulary.naming import NAMESPACE


async def open_wal(
    config: BrokerConfig, node_epoch: int, *, limiters: NetworkLimiters | None = None
) -> WriteAheadLog:
    """The WAL ``s3.wal.path`` names, by its scheme: the block WAL file (a path or
    ``0@file://``; a raw block device there gets ``O_DIRECT``), the block WAL on a WAL device
    process (``0@device://``), or the object WAL (``0@s3://`` a bucket, ``0@dir://`` a
    directory)."""
    device = config.wal_device
    if device is not None:
        return await BlockWal.open_remote(
            device,
            node_id=config.node_id,
            node_epoch=node_epoch,
            capacity_bytes=config.s3_wal_capacity,
        )
    settings = config.object_wal
    if settings is None:
        return await BlockWal.open_file(
            config.wal_file,
            node_id=config.node_id,
            node_epoch=node_epoch,
            capacity_bytes=config.s3_wal_capacity,
        )
    store = open_object_store(settings.store_uri)
    if limiters is not None:
        store = ThrottledStore(store, limiters, Priority.BYPASS)
    return await ObjectWal.open(
        store,
        namespace=NAMESPACE,
        node_id=config.node_id,
        node_epoch=node_epoch,
        config=object_wal_config(settings),
        owns_store=True,
    )


async def take_over_wal(
    config: BrokerConfig, wal_path: str, node_id: int, node_epoch: int
) -> WriteAheadLog:
    """Failed node ``node_id``'s WAL, which ``wal_path`` (an ``s3.wal.path``) names, taken over
    at ``node_epoch`` in failover mode (crash failover): an object WAL, or a block WAL on a WAL
    device process (its reservation preempted)."""
    named = config.model_copy(update={"s3_wal_path": wal_path})
    device = named.wal_device
    if device is not None:
        return await BlockWal.take_over(device, node_id=node_id, node_epoch=node_epoch)
    settings = named.object_wal
    if settings is None:
        raise ValueError(
            f"{wal_path!r} is a WAL file of the failed broker's own: no survivor can take it over"
        )
    return await ObjectWal.take_over(
        open_object_store(settings.store_uri),
        namespace=NAMESPACE,
        node_id=node_id,
        node_epoch=node_epoch,
        config=object_wal_config(settings),
        owns_store=True,
    )
