"""What a handler returns, and the checks every handler module shares.

A handler decides one request on the image: it rejects it (an error code, no records) or accepts
it with the records that carry the decision. ``Outcome`` is that pair; ``Decision`` adds the
controller's soft state (broker sessions, reported loads and when) for the handlers that change it,
which
``step`` applies after the records are replayed. ``ignore_node`` is AutoMQ's node-epoch check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from automq_ref.state_machines.placement import PartitionKey
from automq_ref.state_machines.stream_metadata.events import Response, StreamErrorCode
from automq_ref.state_machines.stream_metadata.image import ReportedLoad, StreamMetadataImage
from automq_ref.vocabulary.metadata_records import MetadataRecord

Outcome: TypeAlias = tuple[list[MetadataRecord], Response]


@dataclass(frozen=True, slots=True)
class Decision:
    """Records and answer, and the soft state to keep (None: unchanged)."""

    records: list[MetadataRecord]
    response: Response
    sessions: Mapping[int, int] | None = None
    loads: Mapping[PartitionKey, ReportedLoad] | None = None
    reports: Mapping[int, int] | None = None


def reject(error: StreamErrorCode, message: str) -> Outcome:
    return [], Response(error=error, message=message)


def accept(records: list[MetadataRecord], **fields: object) -> Outcome:
    return records, Response(**fields)  # type: ignore[arg-type]


def ignore_node(
    image: StreamMetadataImage, node_id: int, node_epoch: int, *, check_failover: bool = True
) -> Outcome | None:
    """The node-epoch check applied to most requests, as AutoMQ's controller does it.

    An unregistered node is refused, a node epoch older than the stored one is expired, and a
    node that failover took over is fenced unless the request may skip that last test.
    """
    node = image.nodes.get(node_id)
    if node is None:
        return reject(StreamErrorCode.NODE_EPOCH_NOT_EXIST, f"node {node_id} is not registered")
    if node.node_epoch > node_epoch:
        return reject(
            StreamErrorCode.NODE_EPOCH_EXPIRED,
            f"node {node_id} epoch {node_epoch} is older than {node.node_epoch}",
        )
    if check_failover and node.failover_mode:
        return reject(StreamErrorCode.NODE_FENCED, f"node {node_id} was taken over by failover")
    return None
