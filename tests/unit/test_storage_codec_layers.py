"""The naming rules and the storage codecs stay at the bottom: naming imports nothing of the
project, the codecs only ``formats``, ``vocabulary`` and ``errors``, so that a reader of a
broker's bytes (the Spark source) does not drag in the broker, the storage or the machines."""

from __future__ import annotations

import ast
from pathlib import Path

import automq_ref

ROOT = Path(automq_ref.__file__).parent
CODECS = ["meta_stream", "topic_record", "group_record", "kv_integer", "json_document"]
ALLOWED_FOR_CODECS = ("automq_ref.formats", "automq_ref.vocabulary", "automq_ref.errors")


def project_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name for name in names if name.split(".")[0] == "automq_ref"}


def test_naming_imports_nothing_of_the_project() -> None:
    assert project_imports(ROOT / "vocabulary" / "naming.py") == set()


def test_storage_codecs_import_only_the_bottom_layers() -> None:
    offenders = {
        f"{codec}: {module}"
        for codec in CODECS
        for module in project_imports(ROOT / "formats" / f"{codec}.py")
        if not any(module == ok or module.startswith(ok + ".") for ok in ALLOWED_FOR_CODECS)
    }
    assert not offenders, offenders
