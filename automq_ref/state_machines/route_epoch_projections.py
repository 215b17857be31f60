"""The controller's and a node's projections of the RouteEpoch machine: what a real controller
and a real broker decide about route epochs, decided by the machine's own rules.

The machine (:mod:`automq_ref.state_machines.route_epoch`) models the whole cluster; a real
process sees only its part.

- The active controller sees the epoch record in its KV and, per registered broker, whether
  it is up (not fenced), whether it still has streams open, and its last report.
  :func:`controller_round` builds a :class:`~automq_ref.state_machines.route_epoch.RouteEpochState`
  from exactly that and steps the machine's ``BumpRouteEpoch`` (when a bump is due) or
  ``PublishCommittedEpoch`` on it: the record to write is the effect the machine returns
  (``PutEpochRecord``), so the bump arithmetic, which nodes are counted and when the minimum
  is undefined are the machine's decisions (``counted``, ``committed_minimum``, ``bumped``).
- A node sees the epoch record it learned last, its own requests in flight per epoch and its
  own last report. It admits a request by the machine's fence check (:func:`admits`), learns a
  record by the machine's ``caught_up`` (:func:`learn`), and reports by the machine's
  ``waiting_epoch`` with ``wait_earlier_epochs`` on (:func:`epoch_to_report`): the largest
  epoch E at or below the fenced epoch such that nothing of E *or any earlier epoch* is in
  flight. AutoMQ's loop as read stops only at an epoch that has nothing in flight itself,
  which lets a main report E while a request of an earlier epoch is still in flight, and the
  proxy then trims that request's data (TLC's counterexample, ``MCRouteEpochNoWaitEarlier``).
  The shell runs the fixed rule.

Pure: the callers read the KV, the image and their counters, and write what these return.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from automq_ref.state_machines.route_epoch import (
    DEFAULT_PARAMS,
    BumpRouteEpoch,
    EpochRecord,
    NodeState,
    PublishCommittedEpoch,
    PutEpochRecord,
    RouteEpochParams,
    RouteEpochState,
    caught_up,
    fenced_out,
    step,
    waiting_epoch,
)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One registered broker as the controller sees it."""

    node_id: int
    up: bool  # its session is live (AutoMQ: not FENCED)
    open_streams: bool  # streams are still OPENED on it
    reported: int | None  # its committed route epoch in the KV, None before its first report


def initial_record(params: RouteEpochParams = DEFAULT_PARAMS) -> EpochRecord:
    """AutoMQ's first record: (committed, fenced, current) = (-3, -2, 0) for a gap of 2."""
    fenced = -params.fence_gap
    return EpochRecord(route=0, fenced=fenced, committed=fenced - 1)


def controller_state(record: EpochRecord, nodes: Iterable[NodeView]) -> RouteEpochState:
    """The machine's state for the controller's view: its record, and each node with the facts
    the controller's actions read (the nodes' own views and trim points play no part in
    them)."""
    return RouteEpochState(
        controller=record,
        nodes={
            n.node_id: NodeState(
                view=record,
                trimmed=record.committed,
                up=n.up,
                open_streams=n.open_streams,
                reported=n.reported,
            )
            for n in nodes
        },
    )


@dataclass(frozen=True, slots=True)
class ControllerDecision:
    event: BumpRouteEpoch | PublishCommittedEpoch
    record: EpochRecord  # what to write under the route-epoch key


def controller_round(
    record: EpochRecord,
    nodes: Iterable[NodeView],
    *,
    bump_due: bool,
    params: RouteEpochParams = DEFAULT_PARAMS,
) -> ControllerDecision | None:
    """The machine's ``BumpRouteEpoch`` when ``bump_due``, else its ``PublishCommittedEpoch``,
    on the controller's view; None when the machine refuses (nothing new to publish)."""
    event: BumpRouteEpoch | PublishCommittedEpoch = (
        BumpRouteEpoch() if bump_due else PublishCommittedEpoch()
    )
    transition = step(controller_state(record, nodes), event, params)
    if transition.rejection is not None:
        return None
    (put,) = (effect for effect in transition.effects if isinstance(effect, PutEpochRecord))
    return ControllerDecision(event, put.record)


def admits(view: EpochRecord, epoch: int) -> bool:
    """Whether a main that knows ``view`` accepts a routed request tagged ``epoch`` (the
    machine's ``ReceiveRequest``: refused, ``ROUTE_EPOCH_FENCED``, at or below fenced)."""
    return not fenced_out(epoch, view.fenced)


def learn(node: NodeState, record: EpochRecord) -> NodeState:
    """The node after it learns ``record`` (the machine's ``LearnRouteEpoch``): its view and
    its channel's trim point, which never goes down."""
    return caught_up(node, record)


def epoch_to_report(
    view: EpochRecord, in_flight: Mapping[int, int], reported: int | None
) -> int | None:
    """The machine's ``ReportCommittedEpoch`` decision for one main: its waiting epoch (the
    fixed rule, see the module docstring), when above its last report; else None.
    ``in_flight`` maps an epoch to the count of its requests in flight (zero counts allowed).

    post: __return__ is None or __return__ <= view.fenced
    post: __return__ is None or reported is None or __return__ > reported
    """
    busy = [epoch for epoch, count in in_flight.items() if count > 0]
    epoch = waiting_epoch(view.fenced, busy, wait_earlier_epochs=True)
    if epoch is None or (reported is not None and epoch <= reported):
        return None
    return epoch
