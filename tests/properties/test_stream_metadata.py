"""StreamMetadataMachine: every TLA+ action of specs/StreamMetadata.tla as a rule on the real step.

Requests are generated the way real nodes send them: with current, stale or future node and
stream epochs, offsets at or near the stream's end, object ids that are prepared, committed,
destroyed or unknown. After every step the spec's invariants are checked on the image, and the
transition properties (epochs, start and end offsets never decrease; an expired object is never
committed) are checked between images. A tiny model of the data keeps, per stream, what a reader
must find: get_objects over [start, end) returns a contiguous chain of objects.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterable

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from automq_ref.formats.kv_integer import decode_kv_integer
from automq_ref.io.storage.block_cache import StreamSetIndexer
from automq_ref.io.storage.read_image import ReadImageMirror, ReadImageSender
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import (
    ANY_STREAM_EPOCH,
    EMPTY_IMAGE,
    NO_OBJECT,
    AllocateProducerIds,
    CloseStream,
    CommitRange,
    CommitStreamObject,
    CommitStreamObjectEntry,
    CommitStreamSetObject,
    CreateStream,
    DeleteKV,
    DeleteStream,
    ExpireObject,
    FenceNode,
    OpenStream,
    PrepareObject,
    PutKV,
    RegisterNode,
    RemoveObject,
    S3ObjectState,
    StreamErrorCode,
    StreamMetadataEvent,
    StreamMetadataImage,
    StreamMetadataParams,
    StreamState,
    TrimStream,
)
from automq_ref.vocabulary.naming import PRODUCER_ID_KEY

NODES = (0, 1, 2)
PARAMS = StreamMetadataParams(object_retention_ms=50)
TTL_MS = 1000
deltas = st.sampled_from([-1, 0, 0, 0, 0, 0, 0, 1])


def live_runs(
    image: StreamMetadataImage, sources: list[sm.StreamSetObject]
) -> list[tuple[int, int, int]]:
    """(stream, start, end) of the merged offsets of ``sources`` that are still live: their
    stream exists and they lie at or above its start. What a compaction of ``sources`` must
    write again (the reference the compaction rules plan their outputs by)."""
    pieces = sorted(
        (r.stream_id, max(r.start_offset, stream.start_offset), r.end_offset)
        for source in sources
        for r in source.ranges
        if (stream := image.streams.get(r.stream_id)) is not None
        and r.end_offset > stream.start_offset
    )
    runs: list[tuple[int, int, int]] = []
    for stream_id, start, end in pieces:
        if runs and runs[-1][0] == stream_id and runs[-1][2] == start:
            runs[-1] = (stream_id, runs[-1][1], end)
        else:
            runs.append((stream_id, start, end))
    return runs


class StreamMetadataMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.image: StreamMetadataImage = EMPTY_IMAGE
        # The read path's index of stream set objects, kept up to date image after image.
        self.indexer = StreamSetIndexer()
        # A cold-read process's read image, brought up to date by the deltas a broker sends.
        self.sender = ReadImageSender()
        self.mirror = ReadImageMirror()
        self.records: list[sm.MetadataRecord] = []
        self.now_ms = 0
        self.node_epochs = dict.fromkeys(NODES, 0)
        self.expired: set[int] = set()
        self.producer_id_blocks: list[tuple[int, int]] = []  # [first, end) handed out

    # ----------------------------------------------------------------------------- helpers

    def apply(self, event: StreamMetadataEvent) -> sm.Response:
        before = self.image
        transition = sm.step(self.image, event, PARAMS)
        response = sm.response_of(transition)
        records = sm.records_of(transition)
        # One shape: the records to append first (if any), then the answer.
        appended = (sm.AppendRecords(records),) if records else ()
        assert transition.effects == (*appended, sm.Respond(response)), transition.effects
        if not response.ok:
            assert records == (), (event, response)
            assert transition.state == before
        self.image = transition.state
        self.records.extend(records)
        self._check_transition(before, self.image)
        return response

    def _check_transition(self, before: StreamMetadataImage, after: StreamMetadataImage) -> None:
        for stream_id, old in before.streams.items():
            new = after.streams.get(stream_id)
            if new is None:
                continue
            # EpochNeverDecreases, and the offsets' max semantics.
            assert new.epoch >= old.epoch, (stream_id, old.epoch, new.epoch)
            assert new.start_offset >= old.start_offset
            assert new.end_offset >= old.end_offset
        for node_id, old_node in before.nodes.items():
            assert after.nodes[node_id].node_epoch >= old_node.node_epoch
        # ExpiredNeverCommitted.
        for object_id in self.expired:
            s3_object = after.objects.get(object_id)
            assert s3_object is None or s3_object.state is not S3ObjectState.COMMITTED

    def tick(self, elapsed_ms: int) -> int:
        self.now_ms += elapsed_ms
        return self.now_ms

    def stream_ids(self) -> list[int]:
        return sorted(self.image.streams)

    def epoch_for(self, node_id: int, delta: int) -> int:
        return max(0, self.node_epochs[node_id] + delta)

    # ------------------------------------------------------------------ rules (TLA+ actions)

    @initialize()
    def register_all(self) -> None:
        for node_id in NODES:
            response = self.apply(RegisterNode(node_id, 0))
            assert response.ok

    @rule(node_id=st.sampled_from(NODES), delta=st.sampled_from([-1, 0, 1, 1, 1, 3]))
    def register_node(self, node_id: int, delta: int) -> None:
        proposed = self.epoch_for(node_id, delta)
        stored = self.image.nodes[node_id].node_epoch
        response = self.apply(RegisterNode(node_id, proposed))
        # Never refused: granted above the stored epoch, whatever the node proposed.
        assert response.ok and response.node_epoch == max(proposed, stored + 1)
        node = self.image.nodes[node_id]
        assert node.node_epoch == response.node_epoch and not node.failover_mode
        self.node_epochs[node_id] = response.node_epoch

    @rule(node_id=st.sampled_from(NODES), delta=deltas, really=st.integers(0, 3))
    def fence_node(self, node_id: int, delta: int, really: int) -> None:
        if really:  # failovers are rare: most draws of this rule do nothing
            return
        epoch = self.epoch_for(node_id, delta)
        response = self.apply(FenceNode(node_id, epoch))
        if response.ok:
            assert self.image.nodes[node_id].failover_mode
            self.node_epochs[node_id] = max(self.node_epochs[node_id], epoch)

    @precondition(lambda self: len(self.image.streams) < 3)
    @rule(node_id=st.sampled_from(NODES), delta=deltas)
    def create_stream(self, node_id: int, delta: int) -> None:
        response = self.apply(CreateStream(node_id, self.epoch_for(node_id, delta)))
        if response.ok:
            assert response.stream_id is not None
            stream = self.image.streams[response.stream_id]
            assert stream.state is StreamState.CLOSED and stream.end_offset == 0

    @precondition(lambda self: bool(self.image.streams))
    @rule(data=st.data(), node_id=st.sampled_from(NODES), delta=deltas, epoch_delta=deltas)
    def open_stream(self, data: st.DataObject, node_id: int, delta: int, epoch_delta: int) -> None:
        stream_id = data.draw(st.sampled_from(self.stream_ids()))
        before = self.image.streams[stream_id]
        stream_epoch = max(0, before.epoch + (epoch_delta if epoch_delta else 1))
        response = self.apply(
            OpenStream(node_id, self.epoch_for(node_id, delta), stream_id, stream_epoch)
        )
        if response.ok:
            after = self.image.streams[stream_id]
            assert after.state is StreamState.OPENED and after.epoch == stream_epoch
            assert after.current_range is not None and after.current_range.node_id == node_id
            assert response.next_offset == before.end_offset
        elif before.state is StreamState.OPENED and stream_epoch > before.epoch:
            assert response.error in (
                StreamErrorCode.STREAM_NOT_CLOSED,
                StreamErrorCode.NODE_EPOCH_EXPIRED,
                StreamErrorCode.NODE_FENCED,
            )

    def _owner_request(self, data: st.DataObject) -> tuple[int, int, int, int]:
        """A node and epochs aimed at a stream: usually its owner's, sometimes stale."""
        opened = [i for i in self.stream_ids() if self.image.streams[i].state is StreamState.OPENED]
        stream_id = data.draw(st.sampled_from(opened * 3 + self.stream_ids()))
        stream = self.image.streams[stream_id]
        current = stream.current_range
        owner = current.node_id if current is not None else 0
        node_id = data.draw(st.sampled_from([owner, owner, *NODES]))
        node_epoch = self.epoch_for(node_id, data.draw(deltas))
        stream_epoch = max(0, stream.epoch + data.draw(deltas))
        return node_id, node_epoch, stream_id, stream_epoch

    @precondition(lambda self: bool(self.image.streams))
    @rule(data=st.data())
    def close_stream(self, data: st.DataObject) -> None:
        node_id, node_epoch, stream_id, stream_epoch = self._owner_request(data)
        response = self.apply(CloseStream(node_id, node_epoch, stream_id, stream_epoch))
        if response.ok:
            assert self.image.streams[stream_id].state is StreamState.CLOSED

    @precondition(lambda self: bool(self.image.streams))
    @rule(data=st.data(), step_offsets=st.integers(min_value=-1, max_value=4))
    def trim_stream(self, data: st.DataObject, step_offsets: int) -> None:
        node_id, node_epoch, stream_id, stream_epoch = self._owner_request(data)
        new_start = max(0, self.image.streams[stream_id].start_offset + step_offsets)
        response = self.apply(TrimStream(node_id, node_epoch, stream_id, stream_epoch, new_start))
        if response.ok:
            assert self.image.streams[stream_id].start_offset == new_start

    @precondition(lambda self: bool(self.image.streams))
    @rule(data=st.data())
    def delete_stream(self, data: st.DataObject) -> None:
        node_id, node_epoch, stream_id, stream_epoch = self._owner_request(data)
        was_open = self.image.streams[stream_id].state is StreamState.OPENED
        response = self.apply(
            DeleteStream(node_id, node_epoch, stream_id, stream_epoch, self.tick(1))
        )
        if response.ok:
            assert stream_id not in self.image.streams
        else:
            assert was_open or response.error is not StreamErrorCode.NONE

    @precondition(
        lambda self: sum(o.state is S3ObjectState.PREPARED for o in self.image.objects.values()) < 4
    )
    @rule(node_id=st.sampled_from(NODES), count=st.integers(min_value=1, max_value=3))
    def prepare_object(self, node_id: int, count: int) -> None:
        first = self.image.next_object_id
        response = self.apply(
            PrepareObject(node_id, self.node_epochs[node_id], count, TTL_MS, self.tick(1))
        )
        if response.ok:
            assert response.first_object_id == first
            assert self.image.next_object_id == first + count

    def _object_id(self, data: st.DataObject) -> int:
        prepared = [
            o.object_id for o in self.image.objects.values() if o.state is S3ObjectState.PREPARED
        ]
        others = [*self.image.objects, self.image.next_object_id + 5]
        return data.draw(st.sampled_from(prepared * 3 + others if prepared else others))

    @precondition(lambda self: bool(self.image.streams) and bool(self.image.objects))
    @rule(
        data=st.data(),
        length=st.integers(min_value=1, max_value=3),
        start_shift=st.sampled_from([0, 0, 0, 0, 0, -1, 1]),
        as_stream_object=st.booleans(),
        failover_mode=st.booleans(),
    )
    def commit_stream_set_object(
        self,
        data: st.DataObject,
        length: int,
        start_shift: int,
        as_stream_object: bool,
        failover_mode: bool,
    ) -> None:
        node_id, node_epoch, stream_id, stream_epoch = self._owner_request(data)
        stream = self.image.streams[stream_id]
        start = max(0, stream.end_offset + start_shift)
        object_id = self._object_id(data)
        if as_stream_object:
            event = CommitStreamSetObject(
                node_id,
                node_epoch,
                NO_OBJECT,
                NO_OBJECT,
                0,
                (),
                (CommitStreamObjectEntry(object_id, stream_id, start, start + length, 10),),
                (),
                failover_mode,
                self.tick(1),
            )
        else:
            claimed_epoch = data.draw(st.sampled_from([stream_epoch, ANY_STREAM_EPOCH]))
            event = CommitStreamSetObject(
                node_id,
                node_epoch,
                object_id,
                NO_OBJECT,
                10,
                (CommitRange(stream_id, claimed_epoch, start, start + length),),
                (),
                (),
                failover_mode,
                self.tick(1),
            )
        before = self.image.streams[stream_id]
        response = self.apply(event)
        if response.error is StreamErrorCode.NONE:
            after = self.image.streams[stream_id]
            current = before.current_range
            if start + length > before.start_offset:
                # Only the owner of the current range, at the stream's end, gets in.
                assert current is not None and current.node_id == node_id
                assert before.state is StreamState.OPENED
                assert after.end_offset == start + length
            # A retried commit (the response was lost) is a successful no-op.
            image_after = self.image
            retried = self.apply(event)
            assert retried.error is StreamErrorCode.REDUNDANT_OPERATION, retried
            assert self.image == image_after

    @precondition(lambda self: bool(self.image.streams) and bool(self.image.objects))
    @rule(data=st.data(), merge_count=st.integers(min_value=1, max_value=3))
    def commit_stream_object(self, data: st.DataObject, merge_count: int) -> None:
        node_id, node_epoch, stream_id, stream_epoch = self._owner_request(data)
        stream = self.image.streams[stream_id]
        ordered = sorted(stream.stream_objects.items(), key=lambda item: item[1].start_offset)
        sources = ordered[:merge_count]
        start = sources[0][1].start_offset if sources else 0
        end = sources[-1][1].end_offset if sources else 1
        claimed_epoch = data.draw(st.sampled_from([stream_epoch, ANY_STREAM_EPOCH]))
        object_id = data.draw(st.sampled_from([self._object_id(data), NO_OBJECT]))
        self.apply(
            CommitStreamObject(
                node_id,
                node_epoch,
                stream_id,
                claimed_epoch,
                object_id,
                start,
                end,
                10,
                tuple(source_id for source_id, _ in sources),
                self.tick(1),
            )
        )

    @precondition(lambda self: bool(self.image.streams))
    @rule(
        data=st.data(),
        lengths=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=3),
        split=st.booleans(),
    )
    def owner_writes(self, data: st.DataObject, lengths: list[int], split: bool) -> None:
        """A healthy writer, composed of the actions above: the owner of an open stream prepares
        objects and commits runs at the stream's end (as stream set objects, or as stream
        objects when ``split``), so that later actions meet streams with data in them."""
        opened = [
            stream
            for stream in self.image.streams.values()
            if stream.state is StreamState.OPENED and stream.current_range is not None
        ]
        if not opened:
            return
        stream = data.draw(st.sampled_from(opened))
        assert stream.current_range is not None
        node_id = stream.current_range.node_id
        node_epoch = self.image.nodes[node_id].node_epoch
        for length in lengths:
            prepared = self.apply(PrepareObject(node_id, node_epoch, 1, TTL_MS, self.tick(1)))
            if not prepared.ok:
                return
            assert prepared.first_object_id is not None
            object_id = prepared.first_object_id
            start = self.image.streams[stream.stream_id].end_offset
            if split:
                entry = CommitStreamObjectEntry(
                    object_id, stream.stream_id, start, start + length, 10
                )
                ranges: tuple[CommitRange, ...] = ()
                entries: tuple[CommitStreamObjectEntry, ...] = (entry,)
                set_object_id = NO_OBJECT
            else:
                ranges = (CommitRange(stream.stream_id, stream.epoch, start, start + length),)
                entries = ()
                set_object_id = object_id
            response = self.apply(
                CommitStreamSetObject(
                    node_id,
                    node_epoch,
                    set_object_id,
                    NO_OBJECT,
                    10,
                    ranges,
                    entries,
                    (),
                    False,
                    self.tick(1),
                )
            )
            assert response.error is StreamErrorCode.NONE, response
            assert self.image.streams[stream.stream_id].end_offset == start + length

    @precondition(
        lambda self: any(len(node.stream_set_objects) >= 1 for node in self.image.nodes.values())
    )
    @rule(
        data=st.data(),
        take=st.integers(min_value=1, max_value=3),
        shape=st.sampled_from(["merge", "merge", "split", "cleanup"]),
        fault=st.sampled_from([None, None, None, "drop_one", "foreign_source"]),
    )
    def commit_stream_set_object_compaction(
        self, data: st.DataObject, take: int, shape: str, fault: str | None
    ) -> None:
        """CommitStreamSetObjectCompaction: a node replaces some of its stream set objects by a
        new one holding their live runs (``merge``), by one stream object per live run
        (``split``) or by nothing (``cleanup``, right only when nothing in them is live). The
        faults must be refused: an output that loses a run (``drop_one``), a source that is not
        a committed stream set object of this node (``foreign_source``)."""
        node = data.draw(
            st.sampled_from([n for n in self.image.nodes.values() if n.stream_set_objects])
        )
        sources = sorted(node.stream_set_objects.values(), key=lambda o: o.order_id)[:take]
        runs = live_runs(self.image, sources)
        compacted = [source.object_id for source in sources]
        if fault == "foreign_source":
            others = [o for o in self.image.objects if o not in node.stream_set_objects]
            if not others:
                return
            compacted.append(data.draw(st.sampled_from(sorted(others))))
        elif fault == "drop_one" and shape != "cleanup":
            if not runs:
                return
            runs = runs[1:]
        if shape == "cleanup":
            runs = []
        outputs = {"merge": 1, "split": len(runs), "cleanup": 0}[shape]
        first = NO_OBJECT
        if outputs:
            prepared = self.apply(
                PrepareObject(node.node_id, node.node_epoch, outputs, TTL_MS, self.tick(1))
            )
            if not prepared.ok:
                return
            assert prepared.first_object_id is not None
            first = prepared.first_object_id
        if shape == "merge":
            set_object_id = first
            ranges = tuple(CommitRange(s, ANY_STREAM_EPOCH, a, b) for s, a, b in runs)
            entries: tuple[CommitStreamObjectEntry, ...] = ()
        else:
            set_object_id, ranges = NO_OBJECT, ()
            entries = tuple(
                CommitStreamObjectEntry(first + i, s, a, b, 10) for i, (s, a, b) in enumerate(runs)
            )
        before = self.image
        live = live_runs(self.image, sources)
        response = self.apply(
            CommitStreamSetObject(
                node.node_id,
                node.node_epoch,
                set_object_id,
                NO_OBJECT,
                10,
                ranges,
                entries,
                tuple(compacted),
                False,
                self.tick(1),
            )
        )
        if node.failover_mode:
            assert response.error is StreamErrorCode.NODE_FENCED, response
            return
        if fault == "foreign_source":
            assert response.error is StreamErrorCode.COMPACTED_OBJECTS_NOT_FOUND, response
            return
        if (fault == "drop_one" and shape != "cleanup") or (shape == "cleanup" and live):
            assert response.error is StreamErrorCode.OFFSET_NOT_MATCHED, response
            return
        assert response.ok, response
        after = self.image.nodes[node.node_id].stream_set_objects
        for source in sources:
            assert source.object_id not in after
            assert self.image.objects[source.object_id].state is S3ObjectState.MARK_DESTROYED
        if shape == "merge":
            new_object = after[set_object_id]
            assert new_object.order_id == min(source.order_id for source in sources)
            assert new_object.data_time_ms == min(source.data_time_ms for source in sources)
        for entry in entries:
            assert self.image.streams[entry.stream_id].stream_objects[entry.object_id] == (
                sm.StreamOffsetRange(entry.stream_id, entry.start_offset, entry.end_offset)
            )
        assert {s: v.end_offset for s, v in self.image.streams.items()} == {
            s: v.end_offset for s, v in before.streams.items()
        }

    @precondition(lambda self: bool(self.image.objects))
    @rule(data=st.data(), elapsed_ms=st.sampled_from([0, TTL_MS // 2, TTL_MS + 1]))
    def expire_object(self, data: st.DataObject, elapsed_ms: int) -> None:
        object_id = data.draw(st.sampled_from(sorted(self.image.objects)))
        was_prepared = self.image.objects[object_id].state is S3ObjectState.PREPARED
        response = self.apply(ExpireObject(object_id, self.tick(elapsed_ms)))
        if response.ok:
            assert was_prepared
            self.expired.add(object_id)

    @precondition(lambda self: bool(self.image.objects))
    @rule(data=st.data(), elapsed_ms=st.sampled_from([0, 60]))
    def remove_object(self, data: st.DataObject, elapsed_ms: int) -> None:
        object_id = data.draw(st.sampled_from(sorted(self.image.objects)))
        state = self.image.objects[object_id].state
        response = self.apply(RemoveObject(object_id, self.tick(elapsed_ms)))
        if response.ok:
            assert state is S3ObjectState.MARK_DESTROYED
            assert object_id not in self.image.objects

    def expected_value(self, data: st.DataObject, key: str) -> bytes | None:
        """No condition, the value the key holds now, or another (stale) one."""
        choices = [st.none(), st.binary(max_size=2)]
        if key in self.image.kv:
            choices.append(st.just(self.image.kv[key]))
        return data.draw(st.one_of(choices))

    @rule(
        data=st.data(),
        key=st.sampled_from(["a", "b"]),
        value=st.binary(max_size=3),
        overwrite=st.booleans(),
    )
    def put_kv(self, data: st.DataObject, key: str, value: bytes, overwrite: bool) -> None:
        existing = self.image.kv.get(key)
        expected = self.expected_value(data, key)
        response = self.apply(PutKV(key, value, overwrite, expected))
        if expected is not None and expected != existing:
            assert response.error is StreamErrorCode.VALUE_NOT_MATCHED
            assert response.value == existing and self.image.kv.get(key) == existing
        elif existing is not None and not overwrite:
            assert response.error is StreamErrorCode.KEY_EXIST and response.value == existing
        else:
            assert response.ok and self.image.kv[key] == value

    @rule(data=st.data(), key=st.sampled_from(["a", "b"]))
    def delete_kv(self, data: st.DataObject, key: str) -> None:
        existing = self.image.kv.get(key)
        expected = self.expected_value(data, key)
        response = self.apply(DeleteKV(key, expected))
        if expected is not None and expected != existing:
            assert response.error is StreamErrorCode.VALUE_NOT_MATCHED
            assert response.value == existing and self.image.kv.get(key) == existing
        else:
            assert response.ok and key not in self.image.kv

    @rule(node_id=st.sampled_from(NODES), delta=deltas, count=st.sampled_from([0, 1, 5, 1000]))
    def allocate_producer_ids(self, node_id: int, delta: int, count: int) -> None:
        node_epoch = self.epoch_for(node_id, delta)
        node = self.image.nodes[node_id]
        response = self.apply(AllocateProducerIds(node_id, node_epoch, count))
        if node_epoch < node.node_epoch:
            assert response.error is StreamErrorCode.NODE_EPOCH_EXPIRED
        elif node.failover_mode:
            assert response.error is StreamErrorCode.NODE_FENCED
        elif count < 1:
            assert response.error is StreamErrorCode.INVALID_REQUEST
        else:
            assert response.ok and response.first_producer_id is not None
            first = response.first_producer_id
            self.producer_id_blocks.append((first, first + count))

    # ------------------------------------------------------------------------- invariants

    @invariant()
    def single_writer(self) -> None:
        sm.inv_single_writer(self.image)

    @invariant()
    def ranges_contiguous(self) -> None:
        sm.inv_ranges_contiguous(self.image)

    @invariant()
    def objects_cover_stream(self) -> None:
        sm.inv_objects_cover_stream(self.image)

    @invariant()
    def no_fenced_commit_visible(self) -> None:
        sm.inv_no_fenced_commit_visible(self.image)

    @invariant()
    def nothing_referenced_is_destroyed(self) -> None:
        sm.inv_nothing_referenced_is_destroyed(self.image)

    @invariant()
    def readers_find_every_committed_offset(self) -> None:
        index = sm.stream_set_index(self.image)
        kept = self.indexer.index(self.image)

        def by_offset(slices: Iterable[sm.ObjectSlice]) -> list[sm.ObjectSlice]:
            return sorted(slices, key=lambda s: (s.start_offset, s.end_offset, s.object_id))

        assert set(kept) == set(index)
        for stream_id, slices in index.items():
            assert by_offset(kept[stream_id]) == by_offset(slices), stream_id
        for stream in self.image.streams.values():
            error, slices = sm.get_objects(
                self.image, stream.stream_id, stream.start_offset, stream.end_offset, 1000
            )
            assert error is StreamErrorCode.NONE
            # The precomputed index answers the same, for the whole range and from within it.
            for start in {stream.start_offset, (stream.start_offset + stream.end_offset) // 2}:
                unindexed = sm.get_objects(
                    self.image, stream.stream_id, start, stream.end_offset, 3
                )
                indexed = sm.get_objects(
                    self.image, stream.stream_id, start, stream.end_offset, 3, index=index
                )
                assert indexed == unindexed
            cursor = stream.start_offset
            for object_slice in slices:
                assert object_slice.start_offset <= cursor < object_slice.end_offset
                cursor = object_slice.end_offset
            assert cursor == stream.end_offset or (
                cursor == stream.start_offset == stream.end_offset
            )

    @invariant()
    def the_read_image_reads_as_the_image(self) -> None:
        """The mirror, after the deltas (pickled, as they cross to the cold-read process),
        answers every reader's question as the image does; the images it handed out before
        stay as they were."""
        before = self.mirror.image
        streams_before, nodes_before = dict(before.streams), dict(before.nodes)
        delta = self.sender.delta(self.image)
        if delta is not None:
            self.mirror.apply(pickle.loads(pickle.dumps(delta)))
        assert dict(before.streams) == streams_before and dict(before.nodes) == nodes_before
        mirrored = self.mirror.image
        assert mirrored.streams.keys() == self.image.streams.keys()
        for stream in self.image.streams.values():
            assert mirrored.streams[stream.stream_id].start_offset == stream.start_offset
            for start in {
                stream.start_offset - 1,
                stream.start_offset,
                (stream.start_offset + stream.end_offset) // 2,
            }:
                end = stream.end_offset
                expected = sm.get_objects(self.image, stream.stream_id, start, end, 99)
                found = sm.get_objects(mirrored, stream.stream_id, start, end, 99)
                assert found == expected, (stream.stream_id, start)
                for object_slice in found[1]:
                    size = mirrored.objects[object_slice.object_id].object_size
                    assert size == self.image.objects[object_slice.object_id].object_size

    @invariant()
    def producer_id_blocks_never_overlap(self) -> None:
        """No producer id is handed out twice, and the counter is past every block."""
        blocks = sorted(self.producer_id_blocks)
        for (_, end), (first, _) in itertools.pairwise(blocks):
            assert end <= first, blocks
        if blocks:
            raw = self.image.kv[PRODUCER_ID_KEY]
            assert decode_kv_integer(raw, "next producer id") >= max(end for _, end in blocks)

    @invariant()
    def image_is_the_replay_of_its_records(self) -> None:
        assert sm.replay_all(EMPTY_IMAGE, self.records) == self.image
        assert sm.replay_all(EMPTY_IMAGE, sm.image_records(self.image)) == self.image


TestStreamMetadataMachine = StreamMetadataMachine.TestCase
