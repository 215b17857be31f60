"""Route-epoch traces of real runs: the RouteEpoch machine's events as the processes of a
cluster step them, recorded per process and merged into one behaviour for trace validation
against specs/RouteEpoch.tla (docs/trace_validation.md, "Route-epoch traces from real runs").

Who records what:

- the active controller's round (:mod:`automq_ref.io.metadata.route_epochs`):
  ``BumpRouteEpoch`` and ``PublishCommittedEpoch`` once its compare-and-set committed, with the
  record it wrote, and, before deciding, what it saw of each registered broker (an
  ``Observe`` line: up, streams open);
- each broker's route-epoch node (:mod:`automq_ref.io.storage.route_epoch_node`):
  ``LearnRouteEpoch`` when it takes a new record from its image; ``ForwardWrite`` when, as a
  proxy, it tags a new write for a main; ``ReceiveRequest`` (with its verdict) and
  ``AppendLinkRecord`` when, as a main, a routed request enters and leaves its in-flight
  count; ``ReportCommittedEpoch`` (with the epoch) once its report is in the KV.

A routed write is named by a key the proxy and the main share (the caller's: its channel
offset, say); :func:`replay` numbers writes in the order of their ``ForwardWrite``, as the
machine does.

Order across processes, as for failover traces: every line carries the metadata log index it
is placed at and whether it was *committed* at that index (a KV write: the controller's record,
a node's report; the index is the one just past the write) or is *local* (placed after the
index the process had applied when it took the step). :func:`merge` sorts by (index,
committed before local, causal order): a message between processes is no metadata record, so
a main's ``ReceiveRequest`` is placed no earlier than the proxy's ``ForwardWrite`` it answers
(and every later local step of the main no earlier than that), and steps at one index follow a
Lamport clock. Moving a local step later past records it had not seen changes nothing the
machine's step reads: a main's verdict reads only its own view and the request, and its own
steps keep their order (a record written after the forward has a higher index than any index
applied before it, so no committed step of the process is passed).

An ``Observe`` line is a fact, not an action: the replay turns it into the machine's
``CrashNode``, ``FailoverNode`` and ``RestartNode`` steps that make the machine's nodes look
like the observation (a broker not registered yet is down with no streams open, so it is not
counted, as the controller does not count it). A broker's own step while the machine has it
down is preceded by its ``RestartNode``: a broker takes route-epoch steps only after it
registered and heartbeated, so it is up in the image from that index on.

:func:`replay` runs the merged events through the machine's ``step`` from the initial state
over every node the trace names; a step the machine refuses is a stutter and is reported.
:func:`mismatches` compares what the shell did (the record the controller wrote, a node's
verdict on a request, the epoch it reported) with the machine's state after the same step.
Recording is off unless a directory is given (``automq.zonerouter.route.epoch.trace.dir``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from automq_ref.io.metadata import trace_cli
from automq_ref.state_machines import route_epoch as re_
from automq_ref.state_machines.route_epoch_projections import NodeView

OBSERVE = "Observe"

# The machine's events a run records, by name (the TLA+ action's).
EVENTS: dict[str, type[re_.RouteEpochEvent]] = {
    kind.__name__: kind
    for kind in (
        re_.BumpRouteEpoch,
        re_.PublishCommittedEpoch,
        re_.LearnRouteEpoch,
        re_.ForwardWrite,
        re_.ReceiveRequest,
        re_.AppendLinkRecord,
        re_.ReportCommittedEpoch,
    )
}


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One line of a process's trace file. ``args``: the event's fields (for a request event,
    ``key`` names the write instead of its id); ``detail``: what the shell did (the record
    written, the verdict, the epoch reported), or the observation."""

    process: str
    seq: int
    index: int
    committed: bool
    action: str
    args: dict[str, object] = field(default_factory=dict)
    detail: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "process": self.process,
                "seq": self.seq,
                "index": self.index,
                "committed": self.committed,
                "action": self.action,
                "args": self.args,
                "detail": self.detail,
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> RecordedStep:
        item = json.loads(text)
        if item["action"] not in EVENTS and item["action"] != OBSERVE:
            raise ValueError(f"unknown action {item['action']!r}")
        return cls(
            str(item["process"]),
            int(item["seq"]),
            int(item["index"]),
            bool(item["committed"]),
            str(item["action"]),
            dict(item["args"]),
            dict(item["detail"]),
        )


def _record_json(record: re_.EpochRecord) -> dict[str, object]:
    return {"route": record.route, "fenced": record.fenced, "committed": record.committed}


