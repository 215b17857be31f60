"""``python -m automq_ref.checker.serve [serve options]``: ``automq-ref serve`` for the checker.

The broker processes of the checker and of the tests start here (``BrokerProcess``), because
the test-only WAL modes of :mod:`automq_ref.checker.broken` must not be importable from the
broker's own modules. The broker's start-up still hands the ``automq.ref.test.*`` WAL flags to
``BlockWal.open_file`` as ``undo_journal`` / ``ack_before_fsync``, which the production WAL
refuses. Until the start-up takes a WAL opener instead (then this process passes the one from
``seams_for``), :func:`install_wal_modes` replaces ``BlockWal.open_file`` in this process with one
that turns those flags into the WAL's seams.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from automq_ref import cli
from automq_ref.checker.broken import ACK_BEFORE_FSYNC, WAL_UNDO_JOURNAL, wal_seams
from automq_ref.io.storage.wal_block import BlockWal


def install_wal_modes() -> None:
    """Make ``BlockWal.open_file`` of this process honour the flags through the seams."""
    production_open_file = BlockWal.open_file

    async def open_file(
        cls: type[BlockWal],
        path: Path | str,
        /,
        *,
        undo_journal: bool = False,
        ack_before_fsync: bool = False,
        **options: Any,
    ) -> BlockWal:
        modes = {WAL_UNDO_JOURNAL} if undo_journal else set()
        if ack_before_fsync:
            modes.add(ACK_BEFORE_FSYNC)
        wrap_device, sync_policy = wal_seams(modes, path)
        if wrap_device is not None:
            options["wrap_device"] = wrap_device
        if sync_policy is not None:
            options["sync_policy"] = sync_policy
        return await production_open_file(path, **options)

    BlockWal.open_file = classmethod(open_file)  # type: ignore[method-assign, assignment]


def main(argv: list[str] | None = None) -> int:
    install_wal_modes()
    return cli.main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
