"""The cluster's requests: broker registration, sessions and shutdown; topics; where each
partition lives, and how it moves. Spec: specs/Placement.tla.

Brokers. ``RegisterNode`` records the broker (rack, listeners) *fenced*; its first
``BrokerHeartbeat`` unfences it. A live broker (registered, unfenced, not shutting down) keeps a
session that each heartbeat extends by Kafka's ``broker.session.timeout.ms``; ``ExpireSessions``
fences a broker whose session ended and bumps its node epoch, so every later request of that
incarnation gets ``NODE_EPOCH_EXPIRED`` (AutoMQ's node-level fencing; the failover of its WAL
acts at the bumped epoch). ``ControlledShutdown`` fences a stopping broker but keeps its epoch:
it still closes its streams, and its partitions leave it in batches (``placement.drain``,
AutoMQ's rule): the first at the request, the next at each ``ExpireSessions`` tick.
``UnregisterBroker`` removes a broker that holds no stream open.

Placement. Every partition has one broker, its *leader* (the one replica, the preferred leader),
and a *leader epoch*: the stream epoch at which that broker opens the partition's streams. A
partition moves by a ``PartitionChangeRecord`` to another live broker at the next leader epoch;
nothing else happens at the controller. The old broker, seeing the change, stops accepting,
uploads what its WAL holds for those streams and closes them; the new one opens them at the new
epoch, which the stream epochs turn into fencing of the old owner. Every change of the set of
live brokers moves partitions in the same decision (``placement`` computes where to):

- a broker leaves (fenced by its session, unregistered, re-registered after a restart): its
  partitions go to live brokers evenly, nothing else moves; with no live broker left they have
  no leader (``NO_LEADER``) until one joins;
- a broker shuts down (controlled shutdown): its partitions go the same way, in batches of
  ``max(ceil(leaders / 60), 100)`` a round, and no other decision moves them meanwhile;
- a broker joins (its first heartbeat): partitions without a leader come to live brokers, then
  it takes its share from the brokers with the most.

``CreateTopic`` and ``CreatePartitions`` write the topic's KV record (as ``PutKV`` did) and the
placement of its partitions in one decision; ``DeleteTopic`` removes both. ``ReassignPartition``
and ``ElectLeaders`` are Kafka's admin requests, one partition each. ``BalancePartitions`` is the
autobalancer's round, on the loads heartbeats reported.

Streams of a partition. A stream tagged with a partition (``CreateStream`` with ``topic_id`` and
``partition``) may be created only by the partition's broker and opened only by it, at exactly
the partition's leader epoch, and only while no other stream of the partition is open on another
broker (``STREAM_NOT_CLOSED``: the new broker waits for the old one to close them all). So a
partition's streams are open on at most one broker: its broker, or the one it is moving from
until that one closes them (``inv_one_owner_per_partition``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from automq_ref.formats.errors import FormatError
from automq_ref.formats.topic_record import Topic, decode_topic
from automq_ref.state_machines import placement
from automq_ref.state_machines.placement import PartitionKey
from automq_ref.state_machines.stream_metadata.decisions import (
    Decision,
    Outcome,
    accept,
    ignore_node,
    reject,
)
from automq_ref.state_machines.stream_metadata.events import (
    BalancePartitions,
    BrokerHeartbeat,
    ControlledShutdown,
    CreatePartitions,
    CreateStream,
    CreateTopic,
    DeleteTopic,
    ElectLeaders,
    ExpireSessions,
    OpenStream,
    ReassignPartition,
    Response,
    StreamErrorCode,
    StreamMetadataParams,
    UnregisterBroker,
)
from automq_ref.state_machines.stream_metadata.image import (
    BrokerRegistration,
    PartitionAssignment,
    ReportedLoad,
    StreamMetadata,
    StreamMetadataImage,
    TopicPlacement,
    replay_all,
)
from automq_ref.state_machines.stream_metadata.queries import (
    live_brokers,
    opening_streams,
    partition_streams,
    placed_topic,
)
from automq_ref.vocabulary.metadata_records import (
    NO_LEADER,
    NO_TOPIC,
    BrokerRegistrationChangeRecord,
    KVRecord,
    MetadataRecord,
    NodeWALMetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RemoveKVRecord,
    RemoveTopicRecord,
    StreamState,
    TopicRecord,
    UnregisterBrokerRecord,
)
from automq_ref.vocabulary.naming import topic_key

# ------------------------------------------------------------------------------ moves


def _brokers(image: StreamMetadataImage) -> list[placement.Broker]:
    return [placement.Broker(b.node_id, b.rack) for b in live_brokers(image)]


def _assignment(image: StreamMetadataImage) -> dict[PartitionKey, int]:
    return {
        (placed.topic_id, index): assignment.leader
        for placed in image.topics.values()
        for index, assignment in placed.partitions.items()
    }


def _move_records(
    image: StreamMetadataImage, moves: Mapping[PartitionKey, int]
) -> list[MetadataRecord]:
    """One PartitionChangeRecord per moved partition, at the next leader epoch."""
    records: list[MetadataRecord] = []
    for (topic_id, index), broker in sorted(moves.items()):
        current = image.topics[topic_id].partitions[index]
        if broker != current.leader:
            records.append(PartitionChangeRecord(topic_id, index, broker, current.leader_epoch + 1))
    return records


def draining(image: StreamMetadataImage) -> set[int]:
    """The brokers in controlled shutdown: their partitions stay on them until a round of
    :func:`placement.drain` moves them."""
    return {b.node_id for b in image.brokers.values() if b.in_controlled_shutdown}


def _then(
    image: StreamMetadataImage,
    records: list[MetadataRecord],
    *,
    joined: int | None = None,
    drain: bool = False,
) -> list[MetadataRecord]:
    """``records`` (a change of the live brokers) followed by the moves it calls for: the
    partitions on no live broker move to live ones, except those of brokers in controlled
    shutdown, which leave in batches (one batch each when ``drain``); a broker that ``joined``
    takes its share. A partition moves once per decision, to where it ends, one leader epoch
    up."""
    after = replay_all(image, records)
    brokers = _brokers(after)
    assignment = _assignment(after)
    held = draining(after)
    moves = placement.move_off(brokers, assignment, held)
    if drain:
        moves.update(placement.drain(brokers, {**assignment, **moves}, held))
    if joined is not None:
        loads = {key: reported.load for key, reported in image.loads.items()}
        moves.update(placement.share_with(brokers, {**assignment, **moves}, joined, loads))
    return records + _move_records(after, moves)


def departure_records(
    image: StreamMetadataImage, records: list[MetadataRecord]
) -> list[MetadataRecord]:
    """``records`` (which take brokers out of the live set), then the moves off them."""
    return _then(image, records)


def _without(sessions: Mapping[int, int], node_ids: Collection[int]) -> dict[int, int]:
    return {node_id: deadline for node_id, deadline in sessions.items() if node_id not in node_ids}


# ----------------------------------------------------------------------------- brokers


def _registration(
    image: StreamMetadataImage, node_id: int, node_epoch: int
) -> tuple[BrokerRegistration | None, Outcome | None]:
    """The broker's registration, if the request comes from the incarnation it registered: a
    registration whose node epoch was bumped since (its session lapsed) is over, and so is a
    request at another epoch than the registration's."""
    broker = image.brokers.get(node_id)
    if broker is None:
        return None, reject(
            StreamErrorCode.NODE_EPOCH_NOT_EXIST,
            f"node {node_id} has no broker registration: register again",
        )
    stored = image.nodes[node_id].node_epoch
    if node_epoch != broker.node_epoch or stored != broker.node_epoch:
        return None, reject(
            StreamErrorCode.NODE_EPOCH_EXPIRED,
            f"broker {node_id} registered at epoch {broker.node_epoch} (node epoch now {stored}), "
            f"not {node_epoch}: register again",
        )
    return broker, None


