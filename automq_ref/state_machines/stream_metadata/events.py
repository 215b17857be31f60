"""What the controller is asked and what it answers: the request events (one per TLA+ action,
plus the KV requests and the producer-id blocks), the ``Response`` every request gets and its
error codes (AutoMQ's names, and ``VALUE_NOT_MATCHED`` for a conditional KV request that lost),
the effects of a step (``AppendRecords`` then ``Respond``), and the machine's parameters.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, TypeAlias

from automq_ref.state_machines.stream_metadata.image import (
    StreamMetadataImage,
)
from automq_ref.state_machines.transition import InvariantViolation, Transition
from automq_ref.vocabulary.metadata_records import (
    MetadataRecord,
)

NO_OBJECT: Final = -1
ANY_STREAM_EPOCH: Final = -1  # a commit range that does not claim an epoch (AutoMQ sends -1)


class StreamErrorCode(enum.Enum):
    """Outcomes of controller requests, with AutoMQ's names."""

    NONE = "NONE"
    STREAM_NOT_EXIST = "STREAM_NOT_EXIST"
    STREAM_FENCED = "STREAM_FENCED"
    STREAM_NOT_OPENED = "STREAM_NOT_OPENED"
    STREAM_NOT_CLOSED = "STREAM_NOT_CLOSED"
    STREAM_INNER_ERROR = "STREAM_INNER_ERROR"
    OFFSET_NOT_MATCHED = "OFFSET_NOT_MATCHED"
    REDUNDANT_OPERATION = "REDUNDANT_OPERATION"
    OBJECT_NOT_EXIST = "OBJECT_NOT_EXIST"
    OBJECT_NOT_COMMITTED = "OBJECT_NOT_COMMITTED"
    COMPACTED_OBJECTS_NOT_FOUND = "COMPACTED_OBJECTS_NOT_FOUND"
    NODE_EPOCH_NOT_EXIST = "NODE_EPOCH_NOT_EXIST"
    NODE_EPOCH_EXPIRED = "NODE_EPOCH_EXPIRED"
    NODE_FENCED = "NODE_FENCED"
    KEY_EXIST = "KEY_EXIST"
    # A conditional KV request (``expected``) found another value under the key, or none.
    VALUE_NOT_MATCHED = "VALUE_NOT_MATCHED"
    INVALID_REQUEST = "INVALID_REQUEST"


@dataclass(frozen=True, slots=True)
class RegisterNode:
    """getOpeningStreams: a node (re)starts and asks for its epoch and its open streams.

    ``node_epoch`` is the node's proposal (its clock). The controller grants
    ``max(node_epoch, stored + 1)``, strictly above any epoch it stored for the node, so a
    restart on a clock that went backwards still fences the previous incarnation; it answers
    the granted epoch (``Response.node_epoch``), which the node then uses for everything."""

    node_id: int
    node_epoch: int  # proposed


@dataclass(frozen=True, slots=True)
class FenceNode:
    """Failover: a survivor acts for a failed node's epoch; the failed node is NODE_FENCED."""

    node_id: int
    node_epoch: int


@dataclass(frozen=True, slots=True)
class CreateStream:
    node_id: int
    node_epoch: int


@dataclass(frozen=True, slots=True)
class OpenStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class CloseStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class TrimStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int
    new_start_offset: int


@dataclass(frozen=True, slots=True)
class DeleteStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class PrepareObject:
    node_id: int
    node_epoch: int
    count: int
    ttl_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class CommitRange:
    """One stream's offsets inside a stream set object."""

    stream_id: int
    stream_epoch: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class CommitStreamObjectEntry:
    """A stream object uploaded beside a stream set object (one stream, contiguous)."""

    object_id: int
    stream_id: int
    start_offset: int
    end_offset: int
    object_size: int


@dataclass(frozen=True, slots=True)
class CommitStreamSetObject:
    node_id: int
    node_epoch: int
    object_id: int  # NO_OBJECT when the upload produced stream objects only
    order_id: int  # NO_OBJECT: the smallest order id of the compacted objects
    object_size: int
    stream_ranges: tuple[CommitRange, ...]
    stream_objects: tuple[CommitStreamObjectEntry, ...]
    compacted_object_ids: tuple[int, ...]
    failover_mode: bool
    now_ms: int


