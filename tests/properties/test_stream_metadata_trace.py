"""Trace validation of StreamMetadata: runs of the Python machine are behaviours of the TLA+ spec.

Requests are driven through the real ``step`` the way the spec's environment sends them (a node
only sends node epochs it has held and stream epochs it was granted; see
``StreamMetadataTraceMachine``), each run is recorded as a trace -- ``tla_state`` of the image
after every request, labelled with the TLA+ action by ``tla_action`` -- and TLC checks, through
specs/trace_validate.py, that some behaviour of specs/StreamMetadata.tla produces exactly those
observed states with exactly those actions (a rejected request is a stutter). Deliberately broken
traces must be rejected at the line that breaks them. docs/trace_validation.md explains the
method; each TLC run costs a JVM start, so the traces are validated in a few batches.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import (
    ANY_STREAM_EPOCH,
    EMPTY_IMAGE,
    NO_OBJECT,
    AllocateProducerIds,
    CloseStream,
    CommitRange,
    CommitStreamObject,
    CommitStreamObjectEntry,
    CommitStreamSetObject,
    CreateStream,
    DeleteStream,
    ExpireObject,
    FenceNode,
    OpenStream,
    PrepareObject,
    PutKV,
    RegisterNode,
    RemoveObject,
    RemoveStreamSetObjectRecord,
    S3ObjectRecord,
    S3ObjectState,
    S3StreamSetObjectRecord,
    StreamMetadataEvent,
    StreamMetadataImage,
    StreamMetadataParams,
    StreamOffsetRange,
    StreamState,
    TrimStream,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

from tests.properties.test_stream_metadata import live_runs

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="TLC needs a Java runtime")

NODES = (0, 1)
PARAMS = StreamMetadataParams(object_retention_ms=50)
TTL_MS = 1000
MAX_OBJECTS = 10
MAX_STREAM_EPOCH = 3
SPEC = "StreamMetadata"


class TraceRecorder:
    """Drives ``step`` and keeps the trace: the Init line, then one line per request."""

    def __init__(self, nodes: tuple[int, ...] = NODES) -> None:
        image = EMPTY_IMAGE
        for node_id in nodes:  # the spec's Init: every node registered at epoch 0
            image = sm.step(image, RegisterNode(node_id, 0), PARAMS).state
        self.image: StreamMetadataImage = image
        self.now_ms = 0
        self.lines = [tv.TraceLine("Init", sm.tla_state(image))]

    def tick(self, elapsed_ms: int = 1) -> int:
        self.now_ms += elapsed_ms
        return self.now_ms

    def apply(self, event: StreamMetadataEvent) -> sm.Response:
        transition = sm.step(self.image, event, PARAMS)
        self.image = transition.state
        self.lines.append(tv.TraceLine(sm.tla_action(event), sm.tla_state(self.image)))
        return sm.response_of(transition)

    def forge(self, action: str, records: list[sm.MetadataRecord]) -> None:
        """A step a broken controller could take: these records, replayed, labelled ``action``."""
        self.image = sm.replay_all(self.image, records)
        self.lines.append(tv.TraceLine(action, sm.tla_state(self.image)))

    def ok(self, event: StreamMetadataEvent) -> None:
        response = self.apply(event)
        assert response.ok, (event, response)

    def answers(self, event: StreamMetadataEvent, error: sm.StreamErrorCode) -> None:
        """The request is answered with ``error`` (a refusal, or a no-op such as a retry)."""
        response = self.apply(event)
        assert response.error is error, (event, response)


def commit(
    node_id: int,
    object_id: int,
    stream_epoch: int,
    start: int,
    end: int,
    now_ms: int,
    *,
    failover: bool = False,
) -> CommitStreamSetObject:
    """A WAL upload by a node at node epoch 0: one stream set object, [start, end) of stream 0."""
    return CommitStreamSetObject(
        node_id,
        0,
        object_id,
        NO_OBJECT,
        10,
        (CommitRange(0, stream_epoch, start, end),),
        (),
        (),
        failover,
        now_ms,
    )


# ================================================================================= scenarios

E = sm.StreamErrorCode


def handoff(*, forge_stale_commit: bool = False) -> list[tv.TraceLine]:
    """Node 0 writes stream 0, splits and compacts its objects, hands the stream to node 1; a
    stale commit of node 0 is fenced; node 1 writes, trims (past the end too), closes, deletes.
    With ``forge_stale_commit`` the stale commit is accepted instead, as by a controller that
    checks neither the range owner nor the stream epoch (and the trace stops there)."""
    r = TraceRecorder()
    r.ok(CreateStream(0, 0))
    r.ok(OpenStream(0, 0, 0, 0))
    r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))  # object 0
    r.ok(commit(0, 0, 0, 0, 2, r.tick()))
    r.answers(commit(0, 0, 0, 0, 2, r.tick()), E.REDUNDANT_OPERATION)  # a retry: stutter
    r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))  # object 1
    r.answers(commit(0, 1, 0, 3, 4, r.tick()), E.OFFSET_NOT_MATCHED)  # stutter: a gap
    r.ok(commit(0, 1, 0, 2, 3, r.tick()))
    for sso, new in ((0, 2), (1, 3)):  # split each stream set object into a stream object
        r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))
        start, end = ((0, 2), (2, 3))[sso]
        split = CommitStreamSetObject(
            0,
            0,
            NO_OBJECT,
            NO_OBJECT,
            0,
            (),
            (CommitStreamObjectEntry(new, 0, start, end, 10),),
            (sso,),
            False,
            r.tick(),
        )
        assert sm.tla_action(split) == "CommitStreamSetObjectCompaction"
        r.ok(split)
    r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))  # object 4: stream objects 2 and 3 merged
    r.ok(CommitStreamObject(0, 0, 0, ANY_STREAM_EPOCH, 4, 0, 3, 10, (2, 3), r.tick()))
    r.ok(RemoveObject(2, r.tick(60)))
    r.ok(PutKV("a", b"x", False))  # not in the spec: a stutter
    r.ok(AllocateProducerIds(0, 0, 10))  # not in the spec either
    r.answers(OpenStream(1, 0, 0, 1), E.STREAM_NOT_CLOSED)
    r.ok(CloseStream(0, 0, 0, 0))
    r.ok(OpenStream(1, 0, 0, 1))
    r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))  # object 5, for node 0's stale upload
    stale = commit(0, 5, 0, 3, 4, r.tick())
    if forge_stale_commit:
        r.forge(
            "CommitStreamSetObject",
            [
                S3ObjectRecord(5, 10, S3ObjectState.COMMITTED, r.now_ms),
                S3StreamSetObjectRecord(0, 5, 5, (StreamOffsetRange(0, 3, 4),), r.now_ms),
            ],
        )
        return r.lines
    r.answers(stale, E.STREAM_FENCED)
    r.answers(CloseStream(0, 0, 0, 0), E.STREAM_FENCED)
    r.ok(PrepareObject(1, 0, 1, TTL_MS, r.tick()))  # object 6
    r.ok(commit(1, 6, 1, 3, 5, r.tick()))
    r.ok(TrimStream(1, 0, 0, 1, 4))
    r.ok(ExpireObject(5, r.tick(TTL_MS + 1)))
    r.answers(commit(0, 5, 0, 3, 4, r.tick()), E.OBJECT_NOT_EXIST)
    r.ok(TrimStream(1, 0, 0, 1, 6))  # past the end: the end moves too
    r.ok(CloseStream(1, 0, 0, 1))
    r.ok(DeleteStream(1, 0, 0, 1, r.tick()))
    r.ok(RemoveObject(4, r.tick(60)))
    return r.lines


def failover() -> list[tv.TraceLine]:
    """Node 0 is failed over while it owns stream 0: its own requests are fenced, the survivor
    commits node 0's data in failover mode and closes the stream as node 0; node 0 restarts and
    its zombie incarnation is expired; node 1 takes the stream."""
    r = TraceRecorder()
    r.ok(CreateStream(0, 0))
    r.ok(OpenStream(0, 0, 0, 0))
    r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))
    r.ok(commit(0, 0, 0, 0, 1, r.tick()))
    r.ok(FenceNode(0, 0))
    r.ok(FenceNode(0, 0))  # a retried failover writes the same record: a stutter
    r.answers(PrepareObject(0, 0, 1, TTL_MS, r.tick()), E.NODE_FENCED)
    r.answers(CreateStream(0, 0), E.NODE_FENCED)
    r.ok(PrepareObject(1, 0, 1, TTL_MS, r.tick()))  # object 1, by the survivor
    r.answers(commit(0, 1, 0, 1, 2, r.tick()), E.NODE_FENCED)
    r.ok(commit(0, 1, 0, 1, 2, r.tick(), failover=True))
    r.ok(CloseStream(0, 0, 0, 0))  # closed as node 0: no failover check
    r.ok(RegisterNode(0, 1))
    r.answers(CreateStream(0, 0), E.NODE_EPOCH_EXPIRED)  # the zombie
    r.ok(OpenStream(1, 0, 0, 1))
    r.answers(OpenStream(0, 1, 0, 0), E.STREAM_FENCED)
    r.ok(OpenStream(1, 0, 0, 1))  # a retried open on the OPENED stream: a stutter
    r.ok(CreateStream(1, 0))
    return r.lines


def compaction(
    node_id: int,
    node_epoch: int,
    object_id: int,
    runs: tuple[tuple[int, int], ...],
    stream_objects: tuple[tuple[int, int, int], ...],
    compacted: tuple[int, ...],
    now_ms: int,
) -> CommitStreamSetObject:
    """The compaction form: ``compacted`` replaced by stream set object ``object_id`` holding
    ``runs`` of stream 0 and by the stream objects ``(object, start, end)`` of stream 0."""
    return CommitStreamSetObject(
        node_id,
        node_epoch,
        object_id,
        NO_OBJECT,
        10,
        tuple(CommitRange(0, ANY_STREAM_EPOCH, start, end) for start, end in runs),
        tuple(CommitStreamObjectEntry(o, 0, start, end, 10) for o, start, end in stream_objects),
        compacted,
        False,
        now_ms,
    )


def compactions(*, forge_lossy_compaction: bool = False) -> list[tv.TraceLine]:
    """Node 0 merges two stream set objects into one, then splits two into a stream set object
    and a stream object, and cleans up an object left wholly below a trim; the stale, foreign
    and lossy compactions in between are refused (stutters). With ``forge_lossy_compaction``
    the lossy one is accepted instead, as by a controller that does not check that the outputs
    hold the sources' live offsets (and the trace stops there)."""
    r = TraceRecorder()
    r.ok(CreateStream(0, 0))
    r.ok(OpenStream(0, 0, 0, 0))
    for object_id, start in ((0, 0), (1, 1)):
        r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))
        r.ok(commit(0, object_id, 0, start, start + 1, r.tick()))
    r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))  # object 2
    merge = compaction(0, 0, 2, ((0, 2),), (), (0, 1), r.tick())
    assert sm.tla_action(merge) == "CommitStreamSetObjectCompaction"
    r.ok(merge)
    r.answers(merge, E.REDUNDANT_OPERATION)  # a retry: stutter
    r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))  # object 3
    stale = compaction(0, 0, 3, ((0, 2),), (), (0, 1), r.tick())
    r.answers(stale, E.COMPACTED_OBJECTS_NOT_FOUND)  # its sources are gone
    r.answers(compaction(1, 0, 3, ((0, 2),), (), (2,), r.tick()), E.COMPACTED_OBJECTS_NOT_FOUND)
    r.ok(commit(0, 3, 0, 2, 3, r.tick()))
    r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))  # object 4
    r.ok(PrepareObject(0, 0, 1, TTL_MS, r.tick()))  # object 5
    lossy = compaction(0, 0, 4, ((0, 2),), (), (2, 3), r.tick())
    if forge_lossy_compaction:
        r.forge(
            "CommitStreamSetObjectCompaction",
            [
                S3ObjectRecord(4, 10, S3ObjectState.COMMITTED, r.now_ms),
                S3StreamSetObjectRecord(0, 4, 2, (StreamOffsetRange(0, 0, 2),), r.now_ms),
                *(S3ObjectRecord(o, 10, S3ObjectState.MARK_DESTROYED, r.now_ms) for o in (2, 3)),
                *(RemoveStreamSetObjectRecord(0, o) for o in (2, 3)),
            ],
        )
        return r.lines
    r.answers(lossy, E.OFFSET_NOT_MATCHED)  # [2, 3) would be lost
    r.ok(compaction(0, 0, 4, ((0, 1),), ((5, 1, 3),), (2, 3), r.tick()))
    r.ok(TrimStream(0, 0, 0, 0, 1))
    r.ok(compaction(0, 0, NO_OBJECT, (), (), (4,), r.tick()))  # a cleanup: [0, 1) is dead
    r.ok(RemoveObject(0, r.tick(60)))
    return r.lines


