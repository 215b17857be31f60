"""The group coordinator's shell: the pure Group machine, its clock, and its offsets stream.

Every group request becomes an event with a fresh request id; the caller awaits the answer,
which the machine may give later (a JoinGroup waits for the rebalance). The machine runs under
the shell's one driver (:mod:`automq_ref.io.driver`), whose executors are synchronous: a
``Respond`` resolves the caller's future; ``PersistOffsets`` and ``PersistGroupDeletion`` are
appended, in emission order, to one *offsets stream* (found in the controller's KV under
:data:`~automq_ref.vocabulary.naming.OFFSETS_STREAM_KEY`; records encoded by
:mod:`automq_ref.formats.group_record`); when an append is durable the machine hears
``OffsetsPersisted`` and only then answers the commit and shows the offsets (so offsets are
persisted before the commit is answered). An append the storage refuses at once is answered
``OffsetsPersistFailed`` (stepped after the transition that asked for it). A ``Rejected`` means
this shell broke its side of the contract and raises ``CoordinatorError``.
At start the stream is replayed (``recover``): groups come back Empty with their offsets, and
members rejoin. Time is the injected clock's wall-clock milliseconds (the node's ``Clock``),
stamped on every request and fed as ``Tick``: at the machine's next deadline
(``next_deadline_ms``, checked at least every 100 ms), and before any request once a deadline
has passed, so that a request sees every timer due at its time fired (a static member that
stopped heartbeating is gone for the DeleteGroups sent one session timeout after it closed, as
in Kafka, where timers fire on their own). The offsets stream's id is read from the metadata
view and written through the controller client.

The stream only grows here; compacting it (rewriting the live offsets and trimming) is left for
later, as AutoMQ does for its MetaStreams.

Each new generation of a group is logged at INFO (``group rebalanced``: the group, generation,
member count, protocol and leader; ``group empty`` when the last member left), and so is a group
removed (deleted, or expired once empty without offsets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Mapping

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats import group_record as gr
from automq_ref.formats.kv_integer import decode_kv_integer, encode_kv_integer
from automq_ref.io.clock import Clock, SystemClock
from automq_ref.io.driver import Driver
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.s3stream import S3Storage, StorageError
from automq_ref.state_machines import group as gc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import OFFSETS_STREAM_KEY

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.1  # the longest the ticker sleeps; it wakes earlier for a known deadline
TICK_MIN_S = 0.001
READ_CHUNK_BYTES = 4 * 1024 * 1024


def encode_record(record: gc.DurableRecord) -> bytes:
    """The offsets-stream record of one of the Group machine's durable effects."""
    if isinstance(record, gc.PersistOffsets):
        offsets = tuple(
            gr.StoredOffset(
                o.topic, o.partition, o.offset, o.leader_epoch, o.metadata, o.commit_timestamp_ms
            )
            for o in record.offsets
        )
        return gr.encode_group_record(gr.OffsetsCommitted(record.group_id, offsets))
    return gr.encode_group_record(gr.GroupsDeleted(record.group_ids))


def decode_record(payload: bytes | memoryview) -> gc.DurableRecord:
    """The Group machine's record for one offsets-stream record (request id -1: replayed)."""
    record = gr.decode_group_record(payload)
    if isinstance(record, gr.OffsetsCommitted):
        offsets = tuple(
            gc.OffsetRecord(
                o.topic, o.partition, o.offset, o.leader_epoch, o.metadata, o.commit_timestamp_ms
            )
            for o in record.offsets
        )
        return gc.PersistOffsets(-1, record.group_id, offsets)
    return gc.PersistGroupDeletion(-1, record.group_ids)


def _log_generations(before: Mapping[str, gc.Group], after: Mapping[str, gc.Group]) -> None:
    """One line per group whose generation moved, or that is gone."""
    for group_id, group in after.items():
        old = before.get(group_id)
        if group is old or group.generation_id == (0 if old is None else old.generation_id):
            continue  # unchanged, or a group just created: its first rebalance is logged
        if group.members:
            log.info(
                "group rebalanced %s",
                fields(
                    group=group_id,
                    generation=group.generation_id,
                    members=len(group.members),
                    protocol_type=group.protocol_type or "",
                    protocol=group.protocol_name or "",
                    leader=group.leader_id or "",
                ),
            )
        else:
            log.info("group empty %s", fields(group=group_id, generation=group.generation_id))
    # Linear, as the machine's own copy of the mapping on every change is.
    for group_id in sorted(before.keys() - after.keys()):
        log.info("group removed %s", fields(group=group_id))


class CoordinatorError(RuntimeError):
    """The machine refused an event this shell made: the shell broke its side of the contract."""


