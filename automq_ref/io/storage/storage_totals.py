"""What a broker's storage sums for its logs: blocks uploaded (:class:`UploadTotals`, taken and
logged now and then by :mod:`automq_ref.io.storage.storage_log`) and what start-up recovery
replayed (:class:`RecoveryTotals`); and what it counts for the metrics as it goes
(:class:`StorageCounts`, read by :mod:`automq_ref.io.storage.storage_metrics`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from automq_ref.io.metrics import UPLOAD_STAGES
from automq_ref.state_machines import log_cache as lc

T = TypeVar("T")
# An upload stage that ended: its name, its seconds, and (the put) the objects' sizes by id.
StageListener = Callable[[str, float, Mapping[int, int]], None]
# The LogCache effects that are stages of an upload, with the names the metrics give them.
_STAGES: dict[type, str] = dict(
    zip((lc.PrepareObjects, lc.UploadBlock, lc.CommitBlock), UPLOAD_STAGES, strict=True)
)


@dataclass(slots=True)
class UploadTotals:
    """Blocks uploaded and committed since these totals were taken: their objects, the bytes of
    those objects, the streams they hold, and the slowest block's PUTs in seconds."""

    blocks: int = 0
    objects: int = 0
    bytes: int = 0
    streams: set[int] = field(default_factory=set)
    slowest_s: float = 0.0

    def add_block(self, sizes: Mapping[int, int], streams: set[int]) -> None:
        """One block committed: its objects (sizes by id) holding ``streams``."""
        self.blocks += 1
        self.objects += len(sizes)
        self.bytes += sum(sizes.values())
        self.streams |= streams


@dataclass(frozen=True, slots=True)
class RecoveryTotals:
    """What start-up recovery replayed from the WAL into objects: records, their bytes, the
    streams they belong to, and records refused as discontinuities (logged as errors)."""

    records: int = 0
    bytes: int = 0
    streams: int = 0
    refused: int = 0
    links: int = 0  # of the records, link records turned back into data


@dataclass(slots=True)
class StorageCounts:
    """What the storage counts for the metrics, never reset: the turns of its reads answered
    from the LogCache (``log_cache_hits``) and those that went to objects
    (``log_cache_misses``: a read that crosses from objects into the cache counts one of each),
    and each upload stage as it ends, told to ``stage_listener`` (the metrics'; None: nobody
    listens): prepare (object ids from the controller), put (the objects' PUTs, retries
    included), commit (the controller's commit of the block)."""

    log_cache_hits: int = 0
    log_cache_misses: int = 0
    stage_listener: StageListener | None = None

    def log_cache_read(self, batches: T) -> T:
        """``batches``, found in the LogCache: a hit when there are any."""
        if batches:
            self.log_cache_hits += 1
        return batches

    def effect_done(
        self, effect: object, seconds: float, sizes: Mapping[int, Mapping[int, int]]
    ) -> None:
        """A LogCache effect ran for ``seconds``; ``sizes``: the uploaded blocks' objects."""
        stage = _STAGES.get(type(effect))
        if stage is None or self.stage_listener is None:
            return
        uploaded = sizes.get(effect.block_id, {}) if isinstance(effect, lc.UploadBlock) else {}
        self.stage_listener(stage, seconds, uploaded)
