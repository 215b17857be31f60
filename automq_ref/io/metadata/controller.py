"""The controller shell: StreamMetadata requests, made durable on the metadata log.

A request runs the pure :func:`~automq_ref.state_machines.stream_metadata.step` on the current
image, through the shell's one driver (:mod:`automq_ref.io.driver`). A rejection, or an
acceptance that writes nothing, is answered at once (its only effect is ``Respond``). Otherwise
the ``AppendRecords`` effect appends the records to the metadata log as one batch, guarded by the
index this controller has applied up to; only once the batch is durable does the driver advance
the image, and only then does the caller get its answer (the ``Respond`` effect, returned with
the transition). If another writer got to the log first (``LogIndexConflict``), the append says
the decision is stale: the controller replays what it missed and the driver decides again on the
newer image, up to ``MAX_CONFLICT_RETRIES`` times. Requests are handled one at a time, so the
log's order is the order of decisions.

On open the image is rebuilt from the latest snapshot plus the records after it; ``snapshot()``
writes the image as records (``image_records``) and lets the log drop what it covers.

Time. Given a clock (``now_ms``), the controller times each broker heartbeat itself, when it
decides it, as KRaft's controller does: a session then runs from when the controller heard the
broker, on the same clock as the ``ExpireSessions`` ticks that end it. The time a broker put in
its heartbeat is when it sent it, and a heartbeat can wait long after that (sent again through a
controller failover, queued behind a decision stuck on an etcd outage): timed by its sender, it
would renew a session already over, and the new controller's next tick would fence a broker
that is alive; brokers' clocks need not agree with the controller's either.

Replicas. On a log that several nodes share (etcd), every node runs a controller over it, and
only the elected one decides; the others are replicas that ``catch_up`` as the log grows (a
:class:`~automq_ref.io.metadata.follower.MetadataFollower` calls it) and load the snapshot when
they fell below it. ``wait_applied`` lets a node wait until its image includes a given index
(its own request, decided elsewhere). ``catch_up`` runs between decisions, never inside one.

Nothing above the metadata room calls the controller directly: requests come through a
:class:`~automq_ref.io.metadata.client.ControllerClient`, and readers follow the image through a
:class:`~automq_ref.io.metadata.view.MetadataView`, which ``subscribe`` tells of every image
the controller moves to (its own decisions and the records it replays from other writers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Self

from automq_ref.formats.metadata_record import (
    decode_record,
    decode_snapshot,
    encode_record,
    encode_snapshot,
)
from automq_ref.io.driver import Driver, Stale, StaleDecisions
from automq_ref.io.metadata.metadata_log import LogIndexConflict, LogTruncated, MetadataLog
from automq_ref.state_machines import stream_metadata as sm

log = logging.getLogger(__name__)

MAX_CONFLICT_RETRIES = 5
# A replica that keeps falling below newer snapshots while it reads gives up after this many.
MAX_SNAPSHOT_LOADS = 5

_ControllerDriver = Driver[sm.StreamMetadataImage, sm.StreamMetadataEvent, sm.StreamMetadataEffect]


class ControllerError(Exception):
    """The controller could not get its decision onto the metadata log."""


class ControllerUnavailable(ControllerError):
    """No controller answered within the request timeout; nothing was decided."""


class Controller:
    def __init__(
        self,
        metadata_log: MetadataLog,
        image: sm.StreamMetadataImage,
        applied_index: int,
        params: sm.StreamMetadataParams,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self._log = metadata_log
        self._applied_index = applied_index
        self._params = params
        self._now_ms = now_ms
        self._listeners: list[Callable[[sm.StreamMetadataImage], None]] = []
        self._applied = asyncio.Event()
        # Record bytes applied since the snapshot this image started from (or the last one
        # written): what a snapshot policy measures.
        self.bytes_since_snapshot = 0
        self._driver: _ControllerDriver = Driver(
            self._step,
            image,
            # The Respond is not executed here: handle returns it, once the driver advanced.
            {sm.AppendRecords: self._append_records, sm.Respond: None},
            refresh=self._replay_new_records,
            max_decisions=MAX_CONFLICT_RETRIES,
        )

    @classmethod
    async def open(
        cls,
        metadata_log: MetadataLog,
        params: sm.StreamMetadataParams = sm.DEFAULT_PARAMS,
        now_ms: Callable[[], int] | None = None,
    ) -> Self:
        """The controller over ``metadata_log``; ``now_ms``, the clock that times heartbeats
        (the module docstring; None: the time each heartbeat carries)."""
        image = sm.EMPTY_IMAGE
        index = metadata_log.first_index
        snapshot = await metadata_log.snapshot()
        if snapshot is not None:
            image = sm.replay_all(image, decode_snapshot(snapshot.payload))
            index = snapshot.index
        controller = cls(metadata_log, image, index, params, now_ms)
        await controller.catch_up()
        return controller

    @property
    def image(self) -> sm.StreamMetadataImage:
        return self._driver.state

    @property
    def applied_index(self) -> int:
        return self._applied_index

    def subscribe(self, listener: Callable[[sm.StreamMetadataImage], None]) -> None:
        """Call ``listener`` with the image after every batch this controller applies."""
        self._listeners.append(listener)

    def _published(self) -> None:
        image = self._driver.state
        for listener in self._listeners:
            listener(image)
        applied, self._applied = self._applied, asyncio.Event()
        applied.set()

    async def wait_applied(self, index: int) -> None:
        """Return once this controller's image includes every record below ``index``."""
        while self._applied_index < index:
            await self._applied.wait()

    async def catch_up(self) -> None:
        """Replay every record the log has beyond what this controller applied (loading the
        snapshot first when the records it needs were truncated); waits for the decision in
        progress, if any."""
        async with self._driver.between_decisions():
            await self._replay_new_records()

    async def take_over(self) -> None:
        """This replica was just elected: forget the soft state (sessions, loads) an earlier
        term of its own left behind, then catch up. A controller that takes over starts with
        no session, and its first ``ExpireSessions`` gives every live broker a whole one; stale
        deadlines kept from an earlier term would fence every broker at once."""
        async with self._driver.between_decisions() as image:
            self._driver.reset(replace(image, sessions={}, loads={}, reports={}))
            await self._replay_new_records()

    async def _replay_new_records(self) -> None:
        """``catch_up``'s work, under the driver's lock (it is also the driver's refresh)."""
        image, index, replayed = self._driver.state, self._applied_index, 0
        loads = 0
        while True:
            try:
                entries = await self._log.read(index)
                break
            except LogTruncated:
                loads += 1
                snapshot = await self._log.snapshot()
                if snapshot is None or loads > MAX_SNAPSHOT_LOADS:
                    raise
                log.info("metadata log truncated below %d: loading its snapshot", snapshot.index)
                image = sm.replay_all(sm.EMPTY_IMAGE, decode_snapshot(snapshot.payload))
                index, replayed = snapshot.index, 0
                self.bytes_since_snapshot = 0
        for entry in entries:
            image = sm.replay(image, decode_record(entry.payload))
            replayed += len(entry.payload)
        if entries:
            index = entries[-1].index + 1
        # The image and its index move together, after every read succeeded.
        self._applied_index = index
        self.bytes_since_snapshot += replayed
        self._driver.reset(image)
        self._published()

    async def handle(self, event: sm.StreamMetadataEvent) -> sm.Response:
        try:
            transition = await self._driver.apply_async(event)
        except StaleDecisions:
            raise ControllerError(
                f"{type(event).__name__}: the metadata log kept moving ahead "
                f"({MAX_CONFLICT_RETRIES} tries)"
            ) from None
        # No await since the driver advanced: listeners see the image before the caller the
        # answer, and before any other decision. A decision that appended nothing (a heartbeat
        # changes only the soft state: sessions, loads) is no change to publish, else every
        # heartbeat would wake every reader of the view.
        if any(isinstance(effect, sm.AppendRecords) for effect in transition.effects):
            self._published()
        return sm.response_of(transition)

    def _step(
        self, image: sm.StreamMetadataImage, event: sm.StreamMetadataEvent
    ) -> sm.StreamMetadataTransition:
        if self._now_ms is not None and isinstance(event, sm.BrokerHeartbeat):
            # Timed here, under the driver's lock: when it is decided (the module docstring).
            event = replace(event, now_ms=self._now_ms())
        return sm.step(image, event, self._params)

    async def _append_records(self, effect: sm.AppendRecords) -> None:
        """The executor of ``AppendRecords``: the batch, durable, right after what was applied."""
        payloads = [encode_record(record) for record in effect.records]
        try:
            next_index = await self._log.append(payloads, expected_next_index=self._applied_index)
        except LogIndexConflict:
            log.debug("metadata log moved past %d; catching up", self._applied_index)
            raise Stale from None
        # Nothing runs between here and the driver's advance (the Respond after this effect
        # is returned, not executed), so the index and the image move together.
        self._applied_index = next_index
        self.bytes_since_snapshot += sum(len(payload) for payload in payloads)

    async def snapshot(self) -> None:
        """Write the image as a snapshot; the log may then drop every record it covers."""
        async with self._driver.between_decisions() as image:
            payload = encode_snapshot(sm.image_records(image))
            await self._log.install_snapshot(self._applied_index, payload)
            self.bytes_since_snapshot = 0
