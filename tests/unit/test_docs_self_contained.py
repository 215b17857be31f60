"""The repository's text stands on its own: a person who clones it has only the clone.

Every tracked Markdown, Python, TLA+ and TLC config file is read, and none may point a reader
outside the repository: no design note that lives beside the project instead of in it (the
AutoMQ, Kafka and verification notes the project was written from), no path into the machine it
was written on (a home or work directory, a sibling ``shared`` folder), and no relative Markdown
link that climbs out of the repository or names a file that is not there. Upstream sources are
cited by their public names (a class, a KIP) and facts are stated in the repository's own docs.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = (".md", ".py", ".tla", ".cfg")

# Written so that this file does not match itself.
OUTSIDE = (
    (
        re.compile(r"\b(?:AUTOMQ|KAFKA|VERIFICATION(?:_RESEARCH)?)\.md\b"),
        "a design note kept outside",
    ),
    (re.compile(r"(?<![\w.])/(?:work|home|Users|root)/"), "an absolute path on one machine"),
    (re.compile(r"\.\./shared\b"), "a folder beside the checkout"),
)
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def tracked_files() -> list[Path]:
    """The files git tracks (every file under the root, less tool folders, without git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.decode()
        paths = [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "__pycache__", "build", "dist", "node_modules"}
        paths = [
            path
            for path in ROOT.rglob("*")
            if not skip.intersection(path.relative_to(ROOT).parts) and path.is_file()
        ]
    return sorted(path for path in paths if path.suffix in SUFFIXES and path.is_file())


def test_the_scan_sees_the_docs_specs_and_code() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in tracked_files()}
    assert {"README.md", "specs/README.md", "specs/StreamMetadata.tla"} <= names
    assert any(name.endswith(".cfg") for name in names)
    assert any(name.startswith("automq_ref/") and name.endswith(".py") for name in names)


def test_the_patterns_catch_what_they_are_for() -> None:
    for sample in (
        "see " + "AUTOMQ" + ".md 4.3",
        "(" + "KAFKA" + ".md section 4)",
        "VERIFICATION" + "_RESEARCH.md",
        "read /" + "work/shared/design",
        "default .." + "/shared/bench/peer.sh",
    ):
        assert any(pattern.search(sample) for pattern, _ in OUTSIDE), sample
    for sample in ("docs/verification.md", "--keep /tmp/tv", "specs/README.md", "../docs/x.md"):
        assert not any(pattern.search(sample) for pattern, _ in OUTSIDE), sample


def test_no_file_names_a_note_or_path_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for pattern, what in OUTSIDE:
                match = pattern.search(line)
                if match:
                    where = f"{path.relative_to(ROOT)}:{number}"
                    found.append(f"{where}: {what}: {match.group(0)!r}")
    assert not found, "text that points outside the repository:\n" + "\n".join(found)


def test_relative_markdown_links_stay_inside_and_exist() -> None:
    found = []
    for path in tracked_files():
        if path.suffix != ".md":
            continue
        for target in MARKDOWN_LINK.findall(path.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, a mail address or an anchor in the same page
            resolved = (path.parent / target.split("#", 1)[0]).resolve()
            if not resolved.is_relative_to(ROOT):
                found.append(f"{path.relative_to(ROOT)}: {target} leaves the repository")
            elif not resolved.exists():
                found.append(f"{path.relative_to(ROOT)}: {target} does not exist")
    assert not found, "\n".join(found)
