"""Route epochs, a broker's side: the epoch record it learned, the fence check on routed
requests, their in-flight count per epoch, and the loop that reports its committed route epoch.

Every broker runs one :class:`RouteEpochNode` while the zone router is on. It follows its image
for the controller's record (:data:`~automq_ref.vocabulary.naming.ROUTE_EPOCH_KEY`, written by
:mod:`automq_ref.io.metadata.route_epochs`) and learns each new one by the RouteEpoch machine's
``LearnRouteEpoch`` (:func:`~automq_ref.state_machines.route_epoch_projections.learn`): the
subscribers hear ``on_new_epoch(current)`` when the current route epoch moved (a proxy's
RouterChannel tags its next appends with it) and then ``on_committed(committed)`` when the
committed epoch moved (the channel trims up to it), in that order, one record at a time.

The zone router uses it both ways:

- as a proxy, :meth:`RouteEpochNode.tag` gives the epoch to put on a new routed write (the
  current route epoch this node knows);
- as a main, :meth:`RouteEpochNode.begin` admits a routed request by the machine's fence check
  (refused when its epoch is at or below the fenced epoch this node knows, the machine's
  ``ROUTE_EPOCH_FENCED``: nothing is appended, and AutoMQ's leader fails the whole
  ``AutomqZoneRouterRequest`` ("The router request epoch E is less than fenced epoch F", an
  ``UNKNOWN_SERVER_ERROR`` on the wire), which the proxy answers its client as the retriable
  ``LEADER_NOT_AVAILABLE``) and counts it in flight for its epoch;
  :meth:`RouteEpochNode.end` takes it out once its append is durable (or failed).
  :meth:`RouteEpochNode.in_flight` is both as a context manager, raising
  :class:`RouteEpochFenced`.

Once a second (``automq.zonerouter.route.epoch.commit.interval.ms``) the loop asks the machine
which epoch this node may report (``epoch_to_report`` of
:mod:`automq_ref.state_machines.route_epoch_projections`): the largest epoch E at or below the
fenced epoch such that no request of E **or of any earlier epoch** is in flight. That is the
fixed rule: AutoMQ's CommittedEpochManager as read stops only at an epoch with nothing in flight
itself, so it can report E while a slow request of an earlier epoch is still in flight, and the
proxy then trims data that request's Link Record will point to (the counterexample TLC found,
``specs/MCRouteEpochNoWaitEarlier.cfg``). When the epoch is above the last report, the
storage's LogCache is committed (every record appended before the commit began is in objects:
the full data of every Link Record this node appended; AutoMQ's commit is lazy:
``automq.zonerouter.route.epoch.commit.linger.ms``) and only then is the epoch written under
``__a_r_c_nce/<nodeId>``.

The machine's report is one atomic step; so that the shell's is too, while a report is being
made this node learns no new record and a request that ends stays counted until the report is
written (its end is applied right after). Neither is unsafe: a record learned later only fences
later, and a request counted longer only holds the next report back.

With a trace (:mod:`automq_ref.io.metadata.route_epoch_trace`) each step is recorded:
``LearnRouteEpoch``, ``ForwardWrite``, ``ReceiveRequest`` (with its verdict),
``AppendLinkRecord`` as local steps, ``ReportCommittedEpoch`` as committed at its write. Requests
are named by the caller's ``key``, which the proxy and the main share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator

from automq_ref.formats.route_epoch_record import encode_node_committed_epoch
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.background import stop
from automq_ref.io.metadata.route_epoch_trace import RouteEpochTrace
from automq_ref.io.metadata.route_epochs import epoch_record, node_report, stored_record
from automq_ref.io.metadata.view import MetadataView
from automq_ref.state_machines import route_epoch as re_
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.route_epoch_projections import (
    admits,
    epoch_to_report,
    initial_record,
    learn,
)
from automq_ref.vocabulary.naming import ROUTE_EPOCH_KEY, node_committed_route_epoch_key

log = logging.getLogger(__name__)

DEFAULT_COMMIT_INTERVAL_MS = 1000  # AutoMQ's CommittedEpochManager runs every second

# A KV write that also says the index just past it (the controller client's submit_indexed).
IndexedSubmit = Callable[[sm.StreamMetadataEvent], Awaitable[tuple[sm.Response, int]]]
EpochListener = Callable[[int], None]


class RouteEpochFenced(Exception):
    """A routed request's epoch is at or below the fenced epoch this main knows."""

    def __init__(self, epoch: int, fenced: int) -> None:
        super().__init__(
            f"the router request epoch {epoch} is at or below the fenced epoch {fenced}"
        )
        self.epoch = epoch
        self.fenced = fenced


