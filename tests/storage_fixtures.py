"""S3Storage for tests and benchmarks: a metadata log, a controller and the storage in one call.

Every test and benchmark that runs :class:`S3Storage` wires the same pieces: a file metadata log
in ``<directory>/meta``, a controller over it, its client and view, the node's registration, then
``S3Storage.start`` with a WAL, a store and that registration. :func:`start_storage` writes that
argument list once; the WAL and the store stay the caller's (a memory device to crash, a store
behind a fault proxy, a counting store).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from automq_ref.io.clock import Clock
from automq_ref.io.metadata.client import ControllerClient, connect_in_process, register_node
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.metadata.view import ImageView
from automq_ref.io.storage.cold_read_process import InChildProcess
from automq_ref.io.storage.cold_reads import ColdReads
from automq_ref.io.storage.object_store import ObjectStore
from automq_ref.io.storage.s3stream import LinkResolver, S3Storage
from automq_ref.io.storage.wal import WriteAheadLog
from automq_ref.state_machines import log_cache as lc

NODE_ID = 1


@dataclass(slots=True)
class RunningStorage:
    storage: S3Storage
    controller: Controller
    client: ControllerClient
    view: ImageView
    metadata_log: FileMetadataLog
    store: ObjectStore

    async def stop(self, *, shut_down: bool = True, close_store: bool = False) -> None:
        """A graceful stop (or, with ``shut_down=False``, the metadata log closed under a
        storage left running, as a crash leaves it); the store is the caller's unless asked."""
        if shut_down:
            await self.storage.shutdown()
        await self.metadata_log.close()
        if close_store:
            await self.store.close()


async def start_storage(
    directory: Path,
    wal: WriteAheadLog,
    store: ObjectStore,
    *,
    params: lc.LogCacheParams,
    node_epoch: int = 1,
    namespace: str = "_kafka_test",
    wrap_client: Callable[[ControllerClient], ControllerClient] | None = None,
    block_size_threshold_bytes: int | None = None,
    clock: Clock | None = None,
    block_cache_bytes: int | None = None,
    runs_lifecycle: Callable[[], bool] | None = None,
    link_resolver: LinkResolver | None = None,
    cold_reads: ColdReads | InChildProcess | None = None,
) -> RunningStorage:
    """Open ``<directory>/meta`` and its controller, register node ``NODE_ID`` proposing
    ``node_epoch`` (the tests' epochs grow, so that is the epoch granted), then start it over
    ``wal`` (opened for that node and epoch) and ``store``. ``wrap_client`` puts a test's
    client in front of the controller's. Options left None keep ``S3Storage.start``'s
    defaults."""
    options: dict[str, Any] = {
        name: value
        for name, value in (
            ("block_size_threshold_bytes", block_size_threshold_bytes),
            ("clock", clock),
            ("block_cache_bytes", block_cache_bytes),
            ("runs_lifecycle", runs_lifecycle),
            ("link_resolver", link_resolver),
            ("cold_reads", cold_reads),
        )
        if value is not None
    }
    metadata_log = await FileMetadataLog.open(directory / "meta")
    try:
        controller = await Controller.open(metadata_log)
        in_process, view = connect_in_process(controller)
        client = wrap_client(in_process) if wrap_client is not None else in_process
        registration = await register_node(client, NODE_ID, node_epoch)
        if registration.node_epoch != node_epoch:
            raise AssertionError(
                f"node epoch {node_epoch} proposed, {registration.node_epoch} granted: a test's "
                "epochs must grow from start to start"
            )
        storage = await S3Storage.start(
            wal=wal,
            store=store,
            client=client,
            view=view,
            registration=registration,
            namespace=namespace,
            params=params,
            **options,
        )
    except BaseException:
        await metadata_log.close()
        raise
    return RunningStorage(storage, controller, client, view, metadata_log, store)
