"""OffsetDelete against the Group machine, with Kafka's errors (``OffsetMetadataManager
.deleteOffsets``, ``ClassicGroup.validateOffsetDelete`` and ``isSubscribedToTopic``): an unknown
group, a non-consumer group with members, a topic the group's members subscribe to; a deletion
answered once its tombstones are durable, agreed with by a replay of the log (``recover``),
dropping commits in flight and transactional offsets held of the keys it deletes."""

from __future__ import annotations

import struct

from automq_ref.errors import KafkaErrorCode as E
from automq_ref.formats.consumer_protocol import subscription_topics
from automq_ref.state_machines import group as g
from automq_ref.state_machines.group import GroupState, Protocol
from tests.unit.test_group import Coordinator, form_group


def subscription(*topics: str, version: int = 1) -> bytes:
    """A ConsumerProtocolSubscription: version, topics, null user data (and, from version 1,
    an empty list of owned partitions)."""
    out = struct.pack(">hi", version, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    out += struct.pack(">i", -1)
    if version >= 1:
        out += struct.pack(">i", 0)
    return out


def commit(c: Coordinator, group_id: str, *keys: tuple[str, int], persist: bool = True) -> int:
    rid = c.request(
        g.OffsetCommit,
        group_id=group_id,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=tuple(g.OffsetCommitEntry(t, p, 10 + p) for t, p in keys),
    )
    if persist:
        c.apply(g.OffsetsPersisted(rid))
    return rid


def delete(c: Coordinator, group_id: str, *keys: tuple[str, int]) -> int:
    return c.request(g.OffsetDelete, group_id=group_id, partitions=keys)


def answer(c: Coordinator, rid: int) -> g.OffsetDeleteResponse:
    response = c.answers[rid]
    assert isinstance(response, g.OffsetDeleteResponse)
    return response


def test_subscription_topics_are_read_as_version_0() -> None:
    assert subscription_topics(subscription("a", "b", version=0)) == frozenset({"a", "b"})
    assert subscription_topics(subscription("a", version=3)) == frozenset({"a"})
    assert subscription_topics(b"sub-a") is None
    assert subscription_topics(struct.pack(">hi", 0, -1)) is None
    assert subscription_topics(struct.pack(">hih", 0, 1, 5) + b"ab") is None


def test_an_unknown_group_is_not_found() -> None:
    c = Coordinator()
    rid = delete(c, "nope", ("t", 0))
    assert answer(c, rid) == g.OffsetDeleteResponse(E.GROUP_ID_NOT_FOUND)
    assert not c.writes


def test_an_empty_groups_offsets_are_deleted_once_durable() -> None:
    c = Coordinator()
    commit(c, "solo", ("t", 0), ("t", 1), ("u", 0))
    rid = delete(c, "solo", ("t", 0), ("t", 7), ("u", 0))
    assert rid not in c.answers  # answered once the tombstones are durable
    write = c.writes[-1]
    # A tombstone for each offset the group holds; none for a partition it has none of.
    assert write == g.PersistOffsetDeletion(rid, "solo", (("t", 0), ("u", 0)))
    assert set(c.state.offsets["solo"]) == {("t", 1)}  # gone at once
    c.apply(g.OffsetsPersisted(rid))
    assert answer(c, rid) == g.OffsetDeleteResponse(
        E.NONE,
        (
            g.OffsetDeletePartitionResult("t", 0, E.NONE),
            g.OffsetDeletePartitionResult("t", 7, E.NONE),
            g.OffsetDeletePartitionResult("u", 0, E.NONE),
        ),
    )
    assert set(g.recover(c.writes).offsets["solo"]) == {("t", 1)}
    # Nothing left to delete: answered at once, nothing written.
    writes = len(c.writes)
    again = delete(c, "solo", ("t", 0))
    assert answer(c, again).error_code is E.NONE
    assert len(c.writes) == writes


def test_a_consumer_group_keeps_the_offsets_of_topics_it_subscribes_to() -> None:
    c = Coordinator()
    commit(c, "g", ("t", 0), ("u", 0))
    ids = [c.new_member(client=f"c{i}") for i in range(2)]
    joins = [
        c.join(m, client=f"c{i}", protocols=(Protocol("range", subscription(topic)),))
        for i, (m, topic) in enumerate(zip(ids, ("t", "v"), strict=True))
    ]
    c.tick()
    generation = c.join_response(joins[0]).generation_id
    assert c.group().subscribed_topics == frozenset({"t", "v"})
    assert c.group().state is GroupState.COMPLETING_REBALANCE
    rid = delete(c, "g", ("t", 0), ("t", 1), ("u", 0))
    c.apply(g.OffsetsPersisted(rid))
    assert answer(c, rid).partitions == (
        g.OffsetDeletePartitionResult("t", 0, E.GROUP_SUBSCRIBED_TO_TOPIC),
        g.OffsetDeletePartitionResult("t", 1, E.GROUP_SUBSCRIBED_TO_TOPIC),
        g.OffsetDeletePartitionResult("u", 0, E.NONE),
    )
    assert set(c.state.offsets["g"]) == {("t", 0)}
    # Once every member left, the group is Empty and subscribes to nothing.
    for member_id in ids:
        c.request(g.LeaveGroup, group_id="g", members=(g.LeavingMember(member_id),))
    c.tick()
    assert c.group().state is GroupState.EMPTY and c.group().subscribed_topics == frozenset()
    rid = delete(c, "g", ("t", 0))
    c.apply(g.OffsetsPersisted(rid))
    assert answer(c, rid).partitions == (g.OffsetDeletePartitionResult("t", 0, E.NONE),)
    assert generation == 1


def test_unknown_subscriptions_count_as_every_topic() -> None:
    """Metadata that does not parse (or a first generation still joining): Kafka does not
    know the topics, and a consumer group is taken to consume every one."""
    c = Coordinator()
    commit(c, "g", ("t", 0))
    form_group(c, 2)  # RANGE's metadata is not a subscription
    assert c.group().subscribed_topics is None
    rid = delete(c, "g", ("t", 0))
    assert answer(c, rid).partitions == (
        g.OffsetDeletePartitionResult("t", 0, E.GROUP_SUBSCRIBED_TO_TOPIC),
    )


def test_a_non_consumer_group_with_members_is_not_empty() -> None:
    c = Coordinator()
    member = c.new_member()
    c.request(
        g.JoinGroup,
        group_id="g",
        member_id=member,
        group_instance_id=None,
        client_id="c",
        client_host="/127.0.0.1",
        session_timeout_ms=1_000,
        rebalance_timeout_ms=5_000,
        protocol_type="connect",
        protocols=(Protocol("default", b""),),
    )
    rid = delete(c, "g", ("t", 0))
    assert answer(c, rid) == g.OffsetDeleteResponse(E.NON_EMPTY_GROUP)


def test_commits_in_flight_and_held_offsets_of_the_keys_are_dropped() -> None:
    c = Coordinator()
    in_flight = commit(c, "solo", ("t", 0), ("t", 1), persist=False)
    held = c.request(
        g.TxnOffsetCommit,
        group_id="solo",
        producer_id=7,
        producer_epoch=0,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=(g.OffsetCommitEntry("u", 0, 3),),
    )
    c.apply(g.OffsetsPersisted(held))
    rid = delete(c, "solo", ("t", 0), ("u", 0))
    # Both keys are tombstoned: one in a write in flight, one held for a marker.
    assert c.writes[-1] == g.PersistOffsetDeletion(rid, "solo", (("t", 0), ("u", 0)))
    assert not g.unstable_offset(c.state, "solo", ("u", 0))
    c.apply(g.OffsetsPersisted(in_flight))
    c.apply(g.OffsetsPersisted(rid))
    c.apply(g.TxnMarker(7, commit=True))
    log: list[g.DurableRecord | g.TxnMarker] = [*c.writes, g.TxnMarker(7, commit=True)]
    assert set(c.state.offsets["solo"]) == {("t", 1)}
    assert set(g.recover(log).offsets["solo"]) == {("t", 1)}


def test_a_failed_write_answers_coordinator_not_available() -> None:
    c = Coordinator()
    commit(c, "solo", ("t", 0))
    rid = delete(c, "solo", ("t", 0))
    c.apply(g.OffsetsPersistFailed(rid))
    assert answer(c, rid) == g.OffsetDeleteResponse(E.COORDINATOR_NOT_AVAILABLE)


def test_a_request_id_in_flight_is_refused() -> None:
    c = Coordinator()
    commit(c, "solo", ("t", 0), ("t", 1))
    rid = delete(c, "solo", ("t", 0))
    c.apply(g.OffsetDelete(rid, c.now_ms, "solo", (("t", 1),)))
    assert c.refusals and c.refusals[-1].error is E.INVALID_REQUEST
