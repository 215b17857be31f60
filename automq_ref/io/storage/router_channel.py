"""RouterChannel: a node's own object WAL of type ``rc``, where a proxy puts the produce data it
routes to a main in another zone; and the read-only reader any node uses to fetch that data.

Theory of operation
-------------------
A proxy that routes a produce request appends the data to its channel
(:meth:`RouterChannel.append`) and sends the main only the returned :class:`ChannelOffset` and
route epoch; the main reads the data back from shared storage (:meth:`RouterChannelReader.read`)
instead of receiving it across zones. The channel is an :class:`ObjectWal` like the node's data
WAL, with keys of its own (``MD5HEX(node)/<namespace>/<node>_rc/<epoch>/wal/<start>-<end>``,
:func:`~automq_ref.vocabulary.naming.wal_object_key` with
:data:`~automq_ref.vocabulary.naming.ROUTER_CHANNEL_WAL_TYPE`) and a reservation of its own:
a newer epoch of the node that opens its channel fences the older writer, whose appends then
fail and are never acknowledged. An append is acknowledged once the WAL acknowledged it (its
object is durable and the reservation still this writer's).

Each append is one WAL record whose body is a StreamRecordBatch: stream id = the target node,
epoch 0, a counter as base offset, count 1, the payload as its payload. The returned
ChannelOffset names the channel (its bucket id), the order hint, the owner, the target and the
record's :class:`RecordOffset` (node epoch, WAL offset, bytes of the whole record).

Reading without listing: every object of an object WAL fills exactly one 64 MiB slot of the
offset space (a bulk never crosses a slot and the next starts at the next slot), so the object
holding offset ``o`` written at epoch ``e`` is ``<prefix><e>/wal/<floor>-<floor + 64 MiB>`` with
``floor`` the 64 MiB floor of ``o``, and the record is bytes ``[44 + o - floor, + size)`` of
it: one ranged GET. The reader checks the WAL record (header CRC, magic, that the header claims
this offset, body CRC) and the batch inside (its stream id is the target the offset names);
a missing object is :class:`ChannelRecordGoneError` (trimmed, or never written), bytes that do
not check are :class:`ChannelRecordCorruptError`, a store that does not answer is
:class:`ChannelUnavailableError` (worth retrying).

Route epochs and trimming (AutoMQ's rule; the RouteEpoch machine's ``TrimRouterChannel``
effect): each acknowledged append is tagged with the channel's current route epoch at the time
of its acknowledgement, and the channel remembers, per epoch, the end of the last record tagged
with it. Acknowledgements come in WAL order and :meth:`RouterChannel.next_epoch` only raises the
epoch, so every record below that end carries that epoch or an earlier one.
:meth:`RouterChannel.trim` with the cluster's committed epoch ``c`` trims the WAL up to the end
of the last record of the highest epoch ``<= c``: every main has uploaded every link record
that could point there.

A restarted node keeps what its earlier incarnation wrote (:meth:`ObjectWal.resume`, no
recovery, no reset): mains may still need it. Their epochs are not known any more, so
:meth:`RouterChannel.open` takes the route epoch the node knows when it opens the channel (the
cluster's current one, at least every epoch the earlier incarnation could have tagged) and
counts everything inherited as of that epoch: a trim removes it only once that epoch is
committed, and a new incarnation that learnt no newer epoch yet cannot trim past it under a
lower one.

Payloads the owner appended stay in an in-process cache for ``cache_ttl_s`` (10 s), so the
owner reads its own fresh records (a route to itself in ``router_channel`` local-write mode)
without a GET.

Differences from AutoMQ's router channel: a reservation key of its own (AutoMQ's channel WAL
shares the node's); a restart keeps the channel's objects (AutoMQ starts the WAL without
recovering it either); the record check includes the body CRC.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from automq_ref.formats.errors import FormatError
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.formats.stream_record_batch import decode as decode_stream_record_batch
from automq_ref.formats.wal_object import WAL_OBJECT_HEADER_SIZE
from automq_ref.formats.wal_record import (
    RECORD_MAGIC_PADDING,
    WAL_RECORD_HEADER_SIZE,
    check_wal_record_body,
    decode_wal_record_header,
)
from automq_ref.formats.zone_router import ChannelOffset, LinkRecord, RecordOffset
from automq_ref.io.clock import Clock, SystemClock
from automq_ref.io.storage.object_store import (
    NotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    RangeNotSatisfiable,
)
from automq_ref.io.storage.wal import WalOverCapacityError
from automq_ref.io.storage.wal_object import (
    DATA_ALIGN_BYTES,
    ObjectWal,
    ObjectWalConfig,
)
from automq_ref.vocabulary.naming import ROUTER_CHANNEL_WAL_TYPE, wal_object_key

log = logging.getLogger(__name__)

CACHE_TTL_S: Final = 10.0
CACHE_MAX_BYTES: Final = 256 * 1024 * 1024
OVER_CAPACITY_RETRY_S: Final = 1.0


class RouterChannelError(Exception):
    """A channel record could not be read."""


class ChannelRecordGoneError(RouterChannelError):
    """The object that held the record is gone: the channel was trimmed past it (or the offset
    names a record that was never written)."""


class ChannelRecordCorruptError(RouterChannelError):
    """The bytes at the offset are not the record it names."""


class ChannelUnavailableError(RouterChannelError):
    """The object store did not answer; reading again may succeed."""


def channel_object_key(namespace: str, owner: int, record_offset: RecordOffset) -> str:
    """The key of the channel object that holds ``record_offset`` of ``owner``'s channel."""
    start = record_offset.offset // DATA_ALIGN_BYTES * DATA_ALIGN_BYTES
    return wal_object_key(
        namespace,
        owner,
        record_offset.epoch,
        start,
        start + DATA_ALIGN_BYTES,
        ROUTER_CHANNEL_WAL_TYPE,
    )


