"""A broker's session with the controller, and the active controller's clock.

:class:`BrokerSession` is the broker's side: after ``RegisterNode`` (which records the broker
fenced) its first ``BrokerHeartbeat`` makes it live; then one every
``broker.heartbeat.interval.ms`` renews its session and reports the loads of the partitions it
leads; at a graceful stop ``ControlledShutdown`` fences it and moves its partitions away while
it keeps its epoch to close its streams. A heartbeat answered ``NODE_EPOCH_EXPIRED`` means the
controller fenced this incarnation (its session lapsed): the broker must stop serving and
register again; the session records it (``expired``) and stops heartbeating.

:class:`ControllerTicks` is the active controller's side: ``ExpireSessions(now)`` once a
second (a controller that just took over gives each live broker its session then, and a broker
in controlled shutdown loses its next batch of partitions), and, with
``autobalancer.controller.enable``, ``BalancePartitions(now)`` every
``autobalancer.controller.anomaly.detect.interval.ms``, and, given a failover setting (in a
cluster), a failover round every tick (:mod:`automq_ref.io.metadata.failover_contexts`), and,
given route-epoch settings (the zone router on), a route-epoch round every tick
(:mod:`automq_ref.io.metadata.route_epochs`).
Between ticks it looks every :data:`SESSION_CHECK_S` for a live broker whose session deadline
has passed, and then fences it at once, with a failover round right after: a crashed broker is
fenced within a tenth of a second of its session's end instead of up to a second after it (the
session itself is as long as before; only the wait for the next tick goes). Each fence is logged
(``session expired``, with how long after the deadline). A broker that became live or left
since the last failover round also gets a round at the next check, so that what a round
observes (the sessions a failover trace records) follows the image within a check, not a tick.
Only the active controller ticks (``is_active``): in the embedded one-node mode that is always
this process's controller; in a cluster, the broker holding the election.

A controller that was itself stalled (its process paused, its loop blocked) must not fence the
brokers whose heartbeats it could not receive meanwhile: when a tick comes much later than due,
the next expiry waits one heartbeat interval more, so every live broker has had a chance to
heartbeat since the controller resumed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from automq_ref.io.clock import Clock
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.background import stop
from automq_ref.io.metadata.client import ControllerClient, InProcessControllerClient
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.failover_contexts import FailoverSettings, run_failover_round
from automq_ref.io.metadata.failover_trace import FailoverTrace
from automq_ref.io.metadata.route_epoch_trace import RouteEpochTrace
from automq_ref.io.metadata.route_epochs import RouteEpochSettings, run_route_epoch_round
from automq_ref.state_machines import stream_metadata as sm

log = logging.getLogger(__name__)

EXPIRE_INTERVAL_S = 1.0  # the active controller's tick (sessions, drains, failover, balance)
SESSION_CHECK_S = 0.1  # how often, between ticks, it looks for a session past its deadline

LoadReporter = Callable[[], tuple[sm.PartitionLoad, ...]]


class SessionError(Exception):
    """The controller refused this broker's heartbeat."""


class BrokerSession:
    """This broker's heartbeats (see the module docstring)."""

    def __init__(
        self,
        client: ControllerClient,
        node_id: int,
        node_epoch: int,
        clock: Clock,
        interval_ms: int,
        loads: LoadReporter = lambda: (),
    ) -> None:
        self._client = client
        self.node_id = node_id
        self.node_epoch = node_epoch
        self._clock = clock
        self._interval_s = interval_ms / 1000
        self._loads = loads
        self._task: asyncio.Task[None] | None = None
        self.expired = asyncio.Event()

    def report_loads(self, loads: LoadReporter) -> None:
        """Report ``loads()`` with every heartbeat from now on."""
        self._loads = loads

    async def heartbeat(self) -> sm.Response:
        """One heartbeat; raises :class:`SessionError` when refused (and marks ``expired`` on
        ``NODE_EPOCH_EXPIRED``)."""
        response = await self._client.submit(
            sm.BrokerHeartbeat(self.node_id, self.node_epoch, self._clock.now_ms(), self._loads())
        )
        if not response.ok:
            if response.error is sm.StreamErrorCode.NODE_EPOCH_EXPIRED:
                self.expired.set()
            raise SessionError(
                f"broker {self.node_id} heartbeat: {response.error.value}: {response.message}"
            )
        return response

    def start(self) -> None:
        """Heartbeat every interval from now on (after the first, made by the caller)."""
        self._task = asyncio.create_task(self._forever(), name="broker-heartbeats")

    async def _forever(self) -> None:
        while not self.expired.is_set():
            await asyncio.sleep(self._interval_s)
            try:
                await self.heartbeat()
            except SessionError as error:
                if self.expired.is_set():
                    log.error("%s: this broker was fenced; restart it to register again", error)
                    return
                log.warning("%s", error)
            except Exception as error:  # the controller unreachable: the next one tries again
                log.warning("broker %d heartbeat failed: %s", self.node_id, error)

    async def stop_heartbeats(self) -> None:
        """Stop heartbeating without telling the controller: the session then lapses."""
        await stop(self._task)
        self._task = None

    async def shutdown(self) -> bool:
        """Stop heartbeating and tell the controller this broker is stopping (its partitions
        move now, in batches, while it still closes their streams at its epoch). True if the
        controller took it: the partitions are on their way; False if it could not be told
        (they move when the session lapses)."""
        await self.stop_heartbeats()
        if self.expired.is_set():
            return False
        try:
            response = await self._client.submit(
                sm.ControlledShutdown(self.node_id, self.node_epoch)
            )
        except Exception as error:  # stopping anyway: the session lapses instead
            log.warning("broker %d controlled shutdown failed: %s", self.node_id, error)
            return False
        if not response.ok:
            log.warning(
                "broker %d controlled shutdown refused: %s: %s",
                self.node_id,
                response.error.value,
                response.message,
            )
            return False
        return True


