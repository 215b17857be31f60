"""docs/quickstart.md works as written: its commands run, and print what the page shows.

The page marks what this test runs by the fenced blocks' info strings:

- ``sh quickstart-broker``: the broker (``make run``). The test asks make what ``make run`` would
  run (``make -n run``: nothing is installed or started by it), and runs that command with this
  interpreter, in the background, on a free port and a temporary data directory (9092 is left
  to people);
- ``sh quickstart``: a shell script run to its end (``bash -e -o pipefail``), which must succeed;
- ``text output`` right after either: what that block printed (stdout and stderr together);
- ``text quickstart-ctrl-c``: what the broker prints when it gets Ctrl-C (SIGINT).

In every command ``127.0.0.1:9092`` becomes the test broker's address, ``.venv/bin/automq-ref``
and ``.venv/bin/python`` this interpreter (with the project on PYTHONPATH); the scripts run in a
temporary directory, so ``./data``, ``check-out`` and the other files the page makes land there.

The page's output lines must appear in the output in the page's order (other lines may come
between: ``...`` marks where the page cut some). Numbers, times and dates vary between runs, so
each number matches any number, and an elapsed time (``17 s``) any elapsed time (``1m02s``); the
rest of each line must be equal. A leading ``^C`` (the terminal's echo of Ctrl-C) is not
output. The verify step runs Spark once (20-40 s); the whole page takes about a minute and a half.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from automq_ref.checker.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
TOKEN = re.compile(r"\d+m\d\ds|\d[\d,.]* s\b|\d[\d,.]*")
ELAPSED = r"(?:\d[\d,.]* s|\d+m\d\ds)"
NUMBER = r"\d[\d,.]*"
VENV_COMMAND = re.compile(r"(?<![\w/.])\.venv/bin/(automq-ref|python)\b")
START_TIMEOUT_S = 120
STEP_TIMEOUT_S = 600

for tool in ("kcat", "java", "make", "bash"):
    if shutil.which(tool) is None:
        pytest.skip(f"the quickstart needs {tool}", allow_module_level=True)
pytest.importorskip("pyspark", reason="the spark extra is not installed")


@dataclass(frozen=True)
class Block:
    info: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Step:
    kind: str  # quickstart-broker, quickstart, quickstart-ctrl-c
    script: str
    shows: list[str]  # the output lines the page shows


def steps(page: str) -> list[Step]:
    blocks = [Block(tuple(info.split()), text) for info, text in FENCE.findall(page)]
    found: list[Step] = []
    for index, block in enumerate(blocks):
        following = blocks[index + 1] if index + 1 < len(blocks) else None
        output = following is not None and following.info == ("text", "output")
        shows = following.text.splitlines() if following is not None and output else []
        if block.info in (("sh", "quickstart-broker"), ("sh", "quickstart")):
            found.append(Step(block.info[1], block.text, shows))
        elif block.info == ("text", "quickstart-ctrl-c"):
            found.append(Step("quickstart-ctrl-c", "", block.text.splitlines()))
    return found


def line_pattern(line: str) -> re.Pattern[str]:
    """The page's line with every number (and elapsed time) free."""
    parts: list[str] = []
    last = 0
    for match in TOKEN.finditer(line):
        parts.append(re.escape(line[last : match.start()]))
        token = match.group()
        parts.append(ELAPSED if token.endswith("s") else NUMBER)
        last = match.end()
    parts.append(re.escape(line[last:]))
    return re.compile("".join(parts))


def assert_shows(shown: list[str], output: list[str], what: str) -> None:
    """Every line the page shows appears in ``output``, in order."""
    position = 0
    for line in shown:
        line = line.removeprefix("^C").rstrip()
        if line in ("", "..."):
            continue
        pattern = line_pattern(line)
        for index in range(position, len(output)):
            if pattern.fullmatch(output[index].rstrip()):
                position = index + 1
                break
        else:
            printed = "\n".join(output)
            pytest.fail(f"{what}: the page shows {line!r}; not printed (in order):\n{printed}")


def localised(script: str, port: int) -> str:
    python = shlex.quote(sys.executable)
    commands = {"automq-ref": f"{python} -m automq_ref.cli", "python": python}
    script = script.replace("127.0.0.1:9092", f"127.0.0.1:{port}")
    script = VENV_COMMAND.sub(lambda match: commands[match.group(1)], script)
    assert "9092" not in script, script  # the people's port is never used
    return script


