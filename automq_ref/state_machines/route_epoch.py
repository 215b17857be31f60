"""Route epochs: new, fenced and committed, and when a RouterChannel may be trimmed.

Spec: specs/RouteEpoch.tla. Properties: tests/properties/test_route_epoch.py.

Theory of operation
-------------------
The zone router lets a client write to a partition led in another zone without paying for
cross-zone traffic. The client talks to a *proxy* in its own zone. The proxy appends the data to
its own *RouterChannel* (a WAL in shared storage that every node can read) and forwards a small
ZoneRouteRequest to the *main*, the partition leader. The main reads the data from the channel
and appends to its own WAL only a *Link Record* pointing into the channel; its LogCache keeps the
full data and the next upload puts the full data in object storage. Until that upload the Link
Record is the only durable trace of an acknowledged write, and it is worth nothing without the
channel data it points to (recovery and failover read the channel to turn Link Records back into
data). So **a proxy may trim channel data only after every Link Record pointing to it is in
committed storage** (``TrimSafe``).

Route epochs are how the cluster learns when that is. The controller bumps the *route* epoch
every 10 s and with it the *fenced* epoch (``route - fence_gap``), in one KV record that each
node learns at its own pace (``BumpRouteEpoch``, ``LearnRouteEpoch``). A proxy tags every write
with the newest route epoch it knows (``ForwardWrite``). A main rejects a request whose epoch is
at or below the fenced epoch *it* knows (``ReceiveRequest``: ``ROUTE_EPOCH_FENCED``), so that
after a while no new Link Record of that epoch can appear; it then waits until nothing of that
epoch or earlier is in flight, uploads its LogCache and writes that epoch as its committed route
epoch (``ReportCommittedEpoch``). The controller publishes the minimum of the reports of the
*counted* nodes as the committed epoch (``PublishCommittedEpoch``, and again at every bump); a
node that is down and has no open streams (its WAL was uploaded by a failover) is not counted,
and a counted node that never reported leaves the minimum undefined. A proxy learning a
committed epoch trims its channel up to it (the ``TrimRouterChannel`` effect of
``LearnRouteEpoch``).

Safety rests on each main's own fence check and its own report, never on proxies being up to
date: TLC checks ``TrimSafe`` with a fence gap of 1 (the design issue) and 2 (AutoMQ's). The gap
is about availability: with 1, a proxy a single bump behind its main has its writes rejected;
with 2 it must lag two bumps (``inv_no_rejection_within_one_bump``).

This machine is the whole cluster as one pure value, the way the spec sees it: the controller's
record, every node's view, report and channel trim point, and every forwarded write. The
helpers ``waiting_epoch``, ``committed_minimum`` and ``counted`` are the pieces a shell's
controller and brokers run on their own state. Each ``RouteEpochParams`` switch is a constant of
the spec; only the defaults are the protocol, the others are the spec's mutations (they let a
test replay TLC's counterexamples).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

from automq_ref.state_machines.transition import InvariantViolation as InvariantViolation
from automq_ref.state_machines.transition import Rejected as Rejected
from automq_ref.state_machines.transition import Transition as Transition

# ================================================================================== state


class RequestState(enum.Enum):
    """A forwarded write, from the main's point of view (``RequestStates`` in the spec)."""

    SENT = "SENT"  # data in the proxy's channel, ZoneRouteRequest on the wire
    REJECTED = "REJECTED"  # the main refused its epoch
    ACCEPTED = "ACCEPTED"  # in flight at the main: the channel read is issued
    APPENDED = "APPENDED"  # Link Record durable in the main's WAL; write acknowledged
    COMMITTED = "COMMITTED"  # the main's upload put the full data in object storage
    LOST = "LOST"  # the main crashed while it was in flight: never acknowledged


# Requests whose Link Record exists (or may be being made) and is not in committed storage.
LINKED_STATES: Final = frozenset({RequestState.ACCEPTED, RequestState.APPENDED})
ACCEPTED_STATES: Final = frozenset(
    {RequestState.ACCEPTED, RequestState.APPENDED, RequestState.COMMITTED, RequestState.LOST}
)


class CountRule(enum.Enum):
    """Which nodes the committed minimum is taken over (``CountRule`` in the spec)."""

    UP_OR_OPEN_STREAMS = "UpOrOpenStreams"  # AutoMQ: skip FENCED nodes with no opening streams
    UP_ONLY = "UpOnly"  # mutation: skip every FENCED node (unsafe)
    ALL = "All"  # mutation: count every node (committed can stall for ever)


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """KV ``__a_r_c/metadata``: the controller's route, fenced and committed epochs."""

    route: int
    fenced: int
    committed: int


