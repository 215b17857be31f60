"""Crash failover, the active controller's side: the failover contexts in the KV store, and the
round that starts and forgets them.

A context says "target node T, take over failed node N at node epoch E, whose WAL is W": AutoMQ's
``(nodeId, nodeEpoch, target, walConfig)``, stored as one JSON list under the KV key
:data:`~automq_ref.vocabulary.naming.FAILOVER_CONTEXTS_KEY` (AutoMQ's ``__a.failover``), so
that every broker's image carries it and the target learns its task by following the log
(:mod:`automq_ref.io.storage.failover_runner`).

:func:`run_failover_round` is one round on the active controller (its ticks call it about once a
second): it reads each broker's session, node epoch and OPENED streams from the image, has the
Failover machine's projection (:mod:`automq_ref.state_machines.failover.controller`) decide
which contexts to forget (the node restarted, has no stream open any more, its target left) and
which candidate to assign to whom (session lapsed, streams still OPENED, node epoch older than
``failover.new.epoch.grace.ms``, at most one in flight), and writes the new list with a
compare-and-set, so a round decided on a stale image writes nothing. With a trace
(:mod:`automq_ref.io.metadata.failover_trace`) it records the machine's steps it committed
(``ClearFailover``, ``AssignFailover``) and the session and grace changes it saw
(``ExpireSession``, ``Heartbeat``, ``EndGrace``).

The WAL named in a context is the failed node's own: each broker publishes its ``s3.wal.path``
in its registration (``BrokerRegistration.wal_config``), so the brokers of a cluster may keep
their WALs in different places. Only a WAL a survivor can reach is taken over
(:func:`survivors_can_take_over`): an object WAL (``s3://``, ``dir://``) or a block WAL on a WAL
device process (``device://``). A node whose WAL is a file or a raw device of its own is never
failed over (no survivor can read its disk): the round leaves it out, saying so once per node
epoch, and its partitions wait for it to restart. A registration written before brokers
published their WAL names none: the controller's own object WAL stands in for it
(``FailoverSettings.wal_config``), as when every broker shared that one location.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field

from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.failover_trace import FailoverTrace
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.failover import (
    AssignFailover,
    ClearFailover,
    FailoverContext,
    Session,
)
from automq_ref.state_machines.failover.controller import NodeView, failover_round, in_grace
from automq_ref.vocabulary.naming import FAILOVER_CONTEXTS_KEY

log = logging.getLogger(__name__)


# The schemes of WALs a survivor can open: object WALs and the WAL device process.
_SHARED_WAL_SCHEMES = frozenset({"s3", "dir", "device"})


@dataclass(frozen=True, slots=True)
class FailoverSettings:
    """The active controller's failover: how long a (re)started node is left to recover by
    itself (``failover.new.epoch.grace.ms``), and the WAL of a broker whose registration names
    none (the controller's own object WAL, or empty). ``skipped`` remembers the node epochs
    already reported as impossible to fail over, so each is logged once."""

    grace_ms: int
    wal_config: str = ""
    skipped: set[tuple[int, int]] = field(default_factory=set, compare=False, hash=False)


def survivors_can_take_over(wal_config: str) -> bool:
    """Whether a survivor can take over a WAL named ``wal_config`` (an ``s3.wal.path``): an
    object WAL or a WAL device process, not a file or raw device of the broker's own (a bare
    path, ``file://``), nor an empty one."""
    raw = wal_config.strip()
    if "@" in raw.split("/", 1)[0]:
        raw = raw.split("@", 1)[1]
    scheme, separator, _ = raw.partition("://")
    return bool(separator) and scheme in _SHARED_WAL_SCHEMES


def failed_node_wal(image: sm.StreamMetadataImage, node_id: int, settings: FailoverSettings) -> str:
    """The WAL node ``node_id`` published at its registration (the settings' when none)."""
    broker = image.brokers.get(node_id)
    published = broker.wal_config if broker is not None else ""
    return published or settings.wal_config


@dataclass(frozen=True, slots=True)
class StoredContext:
    """A failover in flight, as stored: the machine's context and the failed node's WAL."""

    failed_node_id: int
    node_epoch: int
    target_node_id: int
    wal_config: str

    @property
    def context(self) -> FailoverContext:
        return FailoverContext(self.failed_node_id, self.node_epoch, self.target_node_id)


def encode_contexts(contexts: list[StoredContext]) -> bytes:
    """AutoMQ's JSON fields, one object per context, in failed-node order."""
    return json.dumps(
        [
            {
                "nodeId": c.failed_node_id,
                "nodeEpoch": c.node_epoch,
                "target": c.target_node_id,
                "walConfig": c.wal_config,
            }
            for c in sorted(contexts, key=lambda c: c.failed_node_id)
        ],
        separators=(",", ":"),
    ).encode()


def decode_contexts(value: bytes | None) -> list[StoredContext]:
    """The contexts under the key (none when it is absent or does not decode)."""
    if not value:
        return []
    try:
        return [
            StoredContext(
                int(item["nodeId"]),
                int(item["nodeEpoch"]),
                int(item["target"]),
                str(item["walConfig"]),
            )
            for item in json.loads(value)
        ]
    except (ValueError, TypeError, KeyError) as error:
        log.error("failover contexts under %s do not decode: %s", FAILOVER_CONTEXTS_KEY, error)
        return []


def stored_contexts(image: sm.StreamMetadataImage) -> list[StoredContext]:
    return decode_contexts(image.kv.get(FAILOVER_CONTEXTS_KEY))


def node_views(image: sm.StreamMetadataImage, now_ms: int, grace_ms: int) -> list[NodeView]:
    """Every registered broker as the failover sees it.

    A broker in controlled shutdown is STOPPED (never failed over: it is closing its streams
    itself) unless it still holds streams open ``grace_ms`` after its last heartbeat: then it
    died while draining and is FENCED, a candidate (AutoMQ's controller likewise stops
    reporting a broker as shutting down a minute after its last controlled-shutdown
    heartbeat). A controller that took over meanwhile knows no last heartbeat and waits for
    the broker's restart."""
    views = []
    for broker in sorted(image.brokers.values(), key=lambda b: b.node_id):
        node = image.nodes.get(broker.node_id)
        node_epoch = node.node_epoch if node is not None else broker.node_epoch
        opened = frozenset(s.stream_id for s in sm.opening_streams(image, broker.node_id))
        if broker.in_controlled_shutdown:
            last = image.reports.get(broker.node_id)
            drained = not opened or last is None or now_ms - last < grace_ms
            session = Session.STOPPED if drained else Session.FENCED
        elif broker.fenced:
            session = Session.FENCED
        else:
            session = Session.ACTIVE
        views.append(
            NodeView(
                broker.node_id, node_epoch, session, in_grace(node_epoch, now_ms, grace_ms), opened
            )
        )
    return views


def traced_session(image: sm.StreamMetadataImage, view: NodeView) -> Session:
    """The session a trace records for ``view``. A broker registered and not yet heartbeaten is
    fenced at its registration's own node epoch (an expired session bumps the node epoch): it is
    starting, ACTIVE as the machine's nodes start. Recorded FENCED, the ``Heartbeat`` that ends
    it would come only at the next round, after the opens its first heartbeat already allowed."""
    broker = image.brokers.get(view.node_id)
    starting = (
        broker is not None
        and broker.fenced
        and not broker.in_controlled_shutdown
        and view.node_epoch == broker.node_epoch
    )
    return Session.ACTIVE if view.session is Session.FENCED and starting else view.session


def awaiting_failover(
    image: sm.StreamMetadataImage, now_ms: int, settings: FailoverSettings
) -> frozenset[int]:
    """The brokers whose streams a crash failover will close: the round's candidates (session
    fenced, streams still OPENED, past the grace, a WAL a survivor can reach), whether or not
    one is in flight for them yet. Read-only: nothing is logged."""
    return frozenset(
        view.node_id
        for view in node_views(image, now_ms, settings.grace_ms)
        if view.session is Session.FENCED
        and view.opened
        and not view.in_grace
        and survivors_can_take_over(failed_node_wal(image, view.node_id, settings))
    )


async def run_failover_round(
    client: ControllerClient,
    image: sm.StreamMetadataImage,
    now_ms: int,
    settings: FailoverSettings,
    trace: FailoverTrace | None = None,
) -> None:
    """One round (see the module docstring) decided on ``image``; the new contexts are written
    only if the key still holds what ``image`` showed. With ``trace``, the sessions that changed
    since the last round and the machine's steps that committed are recorded."""
    current_value = image.kv.get(FAILOVER_CONTEXTS_KEY)
    stored = decode_contexts(current_value)
    views = [
        _reachable(view, image, settings) for view in node_views(image, now_ms, settings.grace_ms)
    ]
    # The index of the image the round decides on (read before any await, with the image).
    decided_at = trace.index() if trace is not None else 0
    if trace is not None:
        trace.observe_sessions((view.node_id, traced_session(image, view)) for view in views)
        trace.observe_grace((view.node_id, view.in_grace) for view in views)
    decided = failover_round(views, [s.context for s in stored])
    if not decided.assigned and not decided.cleared:
        return
    kept = [s for s in stored if s.context in decided.contexts]
    added = [
        StoredContext(
            c.failed_node_id,
            c.node_epoch,
            c.target_node_id,
            failed_node_wal(image, c.failed_node_id, settings),
        )
        for c in decided.assigned
    ]
    contexts = kept + added
    event: sm.StreamMetadataEvent
    if contexts:
        event = sm.PutKV(
            FAILOVER_CONTEXTS_KEY, encode_contexts(contexts), True, expected=current_value
        )
    elif current_value is not None:
        event = sm.DeleteKV(FAILOVER_CONTEXTS_KEY, expected=current_value)
    else:
        return
    response = await client.submit(event)
    if not response.ok:
        log.info("failover contexts changed meanwhile: %s", response.error.value)
        return
    if trace is not None:
        # Placed right after the image the round decided on: the target acts on an image at
        # or past the write, while the index applied after the answer may already include
        # later records of other writers.
        for gone in decided.cleared:
            trace.record(ClearFailover(gone.failed_node_id), index=decided_at)
        for new in decided.assigned:
            trace.record(AssignFailover(new.failed_node_id, new.target_node_id), index=decided_at)
    for cleared in decided.cleared:
        log.info("failover context removed %s", _fields(cleared))
    for context in added:
        log.warning("failover assigned %s", _fields(context.context))


def _reachable(
    view: NodeView, image: sm.StreamMetadataImage, settings: FailoverSettings
) -> NodeView:
    """``view``, except that a fenced node whose WAL no survivor can reach shows no open
    streams: nothing of it can be failed over, so it is no candidate (and takes no turn of the
    one failover in flight from the others). Reported once it would have been a candidate
    (past its grace), once per node epoch."""
    if view.session is not Session.FENCED or not view.opened:
        return view
    wal = failed_node_wal(image, view.node_id, settings)
    if survivors_can_take_over(wal):
        return view
    if not view.in_grace and (view.node_id, view.node_epoch) not in settings.skipped:
        settings.skipped.add((view.node_id, view.node_epoch))
        log.warning(
            "failover impossible %s",
            fields(
                failed_node=view.node_id,
                node_epoch=view.node_epoch,
                wal=wal or "(none published)",
                reason="no survivor can reach this WAL; its partitions wait for the node",
            ),
        )
    return dataclasses.replace(view, opened=frozenset())


def _fields(context: FailoverContext) -> str:
    return fields(
        failed_node=context.failed_node_id,
        node_epoch=context.node_epoch,
        target=context.target_node_id,
    )
