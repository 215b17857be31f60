"""What a broker's storage sums for its logs: blocks uploaded (:class:`UploadTotals`, taken and
logged now and then by :mod:`automq_ref.io.storage.storage_log`) and what start-up recovery
replayed (:class:`RecoveryTotals`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class UploadTotals:
    """Blocks uploaded and committed since these totals were taken: their objects, the bytes of
    those objects, the streams they hold, and the slowest block's PUTs in seconds."""

    blocks: int = 0
    objects: int = 0
    bytes: int = 0
    streams: set[int] = field(default_factory=set)
    slowest_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RecoveryTotals:
    """What start-up recovery replayed from the WAL into objects: records, their bytes, the
    streams they belong to, and records refused as discontinuities (logged as errors)."""

    records: int = 0
    bytes: int = 0
    streams: int = 0
    refused: int = 0
    links: int = 0  # of the records, link records turned back into data