class RouteEpochTrace(trace_cli.TraceFile):
    """One process's trace file, ``<directory>/<process>.ndjson``; ``index`` reads the metadata
    log index the process has applied."""

    def __init__(self, directory: Path, process: str, index: Callable[[], int]) -> None:
        super().__init__(directory, process, index)
        self._observed: list[NodeView] | None = None

    def _write(
        self,
        action: str,
        args: dict[str, object],
        detail: dict[str, object],
        committed: bool,
        index: int | None,
    ) -> None:
        seq, at = self._next(index)
        self._append(RecordedStep(self.process, seq, at, committed, action, args, detail).to_json())

    def record(
        self,
        event: re_.RouteEpochEvent,
        *,
        committed: bool = False,
        index: int | None = None,
        key: str | None = None,
        record: re_.EpochRecord | None = None,
        accepted: bool | None = None,
        reported: int | None = None,
    ) -> None:
        """``event`` was taken: committed at ``index`` (the index just past its write) or local
        (after the index applied now, or ``index``). ``key`` names the write of a request event;
        the rest is what the shell did."""
        args: dict[str, object] = {
            name: getattr(event, name)
            for name in type(event).__dataclass_fields__
            if name != "request_id"
        }
        if key is not None:
            args["key"] = key
        detail: dict[str, object] = {}
        if record is not None:
            detail["record"] = _record_json(record)
        if accepted is not None:
            detail["accepted"] = accepted
        if reported is not None:
            detail["reported"] = reported
        self._write(type(event).__name__, args, detail, committed, index)

    def observe(self, views: Sequence[NodeView], *, index: int) -> None:
        """What the controller saw of the registered brokers at ``index`` (recorded only when
        it changed since the last observation)."""
        views = list(views)
        if views == self._observed:
            return
        self._observed = views
        seen = {str(v.node_id): [v.up, v.open_streams] for v in views}
        self._write(OBSERVE, {}, {"nodes": seen}, False, index)


# The process's trace, or None when recording is off (no directory).
open_trace = RouteEpochTrace.in_directory


def read_steps(directory: Path) -> list[RecordedStep]:
    """Every process's steps under ``directory``, unordered."""
    return trace_cli.read_lines(directory, RecordedStep.from_json)


def merge(steps: Iterable[RecordedStep]) -> list[RecordedStep]:
    """One behaviour: by index, committed before local, then causal order (module docstring):
    a local step is placed no earlier than the step before it in its process, and a main's
    ``ReceiveRequest`` no earlier than the proxy's ``ForwardWrite`` of the same write (whose
    message it answers), with a Lamport clock among steps at one index."""
    processes: dict[str, list[RecordedStep]] = {}
    for step in steps:
        processes.setdefault(step.process, []).append(step)
    for own in processes.values():
        own.sort(key=lambda s: s.seq)
    placed: dict[tuple[str, int], tuple[int, int]] = {}  # (index, Lamport clock)
    forwards: dict[str, tuple[int, int]] = {}
    changed = True
    while changed:  # a fixpoint: placements only grow, and are bounded
        changed = False
        for own in processes.values():
            floor = (-(2**62), 0)
            for step in own:
                index, clock = step.index, floor[1] + 1
                if not step.committed:
                    index = max(index, floor[0])
                key = str(step.args.get("key"))
                if step.action == "ReceiveRequest" and key in forwards:
                    sent = forwards[key]
                    if not step.committed:
                        index = max(index, sent[0])
                    clock = max(clock, sent[1] + 1)
                at = (index, clock)
                if step.action == "ForwardWrite":
                    forwards[key] = at
                if placed.get((step.process, step.seq)) != at:
                    placed[(step.process, step.seq)] = at
                    changed = True
                floor = at
    return sorted(
        (step for own in processes.values() for step in own),
        key=lambda s: (
            placed[(s.process, s.seq)][0],
            not s.committed,
            placed[(s.process, s.seq)][1],
            s.process,
            s.seq,
        ),
    )


def trace_nodes(steps: Iterable[RecordedStep]) -> list[int]:
    """Every node id the steps name (events and observations)."""
    nodes: set[int] = set()
    for step in steps:
        for name in ("node_id", "proxy_id", "main_id"):
            if name in step.args:
                nodes.add(int(str(step.args[name])))
        if step.action == OBSERVE:
            nodes.update(int(n) for n in dict(step.detail["nodes"]))  # type: ignore[call-overload]
    return sorted(nodes)


@dataclass(frozen=True, slots=True)
class Replayed:
    """The machine's run of a merged trace: ``states[0]`` initial, ``states[i]`` after
    ``events[i - 1]``; ``refused``: (1-based event number, event, error); ``steps[i]``: the
    recorded step event ``i + 1`` came from."""

    events: tuple[re_.RouteEpochEvent, ...]
    states: tuple[re_.RouteEpochState, ...]
    refused: tuple[tuple[int, re_.RouteEpochEvent, re_.RouteEpochError], ...]
    steps: tuple[RecordedStep, ...]


def _observed_events(
    state: re_.RouteEpochState, seen: dict[int, tuple[bool, bool]]
) -> list[re_.RouteEpochEvent]:
    """The machine's steps that make its nodes look like the observation: down and closed for a
    node the controller does not know; an up node is counted whatever its streams."""
    events: list[re_.RouteEpochEvent] = []
    for node_id, node in sorted(state.nodes.items()):
        up, open_streams = seen.get(node_id, (False, False))
        if node.up and not up:
            events.append(re_.CrashNode(node_id))
            if not open_streams:
                events.append(re_.FailoverNode(node_id))
        elif not node.up and up:
            events.append(re_.RestartNode(node_id))
        elif not node.up and node.open_streams and not open_streams:
            events.append(re_.FailoverNode(node_id))
        elif not node.up and not node.open_streams and open_streams:
            events += [re_.RestartNode(node_id), re_.CrashNode(node_id)]
    return events


