"""docs/traceability.md stays true: for every protocol machine, spec actions, events, handlers
and rules line up by name, and so do spec invariants, checkers and hypothesis invariants.

One machine may carry two specs (StreamMetadata's machine decides the stream requests of
specs/StreamMetadata.tla and the cluster requests of specs/Placement.tla): each spec has its
table, its event union (``<Name>Event``), its invariant tuple and its property machine, and every
event of the machine has a row in one of its tables."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACEABILITY = ROOT / "docs" / "traceability.md"
# Checker cells that name no function: checked between steps, or a liveness property.
NOT_A_FUNCTION = {"(transition)", "(liveness)"}


@dataclass(frozen=True)
class Trio:
    name: str  # the one CapWords name: spec, section, event union prefix, property machine
    module: str  # automq_ref.state_machines.<module>
    tests: str = ""  # tests/properties/test_<tests>.py (default: the module's name)
    invariants: str = "INVARIANTS"  # the machine's tuple of this spec's checkers

    @property
    def spec(self) -> Path:
        return ROOT / "specs" / f"{self.name}.tla"

    def machine(self) -> ModuleType:
        return importlib.import_module(f"automq_ref.state_machines.{self.module}")

    def events(self) -> set[str]:
        return {cls.__name__ for cls in getattr(self.machine(), f"{self.name}Event").__args__}

    def properties(self) -> type:
        tests = importlib.import_module(f"tests.properties.test_{self.tests or self.module}")
        machine = getattr(tests, f"{self.name}Machine")
        assert isinstance(machine, type)
        return machine


def handler(machine: str, cell: str) -> object:
    """A handler cell: ``_on_x`` in the machine's module, or ``step._on_x`` in the module ``step``
    of the machine's package."""
    module, _, function = cell.rpartition(".")
    owner = machine + (f".{module}" if module else "")
    return getattr(importlib.import_module(f"automq_ref.state_machines.{owner}"), function)


TRIOS = [
    Trio("StreamMetadata", "stream_metadata"),
    Trio("Placement", "stream_metadata", tests="placement", invariants="PLACEMENT_INVARIANTS"),
    Trio("RouteEpoch", "route_epoch"),
    Trio("ConfirmWal", "confirm_wal"),
    Trio("Failover", "failover"),
    Trio("Transaction", "transaction"),
]
PRESENT = [trio for trio in TRIOS if trio.spec.exists()]


def table_rows(section: str, first_header: str) -> list[list[str]]:
    """Rows of the table under ``section`` whose header starts with ``first_header``."""
    text = TRACEABILITY.read_text()
    assert f"## {section}\n" in text, f"docs/traceability.md has no section {section}"
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows: list[list[str]] = []
    in_table = False
    for line in body.splitlines():
        if line.startswith(f"| {first_header}"):
            in_table = True
            continue
        if in_table and line.startswith("| ---"):
            continue
        if in_table and line.startswith("|"):
            rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
        elif in_table:
            break
    assert rows, f"no {first_header} table in {section}"
    return rows


def spec_definitions(trio: Trio) -> set[str]:
    return set(re.findall(r"^([A-Z][A-Za-z]*)\s*(?:\(|==)", trio.spec.read_text(), re.MULTILINE))


def spec_actions(trio: Trio) -> set[str]:
    return set(re.findall(r"\\\* ACTION: ([A-Z][A-Za-z]*)\b", trio.spec.read_text()))


@pytest.mark.parametrize("trio", PRESENT, ids=lambda trio: trio.name)
def test_action_table_matches_spec_machine_and_rules(trio: Trio) -> None:
    machine, properties = trio.machine(), trio.properties()
    rows = table_rows(trio.name, "TLA+ action")
    definitions = spec_definitions(trio)
    for action, event, handler_cell, rule in rows:
        if action != "-":
            # One name; a second form of one request is an action named after the request
            # and the form (CommitStreamSetObjectCompaction is CommitStreamSetObject's).
            assert action.startswith(event), f"{action} and {event} must share one name"
            assert action in definitions, f"{action} is not defined in {trio.spec.name}"
        assert isinstance(getattr(machine, event), type), event
        assert callable(handler(trio.module, handler_cell)), handler_cell
        assert callable(getattr(properties, rule)), rule
    table_actions = {row[0] for row in rows if row[0] != "-"}
    assert table_actions == spec_actions(trio), "spec ACTION headers and the table differ"
    events = trio.events()
    listed = {row[1] for row in rows}
    assert listed <= events, f"{sorted(listed - events)} are not in {trio.name}Event"
    # Every event of the union has a row here or in a table of another spec of the machine.
    elsewhere = {
        row[1]
        for other in PRESENT
        if other.module == trio.module and other.name != trio.name
        for row in table_rows(other.name, "TLA+ action")
    }
    assert events - elsewhere <= listed, f"every event class needs a row: {events - listed}"


@pytest.mark.parametrize("trio", PRESENT, ids=lambda trio: trio.name)
def test_invariant_table_matches_spec_machine_and_properties(trio: Trio) -> None:
    machine, properties = trio.machine(), trio.properties()
    definitions = spec_definitions(trio)
    rows = table_rows(trio.name, "TLA+ invariant")
    for invariant, checker, hypothesis_invariant in rows:
        assert invariant in definitions, f"{invariant} is not defined in {trio.spec.name}"
        if checker not in NOT_A_FUNCTION:
            assert checker.startswith("inv_") and callable(getattr(machine, checker)), checker
        assert callable(getattr(properties, hypothesis_invariant)), hypothesis_invariant
    listed = {row[1] for row in rows}
    for checker in getattr(machine, trio.invariants):
        assert checker.__name__ in listed, f"{checker.__name__} has no row"


def test_every_spec_is_traced() -> None:
    specs = {path.stem for path in (ROOT / "specs").glob("*.tla")}
    protocols = {name for name in specs if not name.startswith(("MC", "Trace"))}
    assert protocols <= {trio.name for trio in TRIOS}, protocols


def test_group_table_matches_machine_and_rules() -> None:
    """The group machine has no spec; its table still names every event, handler and rule."""
    machine = importlib.import_module("automq_ref.state_machines.group")
    properties = {
        "GroupMachine": importlib.import_module("tests.properties.test_group").GroupMachine,
        "ConsumerGroupMachine": importlib.import_module(
            "tests.properties.test_consumer_group"
        ).ConsumerGroupMachine,
    }
    rows = table_rows("Group", "spec action")
    for action, event, handler_cell, rule in rows:
        assert action == "-", action
        assert isinstance(getattr(machine, event), type), event
        assert callable(handler("group", handler_cell)), handler_cell
        owner, _, name = rule.rpartition(".")
        assert callable(getattr(properties[owner or "GroupMachine"], name)), rule
    events = {cls.__name__ for cls in machine.GroupEvent.__args__}
    assert {row[1] for row in rows} == events, "every event class needs a row"
