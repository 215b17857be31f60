"""docs/traceability.md stays true: spec actions, events, handlers and rules line up by name."""

from __future__ import annotations

import re
from pathlib import Path

from automq_ref.state_machines import stream_metadata
from tests.properties.test_stream_metadata import StreamMetadataMachine

ROOT = Path(__file__).resolve().parents[2]
TRACEABILITY = ROOT / "docs" / "traceability.md"
SPEC = ROOT / "specs" / "StreamMetadata.tla"


def table_rows(section: str, first_header: str) -> list[list[str]]:
    """Rows of the table under ``section`` whose header starts with ``first_header``."""
    text = TRACEABILITY.read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
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


def spec_definitions() -> set[str]:
    return set(re.findall(r"^([A-Z][A-Za-z]*)\s*(?:\(|==)", SPEC.read_text(), re.MULTILINE))


def spec_actions() -> set[str]:
    return set(re.findall(r"\\\* ACTION: ([A-Z][A-Za-z]*)\(", SPEC.read_text()))


def test_action_table_matches_spec_machine_and_rules() -> None:
    rows = table_rows("StreamMetadata", "TLA+ action")
    definitions = spec_definitions()
    for action, event, handler, rule in rows:
        if action != "-":
            assert action == event, f"{action} and {event} must share one name"
            assert action in definitions, f"{action} is not defined in {SPEC.name}"
        assert isinstance(getattr(stream_metadata, event), type), event
        assert callable(getattr(stream_metadata, handler)), handler
        assert callable(getattr(StreamMetadataMachine, rule)), rule
    table_actions = {row[0] for row in rows if row[0] != "-"}
    assert table_actions == spec_actions(), "spec ACTION headers and the table differ"
    events = {cls.__name__ for cls in stream_metadata.StreamMetadataEvent.__args__}
    assert {row[1] for row in rows} == events, "every event class needs a row"


def test_invariant_table_matches_spec_machine_and_properties() -> None:
    definitions = spec_definitions()
    for invariant, checker, hypothesis_invariant in table_rows("StreamMetadata", "TLA+ invariant"):
        assert invariant in definitions, f"{invariant} is not defined in {SPEC.name}"
        if checker != "(transition)":
            assert callable(getattr(stream_metadata, checker)), checker
            assert checker in {f.__name__ for f in stream_metadata.INVARIANTS}, checker
        assert callable(getattr(StreamMetadataMachine, hypothesis_invariant))