@dataclass(frozen=True, slots=True)
class NodeState:
    view: EpochRecord  # the epoch record this node has learned
    trimmed: int  # its RouterChannel is trimmed up to this epoch
    up: bool = True  # running and heartbeating (not FENCED at the controller)
    open_streams: bool = True  # has opening streams: its WAL may hold data not yet uploaded
    reported: int | None = None  # KV __a_r_c_nce/<id>: its committed route epoch


@dataclass(frozen=True, slots=True)
class ForwardedWrite:
    """A RouterChannel entry and the ZoneRouteRequest naming it. The ``*_at_receive`` fields
    record the main's view when the request arrived (the spec checks them on the step)."""

    proxy_id: int
    main_id: int
    epoch: int
    state: RequestState = RequestState.SENT
    route_at_receive: int | None = None
    fenced_at_receive: int | None = None


@dataclass(frozen=True, slots=True)
class RouteEpochState:
    controller: EpochRecord
    nodes: Mapping[int, NodeState]
    requests: tuple[ForwardedWrite, ...] = ()  # request id = position + 1, as in the spec
    crashes: int = 0

    def request(self, request_id: int) -> ForwardedWrite | None:
        if 1 <= request_id <= len(self.requests):
            return self.requests[request_id - 1]
        return None


@dataclass(frozen=True, slots=True)
class RouteEpochParams:
    fence_gap: int = 2  # fenced = route - fence_gap (AutoMQ: 2; the design issue: 1)
    # The spec's switches; the defaults are the protocol.
    check_fence: bool = True
    wait_earlier_epochs: bool = True
    committed_monotone: bool = True
    restart_catches_up: bool = True
    count_rule: CountRule = CountRule.UP_OR_OPEN_STREAMS


DEFAULT_PARAMS: Final = RouteEpochParams()


def initial_state(
    node_ids: Iterable[int], params: RouteEpochParams = DEFAULT_PARAMS
) -> RouteEpochState:
    """AutoMQ starts at (committed, fenced, current) = (-3, -2, 0): fenced - 1, route - gap, 0."""
    fenced = -params.fence_gap
    record = EpochRecord(route=0, fenced=fenced, committed=fenced - 1)
    nodes = {node_id: NodeState(view=record, trimmed=record.committed) for node_id in node_ids}
    if not nodes:
        raise ValueError("a cluster needs at least one node")
    return RouteEpochState(controller=record, nodes=nodes)


# ================================================================================= events


@dataclass(frozen=True, slots=True)
class BumpRouteEpoch:
    """The controller's 10 s timer: route + 1, fenced + 1, committed recomputed."""


@dataclass(frozen=True, slots=True)
class PublishCommittedEpoch:
    """The controller's 1 s run between bumps: publish a higher committed minimum."""


@dataclass(frozen=True, slots=True)
class LearnRouteEpoch:
    """Node ``node_id`` replays the controller's current epoch record."""

    node_id: int


@dataclass(frozen=True, slots=True)
class ForwardWrite:
    """Proxy ``proxy_id`` appends data to its channel and forwards it to ``main_id``."""

    proxy_id: int
    main_id: int


@dataclass(frozen=True, slots=True)
class ReceiveRequest:
    """The main of request ``request_id`` handles the ZoneRouteRequest: fence check."""

    request_id: int


@dataclass(frozen=True, slots=True)
class AppendLinkRecord:
    """The main's WAL made the Link Record of request ``request_id`` durable."""

    request_id: int


@dataclass(frozen=True, slots=True)
class ReportCommittedEpoch:
    """Node ``node_id``'s CommittedEpochManager tick: upload, then report the waiting epoch."""

    node_id: int


@dataclass(frozen=True, slots=True)
class CrashNode:
    node_id: int


@dataclass(frozen=True, slots=True)
class FailoverNode:
    """A survivor uploads crashed node ``node_id``'s WAL and closes its streams."""

    node_id: int


@dataclass(frozen=True, slots=True)
class RestartNode:
    """Crashed node ``node_id`` recovers (uploads its WAL), catches up and serves again."""

    node_id: int