class RouteEpochNode:
    """This broker's route epochs (module docstring)."""

    def __init__(
        self,
        *,
        node_id: int,
        view: MetadataView,
        index: Callable[[], int],
        submit: IndexedSubmit,
        commit: Callable[[], Awaitable[None]],
        interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
        trace: RouteEpochTrace | None = None,
    ) -> None:
        self.node_id = node_id
        self._view = view
        self._index = index
        self._submit = submit
        self._commit = commit
        self._interval_s = interval_ms / 1000
        self._trace = trace
        first = initial_record()
        # The machine's view of this node: its record, trim point and report (up: it runs).
        self.state = re_.NodeState(
            view=first, trimmed=first.committed, reported=node_report(view.image, node_id)
        )
        self._in_flight: Counter[int] = Counter()
        self._reporting = False
        self._learned_raw: bytes | None = None
        self._ended: list[tuple[int, str | None]] = []  # ends held while a report is made
        self._new_epoch: list[EpochListener] = []
        self._committed: list[EpochListener] = []
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------------- the record

    @property
    def record(self) -> re_.EpochRecord:
        """The epoch record this node learned last."""
        return self.state.view

    @property
    def current_epoch(self) -> int:
        return self.state.view.route

    def subscribe(
        self,
        on_new_epoch: EpochListener | None = None,
        on_committed: EpochListener | None = None,
    ) -> None:
        """Hear each new current epoch and each new committed epoch from now on; a subscriber
        hears the ones this node knows already at once (its channel starts there)."""
        if on_new_epoch is not None:
            self._new_epoch.append(on_new_epoch)
            on_new_epoch(self.state.view.route)
        if on_committed is not None:
            self._committed.append(on_committed)
            on_committed(self.state.trimmed)

    def learn_latest(self) -> bool:
        """Learn the record in the image if it is new (held while a report is being made).
        True if this node learned one."""
        if self._reporting:
            return False
        raw = self._view.image.kv.get(ROUTE_EPOCH_KEY)
        if raw is None or raw == self._learned_raw:
            return False  # most image changes are other records
        stored = stored_record(self._view.image)
        if stored is None:
            return False
        self._learned_raw = raw
        record = epoch_record(stored)
        if record == self.state.view:
            return False
        before = self.state
        self.state = learn(before, record)
        if self._trace is not None:
            self._trace.record(re_.LearnRouteEpoch(self.node_id))
        if self.state.view.route != before.view.route:
            self._tell(self._new_epoch, self.state.view.route)
        if self.state.trimmed != before.trimmed:
            self._tell(self._committed, self.state.trimmed)
        return True

    def _tell(self, listeners: list[EpochListener], epoch: int) -> None:
        for listener in list(listeners):
            try:
                listener(epoch)
            except Exception:  # a subscriber's fault must not stop this node learning records
                log.exception("route epoch subscriber failed on epoch %d", epoch)

    # ------------------------------------------------------------------ routed requests

    def tag(self, main_id: int, key: str | None = None) -> int:
        """The epoch of a new write this node routes (as a proxy) to ``main_id``."""
        if self._trace is not None:
            self._trace.record(re_.ForwardWrite(self.node_id, main_id), key=key)
        return self.state.view.route

    def admit(self, epoch: int) -> bool:
        """Whether a routed request of ``epoch`` passes the fence check now (machine's rule)."""
        return admits(self.state.view, epoch)

    def begin(self, epoch: int, key: str | None = None) -> bool:
        """A routed request of ``epoch`` arrives: admitted and counted in flight, or refused
        (False: answer it with the fenced error; nothing to end)."""
        admitted = self.admit(epoch)
        if admitted:
            self._in_flight[epoch] += 1
        if self._trace is not None:
            self._trace.record(re_.ReceiveRequest(0), key=key, accepted=admitted)
        return admitted

    def end(self, epoch: int, key: str | None = None) -> None:
        """A request :meth:`begin` admitted is done (its append durable, or failed)."""
        if self._reporting:
            self._ended.append((epoch, key))
            return
        self._end(epoch, key)

    def _end(self, epoch: int, key: str | None) -> None:
        self._in_flight[epoch] -= 1
        if self._in_flight[epoch] <= 0:
            del self._in_flight[epoch]
        if self._trace is not None:
            self._trace.record(re_.AppendLinkRecord(0), key=key)

    @contextlib.contextmanager
    def in_flight(self, epoch: int, key: str | None = None) -> Iterator[None]:
        """:meth:`begin` and :meth:`end` around the body; :class:`RouteEpochFenced` if
        refused."""
        if not self.begin(epoch, key):
            raise RouteEpochFenced(epoch, self.state.view.fenced)
        try:
            yield
        finally:
            self.end(epoch, key)

    def in_flight_epochs(self) -> dict[int, int]:
        return dict(self._in_flight)

    # ------------------------------------------------------------------------ the report

    async def report_once(self) -> int | None:
        """One run of the loop: report the epoch the machine allows, if above the last report,
        after committing the LogCache. The epoch reported, or None."""
        epoch = epoch_to_report(self.state.view, self._in_flight, self.state.reported)
        if epoch is None:
            return None
        self._reporting = True
        try:
            await self._commit()
            response, index = await self._submit(
                sm.PutKV(
                    node_committed_route_epoch_key(self.node_id),
                    encode_node_committed_epoch(epoch),
                    True,
                )
            )
            if not response.ok:
                log.warning("route epoch report refused: %s", response.error.value)
                return None
            self.state = re_.NodeState(
                view=self.state.view, trimmed=self.state.trimmed, reported=epoch
            )
            if self._trace is not None:
                self._trace.record(
                    re_.ReportCommittedEpoch(self.node_id),
                    committed=True,
                    index=index,
                    reported=epoch,
                )
            log.debug("route epoch reported %s", fields(node_id=self.node_id, committed=epoch))
            return epoch
        finally:
            self._reporting = False
            ended, self._ended = self._ended, []
            for ended_epoch, key in ended:
                self._end(ended_epoch, key)
            self.learn_latest()

    # ------------------------------------------------------------------------- the loops

    def start(self) -> None:
        """Follow the image and report once a second from now on."""
        self.learn_latest()
        self._tasks = [
            asyncio.create_task(self._follow(), name="route-epoch-follow"),
            asyncio.create_task(self._report_forever(), name="route-epoch-report"),
        ]

    async def _follow(self) -> None:
        version = self._view.version
        while True:
            self.learn_latest()
            version = await self._view.wait_for_change(version)

    async def _report_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.report_once()
            except Exception as error:  # the controller or the storage unreachable: next time
                log.warning("route epoch report of node %d failed: %s", self.node_id, error)

    async def close(self) -> None:
        for task in self._tasks:
            await stop(task)
        self._tasks = []
