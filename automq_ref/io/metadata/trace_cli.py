"""What the recordings of real runs share, whichever machine they trace
(:mod:`automq_ref.io.metadata.failover_trace`, :mod:`automq_ref.io.metadata.route_epoch_trace`):
one process's trace file appended line by line, a run's files read back, the spec's trace lines
made from a replay, and the command that writes those lines for TLC and says what the machine
refused and where the shell differed from it.

Each machine's module keeps what is its own: the fields of its recorded steps, its merge, its
replay and its comparison of the shell with the machine. They share this one so that the file
layout (``<directory>/<process>.ndjson``), the NDJSON ``specs/trace_validate.py`` reads and the
command's words stay one and the same for every traced machine.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self, TypeVar

S = TypeVar("S")
T = TypeVar("T")

# (action, spec variables): one line of the trace TLC checks.
TlaLine = tuple[str, dict[str, object]]


class TraceFile:
    """One process's trace file, ``<directory>/<process>.ndjson``; ``index`` reads the metadata
    log index the process has applied."""

    def __init__(self, directory: Path, process: str, index: Callable[[], int]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{process}.ndjson"
        self.process = process
        self.index = index
        self._seq = 0

    @classmethod
    def in_directory(
        cls, directory: str | Path | None, process: str, index: Callable[[], int]
    ) -> Self | None:
        """The process's trace, or None when recording is off (no directory)."""
        if not directory:
            return None
        return cls(Path(directory), process, index)

    def _next(self, index: int | None) -> tuple[int, int]:
        """The next step's sequence number and the index it is placed at (by default the index
        applied now)."""
        self._seq += 1
        return self._seq, self.index() if index is None else index

    def _append(self, line: str) -> None:
        with self.path.open("a") as out:
            out.write(line + "\n")


def read_lines(directory: Path, parse: Callable[[str], T]) -> list[T]:
    """Every process's lines under ``directory``, each read by ``parse``, unordered."""
    steps: list[T] = []
    for path in sorted(directory.glob("*.ndjson")):
        steps += [parse(line) for line in path.read_text().splitlines() if line]
    return steps


def tla_lines(
    events: Sequence[object], states: Sequence[S], tla_state: Callable[[S], dict[str, object]]
) -> list[TlaLine]:
    """(action, spec variables) per line: ``Init`` then one per event, ``states[i]`` the state
    after ``events[i - 1]``."""
    actions = ["Init", *(type(event).__name__ for event in events)]
    return [(action, tla_state(state)) for action, state in zip(actions, states, strict=True)]


@dataclass(frozen=True, slots=True)
class Checked:
    """A run's replay as the command reports it: ``count`` ``noun``\\ s merged (``noun`` also
    names what a refusal's number counts), the spec's trace lines, the machine's refusals
    (1-based number, event, error) and where the shell differed from the machine."""

    noun: str
    count: int
    lines: list[TlaLine]
    refused: Sequence[tuple[int, object, enum.Enum]]
    mismatches: list[str]


def main(prog: str, argv: Sequence[str] | None, check: Callable[[Path], Checked]) -> int:
    """``python -m <prog> DIR OUT``: ``check`` merges and replays the trace files under DIR;
    the spec's trace goes to OUT (the NDJSON ``specs/trace_validate.py`` reads), the refusals
    and mismatches to stdout. Exit 0, or 1 on a mismatch."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("directory", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    checked = check(args.directory)
    with args.out.open("w") as out:
        for action, state in checked.lines:
            out.write(json.dumps({"action": action, "state": state}, sort_keys=True) + "\n")
    print(f"{checked.count} {checked.noun}s from {args.directory} -> {args.out}")
    for number, event, error in checked.refused:
        print(f"refused (a stutter): {checked.noun} {number} {event}: {error.value}")
    for mismatch in checked.mismatches:
        print(f"mismatch: {mismatch}")
    return 1 if checked.mismatches else 0