RouteEpochEvent: TypeAlias = (
    BumpRouteEpoch
    | PublishCommittedEpoch
    | LearnRouteEpoch
    | ForwardWrite
    | ReceiveRequest
    | AppendLinkRecord
    | ReportCommittedEpoch
    | CrashNode
    | FailoverNode
    | RestartNode
)

# ================================================================================ effects


@dataclass(frozen=True, slots=True)
class PutEpochRecord:
    """The controller writes KV ``__a_r_c/metadata``."""

    record: EpochRecord


@dataclass(frozen=True, slots=True)
class AppendRouterChannel:
    """The proxy appends the write's data to its RouterChannel, tagged with ``epoch``."""

    request_id: int
    proxy_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class SendZoneRouteRequest:
    """After the channel append: the request, with the channel offset, goes to the main."""

    request_id: int
    main_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class ReadRouterChannel:
    """The main reads the request's data from the proxy's channel."""

    request_id: int
    proxy_id: int


@dataclass(frozen=True, slots=True)
class RespondZoneRouteRequest:
    """The answer to the proxy (and so to the client): success or the error."""

    request_id: int
    error: RouteEpochError


@dataclass(frozen=True, slots=True)
class UploadWal:
    """confirmWAL.commit: the node's LogCache (full data of its Link Records) to objects."""

    node_id: int


@dataclass(frozen=True, slots=True)
class PutNodeCommittedEpoch:
    """KV ``__a_r_c_nce/<node>`` = ``epoch``, written after the upload completed."""

    node_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class TrimRouterChannel:
    """RouterChannel#trim: drop the proxy's channel data of every epoch <= ``epoch``."""

    node_id: int
    epoch: int


class RouteEpochError(enum.Enum):
    """Outcomes. ``ROUTE_EPOCH_FENCED`` is the protocol's refusal (AutoMQ fails the request with
    "The router request epoch ... is less than fenced epoch"): it is a step (the request becomes
    REJECTED) whose answer, ``RespondZoneRouteRequest``, carries the error. The others say the
    event does not apply to the state (the spec's action is not enabled): they come as a
    ``Rejected`` effect and leave the state unchanged (a stutter)."""

    NONE = "NONE"
    ROUTE_EPOCH_FENCED = "ROUTE_EPOCH_FENCED"
    NODE_DOWN = "NODE_DOWN"
    NODE_UP = "NODE_UP"
    UNKNOWN_NODE = "UNKNOWN_NODE"
    UNKNOWN_REQUEST = "UNKNOWN_REQUEST"
    WRONG_REQUEST_STATE = "WRONG_REQUEST_STATE"
    SAME_NODE = "SAME_NODE"
    NO_SURVIVOR = "NO_SURVIVOR"
    STREAMS_CLOSED = "STREAMS_CLOSED"
    NOTHING_TO_DO = "NOTHING_TO_DO"


RouteEpochEffect: TypeAlias = (
    PutEpochRecord
    | AppendRouterChannel
    | SendZoneRouteRequest
    | ReadRouterChannel
    | RespondZoneRouteRequest
    | UploadWal
    | PutNodeCommittedEpoch
    | TrimRouterChannel
    | Rejected[RouteEpochError]
)


RouteEpochTransition: TypeAlias = Transition[RouteEpochState, RouteEpochEffect]


def outcome(transition: RouteEpochTransition) -> RouteEpochError:
    """How the event ended: a refusal's error, else the error a request's answer carries
    (``ROUTE_EPOCH_FENCED``), else ``NONE``."""
    if (refused := transition.rejection) is not None:
        error: RouteEpochError = refused.error
        return error
    for effect in transition.effects:
        if isinstance(effect, RespondZoneRouteRequest):
            return effect.error
    return RouteEpochError.NONE


# ============================================================ the request lifecycle, as data


@dataclass(frozen=True, slots=True)
class RequestTransition:
    source: RequestState | None  # None: the request does not exist yet
    action: str  # the TLA+ action (and event class) that moves it
    target: RequestState
    when: str


