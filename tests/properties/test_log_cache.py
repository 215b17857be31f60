"""LogCacheMachine: appends, seals, and out-of-order I/O answers against the ordering rules.

The test plays the shell: it answers PrepareObjects, UploadBlock and CommitBlock effects in any
order the rules allow (uploads of different blocks complete in any order), and plays the
controller's continuity check on every CommitBlock: each stream's committed offsets must start
exactly where its previous commit ended. Invariants: commits in block order, one prepare in
flight, nothing the WAL still holds is evicted, and reads from the cache return exactly the
appended payloads, contiguous from the requested offset.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines.log_cache import (
    ALL_STREAMS,
    BlockCommitted,
    BlockUploaded,
    CachedRecord,
    CommitBlock,
    ForceUpload,
    LogCacheParams,
    LogCacheState,
    ObjectsPrepared,
    PrepareObjects,
    RecordAppended,
    Tick,
    TrimWal,
    UploadBlock,
)

PARAMS = LogCacheParams(
    upload_threshold_bytes=300,
    upload_interval_ms=50,
    stream_object_split_bytes=120,
    capacity_bytes=600,
    max_blocks=4,
    max_stream_objects_per_upload=2,
)
STREAMS = (0, 1, 2)


class LogCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = LogCacheState()
        self.now_ms = 0
        self.wal_offset = 0
        self.appended: dict[int, list[CachedRecord]] = {stream: [] for stream in STREAMS}
        self.wal_ends: list[int] = []
        self.pending_prepare: list[PrepareObjects] = []
        self.uploading: list[UploadBlock] = []
        self.committing: list[CommitBlock] = []
        self.committed_end: dict[int, int] = {}
        self.next_object_id = 0
        self.trimmed_to = -1

    def apply(self, event: lc.LogCacheEvent) -> None:
        transition = lc.step(self.state, event, PARAMS)
        self.state = transition.state
        for effect in transition.effects:
            match effect:
                case PrepareObjects():
                    assert not self.pending_prepare, "a second prepare while one is in flight"
                    self.pending_prepare.append(effect)
                case UploadBlock():
                    self._check_layout(effect)
                    self.uploading.append(effect)
                case CommitBlock():
                    assert not self.committing, "a second commit while one is in flight"
                    self._controller_continuity(effect)
                    self.committing.append(effect)
                case TrimWal():
                    assert effect.wal_offset > self.trimmed_to
                    self.trimmed_to = effect.wal_offset
                case lc.Rejected():
                    raise AssertionError(f"a well-behaved shell, yet {event}: {effect}")

    def _check_layout(self, upload: UploadBlock) -> None:
        """Every run of the block is in exactly one object; at most the cap of stream objects,
        and a run of split size shares the stream set object only when the cap is reached."""
        layout = upload.layout
        own = [run for _, run in layout.stream_objects]
        shared = list(layout.stream_set_runs)
        assert len(own) <= PARAMS.max_stream_objects_per_upload
        streams = sorted(run.stream_id for run in [*own, *shared])
        assert streams == sorted({record.stream_id for record in upload.records})
        if len(streams) > 1 and len(own) < PARAMS.max_stream_objects_per_upload:
            assert all(run.size_bytes < PARAMS.stream_object_split_bytes for run in shared)
        if shared and own:
            assert min(run.size_bytes for run in own) >= max(run.size_bytes for run in shared)

    def _controller_continuity(self, commit: CommitBlock) -> None:
        runs = [*commit.layout.stream_set_runs, *(run for _, run in commit.layout.stream_objects)]
        for run in runs:
            expected = self.committed_end.get(run.stream_id, 0)
            assert run.start_offset == expected, (run, expected)
            self.committed_end[run.stream_id] = run.end_offset
        object_ids = [object_id for object_id, _ in commit.layout.stream_objects]
        if commit.layout.stream_set_runs:
            object_ids.append(commit.layout.stream_set_object_id)
        assert len(set(object_ids)) == len(object_ids)

    @rule(
        stream_id=st.sampled_from(STREAMS),
        count=st.integers(min_value=1, max_value=3),
        size=st.integers(min_value=1, max_value=150),
    )
    def append(self, stream_id: int, count: int, size: int) -> None:
        records = self.appended[stream_id]
        base = records[-1].end_offset if records else 0
        self.wal_offset += size + 24
        payload = bytes([stream_id]) * size
        record = CachedRecord(stream_id, base, count, payload, self.wal_offset)
        records.append(record)
        self.wal_ends.append(self.wal_offset)
        self.apply(RecordAppended(record, self.now_ms))

    @rule(stream_id=st.sampled_from(STREAMS), gap=st.integers(min_value=0, max_value=3))
    def reopen(self, stream_id: int, gap: int) -> None:
        """The stream moves away and back, committed; other brokers appended ``gap``."""
        uncommitted = lc.uncommitted_blocks(self.state)
        if any(stream_id in block.by_stream for block in uncommitted):
            return
        records = self.appended[stream_id]
        end = (records[-1].end_offset if records else 0) + gap
        if gap:
            # The other brokers' records, committed there: a placeholder keeps the model's
            # next offset; none of it is in this cache.
            records.append(CachedRecord(stream_id, end - gap, gap, b"", -1))
            self.committed_end[stream_id] = end
        self.apply(lc.StreamReopened(stream_id, end))

    @rule(elapsed_ms=st.sampled_from([1, 10, 60]))
    def tick(self, elapsed_ms: int) -> None:
        self.now_ms += elapsed_ms
        self.apply(Tick(self.now_ms))

    @rule(stream_id=st.sampled_from([*STREAMS, ALL_STREAMS]))
    def force_upload(self, stream_id: int) -> None:
        self.apply(ForceUpload(stream_id, self.now_ms))

    @precondition(lambda self: bool(self.pending_prepare))
    @rule()
    def objects_prepared(self) -> None:
        prepare = self.pending_prepare.pop()
        first = self.next_object_id
        self.next_object_id += prepare.count
        self.apply(ObjectsPrepared(prepare.block_id, first))

    @precondition(lambda self: bool(self.uploading))
    @rule(data=st.data())
    def block_uploaded(self, data: st.DataObject) -> None:
        upload = self.uploading.pop(data.draw(st.integers(0, len(self.uploading) - 1)))
        self.apply(BlockUploaded(upload.block_id))

    @precondition(lambda self: bool(self.committing))
    @rule()
    def block_committed(self) -> None:
        commit = self.committing.pop()
        self.apply(BlockCommitted(commit.block_id))

    @rule(
        stream_id=st.sampled_from(STREAMS),
        start=st.integers(min_value=0, max_value=30),
        max_bytes=st.integers(min_value=0, max_value=400),
    )
    def read(self, stream_id: int, start: int, max_bytes: int) -> None:
        found = lc.read(self.state, stream_id, start, 10**9, max_bytes)
        if not found:
            return
        assert found[0].base_offset <= start < found[0].end_offset
        for before, after in itertools.pairwise(found):
            assert before.end_offset == after.base_offset
        appended = {record.base_offset: record for record in self.appended[stream_id]}
        for record in found:
            assert appended[record.base_offset] == record

    @invariant()
    def commits_in_block_order(self) -> None:
        lc.inv_commits_in_block_order(self.state)

    @invariant()
    def one_prepare_in_flight(self) -> None:
        lc.inv_one_prepare_in_flight(self.state)

    @invariant()
    def nothing_untrimmed_is_evicted(self) -> None:
        lc.inv_only_committed_blocks_evicted(self.state, self.wal_ends)

    @invariant()
    def trim_never_passes_uncommitted_data(self) -> None:
        for block in lc.uncommitted_blocks(self.state):
            for record in block.records:
                assert record.wal_next_offset > self.trimmed_to


TestLogCacheMachine = LogCacheMachine.TestCase


def test_events_breaking_the_contract_are_refused_and_change_nothing() -> None:
    params = LogCacheParams(upload_threshold_bytes=10, upload_interval_ms=-1)
    state = lc.step(
        LogCacheState(), RecordAppended(CachedRecord(0, 0, 2, b"ab", 1), 0), params
    ).state
    refusals: dict[lc.LogCacheEvent, lc.LogCacheError] = {
        RecordAppended(CachedRecord(0, 0, 0, b"", 2), 0): lc.LogCacheError.EMPTY_RECORD,
        RecordAppended(CachedRecord(0, 5, 1, b"c", 2), 0): lc.LogCacheError.DISCONTINUOUS_RECORD,
        ObjectsPrepared(0, 0): lc.LogCacheError.WRONG_STAGE,  # block 0 never asked
        ObjectsPrepared(7, 0): lc.LogCacheError.UNKNOWN_BLOCK,
        BlockUploaded(0): lc.LogCacheError.WRONG_STAGE,
        BlockCommitted(7): lc.LogCacheError.UNKNOWN_BLOCK,
        lc.StreamReopened(0, 1): lc.LogCacheError.STREAM_NOT_SETTLED,  # below its end
        lc.StreamReopened(0, 3): lc.LogCacheError.STREAM_NOT_SETTLED,  # uncommitted records
    }
    for event, error in refusals.items():
        transition = lc.step(state, event, params)
        assert transition.refusal is error, (event, transition)
        assert transition.state == state and len(transition.effects) == 1