class ControllerTicks:
    """The active controller's periodic decisions (see the module docstring)."""

    def __init__(
        self,
        controller: Controller,
        is_active: Callable[[], bool],
        clock: Clock,
        *,
        heartbeat_interval_ms: int,
        balance_interval_ms: int | None,
        failover: FailoverSettings | None = None,
        trace: FailoverTrace | None = None,
        route_epochs: RouteEpochSettings | None = None,
        route_epoch_trace: RouteEpochTrace | None = None,
    ) -> None:
        self._controller = controller
        self._failover = failover
        self._trace = trace
        self._route_epochs = route_epochs
        self._route_epoch_trace = route_epoch_trace
        self._is_active = is_active
        self._clock = clock
        self._grace_s = heartbeat_interval_ms / 1000 + EXPIRE_INTERVAL_S
        self._balance_interval_s = (
            None if balance_interval_ms is None else balance_interval_ms / 1000
        )
        self._task: asyncio.Task[None] | None = None
        self._round_saw: frozenset[int] = frozenset()  # the live brokers at the last round

    def start(self) -> None:
        self._task = asyncio.create_task(self._forever(), name="controller-ticks")

    async def _forever(self) -> None:
        last_s = self._clock.monotonic_s()
        expire_after_s = last_s + self._grace_s
        balanced_s = last_s
        ticked_s = last_s
        while True:
            await asyncio.sleep(SESSION_CHECK_S)
            now_s = self._clock.monotonic_s()
            if now_s - last_s > 2 * EXPIRE_INTERVAL_S + 1:
                # This controller was stalled: heartbeats may be waiting to be heard.
                expire_after_s = now_s + self._grace_s
            last_s = now_s
            if not self._is_active():
                # A controller that takes over gives every live broker a fresh session (the
                # machine does), but waits a heartbeat interval for loads before balancing.
                # Its first round as the active one is a whole tick.
                expire_after_s = max(expire_after_s, now_s)
                balanced_s = now_s
                ticked_s = now_s - EXPIRE_INTERVAL_S
                continue
            may_expire = now_s >= expire_after_s
            if now_s - ticked_s >= EXPIRE_INTERVAL_S:
                ticked_s = now_s
            elif may_expire and self._session_lapsed():
                pass
            elif self._failover is not None and self._live() != self._round_saw:
                # A broker joined or left since the last round: a round now, so that what it
                # observes (the failover trace's sessions) follows within a check.
                await self._failover_round(self._failover)
                continue
            else:
                continue
            if may_expire:
                await self._expire_sessions()
            if self._failover is not None:
                await self._failover_round(self._failover)
            if self._route_epochs is not None:
                await self._route_epoch_round(self._route_epochs)
            if (
                self._balance_interval_s is not None
                and now_s - balanced_s >= self._balance_interval_s
            ):
                balanced_s = now_s
                await self._decide(sm.BalancePartitions(self._clock.now_ms()))

    def _live(self) -> frozenset[int]:
        return frozenset(broker.node_id for broker in sm.live_brokers(self._controller.image))

    def _session_lapsed(self) -> bool:
        """Whether a live broker's session deadline has passed (by the controller's clock)."""
        image = self._controller.image
        now_ms = self._clock.now_ms()
        return any(
            deadline < now_ms
            for node_id, deadline in image.sessions.items()
            if (broker := image.brokers.get(node_id)) is not None and broker.live
        )

    async def _expire_sessions(self) -> None:
        now_ms = self._clock.now_ms()
        before = self._controller.image
        deadlines = {
            broker.node_id: before.sessions.get(broker.node_id)
            for broker in sm.live_brokers(before)
        }
        await self._decide(sm.ExpireSessions(now_ms))
        after = self._controller.image
        for node_id, deadline in deadlines.items():
            broker = after.brokers.get(node_id)
            if (
                deadline is None
                or broker is None
                or broker.live
                or broker.in_controlled_shutdown
                or broker.node_epoch != before.brokers[node_id].node_epoch
            ):
                continue
            log.warning(
                "session expired %s",
                fields(
                    node_id=node_id,
                    node_epoch=before.brokers[node_id].node_epoch,
                    after_deadline_ms=now_ms - deadline,
                ),
            )

    async def _decide(self, event: sm.StreamMetadataEvent) -> None:
        try:
            await self._controller.handle(event)
        except Exception as error:  # deposed meanwhile, or the log unreachable: next tick
            log.debug("%s: %s", type(event).__name__, error)

    async def _failover_round(self, settings: FailoverSettings) -> None:
        self._round_saw = self._live()
        try:
            await run_failover_round(
                InProcessControllerClient(self._controller),
                self._controller.image,
                self._clock.now_ms(),
                settings,
                self._trace,
            )
        except Exception as error:  # deposed meanwhile, or the log unreachable: next tick
            log.debug("failover round: %s", error)

    async def _route_epoch_round(self, settings: RouteEpochSettings) -> None:
        try:
            await run_route_epoch_round(
                self._controller, self._clock.now_ms(), settings, self._route_epoch_trace
            )
        except Exception as error:  # deposed meanwhile, or the log unreachable: next tick
            log.debug("route epoch round: %s", error)

    async def close(self) -> None:
        await stop(self._task)
        self._task = None