class GroupCoordinator:
    def __init__(
        self,
        storage: S3Storage,
        stream_id: int,
        epoch: int,
        params: gc.GroupParams,
        state: gc.CoordinatorState,
        clock: Clock,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._stream_id = stream_id
        self._epoch = epoch
        self._driver: Driver[gc.CoordinatorState, gc.GroupEvent, gc.GroupEffect] = Driver(
            lambda state, event: gc.step(state, event, params),
            state,
            {
                gc.Respond: self._answer,
                gc.PersistOffsets: self._persist,
                gc.PersistGroupDeletion: self._persist,
                gc.Rejected: self._refused,
            },
        )
        self._next_request_id = 0
        self._answers: dict[int, asyncio.Future[gc.Response]] = {}
        self._ticker: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        storage: S3Storage,
        client: ControllerClient,
        view: MetadataView,
        *,
        initial_rebalance_delay_ms: int,
        min_session_timeout_ms: int,
        max_session_timeout_ms: int,
        clock: Clock | None = None,
        offsets_stream_key: str = OFFSETS_STREAM_KEY,
    ) -> GroupCoordinator:
        raw = view.image.kv.get(offsets_stream_key)
        records: list[gc.DurableRecord] = []
        if raw is None:
            stream_id = await storage.create_stream()
            epoch = 0
            await storage.open_stream(stream_id, epoch)
            response = await client.submit(
                sm.PutKV(offsets_stream_key, encode_kv_integer(stream_id), False)
            )
            if not response.ok:
                raise StorageError(f"offsets stream: {response.message}")
        else:
            stream_id = decode_kv_integer(raw, "offsets stream id")
            metadata = view.image.streams[stream_id]
            epoch = max(metadata.epoch, 0) + 1
            start, end = await storage.open_stream(stream_id, epoch)
            cursor = start
            while cursor < end:
                found = await storage.read(stream_id, cursor, end, READ_CHUNK_BYTES)
                if not found:
                    raise StorageError(f"offsets stream {stream_id}: nothing at {cursor}")
                records.extend(decode_record(bytes(batch.payload)) for batch in found)
                cursor = found[-1].last_offset
        params = gc.GroupParams(
            group_initial_rebalance_delay_ms=initial_rebalance_delay_ms,
            group_min_session_timeout_ms=min_session_timeout_ms,
            group_max_session_timeout_ms=max_session_timeout_ms,
            member_id_token=secrets.token_hex(4),
        )
        coordinator = cls(
            storage, stream_id, epoch, params, gc.recover(records), clock or SystemClock()
        )
        coordinator._ticker = asyncio.create_task(coordinator._tick_forever())
        return coordinator

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(BaseException):
                await self._ticker
        for answer in self._answers.values():
            answer.cancel()
        await self._storage.close_stream(self._stream_id, self._epoch)

    async def abandon(self) -> None:
        """Stop without closing the offsets stream (this broker was fenced: the controller
        refuses it; the next start recovers the stream)."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(BaseException):
                await self._ticker
        for answer in self._answers.values():
            answer.cancel()

    async def request(self, make_event: Callable[[int, int], gc.GroupEvent]) -> gc.Response:
        """Step ``make_event(request_id, now_ms)`` and wait for its answer."""
        self._next_request_id += 1
        request_id = self._next_request_id
        answer: asyncio.Future[gc.Response] = asyncio.get_running_loop().create_future()
        self._answers[request_id] = answer
        now_ms = self._clock.now_ms()
        self._fire_due_timers(now_ms)
        self._step(make_event(request_id, now_ms))
        return await answer

    def _fire_due_timers(self, now_ms: int) -> None:
        deadline = gc.next_deadline_ms(self._driver.state)
        if deadline is not None and deadline <= now_ms:
            self._step(gc.Tick(now_ms))

    def _step(self, event: gc.GroupEvent) -> None:
        before = self._driver.state.groups
        self._driver.apply(event)
        after = self._driver.state.groups
        if after is not before and log.isEnabledFor(logging.INFO):
            _log_generations(before, after)

    def _answer(self, effect: gc.Respond) -> None:
        answer = self._answers.pop(effect.request_id, None)
        if answer is not None and not answer.done():
            answer.set_result(effect.response)

    def _refused(self, effect: gc.Rejected[KafkaErrorCode]) -> None:
        raise CoordinatorError(f"{effect.error.name}: {effect.message}")

    def _persist(self, record: gc.DurableRecord) -> None:
        request_id = record.request_id
        try:
            _, durable = self._storage.append_nowait(
                self._stream_id, self._epoch, encode_record(record), 1
            )
        except StorageError as error:
            log.error("offsets stream: append refused: %s", error)
            self._step(gc.OffsetsPersistFailed(request_id))
            return

        def done(future: asyncio.Future[None]) -> None:
            if future.cancelled() or future.exception() is not None:
                # The append may or may not be in the WAL: the storage has failed, the node
                # restarts from what is durable.
                log.error("offsets stream: append failed: %s", future.exception())
                return
            self._step(gc.OffsetsPersisted(request_id))

        durable.add_done_callback(done)

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self._until_next_tick_s())
            self._step(gc.Tick(self._clock.now_ms()))

    def _until_next_tick_s(self) -> float:
        deadline = gc.next_deadline_ms(self._driver.state)
        if deadline is None:
            return TICK_INTERVAL_S
        wait_s = (deadline - self._clock.now_ms()) / 1000
        return min(max(wait_s, TICK_MIN_S), TICK_INTERVAL_S)