REQUEST_TRANSITIONS: Final = (
    RequestTransition(None, "ForwardWrite", RequestState.SENT, "data in the proxy's channel"),
    RequestTransition(
        RequestState.SENT, "ReceiveRequest", RequestState.ACCEPTED, "epoch > main's fenced"
    ),
    RequestTransition(
        RequestState.SENT, "ReceiveRequest", RequestState.REJECTED, "epoch <= main's fenced"
    ),
    RequestTransition(
        RequestState.ACCEPTED, "AppendLinkRecord", RequestState.APPENDED, "Link Record durable"
    ),
    RequestTransition(RequestState.ACCEPTED, "CrashNode", RequestState.LOST, "main crashed"),
    RequestTransition(
        RequestState.APPENDED, "ReportCommittedEpoch", RequestState.COMMITTED, "main uploads"
    ),
    RequestTransition(
        RequestState.APPENDED, "FailoverNode", RequestState.COMMITTED, "survivor uploads"
    ),
    RequestTransition(
        RequestState.APPENDED, "RestartNode", RequestState.COMMITTED, "recovery uploads"
    ),
)
_ALLOWED: Final = frozenset((t.source, t.action, t.target) for t in REQUEST_TRANSITIONS)


def _move(request: ForwardedWrite, action: str, target: RequestState) -> ForwardedWrite:
    if (request.state, action, target) not in _ALLOWED:
        raise InvariantViolation(f"{action} may not move a request {request.state} -> {target}")
    return replace(request, state=target)


def request_state_diagram() -> str:
    """The request lifecycle as a mermaid state diagram, generated from REQUEST_TRANSITIONS."""
    lines = ["stateDiagram-v2"]
    for t in REQUEST_TRANSITIONS:
        source = "[*]" if t.source is None else t.source.value
        lines.append(f"    {source} --> {t.target.value}: {t.action} ({t.when})")
    return "\n".join(lines)


# ========================================================================== pure helpers


def counted(node: NodeState, rule: CountRule = CountRule.UP_OR_OPEN_STREAMS) -> bool:
    """Whether the controller's committed minimum takes this node into account.

    post: implies(node.up, __return__)
    post: implies(rule is CountRule.ALL, __return__)
    """
    match rule:
        case CountRule.UP_OR_OPEN_STREAMS:
            return node.up or node.open_streams
        case CountRule.UP_ONLY:
            return node.up
        case CountRule.ALL:
            return True


def committed_minimum(
    nodes: Mapping[int, NodeState], rule: CountRule = CountRule.UP_OR_OPEN_STREAMS
) -> int | None:
    """calCommitedEpoch: the minimum report of the counted nodes; None when a counted node has
    not reported or no node is counted.

    post: __return__ is None or all(__return__ <= n.reported for n in nodes.values() if n.up)
    """
    reports = [node.reported for node in nodes.values() if counted(node, rule)]
    if not reports or any(report is None for report in reports):
        return None
    return min(report for report in reports if report is not None)


def waiting_epoch(
    fenced: int,
    in_flight_epochs: Iterable[int],
    finished_epochs: Iterable[int] = (),
    reported: int | None = None,
    *,
    wait_earlier_epochs: bool = True,
) -> int | None:
    """The epoch a main may commit now: the largest epoch <= ``fenced`` such that no request
    of that epoch or an earlier one is in flight. With ``wait_earlier_epochs=False``, AutoMQ's
    loop as read: the largest finished epoch <= fenced that has nothing in flight itself,
    whatever earlier epochs still have in flight (else the last report).

    post: implies(wait_earlier_epochs, __return__ is not None and __return__ <= fenced)
    """
    busy = set(in_flight_epochs)
    if not busy:
        return fenced
    if wait_earlier_epochs:
        return min(fenced, min(busy) - 1)
    idle = [epoch for epoch in finished_epochs if epoch <= fenced and epoch not in busy]
    return max(idle) if idle else reported


def fenced_out(epoch: int, fenced: int) -> bool:
    """The main's check: a request of ``epoch`` is refused (``ROUTE_EPOCH_FENCED``) when the
    epoch is at or below the fenced epoch the main knows.

    post: __return__ == (epoch <= fenced)
    """
    return epoch <= fenced


def no_report_epoch(state: RouteEpochState) -> int:
    """The spec's NoReport: one below the initial committed epoch (-gap - 2)."""
    fence_gap = state.controller.route - state.controller.fenced
    return -fence_gap - 2


# ================================================================================== step