def stutters(lines: list[tv.TraceLine]) -> int:
    return sum(a.state == b.state for a, b in itertools.pairwise(lines))


def test_scenarios_are_behaviours_of_the_spec() -> None:
    traces = [handoff(), failover(), compactions()]
    assert all(stutters(lines) >= 4 for lines in traces)
    for verdict, lines in zip(tv.validate_many(traces, SPEC), traces, strict=True):
        assert verdict.accepted, f"{verdict}\n{verdict.log_tail}\n{ndjson(lines)}"
        assert verdict.matched == len(lines)


def test_one_trace_is_accepted_when_tlc_reports_trace_not_finished() -> None:
    verdict = tv.validate(handoff(), SPEC)
    assert verdict.accepted, f"{verdict}\n{verdict.log_tail}"
    assert (verdict.exit_code, verdict.violated) == (12, tv.FINISHED)


# ============================================================================ broken traces


def changed(lines: list[tv.TraceLine], number: int, var: str, value: object) -> list[tv.TraceLine]:
    """The trace with ``var`` set to ``value`` on line ``number`` (1-based)."""
    broken = list(lines)
    line = broken[number - 1]
    broken[number - 1] = tv.TraceLine(line.action, {**line.state, var: value})
    return broken


def relabelled(lines: list[tv.TraceLine], number: int, action: str) -> list[tv.TraceLine]:
    broken = list(lines)
    broken[number - 1] = tv.TraceLine(action, lines[number - 1].state)
    return broken


