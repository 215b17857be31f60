"""docs/architecture.md stays true: its mermaid diagram of rooms and the imports between them is
the import graph of automq_ref/, both ways.

Each diagram node names a room by path (``formats["automq_ref/formats/"]``); a module belongs to
the room with the longest matching path. Every import from one room into another must be an edge
of the diagram, and every edge must be used by at least one import, so the picture can neither
hide a dependency nor keep one that is gone. The size rule of the issue that reshaped the shell
is checked here too: no module under automq_ref/ is longer than 1,000 lines.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.imports import imported_modules, matches

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "automq_ref"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_LINES = 1000

NODE = re.compile(r'^\s*(\w+)\["(automq_ref/[^"]*)"\]', re.MULTILINE)
EDGE = re.compile(r"^\s*(\w+)\s*-->\s*(\w+)\s*$", re.MULTILINE)


def diagram() -> tuple[dict[str, str], set[tuple[str, str]]]:
    """The rooms (node id -> path) and edges of the first mermaid block."""
    text = ARCHITECTURE.read_text()
    blocks = re.findall(r"```mermaid\n(.*?)```", text, re.DOTALL)
    assert blocks, "docs/architecture.md has no mermaid diagram"
    nodes = dict(NODE.findall(blocks[0]))
    edges = set(EDGE.findall(blocks[0]))
    for source, target in edges:
        assert source in nodes and target in nodes, f"edge {source} --> {target}: unknown node"
    return nodes, edges


def module_path(module: str) -> str:
    """``automq_ref.io.storage.wal_block`` -> ``automq_ref/io/storage/wal_block.py`` (or the
    package's folder)."""
    relative = module.replace(".", "/")
    return relative + "/" if (ROOT / relative).is_dir() else relative + ".py"


def room_of(path: str, nodes: dict[str, str]) -> str:
    matches = [(len(prefix), node) for node, prefix in nodes.items() if path.startswith(prefix)]
    assert matches, f"{path} lies in no room of the diagram"
    return max(matches)[1]


def resolved(name: str) -> str | None:
    """The module or package ``name`` refers to (``a.b.C`` -> ``a.b``); None outside the
    project or for the package's own top (``automq_ref.__version__``)."""
    parts = name.split(".")
    while parts and parts[0] == "automq_ref":
        relative = "/".join(parts)
        if len(parts) > 1 and ((ROOT / relative).is_dir() or (ROOT / f"{relative}.py").is_file()):
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(file: Path) -> set[str]:
    """Every automq_ref module ``file`` imports, at any depth of the file."""
    return {module for name in imported_modules(file) if (module := resolved(name)) is not None}


def actual_edges(nodes: dict[str, str]) -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for file in sorted(PACKAGE.rglob("*.py")):
        source_path = str(file.relative_to(ROOT))
        source = room_of(source_path, nodes)
        for module in imports_of(file):
            target = room_of(module_path(module), nodes)
            if target != source:
                edges.setdefault((source, target), []).append(f"{source_path} -> {module}")
    return edges


def test_every_import_between_rooms_is_drawn() -> None:
    nodes, drawn = diagram()
    undrawn = {edge: why for edge, why in actual_edges(nodes).items() if edge not in drawn}
    assert not undrawn, f"imports the diagram does not draw: {undrawn}"


def test_every_drawn_edge_is_an_import() -> None:
    nodes, drawn = diagram()
    unused = drawn - set(actual_edges(nodes))
    assert not unused, f"edges drawn but not imported: {sorted(unused)}"


def test_every_room_exists() -> None:
    nodes, _ = diagram()
    for node, path in nodes.items():
        assert (ROOT / path).exists(), f"{node}: {path} does not exist"


def test_only_the_composition_root_and_the_client_know_the_controller() -> None:
    """Storage and the Kafka front end reach the controller through its seams (the client and
    the view), never the Controller class: a cluster swaps the seams, not the callers."""
    controller = ("automq_ref.io.metadata.controller",)
    for room in ("io/storage", "kafka"):
        files = sorted((PACKAGE / room).rglob("*.py"))
        assert files, f"no modules under {room}: the check would be vacuous"
        offenders = [
            file.name for file in files if any(matches(m, controller) for m in imports_of(file))
        ]
        assert not offenders, f"{room} imports the Controller: {offenders}"


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        str(file.relative_to(ROOT)): lines
        for file in PACKAGE.rglob("*.py")
        if (lines := len(file.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
