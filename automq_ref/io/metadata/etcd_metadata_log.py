"""The metadata log on etcd: :class:`EtcdMetadataLog`, one key range shared by every broker.

It keeps ``metadata_log_contract.py``'s contract, so the controller runs on it unchanged; etcd
(a raft quorum) makes it durable and replicated, and every broker of a cluster reads it.

Key layout
----------
Under ``/automq-ref/<cluster id>/metadata/``:

* ``next``: the log's next index, as 20 decimal digits (so that etcd's byte-wise order and
  comparison of values is the numeric one);
* ``batches/<first index, 20 digits>``: one key per appended batch, holding all its records
  (:func:`encode_batch_value`: a record count, then each record's length and bytes);
* ``snapshot``: the newest snapshot's header (JSON: the index it covers, its chunks' generation,
  chunk count, length and CRC-32C), absent before the first snapshot;
* ``snapshot-chunks/<generation>/<chunk, 8 digits>``: the snapshot's payload in chunks.

One key per batch rather than per record: a batch is appended atomically by one transaction,
and a transaction is bounded in operations (``--max-txn-ops``, 128 by default) but not in keys'
sizes, so with one key a decision of any number of records is one put (and the ``next`` put),
never too many operations; and the history etcd keeps is one revision per decision. The bound
that remains is the request size (``--max-request-bytes``, 1.5 MiB by default): a batch larger
than that cannot be appended atomically and is refused with :class:`BatchTooLarge` (the
controller's decisions are a few hundred bytes each). A snapshot may be larger than any request,
so its payload is written in chunks, before one transaction makes it the snapshot.

Operations
----------
*append* is one transaction: if ``next`` holds the expected index (and, for a controller, the
election key is still the one it created, see :class:`LeaderFence`), put the batch and the new
``next``; else read ``next`` (and the election key) in the same transaction, and raise
:class:`~automq_ref.io.metadata.metadata_log_contract.LogIndexConflict` with the actual next
index, or :class:`NotController` when the fence failed. An empty batch is the same check with
nothing to put.

*read* is a read-only transaction, so every page is consistent at one revision: the snapshot
header (below its index: ``LogTruncated``), ``next``, the batch holding ``from_index`` (the
greatest batch key at or below it) and the batches after it, a page at a time. A snapshot
installed between two pages ends the read early with what was read so far.

*wait_for* waits until ``next`` passes the index. One watch per log serves every waiter: it reads
``next`` and watches it from the revision right after that read (etcd replays every event from
that revision on, so no append slips between the read and the watch), and starts over after a
failure; a waiter waits through an etcd outage rather than failing, and ends at ``close``.

*install_snapshot(S)* writes the chunks under a fresh generation, then in one transaction
guarded on the snapshot header being the one it read (and the fence): puts the header, deletes
every batch that ends at or below ``S`` (the batch straddling ``S`` stays, and reads skip its
records below ``S``) and every chunk of other generations (an older snapshot, or chunks left by an
install that failed). Then it compacts etcd's history to that transaction's revision, so the
deleted batches and superseded values stop taking space. A reader of the old snapshot pins its
reads to one revision; compaction may pull that revision away, and the read starts over.

Failures: etcd unreachable or too slow raises
:class:`~automq_ref.io.metadata.metadata_log_contract.MetadataLogError` with the cause chained;
a write's outcome is then unknown, and a writer must re-read (its next guarded append does:
the conflict tells it the index moved) before it decides again. Unlike the file log, the log
stays usable after such an error: etcd keeps no half-written state.

``next_index`` and ``first_index`` are the values this process saw last (each call refreshes
them); other writers move the log on, so they are lower bounds, not the truth of the moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import struct
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from crc32c import crc32c

from automq_ref.io.metadata.background import stop
from automq_ref.io.metadata.etcd_client import (
    Compare,
    CreateRevisionIs,
    DeleteRange,
    EtcdClient,
    EtcdCompacted,
    EtcdError,
    EtcdRejected,
    Get,
    ModRevisionIs,
    Operation,
    Put,
    RangeResult,
    ValueIs,
    VersionIs,
    operation_bytes,
    prefix_end,
)
from automq_ref.io.metadata.metadata_log_contract import (
    LogEntry,
    LogIndexConflict,
    LogTruncated,
    MetadataLog,
    MetadataLogClosed,
    MetadataLogCorrupt,
    MetadataLogError,
    Snapshot,
)

log = logging.getLogger(__name__)

KEY_ROOT: Final = "/automq-ref"
INDEX_DIGITS: Final = 20
CHUNK_DIGITS: Final = 8
# etcd's defaults (--max-request-bytes, --max-txn-ops); a cluster that raises them can say so.
DEFAULT_MAX_REQUEST_BYTES: Final = 1_572_864
DEFAULT_MAX_TXN_OPS: Final = 128
# What a request carries beyond its keys and values (header, compares, framing): kept free.
REQUEST_OVERHEAD_BYTES: Final = 4096
READ_PAGE_BATCHES: Final = 256
SNAPSHOT_PAGE_CHUNKS: Final = 8
SNAPSHOT_ATTEMPTS: Final = 5
WATCH_RETRY_S: Final = 0.25

_COUNT = struct.Struct(">I")
_T = TypeVar("_T")


class BatchTooLarge(MetadataLogError):
    """A batch does not fit in one etcd request, so it cannot be appended atomically: nothing
    was written."""


class NotController(MetadataLogError):
    """A write guarded by the controller's election found the election lost (or never won):
    nothing was written. Another node is (or will be) the controller."""


@dataclass(frozen=True, slots=True)
class LeaderFence:
    """A controller's hold on its election key: writes go through only while ``key`` is the
    very key it created at ``create_revision`` (not deleted by its lease's expiry and made again
    by another node)."""

    key: bytes
    create_revision: int


@dataclass(frozen=True, slots=True)
class EtcdLimits:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS

    @property
    def chunk_bytes(self) -> int:
        """A snapshot chunk's size: one chunk, its key and the overhead fit in a request."""
        return self.max_request_bytes - 2 * REQUEST_OVERHEAD_BYTES