def line_of(lines: list[tv.TraceLine], action: str, nth: int = 1) -> int:
    """The 1-based number of the nth line labelled ``action`` that changes the state."""
    found = [
        number
        for number, (before, line) in enumerate(itertools.pairwise(lines), start=2)
        if line.action == action and line.state != before.state
    ]
    return found[nth - 1]


def test_broken_traces_are_rejected_where_they_break() -> None:
    good = handoff()
    first_commit = line_of(good, "CommitStreamSetObject")
    handover = line_of(good, "OpenStream", 2)
    forged = handoff(forge_stale_commit=True)
    lossy = compactions(forge_lossy_compaction=True)
    cases = {
        # The first commit moves the end to 3 instead of 2.
        "offset": (changed(good, first_commit, "streamEnd", {"fn": [[0, 3]]}), first_commit),
        # Node 1's open reported as a close.
        "label": (relabelled(good, handover, "CloseStream"), handover),
        # Node 0's stale commit accepted after node 1 took the stream over.
        "stale commit": (forged, len(forged)),
        # A compaction that loses [2, 3) of a live stream accepted.
        "lossy compaction": (lossy, len(lossy)),
    }
    traces = [lines for lines, _ in cases.values()]
    for (name, (_, broken_at)), verdict in zip(
        cases.items(), tv.validate_many(traces, SPEC), strict=True
    ):
        assert not verdict.accepted, (name, str(verdict))
        assert verdict.violated is None, (name, str(verdict))
        assert verdict.matched == broken_at - 1, (name, str(verdict))


