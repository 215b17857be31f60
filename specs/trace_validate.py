"""Trace validation: check with TLC that a recorded run of a Python machine is a spec behaviour.

This is the etcd / CCF method (Cirstea, Kuppe, Loillier, Merz, "Validating Traces of Distributed
Programs Against TLA+ Specifications"), without CommunityModules: TLC 2.15 has no ``Json`` module,
so the trace is turned into TLA+ text. docs/trace_validation.md explains the method and the
encoding; this docstring is the short form.

The input is NDJSON, one line per machine step::

    {"action": "Init", "state": {...}}                      # the first line
    {"action": "OpenStream", "state": {...after the step...}}

A state maps (some of) the spec's variables to JSON-encoded TLA+ values: int, bool and str as
themselves, ``{"set": [...]}``, ``{"seq": [...]}``, ``{"record": {"field": v}}``,
``{"fn": [[k, v], ...]}`` and ``{"model": "n1"}`` (a model value). The script writes a module
``Trace<Spec>.tla`` that EXTENDS the spec's MC module and holds the trace as a sequence of
records (``TraceLogs``) plus a trace spec:

- ``TraceInit``: the spec's ``Init``, ``traceIndex = 1`` and the observed variables equal to
  line 1;
- ``TraceNext``: ``traceIndex < Len(trace)``, ``traceIndex' = traceIndex + 1``, the action the
  line names (its disjunct of ``Next``, with the same quantifiers) or a stutter
  (``UNCHANGED vars``: a rejected request), and the observed variables equal to the line.

Variables a line does not mention are free: TLC computes them from the actions. A variable listed
as *partial* is a function compared only on the keys the line gives. The cfg sets the spec's
constants from the trace (a ``TraceSpec``'s ``constants``; a constant given as the model value of
its own name, like ConfirmWal's ``NoNode``, is set to itself), checks the spec's invariants and,
last, ``TraceNotFinished == traceIndex < Len(trace)``. Verdict: TLC exits 12 naming
``TraceNotFinished`` -- a behaviour of the spec reached the end of the trace -- means ACCEPTED;
anything else is REJECTED. On a rejection the longest matched prefix is read from the invariant
``TraceProgress``, which is always TRUE and prints ``<<"TRACE", traceId, traceIndex>>`` for
every state TLC reaches (TLC runs breadth first with one worker and explores every state whose
lines match, so the highest index printed is the longest prefix some behaviour matches).

``validate_many`` checks several traces in one TLC run: ``traceId`` picks the trace in
``TraceInit``, TLC explores everything (no ``TraceNotFinished``) and a trace is accepted iff a
state matched its last line.

    .venv/bin/python specs/trace_validate.py TRACE.ndjson --spec StreamMetadata
    .venv/bin/python specs/trace_validate.py TRACE.ndjson --spec StreamMetadata \\
        --const CheckStreamEpoch=FALSE --keep /tmp/trace-module

Exit status: 0 accepted, 1 rejected, 2 unusable input (unknown action, malformed line).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from run_tlc import EXIT_SAFETY, EXIT_TIMEOUT, find_jar, find_java

SPECS_DIR = Path(__file__).resolve().parent

# Names the generated module defines (besides TraceLogs, TraceActions, TraceStep, TraceInit,
# TraceNext, TraceObserved*, TraceAction_* and TraceConst_*); a spec must not use them.
TRACE_ID = "traceId"  # which trace a behaviour follows (validate_many)
TRACE_INDEX = "traceIndex"  # the line of that trace the state matches
FINISHED = "TraceNotFinished"  # violated when a behaviour matched every line: acceptance
PROGRESS = "TraceProgress"  # always TRUE; prints <<"TRACE", traceId, traceIndex>> per state
PROGRESS_TAG = "TRACE"
NEXT_ACTION = "Next"  # a line naming "Next" may be any step of the spec


class TraceError(ValueError):
    """The trace or the spec cannot be turned into a trace module (not a verdict)."""


@dataclass(frozen=True)
class TraceLine:
    action: str
    state: Mapping[str, object]

    def to_json(self) -> str:
        return json.dumps({"action": self.action, "state": self.state}, sort_keys=True)


def read_ndjson(path: Path) -> list[TraceLine]:
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if not text.strip():
            continue
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as error:
            raise TraceError(f"{path}:{number}: not JSON: {error}") from error
        if not isinstance(entry, dict) or set(entry) != {"action", "state"}:
            raise TraceError(f'{path}:{number}: expected {{"action": ..., "state": ...}}')
        if not isinstance(entry["action"], str) or not isinstance(entry["state"], dict):
            raise TraceError(f"{path}:{number}: action must be a string and state an object")
        lines.append(TraceLine(entry["action"], entry["state"]))
    return lines


def write_ndjson(path: Path, lines: Iterable[TraceLine]) -> None:
    path.write_text("".join(line.to_json() + "\n" for line in lines))


# ============================================================== JSON values -> TLA+ expressions

IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _identifier(name: object, what: str) -> str:
    if not isinstance(name, str) or not IDENTIFIER_RE.match(name):
        raise TraceError(f"{what} {name!r} is not a TLA+ identifier")
    return name


def _string(text: str) -> str:
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\t", "\\t")
        .replace("\r", "\\r")
    )
    return f'"{escaped}"'


def to_tla(value: object, models: set[str] | None = None) -> str:
    """The TLA+ expression for a JSON-encoded value; model value names are added to ``models``."""
    if models is None:
        models = set()
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value) if value >= 0 else f"({value})"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, dict) and len(value) == 1:
        ((tag, body),) = value.items()
        if tag == "set" and isinstance(body, list):
            return "{" + ", ".join(to_tla(item, models) for item in body) + "}"
        if tag == "seq" and isinstance(body, list):
            return "<<" + ", ".join(to_tla(item, models) for item in body) + ">>"
        if tag == "record" and isinstance(body, dict) and body:
            fields = (
                f"{_identifier(name, 'record field')} |-> {to_tla(item, models)}"
                for name, item in body.items()
            )
            return "[" + ", ".join(fields) + "]"
        if tag == "fn" and isinstance(body, list):
            return _function(body, models)
        if tag == "model":
            models.add(_identifier(body, "model value"))
            return str(body)
    raise TraceError(f"not a trace value: {json.dumps(value)[:200]}")


def _function(pairs: list[object], models: set[str]) -> str:
    if not pairs:
        return "[x \\in {} |-> 0]"
    parts = []
    seen: set[str] = set()
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            raise TraceError(f"a function entry must be [key, value], got {json.dumps(pair)}")
        key = to_tla(pair[0], models)
        if key in seen:
            raise TraceError(f"function key {key} appears twice")
        seen.add(key)
        parts.append(f"({key} :> {to_tla(pair[1], models)})")
    return parts[0] if len(parts) == 1 else "(" + " @@ ".join(parts) + ")"


# ========================================================================= what a spec provides


@dataclass(frozen=True)
class TraceSpec:
    """How to validate traces of one machine against its spec."""

    name: str  # specs/<name>.tla: the spec, whose Next is split into actions
    module: str  # the module the trace module EXTENDS (the spec or its MC module)
    # The cfg constants for a trace: name -> JSON-encoded value (rendered with to_tla).
    constants: Callable[[Sequence[TraceLine]], Mapping[str, object]]
    invariants: tuple[str, ...] = ()  # spec invariants also checked on every trace state
    partial: frozenset[str] = frozenset()  # function variables compared on the given keys only
    # Function variable -> the value of a key a line does not give: each line is completed
    # with it over the keys any line of the batch gives (the constant set those keys make),
    # so that no key is left free (a free key lets TLC branch at every step).
    defaults: Mapping[str, object] = field(default_factory=dict)
    # Bind the observed variables from the next line before the action is evaluated, so that an
    # action written as constraints on primed variables (``leader' \in ...``) checks the line
    # instead of enumerating every choice. Only for a spec whose observed variables are all
    # total (no ``partial``): a partial comparison cannot bind a variable.
    observe_first: bool = False
    unmodelled: frozenset[str] = frozenset()  # machine actions the spec lacks: stutters only
    actions: Mapping[str, str] = field(default_factory=dict)  # name -> TLA+ action, overrides Next
    variables: str = "vars"  # the spec's tuple of all variables (for stutters)
    init: str = "Init"
    next: str = NEXT_ACTION


def spec_actions(spec: TraceSpec) -> dict[str, str]:
    """Action name -> TLA+ expression: ``Next``'s disjuncts, then the spec's own overrides."""
    actions = next_disjuncts((SPECS_DIR / f"{spec.name}.tla").read_text(), spec.next)
    actions.update(spec.actions)
    return actions


def _strip_comments(text: str) -> str:
    # Block comments become blanks (newlines kept, so lines and columns stay where they were).
    text = re.sub(r"\(\*.*?\*\)", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"\\\*.*", "", text)


def next_disjuncts(spec_text: str, next_name: str = NEXT_ACTION) -> dict[str, str]:
    """Split ``Next == \\/ D1 \\/ D2 ...`` into {action name: disjunct}.

    Each disjunct is expected to be quantifiers around one action, as the specs here write
    ``Next`` (so that TLC names actions in traces); the action is the last ``Name(`` of the
    disjunct, or the disjunct itself if it is a bare name. Disjuncts naming the same action are
    kept together. A disjunct keeps its bullet and its original columns, so it is a disjunction
    list laid out exactly as in the spec.
    """
    lines = _strip_comments(spec_text).splitlines()
    start = next(
        (i for i, line in enumerate(lines) if re.match(rf"^{re.escape(next_name)}\s*==", line)),
        None,
    )
    if start is None:
        raise TraceError(f"no definition {next_name} == at the start of a line")
    body = [lines[start].split("==", 1)[1]]
    for line in lines[start + 1 :]:
        if line and not line[0].isspace():
            break
        body.append(line)
    prefix_width = len(lines[start]) - len(body[0])
    body[0] = " " * prefix_width + body[0]
    first_line = next((line for line in body if line.strip()), "")
    if not first_line.lstrip().startswith("\\/"):
        raise TraceError(f"{next_name} is not a disjunction list; give TraceSpec.actions")
    column = first_line.index("\\/")
    starts = [
        i
        for i, line in enumerate(body)
        if line[column : column + 2] == "\\/" and not line[:column].strip()
    ]
    actions: dict[str, str] = {}
    for position, first in enumerate(starts):
        last = starts[position + 1] if position + 1 < len(starts) else len(body)
        # The disjunct with its own bullet, where it was: a one-item (or, for an action that
        # several disjuncts call, a several-item) disjunction list laid out as in the spec.
        chunk = [" " * column + body[first][column:], *body[first + 1 : last]]
        text = "\n".join(line.rstrip() for line in chunk).rstrip()
        calls = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", text)
        names = calls or re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)
        if not names:
            raise TraceError(f"cannot name the action of disjunct {text.strip()!r}")
        name = names[-1]
        actions[name] = f"{actions[name]}\n{text}" if name in actions else text
    return actions


# ================================================================================ the module


@dataclass(frozen=True)
class TraceModule:
    name: str
    tla: str
    cfg: str


def _check_trace(
    lines: Sequence[TraceLine], known: set[str], spec: TraceSpec, observed: list[str] | None
) -> list[str]:
    """The variables the trace observes (the same on every line); raises TraceError."""
    if not lines:
        raise TraceError("empty trace")
    if lines[0].action != "Init":
        raise TraceError(f'line 1 must be "Init", not {lines[0].action!r}')
    observed = observed if observed is not None else sorted(lines[0].state)
    if not observed:
        raise TraceError("line 1 observes no variable")
    for number, line in enumerate(lines, start=1):
        if sorted(line.state) != observed:
            raise TraceError(f"line {number} observes {sorted(line.state)}, not {observed}")
        allowed = line.action in known or line.action in spec.unmodelled
        if number > 1 and not allowed and line.action != NEXT_ACTION:
            raise TraceError(
                f"line {number}: {line.action!r} is not an action of {spec.name} "
                f"(known: {sorted(known)}; stutter-only: {sorted(spec.unmodelled)})"
            )
    for name in observed:
        _identifier(name, "variable")
    return observed


def _wrap(items: list[str], opening: str, closing: str, width: int = 96) -> str:
    """``opening item, item, ... closing`` broken into lines of at most ``width`` characters."""
    if not items:
        return opening + closing
    rows, row = [], opening
    for position, item in enumerate(items):
        piece = item + (", " if position + 1 < len(items) else closing)
        if len(row) + len(piece) > width and row.strip() != opening.strip():
            rows.append(row.rstrip())
            row = " " * len(opening)
        row += piece
    return "\n".join([*rows, row])


def _record(state: Mapping[str, object], observed: list[str], models: set[str]) -> str:
    fields = [f"{name} |-> {to_tla(state[name], models)}" for name in observed]
    return "[ " + ",\n        ".join(fields) + " ]"


def _completed(spec: TraceSpec, traces: Sequence[Sequence[TraceLine]]) -> list[list[TraceLine]]:
    """Each line with every function variable of ``spec.defaults`` given on every key some
    line of the batch gives it, the missing keys at their default."""
    if not spec.defaults:
        return [list(lines) for lines in traces]
    every_line = [line for lines in traces for line in lines]
    universes = {var: fn_keys(every_line, var) for var in spec.defaults}
    completed = []
    for lines in traces:
        new_lines = []
        for line in lines:
            state = dict(line.state)
            for var, default in spec.defaults.items():
                body = state.get(var)
                if not (isinstance(body, dict) and isinstance(body.get("fn"), list)):
                    continue
                pairs = list(body["fn"])
                given = [pair[0] for pair in pairs if isinstance(pair, list) and pair]
                pairs += [[key, default] for key in universes[var] if key not in given]
                state[var] = {"fn": pairs}
            new_lines.append(TraceLine(line.action, state))
        completed.append(new_lines)
    return completed


def build_module(
    spec: TraceSpec,
    traces: Sequence[Sequence[TraceLine]],
    overrides: Mapping[str, str] | None = None,
    *,
    stop_at_end: bool = True,
) -> TraceModule:
    """The trace module and its cfg for one or more traces (``traceId`` picks one in Init).

    ``stop_at_end``: check ``TraceNotFinished`` (the acceptance of a single trace). Either way
    the invariant ``TraceProgress`` prints ``<<"TRACE", traceId, traceIndex>>`` for every state,
    from which the longest matched prefix of each trace is read. ``overrides``: constant name ->
    TLA+ expression, replacing what ``spec.constants`` computes.
    """
    if not traces:
        raise TraceError("no trace")
    actions = spec_actions(spec)
    observed: list[str] | None = None
    for lines in traces:
        observed = _check_trace(lines, set(actions), spec, observed)
    assert observed is not None
    traces = _completed(spec, traces)
    models: set[str] = set()
    every_line = [line for lines in traces for line in lines]
    values = spec.constants(every_line)
    # A constant that is a model value of its own name (``NoNode = NoNode``) is declared by the
    # spec already: the cfg sets it as such, and the trace names it without declaring it again.
    own = {const for const, value in values.items() if value == {"model": const}}
    own -= set(overrides or {})
    constants = {
        const: to_tla(value, models) for const, value in values.items() if const not in own
    }
    constants.update(overrides or {})
    named = {line.action for line in every_line}
    used = sorted(set(actions) & named)
    name = f"Trace{spec.name}"

    def observed_at(prime: str) -> list[str]:
        checks = []
        for var in observed:
            value = f"TraceLogs[t][i].{var}"
            if var in spec.partial:
                checks.append(f"    /\\ \\A k \\in DOMAIN {value} : {var}{prime}[k] = {value}[k]")
            else:
                checks.append(f"    /\\ {var}{prime} = {value}")
        return checks

    observed_next = [f"    /\\ TraceObservedNext({TRACE_ID}, {TRACE_INDEX} + 1)"]
    if spec.observe_first and spec.partial & set(observed):
        raise TraceError(f"{spec.name}: observe_first needs total variables, not partial ones")
    observe_first = observed_next if spec.observe_first else []
    observe_last = [] if spec.observe_first else observed_next

    step = ["TraceStep(name) =="]
    for action in used:
        step.append(f'    \\/ /\\ name = "{action}"\n       /\\ TraceAction_{action}')
    if NEXT_ACTION in named:
        step.append(f'    \\/ /\\ name = "{NEXT_ACTION}"\n       /\\ {spec.next}')
    if len(step) == 1:
        step.append("    FALSE")
    logs, labels = [], []
    for number, lines in enumerate(traces, start=1):
        entries = [
            f"      \\* line {index}: {line.action}\n      {_record(line.state, observed, models)}"
            for index, line in enumerate(lines, start=1)
        ]
        logs.append(f"    \\* trace {number}\n    <<\n" + ",\n".join(entries) + "\n    >>")
        labels.append(_wrap([_string(line.action) for line in lines], "    <<", ">>"))
    out = [
        f"{'-' * 28} MODULE {name} {'-' * 28}",
        f"(* Generated by specs/trace_validate.py from {len(traces)} trace(s) of the",
        f"   {spec.name} machine; docs/trace_validation.md explains it.  Do not edit. *)",
        f"EXTENDS {spec.module}, Integers, Sequences, TLC",
        "",
    ]
    declared = sorted(models - own)
    if declared:
        out += ["CONSTANTS " + ", ".join(declared) + "  \\* model values of the trace", ""]
    out += [
        "VARIABLES",
        f"    {TRACE_ID},     \\* which trace this behaviour follows",
        f"    {TRACE_INDEX}   \\* the line of that trace the state matches",
        "",
        *(f"TraceConst_{const} == {value}" for const, value in constants.items()),
        "",
        "\\* The action each line names.",
        "TraceActions == <<",
        ",\n".join(labels),
        ">>",
        "",
        "\\* The observed variables after each line.",
        "TraceLogs == <<",
        ",\n".join(logs),
        ">>",
        "",
        "TraceObserved(t, i) ==",
        *observed_at(""),
        "",
        "TraceObservedNext(t, i) ==",
        *observed_at("'"),
        "",
    ]
    for action in used:
        out += [f"TraceAction_{action} ==", actions[action], ""]
    out += [
        *step,
        "",
        "TraceInit ==",
        f"    /\\ {TRACE_ID} \\in 1..Len(TraceLogs)",
        f"    /\\ {spec.init}",
        f"    /\\ {TRACE_INDEX} = 1",
        f"    /\\ TraceObserved({TRACE_ID}, 1)",
        "",
        "\\* The line's action, or a stutter (a rejected request, an action the spec lacks).",
        "TraceNext ==",
        f"    /\\ {TRACE_INDEX} < Len(TraceLogs[{TRACE_ID}])",
        f"    /\\ {TRACE_INDEX}' = {TRACE_INDEX} + 1",
        f"    /\\ UNCHANGED {TRACE_ID}",
        *observe_first,
        f"    /\\ \\/ TraceStep(TraceActions[{TRACE_ID}][{TRACE_INDEX} + 1])",
        f"       \\/ UNCHANGED {spec.variables}",
        *observe_last,
        "",
        "\\* Always TRUE; prints each state's place in its trace (the matched prefixes).",
        f'{PROGRESS} == PrintT(<<"{PROGRESS_TAG}", {TRACE_ID}, {TRACE_INDEX}>>)',
        "",
        "\\* Violated exactly when a behaviour of the spec has matched every line: acceptance.",
        f"{FINISHED} == {TRACE_INDEX} < Len(TraceLogs[{TRACE_ID}])",
        "",
        "=" * 77,
        "",
    ]
    cfg = ["CONSTANTS"]
    cfg += [f"    {model} = {model}" for model in sorted(models | own)]
    cfg += [f"    {const} <- TraceConst_{const}" for const in constants]
    cfg += ["INIT TraceInit", "NEXT TraceNext", "INVARIANTS", f"    {PROGRESS}"]
    cfg += [f"    {invariant}" for invariant in spec.invariants]
    if stop_at_end:
        cfg.append(f"    {FINISHED}")
    return TraceModule(name, "\n".join(out), "\n".join(cfg) + "\n")


# ================================================================================ running TLC


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    lines: int  # lines in the trace
    matched: int  # lines 1..matched are a behaviour prefix (all of them when accepted)
    exit_code: int
    violated: str | None  # a spec invariant that a matched state violates, if any
    distinct_states: int | None  # of the whole TLC run
    seconds: float  # of the whole TLC run
    message: str
    log_tail: str

    def __str__(self) -> str:
        return f"{'ACCEPTED' if self.accepted else 'REJECTED'}: {self.message}"


@dataclass(frozen=True)
class _Run:
    exit_code: int
    output: str
    seconds: float

    @property
    def violated(self) -> str | None:
        found = VIOLATED_RE.findall(self.output)
        return found[0] if found else None

    @property
    def distinct_states(self) -> int | None:
        found = DISTINCT_RE.findall(self.output)
        return int(found[-1].replace(",", "")) if found else None

    def reached(self) -> dict[int, int]:
        """Trace id -> the highest line a state of the spec matched."""
        best: dict[int, int] = {}
        for trace_id, index in PROGRESS_RE.findall(self.output):
            best[int(trace_id)] = max(best.get(int(trace_id), 0), int(index))
        return best

    def error_state(self) -> tuple[int, int] | None:
        """(traceId, traceIndex) of the last state of TLC's error trace."""
        ids, indexes = TRACE_ID_RE.findall(self.output), TRACE_INDEX_RE.findall(self.output)
        return (int(ids[-1]), int(indexes[-1])) if ids and indexes else None


VIOLATED_RE = re.compile(r"^Error: Invariant (\S+) is violated", re.M)
DISTINCT_RE = re.compile(r"([\d,]+) distinct states found")
PROGRESS_RE = re.compile(rf'<<"{PROGRESS_TAG}", (\d+), (\d+)>>')
TRACE_ID_RE = re.compile(rf"^/\\ {TRACE_ID} = (\d+)$", re.M)
TRACE_INDEX_RE = re.compile(rf"^/\\ {TRACE_INDEX} = (\d+)$", re.M)


def _run_tlc(module: TraceModule, keep: Path | None, timeout_s: int) -> _Run:
    java, jar = find_java(), find_jar()
    with tempfile.TemporaryDirectory(prefix="trace-validate-") as work:
        workdir = Path(work)
        for source in SPECS_DIR.glob("*.tla"):
            shutil.copy(source, workdir / source.name)
        (workdir / f"{module.name}.tla").write_text(module.tla)
        (workdir / f"{module.name}.cfg").write_text(module.cfg)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for suffix in (".tla", ".cfg"):
                shutil.copy(workdir / f"{module.name}{suffix}", keep)
        command = [
            java,
            "-XX:+UseParallelGC",
            "-cp",
            str(jar),
            "tlc2.TLC",
            "-workers",
            "1",
            "-deadlock",  # do NOT check deadlock: the last line's state has no successor
            "-metadir",
            str(workdir / "meta"),
            "-config",
            f"{module.name}.cfg",
            f"{module.name}.tla",
        ]
        started = time.monotonic()
        try:
            completed = subprocess.run(
                command, cwd=workdir, capture_output=True, text=True, timeout=timeout_s
            )
            exit_code, output = completed.returncode, completed.stdout + completed.stderr
        except subprocess.TimeoutExpired as expired:
            exit_code, output = EXIT_TIMEOUT, _text(expired.stdout) + _text(expired.stderr)
        return _Run(exit_code, output, time.monotonic() - started)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def _verdict(
    lines: Sequence[TraceLine], run: _Run, *, matched: int, accepted: bool, message: str
) -> Verdict:
    return Verdict(
        accepted=accepted,
        lines=len(lines),
        matched=matched,
        exit_code=run.exit_code,
        violated=run.violated,
        distinct_states=run.distinct_states,
        seconds=run.seconds,
        message=message,
        log_tail="\n".join(run.output.splitlines()[-30:]),
    )


def _prefix_verdict(lines: Sequence[TraceLine], run: _Run, matched: int) -> Verdict:
    """The verdict from the longest prefix TLC matched."""
    total = len(lines)
    if matched >= total:
        return _verdict(
            lines, run, matched=total, accepted=True, message=f"all {total} lines matched"
        )
    if matched == 0:
        message = "line 1 is not an initial state of the spec" + _diff(lines, 0)
    else:
        message = (
            f"lines 1..{matched} of {total} match a behaviour of the spec; line {matched + 1} "
            f"({lines[matched].action}) is no step of the spec (nor a stutter) from any state "
            f"matching line {matched}" + _diff(lines, matched)
        )
    return _verdict(lines, run, matched=matched, accepted=False, message=message)


def _failed(lines: Sequence[TraceLine], run: _Run) -> Verdict:
    what = "did not finish in time" if run.exit_code == EXIT_TIMEOUT else "failed"
    return _verdict(
        lines, run, matched=0, accepted=False, message=f"TLC {what} (exit {run.exit_code})"
    )


def validate(
    lines: Sequence[TraceLine],
    spec: TraceSpec | str,
    *,
    overrides: Mapping[str, str] | None = None,
    keep: Path | None = None,
    timeout_s: int = 300,
) -> Verdict:
    """Validate one trace: accepted iff TLC reports ``TraceNotFinished`` violated (exit 12).

    ``overrides``: constant name -> TLA+ expression; ``keep``: copy the module and cfg there.
    """
    spec = TRACE_SPECS[spec] if isinstance(spec, str) else spec
    run = _run_tlc(build_module(spec, [lines], overrides, stop_at_end=True), keep, timeout_s)
    violated = run.violated
    if run.exit_code == EXIT_SAFETY and violated == FINISHED:
        return _prefix_verdict(lines, run, len(lines))
    if run.exit_code == EXIT_SAFETY and violated is not None:
        return _invariant_verdict(lines, run, violated)
    if run.exit_code == 0:
        return _prefix_verdict(lines, run, min(run.reached().get(1, 0), len(lines) - 1))
    return _failed(lines, run)


def _invariant_verdict(lines: Sequence[TraceLine], run: _Run, violated: str) -> Verdict:
    place = run.error_state()
    at = place[1] if place is not None else 0
    message = (
        f"lines 1..{at} match a behaviour of the spec, but its state at line {at} violates "
        f"the invariant {violated}"
    )
    return _verdict(lines, run, matched=at, accepted=False, message=message)


def validate_many(
    traces: Sequence[Sequence[TraceLine]],
    spec: TraceSpec | str,
    *,
    overrides: Mapping[str, str] | None = None,
    keep: Path | None = None,
    timeout_s: int = 300,
) -> list[Verdict]:
    """Validate several traces in one TLC run (one JVM start instead of one per trace).

    TLC explores every state of the trace spec for all traces (no ``TraceNotFinished``) and
    exits 0; a trace is accepted iff some state matched its last line (``TraceProgress``). A
    spec invariant violated on a matched state stops TLC: that trace is rejected, and the others
    are run again without it.
    """
    spec = TRACE_SPECS[spec] if isinstance(spec, str) else spec
    verdicts: dict[int, Verdict] = {}
    pending = list(range(len(traces)))
    while pending:
        batch = [traces[i] for i in pending]
        module = build_module(spec, batch, overrides, stop_at_end=False)
        run = _run_tlc(module, keep, timeout_s)
        violated = run.violated
        place = run.error_state()
        if run.exit_code == EXIT_SAFETY and violated is not None and place is not None:
            culprit = pending[place[0] - 1]
            verdicts[culprit] = _invariant_verdict(traces[culprit], run, violated)
            pending.remove(culprit)
            continue
        reached = run.reached()
        for position, index in enumerate(pending, start=1):
            if run.exit_code == 0:
                verdicts[index] = _prefix_verdict(traces[index], run, reached.get(position, 0))
            else:
                verdicts[index] = _failed(traces[index], run)
        pending = []
    return [verdicts[i] for i in range(len(traces))]


def _diff(lines: Sequence[TraceLine], matched: int, width: int = 200) -> str:
    """What line ``matched + 1`` (1-based) changes in the observed variables, for the message."""
    after = lines[matched].state
    before = lines[matched - 1].state if matched > 0 else {}
    changed = [name for name in sorted(after) if before.get(name) != after[name]]
    if not changed:
        return "; that line changes no observed variable"
    parts = []
    for name in changed:
        for shown in _changes(name, before.get(name), after[name]):
            parts.append(shown if len(shown) <= width else shown[: width - 3] + "...")
    return "; it sets " + "; ".join(parts)


def _changes(name: str, old: object, new: object) -> list[str]:
    """``name: old -> new``, narrowed to the changed keys of a function or elements of a set."""
    if isinstance(old, dict) and isinstance(new, dict) and set(old) == set(new) == {"fn"}:
        old_map = {to_tla(k): v for k, v in old["fn"]}
        new_map = {to_tla(k): v for k, v in new["fn"]}
        return [
            f"{name}[{key}]: "
            + (to_tla(old_map[key]) if key in old_map else "(none)")
            + " -> "
            + (to_tla(new_map[key]) if key in new_map else "(none)")
            for key in sorted(set(old_map) | set(new_map))
            if old_map.get(key) != new_map.get(key)
        ]
    if isinstance(old, dict) and isinstance(new, dict) and set(old) == set(new) == {"set"}:
        old_items = {to_tla(item) for item in old["set"]}
        new_items = {to_tla(item) for item in new["set"]}
        return [f"{name} gains {item}" for item in sorted(new_items - old_items)] + [
            f"{name} loses {item}" for item in sorted(old_items - new_items)
        ]
    if old is None:
        return [f"{name} = {to_tla(new)}"]
    return [f"{name}: {to_tla(old)} -> {to_tla(new)}"]


# ===================================================================== helpers for constants


def walk(value: object) -> Iterator[object]:
    """Every value inside a JSON-encoded value, itself included."""
    yield value
    if isinstance(value, dict) and len(value) == 1:
        ((tag, body),) = value.items()
        if tag in ("set", "seq") and isinstance(body, list):
            for item in body:
                yield from walk(item)
        elif tag == "record" and isinstance(body, dict):
            for item in body.values():
                yield from walk(item)
        elif tag == "fn" and isinstance(body, list):
            for pair in body:
                if isinstance(pair, list):
                    for item in pair:
                        yield from walk(item)


def values_of(lines: Sequence[TraceLine], *variables: str) -> Iterator[object]:
    """Every value inside the named variables on every line."""
    for line in lines:
        for name in variables:
            if name in line.state:
                yield from walk(line.state[name])


def ints_of(lines: Sequence[TraceLine], *variables: str) -> list[int]:
    return [v for v in values_of(lines, *variables) if isinstance(v, int)]


def fields_of(lines: Sequence[TraceLine], variable: str, *names: str) -> list[object]:
    """The given fields of every record inside ``variable`` on every line."""
    found = []
    for value in values_of(lines, variable):
        if isinstance(value, dict) and isinstance(value.get("record"), dict):
            found += [value["record"][name] for name in names if name in value["record"]]
    return found


def fn_keys(lines: Sequence[TraceLine], variable: str) -> list[object]:
    """The keys of function ``variable`` over all lines, in first-seen order, no repeats."""
    keys: list[object] = []
    for line in lines:
        body = line.state.get(variable)
        if isinstance(body, dict) and isinstance(body.get("fn"), list):
            for pair in body["fn"]:
                if isinstance(pair, list) and pair and pair[0] not in keys:
                    keys.append(pair[0])
    return keys


def seq_lengths(lines: Sequence[TraceLine], variable: str) -> list[int]:
    """The length of sequence ``variable`` on every line that has it."""
    found = []
    for line in lines:
        body = line.state.get(variable)
        if isinstance(body, dict) and isinstance(body.get("seq"), list):
            found.append(len(body["seq"]))
    return found


def int_set(count: int) -> dict[str, object]:
    """{0, ..., count - 1}."""
    return {"set": list(range(count))}


# ======================================================================= the machines' specs


def _stream_metadata_constants(lines: Sequence[TraceLine]) -> dict[str, object]:
    """Constants just large enough for the trace; every Check* switch on (the real spec)."""
    nodes = fn_keys(lines, "nodeEpoch")
    offsets = ints_of(lines, "streamStart", "streamEnd") + [
        v
        for var in ("ranges", "streamSetObjects", "streamObjects")
        for v in fields_of(lines, var, "start", "end")
        if isinstance(v, int)
    ]
    stream_epochs = ints_of(lines, "streamEpoch", "rangeIndex") + [
        v for v in fields_of(lines, "ranges", "epoch", "index") if isinstance(v, int)
    ]
    switches = (
        "CheckRangeOwner",
        "CheckStreamEpoch",
        "CheckObjectState",
        "CheckContinuity",
        "CheckOpenFence",
        "CheckExpireState",
        "TrimMovesEnd",
        "CheckCompactedObjects",
        "CheckCompactionCoverage",
    )
    return {
        "Nodes": {"set": nodes},
        "Streams": int_set(max(ints_of(lines, "nextStreamId"), default=0)),
        "Objects": int_set(max(ints_of(lines, "nextObjectId"), default=0)),
        "MaxNodeEpoch": max([0, *ints_of(lines, "nodeEpoch")]),
        "MaxStreamEpoch": max([0, *stream_epochs]),
        "MaxOffset": max([1, *offsets]),
        "MaxPerturbedNodes": len(nodes),
        **dict.fromkeys(switches, True),
    }


STREAM_METADATA = TraceSpec(
    name="StreamMetadata",
    module="MCStreamMetadata",
    constants=_stream_metadata_constants,
    invariants=(
        "TypeOK",
        "SingleWriter",
        "RangesContiguous",
        "ObjectsCoverStream",
        "NoFencedCommitVisible",
        "ExpiredNeverCommitted",
        "NothingReferencedIsDestroyed",
    ),
    # The image knows streams and objects below its next ids only; the spec's functions range
    # over the cfg's Streams and Objects, whose higher ids stay "NONE" until handed out.
    partial=frozenset(
        {
            "streamState",
            "streamEpoch",
            "rangeIndex",
            "streamStart",
            "streamEnd",
            "ranges",
            "objectState",
        }
    ),
    # The KV store (and the producer-id counter kept in it) is not in the spec.
    unmodelled=frozenset({"PutKV", "DeleteKV", "AllocateProducerIds"}),
)


def _initial_lines(lines: Sequence[TraceLine]) -> list[TraceLine]:
    """Line 1 of every trace (the constants see the lines of all traces of a batch)."""
    return [line for line in lines if line.action == "Init"]


def _route_epoch_constants(lines: Sequence[TraceLine]) -> dict[str, object]:
    """Nodes, bounds just large enough for the trace, the fence gap of line 1; the protocol's
    switches (every check on, AutoMQ's count rule)."""
    gaps = set()
    for line in _initial_lines(lines):
        route, fenced = line.state.get("route"), line.state.get("fenced")
        if isinstance(route, int) and isinstance(fenced, int):
            gaps.add(route - fenced)
    if len(gaps) != 1:
        raise TraceError(f"the traces must start with one fence gap (route - fenced), not {gaps}")
    (gap,) = gaps
    return {
        "Nodes": {"set": fn_keys(lines, "up")},
        "MaxEpoch": max([0, *ints_of(lines, "route")]),
        "MaxWrites": max([0, *seq_lengths(lines, "reqs")]),
        "MaxCrashes": max([0, *ints_of(lines, "crashes")]),
        "FenceGap": gap,
        **dict.fromkeys(
            ("CheckFence", "WaitEarlierEpochs", "CommittedMonotone", "RestartCatchesUp"), True
        ),
        "CountRule": "UpOrOpenStreams",
    }


ROUTE_EPOCH = TraceSpec(
    name="RouteEpoch",
    module="MCRouteEpoch",
    constants=_route_epoch_constants,
    invariants=("TypeOK", "TrimSafe", "EpochsOrdered"),
)


def _confirm_wal_constants(lines: Sequence[TraceLine]) -> dict[str, object]:
    """The sources of ``channel`` (the first is the Reader, which only a mutation reads), bounds
    just large enough for the trace, every switch on (the real spec)."""
    sources = fn_keys(lines, "channel")
    if not sources:
        raise TraceError("channel names no source")
    return {
        "Sources": {"set": sources},
        "NoNode": {"model": "NoNode"},  # the spec's own model value
        "Reader": sources[0],
        "MaxProduces": max([1, *ints_of(lines, "nextProduce")]) - 1,
        "MaxWal": max([0, *seq_lengths(lines, "wal")]),
        "MaxRestarts": max([0, *ints_of(lines, "restarts")]),
        **dict.fromkeys(
            (
                "ReportConfirmed",
                "ReplayAtPartitionOffset",
                "ResolveViaSource",
                "ReplayBeforeAdvance",
            ),
            True,
        ),
    }


CONFIRM_WAL = TraceSpec(
    name="ConfirmWal",
    module="MCConfirmWal",
    constants=_confirm_wal_constants,
    invariants=(
        "TypeOK",
        "NoReadBeyondConfirm",
        "ReplayIdempotent",
        "ResolvedDataMatches",
        "SnapshotsConverge",
        "ExposedReadable",
    ),
)


def _fn_values(lines: Sequence[TraceLine], *variables: str) -> list[int]:
    """The integers among the values (not the keys) of functions, functions of functions
    included, of the named variables on every line."""

    def values(value: object) -> Iterator[int]:
        if isinstance(value, dict) and isinstance(value.get("fn"), list):
            for pair in value["fn"]:
                if isinstance(pair, list) and len(pair) == 2:
                    yield from values(pair[1])
        elif isinstance(value, int) and not isinstance(value, bool):
            yield value

    return [v for line in lines for name in variables for v in values(line.state.get(name))]


def _failover_constants(lines: Sequence[TraceLine]) -> dict[str, object]:
    """Nodes and streams of the trace; bounds just large enough for it (the ghost variables
    ``crashes`` and ``perturbed`` are not traced: every Crash line may count, every node may be
    perturbed); one failover in flight and every switch on (the protocol)."""
    nodes = fn_keys(lines, "phase")
    node_epochs = ints_of(lines, "nodeEpoch") + [
        v
        for var, names in (
            ("reservation", ("epoch",)),
            ("acked", ("nepoch",)),
            ("contexts", ("epoch",)),
            ("task", ("epoch",)),
            ("completed", ("epoch",)),
        )
        for v in fields_of(lines, var, *names)
        if isinstance(v, int)
    ]
    stream_epochs = _fn_values(lines, "streamEpoch", "leads") + [
        v
        for var in ("wal", "pending", "acked")
        for v in fields_of(lines, var, "sepoch")
        if isinstance(v, int)
    ]
    return {
        "Nodes": {"set": nodes},
        "Streams": {"set": fn_keys(lines, "streamState")},
        "MaxRecords": max([1, *ints_of(lines, "nextRecord")]) - 1,
        "MaxNodeEpoch": max([0, *node_epochs]),
        "MaxStreamEpoch": max([0, *stream_epochs]),
        "MaxCrashes": sum(line.action == "Crash" for line in lines),
        "MaxPerturbed": len(nodes),
        "MaxInFlight": 1,
        **dict.fromkeys(
            ("FenceBeforeRead", "VerifyReservation", "OpenBumpsEpoch", "UploadBeforeClose"), True
        ),
    }


FAILOVER = TraceSpec(
    name="Failover",
    module="MCFailover",
    constants=_failover_constants,
    invariants=(
        "TypeOK",
        "NoAckedRecordLost",
        "AckedRecordDurable",
        "ZombieNeverAcked",
        "SingleOpenerPerEpoch",
        "OneFailoverInFlight",
    ),
)


def _placement_constants(lines: Sequence[TraceLine]) -> dict[str, object]:
    """Brokers, partitions and tagged streams of the trace; epochs just large enough for it;
    the spec's own model values; every switch on (the real spec)."""
    return {
        "Brokers": {"set": fn_keys(lines, "nodeEpoch")},
        "Partitions": {"set": fn_keys(lines, "leader")},
        "Streams": {"set": fn_keys(lines, "streamState")},
        "NoBroker": {"model": "NoBroker"},  # the spec's own model values
        "NoPartition": {"model": "NoPartition"},
        "MaxNodeEpoch": max([0, *_fn_values(lines, "nodeEpoch")]),
        "MaxLeaderEpoch": max([0, *_fn_values(lines, "leaderEpoch", "streamEpoch")]),
        **dict.fromkeys(
            ("CheckLiveTarget", "CheckAssignee", "CheckSiblings", "BumpLeaderEpoch"), True
        ),
    }


PLACEMENT = TraceSpec(
    name="Placement",
    module="MCPlacement",
    constants=_placement_constants,
    invariants=(
        "TypeOK",
        "PartitionsOnLiveBrokers",
        "OneOwnerPerPartition",
        "SingleOpenerPerEpoch",
        "OpenOnlyByAssignee",
    ),
    # A broker, partition or stream of another trace of the batch (or not there yet) has the
    # spec's initial values: never registered, not created, not created.
    defaults={
        "nodeEpoch": -1,
        "regEpoch": -1,
        "fenced": True,
        "shutdown": False,
        "leader": {"model": "NoBroker"},
        "leaderEpoch": -1,
        "streamPartition": {"model": "NoPartition"},
        "streamState": "NONE",
        "streamEpoch": -1,
        "owner": {"model": "NoBroker"},
    },
    # Every variable but the history is observed on every key: TLC checks each line against the
    # spec's constraints instead of enumerating the moves a step could make.
    observe_first=True,
    # ElectLeaders moves only a partition left without a broker while one is live, which
    # PartitionsOnLiveBrokers excludes: in a run it is always refused, a stutter.
    unmodelled=frozenset({"ElectLeaders"}),
)


def _transaction_constants(lines: Sequence[TraceLine]) -> dict[str, object]:
    """The instances and partitions of the trace; bounds just large enough for it (epochs,
    writes, transactions an instance began); both switches on (the real spec). A trace of the
    coordinator alone (a real run: no instance, no write observed) gets as many instances as
    it has InitProducerId steps (at least two), and as many transactions an instance as it has
    EndTxn lines."""
    partitions = fn_keys(lines, "partitionEpoch")
    partitions += [p for p in fn_keys(lines, "log") if p not in partitions]
    partitions += [
        p
        for p in values_of(lines, "txnPartitions", "pendingMarkers")
        if isinstance(p, str) and p not in partitions
    ]
    instances = fn_keys(lines, "instanceState")
    attempts = _fn_values(lines, "attempt")
    if not instances:  # the most InitProducerId steps, and EndTxn lines, of one trace
        inits, ends, count = [0], [0], {"InitProducerId": 0, "EndTxn": 0}
        for number, line in enumerate(lines):
            if line.action == "Init":
                count = {"InitProducerId": 0, "EndTxn": 0}
            elif line.action == "EndTxn" or (
                line.action == "InitProducerId" and lines[number - 1].state != line.state
            ):
                count[line.action] += 1
            inits.append(count["InitProducerId"])
            ends.append(count["EndTxn"])
        instances = [f"i{n}" for n in range(1, max(2, *inits) + 1)]
        attempts = attempts or [max(ends)]
    epochs = (
        ints_of(lines, "producerEpoch")
        + _fn_values(lines, "partitionEpoch", "openTxn", "instanceEpoch")
        + [v for var in ("inFlight", "log") for v in fields_of(lines, var, "e")]
    )
    writes = ints_of(lines, "sent") + [
        v for var in ("inFlight", "log") for v in fields_of(lines, var, "w")
    ]
    return {
        "Instances": {"set": instances},
        "Partitions": {"set": partitions},
        "MaxEpoch": max([0, *(e for e in epochs if isinstance(e, int))]),
        "MaxWrites": max([0, *(w for w in writes if isinstance(w, int))]),
        "MaxAttempts": max([1, *attempts]),
        "BumpOnFence": True,
        "VerifyPartitions": True,
    }


TRANSACTION = TraceSpec(
    name="Transaction",
    module="MCTransaction",
    constants=_transaction_constants,
    invariants=(
        "TypeOK",
        "AllOrNothing",
        "OutcomeAsAnswered",
        "NoZombieCommit",
        "NoHangingTransaction",
        "MarkersNotStale",
    ),
    # A trace of a real run names, on a marker's line, only the partition it was written to.
    partial=frozenset({"log"}),
    # The expiry of an idle transactional id (Dead, then forgotten) is the machine's, not the
    # spec's: as a stutter it changes the id's state, so a trace holding one is rejected there.
    unmodelled=frozenset({"ExpireTransactionalId"}),
)

# THE table of machines whose traces can be validated; add one TraceSpec per spec.
TRACE_SPECS: dict[str, TraceSpec] = {
    spec.name: spec
    for spec in (STREAM_METADATA, ROUTE_EPOCH, CONFIRM_WAL, FAILOVER, PLACEMENT, TRANSACTION)
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("trace", type=Path, help="NDJSON trace")
    parser.add_argument("--spec", required=True, choices=sorted(TRACE_SPECS))
    parser.add_argument(
        "--const",
        action="append",
        default=[],
        metavar="NAME=EXPR",
        help="override a constant with a TLA+ expression (e.g. CheckStreamEpoch=FALSE)",
    )
    parser.add_argument("--keep", type=Path, help="copy the generated module and cfg here")
    parser.add_argument("--timeout", type=int, default=300, help="seconds TLC may run")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.const:
        name, _, expression = item.partition("=")
        if not expression:
            parser.error(f"--const {item!r}: expected NAME=EXPR")
        overrides[name.strip()] = expression.strip()
    try:
        verdict = validate(
            read_ndjson(args.trace),
            args.spec,
            overrides=overrides,
            keep=args.keep,
            timeout_s=args.timeout,
        )
    except TraceError as error:
        print(f"trace_validate: {error}", file=sys.stderr)
        return 2
    print(verdict)
    states = f"{verdict.distinct_states:,}" if verdict.distinct_states is not None else "?"
    print(f"(TLC exit {verdict.exit_code}, {states} distinct states, {verdict.seconds:.1f} s)")
    if not verdict.accepted and verdict.exit_code not in (0, EXIT_SAFETY):
        print(verdict.log_tail, file=sys.stderr)
    return 0 if verdict.accepted else 1


if __name__ == "__main__":
    sys.exit(main())