def _actor(state: re_.RouteEpochState, event: re_.RouteEpochEvent) -> int | None:
    """The node whose process takes ``event`` (None: the controller, or a request the
    machine does not know)."""
    match event:
        case re_.LearnRouteEpoch() | re_.ReportCommittedEpoch():
            node_id: int | None = event.node_id
        case re_.ForwardWrite():
            node_id = event.proxy_id
        case re_.ReceiveRequest() | re_.AppendLinkRecord():
            request = state.request(event.request_id)
            node_id = None if request is None else request.main_id
        case _:
            node_id = None
    return node_id if node_id in state.nodes else None


def replay(
    steps: Sequence[RecordedStep], params: re_.RouteEpochParams = re_.DEFAULT_PARAMS
) -> Replayed:
    """Run the merged ``steps`` through the machine (module docstring)."""
    state = re_.initial_state(trace_nodes(steps), params)
    ids: dict[str, int] = {}
    events: list[re_.RouteEpochEvent] = []
    states = [state]
    refused = []
    origins: list[RecordedStep] = []

    def apply(event: re_.RouteEpochEvent, origin: RecordedStep) -> None:
        nonlocal state
        transition = re_.step(state, event, params)
        events.append(event)
        origins.append(origin)
        if transition.rejection is not None:
            refused.append((len(events), event, transition.rejection.error))
        state = transition.state
        states.append(state)

    for step in steps:
        if step.action == OBSERVE:
            nodes = dict(step.detail["nodes"])  # type: ignore[call-overload]
            seen = {int(n): (bool(v[0]), bool(v[1])) for n, v in nodes.items()}
            for event in _observed_events(state, seen):
                apply(event, step)
            continue
        args = {k: int(str(v)) for k, v in step.args.items() if k != "key"}
        key = step.args.get("key")
        if step.action == "ForwardWrite" and key is not None:
            ids[str(key)] = len(state.requests) + 1
        elif step.action in ("ReceiveRequest", "AppendLinkRecord"):
            args["request_id"] = ids.get(str(key), 0)
        event = EVENTS[step.action](**args)
        actor = _actor(state, event)
        if actor is not None and not state.nodes[actor].up:
            # A broker takes route-epoch steps only once it registered and heartbeated: it is
            # up in every image from here on, so the controller counts it from here on.
            apply(re_.RestartNode(actor), step)
        apply(event, step)
    return Replayed(tuple(events), tuple(states), tuple(refused), tuple(origins))


def mismatches(replayed: Replayed) -> list[str]:
    """Where the shell did other than the machine: the record the controller wrote, a main's
    verdict on a request, the epoch a node reported (each against the state after the step)."""
    found = []
    pairs = zip(replayed.events, replayed.steps, strict=True)
    for number, (event, step) in enumerate(pairs, start=1):
        after = replayed.states[number]
        detail = step.detail
        if "record" in detail:
            record = _record_json(after.controller)
            if detail["record"] != record:
                found.append(f"event {number} {event}: wrote {detail['record']}, machine {record}")
        if "accepted" in detail and isinstance(event, re_.ReceiveRequest):
            request = after.request(event.request_id)
            state = None if request is None else request.state
            accepted = state is re_.RequestState.ACCEPTED
            if detail["accepted"] != accepted:
                found.append(f"event {number} {event}: accepted={detail['accepted']}, {state}")
        if "reported" in detail and isinstance(event, re_.ReportCommittedEpoch):
            reported = after.nodes[event.node_id].reported
            if detail["reported"] != reported:
                found.append(f"event {number} {event}: reported {detail['reported']}, {reported}")
    return found


def tla_lines(replayed: Replayed) -> list[tuple[str, dict[str, object]]]:
    """(action, spec variables) per line: ``Init`` then one per event."""
    return trace_cli.tla_lines(replayed.events, replayed.states, re_.tla_state)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m automq_ref.io.metadata.route_epoch_trace DIR OUT``: merge the trace files of
    a run under DIR, replay them through the machine, write the spec's trace to OUT (the NDJSON
    ``specs/trace_validate.py OUT --spec RouteEpoch`` reads) and say what the machine refused
    and where the shell differs from it. Exit 0, or 1 on a mismatch."""
    return trace_cli.main("python -m automq_ref.io.metadata.route_epoch_trace", argv, _check)


def _check(directory: Path) -> trace_cli.Checked:
    replayed = replay(merge(read_steps(directory)))
    found = mismatches(replayed)
    return trace_cli.Checked(
        "event", len(replayed.events), tla_lines(replayed), replayed.refused, found
    )


if __name__ == "__main__":
    raise SystemExit(main())
