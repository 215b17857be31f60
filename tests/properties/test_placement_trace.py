"""Trace validation of Placement: runs of the Python machine are behaviours of the TLA+ spec.

Brokers, topics and partition streams are driven through the real StreamMetadata ``step`` (a
scripted scenario, and the runs of ``PlacementMachine`` from test_placement.py), each run is
recorded as a trace -- ``tla_placement_state`` of the image after every request, labelled with
its TLA+ action by ``tla_placement_action`` -- and TLC checks, through specs/trace_validate.py,
that some behaviour of specs/Placement.tla produces exactly those observed states with exactly
those actions (a refused request, or one that changes only the controller's soft state, is a
stutter). Deliberately broken traces must be rejected at the line that breaks them.
docs/trace_validation.md explains the method; each TLC run costs a JVM start, so the traces are
validated in one batch.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from automq_ref.formats.topic_record import Topic
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import (
    EMPTY_IMAGE,
    BrokerHeartbeat,
    CloseStream,
    ControlledShutdown,
    CreatePartitions,
    CreateStream,
    CreateTopic,
    ExpireSessions,
    OpenStream,
    PartitionChangeRecord,
    ReassignPartition,
    RegisterNode,
    StreamMetadataEvent,
    StreamMetadataImage,
    UnregisterBroker,
)
from tests.properties.test_placement import PARAMS, PlacementMachine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="TLC needs a Java runtime")

SPEC = "Placement"
E = sm.StreamErrorCode
TOPIC_ID = str(uuid.UUID(int=42))


class TraceRecorder:
    """Drives ``step`` and keeps the trace: the Init line, then one line per request."""

    def __init__(self) -> None:
        self.image: StreamMetadataImage = EMPTY_IMAGE
        self.lines = [tv.TraceLine("Init", sm.tla_placement_state(self.image))]

    def apply(self, event: StreamMetadataEvent) -> sm.Response:
        transition = sm.step(self.image, event, PARAMS)
        self.image = transition.state
        line = tv.TraceLine(sm.tla_placement_action(event), sm.tla_placement_state(self.image))
        self.lines.append(line)
        return sm.response_of(transition)

    def ok(self, event: StreamMetadataEvent) -> sm.Response:
        response = self.apply(event)
        assert response.ok, (event, response)
        return response

    def answers(self, event: StreamMetadataEvent, error: sm.StreamErrorCode) -> None:
        response = self.apply(event)
        assert response.error is error, (event, response)

    def forge(self, action: str, records: list[sm.MetadataRecord]) -> None:
        """A step a broken controller could take: these records, replayed, labelled ``action``."""
        self.image = sm.replay_all(self.image, records)
        self.lines.append(tv.TraceLine(action, sm.tla_placement_state(self.image)))


def topic(partitions: int) -> bytes:
    return Topic("t", uuid.UUID(TOPIC_ID), partitions, {}).encode()


def scenario() -> TraceRecorder:
    """Three brokers join; a topic of two partitions, streams opened; a move by hand completes
    (the new broker waits for the old to close); a session lapses and its partition moves (its
    streams closed by failover acting at the bumped epoch); a controlled shutdown; an
    unregistration refused while streams are open; a broker restarts."""
    r = TraceRecorder()
    for node_id in (0, 1):
        r.ok(RegisterNode(node_id, 0, "a"))
        r.ok(BrokerHeartbeat(node_id, 0, 1_000))
    r.ok(CreateTopic("t", topic(2)))
    leaders = {i: leader_of(r.image, i) for i in (0, 1)}
    assert sorted(leaders.values()) == [0, 1]  # evenly
    for index, leader in leaders.items():
        r.ok(CreateStream(leader, 0, TOPIC_ID, index))
    r.answers(CreateStream(leaders[0] ^ 1, 0, TOPIC_ID, 0), E.NOT_LEADER_OR_FOLLOWER)
    r.ok(OpenStream(leaders[0], 0, 0, 0))
    r.ok(OpenStream(leaders[1], 0, 1, 0))
    # Broker 2 joins: it takes one partition (counts 1, 1, 0 -> nothing to share below two).
    r.ok(RegisterNode(2, 0, "b"))
    r.ok(BrokerHeartbeat(2, 0, 2_000))
    # A move by hand: partition 0 to broker 2; broker 2 waits for the old broker to close.
    r.ok(ReassignPartition("t", 0, 2))
    r.answers(OpenStream(2, 0, 0, 0), E.FENCED_LEADER_EPOCH)
    r.answers(OpenStream(2, 0, 0, 1), E.STREAM_NOT_CLOSED)
    r.answers(OpenStream(leaders[0], 0, 0, 1), E.NOT_LEADER_OR_FOLLOWER)
    r.ok(CloseStream(leaders[0], 0, 0, 0))
    r.ok(OpenStream(2, 0, 0, 1))
    # Broker 2 creates a second stream of partition 0, at the same leader epoch.
    r.ok(CreateStream(2, 0, TOPIC_ID, 0))
    r.ok(OpenStream(2, 0, 2, 1))
    # Heartbeats: 0 and 2 stay alive; broker 1 goes silent and its session lapses.
    r.ok(BrokerHeartbeat(0, 0, 9_000))
    r.ok(BrokerHeartbeat(2, 0, 9_000))
    r.ok(ExpireSessions(10_500))
    assert r.image.brokers[1].fenced and r.image.nodes[1].node_epoch == 1
    r.answers(BrokerHeartbeat(1, 0, 10_600), E.NODE_EPOCH_EXPIRED)
    moved_to = leader_of(r.image, 1)
    assert moved_to in (0, 2)
    # Failover closes broker 1's stream as broker 1, at its bumped epoch; the new broker opens.
    r.answers(OpenStream(moved_to, 0, 1, 1), E.STREAM_NOT_CLOSED)
    r.ok(CloseStream(1, 1, 1, 0))
    r.ok(OpenStream(moved_to, 0, 1, 1))
    r.answers(UnregisterBroker(2), E.STREAM_NOT_CLOSED)
    # Broker 2 shuts down: its partitions move at once; it closes, the new broker opens.
    r.ok(ControlledShutdown(2, 0))
    r.ok(BrokerHeartbeat(2, 0, 11_000))  # still fenced: nothing changes
    assert leader_of(r.image, 0) == 0
    r.ok(CloseStream(2, 0, 0, 1))
    r.ok(CloseStream(2, 0, 2, 1))
    r.ok(OpenStream(0, 0, 0, 2))
    r.ok(OpenStream(0, 0, 2, 2))
    r.ok(UnregisterBroker(2))
    # Broker 1 restarts, joins again and takes its share.
    r.ok(RegisterNode(1, 0, "a"))
    r.ok(BrokerHeartbeat(1, 2, 12_000))
    assert sorted(leader for _, _, leader in _leaders(r.image)) == [0, 1]
    r.ok(CreatePartitions("t", topic(3), topic(2)))
    r.ok(ExpireSessions(13_000))  # both still in their sessions: a stutter
    return r


def leader_of(image: StreamMetadataImage, index: int) -> int:
    leader = sm.assigned_broker(image, "t", index)
    assert leader is not None
    return leader


def _leaders(image: StreamMetadataImage) -> list[tuple[str, int, int]]:
    return [
        (placed.name, index, assignment.leader)
        for placed in image.topics.values()
        for index, assignment in placed.partitions.items()
    ]


def broken_move_without_epoch_bump() -> list[tv.TraceLine]:
    """A controller that moves a partition without raising its leader epoch."""
    r = TraceRecorder()
    for node_id in (0, 1):
        r.ok(RegisterNode(node_id, 0, "a"))
        r.ok(BrokerHeartbeat(node_id, 0, 1_000))
    r.ok(CreateTopic("t", topic(1)))
    leader = leader_of(r.image, 0)
    r.forge("ReassignPartition", [PartitionChangeRecord(TOPIC_ID, 0, leader ^ 1, 0)])
    return r.lines


def broken_mislabelled() -> list[tv.TraceLine]:
    """A reassignment labelled as a close: no close changes the leader of a partition."""
    lines = scenario().lines
    index = next(i for i, line in enumerate(lines) if line.action == "ReassignPartition")
    return [*lines[:index], tv.TraceLine("CloseStream", lines[index].state), *lines[index + 1 :]]


def broken_leave_to_fenced_broker() -> list[tv.TraceLine]:
    """A session expiry that leaves the fenced broker's partitions where they are."""
    r = TraceRecorder()
    for node_id in (0, 1):
        r.ok(RegisterNode(node_id, 0, "a"))
        r.ok(BrokerHeartbeat(node_id, 0, 1_000))
    r.ok(CreateTopic("t", topic(2)))
    r.forge(
        "ExpireSessions",
        [
            sm.NodeWALMetadataRecord(1, 1, False),
            sm.BrokerRegistrationChangeRecord(1, 0, True, False),
        ],
    )
    return r.lines


