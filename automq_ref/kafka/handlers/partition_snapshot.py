"""AutomqGetPartitionSnapshot (API key 516): a proxy's session with this broker as its main
(:mod:`automq_ref.kafka.snapshot_sessions`). Answered only with the zone router on; a broker
without it closes the connection, as for any API it does not serve."""

from __future__ import annotations

from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.server import CloseConnection, Reply
from automq_ref.kafka.snapshot_read import SnapshotPartition
from automq_ref.kafka.zones import client_zone, proxy_mapping
from automq_ref.protocol.partition_snapshot import encode_response_frame
from automq_ref.state_machines import stream_metadata as sm


async def handle_get_partition_snapshot(context: Context, request: Request) -> Reply:
    sessions = context.snapshot_sessions
    if sessions is None:
        raise CloseConnection(
            "AutomqGetPartitionSnapshot needs the zone router (automq.zonerouter.channels)",
            reason="api 516 without the zone router",
            client_id=request.client_id,
        )
    response = await sessions.handle(request.body, request.api_version)
    encoded = encode_response_frame(response, request.api_version, request.correlation_id)
    sessions.bytes_out += 4 + len(encoded)  # with the listener's size prefix
    return [encoded]


def snapshot_partition(
    context: Context, request: Request, topic: str | None, index: int
) -> SnapshotPartition | None:
    """The snapshot-read partition that answers ``request`` for ``topic``-``index`` here: with
    the zone router on, for a client in this broker's zone, when this broker is that zone's
    proxy of the partition's leader (None otherwise, or while it has no copy yet)."""
    reads = context.snapshot_reads
    config = context.config
    if reads is None or topic is None:
        return None
    zone = client_zone(request.client_id, request.peer.host, config.zone_cidr_blocks)
    if zone is None or zone != config.broker_rack:
        return None
    image = context.view.image
    assignment = sm.partition_assignment(image, topic, index)
    if assignment is None or assignment.leader == config.node_id:
        return None
    mapping = proxy_mapping(image.brokers.values())
    if mapping.proxy(zone, assignment.leader) != config.node_id:
        return None
    return reads.partition(assignment.leader, topic, index)