def _on_broker_heartbeat(
    image: StreamMetadataImage, event: BrokerHeartbeat, params: StreamMetadataParams
) -> Decision:
    if (ignored := ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return Decision(*ignored)
    broker, refused = _registration(image, event.node_id, event.node_epoch)
    if refused is not None:
        return Decision(*refused)
    assert broker is not None
    # The loads of partitions that are gone are dropped here, where loads are written.
    loads = {key: load for key, load in image.loads.items() if key[0] in image.topics}
    for reported in event.loads:
        key = (reported.topic_id, reported.partition)
        placed = image.topics.get(reported.topic_id)
        assignment = placed.partitions.get(reported.partition) if placed is not None else None
        # Only the partition's broker reports it: a broker it moved away from may still send
        # its old figures for a moment, and they must not overwrite the new one's.
        if assignment is not None and assignment.leader == event.node_id:
            load = placement.Load(reported.bytes_in_per_sec, reported.bytes_out_per_sec)
            loads[key] = ReportedLoad(load, event.now_ms)
    reports = {**image.reports, event.node_id: event.now_ms}
    if broker.in_controlled_shutdown:
        return Decision([], Response(fenced=True), loads=loads, reports=reports)
    sessions = {**image.sessions, event.node_id: event.now_ms + params.broker_session_timeout_ms}
    if not broker.fenced:
        return Decision([], Response(fenced=False), sessions=sessions, loads=loads, reports=reports)
    unfence: list[MetadataRecord] = [
        BrokerRegistrationChangeRecord(event.node_id, broker.node_epoch, False, False)
    ]
    records = _then(image, unfence, joined=event.node_id)
    return Decision(
        records, Response(fenced=False), sessions=sessions, loads=loads, reports=reports
    )


def _on_expire_sessions(
    image: StreamMetadataImage, event: ExpireSessions, params: StreamMetadataParams
) -> Decision:
    sessions = dict(image.sessions)
    lapsed: list[int] = []
    for broker in live_brokers(image):
        deadline = sessions.get(broker.node_id)
        if deadline is None:
            # A controller that just took over knows no session: each live broker gets a
            # whole one from now, as KRaft's new active controller gives them.
            sessions[broker.node_id] = event.now_ms + params.broker_session_timeout_ms
        elif deadline < event.now_ms:
            lapsed.append(broker.node_id)
    fence: list[MetadataRecord] = []
    for node_id in lapsed:
        node = image.nodes[node_id]
        fence.append(NodeWALMetadataRecord(node_id, node.node_epoch + 1, node.failover_mode))
        fence.append(
            BrokerRegistrationChangeRecord(node_id, image.brokers[node_id].node_epoch, True, False)
        )
    # The same tick moves the next batch off each broker in controlled shutdown.
    records = _then(image, fence, drain=True) if fence or draining(image) else []
    return Decision(records, Response(), sessions=_without(sessions, lapsed))


def _on_controlled_shutdown(image: StreamMetadataImage, event: ControlledShutdown) -> Decision:
    if (ignored := ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return Decision(*ignored)
    broker, refused = _registration(image, event.node_id, event.node_epoch)
    if refused is not None:
        return Decision(*refused)
    assert broker is not None
    if broker.in_controlled_shutdown:
        return Decision(*accept([]))
    change: list[MetadataRecord] = [
        BrokerRegistrationChangeRecord(event.node_id, broker.node_epoch, True, True)
    ]
    # The first batch of its partitions moves now, the next ones at the following ticks.
    records = _then(image, change, drain=True)
    return Decision(records, Response(), sessions=_without(image.sessions, [event.node_id]))


def _on_unregister_broker(image: StreamMetadataImage, event: UnregisterBroker) -> Decision:
    broker = image.brokers.get(event.node_id)
    if broker is None:
        return Decision(
            *reject(StreamErrorCode.NODE_EPOCH_NOT_EXIST, f"broker {event.node_id} unknown")
        )
    if opening_streams(image, event.node_id):
        return Decision(
            *reject(
                StreamErrorCode.STREAM_NOT_CLOSED,
                f"broker {event.node_id} still holds streams open",
            )
        )
    node = image.nodes[event.node_id]
    change: list[MetadataRecord] = [
        UnregisterBrokerRecord(event.node_id, broker.node_epoch),
        NodeWALMetadataRecord(event.node_id, node.node_epoch + 1, node.failover_mode),
    ]
    records = departure_records(image, change)
    return Decision(records, Response(), sessions=_without(image.sessions, [event.node_id]))


# ------------------------------------------------------------------------------ topics


def _decode(name: str, value: bytes) -> tuple[Topic | None, Outcome | None]:
    try:
        return decode_topic(name, value), None
    except FormatError as error:
        return None, reject(StreamErrorCode.INVALID_REQUEST, str(error))


def _placements(
    image: StreamMetadataImage, indexes: list[int], assignments: tuple[int, ...]
) -> tuple[list[int], Outcome | None]:
    """Brokers for the new partitions ``indexes``: the given ones (each live), or placed."""
    brokers = _brokers(image)
    if assignments:
        live = {broker.node_id for broker in brokers}
        if len(assignments) != len(indexes):
            return [], reject(
                StreamErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"{len(indexes)} new partitions, {len(assignments)} assignments",
            )
        if any(broker not in live for broker in assignments):
            return [], reject(
                StreamErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"assignments {assignments} name brokers that are not live ({sorted(live)})",
            )
        return list(assignments), None
    if not brokers:
        return [], reject(
            StreamErrorCode.INVALID_REPLICATION_FACTOR, "no live broker to place partitions on"
        )
    return list(placement.place_partitions(brokers, _assignment(image), len(indexes))), None


def _partition_records(
    topic_id: str, indexes: list[int], brokers: list[int]
) -> list[MetadataRecord]:
    return [
        PartitionRecord(topic_id, index, broker, 0)
        for index, broker in zip(indexes, brokers, strict=True)
    ]


def _on_create_topic(image: StreamMetadataImage, event: CreateTopic) -> Outcome:
    topic, refused = _decode(event.name, event.value)
    if refused is not None:
        return refused
    assert topic is not None
    existing = image.kv.get(topic_key(event.name))
    if existing is not None:
        return accept([], error=StreamErrorCode.KEY_EXIST, value=existing)
    topic_id = str(topic.topic_id)
    if topic_id in image.topics:
        return reject(StreamErrorCode.INVALID_REQUEST, f"topic id {topic_id} is taken")
    if topic.partitions < 1:
        return reject(StreamErrorCode.INVALID_PARTITIONS, f"{topic.partitions} partitions")
    indexes = list(range(topic.partitions))
    brokers, refused = _placements(image, indexes, event.assignments)
    if refused is not None:
        return refused
    records: list[MetadataRecord] = [
        KVRecord(topic_key(event.name), event.value),
        TopicRecord(topic_id, event.name),
        *_partition_records(topic_id, indexes, brokers),
    ]
    return accept(records, value=event.value)


def _on_create_partitions(image: StreamMetadataImage, event: CreatePartitions) -> Outcome:
    existing = image.kv.get(topic_key(event.name))
    if existing != event.expected:
        message = f"topic {event.name} holds " + ("no record" if existing is None else "another")
        return [], Response(
            error=StreamErrorCode.VALUE_NOT_MATCHED, message=message, value=existing
        )
    old, refused = _decode(event.name, event.expected)
    if refused is not None:
        return refused
    new, refused = _decode(event.name, event.value)
    if refused is not None:
        return refused
    assert old is not None and new is not None
    if old.topic_id != new.topic_id or new.partitions < old.partitions:
        return reject(
            StreamErrorCode.INVALID_PARTITIONS,
            f"topic {event.name}: {old.partitions} -> {new.partitions} partitions "
            f"(id {old.topic_id} -> {new.topic_id})",
        )
    topic_id = str(new.topic_id)
    placed = image.topics.get(topic_id)
    known = placed.partitions if placed is not None else {}
    indexes = [index for index in range(new.partitions) if index not in known]
    brokers: list[int] = []
    if indexes:
        brokers, refused = _placements(image, indexes, event.assignments)
        if refused is not None:
            return refused
    records: list[MetadataRecord] = []
    if event.value != existing:
        records.append(KVRecord(topic_key(event.name), event.value))
    if placed is None:
        records.append(TopicRecord(topic_id, event.name))
    records.extend(_partition_records(topic_id, indexes, brokers))
    return accept(records, value=event.value)


def _on_delete_topic(image: StreamMetadataImage, event: DeleteTopic) -> Outcome:
    existing = image.kv.get(topic_key(event.name))
    if event.expected is not None and existing != event.expected:
        message = f"topic {event.name} holds " + ("no record" if existing is None else "another")
        return [], Response(
            error=StreamErrorCode.VALUE_NOT_MATCHED, message=message, value=existing
        )
    records: list[MetadataRecord] = []
    if existing is not None:
        records.append(RemoveKVRecord(topic_key(event.name)))
    placed = placed_topic(image, event.name)
    if placed is not None:
        records.append(RemoveTopicRecord(placed.topic_id))
    return accept(records, value=existing)


# -------------------------------------------------------------------------- partitions


def _partition(
    image: StreamMetadataImage, topic: str, index: int
) -> tuple[TopicPlacement | None, PartitionAssignment | None, Outcome | None]:
    placed = placed_topic(image, topic)
    assignment = placed.partitions.get(index) if placed is not None else None
    if placed is None or assignment is None:
        refused = reject(
            StreamErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}-{index}"
        )
        return None, None, refused
    return placed, assignment, None


def _on_reassign_partition(image: StreamMetadataImage, event: ReassignPartition) -> Outcome:
    placed, assignment, refused = _partition(image, event.topic, event.partition)
    if refused is not None:
        return refused
    assert placed is not None and assignment is not None
    if event.broker not in {broker.node_id for broker in live_brokers(image)}:
        return reject(
            StreamErrorCode.INVALID_REPLICA_ASSIGNMENT, f"broker {event.broker} is not live"
        )
    if event.broker == assignment.leader:
        return accept([], leader=assignment.leader, leader_epoch=assignment.leader_epoch)
    epoch = assignment.leader_epoch + 1
    records: list[MetadataRecord] = [
        PartitionChangeRecord(placed.topic_id, event.partition, event.broker, epoch)
    ]
    return accept(records, leader=event.broker, leader_epoch=epoch)


def _on_elect_leaders(image: StreamMetadataImage, event: ElectLeaders) -> Outcome:
    placed, assignment, refused = _partition(image, event.topic, event.partition)
    if refused is not None:
        return refused
    assert placed is not None and assignment is not None
    brokers = _brokers(image)
    if assignment.leader in {broker.node_id for broker in brokers}:
        return reject(
            StreamErrorCode.ELECTION_NOT_NEEDED,
            f"{event.topic}-{event.partition} is led by broker {assignment.leader}",
        )
    if not brokers:
        return reject(StreamErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "no broker is live")
    key = (placed.topic_id, event.partition)
    moves = placement.move_off(brokers, {**_assignment(image), key: NO_LEADER})
    broker = moves[key]
    epoch = assignment.leader_epoch + 1
    records: list[MetadataRecord] = [
        PartitionChangeRecord(placed.topic_id, event.partition, broker, epoch)
    ]
    return accept(records, leader=broker, leader_epoch=epoch)


def _on_balance_partitions(
    image: StreamMetadataImage, event: BalancePartitions, params: StreamMetadataParams
) -> Outcome:
    # Only brokers that reported within the metrics delay take part, as givers or receivers
    # (AutoMQ's autobalancer.controller.metrics.delay.ms): the others' figures are outdated,
    # and a controller that just took over knows none, so it moves nothing until they report.
    since = event.now_ms - params.autobalancer_metrics_delay_ms
    brokers = [b for b in _brokers(image) if image.reports.get(b.node_id, since - 1) >= since]
    current = {b.node_id for b in brokers}
    assignment = {key: node_id for key, node_id in _assignment(image).items() if node_id in current}
    loads = {
        key: reported.load
        for key, reported in image.loads.items()
        if reported.reported_ms >= since and key in assignment
    }
    balance = params.autobalancer
    if any(load != placement.NO_LOAD for load in loads.values()):
        moves = placement.balance_loads(brokers, assignment, loads, balance)
    else:
        moves = placement.balance_counts(brokers, assignment, balance.max_moves)
    return accept(_move_records(image, moves))


# --------------------------------------------------------------------- partition streams


def ignore_partition_create(image: StreamMetadataImage, event: CreateStream) -> Outcome | None:
    """A stream tagged with a partition is created by the partition's broker only."""
    if event.topic_id == NO_TOPIC:
        return None
    placed = image.topics.get(event.topic_id)
    assignment = placed.partitions.get(event.partition) if placed is not None else None
    if assignment is None:
        return reject(
            StreamErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"no partition {event.topic_id}/{event.partition}",
        )
    if assignment.leader != event.node_id:
        return reject(
            StreamErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"partition {event.topic_id}/{event.partition} is on broker {assignment.leader}",
        )
    return None


def ignore_partition_open(
    image: StreamMetadataImage, stream: StreamMetadata, event: OpenStream
) -> Outcome | None:
    """A stream of a partition opens only on the partition's broker, at its leader epoch, and
    only while no other stream of the partition is open on another broker."""
    key = stream.partition_key
    if key is None:
        return None
    placed = image.topics.get(key[0])
    assignment = placed.partitions.get(key[1]) if placed is not None else None
    where = f"partition {key[0]}/{key[1]}"
    if assignment is None:
        return reject(StreamErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no {where}")
    if assignment.leader != event.node_id:
        return reject(
            StreamErrorCode.NOT_LEADER_OR_FOLLOWER, f"{where} is on broker {assignment.leader}"
        )
    if event.stream_epoch < assignment.leader_epoch:
        return reject(
            StreamErrorCode.FENCED_LEADER_EPOCH,
            f"{where} is at leader epoch {assignment.leader_epoch}, not {event.stream_epoch}",
        )
    if event.stream_epoch > assignment.leader_epoch:
        return reject(
            StreamErrorCode.UNKNOWN_LEADER_EPOCH,
            f"{where} is at leader epoch {assignment.leader_epoch}, not {event.stream_epoch}",
        )
    for sibling in partition_streams(image, *key):
        current = sibling.current_range
        if (
            sibling.stream_id != stream.stream_id
            and sibling.state is StreamState.OPENED
            and current is not None
            and current.node_id != event.node_id
        ):
            return reject(
                StreamErrorCode.STREAM_NOT_CLOSED,
                f"stream {sibling.stream_id} of {where} is still open on broker {current.node_id}",
            )
    return None


def with_soft_state(image: StreamMetadataImage, decision: Decision) -> StreamMetadataImage:
    """``image`` with the decision's soft state, where it changed any."""
    if decision.sessions is None and decision.loads is None and decision.reports is None:
        return image
    return replace(
        image,
        sessions=image.sessions if decision.sessions is None else decision.sessions,
        loads=image.loads if decision.loads is None else decision.loads,
        reports=image.reports if decision.reports is None else decision.reports,
    )
