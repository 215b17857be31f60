"""Resendable requests (``sm.RESENDABLE_REQUESTS``): a repeat is answered as the first try was.

The controller client sends such a request again when its answer was lost, not knowing whether
the controller decided it. So, for every kind, on any history: once the machine accepted a
request, the same request again is accepted, writes no record, leaves the image as it was and
answers the same offsets (a commit: ``REDUNDANT_OPERATION``); for ``PrepareObject`` and
``AllocateProducerIds`` it is accepted with new ids, the first answer's staying unused (prepared
objects, which expire; producer ids are never reused). A commit is still redundant when its
resend comes after other requests (other commits, trims, closes and opens by other nodes).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from automq_ref.state_machines import stream_metadata as sm

NODES = (1, 2)
STREAMS = 2
TTL_MS = 60_000


def _accepted(image: sm.StreamMetadataImage, event: sm.StreamMetadataEvent) -> bool:
    return sm.response_of(sm.step(image, event)).ok


def _check_resend(image: sm.StreamMetadataImage, event: sm.StreamMetadataEvent) -> None:
    """``event`` was accepted on ``image``: its repeat on the result is answered alike."""
    first = sm.step(image, event)
    after = first.state
    again = sm.step(after, event)
    answer, repeat = sm.response_of(first), sm.response_of(again)
    assert repeat.ok, (event, repeat)
    match event:
        case sm.PrepareObject():
            assert answer.first_object_id is not None
            assert repeat.first_object_id == answer.first_object_id + event.count
            lost = range(answer.first_object_id, answer.first_object_id + event.count)
            assert all(again.state.objects[o].state is sm.S3ObjectState.PREPARED for o in lost)
        case sm.AllocateProducerIds():
            assert answer.first_producer_id is not None
            assert repeat.first_producer_id == answer.first_producer_id + event.count
        case _:
            assert sm.records_of(again) == (), (event, sm.records_of(again))
            assert again.state == after
            assert (repeat.start_offset, repeat.next_offset) == (
                answer.start_offset,
                answer.next_offset,
            )
            commit = isinstance(event, sm.CommitStreamSetObject | sm.CommitStreamObject)
            if commit and sm.records_of(first):
                assert repeat.error is sm.StreamErrorCode.REDUNDANT_OPERATION


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int, int, int]]:
    """Steps: (kind, node index, stream index, a number), decided against the image."""
    kinds = st.sampled_from(
        ["open", "close", "commit", "objects", "trim", "prepare", "ids", "compact", "delete"]
    )
    return draw(
        st.lists(
            st.tuples(
                kinds,
                st.integers(0, len(NODES) - 1),
                st.integers(0, STREAMS - 1),
                st.integers(1, 5),
            ),
            min_size=1,
            max_size=30,
        )
    )


class _World:
    """The image and what the nodes know: their epochs and each stream's id."""

    def __init__(self) -> None:
        image = sm.EMPTY_IMAGE
        self.epochs: dict[int, int] = {}
        for node in NODES:
            transition = sm.step(image, sm.RegisterNode(node, 1))
            image = transition.state
            epoch = sm.response_of(transition).node_epoch
            assert epoch is not None
            self.epochs[node] = epoch
        self.streams: list[int] = []
        for _ in range(STREAMS):
            transition = sm.step(image, sm.CreateStream(NODES[0], self.epochs[NODES[0]]))
            image = transition.state
            stream_id = sm.response_of(transition).stream_id
            assert stream_id is not None
            self.streams.append(stream_id)
        self.image = image
        self.now_ms = 1
        self.commits: list[sm.CommitStreamSetObject] = []

    def prepare(self, node: int, count: int) -> int:
        transition = sm.step(
            self.image, sm.PrepareObject(node, self.epochs[node], count, TTL_MS, self.now_ms)
        )
        self.image = transition.state
        first = sm.response_of(transition).first_object_id
        assert first is not None
        return first

    def event(self, kind: str, node: int, stream_id: int, n: int) -> sm.StreamMetadataEvent | None:
        epoch = self.epochs[node]
        stream = self.image.streams.get(stream_id)
        if stream is None:
            return None
        owner = stream.current_range.node_id if stream.current_range is not None else None
        end = stream.end_offset
        match kind:
            case "open":
                bump = 0 if owner == node else 1
                return sm.OpenStream(node, epoch, stream_id, stream.epoch + bump)
            case "close":
                return sm.CloseStream(node, epoch, stream_id, stream.epoch)
            case "commit":
                object_id = self.prepare(node, 1)
                ranges = (sm.CommitRange(stream_id, sm.ANY_STREAM_EPOCH, end, end + n),)
                return sm.CommitStreamSetObject(
                    node, epoch, object_id, sm.NO_OBJECT, 10, ranges, (), (), False, self.now_ms
                )
            case "objects":
                object_id = self.prepare(node, 1)
                entry = sm.CommitStreamObjectEntry(object_id, stream_id, end, end + n, 10)
                return sm.CommitStreamSetObject(
                    node, epoch, sm.NO_OBJECT, sm.NO_OBJECT, 0, (), (entry,), (), False, 1
                )
            case "trim":
                new_start = min(end, stream.start_offset + n)
                return sm.TrimStream(node, epoch, stream_id, stream.epoch, new_start)
            case "prepare":
                return sm.PrepareObject(node, epoch, n, TTL_MS, self.now_ms)
            case "ids":
                return sm.AllocateProducerIds(node, epoch, n)
            case "compact":
                sources = sorted(stream.stream_objects.values(), key=lambda r: r.start_offset)
                if len(sources) < 2:
                    return None
                object_id = self.prepare(node, 1)
                ids = tuple(
                    i for i, r in stream.stream_objects.items() if r in (sources[0], sources[1])
                )
                return sm.CommitStreamObject(
                    node,
                    epoch,
                    stream_id,
                    sm.ANY_STREAM_EPOCH,
                    object_id,
                    sources[0].start_offset,
                    sources[1].end_offset,
                    20,
                    ids,
                    self.now_ms,
                )
            case "delete":
                return sm.DeleteStream(node, epoch, stream_id, stream.epoch, self.now_ms)
        raise AssertionError(kind)


