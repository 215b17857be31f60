"""The cluster as the failover protocol sees it: the controller's sessions, contexts and stream
owners; each node's phase, WAL, reservation, in-flight appends and beliefs (the spec's
variables); and the protocol's knobs (``FailoverParams``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

NO_EPOCH: Final = -1  # a stream never opened; a node that holds no epoch of a stream


class Phase(enum.Enum):
    """A node's process, as the node itself would describe it."""

    SERVING = "SERVING"
    DRAINING = "DRAINING"  # graceful shutdown: no new appends, upload, close, stop
    RECOVERING = "RECOVERING"  # restarted: replaying its own WAL before serving
    STOPPED = "STOPPED"  # shut down gracefully
    DOWN = "DOWN"  # crashed or halted


class Session(enum.Enum):
    """The controller's view of a node's heartbeats."""

    ACTIVE = "ACTIVE"
    FENCED = "FENCED"  # the session expired, or the node registered and is not caught up yet
    STOPPED = "STOPPED"  # controlled shutdown done: not a failover candidate


class Stage(enum.Enum):
    """How far a failover target got with its task."""

    ASSIGNED = "ASSIGNED"
    FENCED = "FENCED"
    RECOVERED = "RECOVERED"


class StreamState(enum.Enum):
    CLOSED = "CLOSED"
    OPENED = "OPENED"


@dataclass(frozen=True, slots=True)
class Reservation:
    """Who may write a node's WAL: the owner at ``epoch``, or a failover target acting for it."""

    epoch: int
    failover: bool


@dataclass(frozen=True, slots=True)
class WalEntry:
    """A record in a WAL, written while its writer believed it led the stream at ``epoch``."""

    record: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class AckEntry:
    """History: a record acknowledged to its producer, by which node at which node epoch."""

    record: int
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class FailoverContext:
    """The controller's record of a failover in flight (AutoMQ: KV key ``__a.failover``)."""

    failed_node_id: int
    node_epoch: int
    target_node_id: int


@dataclass(frozen=True, slots=True)
class FailoverTask:
    """A target's own progress on a failover."""

    failed_node_id: int
    node_epoch: int
    stage: Stage
    uploaded: bool = False


@dataclass(frozen=True, slots=True)
class Completion:
    """History: a failover that closed the failed node's streams."""

    failed_node_id: int
    node_epoch: int
    uploaded: bool


@dataclass(frozen=True, slots=True)
class NodeState:
    phase: Phase = Phase.SERVING
    node_epoch: int = 0
    session: Session = Session.ACTIVE
    grace: bool = False
    reservation: Reservation = Reservation(0, False)
    wal: frozenset[WalEntry] = frozenset()
    pending: frozenset[WalEntry] = frozenset()
    # stream id -> the stream epoch the node believes it leads the stream at (absent: it does
    # not lead it). Never mutated: handlers build new dicts.
    leads: Mapping[int, int] = field(default_factory=dict)
    task: FailoverTask | None = None

    @property
    def up(self) -> bool:
        return self.phase in (Phase.SERVING, Phase.DRAINING, Phase.RECOVERING)

    @property
    def running(self) -> bool:
        """Recovered and alive: may append, upload and work as a failover target."""
        return self.phase in (Phase.SERVING, Phase.DRAINING)

    @property
    def own_reservation(self) -> Reservation:
        return Reservation(self.node_epoch, False)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    state: StreamState = StreamState.CLOSED
    owner: int | None = None
    epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class FailoverState:
    nodes: Mapping[int, NodeState]
    streams: Mapping[int, StreamInfo]
    next_record: int = 1
    acked: frozenset[AckEntry] = frozenset()
    committed: frozenset[int] = frozenset()
    contexts: frozenset[FailoverContext] = frozenset()
    completed: frozenset[Completion] = frozenset()
    zombie_acks: frozenset[int] = frozenset()

    def opened_by(self, node_id: int) -> frozenset[int]:
        return frozenset(
            stream_id
            for stream_id, stream in self.streams.items()
            if stream.state is StreamState.OPENED and stream.owner == node_id
        )

    def committable(self, node_id: int, entry: WalEntry) -> bool:
        """The controller accepts ``entry``, written by ``node_id``, into a commit."""
        stream = self.streams[entry.stream_id]
        return (
            stream.state is StreamState.OPENED
            and stream.owner == node_id
            and stream.epoch == entry.stream_epoch
        )

    def acked_records(self) -> frozenset[int]:
        return frozenset(ack.record for ack in self.acked)

    def candidate(self, node_id: int) -> bool:
        """The controller would fail this node over (given a free slot and a target)."""
        node = self.nodes[node_id]
        return node.session is Session.FENCED and not node.grace and bool(self.opened_by(node_id))


def initial_state(node_ids: Iterable[int], stream_ids: Iterable[int]) -> FailoverState:
    """Every node SERVING with an ACTIVE session at epoch 0; every stream CLOSED, never opened."""
    return FailoverState(
        nodes={node_id: NodeState() for node_id in node_ids},
        streams={stream_id: StreamInfo() for stream_id in stream_ids},
    )


@dataclass(frozen=True, slots=True)
class FailoverParams:
    """The protocol's knobs. The switches are True in the real protocol; a test turns one off
    to show the invariant it protects fails (as the spec's mutation models do)."""

    max_in_flight: int = 1
    fence_before_read: bool = True
    verify_reservation: bool = True
    open_bumps_epoch: bool = True
    upload_before_close: bool = True


DEFAULT_PARAMS: Final = FailoverParams()