def step(
    state: RouteEpochState, event: RouteEpochEvent, params: RouteEpochParams = DEFAULT_PARAMS
) -> RouteEpochTransition:
    match event:
        case BumpRouteEpoch():
            return _on_bump_route_epoch(state, params)
        case PublishCommittedEpoch():
            return _on_publish_committed_epoch(state, params)
        case LearnRouteEpoch():
            return _on_learn_route_epoch(state, event)
        case ForwardWrite():
            return _on_forward_write(state, event)
        case ReceiveRequest():
            return _on_receive_request(state, event, params)
        case AppendLinkRecord():
            return _on_append_link_record(state, event)
        case ReportCommittedEpoch():
            return _on_report_committed_epoch(state, event, params)
        case CrashNode():
            return _on_crash_node(state, event)
        case FailoverNode():
            return _on_failover_node(state, event)
        case RestartNode():
            return _on_restart_node(state, event, params)


def _refuse(state: RouteEpochState, error: RouteEpochError) -> RouteEpochTransition:
    return Transition(state, (Rejected(error),))


def _with_node(state: RouteEpochState, node_id: int, node: NodeState) -> RouteEpochState:
    return replace(state, nodes={**state.nodes, node_id: node})


def _upload_wal(
    requests: tuple[ForwardedWrite, ...], node_id: int, action: str
) -> tuple[ForwardedWrite, ...]:
    """Every Link Record in the node's WAL becomes data in object storage."""
    return tuple(
        _move(r, action, RequestState.COMMITTED)
        if r.main_id == node_id and r.state is RequestState.APPENDED
        else r
        for r in requests
    )


def _ignore_node(state: RouteEpochState, node_id: int, *, up: bool) -> RouteEpochError | None:
    node = state.nodes.get(node_id)
    if node is None:
        return RouteEpochError.UNKNOWN_NODE
    if node.up != up:
        return RouteEpochError.NODE_DOWN if up else RouteEpochError.NODE_UP
    return None


# ------------------------------------------------------------------------------ controller


def bumped(old: EpochRecord, minimum: int | None, *, committed_monotone: bool) -> EpochRecord:
    """The epoch record after a bump, given the committed minimum of the reports.

    post: __return__.route == old.route + 1 and __return__.fenced == old.fenced + 1
    post: implies(committed_monotone, __return__.committed >= old.committed)
    post: implies(minimum is None, __return__.committed == old.committed)
    """
    if minimum is None:
        committed = old.committed
    elif committed_monotone:
        committed = max(old.committed, minimum)
    else:
        committed = minimum  # AutoMQ at a bump: the new minimum, as it is
    return EpochRecord(route=old.route + 1, fenced=old.fenced + 1, committed=committed)


def _on_bump_route_epoch(state: RouteEpochState, params: RouteEpochParams) -> RouteEpochTransition:
    minimum = committed_minimum(state.nodes, params.count_rule)
    record = bumped(state.controller, minimum, committed_monotone=params.committed_monotone)
    return Transition(replace(state, controller=record), (PutEpochRecord(record),))


def _ignore_publish_committed_epoch(
    state: RouteEpochState, params: RouteEpochParams
) -> RouteEpochError | None:
    minimum = committed_minimum(state.nodes, params.count_rule)
    if minimum is None or minimum <= state.controller.committed:
        return RouteEpochError.NOTHING_TO_DO
    return None


def _on_publish_committed_epoch(
    state: RouteEpochState, params: RouteEpochParams
) -> RouteEpochTransition:
    if (error := _ignore_publish_committed_epoch(state, params)) is not None:
        return _refuse(state, error)
    minimum = committed_minimum(state.nodes, params.count_rule)
    assert minimum is not None
    record = replace(state.controller, committed=minimum)
    return Transition(replace(state, controller=record), (PutEpochRecord(record),))


# ----------------------------------------------------------------------------------- nodes


def _on_learn_route_epoch(state: RouteEpochState, event: LearnRouteEpoch) -> RouteEpochTransition:
    if (error := _ignore_node(state, event.node_id, up=True)) is not None:
        return _refuse(state, error)
    node = state.nodes[event.node_id]
    if node.view == state.controller:
        return _refuse(state, RouteEpochError.NOTHING_TO_DO)
    node = caught_up(node, state.controller)
    # DefaultRouterChannelProvider.onChange: nextEpoch(current), then trim(committed).
    return Transition(
        _with_node(state, event.node_id, node), (TrimRouterChannel(event.node_id, node.trimmed),)
    )


def caught_up(node: NodeState, controller: EpochRecord) -> NodeState:
    """The node after it learns ``controller``: new view, channel trimmed to its committed epoch.

    post: __return__.view == controller and __return__.up == node.up
    post: __return__.trimmed >= node.trimmed and __return__.trimmed >= controller.committed
    post: __return__.trimmed in (node.trimmed, controller.committed)
    """
    return replace(node, view=controller, trimmed=max(node.trimmed, controller.committed))


