"""The shell's rooms stay stacked: io/metadata below io/storage below kafka below node. The
metadata room imports nothing of storage (the object lifecycle, which deletes objects, lives in
io/storage), and neither imports the Kafka front end or the composition root; storage and kafka
reach the controller only through its seams (client and view), never the Controller class."""

from __future__ import annotations

import ast
from pathlib import Path

import automq_ref

ROOT = Path(automq_ref.__file__).parent


def imports_of(folder: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    assert found, f"no modules under {folder}: the check would be vacuous"
    return found


def offenders(folder: str, forbidden: tuple[str, ...]) -> set[str]:
    return {
        f"{module}: {name}"
        for module, names in imports_of(folder).items()
        for name in names
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    }


def test_metadata_imports_neither_storage_nor_anything_above() -> None:
    above = ("automq_ref.io.storage", "automq_ref.kafka", "automq_ref.node")
    assert not offenders("io/metadata", above)


def test_storage_imports_nothing_above_it() -> None:
    assert not offenders("io/storage", ("automq_ref.kafka", "automq_ref.node"))


def test_only_the_composition_root_and_the_client_know_the_controller() -> None:
    controller = ("automq_ref.io.metadata.controller",)
    assert not offenders("io/storage", controller)
    assert not offenders("kafka", controller)