def test_the_forged_commit_is_a_step_of_the_mutated_spec_that_breaks_an_invariant() -> None:
    """Without the owner and epoch checks (MCStreamMetadataNoOwnerCheck.cfg) the spec takes the
    forged step, and the invariant the checks protect fails on the traced state."""
    forged = handoff(forge_stale_commit=True)
    mutation = {"CheckRangeOwner": "FALSE", "CheckStreamEpoch": "FALSE"}
    verdict = tv.validate(forged, SPEC, overrides=mutation)
    assert not verdict.accepted
    assert verdict.violated == "NoFencedCommitVisible", f"{verdict}\n{verdict.log_tail}"
    assert verdict.matched == len(forged)


def test_the_lossy_compaction_is_a_step_of_the_mutated_spec_that_breaks_an_invariant() -> None:
    """Without the coverage check (MCStreamMetadataNoCoverageCheck.cfg) the spec takes the
    forged compaction, and the live offset it dropped leaves ObjectsCoverStream false."""
    lossy = compactions(forge_lossy_compaction=True)
    verdict = tv.validate(lossy, SPEC, overrides={"CheckCompactionCoverage": "FALSE"})
    assert not verdict.accepted
    assert verdict.violated == "ObjectsCoverStream", f"{verdict}\n{verdict.log_tail}"
    assert verdict.matched == len(lossy)


# ========================================================================== generated runs