# ====================================================================================== TLC


@pytest.fixture(scope="module")
def verdicts() -> dict[str, tuple[Any, list[tv.TraceLine]]]:
    """Every trace of this file, validated in one TLC run."""
    traces: dict[str, list[tv.TraceLine]] = {"scenario": scenario().lines}
    recorded: list[list[tv.TraceLine]] = []

    class Recorded(PlacementMachine):
        """PlacementMachine with its steps recorded; topics are never deleted here (the spec
        has no deletion)."""

        def __init__(self) -> None:
            self.trace = [tv.TraceLine("Init", sm.tla_placement_state(EMPTY_IMAGE))]
            super().__init__()

        def apply(self, event: sm.PlacementEvent) -> sm.Response:
            response = super().apply(event)
            line = tv.TraceLine(sm.tla_placement_action(event), sm.tla_placement_state(self.image))
            self.trace.append(line)
            return response

        def delete_topic(self, data: object) -> None:  # not a rule here
            pass

        def teardown(self) -> None:
            recorded.append(self.trace)

    run_state_machine_as_test(
        Recorded, settings=settings(max_examples=8, stateful_step_count=25, deadline=None)
    )
    for number, lines in enumerate(recorded):
        traces[f"run {number}"] = lines
    traces["no epoch bump"] = broken_move_without_epoch_bump()
    traces["mislabelled"] = broken_mislabelled()
    traces["fenced broker keeps partitions"] = broken_leave_to_fenced_broker()
    names = list(traces)
    results = tv.validate_many([traces[name] for name in names], SPEC)
    return {name: (result, traces[name]) for name, result in zip(names, results, strict=True)}