def cluster_prefix(cluster_id: str) -> str:
    if not cluster_id or "/" in cluster_id:
        raise ValueError(f"cluster id {cluster_id!r}: must be non-empty, without '/'")
    return f"{KEY_ROOT}/{cluster_id}/"


def encode_index(index: int) -> bytes:
    return f"{index:0{INDEX_DIGITS}d}".encode("ascii")


def encode_batch_value(records: Sequence[bytes]) -> bytes:
    """A batch's value: the record count, then each record's length and bytes (big-endian)."""
    parts = [_COUNT.pack(len(records))]
    for payload in records:
        parts.append(_COUNT.pack(len(payload)))
        parts.append(payload)
    return b"".join(parts)


def decode_batch_value(value: bytes, where: str) -> list[bytes]:
    def corrupt(reason: str) -> MetadataLogCorrupt:
        return MetadataLogCorrupt(Path(where), None, reason)

    if len(value) < _COUNT.size:
        raise corrupt(f"batch of {len(value)} bytes has no record count")
    (count,) = _COUNT.unpack_from(value, 0)
    position = _COUNT.size
    records: list[bytes] = []
    for _ in range(count):
        if position + _COUNT.size > len(value):
            raise corrupt(f"batch ends inside record {len(records)}'s length")
        (length,) = _COUNT.unpack_from(value, position)
        position += _COUNT.size
        if position + length > len(value):
            raise corrupt(f"record {len(records)} of {length} bytes runs past the batch")
        records.append(value[position : position + length])
        position += length
    if position != len(value):
        raise corrupt(f"{len(value) - position} bytes after the last record")
    return records