class StreamMetadataTraceMachine(RuleBasedStateMachine):
    """One rule per TLA+ action, sending only requests the spec's environment could send: node
    epochs the node has held (``HeldNodeEpoch``), stream epochs it was granted for the stream
    (``HeldStreamEpoch``, kept in ``grants``), one object per PrepareObject, one range per
    stream set object, restarts to the next epoch, failover-mode commits only from a fenced node.
    Within those bounds requests are often stale, fenced or misplaced, and are then refused
    (stutters in the trace). Small: two nodes, two streams, ten objects, one restart each."""

    def __init__(self) -> None:
        super().__init__()
        self.recorder = TraceRecorder()
        self.grants: set[tuple[int, int, int]] = set()  # (stream, stream epoch, node)

    @property
    def image(self) -> StreamMetadataImage:
        return self.recorder.image

    def node_epoch(self, data: st.DataObject, node_id: int) -> int:
        current = self.image.nodes[node_id].node_epoch
        epoch: int = data.draw(st.sampled_from([current, current, current, *range(current)]))
        return epoch

    def granted(self, data: st.DataObject) -> tuple[int, int, int]:
        """A (stream, epoch, node) some open granted, usually the current owner's."""
        current = [
            (stream.stream_id, stream.epoch, stream.current_range.node_id)
            for stream in self.image.streams.values()
            if stream.state is StreamState.OPENED and stream.current_range is not None
        ]
        return data.draw(st.sampled_from(current * 3 + sorted(self.grants)))

    def object_id(self, data: st.DataObject) -> int:
        prepared = [
            o.object_id for o in self.image.objects.values() if o.state is S3ObjectState.PREPARED
        ]
        return data.draw(st.sampled_from(prepared * 3 + list(range(self.image.next_object_id))))

    @precondition(lambda self: any(n.node_epoch < 1 for n in self.image.nodes.values()))
    @rule(data=st.data())
    def register_node(self, data: st.DataObject) -> None:
        fresh = [node for node in self.image.nodes.values() if node.node_epoch < 1]
        node = data.draw(st.sampled_from(fresh))
        # A proposal at or below the stored epoch (a clock that went back) is granted one more.
        proposed = data.draw(st.sampled_from([node.node_epoch, node.node_epoch + 1]))
        granted = self.recorder.apply(RegisterNode(node.node_id, proposed)).node_epoch
        assert granted == node.node_epoch + 1

    @precondition(lambda self: not any(n.failover_mode for n in self.image.nodes.values()))
    @rule(node_id=st.sampled_from(NODES), really=st.integers(0, 4))
    def fence_node(self, node_id: int, really: int) -> None:
        if really == 2:  # failovers are rare (hypothesis favours the bounds of a range)
            self.recorder.apply(FenceNode(node_id, self.image.nodes[node_id].node_epoch))

    @precondition(lambda self: self.image.next_stream_id < 2)
    @rule(data=st.data(), node_id=st.sampled_from(NODES))
    def create_stream(self, data: st.DataObject, node_id: int) -> None:
        self.recorder.apply(CreateStream(node_id, self.node_epoch(data, node_id)))

    def open(self, node_id: int, node_epoch: int, stream_id: int, epoch: int) -> None:
        response = self.recorder.apply(OpenStream(node_id, node_epoch, stream_id, epoch))
        if response.ok:
            self.grants.add((stream_id, epoch, node_id))

    @precondition(lambda self: self.image.next_stream_id > 0)
    @rule(data=st.data(), node_id=st.sampled_from(NODES), delta=st.sampled_from([1, 0, -1, 1, 2]))
    def open_stream(self, data: st.DataObject, node_id: int, delta: int) -> None:
        stream_id = data.draw(st.integers(0, self.image.next_stream_id - 1))
        stream = self.image.streams.get(stream_id)
        epoch = min(MAX_STREAM_EPOCH, max(0, (stream.epoch if stream is not None else 0) + delta))
        self.open(node_id, self.node_epoch(data, node_id), stream_id, epoch)

    @precondition(
        lambda self: any(s.state is StreamState.CLOSED for s in self.image.streams.values())
    )
    @rule(data=st.data(), node_id=st.sampled_from(NODES))
    def new_owner_opens(self, data: st.DataObject, node_id: int) -> None:
        """A healthy open, composed of the actions above: a node at its current node epoch opens
        a closed stream at the next stream epoch, so that streams change hands."""
        closed = [s for s in self.image.streams.values() if s.state is StreamState.CLOSED]
        stream = data.draw(st.sampled_from(closed))
        if stream.epoch < MAX_STREAM_EPOCH:
            node_epoch = self.image.nodes[node_id].node_epoch
            self.open(node_id, node_epoch, stream.stream_id, stream.epoch + 1)

    @precondition(lambda self: bool(self.grants))
    @rule(data=st.data())
    def close_stream(self, data: st.DataObject) -> None:
        stream_id, epoch, node_id = self.granted(data)
        self.recorder.apply(CloseStream(node_id, self.node_epoch(data, node_id), stream_id, epoch))

    @precondition(lambda self: bool(self.grants))
    @rule(data=st.data(), shift=st.integers(-1, 3))
    def trim_stream(self, data: st.DataObject, shift: int) -> None:
        stream_id, epoch, node_id = self.granted(data)
        stream = self.image.streams.get(stream_id)
        new_start = max(0, (stream.start_offset if stream is not None else 0) + shift)
        self.recorder.apply(
            TrimStream(node_id, self.node_epoch(data, node_id), stream_id, epoch, new_start)
        )

    @precondition(lambda self: self.image.next_stream_id > 0)
    @rule(data=st.data(), node_id=st.sampled_from(NODES), really=st.integers(0, 4))
    def delete_stream(self, data: st.DataObject, node_id: int, really: int) -> None:
        if really != 2:  # deletes are rare: a deleted stream takes no more data
            return
        stream_id = data.draw(st.integers(0, self.image.next_stream_id - 1))
        stream = self.image.streams.get(stream_id)
        epoch = stream.epoch if stream is not None else 0
        self.recorder.apply(
            DeleteStream(
                node_id, self.node_epoch(data, node_id), stream_id, epoch, self.recorder.tick()
            )
        )

    @precondition(
        lambda self: (
            self.image.next_object_id < MAX_OBJECTS
            and sum(o.state is S3ObjectState.PREPARED for o in self.image.objects.values()) < 2
        )
    )
    @rule(data=st.data(), node_id=st.sampled_from(NODES))
    def prepare_object(self, data: st.DataObject, node_id: int) -> None:
        epoch = self.node_epoch(data, node_id)
        self.recorder.apply(PrepareObject(node_id, epoch, 1, TTL_MS, self.recorder.tick()))

    @precondition(lambda self: self.image.next_object_id > 0)
    @rule(data=st.data(), elapsed_ms=st.sampled_from([0, TTL_MS + 1]))
    def expire_object(self, data: st.DataObject, elapsed_ms: int) -> None:
        object_id = data.draw(st.integers(0, self.image.next_object_id - 1))
        self.recorder.apply(ExpireObject(object_id, self.recorder.tick(elapsed_ms)))

    @precondition(lambda self: bool(self.grants) and self.image.next_object_id > 0)
    @rule(
        data=st.data(),
        length=st.integers(1, 2),
        shift=st.sampled_from([0, 0, 0, -1, 1]),
        failover=st.booleans(),
    )
    def commit_stream_set_object(
        self, data: st.DataObject, length: int, shift: int, failover: bool
    ) -> None:
        stream_id, epoch, node_id = self.granted(data)
        stream = self.image.streams.get(stream_id)
        start = max(0, (stream.end_offset if stream is not None else 0) + shift)
        fenced = self.image.nodes[node_id].failover_mode
        self.recorder.apply(
            CommitStreamSetObject(
                node_id,
                self.node_epoch(data, node_id),
                self.object_id(data),
                NO_OBJECT,
                10,
                (CommitRange(stream_id, epoch, start, start + length),),
                (),
                (),
                failover and fenced,
                self.recorder.tick(),
            )
        )

    @precondition(
        lambda self: (
            self.image.next_object_id < MAX_OBJECTS
            and any(stream.state is StreamState.OPENED for stream in self.image.streams.values())
        )
    )
    @rule(data=st.data(), length=st.integers(1, 2))
    def owner_writes(self, data: st.DataObject, length: int) -> None:
        """A healthy writer, composed of the actions above: the owner of an open stream prepares
        an object and commits a run at the stream's end, so that streams carry data."""
        stream = data.draw(
            st.sampled_from(
                [s for s in self.image.streams.values() if s.state is StreamState.OPENED]
            )
        )
        assert stream.current_range is not None
        node = self.image.nodes[stream.current_range.node_id]
        prepared = self.recorder.apply(
            PrepareObject(node.node_id, node.node_epoch, 1, TTL_MS, self.recorder.tick())
        )
        if prepared.first_object_id is None:
            return
        start = stream.end_offset
        self.recorder.apply(
            CommitStreamSetObject(
                node.node_id,
                node.node_epoch,
                prepared.first_object_id,
                NO_OBJECT,
                10,
                (CommitRange(stream.stream_id, stream.epoch, start, start + length),),
                (),
                (),
                node.failover_mode,
                self.recorder.tick(),
            )
        )

    @precondition(
        lambda self: (
            self.image.next_object_id > 0
            and any(node.stream_set_objects for node in self.image.nodes.values())
        )
    )
    @rule(
        data=st.data(),
        take=st.integers(1, 2),
        shape=st.sampled_from(["merge", "split", "both", "cleanup"]),
        stale=st.booleans(),
    )
    def commit_stream_set_object_compaction(
        self, data: st.DataObject, take: int, shape: str, stale: bool
    ) -> None:
        """CommitStreamSetObjectCompaction: a node replaces some of its stream set objects by
        one holding their live run (``merge``), a stream object (``split``), both with the run
        cut in two (``both``), or nothing (``cleanup``), preparing the objects it writes, as a
        compactor does. With ``stale`` the request is one a stale or confused compactor could
        send: any sources (gone, another node's), any objects, an old node epoch. Within the
        spec's fragment: one run per output."""
        node = data.draw(
            st.sampled_from([n for n in self.image.nodes.values() if n.stream_set_objects])
        )
        ordered = sorted(node.stream_set_objects.values(), key=lambda o: o.order_id)
        first = data.draw(st.integers(0, len(ordered) - 1))
        sources = ordered[first : first + take]
        runs = [] if shape == "cleanup" else live_runs(self.image, sources)
        if len(runs) > 1 or (shape != "cleanup" and not runs):
            return  # outputs of several runs, or of none: outside the spec's fragment
        cut = None
        if runs and shape == "both":
            ((_, start, end),) = runs
            if end - start < 2:
                return
            cut = data.draw(st.integers(start + 1, end - 1))
        needed = 0 if not runs else 2 if cut is not None else 1
        if stale:
            compacted = tuple(
                sorted(
                    data.draw(st.sets(st.integers(0, self.image.next_object_id - 1), min_size=1))
                )
            )
            objects = [self.object_id(data) for _ in range(needed)]
            node_epoch = self.node_epoch(data, node.node_id)
        else:
            compacted = tuple(source.object_id for source in sources)
            if self.image.next_object_id + needed > MAX_OBJECTS:
                return
            objects = []
            for _ in range(needed):
                prepared = self.recorder.apply(
                    PrepareObject(node.node_id, node.node_epoch, 1, TTL_MS, self.recorder.tick())
                )
                if prepared.first_object_id is None:
                    return
                objects.append(prepared.first_object_id)
            node_epoch = node.node_epoch
        if len(set(objects)) < len(objects):
            return  # one object as both outputs: not a request the spec has
        set_object_id = NO_OBJECT
        ranges: tuple[CommitRange, ...] = ()
        entries: tuple[CommitStreamObjectEntry, ...] = ()
        if runs:
            ((stream_id, start, end),) = runs
            if cut is not None:
                set_object_id, stream_object_id = objects
                ranges = (CommitRange(stream_id, ANY_STREAM_EPOCH, start, cut),)
                entries = (CommitStreamObjectEntry(stream_object_id, stream_id, cut, end, 10),)
            elif shape == "split":
                entries = (CommitStreamObjectEntry(objects[0], stream_id, start, end, 10),)
            else:
                set_object_id = objects[0]
                ranges = (CommitRange(stream_id, ANY_STREAM_EPOCH, start, end),)
        self.recorder.apply(
            CommitStreamSetObject(
                node.node_id,
                node_epoch,
                set_object_id,
                NO_OBJECT,
                10,
                ranges,
                entries,
                compacted,
                False,
                self.recorder.tick(),
            )
        )

    @precondition(
        lambda self: (
            self.image.next_object_id > 0
            and any(stream.stream_objects for stream in self.image.streams.values())
        )
    )
    @rule(data=st.data(), node_id=st.sampled_from(NODES), merge=st.integers(1, 3))
    def commit_stream_object(self, data: st.DataObject, node_id: int, merge: int) -> None:
        stream = data.draw(
            st.sampled_from([s for s in self.image.streams.values() if s.stream_objects])
        )
        ordered = sorted(stream.stream_objects.items(), key=lambda item: item[1].start_offset)
        first = data.draw(st.integers(0, len(ordered) - 1))
        sources = ordered[first : first + merge]
        held = sorted(e for s, e, n in self.grants if s == stream.stream_id and n == node_id)
        epoch = data.draw(st.sampled_from([ANY_STREAM_EPOCH, *held]))
        self.recorder.apply(
            CommitStreamObject(
                node_id,
                self.node_epoch(data, node_id),
                stream.stream_id,
                epoch,
                self.object_id(data),
                sources[0][1].start_offset,
                sources[-1][1].end_offset,
                10,
                tuple(object_id for object_id, _ in sources),
                self.recorder.tick(),
            )
        )

    @precondition(lambda self: self.image.next_object_id > 0)
    @rule(data=st.data(), elapsed_ms=st.sampled_from([60, 0]))
    def remove_object(self, data: st.DataObject, elapsed_ms: int) -> None:
        object_id = data.draw(st.integers(0, self.image.next_object_id - 1))
        self.recorder.apply(RemoveObject(object_id, self.recorder.tick(elapsed_ms)))

    @invariant()
    def python_invariants(self) -> None:
        sm.check_invariants(self.image)