@given(histories())
def test_every_resendable_request_is_answered_alike_when_repeated(
    history: list[tuple[str, int, int, int]],
) -> None:
    world = _World()
    for kind, node_index, stream_index, n in history:
        event = world.event(kind, NODES[node_index], world.streams[stream_index], n)
        if event is None:
            continue
        assert sm.resendable(event)
        if not _accepted(world.image, event):
            continue
        _check_resend(world.image, event)
        if isinstance(event, sm.CommitStreamSetObject):
            world.commits.append(event)
        world.image = sm.step(world.image, event).state
        world.now_ms += 1
    # A commit's resend may come after anything other nodes did meanwhile: still redundant.
    for commit in world.commits:
        transition = sm.step(world.image, commit)
        response = sm.response_of(transition)
        alive = all(
            o.object_id in world.image.objects
            and world.image.objects[o.object_id].state is sm.S3ObjectState.COMMITTED
            for o in commit.stream_objects
        )
        if commit.object_id == sm.NO_OBJECT and not alive:
            continue  # its stream object was compacted away meanwhile
        assert response.error is sm.StreamErrorCode.REDUNDANT_OPERATION, (commit, response)
        assert sm.records_of(transition) == ()


def test_each_resendable_kind_is_exercised() -> None:
    """The history above draws every kind of ``sm.RESENDABLE_REQUESTS`` (one each here)."""
    world = _World()
    node, stream_id = NODES[0], world.streams[0]
    kinds = ["open", "commit", "objects", "objects", "compact", "trim", "prepare", "ids", "close"]
    kinds.append("delete")
    seen: set[type] = set()
    for kind in kinds:
        event = world.event(kind, node, stream_id, 2)
        assert event is not None, kind
        assert _accepted(world.image, event), (kind, sm.response_of(sm.step(world.image, event)))
        _check_resend(world.image, event)
        seen.add(type(event))
        world.image = sm.step(world.image, event).state
    assert seen == set(sm.RESENDABLE_REQUESTS)
    # Not resendable: a second CreateStream is a second stream.
    create = sm.CreateStream(node, world.epochs[node])
    assert not sm.resendable(create)
    once = sm.step(world.image, create)
    twice = sm.step(once.state, create)
    assert sm.response_of(twice).stream_id != sm.response_of(once).stream_id
    assert not sm.resendable(sm.PutKV("k", b"v", overwrite=False))
