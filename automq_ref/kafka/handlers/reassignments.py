"""AlterPartitionReassignments, ListPartitionReassignments and ElectLeaders: Kafka's admin APIs
that move partitions between brokers and elect their leaders by hand, answered through the
controller's placement (the StreamMetadata machine's ``ReassignPartition`` and ``ElectLeaders``,
read back from the metadata view).

A partition has one replica here, its broker, which is also its leader and its preferred leader:
the data is in shared storage, so no copy is made anywhere. Moving a partition is one decision of
the controller (the new broker at the next leader epoch); the old broker then closes the
partition's streams and the new one opens them. So:

- AlterPartitionReassignments takes exactly one broker per partition, a live one; more or fewer
  is ``INVALID_REPLICA_ASSIGNMENT``, and so is a broker that is not live (Kafka answers that for
  a broker it does not know). Each partition is answered on its own, once the move is durable.
- A reassignment is *in progress* from that decision until the old broker has closed the
  partition's streams: the image assigns the partition to one broker while another still holds
  them open. ListPartitionReassignments lists exactly those, as Kafka does during a move:
  ``replicas`` the target then the broker being left (Kafka's current replica set is both),
  ``adding_replicas`` the target, ``removing_replicas`` the broker being left.
- Cancelling (``replicas`` null) with nothing in progress is ``NO_REASSIGNMENT_IN_PROGRESS``, as
  Kafka answers. A move in progress cannot be cancelled: it was decided whole, at a new leader
  epoch that fences the old broker, and what remains of it is only that broker closing the
  streams, which a cancel could not stop; it is refused with ``REASSIGNMENT_IN_PROGRESS`` and a
  message saying to reassign the partition back instead (a move of its own, just as quick).
- ElectLeaders, preferred (0) or unclean (1), both elect the partition's broker: a partition whose
  broker is live needs no election (``ELECTION_NOT_NEEDED``); only a partition left without a
  live broker (none was live when its broker left) is given one by the controller, any live
  broker being as good as another when none holds data. With none live the answer is Kafka's for
  the election type: ``PREFERRED_LEADER_NOT_AVAILABLE`` or ``ELIGIBLE_LEADERS_NOT_AVAILABLE``.
  Asked for every partition (``topic_partitions`` null), the answer leaves out the partitions
  that needed no election, as Kafka's controller does.

Unknown topics and partitions are ``UNKNOWN_TOPIC_OR_PARTITION`` (ListPartitionReassignments
skips them, as Kafka does). A controller that gives no decision (none elected in time, or the
answer lost) makes the partition ``REQUEST_TIMED_OUT`` with the reason; the rest of the request
is then answered the same way without asking again, rather than waiting out the timeout once per
partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from automq_ref.errors import KafkaErrorCode
from automq_ref.io.metadata.client import ControllerClient, ControllerError
from automq_ref.kafka.handlers.authorize import AclOperation, cluster_allowed, cluster_operation
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.responses import (
    AlterPartitionReassignmentsResponse,
    ElectionPartitionResult,
    ElectLeadersResponse,
    ListPartitionReassignmentsResponse,
    OngoingPartitionReassignment,
    OngoingTopicReassignment,
    ReassignablePartitionResponse,
    ReassignableTopicResponse,
    ReplicaElectionResult,
    respond,
)
from automq_ref.kafka.server import Reply
from automq_ref.state_machines import stream_metadata as sm

PREFERRED = 0  # Kafka's ElectionType ids
UNCLEAN = 1

Outcome = tuple[KafkaErrorCode, str | None]
OK: Outcome = (KafkaErrorCode.NONE, None)

# The machine's refusals these requests can meet, by the Kafka code they are answered with (the
# machine uses Kafka's names for partitions and brokers).
_KAFKA_CODES = {
    sm.StreamErrorCode.NONE: KafkaErrorCode.NONE,
    sm.StreamErrorCode.UNKNOWN_TOPIC_OR_PARTITION: KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    sm.StreamErrorCode.INVALID_REPLICA_ASSIGNMENT: KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT,
    sm.StreamErrorCode.ELECTION_NOT_NEEDED: KafkaErrorCode.ELECTION_NOT_NEEDED,
    sm.StreamErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE: (
        KafkaErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    ),
}


class _Decisions:
    """One request's questions to the controller. After one got no decision, the others are
    answered with that failure without asking (the controller is gone or failing: each would
    wait out the same timeout)."""

    def __init__(self, client: ControllerClient) -> None:
        self._client = client
        self._failed: str | None = None

    async def decide(self, event: sm.StreamMetadataEvent) -> Outcome:
        if self._failed is not None:
            return KafkaErrorCode.REQUEST_TIMED_OUT, self._failed
        try:
            response = await self._client.submit(event)
        except ControllerError as error:
            self._failed = f"the controller gave no decision: {error}"
            return KafkaErrorCode.REQUEST_TIMED_OUT, self._failed
        code = _KAFKA_CODES.get(response.error)
        if code is None:
            return (
                KafkaErrorCode.UNKNOWN_SERVER_ERROR,
                f"the controller answered {response.error.value}: {response.message}",
            )
        if code is KafkaErrorCode.NONE:
            return OK
        return code, response.message or None


def moving_from(image: sm.StreamMetadataImage, topic: str, partition: int) -> int | None:
    """The broker a partition is being moved away from: the one still holding its streams open
    while the controller has assigned it to another broker. None when no move is in progress
    (the partition's broker holds it, nobody does yet, or it has no broker at all)."""
    placed = sm.placed_topic(image, topic)
    assignment = placed.partitions.get(partition) if placed is not None else None
    if placed is None or assignment is None or assignment.leader == sm.NO_LEADER:
        return None
    holder = sm.partition_leader(image, placed.topic_id, partition)
    return holder if holder is not None and holder != assignment.leader else None


# ------------------------------------------------------------------ AlterPartitionReassignments


@cluster_operation(AclOperation.ALTER)
async def handle_alter_partition_reassignments(context: Context, request: Request) -> Reply:
    decisions = _Decisions(context.controller_client)
    responses = []
    for topic in request.body.topics:
        partitions = []
        for asked in topic.partitions:
            index = int(asked.partition_index)
            replicas = None if asked.replicas is None else [int(b) for b in asked.replicas]
            code, message = await _reassign(context, decisions, topic.name, index, replicas)
            partitions.append(ReassignablePartitionResponse(index, code, message))
        responses.append(ReassignableTopicResponse(topic.name, partitions))
    return respond(request, AlterPartitionReassignmentsResponse(responses))


async def _reassign(
    context: Context,
    decisions: _Decisions,
    topic: str,
    index: int,
    replicas: Sequence[int] | None,
) -> Outcome:
    name = f"{topic}-{index}"
    if replicas is None:
        return _cancel(context.view.image, topic, index)
    if len(replicas) != 1:
        given = f"{len(replicas)} replicas {list(replicas)}" if replicas else "no replica"
        return (
            KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"partition {name} was given {given}: this broker keeps one replica per partition, "
            "its data being in shared storage (name exactly one broker)",
        )
    return await decisions.decide(sm.ReassignPartition(topic, index, replicas[0]))


def _cancel(image: sm.StreamMetadataImage, topic: str, index: int) -> Outcome:
    name = f"{topic}-{index}"
    assignment = sm.partition_assignment(image, topic, index)
    if assignment is None:
        return KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {name}"
    old = moving_from(image, topic, index)
    if old is None:
        message = f"no reassignment of {name} is in progress"
        return KafkaErrorCode.NO_REASSIGNMENT_IN_PROGRESS, message
    return (
        KafkaErrorCode.REASSIGNMENT_IN_PROGRESS,
        f"the move of {name} from broker {old} to broker {assignment.leader} cannot be "
        f"cancelled: it was decided whole (leader epoch {assignment.leader_epoch}) and ends as "
        f"soon as broker {old} has closed the partition, no data being copied; reassign it to "
        f"broker {old} to move it back",
    )


# ------------------------------------------------------------------- ListPartitionReassignments


@cluster_operation(AclOperation.DESCRIBE)
async def handle_list_partition_reassignments(context: Context, request: Request) -> Reply:
    image = context.view.image
    wanted: Iterable[tuple[str, Iterable[int]]]
    if request.body.topics is None:
        wanted = _every_partition(image)
    else:
        wanted = [(t.name, [int(i) for i in t.partition_indexes]) for t in request.body.topics]
    topics = []
    for name, indexes in wanted:
        placed = sm.placed_topic(image, name)
        if placed is None:
            continue
        ongoing = []
        for index in indexes:
            old = moving_from(image, name, index)
            if old is not None:
                new = placed.partitions[index].leader
                ongoing.append(OngoingPartitionReassignment(index, [new, old], [new], [old]))
        if ongoing:
            topics.append(OngoingTopicReassignment(name, ongoing))
    return respond(request, ListPartitionReassignmentsResponse(topics))


def _every_partition(image: sm.StreamMetadataImage) -> list[tuple[str, list[int]]]:
    return sorted((placed.name, sorted(placed.partitions)) for placed in image.topics.values())


# ------------------------------------------------------------------------------- ElectLeaders


async def handle_elect_leaders(context: Context, request: Request) -> Reply:
    body = request.body
    # v0 has no election type: it elects preferred leaders.
    election_type = int(getattr(body, "election_type", PREFERRED))
    asked_all = body.topic_partitions is None
    wanted = (
        _every_partition(context.view.image)
        if asked_all
        else [(t.topic, [int(p) for p in t.partitions]) for t in body.topic_partitions]
    )
    refusal: tuple[KafkaErrorCode, str | None] | None = None
    if not cluster_allowed(context, request, AclOperation.ALTER):
        refusal = KafkaErrorCode.CLUSTER_AUTHORIZATION_FAILED, None
    elif election_type not in (PREFERRED, UNCLEAN):
        invalid = f"election type {election_type}: 0 (preferred) or 1 (unclean)"
        refusal = KafkaErrorCode.INVALID_REQUEST, invalid
    if refusal is not None:
        error, message = refusal
        refused = [
            ReplicaElectionResult(
                topic, [ElectionPartitionResult(index, error, message) for index in indexes]
            )
            for topic, indexes in wanted
        ]
        return respond(request, ElectLeadersResponse([] if asked_all else refused, error))
    decisions = _Decisions(context.controller_client)
    results = []
    for topic, indexes in wanted:
        partitions = []
        for index in indexes:
            code, message = await _elect(context, decisions, topic, index, election_type)
            if asked_all and code is KafkaErrorCode.ELECTION_NOT_NEEDED:
                continue
            partitions.append(ElectionPartitionResult(index, code, message))
        if partitions:
            results.append(ReplicaElectionResult(topic, partitions))
    return respond(request, ElectLeadersResponse(results))


async def _elect(
    context: Context, decisions: _Decisions, topic: str, index: int, election_type: int
) -> Outcome:
    image = context.view.image
    assignment = sm.partition_assignment(image, topic, index)
    if assignment is None:
        return KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}-{index}"
    # The controller moves a partition off a broker in the decision that makes it not live, so
    # a broker live in this image leads the partition still, or the controller moved it since:
    # either way there is nothing to elect, and no need to ask.
    if assignment.leader in {broker.node_id for broker in sm.live_brokers(image)}:
        return (
            KafkaErrorCode.ELECTION_NOT_NEEDED,
            f"{topic}-{index} is led by broker {assignment.leader}, its one replica",
        )
    code, message = await decisions.decide(sm.ElectLeaders(topic, index))
    if code is KafkaErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE and election_type == PREFERRED:
        code = KafkaErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    return code, message