def test_generated_runs_are_behaviours_of_the_spec() -> None:
    traces: list[list[tv.TraceLine]] = []

    class Recorded(StreamMetadataTraceMachine):
        def teardown(self) -> None:
            traces.append(self.recorder.lines)

    run_state_machine_as_test(
        Recorded, settings=settings(max_examples=8, stateful_step_count=30, deadline=None)
    )
    rejected = [
        (verdict, lines)
        for verdict, lines in zip(tv.validate_many(traces, SPEC), traces, strict=True)
        if not verdict.accepted
    ]
    if rejected:
        verdict, lines = rejected[0]
        pytest.fail(f"{len(rejected)} of {len(traces)} rejected; first: {verdict}\n{ndjson(lines)}")


# ============================================================================ without TLC


def ndjson(lines: list[tv.TraceLine]) -> str:
    return "".join(line.to_json() + "\n" for line in lines)


def test_values_render_as_tla() -> None:
    models: set[str] = set()
    value = {
        "fn": [
            [{"model": "n0"}, {"record": {"a": -1, "b": {"set": [True, 'x"y']}}}],
            [{"model": "n1"}, {"seq": []}],
        ]
    }
    rendered = tv.to_tla(value, models)
    assert rendered == '((n0 :> [a |-> (-1), b |-> {TRUE, "x\\"y"}]) @@ (n1 :> <<>>))'
    assert models == {"n0", "n1"}
    malformed: list[object] = [[1], None, {"set": 1}, {"model": "1x"}, {"record": {}}]
    for bad in malformed:
        with pytest.raises(tv.TraceError):
            tv.to_tla(bad)


