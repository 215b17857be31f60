"""Route epochs, the active controller's side: the epoch record in the KV store, bumped every
``automq.zonerouter.route.epoch.bump.interval.ms``, and the committed epoch published from the
nodes' reports.

The record lives under :data:`~automq_ref.vocabulary.naming.ROUTE_EPOCH_KEY` (AutoMQ's
``__a_r_c/metadata``; layout in :mod:`automq_ref.formats.route_epoch_record`): committed,
fenced and current route epoch and the time of the last bump, starting at AutoMQ's
(-3, -2, 0). Every broker's image carries it, and each broker learns it by following the log
(:mod:`automq_ref.io.storage.route_epoch_node`).

:func:`run_route_epoch_round` is one round on the active controller (its ticks call it about
once a second, only while the zone router is on): it reads the record, and per registered
broker whether it is up (not fenced), whether streams are still OPENED on it, and its report
(``__a_r_c_nce/<id>``); the RouteEpoch machine's controller projection
(:func:`~automq_ref.state_machines.route_epoch_projections.controller_round`) decides a bump
when the interval has passed since the last one (``BumpRouteEpoch``: current and fenced up by
one, committed the minimum of the counted nodes' reports, never lower than before) and
otherwise whether a higher committed minimum is there to publish (``PublishCommittedEpoch``).
The record is written with a compare-and-set, so a round decided on a stale image writes
nothing. A node that is fenced with no stream open is not counted (its WAL was uploaded by a
failover or its own recovery); a counted node that never reported leaves the minimum
undefined, and the committed epoch stays where it is.

With a trace (:mod:`automq_ref.io.metadata.route_epoch_trace`) the round records what the nodes
looked like when it decided (``observe``) and the machine's step it committed, with the record
it wrote.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from automq_ref.formats.errors import FormatError
from automq_ref.formats.route_epoch_record import (
    RouteEpochRecord,
    decode_node_committed_epoch,
    decode_route_epoch_record,
    encode_route_epoch_record,
)
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.route_epoch_trace import RouteEpochTrace
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.route_epoch import DEFAULT_PARAMS, EpochRecord, RouteEpochParams
from automq_ref.state_machines.route_epoch_projections import (
    NodeView,
    controller_round,
    initial_record,
)
from automq_ref.vocabulary.naming import ROUTE_EPOCH_KEY, node_committed_route_epoch_key

log = logging.getLogger(__name__)

DEFAULT_BUMP_INTERVAL_MS = 10_000  # AutoMQ's controller bumps every 10 s


@dataclass(frozen=True, slots=True)
class RouteEpochSettings:
    """The active controller's route epochs: how often it bumps them."""

    bump_interval_ms: int = DEFAULT_BUMP_INTERVAL_MS
    params: RouteEpochParams = DEFAULT_PARAMS


def stored_record(image: sm.StreamMetadataImage) -> RouteEpochRecord | None:
    """The record under the key (None when absent or when it does not decode)."""
    value = image.kv.get(ROUTE_EPOCH_KEY)
    if value is None:
        return None
    try:
        return decode_route_epoch_record(value)
    except FormatError as error:
        log.error("route epoch record under %s does not decode: %s", ROUTE_EPOCH_KEY, error)
        return None


def epoch_record(stored: RouteEpochRecord) -> EpochRecord:
    """The machine's record for the stored one."""
    return EpochRecord(route=stored.current, fenced=stored.fenced, committed=stored.committed)


def node_report(image: sm.StreamMetadataImage, node_id: int) -> int | None:
    """Node ``node_id``'s committed route epoch in the KV (None: never reported)."""
    value = image.kv.get(node_committed_route_epoch_key(node_id))
    if value is None:
        return None
    try:
        return decode_node_committed_epoch(value)
    except FormatError as error:
        log.error("node %d's committed route epoch does not decode: %s", node_id, error)
        return None


def node_views(image: sm.StreamMetadataImage) -> list[NodeView]:
    """Every registered broker as the round sees it (module docstring)."""
    return [
        NodeView(
            broker.node_id,
            up=not broker.fenced,
            open_streams=bool(sm.opening_streams(image, broker.node_id)),
            reported=node_report(image, broker.node_id),
        )
        for broker in sorted(image.brokers.values(), key=lambda b: b.node_id)
    ]


async def run_route_epoch_round(
    controller: Controller,
    now_ms: int,
    settings: RouteEpochSettings,
    trace: RouteEpochTrace | None = None,
) -> None:
    """One round (module docstring) on ``controller``'s image, written with a compare-and-set
    through it (the active controller's own replica: the index of the write is read right
    after it, with no await in between)."""
    image = controller.image
    decided_at = controller.applied_index  # read with the image, before any await
    current_value = image.kv.get(ROUTE_EPOCH_KEY)
    stored = stored_record(image)
    if stored is None:
        if current_value is not None:
            return  # an undecodable record is logged and left for a person to look at
        first = initial_record(settings.params)
        created = RouteEpochRecord(first.committed, first.fenced, first.route, now_ms)
        await controller.handle(
            sm.PutKV(ROUTE_EPOCH_KEY, encode_route_epoch_record(created), overwrite=False)
        )
        return
    views = node_views(image)
    if trace is not None:
        trace.observe(views, index=decided_at)
    bump_due = now_ms - stored.last_bump_ms >= settings.bump_interval_ms
    decision = controller_round(
        epoch_record(stored), views, bump_due=bump_due, params=settings.params
    )
    if decision is None:
        return
    new = decision.record
    written = RouteEpochRecord(
        new.committed, new.fenced, new.route, now_ms if bump_due else stored.last_bump_ms
    )
    response = await controller.handle(
        sm.PutKV(ROUTE_EPOCH_KEY, encode_route_epoch_record(written), True, expected=current_value)
    )
    after = controller.applied_index  # no await since the write: the index just past it
    if not response.ok:
        log.info("route epoch record changed meanwhile: %s", response.error.value)
        return
    if trace is not None:
        # The machine's step is atomic; the round read its inputs at ``decided_at`` and wrote
        # at ``after``. When no other record changed those inputs in between, the step is
        # placed at the write (nodes that learn the new record learn it after it); otherwise
        # right after the image it decided on, where its inputs are exactly what it read.
        unchanged = node_views(controller.image) == views
        trace.record(
            decision.event,
            committed=unchanged,
            index=after if unchanged else decided_at,
            record=new,
        )
    log.log(
        logging.INFO if bump_due else logging.DEBUG,
        "route epoch %s %s",
        "bumped" if bump_due else "committed",
        fields(current=new.route, fenced=new.fenced, committed=new.committed),
    )