def environment() -> dict[str, str]:
    inherited = {
        name: value
        for name, value in os.environ.items()
        if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")  # make -n as at a prompt
    }
    return {**inherited, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


class Broker:
    """The command ``make run`` runs, as a background process whose output is collected."""

    def __init__(self, recipe: str, port: int, directory: Path) -> None:
        words = shlex.split(recipe)
        assert words[0] == ".venv/bin/automq-ref", recipe
        command = [
            sys.executable,
            "-m",
            "automq_ref.cli",
            *words[1:],
            "--override",
            f"listeners=PLAINTEXT://127.0.0.1:{port}",
            "--override",
            f"log.dirs={directory / 'data'}",
            "--override",  # the metrics on a free port too (9464 is left to people)
            "s3.telemetry.metrics.exporter.uri=prometheus://?host=127.0.0.1&port=0",
        ]
        self.process = subprocess.Popen(
            command,
            cwd=directory,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, marker: str, timeout_s: float) -> list[str]:
        """The lines printed up to the first that contains ``marker``."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        while not any(marker in line for line in seen):
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "the broker exited:\n" + "\n".join(seen)
            seen.append(line)
        return seen

    def rest(self) -> list[str]:
        seen: list[str] = []
        while (line := self.lines.get(timeout=60)) is not None:
            seen.append(line)
        return seen


@pytest.fixture
def broker_slot() -> Iterator[list[Broker]]:
    """Whatever broker the page started is stopped at the end, whatever happened."""
    started: list[Broker] = []
    yield started
    for broker in started:
        if broker.process.poll() is None:
            broker.process.kill()
            broker.process.wait(30)


def test_the_quickstart_runs_as_written(tmp_path: Path, broker_slot: list[Broker]) -> None:
    page = steps(QUICKSTART.read_text())
    kinds = [step.kind for step in page]
    assert kinds[0] == "quickstart-broker" and kinds[-1] == "quickstart-ctrl-c", kinds
    assert kinds.count("quickstart") >= 4, kinds  # kcat, Python, check, produce and verify
    assert all(step.shows for step in page), "every step the test runs shows its output"
    port = free_port()
    for step in page:
        if step.kind == "quickstart-broker":
            assert step.script.strip() == "make run"
            dry_run = subprocess.run(
                ["make", "-n", "run"],
                cwd=ROOT,
                env=environment(),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()
            broker = Broker(dry_run[-1], port, tmp_path)
            broker_slot.append(broker)
            output = dry_run + broker.until("serving Kafka on", START_TIMEOUT_S)
            assert_shows(step.shows, output, "make run")
        elif step.kind == "quickstart":
            result = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", localised(step.script, port)],
                cwd=tmp_path,
                env=environment(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=STEP_TIMEOUT_S,
            )
            first = step.script.strip().splitlines()[0]
            assert result.returncode == 0, f"{first}:\n{result.stdout}"
            assert_shows(step.shows, result.stdout.splitlines(), first)
        else:
            broker = broker_slot[0]
            broker.process.send_signal(signal.SIGINT)
            assert broker.process.wait(60) == 0
            assert_shows(step.shows, broker.rest(), "Ctrl-C")


def test_numbers_and_times_are_free_and_the_words_are_not() -> None:
    shown = line_pattern("automq-ref check: 17 s: done, 4,344 sends acknowledged, 1 fault injected")
    assert shown.fullmatch("automq-ref check: 1m02s: done, 12 sends acknowledged, 1 fault injected")
    assert not shown.fullmatch("automq-ref check: 17 s: done, 4,344 sends acknowledged, 1 faults")
    assert not line_pattern("verdict: VALID").fullmatch("verdict: INVALID")
    assert line_pattern("in 0.94 s: 106,001 records/s").fullmatch("in 12.5 s: 7 records/s")
    with pytest.raises(pytest.fail.Exception, match="verdict: VALID"):
        assert_shows(
            ["linearizable: ok", "...", "verdict: VALID"],
            ["verdict: VALID", "linearizable: ok"],
            "order",
        )