class RouterChannelReader:
    """Reads any node's channel records, read-only, by a ranged GET of the object the offset
    names (the module docstring). ``stores`` maps a channel id (the bucket id of an
    ``automq.zonerouter.channels`` URI) to the store of that bucket."""

    def __init__(self, stores: Mapping[int, ObjectStore], namespace: str) -> None:
        self._stores = dict(stores)
        self._namespace = namespace
        self.get_count = 0

    async def read(self, channel_offset: ChannelOffset) -> bytes:
        """The payload the channel owner appended at ``channel_offset``."""
        store = self._stores.get(channel_offset.channel_id)
        if store is None:
            raise RouterChannelError(
                f"channel offset {channel_offset}: no channel with id {channel_offset.channel_id}"
                f" (known: {sorted(self._stores)})"
            )
        where = channel_offset.record_offset
        owner = channel_offset.channel_owner
        key = channel_object_key(self._namespace, owner, where)
        start = WAL_OBJECT_HEADER_SIZE + where.offset % DATA_ALIGN_BYTES
        what = f"node {owner}'s channel record at epoch {where.epoch} offset {where.offset}"
        if where.size < WAL_RECORD_HEADER_SIZE:
            raise ChannelRecordCorruptError(f"{what}: size {where.size} is below a record header")
        try:
            self.get_count += 1
            data = await store.get_range(key, start, start + where.size)
        except NotFound as error:
            raise ChannelRecordGoneError(
                f"{what}: object {key} is gone (the channel was trimmed past it): {error}"
            ) from error
        except RangeNotSatisfiable as error:
            raise ChannelRecordCorruptError(
                f"{what}: {where.size} bytes at {start} lie past the end of {key}: {error}"
            ) from error
        except ObjectStoreUnavailable as error:
            raise ChannelUnavailableError(f"{what}: {error}") from error
        except ObjectStoreError as error:
            raise RouterChannelError(f"{what}: {error}") from error
        return _payload_of(what, data, channel_offset)


