"""Failover traces of real runs: the Failover machine's events as the processes of a cluster
step them, recorded per process and merged into one behaviour for trace validation against
specs/Failover.tla (docs/trace_validation.md, "Failover traces from real runs").

Who records what:

- the active controller's failover round (:mod:`automq_ref.io.metadata.failover_contexts`):
  ``AssignFailover`` and ``ClearFailover`` once its compare-and-set of the contexts committed,
  placed as local steps right after the index of the image the round decided on,
  and ``ExpireSession`` / ``Heartbeat`` when a node's session in its view changed since the
  last round (:meth:`FailoverTrace.observe_sessions`), ``EndGrace`` when a node's grace after a
  start ran out (:meth:`FailoverTrace.observe_grace`);
- the failover target (:mod:`automq_ref.io.storage.failover_runner`): ``FenceWal``,
  ``RecoverFailedWal``, ``CloseFailedStreams`` and ``AbortFailover``, the steps its projection of
  the machine took, each once its I/O is done;
- a broker's controller client (:class:`TracingClient`): every ``OpenStream`` the controller
  granted;
- whoever crashes and restarts a node (a test, a nemesis): ``Crash``, ``Restart`` and, once the
  restarted node recovered its own WAL, ``RecoverOwnWal`` (a broker started with the setting
  records its own restart and recovery);
- a producer: ``AppendRecord`` and ``AckAppend`` for each record acknowledged to it
  (:meth:`FailoverTrace.record_acknowledged`), named by stream and offset.

Order across processes: every line carries the metadata log index it is placed at and whether
it was *committed* at that index (a step whose effect is a metadata record: the round's
contexts, an open, a failover's recovery) or is *local* (a step of one process between two
records: a WAL fence, a crash), placed after the index the process had applied when it took the
step. ``CloseFailedStreams``, one close per stream in the shell, is placed as a local step right
after the index applied before its first close (the runner's docstring says why).
:func:`merge` sorts by (index, committed before local, process, the process's own sequence
number): committed steps are totally ordered by the log, and a local step comes after every
record its process had seen. Two local steps of different processes at the same
index are concurrent; the merge puts them in process order.

Recording is off unless a directory is given (``failover.trace.dir``): :func:`open_trace`
returns None and the callers skip recording with one ``is None`` test.

:func:`replay` runs the merged events through the machine's ``step`` from every node SERVING
and every stream CLOSED: the states it passes through, mapped by ``tla_state``, are the trace
TLC checks; a step the machine refuses is a stutter, and is reported so that a test can say
which refusals it expects (the round forgetting a context the machine already dropped when its
target closed the streams). :func:`effect_mismatches` compares what the shell recorded doing
(the streams a takeover or a node's own recovery closed) with the effects the machine returned
for the same step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from automq_ref.io.metadata import trace_cli
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.state_machines import failover as fo
from automq_ref.state_machines import stream_metadata as sm

# Every event a real run records, by name (the TLA+ action's).
EVENTS: dict[str, type[fo.FailoverEvent]] = {
    kind.__name__: kind
    for kind in (
        fo.Heartbeat,
        fo.ExpireSession,
        fo.EndGrace,
        fo.Crash,
        fo.Restart,
        fo.RecoverOwnWal,
        fo.BeginShutdown,
        fo.FinishShutdown,
        fo.OpenStream,
        fo.CloseStream,
        fo.AppendRecord,
        fo.AckAppend,
        fo.UploadWal,
        fo.AssignFailover,
        fo.FenceWal,
        fo.RecoverFailedWal,
        fo.CloseFailedStreams,
        fo.AbortFailover,
        fo.ClearFailover,
    )
}


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One line of a process's trace file."""

    process: str
    seq: int
    index: int  # the metadata log index the step is placed at
    committed: bool  # committed at ``index`` (else: local, after ``index``)
    event: fo.FailoverEvent
    # What the shell did, to compare with the machine's effects: ``closed``, the stream ids a
    # CloseFailedStreams or RecoverOwnWal closed.
    closed: frozenset[int] | None = None
    # A record's name in the run (``<stream>:<offset>``) on AppendRecord and AckAppend: the
    # machine numbers records in the order they were appended (:func:`events_of`).
    key: str | None = None

    def to_json(self) -> str:
        line: dict[str, object] = {
            "process": self.process,
            "seq": self.seq,
            "index": self.index,
            "committed": self.committed,
            "action": type(self.event).__name__,
            "args": asdict(self.event),
        }
        if self.closed is not None:
            line["closed"] = sorted(self.closed)
        if self.key is not None:
            line["key"] = self.key
        return json.dumps(line, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RecordedStep:
        item = json.loads(text)
        kind = EVENTS[item["action"]]
        return cls(
            str(item["process"]),
            int(item["seq"]),
            int(item["index"]),
            bool(item["committed"]),
            kind(**{name: int(value) for name, value in item["args"].items()}),
            None if "closed" not in item else frozenset(int(s) for s in item["closed"]),
            None if "key" not in item else str(item["key"]),
        )


class FailoverTrace(trace_cli.TraceFile):
    """One process's trace file, ``<directory>/<process>.ndjson``; ``index`` reads the metadata
    log index the process has applied."""

    def __init__(self, directory: Path, process: str, index: Callable[[], int]) -> None:
        super().__init__(directory, process, index)
        self._sessions: dict[int, fo.Session] = {}
        self._grace: dict[int, bool] = {}

    def record(
        self,
        event: fo.FailoverEvent,
        *,
        committed: bool = False,
        index: int | None = None,
        closed: frozenset[int] | None = None,
        key: str | None = None,
    ) -> None:
        """``event`` was taken: committed at ``index`` (by default the index applied now), or
        local, right after it; ``closed``: the streams it closed; ``key``: its record."""
        seq, at = self._next(index)
        self._append(RecordedStep(self.process, seq, at, committed, event, closed, key).to_json())

    def record_acknowledged(self, node_id: int, stream_id: int, offset: int) -> None:
        """A producer's record acknowledged by ``node_id`` at ``offset`` of ``stream_id``: it
        landed in the node's WAL (``AppendRecord``) and its append was acknowledged
        (``AckAppend``), both local steps."""
        key = f"{stream_id}:{offset}"
        self.record(fo.AppendRecord(node_id, stream_id), key=key)
        self.record(fo.AckAppend(node_id, 0), key=key)

    def observe_sessions(self, sessions: Iterable[tuple[int, fo.Session]]) -> None:
        """Record ``ExpireSession`` / ``Heartbeat`` for each node whose session went from
        ACTIVE to FENCED or back since the last observation (every node starts ACTIVE, as in
        the machine's initial state), as committed at the index applied now (the image
        observed)."""
        for node_id, session in sessions:
            before = self._sessions.get(node_id, fo.Session.ACTIVE)
            self._sessions[node_id] = session
            if before is fo.Session.ACTIVE and session is fo.Session.FENCED:
                self.record(fo.ExpireSession(node_id), committed=True)
            elif before is fo.Session.FENCED and session is fo.Session.ACTIVE:
                self.record(fo.Heartbeat(node_id), committed=True)

    def observe_grace(self, grace: Iterable[tuple[int, bool]]) -> None:
        """Record ``EndGrace`` for each node whose grace after a (re)start ran out since the
        last observation. (A first start is in its grace too, which the machine's initial
        state is not: that ``EndGrace`` is refused, a stutter.)"""
        for node_id, in_grace in grace:
            before = self._grace.get(node_id, False)
            self._grace[node_id] = in_grace
            if before and not in_grace:
                self.record(fo.EndGrace(node_id), committed=True)


# The process's trace, or None when recording is off (no directory).
open_trace = FailoverTrace.in_directory


class TracingClient:
    """A controller client that records every ``OpenStream`` the controller granted."""

    def __init__(self, client: ControllerClient, trace: FailoverTrace) -> None:
        self._client = client
        self._trace = trace

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        response = await self._client.submit(event)
        if isinstance(event, sm.OpenStream) and response.error is sm.StreamErrorCode.NONE:
            self._trace.record(fo.OpenStream(event.node_id, event.stream_id), committed=True)
        return response


def read_steps(directory: Path) -> list[RecordedStep]:
    """Every process's steps under ``directory``, unordered."""
    return trace_cli.read_lines(directory, RecordedStep.from_json)


def merge(steps: Iterable[RecordedStep]) -> list[RecordedStep]:
    """One behaviour: by index, committed before local, then process and sequence."""
    return sorted(steps, key=lambda s: (s.index, not s.committed, s.process, s.seq))


@dataclass(frozen=True, slots=True)
class Replayed:
    """The machine's run of a merged trace: ``states[0]`` initial, ``states[i]`` after
    ``events[i - 1]``; ``refused`` the (1-based event number, event, error) it did not take."""

    events: tuple[fo.FailoverEvent, ...]
    states: tuple[fo.FailoverState, ...]
    refused: tuple[tuple[int, fo.FailoverEvent, fo.FailoverError], ...]
    effects: tuple[tuple[fo.FailoverEffect, ...], ...] = ()  # per event

    def closed_by(self, number: int) -> frozenset[int]:
        """The streams the machine closed at event ``number`` (1-based)."""
        return frozenset(
            stream_id
            for effect in self.effects[number - 1]
            if isinstance(effect, fo.CloseStreams)
            for stream_id in effect.stream_ids
        )


def _nodes_and_streams(events: Sequence[fo.FailoverEvent]) -> tuple[set[int], set[int]]:
    nodes: set[int] = set()
    streams: set[int] = set()
    for event in events:
        for name, value in asdict(event).items():
            if name == "stream_id":
                streams.add(value)
            elif name in ("node_id", "failed_node_id", "target_node_id"):
                nodes.add(value)
    return nodes, streams


def events_of(steps: Sequence[RecordedStep]) -> list[fo.FailoverEvent]:
    """The merged steps' events, records numbered as the machine numbers them: the n-th
    ``AppendRecord`` appends record n, and an ``AckAppend`` acknowledges the record of its key."""
    numbers: dict[str, int] = {}
    events: list[fo.FailoverEvent] = []
    for step in steps:
        event = step.event
        if isinstance(event, fo.AppendRecord) and step.key is not None:
            numbers[step.key] = len(numbers) + 1
        elif isinstance(event, fo.AckAppend) and step.key is not None:
            event = fo.AckAppend(event.node_id, numbers.get(step.key, 0))
        events.append(event)
    return events


def replay(
    events: Sequence[fo.FailoverEvent],
    nodes: Iterable[int] = (),
    streams: Iterable[int] = (),
) -> Replayed:
    """Run ``events`` through the machine from its initial state over the nodes and streams
    they name (and ``nodes``, ``streams``)."""
    named_nodes, named_streams = _nodes_and_streams(events)
    state = fo.initial_state(sorted(named_nodes | set(nodes)), sorted(named_streams | set(streams)))
    states = [state]
    refused = []
    effects = []
    for number, event in enumerate(events, start=1):
        transition = fo.step(state, event)
        if transition.refusal is not None:
            refused.append((number, event, transition.refusal))
        state = transition.state
        states.append(state)
        effects.append(transition.effects)
    return Replayed(tuple(events), tuple(states), tuple(refused), tuple(effects))


def effect_mismatches(steps: Sequence[RecordedStep], replayed: Replayed) -> list[str]:
    """Where the shell did other than the machine's effects say: a step that recorded the
    streams it closed, and the machine closed others."""
    mismatches = []
    for number, step in enumerate(steps, start=1):
        if step.closed is not None and step.closed != replayed.closed_by(number):
            mismatches.append(
                f"event {number} {step.event}: the shell closed {sorted(step.closed)}, "
                f"the machine {sorted(replayed.closed_by(number))}"
            )
    return mismatches


def tla_lines(replayed: Replayed) -> list[tuple[str, dict[str, object]]]:
    """(action, spec variables) per line: ``Init`` then one per event."""
    return trace_cli.tla_lines(replayed.events, replayed.states, fo.tla_state)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m automq_ref.io.metadata.failover_trace DIR OUT``: merge the trace files of a
    run under DIR, replay them through the machine, write the spec's trace to OUT (the NDJSON
    ``specs/trace_validate.py OUT --spec Failover`` reads) and say what the machine refused and
    where the shell's closes differ from its effects. Exit 0, or 1 on a mismatch."""
    return trace_cli.main("python -m automq_ref.io.metadata.failover_trace", argv, _check)


def _check(directory: Path) -> trace_cli.Checked:
    steps = merge(read_steps(directory))
    replayed = replay(events_of(steps))
    mismatches = effect_mismatches(steps, replayed)
    return trace_cli.Checked("step", len(steps), tla_lines(replayed), replayed.refused, mismatches)


if __name__ == "__main__":
    raise SystemExit(main())
