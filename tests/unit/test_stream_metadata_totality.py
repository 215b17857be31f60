"""Totality: every event kind, in every kind of state, gives a transition, never an exception."""

from __future__ import annotations

import itertools
import uuid

import pytest

from automq_ref.formats.topic_record import Topic
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import (
    EMPTY_IMAGE,
    NO_OBJECT,
    CommitRange,
    CommitStreamObjectEntry,
    StreamErrorCode,
    StreamMetadataEvent,
    StreamMetadataImage,
)


def run(image: StreamMetadataImage, *events: StreamMetadataEvent) -> StreamMetadataImage:
    for event in events:
        transition = sm.step(image, event)
        assert sm.response_of(transition).ok, (event, transition.effects)
        image = transition.state
    return image


REGISTERED = run(EMPTY_IMAGE, sm.RegisterNode(0, 1), sm.RegisterNode(1, 1))
TOPIC = Topic("t", uuid.UUID(int=7), 2, {}).encode()
GROWN = Topic("t", uuid.UUID(int=7), 3, {}).encode()
TOPIC_ID = str(uuid.UUID(int=7))
PLACED = run(
    REGISTERED,
    sm.BrokerHeartbeat(0, 1, 1000),
    sm.BrokerHeartbeat(1, 1, 1000),
    sm.CreateTopic("t", TOPIC),
    sm.CreateStream(0, 1, TOPIC_ID, 0),
    sm.OpenStream(0, 1, 0, 0),
)
MOVED = run(PLACED, sm.ReassignPartition("t", 0, 1))
LAPSED = run(MOVED, sm.ExpireSessions(20_000))
CREATED = run(REGISTERED, sm.CreateStream(0, 1), sm.PrepareObject(0, 1, 3, 1000, 0))
OPENED = run(CREATED, sm.OpenStream(0, 1, 0, 1))
WITH_DATA = run(
    OPENED,
    sm.CommitStreamSetObject(0, 1, 0, NO_OBJECT, 10, (CommitRange(0, 1, 0, 5),), (), (), False, 1),
    sm.CommitStreamSetObject(
        0, 1, NO_OBJECT, NO_OBJECT, 0, (), (CommitStreamObjectEntry(1, 0, 5, 7, 10),), (), False, 2
    ),
)
CLOSED_AGAIN = run(WITH_DATA, sm.CloseStream(0, 1, 0, 1))
FENCED = run(WITH_DATA, sm.FenceNode(0, 1))
EXPIRED = run(WITH_DATA, sm.ExpireObject(2, 2000))
REMOVED = run(EXPIRED, sm.RemoveObject(2, 100_000))

STATES = {
    "empty": EMPTY_IMAGE,
    "registered": REGISTERED,
    "created": CREATED,
    "opened": OPENED,
    "with_data": WITH_DATA,
    "closed_again": CLOSED_AGAIN,
    "fenced": FENCED,
    "expired": EXPIRED,
    "removed": REMOVED,
    "placed": PLACED,
    "moved": MOVED,
    "lapsed": LAPSED,
}