def _on_forward_write(state: RouteEpochState, event: ForwardWrite) -> RouteEpochTransition:
    if event.proxy_id == event.main_id:
        return _refuse(state, RouteEpochError.SAME_NODE)
    if event.main_id not in state.nodes:
        return _refuse(state, RouteEpochError.UNKNOWN_NODE)
    if (error := _ignore_node(state, event.proxy_id, up=True)) is not None:
        return _refuse(state, error)
    epoch = state.nodes[event.proxy_id].view.route
    request = ForwardedWrite(event.proxy_id, event.main_id, epoch)
    request_id = len(state.requests) + 1
    return Transition(
        replace(state, requests=(*state.requests, request)),
        (
            AppendRouterChannel(request_id, event.proxy_id, epoch),
            SendZoneRouteRequest(request_id, event.main_id, epoch),
        ),
    )


def _ignore_request(
    state: RouteEpochState, request_id: int, expected: RequestState
) -> RouteEpochError | None:
    request = state.request(request_id)
    if request is None:
        return RouteEpochError.UNKNOWN_REQUEST
    if request.state is not expected:
        return RouteEpochError.WRONG_REQUEST_STATE
    return _ignore_node(state, request.main_id, up=True)


def _replace_request(
    state: RouteEpochState, request_id: int, request: ForwardedWrite
) -> RouteEpochState:
    requests = list(state.requests)
    requests[request_id - 1] = request
    return replace(state, requests=tuple(requests))


def _on_receive_request(
    state: RouteEpochState, event: ReceiveRequest, params: RouteEpochParams
) -> RouteEpochTransition:
    if (error := _ignore_request(state, event.request_id, RequestState.SENT)) is not None:
        return _refuse(state, error)
    request = state.requests[event.request_id - 1]
    view = state.nodes[request.main_id].view
    seen = replace(request, route_at_receive=view.route, fenced_at_receive=view.fenced)
    if params.check_fence and fenced_out(request.epoch, view.fenced):
        rejected = _move(seen, "ReceiveRequest", RequestState.REJECTED)
        return Transition(
            _replace_request(state, event.request_id, rejected),
            (RespondZoneRouteRequest(event.request_id, RouteEpochError.ROUTE_EPOCH_FENCED),),
        )
    accepted = _move(seen, "ReceiveRequest", RequestState.ACCEPTED)
    return Transition(
        _replace_request(state, event.request_id, accepted),
        (ReadRouterChannel(event.request_id, request.proxy_id),),
    )


def _on_append_link_record(state: RouteEpochState, event: AppendLinkRecord) -> RouteEpochTransition:
    if (error := _ignore_request(state, event.request_id, RequestState.ACCEPTED)) is not None:
        return _refuse(state, error)
    request = state.requests[event.request_id - 1]
    appended = _move(request, "AppendLinkRecord", RequestState.APPENDED)
    return Transition(
        _replace_request(state, event.request_id, appended),
        (RespondZoneRouteRequest(event.request_id, RouteEpochError.NONE),),
    )


def node_waiting_epoch(
    state: RouteEpochState, node_id: int, params: RouteEpochParams = DEFAULT_PARAMS
) -> int | None:
    """``waiting_epoch`` for one main, from the requests it holds."""
    node = state.nodes[node_id]
    mine = [r for r in state.requests if r.main_id == node_id]
    return waiting_epoch(
        node.view.fenced,
        (r.epoch for r in mine if r.state is RequestState.ACCEPTED),
        (r.epoch for r in mine if r.state in (RequestState.APPENDED, RequestState.COMMITTED)),
        node.reported,
        wait_earlier_epochs=params.wait_earlier_epochs,
    )


def _on_report_committed_epoch(
    state: RouteEpochState, event: ReportCommittedEpoch, params: RouteEpochParams
) -> RouteEpochTransition:
    if (error := _ignore_node(state, event.node_id, up=True)) is not None:
        return _refuse(state, error)
    node = state.nodes[event.node_id]
    epoch = node_waiting_epoch(state, event.node_id, params)
    if epoch is None or (node.reported is not None and epoch <= node.reported):
        return _refuse(state, RouteEpochError.NOTHING_TO_DO)
    requests = _upload_wal(state.requests, event.node_id, "ReportCommittedEpoch")
    state = replace(state, requests=requests)
    state = _with_node(state, event.node_id, replace(node, reported=epoch))
    # The upload completes before the report is written (commitCf.thenCompose(putKV)).
    return Transition(
        state, (UploadWal(event.node_id), PutNodeCommittedEpoch(event.node_id, epoch))
    )