def _payload_of(what: str, data: bytes, channel_offset: ChannelOffset) -> bytes:
    where = channel_offset.record_offset
    try:
        header = decode_wal_record_header(data, 0, where.offset)
        if header.magic == RECORD_MAGIC_PADDING:
            raise FormatError("a padding record, not data")
        if WAL_RECORD_HEADER_SIZE + header.body_length != where.size:
            raise FormatError(
                f"the record holds {header.body_length} body bytes, the offset says "
                f"{where.size - WAL_RECORD_HEADER_SIZE}"
            )
        body = memoryview(data)[WAL_RECORD_HEADER_SIZE:]
        check_wal_record_body(header, body)
        batch, end = decode_stream_record_batch(body)
        if end != len(body):
            raise FormatError(f"{len(body) - end} bytes follow the batch")
    except FormatError as error:
        raise ChannelRecordCorruptError(f"{what}: {error}") from error
    if batch.stream_id != channel_offset.target_node_id:
        raise ChannelRecordCorruptError(
            f"{what}: the record is for node {batch.stream_id}, the offset names node "
            f"{channel_offset.target_node_id}"
        )
    return bytes(batch.payload)


@dataclass(slots=True)
class _Cached:
    key: tuple[int, int, int, int]
    payload: bytes
    expires_s: float


