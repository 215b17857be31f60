"""Histories of client operations, as Jepsen records them: one JSON object per line.

Every operation is two entries with the same ``process`` and ``index``-ordered times: an
``invoke`` when the client starts it, and its completion: ``ok`` (it happened, with what the
client learned), ``fail`` (it certainly did not happen) or ``info`` (unknown: a timeout or a
disconnect; the operation may or may not have taken effect, now or later). A process runs one
operation at a time; after an ``info`` it never completes that operation.

Operations (``f``):

- ``send``: ``value`` is ``{"partition": p, "value": v}`` at invoke; at ok the broker's answer
  adds ``"offset": o``. Values are unique per history (the workload makes them so).
- ``poll``: at invoke ``{"partitions": [p, ...]}``; at ok ``{"records": [[p, offset, value],
  ...]}`` in the order the client received them.
- ``read_all``: the final phase, a poll from each partition's start to its end, recorded as a
  poll whose ``value`` also carries ``{"final": true}``.

Times are monotonic nanoseconds (``time_ns``); ``index`` is the entry's position in the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

OpType = Literal["invoke", "ok", "fail", "info"]
TYPES: tuple[OpType, ...] = ("invoke", "ok", "fail", "info")


class HistoryError(ValueError):
    """A history that breaks the format's rules (not an anomaly of the system under test)."""


@dataclass(frozen=True, slots=True)
class Op:
    index: int
    process: int
    type: OpType
    f: str
    time_ns: int
    value: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "index": self.index,
                "process": self.process,
                "type": self.type,
                "f": self.f,
                "time_ns": self.time_ns,
                "value": self.value,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, line: str) -> Op:
        raw = json.loads(line)
        if raw.get("type") not in TYPES:
            raise HistoryError(f"entry {raw.get('index')}: type {raw.get('type')!r}")
        return cls(
            int(raw["index"]),
            int(raw["process"]),
            raw["type"],
            str(raw["f"]),
            int(raw["time_ns"]),
            dict(raw.get("value") or {}),
        )


@dataclass(frozen=True, slots=True)
class Operation:
    """An invoke paired with its completion (``completion`` None: still open at the end,
    which counts as ``info``)."""

    invoke: Op
    completion: Op | None

    @property
    def outcome(self) -> OpType:
        return "info" if self.completion is None else self.completion.type

    @property
    def f(self) -> str:
        return self.invoke.f


def write_history(path: Path, ops: Iterable[Op]) -> None:
    with path.open("w") as out:
        for op in ops:
            out.write(op.to_json() + "\n")


def read_history(path: Path) -> list[Op]:
    with path.open() as lines:
        return [Op.from_json(line) for line in lines if line.strip()]


def pair(ops: Iterable[Op]) -> list[Operation]:
    """Match each invoke with its process's next completion; check the format's rules."""
    open_by_process: dict[int, Op] = {}
    done: list[Operation] = []
    for op in ops:
        if op.type == "invoke":
            if op.process in open_by_process:
                raise HistoryError(f"entry {op.index}: process {op.process} invokes twice")
            open_by_process[op.process] = op
            continue
        invoke = open_by_process.pop(op.process, None)
        if invoke is None:
            raise HistoryError(f"entry {op.index}: {op.type} with no invoke")
        if invoke.f != op.f:
            raise HistoryError(f"entry {op.index}: completes {invoke.f} as {op.f}")
        done.append(Operation(invoke, op))
    done.extend(Operation(invoke, None) for invoke in open_by_process.values())
    done.sort(key=lambda operation: operation.invoke.index)
    return done


class Recorder:
    """Builds a history in memory (thread-safety is the caller's: one lock around it)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(self, process: int, type_: OpType, f: str, time_ns: int, value: dict[str, Any]) -> Op:
        op = Op(len(self.ops), process, type_, f, time_ns, value)
        self.ops.append(op)
        return op

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)
