"""A broker's metadata in a cluster: the log on etcd, the controller election, the follower, the
controller RPC, and the :class:`ClusterControllerClient` that ties them together.

:meth:`ClusterMetadata.start` builds, for one broker:

* the :class:`~automq_ref.io.metadata.etcd_metadata_log.EtcdMetadataLog` of the cluster, whose
  writes are fenced by the election (a broker that does not hold it writes nothing);
* a :class:`~automq_ref.io.metadata.controller.Controller` over it, the broker's replica of the
  image (opened from the snapshot, then the records after it), and the
  :class:`~automq_ref.io.metadata.view.ImageView` it publishes to;
* a :class:`~automq_ref.io.metadata.follower.MetadataFollower` keeping the replica up with the
  log;
* a :class:`~automq_ref.io.metadata.controller_rpc.ControllerServer` (the controller RPC
  listener) and the :class:`~automq_ref.io.metadata.election.ControllerElection`, which publishes
  that listener's address with the election key;
* the :class:`ClusterControllerClient`: while this broker holds the election, ``submit`` is its
  replica's ``handle``; otherwise it sends the request to the holder's listener, and returns once
  its own image has reached the log index of the decision, so the broker sees what it asked for
  before it goes on (a read of its own write).

Failover. A request that found no controller, or one that turned out not to be the controller
(``NotController``: nothing decided), is sent again, to whoever holds the election next, until
``request_timeout_s`` has passed (then :class:`ControllerUnavailable`). A request whose answer
was lost after it was sent (the controller died, the connection broke, the log failed under the
controller, or under this broker's own controller) may have been decided. If the machine answers
its repeat as it answered the first try, with the same effect (``sm.resendable``: a retried open,
a close of a closed stream, a commit of committed objects is ``REDUNDANT_OPERATION``, a prepare
only leaks ids that expire), it is sent again like the others, and logged; the answer then says
what the first try did. Any other (creating a stream would create a second one) fails with
:class:`~automq_ref.io.metadata.controller.ControllerError` saying the outcome is unknown, and so
does a resendable one that no controller answered before the timeout. A request waiting on a
controller that lost the election meanwhile (paused past its lease: it may never answer, and can
decide nothing more) stops waiting then, as if its answer was lost, rather than at the timeout.

Snapshots: the controller writes one when the records applied since the last one reach
``snapshot_bytes`` (checked every ``SNAPSHOT_CHECK_S``), so the log on etcd stays short and a new
broker loads the snapshot instead of replaying from index 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.background import stop
from automq_ref.io.metadata.controller import Controller, ControllerError

# Raised by ``submit``; imported from here by the cluster's callers and tests.
from automq_ref.io.metadata.controller import ControllerUnavailable as ControllerUnavailable
from automq_ref.io.metadata.controller_rpc import (
    ControllerConnection,
    ControllerRpcError,
    ControllerServer,
    DecisionUnknown,
    NotControllerError,
    NotSent,
    RemoteError,
    ReplyLost,
)
from automq_ref.io.metadata.election import ControllerElection, ControllerInfo, lease_ttl_s
from automq_ref.io.metadata.etcd_client import EtcdClient, EtcdError
from automq_ref.io.metadata.etcd_metadata_log import (
    BatchTooLarge,
    EtcdLimits,
    EtcdMetadataLog,
    NotController,
)
from automq_ref.io.metadata.follower import MetadataFollower
from automq_ref.io.metadata.metadata_log import MetadataLogClosed, MetadataLogError
from automq_ref.io.metadata.view import ImageView
from automq_ref.state_machines import stream_metadata as sm

log = logging.getLogger(__name__)

RETRY_S: Final = 0.25
SNAPSHOT_CHECK_S: Final = 1.0
_UNSPECIFIED_HOSTS: Final = ("", "0.0.0.0", "::")


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    endpoints: tuple[str, ...]
    cluster_id: str
    node_id: int
    rpc_host: str = "127.0.0.1"
    rpc_port: int = 0
    # Published for other brokers; None: the bound address (rpc_host must then be reachable).
    rpc_advertised_host: str | None = None
    lease_ttl_ms: int = 3000
    request_timeout_ms: int = 30_000
    etcd_request_timeout_ms: int = 5000
    snapshot_bytes: int = 20 * 1024 * 1024
    limits: EtcdLimits = field(default_factory=EtcdLimits)
    # The controller's settings (sessions, the autobalancer), the same on every broker.
    params: sm.StreamMetadataParams = sm.DEFAULT_PARAMS
    # The clock the controller times heartbeats with, when this broker is elected (the one its
    # session ticks use; None: the time each heartbeat carries).
    now_ms: Callable[[], int] | None = None


class ClusterControllerClient:
    """A :class:`~automq_ref.io.metadata.client.ControllerClient` for a broker of a cluster."""

    def __init__(
        self,
        *,
        node_id: int,
        election: ControllerElection,
        replica: Controller,
        request_timeout_s: float,
    ) -> None:
        self._node_id = node_id
        self._election = election
        self._replica = replica
        self._timeout_s = request_timeout_s
        self._connections: dict[str, ControllerConnection] = {}

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        response, _ = await self.submit_indexed(event)
        return response

    async def submit_indexed(self, event: sm.StreamMetadataEvent) -> tuple[sm.Response, int]:
        """``submit``, and the log index just past the decision (where a trace places a step
        the decision commits): this replica's, read with no await after it decided, or the
        one the remote controller answered with."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        name = type(event).__name__
        problem = "no controller is elected"
        # Why an earlier try's outcome is unknown (None: every try so far decided nothing).
        lost: str | None = None
        while True:
            version = self._election.version
            remaining = deadline - loop.time()
            if remaining <= 0:
                if lost is not None:
                    raise ControllerError(
                        f"{name}: its outcome is unknown ({lost}), and no controller answered "
                        f"it again in {self._timeout_s:.1f} s ({problem})"
                    )
                raise ControllerUnavailable(
                    f"{name}: no controller answered in {self._timeout_s:.1f} s ({problem})"
                )
            if self._election.is_leader:
                try:
                    response = await self._replica.handle(event)
                    return response, self._replica.applied_index
                except NotController as error:
                    problem = str(error)
                except (BatchTooLarge, MetadataLogClosed):
                    raise
                except MetadataLogError as error:
                    if not sm.resendable(event):
                        raise
                    lost = problem = self._resending(event, f"this node's metadata log: {error}")
            elif (leader := self._election.leader) is not None and leader.node_id != self._node_id:
                try:
                    return await self._remote(leader, event, deadline)
                except NotSent as error:
                    problem = str(error)
                    await self._drop(leader.address)
                except ReplyLost as error:
                    await self._drop(leader.address)
                    why = f"sent to controller {leader.node_id}, no answer"
                    if not sm.resendable(event):
                        raise ControllerError(
                            f"{name}: {why} (its outcome is unknown): {error}"
                        ) from error
                    lost = problem = self._resending(event, f"{why}: {error}")
                except RemoteError as error:
                    if error.kind == "unknown" and sm.resendable(event):
                        why = f"controller {leader.node_id}: {error}"
                        lost = problem = self._resending(event, why)
                    elif error.kind != "not_controller":
                        raise ControllerError(
                            f"{name}: controller {leader.node_id}: {error}"
                        ) from error
                    else:
                        problem = f"node {leader.node_id} is not the controller any more"
            elif leader is not None:
                problem = "this node's election key is still there after it lost the election"
            await self._election.wait_for_change(version, timeout_s=min(RETRY_S, remaining))

    def _resending(self, event: sm.StreamMetadataEvent, why: str) -> str:
        """A try of resendable ``event`` whose outcome is unknown: it is sent again."""
        log.warning(
            "controller request outcome unknown, sending it again %s",
            fields(node_id=self._node_id, request=type(event).__name__, why=why),
        )
        return why

    async def _remote(
        self, leader: ControllerInfo, event: sm.StreamMetadataEvent, deadline: float
    ) -> tuple[sm.Response, int]:
        loop = asyncio.get_running_loop()
        connection = self._connections.get(leader.address)
        if connection is None or connection.broken:
            connection = self._connections[leader.address] = ControllerConnection(leader.address)
        name = type(event).__name__
        # ReplyLost goes to ``submit``, which sends the request again if it may. A controller
        # that lost the election (paused past its lease, say) may never answer, and can decide
        # nothing more: the wait ends then, rather than at the timeout (a broker's heartbeat
        # stuck there would miss the new controller's session).
        call = asyncio.ensure_future(connection.call(event, deadline - loop.time()))
        deposed = asyncio.ensure_future(self._until_deposed(leader))
        try:
            await asyncio.wait({call, deposed}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            call.cancel()
            raise
        finally:
            deposed.cancel()
        if not call.done():
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, ControllerRpcError):
                await call
            raise ReplyLost(
                f"controller {leader.node_id} lost the election with the request in flight"
            )
        response, index = call.result()
        try:
            async with asyncio.timeout(max(0.0, deadline - loop.time())):
                if self._replica.applied_index < index:
                    # The decision is durable: read it now rather than wait for the follower.
                    await self._replica.catch_up()
                await self._replica.wait_applied(index)
        except TimeoutError:
            raise ControllerError(
                f"{name}: decided at log index {index}, but this node's image did not reach "
                "it in time"
            ) from None
        return response, index

    async def _until_deposed(self, leader: ControllerInfo) -> None:
        """Return once ``leader`` does not hold the election any more."""
        while True:
            version = self._election.version
            if self._election.leader != leader:
                return
            await self._election.wait_for_change(version)

    async def _drop(self, address: str) -> None:
        connection = self._connections.pop(address, None)
        if connection is not None:
            await connection.close()

    async def close(self) -> None:
        for address in list(self._connections):
            await self._drop(address)