@dataclass(frozen=True, slots=True)
class CommitStreamObject:
    """Stream object compaction: ``source_object_ids`` of one stream merged into one object."""

    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int  # ANY_STREAM_EPOCH skips the ownership check, as in AutoMQ
    object_id: int
    start_offset: int
    end_offset: int
    object_size: int
    source_object_ids: tuple[int, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class ExpireObject:
    object_id: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class RemoveObject:
    """The shell deleted a destroyed object from storage; forget it."""

    object_id: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class PutKV:
    """Write ``value`` under ``key``.

    * ``overwrite=False``: put-if-absent; an existing key is answered ``KEY_EXIST`` with its
      value, and nothing is written.
    * ``overwrite=True``, ``expected=None``: an unconditional put.
    * ``expected=v``: compare-and-set: written only if the key holds exactly ``v`` now, else
      ``VALUE_NOT_MATCHED`` with the current value (None when the key is absent).
      The ``overwrite`` rule still applies, so a compare-and-set passes ``overwrite=True``."""

    key: str
    value: bytes
    overwrite: bool
    expected: bytes | None = None


@dataclass(frozen=True, slots=True)
class DeleteKV:
    """Remove ``key`` (absent: accepted, nothing written). With ``expected``: compare-and-delete,
    only if the key holds exactly ``expected`` now, else ``VALUE_NOT_MATCHED`` with the current
    value (None when the key is absent)."""

    key: str
    expected: bytes | None = None


@dataclass(frozen=True, slots=True)
class AllocateProducerIds:
    """Reserve the next ``count`` producer ids for node ``node_id``: the counter under
    ``naming.PRODUCER_ID_KEY`` (decimal, ``formats.kv_integer``; absent means 0) is read and
    advanced by ``count`` in one decision, so two nodes never get overlapping blocks. Answers
    the block's first id (``Response.first_producer_id``). The node-epoch check applies."""

    node_id: int
    node_epoch: int
    count: int


StreamMetadataEvent: TypeAlias = (
    RegisterNode
    | FenceNode
    | CreateStream
    | OpenStream
    | CloseStream
    | TrimStream
    | DeleteStream
    | PrepareObject
    | CommitStreamSetObject
    | CommitStreamObject
    | ExpireObject
    | RemoveObject
    | PutKV
    | DeleteKV
    | AllocateProducerIds
)


@dataclass(frozen=True, slots=True)
class OpeningStream:
    stream_id: int
    epoch: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class Response:
    error: StreamErrorCode = StreamErrorCode.NONE
    message: str = ""
    stream_id: int | None = None
    start_offset: int | None = None
    next_offset: int | None = None
    first_object_id: int | None = None
    opening_streams: tuple[OpeningStream, ...] = ()
    value: bytes | None = None
    node_epoch: int | None = None  # RegisterNode: the granted epoch
    first_producer_id: int | None = None  # AllocateProducerIds: the block's first id

    @property
    def ok(self) -> bool:
        return self.error in (StreamErrorCode.NONE, StreamErrorCode.REDUNDANT_OPERATION)


@dataclass(frozen=True, slots=True)
class AppendRecords:
    """Make ``records`` durable on the metadata log, as one batch. Emitted first: the image of
    the transition (these records replayed) may be published, and the response released, only
    once they are durable."""

    records: tuple[MetadataRecord, ...]


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the request. Every request gets exactly one, a refusal too (its error code)."""

    response: Response


StreamMetadataEffect: TypeAlias = AppendRecords | Respond
StreamMetadataTransition: TypeAlias = Transition[StreamMetadataImage, StreamMetadataEffect]


def records_of(transition: StreamMetadataTransition) -> tuple[MetadataRecord, ...]:
    """The records a transition appends (none for a refusal or a no-op)."""
    for effect in transition.effects:
        if isinstance(effect, AppendRecords):
            return effect.records
    return ()


def response_of(transition: StreamMetadataTransition) -> Response:
    """The answer a transition gives."""
    for effect in transition.effects:
        if isinstance(effect, Respond):
            return effect.response
    raise InvariantViolation(f"a transition without an answer: {transition.effects}")


@dataclass(frozen=True, slots=True)
class StreamMetadataParams:
    object_retention_ms: int = 60_000


DEFAULT_PARAMS: Final = StreamMetadataParams()