def test_every_action_of_next_is_found() -> None:
    actions = tv.spec_actions(tv.TRACE_SPECS[SPEC])
    assert set(actions) == set(tv.next_disjuncts(Path(tv.SPECS_DIR / f"{SPEC}.tla").read_text()))
    assert {"OpenStream", "CommitStreamSetObject", "CommitStreamObject", "RemoveObject"} <= set(
        actions
    )
    assert len(actions) == 13
    assert (
        "CommitStreamSetObject(n, e, o, s, se, start, end, failover)"
        in actions["CommitStreamSetObject"]
    )


def test_unknown_actions_and_uneven_observations_are_refused() -> None:
    lines = TraceRecorder().lines
    state = lines[0].state
    spec = tv.TRACE_SPECS[SPEC]
    with pytest.raises(tv.TraceError, match="not an action"):
        tv.build_module(spec, [[*lines, tv.TraceLine("Reboot", state)]])
    with pytest.raises(tv.TraceError, match="observes"):
        tv.build_module(spec, [[*lines, tv.TraceLine("RemoveObject", {"nodeEpoch": 0})]])
    with pytest.raises(tv.TraceError, match="Init"):
        tv.build_module(spec, [[tv.TraceLine("OpenStream", state)]])
    tv.build_module(spec, [[*lines, tv.TraceLine("PutKV", state)]])  # stutter-only: fine
    tv.build_module(spec, [[*lines, tv.TraceLine("AllocateProducerIds", state)]])


def test_ndjson_round_trip(tmp_path: Path) -> None:
    lines = handoff()
    path = tmp_path / "trace.ndjson"
    tv.write_ndjson(path, lines)
    assert tv.read_ndjson(path) == lines
    assert json.loads(path.read_text().splitlines()[0])["action"] == "Init"