class ClusterMetadata:
    """Everything of one broker's cluster metadata; :meth:`start` builds it, :meth:`close`
    ends it (resigning the election at once if this broker holds it)."""

    def __init__(
        self,
        settings: ClusterSettings,
        etcd: EtcdClient,
        metadata_log: EtcdMetadataLog,
        replica: Controller,
    ) -> None:
        self.settings = settings
        self.etcd = etcd
        self.metadata_log = metadata_log
        self.controller = replica
        self.view = ImageView(replica.image)
        replica.subscribe(self.view.publish)
        self.follower = MetadataFollower(replica, metadata_log)
        self.server = ControllerServer(self._decide)
        self.election: ControllerElection | None = None
        self._client: ClusterControllerClient | None = None
        self.rpc_address = ""
        self._snapshots: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, settings: ClusterSettings) -> ClusterMetadata:
        try:
            etcd = await EtcdClient.connect(
                settings.endpoints, settings.etcd_request_timeout_ms / 1000
            )
        except EtcdError as error:
            raise MetadataLogError(f"etcd at {list(settings.endpoints)}: {error}") from error
        try:
            metadata_log = await EtcdMetadataLog.open(
                etcd, settings.cluster_id, limits=settings.limits, fenced_writes=True
            )
            replica = await Controller.open(metadata_log, settings.params, settings.now_ms)
        except BaseException:
            await etcd.close()
            raise
        metadata = cls(settings, etcd, metadata_log, replica)
        try:
            await metadata._start()
        except BaseException:
            await metadata.close()
            raise
        return metadata

    async def _start(self) -> None:
        settings = self.settings
        self.follower.start()
        host, port = await self.server.start(settings.rpc_host, settings.rpc_port)
        advertised = settings.rpc_advertised_host or (
            "127.0.0.1" if host in _UNSPECIFIED_HOSTS else host
        )
        self.rpc_address = f"{advertised}:{port}"
        self.election = ControllerElection(
            self.etcd,
            settings.cluster_id,
            ControllerInfo(settings.node_id, self.rpc_address),
            ttl_s=lease_ttl_s(settings.lease_ttl_ms),
            metadata_log=self.metadata_log,
            on_elected=self.controller.take_over,
        )
        self._client = ClusterControllerClient(
            node_id=settings.node_id,
            election=self.election,
            replica=self.controller,
            request_timeout_s=settings.request_timeout_ms / 1000,
        )
        self.election.start()
        self._snapshots = asyncio.create_task(self._snapshot_forever(), name="metadata-snapshots")

    @property
    def client(self) -> ClusterControllerClient:
        assert self._client is not None, "not started"
        return self._client

    async def _decide(self, event: sm.StreamMetadataEvent) -> tuple[sm.Response, int]:
        """The controller RPC's handler: decide here if this broker is the controller."""
        if self.election is None or not self.election.is_leader:
            raise NotControllerError(f"node {self.settings.node_id} is not the controller")
        try:
            response = await self.controller.handle(event)
        except NotController as error:
            raise NotControllerError(str(error)) from error
        except BatchTooLarge:
            raise
        except MetadataLogError as error:
            raise DecisionUnknown(str(error)) from error
        # Read with no await after the decision: the index its image reached.
        return response, self.controller.applied_index

    async def _snapshot_forever(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_CHECK_S)
            if self.election is None or not self.election.is_leader:
                continue
            if self.controller.bytes_since_snapshot < self.settings.snapshot_bytes:
                continue
            try:
                await self.controller.snapshot()
                log.info("metadata snapshot at index %d", self.controller.applied_index)
            except (MetadataLogError, ValueError) as error:
                log.warning("writing a metadata snapshot: %s", error)

    async def close(self) -> None:
        await stop(self._snapshots)
        if self.election is not None:
            await self.election.close()
        if self._client is not None:
            await self._client.close()
        await self.server.close()
        await self.follower.close()
        await self.metadata_log.close()
        await self.etcd.close()
