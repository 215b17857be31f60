"""A loop device over a sparse file, for the tests that need a real raw block device.

``losetup -f --show FILE`` attaches the first free loop device; it needs root and the
``losetup`` command (util-linux). Without them the caller skips, naming which is missing. The
device is always detached afterwards (``losetup -d``), whether the test passed or failed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path


def why_no_loop_device() -> str | None:
    """Why this process cannot attach a loop device, or None if it can try."""
    if os.geteuid() != 0:
        return "attaching a loop device needs root"
    if shutil.which("losetup") is None:
        return "losetup (util-linux) is not installed"
    return None


@contextlib.contextmanager
def loop_device(backing: Path, size_bytes: int) -> Iterator[Path]:
    """A loop device over a new sparse file of ``size_bytes`` at ``backing``; raises
    ``OSError`` (with losetup's message) when none can be attached."""
    with open(backing, "wb") as file:
        file.truncate(size_bytes)
    attached = subprocess.run(
        ["losetup", "-f", "--show", str(backing)], capture_output=True, text=True, check=False
    )
    if attached.returncode != 0:
        raise OSError(f"losetup -f --show failed: {attached.stderr.strip()}")
    device = Path(attached.stdout.strip())
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", str(device)], capture_output=True, check=False)
