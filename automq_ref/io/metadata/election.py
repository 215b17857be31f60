"""The controller election on etcd: which broker of a cluster decides, and how the others know.

Every broker campaigns; the one that holds the election key ``/automq-ref/<cluster id>/controller``
is the active controller. The key is attached to an etcd lease the holder keeps alive
(``ttl_s``, a keepalive every third of it), and holds who it is (:class:`ControllerInfo`: the
node id and the address of its controller RPC listener), so the others know where to send their
requests.

Campaign: grant a lease, then ``put`` the key only if it is absent (a transaction guarded on its
version being 0). The winner's :class:`~automq_ref.io.metadata.etcd_metadata_log.LeaderFence`
(the key and the revision that created it) is set on the metadata log, whose every append then
carries the compare "the election key is still the one I created": a controller whose lease
expired (paused, cut off, too slow to keep it alive) can decide nothing, even before it notices
(its guarded append fails with ``NotController``). A loser watches the key from the revision it
read and campaigns again once the key is deleted: a dead holder's lease expires within the TTL,
a holder that shuts down revokes its lease at once (:meth:`ControllerElection.close`).

Losing: the holder counts itself deposed as soon as the key is deleted, or when no keepalive
has succeeded for a whole TTL counted from when the last good one was *sent* (etcd cannot have
expired the lease any earlier, so the node never believes it leads after etcd stopped agreeing);
it then drops the fence and campaigns again on a fresh lease.

:attr:`ControllerElection.leader` is the holder as this node last saw it (kept by a watch of
the key), ``None`` while there is none; :meth:`wait_for_change` wakes at each change. Failures
to reach etcd are logged and retried; they never end the election tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from automq_ref.io.metadata.background import stop
from automq_ref.io.metadata.etcd_client import (
    EtcdClient,
    EtcdError,
    Get,
    KeyValue,
    Put,
    VersionIs,
    WatchEvent,
)
from automq_ref.io.metadata.etcd_metadata_log import EtcdMetadataLog, LeaderFence, cluster_prefix

log = logging.getLogger(__name__)

MIN_TTL_S: Final = 2  # etcd refuses shorter leases (1.5 election timeouts by default, rounded up)
RETRY_S: Final = 0.25


@dataclass(frozen=True, slots=True)
class ControllerInfo:
    """Who holds the election: the node and where its controller RPC listener is."""

    node_id: int
    address: str  # host:port

    def encode(self) -> bytes:
        return json.dumps({"node_id": self.node_id, "address": self.address}).encode()

    @classmethod
    def decode(cls, value: bytes) -> ControllerInfo | None:
        try:
            fields = json.loads(value)
            return cls(int(fields["node_id"]), str(fields["address"]))
        except (ValueError, KeyError, TypeError):
            log.warning("the controller election key holds %r, not a controller", value)
            return None


def election_key(cluster_id: str) -> bytes:
    return (cluster_prefix(cluster_id) + "controller").encode()


def lease_ttl_s(ttl_ms: int) -> int:
    """etcd leases count whole seconds: ``ttl_ms`` rounded up, at least :data:`MIN_TTL_S`."""
    return max(MIN_TTL_S, math.ceil(ttl_ms / 1000))


class ControllerElection:
    """This node's campaign for the controller of ``cluster_id``. ``start`` it; ``close`` it."""

    def __init__(
        self,
        client: EtcdClient,
        cluster_id: str,
        me: ControllerInfo,
        *,
        ttl_s: int,
        metadata_log: EtcdMetadataLog | None = None,
        on_elected: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._client = client
        self.key = election_key(cluster_id)
        self.me = me
        self.ttl_s = ttl_s
        self._log = metadata_log
        self._on_elected = on_elected
        self._leader: ControllerInfo | None = None
        self._version = 0
        self._changed = asyncio.Event()
        self._fence: LeaderFence | None = None
        self._lease: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.elections_won = 0

    # ---------------------------------------------------------------------- reading

    @property
    def leader(self) -> ControllerInfo | None:
        """The holder as last seen, or None while the key is absent."""
        return self._leader

    @property
    def is_leader(self) -> bool:
        """Whether this node holds the election (and its fence is on the log)."""
        return self._fence is not None

    @property
    def fence(self) -> LeaderFence | None:
        return self._fence

    @property
    def version(self) -> int:
        """Counts the changes of ``leader`` and ``is_leader`` seen here."""
        return self._version

    async def wait_for_change(self, after_version: int, timeout_s: float | None = None) -> int:
        """Wait until ``version`` passes ``after_version`` (or ``timeout_s`` passes)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._version <= after_version:
                    await self._changed.wait()
        return self._version

    def _notify(self) -> None:
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _saw_leader(self, leader: ControllerInfo | None) -> None:
        if leader != self._leader:
            self._leader = leader
            self._notify()

    def _set_fence(self, fence: LeaderFence | None) -> None:
        if fence == self._fence:
            return
        self._fence = fence
        if self._log is not None:
            self._log.fence = fence
        if fence is not None:
            self.elections_won += 1
            log.info(
                "node %d is the active controller (election key revision %d)",
                self.me.node_id,
                fence.create_revision,
            )
        else:
            log.info("node %d is no longer the active controller", self.me.node_id)
        self._notify()

    # --------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(self._observe_forever(), name="controller-election-observer"),
            asyncio.create_task(self._campaign_forever(), name="controller-election-campaign"),
        ]

    async def close(self) -> None:
        """Stop campaigning; a holder revokes its lease, so another node takes over at once."""
        if self._closed:
            return
        self._closed = True
        await stop(*self._tasks)
        self._set_fence(None)
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                await self._client.revoke_lease(lease)
            except EtcdError as error:
                log.warning("revoking the controller lease: %s (it expires by itself)", error)

    # ------------------------------------------------------------------- observing

    async def _observe_forever(self) -> None:
        """Keep ``leader`` equal to the key's holder."""
        while True:
            try:
                found = await self._client.range(Get(self.key))
                self._saw_leader(ControllerInfo.decode(found.kvs[0].value) if found.kvs else None)
                async with self._client.watch(
                    self.key, start_revision=found.revision + 1
                ) as events:
                    async for event in events:
                        self._saw_leader(
                            None if event.deleted else ControllerInfo.decode(event.kv.value)
                        )
            except EtcdError as error:
                log.debug("watching the controller election: %s; again", error)
                await asyncio.sleep(RETRY_S)

    # ------------------------------------------------------------------ campaigning

    async def _campaign_forever(self) -> None:
        while True:
            lost = asyncio.Event()
            keepalive: asyncio.Task[None] | None = None
            try:
                self._lease = lease = await self._client.grant_lease(self.ttl_s)
                keepalive = asyncio.create_task(self._keep_alive(lease, lost))
                await self._campaign(lease, lost)
            except EtcdError as error:
                log.debug("controller campaign: %s; again", error)
            except Exception:
                log.exception("controller campaign failed; again")
            finally:
                self._set_fence(None)
                await stop(keepalive)
            held, self._lease = self._lease, None
            if held is not None:
                with contextlib.suppress(EtcdError):
                    await self._client.revoke_lease(held)
            await asyncio.sleep(RETRY_S)

    async def _campaign(self, lease: int, lost: asyncio.Event) -> None:
        """Win the key on ``lease`` and hold it, or wait for it to go; return once ``lease``
        is lost or the key was taken from this node (the caller starts again)."""
        while not lost.is_set():
            result = await self._client.txn(
                (VersionIs(self.key, 0),),
                (Put(self.key, self.me.encode(), lease), Get(self.key)),
                (Get(self.key),),
            )
            found = result.results[1] if result.succeeded else result.results[0]
            holder: KeyValue | None = found.kvs[0] if found is not None and found.kvs else None
            if holder is None:
                continue  # deleted right after the failed compare: try again
            if holder.lease == lease:
                # Won now, or by an earlier attempt whose answer was lost.
                self._saw_leader(ControllerInfo.decode(holder.value))
                self._set_fence(LeaderFence(self.key, holder.create_revision))
                if self._on_elected is not None:
                    try:
                        await self._on_elected()
                    except Exception as error:
                        # Deciding still works: a controller behind the log catches up at
                        # its first append's conflict.
                        log.warning("after winning the controller election: %s", error)
                await self._until_gone(holder, lost)
                return
            await self._until_gone(holder, lost)

    async def _until_gone(self, holder: KeyValue, lost: asyncio.Event) -> None:
        """Return once ``holder`` (the key as read) is deleted or replaced, or ``lost`` is set.
        A broken watch is set up again (after reading the key once more): an etcd hiccup
        does not depose a holder whose lease lives."""
        revision = holder.mod_revision
        while not lost.is_set():
            try:
                async with self._client.watch(self.key, start_revision=revision + 1) as events:
                    await self._first(self._key_gone(events, holder), lost)
                    return
            except EtcdError as error:
                log.debug("watching the controller election key: %s; again", error)
            await self._first(asyncio.sleep(RETRY_S), lost)
            try:
                found = await self._client.range(Get(self.key))
            except EtcdError:
                continue
            current = found.kvs[0] if found.kvs else None
            if current is None or current.create_revision != holder.create_revision:
                return
            revision = found.revision

    @staticmethod
    async def _first(work: Awaitable[None], lost: asyncio.Event) -> None:
        """Await ``work`` until it ends or ``lost`` is set; ``work``'s failure is raised."""
        task = asyncio.ensure_future(work)
        lost_waiter = asyncio.ensure_future(lost.wait())
        try:
            await asyncio.wait({task, lost_waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await stop(task, lost_waiter)
        if task.done() and not task.cancelled():
            failure = task.exception()
            if failure is not None:
                raise failure

    @staticmethod
    async def _key_gone(events: AsyncIterator[WatchEvent], holder: KeyValue) -> None:
        async for event in events:
            if event.deleted or event.kv.create_revision != holder.create_revision:
                return

    async def _keep_alive(self, lease: int, lost: asyncio.Event) -> None:
        """Refresh ``lease`` every third of its TTL; set ``lost`` when it is gone, or when no
        refresh succeeded for a TTL counted from the sending of the last good one."""
        loop = asyncio.get_running_loop()
        good_until = loop.time() + self.ttl_s
        interval = self.ttl_s / 3
        while True:
            sent = loop.time()
            try:
                async with asyncio.timeout(max(0.1, good_until - sent)):
                    remaining = await self._client.keep_alive(lease)
                if remaining <= 0:
                    log.warning("controller lease %x expired", lease)
                    break
                good_until = sent + self.ttl_s
            except (EtcdError, TimeoutError) as error:
                log.warning("controller lease keepalive: %s", error or "timed out")
            now = loop.time()
            if now >= good_until:
                log.warning("controller lease %x: no keepalive for a whole TTL", lease)
                break
            await asyncio.sleep(min(interval, max(0.0, good_until - now)))
        lost.set()