class RouterChannel:
    """This node's RouterChannel ``channel_id`` (the module docstring). Open with :meth:`open`."""

    def __init__(
        self,
        wal: ObjectWal,
        *,
        channel_id: int,
        reader: RouterChannelReader,
        clock: Clock,
        cache_ttl_s: float,
        cache_max_bytes: int,
        route_epoch: int,
    ) -> None:
        self._wal = wal
        self._channel_id = channel_id
        self._reader = reader
        self._clock = clock
        self._cache_ttl_s = cache_ttl_s
        self._cache_max_bytes = cache_max_bytes
        self._route_epoch = route_epoch
        # Route epoch -> the WAL offset just past the last record acknowledged under it.
        self._epoch_ends: dict[int, int] = {}
        self._sequence = 0
        self._cache: dict[tuple[int, int, int, int], _Cached] = {}
        self._cache_order: collections.deque[_Cached] = collections.deque()
        self._cache_bytes = 0

    @classmethod
    async def open(
        cls,
        store: ObjectStore,
        *,
        namespace: str,
        node_id: int,
        node_epoch: int,
        channel_id: int,
        config: ObjectWalConfig | None = None,
        owns_store: bool = False,
        reader: RouterChannelReader | None = None,
        clock: Clock | None = None,
        cache_ttl_s: float = CACHE_TTL_S,
        cache_max_bytes: int = CACHE_MAX_BYTES,
        route_epoch: int,
    ) -> RouterChannel:
        """Take the reservation of node ``node_id``'s channel at ``node_epoch`` (fencing an
        older epoch's writer) and accept appends after what is there, tagged with
        ``route_epoch`` until :meth:`next_epoch` raises it. ``route_epoch`` must be at least
        every route epoch an earlier incarnation of the node could have tagged its records with
        (the cluster's current route epoch is): what is inherited counts as of it.
        ``channel_id`` is the bucket id of the channel's URI; ``reader`` reads channel records
        this node did not append (default: only this channel's bucket)."""
        wal = await ObjectWal.open(
            store,
            namespace=namespace,
            node_id=node_id,
            node_epoch=node_epoch,
            config=config,
            owns_store=owns_store,
            wal_type=ROUTER_CHANNEL_WAL_TYPE,
        )
        try:
            await wal.resume()
        except BaseException:
            await wal.close()
            raise
        channel = cls(
            wal,
            channel_id=channel_id,
            reader=reader or RouterChannelReader({channel_id: store}, namespace),
            clock=clock or SystemClock(),
            cache_ttl_s=cache_ttl_s,
            cache_max_bytes=cache_max_bytes,
            route_epoch=route_epoch,
        )
        if wal.objects:
            channel._epoch_ends[route_epoch] = wal.confirm_offset
        return channel

    @property
    def channel_id(self) -> int:
        return self._channel_id

    @property
    def node_id(self) -> int:
        return self._wal.node_id

    @property
    def route_epoch(self) -> int:
        """The route epoch the next acknowledged append is tagged with."""
        return self._route_epoch

    @property
    def wal(self) -> ObjectWal:
        return self._wal

    @property
    def epoch_ends(self) -> dict[int, int]:
        """Per route epoch not trimmed yet, the WAL offset past its last record."""
        return dict(self._epoch_ends)

    async def append(
        self, target_node: int, order_hint: int, payload: bytes
    ) -> tuple[int, ChannelOffset]:
        """Append ``payload`` for ``target_node``; once durable, return the route epoch it is
        tagged with and where it lies. Raises the WAL's errors (``WalFencedError`` once a newer
        epoch of this node opened the channel); waits while the WAL is over capacity."""
        self._sequence += 1
        body = StreamRecordBatch(target_node, 0, self._sequence, 1, payload).encode()
        while True:
            try:
                result = await self._wal.append(body)
                break
            except WalOverCapacityError as error:
                log.warning("router channel %d over capacity, waiting: %s", self._channel_id, error)
                await asyncio.sleep(OVER_CAPACITY_RETRY_S)
        epoch = self._route_epoch
        self._epoch_ends[epoch] = max(self._epoch_ends.get(epoch, 0), result.next_offset)
        offset = ChannelOffset(
            self._channel_id,
            order_hint,
            self._wal.node_id,
            target_node,
            RecordOffset(
                self._wal.node_epoch, result.record_offset, WAL_RECORD_HEADER_SIZE + len(body)
            ),
        )
        self._remember(offset, payload)
        return epoch, offset

    def next_epoch(self, epoch: int) -> None:
        """Tag later acknowledgements with route epoch ``epoch`` (an older one is ignored)."""
        if epoch > self._route_epoch:
            self._route_epoch = epoch

    async def trim(self, committed_epoch: int) -> None:
        """Trim the channel up to the last record of the highest epoch ``<= committed_epoch``."""
        done = [epoch for epoch in self._epoch_ends if epoch <= committed_epoch]
        if not done:
            return
        end = max(self._epoch_ends.pop(epoch) for epoch in done)
        log.info("router channel %d: trim to epoch %d offset %d", self._channel_id, max(done), end)
        await self._wal.trim(end)

    async def read(self, channel_offset: ChannelOffset) -> bytes:
        """The payload at ``channel_offset``: from the cache when this channel appended it in
        the last ``cache_ttl_s``, else through the reader."""
        self._expire()
        cached = self._cache.get(_cache_key(channel_offset))
        if cached is not None:
            return cached.payload
        return await self._reader.read(channel_offset)

    def _remember(self, offset: ChannelOffset, payload: bytes) -> None:
        entry = _Cached(
            _cache_key(offset), bytes(payload), self._clock.monotonic_s() + self._cache_ttl_s
        )
        self._cache[entry.key] = entry
        self._cache_order.append(entry)
        self._cache_bytes += len(entry.payload)
        self._expire()

    def _expire(self) -> None:
        now = self._clock.monotonic_s()
        while self._cache_order and (
            self._cache_order[0].expires_s <= now or self._cache_bytes > self._cache_max_bytes
        ):
            entry = self._cache_order.popleft()
            self._cache_bytes -= len(entry.payload)
            if self._cache.get(entry.key) is entry:
                del self._cache[entry.key]

    async def close(self) -> None:
        """Upload what is queued and release the channel."""
        self._cache.clear()
        self._cache_order.clear()
        self._cache_bytes = 0
        await self._wal.close()


def _cache_key(offset: ChannelOffset) -> tuple[int, int, int, int]:
    where = offset.record_offset
    return (offset.channel_id, offset.channel_owner, where.epoch, where.offset)


class ChannelLinkResolver:
    """Resolves a link record to the channel payload it points to, unchanged: for streams
    whose channel records hold the stored data itself. (A Kafka partition's channel record
    holds the routed produce request instead, which its resolver decodes and re-stamps with
    the offsets and timestamps the link record carries.)"""

    def __init__(self, reader: RouterChannelReader | RouterChannel) -> None:
        self._reader = reader

    async def resolve(self, link: LinkRecord) -> bytes:
        return await self._reader.read(link.channel_offset)