@dataclass(frozen=True, slots=True)
class _SnapshotHeader:
    index: int
    generation: str
    chunks: int
    length: int
    crc: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "index": self.index,
                "generation": self.generation,
                "chunks": self.chunks,
                "length": self.length,
                "crc32c": self.crc,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, value: bytes, where: str) -> _SnapshotHeader:
        try:
            fields = json.loads(value)
            header = cls(
                int(fields["index"]),
                str(fields["generation"]),
                int(fields["chunks"]),
                int(fields["length"]),
                int(fields["crc32c"]),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise MetadataLogCorrupt(
                Path(where),
                None,
                f"snapshot header does not decode: {error}",
            ) from None
        return header


class EtcdMetadataLog(MetadataLog):
    """The metadata log of cluster ``cluster_id`` on etcd. Open with :meth:`open`."""

    def __init__(
        self,
        client: EtcdClient,
        cluster_id: str,
        *,
        limits: EtcdLimits = EtcdLimits(),
        owns_client: bool = False,
        fenced_writes: bool = False,
    ) -> None:
        prefix = cluster_prefix(cluster_id) + "metadata/"
        self._client = client
        self._owns_client = owns_client
        self.cluster_id = cluster_id
        self.limits = limits
        self._next_key = (prefix + "next").encode()
        self._batches = (prefix + "batches/").encode()
        self._snapshot_key = (prefix + "snapshot").encode()
        self._chunks = (prefix + "snapshot-chunks/").encode()
        self._next_index = 0
        self._first_index = 0
        # With fenced writes every append and snapshot needs a fence (the election's), and
        # without one is refused at once: a node writes only while it holds the election.
        self._fenced_writes = fenced_writes
        self.fence: LeaderFence | None = None
        self._closed = False
        # wait_for's waiters: woken each time next_index grows, or at close. One watch of the
        # next-index key serves them all, started by the first wait.
        self._advanced = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        client: EtcdClient,
        cluster_id: str,
        *,
        limits: EtcdLimits = EtcdLimits(),
        owns_client: bool = False,
        fenced_writes: bool = False,
    ) -> EtcdMetadataLog:
        """The log of ``cluster_id`` (created empty if etcd has none), its indexes read."""
        metadata_log = cls(
            client, cluster_id, limits=limits, owns_client=owns_client, fenced_writes=fenced_writes
        )
        try:
            await metadata_log._call(
                "create the log",
                client.txn,
                (VersionIs(metadata_log._next_key, 0),),
                (Put(metadata_log._next_key, encode_index(0)),),
            )
            await metadata_log.refresh()
        except BaseException:
            if owns_client:
                await client.close()
            raise
        return metadata_log

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[str],
        cluster_id: str,
        *,
        limits: EtcdLimits = EtcdLimits(),
        request_timeout_s: float = 5.0,
    ) -> EtcdMetadataLog:
        """Connect to ``endpoints`` and open the log there (the log owns the connection)."""
        try:
            client = await EtcdClient.connect(endpoints, request_timeout_s)
        except EtcdError as error:
            raise MetadataLogError(f"metadata log on etcd {list(endpoints)}: {error}") from error
        return await cls.open(client, cluster_id, limits=limits, owns_client=True)

    @property
    def client(self) -> EtcdClient:
        return self._client

    @property
    def next_index(self) -> int:
        return self._next_index

    @property
    def first_index(self) -> int:
        return self._first_index

    def _saw(self, *, next_index: int | None = None, first_index: int | None = None) -> None:
        if next_index is not None and next_index > self._next_index:
            self._next_index = next_index
            advanced, self._advanced = self._advanced, asyncio.Event()
            advanced.set()
        if first_index is not None:
            self._first_index = max(self._first_index, first_index)

    def batch_key(self, first_index: int) -> bytes:
        return self._batches + encode_index(first_index)

    # ------------------------------------------------------------------------- plumbing

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataLogClosed(f"metadata log of cluster {self.cluster_id} is closed")

    async def _call(self, what: str, call: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Make an etcd call; its failures as MetadataLogError (cause chained)."""
        self._check_open()
        try:
            return await call(*args)
        except EtcdRejected as error:
            raise MetadataLogError(
                f"metadata log of cluster {self.cluster_id}: {what}: etcd refused the request, "
                f"nothing was applied: {error}"
            ) from error
        except EtcdError as error:
            raise MetadataLogError(
                f"metadata log of cluster {self.cluster_id}: {what}: {error} "
                "(the outcome of a write is unknown)"
            ) from error

    def _fence_compares(self) -> tuple[Compare, ...]:
        if self.fence is None:
            if self._fenced_writes:
                raise NotController(
                    f"metadata log of cluster {self.cluster_id}: this node is not the controller"
                )
            return ()
        return (CreateRevisionIs(self.fence.key, self.fence.create_revision),)

    def _fence_reads(self) -> tuple[Operation, ...]:
        return () if self.fence is None else (Get(self.fence.key),)

    def _check_fence(self, fence: LeaderFence | None, found: RangeResult | None) -> None:
        """Raise NotController if ``fence`` no longer holds, as ``found`` (its key) shows."""
        if fence is None or found is None:
            return
        if not found.kvs or found.kvs[0].create_revision != fence.create_revision:
            raise NotController(
                f"metadata log of cluster {self.cluster_id}: the controller election was lost "
                f"(election key created at revision {fence.create_revision} is gone); "
                "nothing was written"
            )

    def _check_request(self, what: str, operations: Sequence[Operation]) -> None:
        size = sum(operation_bytes(operation) for operation in operations)
        if size + REQUEST_OVERHEAD_BYTES > self.limits.max_request_bytes:
            raise BatchTooLarge(
                f"metadata log of cluster {self.cluster_id}: {what} needs a request of about "
                f"{size + REQUEST_OVERHEAD_BYTES} bytes, above etcd's limit of "
                f"{self.limits.max_request_bytes} (--max-request-bytes); nothing was written"
            )
        if len(operations) > self.limits.max_txn_ops:
            raise BatchTooLarge(
                f"metadata log of cluster {self.cluster_id}: {what} needs {len(operations)} "
                f"operations, above etcd's limit of {self.limits.max_txn_ops} "
                "(--max-txn-ops); nothing was written"
            )

    def _next_of(self, found: RangeResult | None) -> int:
        if found is None or not found.kvs:
            raise MetadataLogCorrupt(
                Path(self._next_key.decode()),
                None,
                "the log's next-index key is missing",
            )
        try:
            return int(found.kvs[0].value)
        except ValueError:
            raise MetadataLogCorrupt(
                Path(self._next_key.decode()),
                None,
                f"next index {found.kvs[0].value!r} is not a number",
            ) from None

    def _header_of(self, found: RangeResult | None) -> _SnapshotHeader | None:
        if found is None or not found.kvs:
            return None
        return _SnapshotHeader.decode(found.kvs[0].value, self._snapshot_key.decode())

    # ---------------------------------------------------------------------- operations

    async def append(self, records: Sequence[bytes], *, expected_next_index: int) -> int:
        self._check_open()
        fence = self.fence
        compares = (
            ValueIs(self._next_key, encode_index(expected_next_index)),
            *self._fence_compares(),
        )
        success: tuple[Operation, ...] = ()
        new_next = expected_next_index + len(records)
        if records:
            success = (
                Put(self.batch_key(expected_next_index), encode_batch_value(records)),
                Put(self._next_key, encode_index(new_next)),
            )
            self._check_request(f"a batch of {len(records)} records", success)
        failure = (Get(self._next_key), *self._fence_reads())
        result = await self._call(
            f"append at {expected_next_index}", self._client.txn, compares, success, failure
        )
        if result.succeeded:
            self._saw(next_index=new_next)
            return new_next
        self._check_fence(fence, result.results[1] if fence is not None else None)
        actual = self._next_of(result.results[0])
        self._saw(next_index=actual)
        raise LogIndexConflict(expected_next_index, actual)

    async def read(self, from_index: int, max_records: int | None = None) -> list[LogEntry]:
        if from_index < 0:
            raise ValueError(f"negative index {from_index}")
        if max_records is not None and max_records < 0:
            raise ValueError(f"negative max_records {max_records}")
        stop = None if max_records is None else from_index + max_records
        entries: list[LogEntry] = []
        cursor = from_index
        while True:
            page, more = await self._read_page(cursor, stop, first=not entries)
            entries.extend(page)
            if not page or not more:
                return entries
            cursor = page[-1].index + 1

    async def refresh(self) -> None:
        """Read the log's next and first index from etcd."""
        result = await self._call(
            "read the indexes", self._client.txn, (), (Get(self._snapshot_key), Get(self._next_key))
        )
        header = self._header_of(result.results[0])
        self._saw(
            next_index=self._next_of(result.results[1]),
            first_index=0 if header is None else header.index,
        )

    async def _read_page(
        self, cursor: int, stop: int | None, *, first: bool
    ) -> tuple[list[LogEntry], bool]:
        """The records from ``cursor`` (up to ``stop``): those of the batch holding ``cursor``
        and of at most ``READ_PAGE_BATCHES`` batches after it, and whether more batches may
        follow. A ``first`` page below the snapshot raises LogTruncated; a later one ends the
        read (a snapshot was installed meanwhile)."""
        upper = self.batch_key(stop) if stop is not None else prefix_end(self._batches)
        reads = (
            Get(self._snapshot_key),
            Get(self._next_key),
            Get(self._batches, self.batch_key(cursor + 1), limit=1, descending=True),
            Get(self.batch_key(cursor + 1), upper, limit=READ_PAGE_BATCHES),
        )
        result = await self._call(f"read from {cursor}", self._client.txn, (), reads)
        header = self._header_of(result.results[0])
        first_index = 0 if header is None else header.index
        next_index = self._next_of(result.results[1])
        self._saw(next_index=next_index, first_index=first_index)
        if cursor < first_index:
            if first:
                raise LogTruncated(cursor, first_index)
            return [], False
        if cursor >= next_index or (stop is not None and cursor >= stop):
            return [], False
        holding, after = result.results[2], result.results[3]
        kvs = [*(holding.kvs if holding else ()), *(after.kvs if after else ())]
        entries: list[LogEntry] = []
        expected: int | None = None
        for kv in kvs:
            start = int(kv.key[len(self._batches) :])
            records = decode_batch_value(kv.value, kv.key.decode())
            if expected is not None and start != expected:
                raise MetadataLogCorrupt(
                    Path(kv.key.decode()),
                    None,
                    f"gap: batch starts at {start}, the previous one ended at {expected}",
                )
            expected = start + len(records)
            for offset, payload in enumerate(records):
                index = start + offset
                if index >= cursor and (stop is None or index < stop) and index < next_index:
                    entries.append(LogEntry(index, payload))
        if not entries or entries[0].index != cursor:
            raise MetadataLogCorrupt(
                Path(self.batch_key(cursor).decode()),
                None,
                f"record {cursor} is missing (first index {first_index}, next {next_index})",
            )
        return entries, bool(after and after.more)

    async def snapshot(self) -> Snapshot | None:
        for _ in range(SNAPSHOT_ATTEMPTS):
            try:
                return await self._read_snapshot()
            except MetadataLogError as error:
                if not isinstance(error.__cause__, EtcdCompacted):
                    raise
                # Compaction took the revision the chunks were read at: read the newer one.
        raise MetadataLogError(
            f"metadata log of cluster {self.cluster_id}: the snapshot kept changing while read"
        )

    async def _read_snapshot(self) -> Snapshot | None:
        found = await self._call("read the snapshot", self._client.range, Get(self._snapshot_key))
        header = self._header_of(found)
        if header is None:
            return None
        self._saw(first_index=header.index)
        prefix = self._chunk_prefix(header.generation)
        chunks: list[bytes] = []
        cursor = prefix
        while len(chunks) < header.chunks:
            page = await self._call(
                "read snapshot chunks",
                functools.partial(self._client.range, revision=found.revision),
                Get(cursor, prefix_end(prefix), limit=SNAPSHOT_PAGE_CHUNKS),
            )
            chunks.extend(kv.value for kv in page.kvs)
            if not page.kvs:
                break
            cursor = page.kvs[-1].key + b"\0"
        payload = b"".join(chunks)
        if (
            len(chunks) != header.chunks
            or len(payload) != header.length
            or int(crc32c(payload)) != header.crc
        ):
            raise MetadataLogCorrupt(
                Path(prefix.decode()),
                None,
                f"snapshot at {header.index}: {len(chunks)} chunks of {len(payload)} bytes, "
                f"the header says {header.chunks} chunks of {header.length} bytes",
            )
        return Snapshot(header.index, payload)

    def _chunk_prefix(self, generation: str) -> bytes:
        return self._chunks + generation.encode() + b"/"

    async def install_snapshot(self, index: int, payload: bytes) -> None:
        self._check_open()
        payload = bytes(payload)
        for _ in range(SNAPSHOT_ATTEMPTS):
            if await self._try_install(index, payload):
                return
        raise MetadataLogError(
            f"metadata log of cluster {self.cluster_id}: another snapshot install kept "
            f"winning the race ({SNAPSHOT_ATTEMPTS} tries)"
        )

    async def _try_install(self, index: int, payload: bytes) -> bool:
        fence = self.fence
        self._fence_compares()  # refuse at once when this node may not write
        state = await self._call(
            "read before a snapshot",
            self._client.txn,
            (),
            (
                Get(self._snapshot_key),
                Get(self._next_key),
                Get(self._batches, self.batch_key(index + 1), limit=1, descending=True),
            ),
        )
        header_kv = state.results[0]
        old = self._header_of(header_kv)
        first_index = 0 if old is None else old.index
        next_index = self._next_of(state.results[1])
        self._saw(next_index=next_index, first_index=first_index)
        if not first_index <= index <= next_index:
            raise ValueError(f"snapshot index {index} outside [{first_index}, {next_index}]")
        # Batches that end at or below ``index`` go; the one holding ``index`` stays whole.
        holding = state.results[2]
        keep_from = index
        if holding is not None and holding.kvs:
            start = int(holding.kvs[0].key[len(self._batches) :])
            count = len(decode_batch_value(holding.kvs[0].value, holding.kvs[0].key.decode()))
            if start + count > index:
                keep_from = start
        generation = f"{index:0{INDEX_DIGITS}d}-{uuid.uuid4().hex}"
        prefix = self._chunk_prefix(generation)
        chunk_bytes = self.limits.chunk_bytes
        pieces = [payload[at : at + chunk_bytes] for at in range(0, len(payload), chunk_bytes)]
        for number, piece in enumerate(pieces):
            key = prefix + f"{number:0{CHUNK_DIGITS}d}".encode()
            self._check_request("a snapshot chunk", (Put(key, piece),))
            await self._call("write a snapshot chunk", self._client.put, key, piece)
        header = _SnapshotHeader(index, generation, len(pieces), len(payload), int(crc32c(payload)))
        mod_revision = header_kv.kvs[0].mod_revision if header_kv and header_kv.kvs else 0
        compares = (ModRevisionIs(self._snapshot_key, mod_revision), *self._fence_compares())
        success: tuple[Operation, ...] = (
            Put(self._snapshot_key, header.encode()),
            DeleteRange(self._batches, self.batch_key(keep_from)),
            DeleteRange(self._chunks, prefix),
            DeleteRange(prefix_end(prefix), prefix_end(self._chunks)),
        )
        self._check_request("the snapshot install", success)
        result = await self._call(
            f"install the snapshot at {index}",
            self._client.txn,
            compares,
            success,
            self._fence_reads(),
        )
        if not result.succeeded:
            with contextlib.suppress(MetadataLogError):
                await self._call(
                    "delete unused chunks",
                    self._client.txn,
                    (),
                    (DeleteRange(prefix, prefix_end(prefix)),),
                )
            self._check_fence(fence, result.results[0] if fence is not None else None)
            return False
        self._saw(first_index=index)
        try:
            await self._client.compact(result.revision)
        except EtcdError as error:
            # The snapshot is in place; the history goes at the next snapshot instead.
            log.warning("compacting etcd after the snapshot at %d: %s", index, error)
        return True

    async def wait_for(self, index: int) -> int:
        while self._next_index <= index:
            self._check_open()
            self._watch_next()
            advanced = self._advanced
            await advanced.wait()
        return self._next_index

    def _watch_next(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.create_task(
                self._watch_next_forever(), name=f"metadata-log-{self.cluster_id}-next"
            )

    async def _watch_next_forever(self) -> None:
        """Keep ``next_index`` current for ``wait_for``: read ``next``, then watch it from the
        revision after that read (no append slips between), again after any failure."""
        while True:
            try:
                found = await self._client.range(Get(self._next_key))
                self._saw(next_index=self._next_of(found))
                async with self._client.watch(
                    self._next_key, start_revision=found.revision + 1
                ) as events:
                    async for event in events:
                        if not event.deleted:
                            self._saw(next_index=int(event.kv.value))
            except (EtcdError, MetadataLogCorrupt, ValueError) as error:
                log.debug("watching the metadata log's next index: %s; again", error)
                await asyncio.sleep(WATCH_RETRY_S)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._advanced.set()
        await stop(self._watcher)
        if self._owns_client:
            await self._client.close()
