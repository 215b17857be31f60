"""What the read path from objects needs of a metadata image, sent to another process as changes.

The stream readers (:mod:`automq_ref.io.storage.block_cache`) ask an image three things: a
stream's start offset and stream objects, the stream set objects (for the slices of each
stream), and an object's size (to find its index). A read path in a process of its own
(:mod:`automq_ref.io.storage.cold_read_process`) keeps a *read image* with only those, built
from the changes the broker sends before each read whose image differs from the last one sent:
:class:`ReadImageSender` (the broker's side) works them out by comparing the maps of the image
by identity (an image's maps are never mutated, so an unchanged entry is the same object) and
then by what the readers use, so a commit that only moves a stream's end offset sends nothing;
:class:`ReadImageMirror` (the reading process's side) applies them and builds each new read
image from fresh maps, so that an image once handed out never changes
(:class:`~automq_ref.io.storage.block_cache.StreamSetIndexer` tells images apart by their maps'
identity). No I/O: both are plain data over the pure image.

For every stream, object and offset range, ``sm.get_objects`` over the mirror's image answers
what it answers over the broker's, and the objects it names have the same size
(``tests/properties/test_stream_metadata.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from automq_ref.state_machines import stream_metadata as sm

# A stream as the readers see it: its start offset and its stream objects.
StreamView = tuple[int, Mapping[int, sm.StreamOffsetRange]]

READ_IMAGE_NODE_EPOCH: Final = 0
READ_IMAGE_OBJECT_TIMESTAMP_MS: Final = 0


@dataclass(slots=True)
class ReadImageDelta:
    """The changes, since the last delta, of what the readers use (added or changed entries,
    then the keys gone)."""

    streams: dict[int, StreamView] = field(default_factory=dict)
    streams_gone: tuple[int, ...] = ()
    stream_set_objects: dict[int, sm.StreamSetObject] = field(default_factory=dict)
    stream_set_objects_gone: tuple[int, ...] = ()
    object_sizes: dict[int, int] = field(default_factory=dict)
    objects_gone: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(
            self.streams
            or self.streams_gone
            or self.stream_set_objects
            or self.stream_set_objects_gone
            or self.object_sizes
            or self.objects_gone
        )


class ReadImageSender:
    """The broker's side: what it last sent, and the delta that brings the other side to a
    newer image. Starts from nothing (the first delta holds the whole read image); :meth:`reset`
    starts over (a new reading process)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._image: sm.StreamMetadataImage | None = None
        self._streams: Mapping[int, sm.StreamMetadata] = {}
        self._stream_views: dict[int, StreamView] = {}
        self._nodes: Mapping[int, sm.NodeMetadata] = {}
        self._node_sets: dict[int, Mapping[int, sm.StreamSetObject]] = {}
        self._stream_set_objects: dict[int, sm.StreamSetObject] = {}
        self._objects: Mapping[int, sm.S3Object] = {}
        self._sizes: dict[int, int] = {}

    def delta(self, image: sm.StreamMetadataImage) -> ReadImageDelta | None:
        """The changes from the last image sent to ``image``, now counted as sent; None when
        the readers would see no change."""
        if image is self._image:
            return None
        self._image = image
        delta = ReadImageDelta()
        if image.streams is not self._streams:
            self._diff_streams(image.streams, delta)
        if image.nodes is not self._nodes:
            self._diff_nodes(image.nodes, delta)
        if image.objects is not self._objects:
            self._diff_objects(image.objects, delta)
        return delta if delta else None

    def _diff_streams(
        self, streams: Mapping[int, sm.StreamMetadata], delta: ReadImageDelta
    ) -> None:
        before, views = self._streams, self._stream_views
        for stream_id, stream in streams.items():
            if before.get(stream_id) is stream:
                continue
            view = (stream.start_offset, stream.stream_objects)
            sent = views.get(stream_id)
            if sent is None or sent[0] != view[0] or sent[1] is not view[1]:
                views[stream_id] = view
                delta.streams[stream_id] = view
        gone = tuple(stream_id for stream_id in views if stream_id not in streams)
        for stream_id in gone:
            del views[stream_id]
        delta.streams_gone = gone
        self._streams = streams

    def _diff_nodes(self, nodes: Mapping[int, sm.NodeMetadata], delta: ReadImageDelta) -> None:
        sent = self._stream_set_objects
        current_sets = {node_id: node.stream_set_objects for node_id, node in nodes.items()}
        for node_id, objects in current_sets.items():
            if self._node_sets.get(node_id) is objects:
                continue
            for object_id, stream_set_object in objects.items():
                if sent.get(object_id) is not stream_set_object:
                    sent[object_id] = stream_set_object
                    delta.stream_set_objects[object_id] = stream_set_object
        # An object is gone when no node holds it any more (it may have moved to another).
        held = {object_id for objects in current_sets.values() for object_id in objects}
        gone = tuple(object_id for object_id in sent if object_id not in held)
        for object_id in gone:
            del sent[object_id]
        delta.stream_set_objects_gone = gone
        self._node_sets = current_sets
        self._nodes = nodes

    def _diff_objects(self, objects: Mapping[int, sm.S3Object], delta: ReadImageDelta) -> None:
        before, sizes = self._objects, self._sizes
        for object_id, s3_object in objects.items():
            if before.get(object_id) is s3_object:
                continue
            if sizes.get(object_id) != s3_object.object_size:
                sizes[object_id] = s3_object.object_size
                delta.object_sizes[object_id] = s3_object.object_size
        gone = tuple(object_id for object_id in sizes if object_id not in objects)
        for object_id in gone:
            del sizes[object_id]
        delta.objects_gone = gone
        self._objects = objects


