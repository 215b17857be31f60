"""The checker's test-only broker modes, as seams a broker's composition root injects.

A production module never imports this one (``tests/unit/test_checker_isolation.py``); the modes
reach a broker only through the seams it offers, a WAL opener and a hook run before the WAL is
opened (``python -m automq_ref.checker.serve --broken MODE``).

- ``wal-undo-journal``: not broken, a recorder. The WAL
  file's device journals the bytes each write overwrites until the next fsync
  (:class:`automq_ref.checker.faults.UndoJournalBlockDevice`), so that after a kill
  ``lose_unsynced_tail`` can throw away what was never fsynced, as a power loss would.
- ``ack-before-fsync``: broken on purpose. The WAL
  acknowledges a group as soon as it is written and fsyncs only with a header write or once
  ``ACK_BEFORE_FSYNC_SYNC_INTERVAL_S`` has passed since the last sync, so losing the un-fsynced
  tail loses acknowledged records, which the history checker must catch.
- ``discard-wal-at-start``: broken on purpose. The WAL
  file is deleted before it is opened, so what was acknowledged but not yet uploaded is lost.
- ``txn-markers-before-decision``: broken on purpose. The transaction coordinator writes a
  transaction's COMMIT or ABORT markers, one partition after another with
  ``MARKERS_FIRST_PAUSE_S`` between them (a slow partition's broker), before its PrepareCommit
  or PrepareAbort record is appended. A broker killed meanwhile comes back with the transaction
  still Ongoing in its log and some partitions already marked: when the producer's next
  instance fences it, the abort reaches only the partitions not marked yet, and the transaction
  is torn, which the transactional workload's checks must catch.

:func:`seams_for` turns a set of modes into ``(wal_opener, before_open)``: ``wal_opener(config,
node_epoch)`` opens ``config.wal_file`` as the broker would, with the modes' device wrapper and
sync policy; ``before_open(config)`` runs before it. Either is None when no mode needs it.
:func:`decision_seam` gives the transaction coordinator's ``before_decision`` hook of the modes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path
from typing import Final

from automq_ref.checker.faults import UndoJournalBlockDevice, undo_journal_path
from automq_ref.config import BrokerConfig
from automq_ref.io.storage.block_device import BlockDevice
from automq_ref.io.storage.wal_block import BlockWal, SyncPolicy

log = logging.getLogger(__name__)

WAL_UNDO_JOURNAL: Final = "wal-undo-journal"
ACK_BEFORE_FSYNC: Final = "ack-before-fsync"
DISCARD_WAL_AT_START: Final = "discard-wal-at-start"
TXN_MARKERS_BEFORE_DECISION: Final = "txn-markers-before-decision"
MODES: Final = frozenset(
    {WAL_UNDO_JOURNAL, ACK_BEFORE_FSYNC, DISCARD_WAL_AT_START, TXN_MARKERS_BEFORE_DECISION}
)
# How long a txn-markers-before-decision coordinator waits between two partitions' markers: a kill
# tears a transaction only in these pauses, so they are most of a commit's time (the checked
# run's commits that a kill missed had their last marker written before it; the commit call's
# timeout, 3 s, still covers a transaction over three partitions).
MARKERS_FIRST_PAUSE_S: Final = 1.0
# The longest an ack-before-fsync WAL keeps a group acknowledged but unsynced while groups come.
ACK_BEFORE_FSYNC_SYNC_INTERVAL_S: Final = 1.0

WalOpener = Callable[[BrokerConfig, int], Awaitable[BlockWal]]
# The transaction coordinator's ``before_decision`` seam (``transactions.MarkersHook``): given a
# writer per partition of the markers a decision leads to, run before the decision is appended.
MarkersHook = Callable[[Sequence[Callable[[], Awaitable[None]]]], Awaitable[None]]
DeviceWrapper = Callable[[BlockDevice], BlockDevice]


class AckBeforeFsync:
    """A :class:`SyncPolicy` that defers a group's fdatasync while the last sync is recent.

    ``interval_s`` may be changed while the WAL runs (a test opens the window wide or shuts it).
    """

    def __init__(self, interval_s: float = ACK_BEFORE_FSYNC_SYNC_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last_sync_s = time.monotonic()

    def defer_sync(self) -> bool:
        return time.monotonic() - self._last_sync_s < self.interval_s

    def synced(self) -> None:
        self._last_sync_s = time.monotonic()


def undo_journal(wal_path: Path | str) -> DeviceWrapper:
    """A ``wrap_device`` that journals the WAL file's writes to ``<wal>.undo``."""
    journal = undo_journal_path(wal_path)
    return lambda device: UndoJournalBlockDevice(device, journal)


def wal_seams(
    modes: Collection[str], wal_path: Path | str
) -> tuple[DeviceWrapper | None, SyncPolicy | None]:
    """The ``wrap_device`` and ``sync_policy`` of ``BlockWal.open_file`` for ``modes``; each
    call makes a fresh policy (its state belongs to one open WAL)."""
    _check(modes)
    wrap_device = undo_journal(wal_path) if WAL_UNDO_JOURNAL in modes else None
    sync_policy = AckBeforeFsync() if ACK_BEFORE_FSYNC in modes else None
    return wrap_device, sync_policy


def seams_for(
    modes: set[str],
) -> tuple[WalOpener | None, Callable[[BrokerConfig], None] | None]:
    """``(wal_opener, before_open)`` for a broker in ``modes``; None where a mode needs none."""
    _check(modes)
    wal_modes = frozenset(modes & {WAL_UNDO_JOURNAL, ACK_BEFORE_FSYNC})
    wal_opener: WalOpener | None = None
    if wal_modes:

        async def open_wal(config: BrokerConfig, node_epoch: int) -> BlockWal:
            if ACK_BEFORE_FSYNC in wal_modes:
                log.warning("ack-before-fsync: the WAL acknowledges before fsync (test only)")
            wrap_device, sync_policy = wal_seams(wal_modes, config.wal_file)
            return await BlockWal.open_file(
                config.wal_file,
                node_id=config.node_id,
                node_epoch=node_epoch,
                capacity_bytes=config.s3_wal_capacity,
                wrap_device=wrap_device,
                sync_policy=sync_policy,
            )

        wal_opener = open_wal
    before_open = discard_wal if DISCARD_WAL_AT_START in modes else None
    return wal_opener, before_open


def discard_wal(config: BrokerConfig) -> None:
    """``discard-wal-at-start``: delete the WAL file before the broker opens it."""
    log.warning("discard-wal-at-start: discarding the WAL (test only)")
    config.wal_file.unlink(missing_ok=True)


def _check(modes: Collection[str]) -> None:
    unknown = set(modes) - MODES
    if unknown:
        raise ValueError(f"unknown broken modes {sorted(unknown)}; known: {sorted(MODES)}")


def decision_seam(modes: Collection[str]) -> MarkersHook | None:
    """The coordinator's ``before_decision`` hook for ``modes`` (None: the broker's own order)."""
    _check(modes)
    if TXN_MARKERS_BEFORE_DECISION not in modes:
        return None
    log.warning("txn-markers-before-decision: markers before the decision is durable (test only)")
    return markers_first


async def markers_first(writers: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """``txn-markers-before-decision``: every marker, one at a time, before the decision."""
    for index, write in enumerate(writers):
        if index:
            await asyncio.sleep(MARKERS_FIRST_PAUSE_S)
        await write()