EVENTS: dict[str, list[StreamMetadataEvent]] = {
    "RegisterNode": [
        sm.RegisterNode(0, 0),
        sm.RegisterNode(0, 2, "a", (sm.Endpoint("PLAINTEXT", "h", 1),)),
        sm.RegisterNode(9, 1),
    ],
    "FenceNode": [sm.FenceNode(0, 1), sm.FenceNode(9, 1)],
    "CreateStream": [
        sm.CreateStream(n, 1, t, p)
        for n, t, p in itertools.product((0, 1, 9), ("", TOPIC_ID, "other"), (-1, 0, 5))
    ],
    "OpenStream": [
        sm.OpenStream(n, 1, s, e) for n, s, e in itertools.product((0, 1), (0, 1, 5), (0, 1, 2))
    ],
    "CloseStream": [
        sm.CloseStream(n, 1, s, e) for n, s, e in itertools.product((0, 1), (0, 5), (1, 2))
    ],
    "TrimStream": [sm.TrimStream(0, 1, 0, 1, start) for start in (0, 3, 7, 20)],
    "DeleteStream": [sm.DeleteStream(0, 1, s, 1, 5) for s in (0, 5)],
    "PrepareObject": [sm.PrepareObject(0, 1, 1, 10, 0), sm.PrepareObject(0, 1, 0, 10, 0)],
    "CommitStreamSetObject": [
        sm.CommitStreamSetObject(0, 1, o, NO_OBJECT, 1, (CommitRange(s, 1, a, a + 2),), (), c, f, 3)
        for o, s, a, c, f in itertools.product(
            (0, 2, 9, NO_OBJECT), (0, 5), (0, 7), ((), (0,)), (False, True)
        )
    ],
    "CommitStreamObject": [
        sm.CommitStreamObject(0, 1, 0, e, o, 5, 7, 1, sources, 3)
        for e, o, sources in itertools.product((1, -1), (2, NO_OBJECT), ((1,), (0,), ()))
    ],
    "ExpireObject": [sm.ExpireObject(o, t) for o, t in itertools.product((0, 2, 9), (0, 5000))],
    "RemoveObject": [sm.RemoveObject(o, t) for o, t in itertools.product((0, 2, 9), (0, 10**6))],
    "PutKV": [
        sm.PutKV("k", b"v", overwrite, expected)
        for overwrite, expected in itertools.product((False, True), (None, b"v", b"w"))
    ],
    "DeleteKV": [sm.DeleteKV("k", expected) for expected in (None, b"v")],
    "AllocateProducerIds": [
        sm.AllocateProducerIds(n, e, c) for n, e, c in itertools.product((0, 9), (0, 1), (0, 7))
    ],
    "BrokerHeartbeat": [
        sm.BrokerHeartbeat(n, e, t, (sm.PartitionLoad(TOPIC_ID, 0, 10, 10),))
        for n, e, t in itertools.product((0, 1, 9), (0, 1, 2), (0, 30_000))
    ],
    "ExpireSessions": [sm.ExpireSessions(t) for t in (0, 5_000, 50_000)],
    "ControlledShutdown": [
        sm.ControlledShutdown(n, e) for n, e in itertools.product((0, 9), (0, 1))
    ],
    "UnregisterBroker": [sm.UnregisterBroker(n) for n in (0, 1, 9)],
    "CreateTopic": [
        sm.CreateTopic(name, value, assignments)
        for name, value, assignments in itertools.product(
            ("t", "u"), (TOPIC, b"{}", GROWN), ((), (0, 1), (9, 9), (0,))
        )
    ],
    "CreatePartitions": [
        sm.CreatePartitions(name, value, expected, assignments)
        for name, value, expected, assignments in itertools.product(
            ("t", "u"), (TOPIC, GROWN, b"{}"), (TOPIC, GROWN), ((), (1,), (9,))
        )
    ],
    "DeleteTopic": [sm.DeleteTopic(n, e) for n, e in itertools.product(("t", "u"), (None, TOPIC))],
    "ReassignPartition": [
        sm.ReassignPartition(t, p, b)
        for t, p, b in itertools.product(("t", "u"), (0, 7), (0, 1, 9))
    ],
    "ElectLeaders": [sm.ElectLeaders(t, p) for t, p in itertools.product(("t", "u"), (0, 7))],
    "BalancePartitions": [sm.BalancePartitions(t) for t in (0, 100_000)],
}


def test_every_event_class_is_covered() -> None:
    event_classes = set(StreamMetadataEvent.__args__)
    assert {cls.__name__ for cls in event_classes} == set(EVENTS)


@pytest.mark.parametrize("state_name", sorted(STATES))
@pytest.mark.parametrize("event_name", sorted(EVENTS))
def test_step_is_total(state_name: str, event_name: str) -> None:
    image = STATES[state_name]
    for event in EVENTS[event_name]:
        transition = sm.step(image, event)
        response = sm.response_of(transition)
        assert isinstance(response.error, StreamErrorCode)
        # The one shape: the records to append (if any), then the answer; the state is the
        # records replayed.
        records = sm.records_of(transition)
        expected = (sm.AppendRecords(records), sm.Respond(response)) if records else ()
        assert transition.effects == (expected or (sm.Respond(response),))
        assert transition.state == sm.replay_all(image, records)
        if not response.ok:
            assert records == () and transition.state == image
        sm.check_invariants(transition.state)
