"""What drives the machine and what it asks of the shell: one event per TLA+ action of
specs/Failover.tla, the effects a step produces, and the reasons a request is refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

from automq_ref.state_machines.failover.state import (
    FailoverContext,
    FailoverState,
    Reservation,
    WalEntry,
)
from automq_ref.state_machines.transition import Rejected, Transition


class FailoverError(enum.Enum):
    """Why a request is refused: the ``Rejected`` effect's error. A refusal changes nothing and
    produces no other effect."""

    NODE_NOT_RUNNING = "NODE_NOT_RUNNING"
    NODE_NOT_SERVING = "NODE_NOT_SERVING"
    NODE_NOT_DRAINING = "NODE_NOT_DRAINING"
    NODE_NOT_RECOVERING = "NODE_NOT_RECOVERING"
    NODE_NOT_STOPPED = "NODE_NOT_STOPPED"
    SESSION_NOT_ACTIVE = "SESSION_NOT_ACTIVE"
    SESSION_NOT_FENCED = "SESSION_NOT_FENCED"
    NOT_IN_GRACE = "NOT_IN_GRACE"
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
    STREAM_NOT_CLOSED = "STREAM_NOT_CLOSED"
    STREAMS_STILL_LED = "STREAMS_STILL_LED"
    APPENDS_IN_FLIGHT = "APPENDS_IN_FLIGHT"
    RECORDS_NOT_UPLOADED = "RECORDS_NOT_UPLOADED"
    UNKNOWN_RECORD = "UNKNOWN_RECORD"
    WAL_FENCED = "WAL_FENCED"
    WAL_NOT_FENCED = "WAL_NOT_FENCED"
    NOTHING_TO_UPLOAD = "NOTHING_TO_UPLOAD"
    NOTHING_TO_VERIFY = "NOTHING_TO_VERIFY"
    NOT_A_CANDIDATE = "NOT_A_CANDIDATE"
    FAILOVER_IN_FLIGHT = "FAILOVER_IN_FLIGHT"
    TARGET_NOT_AVAILABLE = "TARGET_NOT_AVAILABLE"
    NO_FAILOVER_TASK = "NO_FAILOVER_TASK"
    WRONG_STAGE = "WRONG_STAGE"
    NODE_EPOCH_EXPIRED = "NODE_EPOCH_EXPIRED"
    NODE_EPOCH_CURRENT = "NODE_EPOCH_CURRENT"
    CONTEXT_STILL_NEEDED = "CONTEXT_STILL_NEEDED"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    node_id: int


@dataclass(frozen=True, slots=True)
class ExpireSession:
    node_id: int


@dataclass(frozen=True, slots=True)
class EndGrace:
    node_id: int


@dataclass(frozen=True, slots=True)
class Crash:
    node_id: int


@dataclass(frozen=True, slots=True)
class Restart:
    node_id: int


@dataclass(frozen=True, slots=True)
class RecoverOwnWal:
    node_id: int


@dataclass(frozen=True, slots=True)
class BeginShutdown:
    node_id: int


@dataclass(frozen=True, slots=True)
class FinishShutdown:
    node_id: int


@dataclass(frozen=True, slots=True)
class OpenStream:
    node_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class CloseStream:
    node_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class AppendRecord:
    node_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class AckAppend:
    node_id: int
    record: int


@dataclass(frozen=True, slots=True)
class DetectFence:
    node_id: int


@dataclass(frozen=True, slots=True)
class UploadWal:
    node_id: int


@dataclass(frozen=True, slots=True)
class AssignFailover:
    failed_node_id: int
    target_node_id: int


@dataclass(frozen=True, slots=True)
class FenceWal:
    target_node_id: int


@dataclass(frozen=True, slots=True)
class RecoverFailedWal:
    target_node_id: int


@dataclass(frozen=True, slots=True)
class CloseFailedStreams:
    target_node_id: int


@dataclass(frozen=True, slots=True)
class AbortFailover:
    target_node_id: int


@dataclass(frozen=True, slots=True)
class ClearFailover:
    failed_node_id: int


FailoverEvent: TypeAlias = (
    Heartbeat
    | ExpireSession
    | EndGrace
    | Crash
    | Restart
    | RecoverOwnWal
    | BeginShutdown
    | FinishShutdown
    | OpenStream
    | CloseStream
    | AppendRecord
    | AckAppend
    | DetectFence
    | UploadWal
    | AssignFailover
    | FenceWal
    | RecoverFailedWal
    | CloseFailedStreams
    | AbortFailover
    | ClearFailover
)


@dataclass(frozen=True, slots=True)
class AcquireReservation:
    """Write ``wal_node_id``'s reservation (S3 WAL: PUT the reservation object; block WAL:
    attach the volume and NVMe Reservation Acquire)."""

    wal_node_id: int
    reservation: Reservation


@dataclass(frozen=True, slots=True)
class WriteWal:
    """Append the record to the node's WAL, then verify the reservation; report AckAppend or
    DetectFence."""

    node_id: int
    entry: WalEntry


@dataclass(frozen=True, slots=True)
class AcknowledgeProduce:
    node_id: int
    record: int


@dataclass(frozen=True, slots=True)
class CommitRecords:
    """Upload and commit ``records`` from ``wal_node_id``'s WAL, acting as that node."""

    wal_node_id: int
    records: frozenset[int]


@dataclass(frozen=True, slots=True)
class TrimWal:
    wal_node_id: int
    records: frozenset[int]


@dataclass(frozen=True, slots=True)
class ResetWal:
    wal_node_id: int


@dataclass(frozen=True, slots=True)
class CloseStreams:
    """closeStream for each stream, as ``node_id`` (by itself or by its failover target)."""

    node_id: int
    stream_ids: frozenset[int]


@dataclass(frozen=True, slots=True)
class HaltNode:
    node_id: int


@dataclass(frozen=True, slots=True)
class PutFailoverContext:
    context: FailoverContext


@dataclass(frozen=True, slots=True)
class RemoveFailoverContext:
    context: FailoverContext


FailoverEffect: TypeAlias = (
    AcquireReservation
    | WriteWal
    | AcknowledgeProduce
    | CommitRecords
    | TrimWal
    | ResetWal
    | CloseStreams
    | HaltNode
    | PutFailoverContext
    | RemoveFailoverContext
    | Rejected[FailoverError]
)
FailoverTransition: TypeAlias = Transition[FailoverState, FailoverEffect]