def _on_crash_node(state: RouteEpochState, event: CrashNode) -> RouteEpochTransition:
    if (error := _ignore_node(state, event.node_id, up=True)) is not None:
        return _refuse(state, error)
    requests = tuple(
        _move(r, "CrashNode", RequestState.LOST)
        if r.main_id == event.node_id and r.state is RequestState.ACCEPTED
        else r
        for r in state.requests
    )
    node = replace(state.nodes[event.node_id], up=False)
    state = replace(state, requests=requests, crashes=state.crashes + 1)
    return Transition(_with_node(state, event.node_id, node))


def _on_failover_node(state: RouteEpochState, event: FailoverNode) -> RouteEpochTransition:
    if (error := _ignore_node(state, event.node_id, up=False)) is not None:
        return _refuse(state, error)
    node = state.nodes[event.node_id]
    if not node.open_streams:
        return _refuse(state, RouteEpochError.STREAMS_CLOSED)
    if not any(other.up for node_id, other in state.nodes.items() if node_id != event.node_id):
        return _refuse(state, RouteEpochError.NO_SURVIVOR)
    requests = _upload_wal(state.requests, event.node_id, "FailoverNode")
    state = replace(state, requests=requests)
    return Transition(
        _with_node(state, event.node_id, replace(node, open_streams=False)),
        (UploadWal(event.node_id),),
    )


def _on_restart_node(
    state: RouteEpochState, event: RestartNode, params: RouteEpochParams
) -> RouteEpochTransition:
    if (error := _ignore_node(state, event.node_id, up=False)) is not None:
        return _refuse(state, error)
    node = replace(state.nodes[event.node_id], up=True, open_streams=True)
    effects: list[RouteEpochEffect] = [UploadWal(event.node_id)]
    if params.restart_catches_up:
        node = caught_up(node, state.controller)
        effects.append(TrimRouterChannel(event.node_id, node.trimmed))
    requests = _upload_wal(state.requests, event.node_id, "RestartNode")
    state = replace(state, requests=requests)
    return Transition(_with_node(state, event.node_id, node), tuple(effects))


# ============================================================================ invariants


def is_trimmed(state: RouteEpochState, request: ForwardedWrite) -> bool:
    """The request's data is gone from its proxy's RouterChannel."""
    return request.epoch <= state.nodes[request.proxy_id].trimmed


def inv_trim_safe(state: RouteEpochState) -> None:
    """TrimSafe: no request whose channel data is trimmed is in flight at its main or has a
    Link Record there that is not in committed storage."""
    for request_id, request in enumerate(state.requests, start=1):
        if is_trimmed(state, request) and request.state in LINKED_STATES:
            raise InvariantViolation(
                f"request {request_id} ({request.state.value} at node {request.main_id}, epoch "
                f"{request.epoch}) points into node {request.proxy_id}'s channel, trimmed up to "
                f"{state.nodes[request.proxy_id].trimmed}"
            )


def inv_no_append_at_or_below_fenced(state: RouteEpochState) -> None:
    """NoAppendAtOrBelowFenced: every accepted request's epoch was above the fenced epoch its
    main knew when it arrived."""
    for request_id, request in enumerate(state.requests, start=1):
        if request.state not in ACCEPTED_STATES:
            continue
        fenced = request.fenced_at_receive
        if fenced is None or request.epoch <= fenced:
            raise InvariantViolation(
                f"request {request_id} of epoch {request.epoch} accepted at fenced {fenced}"
            )


