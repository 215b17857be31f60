"""A snapshot-read copy's side of Kafka transactions: what a proxy knows of its main's last
stable offset and aborted-transactions index, so that its copy of a partition
(:class:`~automq_ref.kafka.snapshot_read.SnapshotPartition`) answers a READ_COMMITTED read what
the main would (``handlers/fetch.py``).

The LSO. Each answer of the main's session carries the partition's LSO at the end it describes
(``first_unstable_offset``, :mod:`automq_ref.kafka.snapshot_sessions`). The copy takes it when
it applies that end, not before (:meth:`CopyTransactions.applied`): the end and the LSO it
answers are a pair its main had. Between a copy's first answer and its first applied end the
applied end may lie below the answer's; the LSO answered is never past the applied end.

The aborted index, never sent whole. The copy holds the entries whose ABORT marker lies at or
past the end of the ADD it began with (``known_from``): each later answer brings the entries of
the offsets it adds. Below that end it holds none, and the ADD said where the newest of them
ends (``aborted_below``, ``older_end`` here): a read from at or past it meets none of them, and
a read from below it asks the main for the entries it overlaps (:class:`AbortedQueries`: one
request with every question waiting, on a connection of its own to the main, answered at once
from the main's index). A new session's ADD of a copy already held (the main restarted, the
session expired) starts the held entries afresh from its end, since entries may have ended
between the two sessions' answers.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import struct
import uuid
from collections.abc import Awaitable, Callable
from typing import Final

from automq_ref.formats.partition_checkpoint import AbortedRow
from automq_ref.io.storage.s3stream import StorageError
from automq_ref.kafka.listeners import Connect
from automq_ref.protocol.partition_snapshot import (
    MAX_VERSION,
    QUERY_SESSION_ID,
    AbortedAnswer,
    AbortedQuery,
    GetPartitionSnapshotRequest,
    PartitionSnapshot,
    SnapshotOperation,
    decode_response_frame,
    encode_request_frame,
)

log = logging.getLogger(__name__)

QUERY_TIMEOUT_S: Final = 10.0  # one request of questions about the main's aborted transactions
_LENGTH = struct.Struct(">i")

# The main's aborted-transactions entries with last offset in [start, end) and first offset
# below upper: (start, upper, end) -> the entries, in index order.
AbortedLookup = Callable[[int, int, int], Awaitable[list[AbortedRow]]]


def _last_offset(row: AbortedRow) -> int:
    return row[2]


def stable_of(snapshot: PartitionSnapshot, end: int) -> int:
    """The main's LSO at the snapshot's end (its first unstable offset; the end if none)."""
    unstable = snapshot.first_unstable_offset
    return end if unstable is None else min(unstable.message_offset, end)


class CopyTransactions:
    """One copy's knowledge of its main's transaction state (module docstring)."""

    def __init__(
        self, name: str, snapshot: PartitionSnapshot, end: int, lookup: AbortedLookup | None
    ) -> None:
        self._name = name
        # The main's LSO at the applied end, and at the newest answer's end.
        self._stable = self._target_stable = stable_of(snapshot, end)
        self._aborted: list[AbortedRow] = []  # by last offset, each >= _known_from
        self._known_from = end
        self._older_end = end if snapshot.aborted_below is None else snapshot.aborted_below
        self._lookup = lookup
        self.lookups = 0

    def told(self, snapshot: PartitionSnapshot, log_start: int, end: int, newest: bool) -> None:
        """An answer's snapshot of the partition (``newest``: its end is the newest end told)."""
        if snapshot.operation is SnapshotOperation.ADD:
            self._aborted = []
            self._known_from = end
            below = snapshot.aborted_below
            self._older_end = end if below is None else below
        else:
            aborted = self._aborted
            for entry in snapshot.aborted:
                row = (entry.producer_id, entry.first_offset, entry.last_offset)
                if row[2] >= self._known_from and (not aborted or row[2] > aborted[-1][2]):
                    aborted.append(row)
        del self._aborted[: bisect.bisect_left(self._aborted, log_start, key=_last_offset)]
        if newest:
            self._target_stable = stable_of(snapshot, end)

    def applied(self) -> None:
        """The copy's applied end reached the newest end told: its LSO goes with it."""
        self._stable = self._target_stable

    def stable_offset(self, high_watermark: int, log_start: int) -> int:
        return max(log_start, min(self._stable, high_watermark))

    def held(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]] | None:
        """What :meth:`aborted` answers when the copy holds all of it (no await: the usual
        case); else None."""
        if fetch_offset < min(self._older_end, self._known_from):
            return None
        return self._held(fetch_offset, upper_bound)

    def _held(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        aborted = self._aborted
        position = bisect.bisect_left(aborted, fetch_offset, key=_last_offset)
        return [
            (producer, first) for producer, first, _ in aborted[position:] if first < upper_bound
        ]

    async def aborted(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the main's aborted transactions a read of
        ``[fetch_offset, upper_bound)`` may meet (last offset at or past ``fetch_offset``,
        first offset below ``upper_bound``), in its index's order: from the entries held, and
        from the main for the entries ending below them."""
        held = self.held(fetch_offset, upper_bound)
        if held is not None:
            return held
        known_from = self._known_from  # what is held and what is asked for, at one moment
        held = self._held(fetch_offset, upper_bound)
        if self._lookup is None:
            raise StorageError(f"{self._name}: no way to ask the main")
        if not self.lookups:
            log.info(
                "snapshot read asks the main for the aborted transactions of %s below %d",
                self._name,
                known_from,
            )
        self.lookups += 1
        rows = await self._lookup(fetch_offset, upper_bound, known_from)
        return [(producer, first) for producer, first, _ in rows] + held


Waiting = list[tuple[AbortedQuery, asyncio.Future[list[AbortedRow]]]]


class AbortedQueries:
    """Questions to one main about its aborted transactions: each asked with every other one
    waiting, one request at a time, on a connection of its own (not the session's, which a
    long poll may hold)."""

    def __init__(
        self,
        main: int,
        address: Callable[[int], tuple[str, int] | None],
        node_id: int,
        connect: Connect | None = None,
    ) -> None:
        self.main = main
        self._address = address
        self._connect = connect
        self._node_id = node_id
        self._waiting: Waiting = []
        self._task: asyncio.Task[None] | None = None
        self._link: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._correlation = 0
        self.requests = 0

    def lookup_for(self, topic_id: uuid.UUID, index: int) -> AbortedLookup:
        """The :data:`AbortedLookup` of one partition this main leads."""

        async def lookup(start: int, upper: int, end: int) -> list[AbortedRow]:
            return await self.ask(AbortedQuery(topic_id, index, start, upper, end))

        return lookup

    async def ask(self, query: AbortedQuery) -> list[AbortedRow]:
        """The main's answer to ``query`` (:class:`StorageError` if it gives none)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[AbortedRow]] = loop.create_future()
        self._waiting.append((query, answer))
        if self._task is None or self._task.done():
            self._task = loop.create_task(
                self._send(), name=f"aborted transactions of node {self.main}"
            )
        return await answer

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        _fail(self._waiting, StorageError(f"snapshot read of node {self.main} closed"))
        self._waiting = []
        self._drop_link()

    async def _send(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                answers = await asyncio.wait_for(
                    self._exchange(tuple(query for query, _ in batch)), QUERY_TIMEOUT_S
                )
            except asyncio.CancelledError:
                _fail(batch, StorageError("cancelled"))
                raise
            except Exception as error:  # the next question connects again
                self._drop_link()
                _fail(batch, StorageError(f"aborted transactions of node {self.main}: {error!r}"))
                continue
            for (query, waiting), answer in zip(batch, answers, strict=True):
                if waiting.done():
                    continue
                if answer.error_code:
                    waiting.set_exception(
                        StorageError(
                            f"node {self.main} answers error {answer.error_code} for partition "
                            f"{query.partition_index}'s aborted transactions"
                        )
                    )
                else:
                    waiting.set_result(
                        [(a.producer_id, a.first_offset, a.last_offset) for a in answer.aborted]
                    )

    async def _exchange(self, queries: tuple[AbortedQuery, ...]) -> tuple[AbortedAnswer, ...]:
        if self._link is None:
            address = self._address(self.main)
            if address is None:
                raise ConnectionError(f"node {self.main} has no known listener")
            self._link = await (
                asyncio.open_connection(*address)
                if self._connect is None
                else self._connect(*address)
            )
        reader, writer = self._link
        self._correlation += 1
        correlation = self._correlation
        request = GetPartitionSnapshotRequest(QUERY_SESSION_ID, -1, aborted_queries=queries)
        frame = encode_request_frame(
            request, MAX_VERSION, correlation, f"snapshot-read-{self._node_id}"
        )
        self.requests += 1
        writer.write(_LENGTH.pack(len(frame)) + frame)
        await writer.drain()
        (size,) = _LENGTH.unpack(await reader.readexactly(4))
        answered, response = decode_response_frame(await reader.readexactly(size), MAX_VERSION)
        if answered != correlation:
            raise ConnectionError(f"answer {answered} to request {correlation}")
        if response.error_code or len(response.aborted_answers) != len(queries):
            raise ConnectionError(
                f"error {response.error_code}, {len(response.aborted_answers)} answers to "
                f"{len(queries)} questions"
            )
        return response.aborted_answers

    def _drop_link(self) -> None:
        if self._link is not None:
            self._link[1].close()
            self._link = None


def _fail(batch: Waiting, failure: Exception) -> None:
    for _, waiting in batch:
        if not waiting.done():
            waiting.set_exception(failure)