def ndjson(lines: list[tv.TraceLine]) -> str:
    return "".join(line.to_json() + "\n" for line in lines)


def test_the_scenario_is_a_behaviour_of_the_spec(
    verdicts: dict[str, tuple[Any, list[tv.TraceLine]]],
) -> None:
    verdict, lines = verdicts["scenario"]
    assert verdict.accepted, f"{verdict}\n{ndjson(lines)}"


def test_generated_runs_are_behaviours_of_the_spec(
    verdicts: dict[str, tuple[Any, list[tv.TraceLine]]],
) -> None:
    runs = {name: item for name, item in verdicts.items() if name.startswith("run ")}
    assert len(runs) >= 8
    rejected = [(name, v, lines) for name, (v, lines) in runs.items() if not v.accepted]
    if rejected:
        name, verdict, lines = rejected[0]
        pytest.fail(f"{len(rejected)} of {len(runs)} rejected; {name}: {verdict}\n{ndjson(lines)}")


@pytest.mark.parametrize(
    ("name", "matched"),
    [("no epoch bump", 6), ("fenced broker keeps partitions", 6)],
)
def test_broken_controllers_are_rejected_where_they_break(
    verdicts: dict[str, tuple[Any, list[tv.TraceLine]]], name: str, matched: int
) -> None:
    verdict, lines = verdicts[name]
    assert not verdict.accepted, ndjson(lines)
    assert verdict.matched == matched, verdict


def test_a_mislabelled_step_is_rejected_there(
    verdicts: dict[str, tuple[Any, list[tv.TraceLine]]],
) -> None:
    verdict, lines = verdicts["mislabelled"]
    index = next(i for i, line in enumerate(lines) if line.action == "CloseStream")
    assert not verdict.accepted and verdict.matched == index, verdict


def test_every_action_of_next_is_found() -> None:
    actions = tv.spec_actions(tv.TRACE_SPECS[SPEC])
    assert set(actions) == {
        "RegisterNode",
        "BrokerHeartbeat",
        "ExpireSessions",
        "ControlledShutdown",
        "UnregisterBroker",
        "CreateTopic",
        "ReassignPartition",
        "BalancePartitions",
        "CreateStream",
        "OpenStream",
        "CloseStream",
    }