class ReadImageMirror:
    """The reading process's side: the read image the deltas received add up to."""

    def __init__(self) -> None:
        self.image = sm.EMPTY_IMAGE
        self.applied = 0

    def apply(self, delta: ReadImageDelta) -> sm.StreamMetadataImage:
        image = self.image
        streams, nodes, objects = image.streams, image.nodes, image.objects
        if delta.streams or delta.streams_gone:
            fresh = dict(streams)
            for stream_id, (start_offset, stream_objects) in delta.streams.items():
                fresh[stream_id] = sm.StreamMetadata(
                    stream_id, start_offset=start_offset, stream_objects=stream_objects
                )
            for stream_id in delta.streams_gone:
                fresh.pop(stream_id, None)
            streams = fresh
        if delta.stream_set_objects or delta.stream_set_objects_gone:
            nodes = _nodes_with(nodes, delta)
        if delta.object_sizes or delta.objects_gone:
            fresh_objects = dict(objects)
            for object_id, size in delta.object_sizes.items():
                fresh_objects[object_id] = sm.S3Object(
                    object_id, size, sm.S3ObjectState.COMMITTED, READ_IMAGE_OBJECT_TIMESTAMP_MS
                )
            for object_id in delta.objects_gone:
                fresh_objects.pop(object_id, None)
            objects = fresh_objects
        self.image = sm.StreamMetadataImage(streams=streams, nodes=nodes, objects=objects)
        self.applied += 1
        return self.image


def _nodes_with(
    nodes: Mapping[int, sm.NodeMetadata], delta: ReadImageDelta
) -> dict[int, sm.NodeMetadata]:
    """``nodes`` with the delta's stream set objects placed under their nodes and the gone ones
    taken out; a node whose set changed gets a fresh map, the others keep theirs."""
    sets = {node_id: node.stream_set_objects for node_id, node in nodes.items()}
    changed: dict[int, dict[int, sm.StreamSetObject]] = {}

    def fresh(node_id: int) -> dict[int, sm.StreamSetObject]:
        if node_id not in changed:
            changed[node_id] = dict(sets.get(node_id, {}))
        return changed[node_id]

    gone = set(delta.stream_set_objects_gone)
    # An object sent again under another node moved: out of its old node first.
    moved = set(delta.stream_set_objects)
    for node_id, objects in sets.items():
        for object_id in (gone | moved) & objects.keys():
            fresh(node_id).pop(object_id)
    for object_id, stream_set_object in delta.stream_set_objects.items():
        fresh(stream_set_object.node_id)[object_id] = stream_set_object
    result = dict(nodes)
    for node_id, objects in changed.items():
        if objects:
            result[node_id] = sm.NodeMetadata(
                node_id, READ_IMAGE_NODE_EPOCH, stream_set_objects=objects
            )
        else:
            result.pop(node_id, None)
    return result