def inv_epochs_ordered(state: RouteEpochState) -> None:
    """EpochsOrdered: committed <= fenced = route - gap; each view an earlier record; each report
    at most the fenced epoch the node knows; each trim at most the committed epoch it knows."""
    c = state.controller
    gap = c.route - c.fenced
    if c.committed > c.fenced:
        raise InvariantViolation(f"committed {c.committed} above fenced {c.fenced}")
    for node_id, node in state.nodes.items():
        v = node.view
        problems = [
            (v.route - v.fenced != gap, f"view gap {v.route - v.fenced} != {gap}"),
            (v.route > c.route, f"view route {v.route} ahead of {c.route}"),
            (v.committed > c.committed, f"view committed {v.committed} ahead of {c.committed}"),
            (
                node.reported is not None and node.reported > v.fenced,
                f"report {node.reported} above its fenced {v.fenced}",
            ),
            (node.trimmed > v.committed, f"trimmed {node.trimmed} above {v.committed}"),
        ]
        for broken, message in problems:
            if broken:
                raise InvariantViolation(f"node {node_id}: {message}")


def inv_no_rejection_within_one_bump(state: RouteEpochState) -> None:
    """NoRejectionWithinOneBump (availability; holds for a fence gap >= 2): a rejected request
    was at least two route epochs behind its main's view."""
    for request_id, request in enumerate(state.requests, start=1):
        if request.state is not RequestState.REJECTED:
            continue
        route = request.route_at_receive
        if route is None or request.epoch >= route - 1:
            raise InvariantViolation(
                f"request {request_id} of epoch {request.epoch} rejected by a main at route {route}"
            )


def check_epochs_never_decrease(before: RouteEpochState, after: RouteEpochState) -> None:
    """EpochsNeverDecrease (a property of steps): route, fenced, committed, every view, report
    and trim point never go down."""
    b, a = before.controller, after.controller
    if a.route < b.route or a.fenced < b.fenced or a.committed < b.committed:
        raise InvariantViolation(f"controller epochs went down: {b} -> {a}")
    for node_id, old in before.nodes.items():
        new = after.nodes[node_id]
        if new.view.route < old.view.route or new.view.committed < old.view.committed:
            raise InvariantViolation(f"node {node_id} view went down: {old.view} -> {new.view}")
        if old.reported is not None and (new.reported is None or new.reported < old.reported):
            raise InvariantViolation(f"node {node_id} report went down")
        if new.trimmed < old.trimmed:
            raise InvariantViolation(f"node {node_id} trim point went down")


INVARIANTS: Final = (inv_trim_safe, inv_no_append_at_or_below_fenced, inv_epochs_ordered)


def check_invariants(state: RouteEpochState) -> None:
    for invariant in INVARIANTS:
        invariant(state)


# ============================================================================ TLA+ trace


def _model(node_id: int) -> dict[str, object]:
    return {"model": f"n{node_id}"}


def _record(record: EpochRecord) -> dict[str, object]:
    return {
        "record": {
            "route": record.route,
            "fenced": record.fenced,
            "committed": record.committed,
        }
    }


def tla_state(state: RouteEpochState) -> dict[str, object]:
    """The spec's variables (RouteEpoch.tla) for this state, as trace JSON values. Node ``k`` is
    the model value ``nk``; a missing report is the spec's NoReport."""
    no_report = no_report_epoch(state)
    nodes = state.nodes

    def per_node(values: Mapping[int, object]) -> dict[str, object]:
        return {"fn": [[_model(node_id), values[node_id]] for node_id in sorted(nodes)]}

    return {
        "route": state.controller.route,
        "fenced": state.controller.fenced,
        "committed": state.controller.committed,
        "view": per_node({k: _record(n.view) for k, n in nodes.items()}),
        "up": per_node({k: n.up for k, n in nodes.items()}),
        "openStreams": per_node({k: n.open_streams for k, n in nodes.items()}),
        "reported": per_node(
            {k: no_report if n.reported is None else n.reported for k, n in nodes.items()}
        ),
        "trimmed": per_node({k: n.trimmed for k, n in nodes.items()}),
        "reqs": {
            "seq": [
                {
                    "record": {
                        "proxy": _model(r.proxy_id),
                        "main": _model(r.main_id),
                        "epoch": r.epoch,
                        "state": r.state.value,
                    }
                }
                for r in state.requests
            ]
        },
        "crashes": state.crashes,
    }


@dataclass(slots=True)
class TraceRecorder:
    """Collects ``{"action", "state"}`` lines of a run: ``Init`` first, then one per step."""

    lines: list[dict[str, object]] = field(default_factory=list)

    def init(self, state: RouteEpochState) -> None:
        self.lines = [{"action": "Init", "state": tla_state(state)}]

    def record(self, event: RouteEpochEvent, state: RouteEpochState) -> None:
        self.lines.append({"action": type(event).__name__, "state": tla_state(state)})
