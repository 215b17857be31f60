"""``automq-ref produce`` shows its progress as a person's terminal wants it: a bar redrawn in
place when stderr is a terminal (a pseudo-terminal here), plain lines when it is a pipe.

Both run the command as a user would, against the module's broker process. The lines' cadence
is the unit tests' business (``tests/unit/test_progress.py``, on an injected clock); here only
what each mode looks like: the first and the final state, and carriage returns or none.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from automq_ref.checker.cluster import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 20_000


def produce_command(broker: BrokerProcess, topic: str, manifest: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "automq_ref.cli",
        "produce",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--partitions",
        "2",
        "--records",
        str(RECORDS),
        "--manifest",
        str(manifest),
    ]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def test_off_a_terminal_produce_prints_plain_lines(broker: BrokerProcess, tmp_path: Path) -> None:
    result = subprocess.run(
        produce_command(broker, "progress-plain", tmp_path / "plain.json"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == (
        f"automq-ref produce: 0 s: creating the topic, 0/{RECORDS:,} acknowledged, 0 queued"
    )
    assert re.fullmatch(
        rf"automq-ref produce: \d+ s: done, {RECORDS:,}/{RECORDS:,} acknowledged, "
        rf"{RECORDS:,} queued, [\d,]+ records/s",
        lines[-1],
    ), lines[-1]
    assert all(line.startswith("automq-ref produce: ") for line in lines)
    assert result.stdout.startswith(f"produced {RECORDS} records")


def test_on_a_terminal_produce_draws_a_bar(broker: BrokerProcess, tmp_path: Path) -> None:
    controller, attached = os.openpty()
    process = subprocess.Popen(
        produce_command(broker, "progress-bar", tmp_path / "bar.json"),
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=attached,
        text=True,
    )
    os.close(attached)
    chunks: list[bytes] = []

    def drain() -> None:  # until the last writer closes (EIO on Linux, b"" elsewhere)
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    stdout, _ = process.communicate(timeout=120)
    reader.join(timeout=30)
    os.close(controller)
    assert process.returncode == 0
    # The terminal turns each \n into \r\n; the bar's own carriage returns are the others.
    terminal = b"".join(chunks).decode().replace("\r\n", "\n")
    draws = terminal.split("\r")[1:]
    assert draws, terminal
    assert draws[0].startswith("produce [----------]   0% 0 s: creating the topic")
    assert draws[-1].startswith("produce [##########] 100% "), draws[-1]
    assert f"done, {RECORDS:,}/{RECORDS:,} acknowledged" in draws[-1]
    assert terminal.endswith("\x1b[K\n")
    assert terminal.count("\n") == 1  # the bar's line ends once, at the end
    assert stdout.startswith(f"produced {RECORDS} records")
