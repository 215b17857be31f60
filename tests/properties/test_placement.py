"""Placement: the pure placement arithmetic, and PlacementMachine, every TLA+ action of
specs/Placement.tla as a rule on the real StreamMetadata ``step``.

The arithmetic (``automq_ref/state_machines/placement.py``) is checked on random clusters: new
partitions go to live brokers evenly and across racks; a broker's departure moves only its
partitions; a joining broker receives only as many as its share; balancing by count ends within
one; balancing by load never raises a peak past its goal range, strictly lowers the balance
potential, respects its cap and stops (a second round finds nothing to do).

PlacementMachine drives brokers through registration, heartbeats at a moving clock, session
expiry, controlled shutdown and unregistration, creates and deletes topics, reassigns, elects and
balances, and lets brokers create, open and close their partitions' streams, as well-behaved
brokers do (following the image) and as stale ones do (old epochs, partitions that moved). After
every step the spec's invariants are checked on the image; between steps, that every accepted
open came from the partition's broker at its leader epoch (``OpenOnlyByAssignee``) and that leader
and node epochs never decrease.
"""

from __future__ import annotations

import itertools
import uuid

from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from automq_ref.formats.topic_record import Topic, decode_topic
from automq_ref.state_machines import placement as pl
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import (
    EMPTY_IMAGE,
    NO_LEADER,
    BalancePartitions,
    BrokerHeartbeat,
    CloseStream,
    ControlledShutdown,
    CreatePartitions,
    CreateStream,
    CreateTopic,
    DeleteTopic,
    ElectLeaders,
    Endpoint,
    ExpireSessions,
    OpenStream,
    PartitionLoad,
    PlacementEvent,
    ReassignPartition,
    RegisterNode,
    StreamErrorCode,
    StreamMetadataImage,
    StreamMetadataParams,
    StreamState,
    UnregisterBroker,
)
from automq_ref.vocabulary.naming import topic_key

E = StreamErrorCode

# =============================================================== the placement arithmetic

RACKS = ("a", "b", "c")


@st.composite
def clusters(
    draw: st.DrawFn, min_brokers: int = 1, max_partitions: int = 24
) -> tuple[list[pl.Broker], dict[pl.PartitionKey, int]]:
    """Live brokers (ids 0..n-1, random racks) and an assignment over them and some dead ones
    (ids 10+) or none."""
    count = draw(st.integers(min_brokers, 5))
    brokers = [pl.Broker(i, draw(st.sampled_from(RACKS))) for i in range(count)]
    owners = st.sampled_from([*range(count), 10, 11, pl.NO_BROKER])
    partitions = draw(st.integers(0, max_partitions))
    topics = draw(st.lists(st.sampled_from("xyz"), min_size=partitions, max_size=partitions))
    assignment = {(topic, index): draw(owners) for index, topic in enumerate(topics)}
    return brokers, assignment


def spread(counts: dict[int, int]) -> int:
    return max(counts.values()) - min(counts.values()) if counts else 0


def applied(
    assignment: dict[pl.PartitionKey, int], moves: dict[pl.PartitionKey, int]
) -> dict[pl.PartitionKey, int]:
    return {**assignment, **moves}


@given(clusters(), st.integers(0, 12))
def test_new_partitions_go_to_live_brokers_evenly(
    cluster: tuple[list[pl.Broker], dict[pl.PartitionKey, int]], count: int
) -> None:
    brokers, assignment = cluster
    before = pl.partition_counts(brokers, assignment)
    chosen = pl.place_partitions(brokers, assignment, count)
    assert len(chosen) == count
    assert {node_id for node_id in chosen} <= {broker.node_id for broker in brokers}
    after = dict(before)
    for node_id in chosen:
        after[node_id] += 1
    # Each goes where there are fewest: the spread never grows past one (or what it was).
    assert spread(after) <= max(spread(before), 1)
    assert pl.place_partitions(brokers, assignment, count) == chosen  # deterministic


@given(st.integers(1, 3), st.integers(2, 3), st.integers(1, 20))
def test_consecutive_partitions_land_on_other_racks(per_rack: int, racks: int, count: int) -> None:
    """Equal racks, equal counts: consecutive new partitions never share a rack."""
    brokers = [pl.Broker(r * 10 + i, RACKS[r]) for r in range(racks) for i in range(per_rack)]
    rack_of = {broker.node_id: broker.rack for broker in brokers}
    chosen = pl.place_partitions(brokers, {}, count)
    for first, second in itertools.pairwise(chosen):
        assert rack_of[first] != rack_of[second], chosen


def test_rack_order_deals_one_rack_at_a_time() -> None:
    brokers = [pl.Broker(1, "b"), pl.Broker(2, "a"), pl.Broker(3, "a"), pl.Broker(4, "c")]
    assert [b.node_id for b in pl.rack_order(brokers)] == [2, 1, 4, 3]


@given(clusters())
def test_a_departure_moves_only_the_stranded_partitions(
    cluster: tuple[list[pl.Broker], dict[pl.PartitionKey, int]],
) -> None:
    brokers, assignment = cluster
    live = {broker.node_id for broker in brokers}
    moves = pl.move_off(brokers, assignment)
    assert set(moves) == {key for key, node_id in assignment.items() if node_id not in live}
    assert set(moves.values()) <= live
    counts_before = pl.partition_counts(brokers, assignment)
    counts_after = pl.partition_counts(brokers, applied(assignment, moves))
    assert spread(counts_after) <= max(spread(counts_before), 1)
    assert pl.move_off([], assignment) == {
        key: pl.NO_BROKER for key, node_id in assignment.items() if node_id != pl.NO_BROKER
    }


@given(clusters())
def test_a_shutting_down_broker_is_drained_in_batches(
    cluster: tuple[list[pl.Broker], dict[pl.PartitionKey, int]],
) -> None:
    """Broker 10 shuts down: its partitions are held by every other rule and leave in rounds
    of AutoMQ's batch, each round to live brokers only (none when none is live), until none is
    left; the others' partitions never move."""
    brokers, assignment = cluster
    live = {broker.node_id for broker in brokers}
    assert not set(pl.move_off(brokers, assignment, held=[10])) & {
        key for key, node_id in assignment.items() if node_id == 10
    }
    current = dict(assignment)
    rounds = 0
    while any(node_id == 10 for node_id in current.values()):
        mine = sum(1 for node_id in current.values() if node_id == 10)
        moves = pl.drain(brokers, current, [10])
        assert {current[key] for key in moves} == {10}
        assert len(moves) == (min(mine, pl.shutdown_batch_size(mine)) if brokers else mine)
        assert set(moves.values()) <= (live or {pl.NO_BROKER})
        current.update(moves)
        rounds += 1
    assert rounds <= 1 + len(assignment) // pl.SHUTDOWN_BATCH_MIN
    assert {k: v for k, v in current.items() if assignment[k] != 10} == {
        k: v for k, v in assignment.items() if v != 10
    }


def test_the_shutdown_batch_is_automqs() -> None:
    """max(ceil(leaders / 60), 100): a broker with thousands of partitions drains in a minute."""
    sizes = [pl.shutdown_batch_size(n) for n in (0, 1, 100, 6000, 6001, 12000)]
    assert sizes == [100, 100, 100, 100, 101, 200]


@given(clusters(min_brokers=2), st.data())
def test_a_joining_broker_takes_only_its_share(
    cluster: tuple[list[pl.Broker], dict[pl.PartitionKey, int]], data: st.DataObject
) -> None:
    brokers, assignment = cluster
    joined = data.draw(st.sampled_from([broker.node_id for broker in brokers]))
    live = {broker.node_id for broker in brokers}
    current = applied(assignment, pl.move_off(brokers, assignment))
    moves = pl.share_with(brokers, current, joined)
    assert set(moves.values()) <= {joined}
    assert all(current[key] not in (joined, pl.NO_BROKER) for key in moves)
    counts = pl.partition_counts(brokers, applied(current, moves))
    assert all(counts[node_id] <= counts[joined] + 1 for node_id in live)
    # No more than needed: before the last move, some broker had two more than the joiner.
    if moves:
        before_last = pl.partition_counts(brokers, applied(current, dict(list(moves.items())[:-1])))
        assert max(before_last.values()) >= before_last[joined] + 2


@given(clusters(), st.integers(0, 30))
def test_balancing_by_count_ends_within_one(
    cluster: tuple[list[pl.Broker], dict[pl.PartitionKey, int]], max_moves: int
) -> None:
    brokers, assignment = cluster
    current = applied(assignment, pl.move_off(brokers, assignment))
    moves = pl.balance_counts(brokers, current, max_moves)
    assert len(moves) <= max_moves
    assert set(moves.values()) <= {broker.node_id for broker in brokers}
    if max_moves >= len(current):
        assert spread(pl.partition_counts(brokers, applied(current, moves))) <= 1


loads = st.builds(pl.Load, st.integers(0, 4_000_000), st.integers(0, 4_000_000))


@given(clusters(min_brokers=2), st.data(), st.integers(0, 40))
def test_balancing_by_load_never_raises_a_peak_past_its_goal_and_stops(
    cluster: tuple[list[pl.Broker], dict[pl.PartitionKey, int]], data: st.DataObject, cap: int
) -> None:
    brokers, assignment = cluster
    current = applied(assignment, pl.move_off(brokers, assignment))
    reported = {key: data.draw(loads) for key in current}
    params = pl.BalanceParams(
        network_in_threshold_bytes_per_sec=data.draw(st.sampled_from([0, 1024 * 1024])),
        max_moves=cap,
    )
    moves = pl.balance_loads(brokers, current, reported, params)
    after = applied(current, moves)
    assert len(moves) <= cap
    assert set(moves.values()) <= {broker.node_id for broker in brokers}
    for resource in pl.RESOURCES:
        # A peak never rises above where it was or above its goal range.
        before_loads = _broker_load(brokers, current, reported, resource)
        peak_before = max(before_loads.values())
        peak_after = max(_broker_load(brokers, after, reported, resource).values())
        totals = {b: [0, 0] for b in before_loads}
        for b, value in before_loads.items():
            totals[b][resource] = value
        assert peak_after <= max(peak_before, pl.goal_bound(totals, resource, params))
    if moves:
        before = pl.balance_potential(brokers, current, reported)
        assert pl.balance_potential(brokers, after, reported) < before
    # Stability: uncapped, a round reaches a point the next round leaves alone.
    uncapped = pl.BalanceParams(max_moves=10_000)
    settled = applied(current, pl.balance_loads(brokers, current, reported, uncapped))
    assert pl.balance_loads(brokers, settled, reported, uncapped) == {}


def _broker_load(
    brokers: list[pl.Broker],
    assignment: dict[pl.PartitionKey, int],
    reported: dict[pl.PartitionKey, pl.Load],
    resource: int,
) -> dict[int, int]:
    totals = {broker.node_id: 0 for broker in brokers}
    for key, node_id in assignment.items():
        if node_id in totals:
            totals[node_id] += reported.get(key, pl.NO_LOAD).of(resource)
    return totals


def test_a_new_empty_broker_receives_its_share_of_the_load() -> None:
    """Twelve partitions of 2 MiB/s in on two brokers; a third, empty, joins: a round moves
    four to it and every broker ends within the goal range."""
    brokers = [pl.Broker(1, "a"), pl.Broker(2, "b"), pl.Broker(3, "c")]
    assignment = {("t", i): 1 + i % 2 for i in range(12)}
    reported = {key: pl.Load(2 * 1024 * 1024, 1024 * 1024) for key in assignment}
    moves = pl.balance_loads(brokers, assignment, reported)
    assert set(moves.values()) == {3} and len(moves) == 4
    assert pl.partition_counts(brokers, applied(assignment, moves)) == {1: 4, 2: 4, 3: 4}


def test_balancing_leaves_brokers_below_the_threshold_alone() -> None:
    brokers = [pl.Broker(1, "a"), pl.Broker(2, "b")]
    assignment = {("t", i): 1 for i in range(4)}
    reported = {key: pl.Load(100, 100) for key in assignment}
    assert pl.balance_loads(brokers, assignment, reported) == {}
    low = pl.BalanceParams(network_in_threshold_bytes_per_sec=0)
    assert len(pl.balance_loads(brokers, assignment, reported, low)) == 2


# ============================================================= the machine: PlacementMachine

NODES = (0, 1, 2, 3)
RACK_OF = {0: "a", 1: "b", 2: "a", 3: "c"}
TOPICS = ("t0", "t1")
SESSION_MS = 9_000
PARAMS = StreamMetadataParams(broker_session_timeout_ms=SESSION_MS)
MAX_STREAMS = 6


def topic_value(name: str, partitions: int, generation: int = 0) -> bytes:
    topic_id = uuid.UUID(int=(TOPICS.index(name) + 1) * 1000 + generation)
    return Topic(name, topic_id, partitions, {}).encode()


def listeners(node_id: int) -> tuple[Endpoint, ...]:
    return (Endpoint("PLAINTEXT", "127.0.0.1", 9092 + node_id),)


class PlacementMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.image: StreamMetadataImage = EMPTY_IMAGE
        self.records: list[sm.MetadataRecord] = []
        self.now_ms = 0
        self.node_epochs: dict[int, int] = {}
        self.generation = 0

    # ----------------------------------------------------------------------------- helpers

    def apply(self, event: PlacementEvent) -> sm.Response:
        before = self.image
        transition = sm.step(self.image, event, PARAMS)
        response = sm.response_of(transition)
        records = sm.records_of(transition)
        appended = (sm.AppendRecords(records),) if records else ()
        assert transition.effects == (*appended, sm.Respond(response)), transition.effects
        if not response.ok:
            assert records == () and transition.state == before, (event, response)
        self.image = transition.state
        self.records.extend(records)
        self._check_transition(before, event, response)
        return response

    def _check_transition(
        self, before: StreamMetadataImage, event: PlacementEvent, response: sm.Response
    ) -> None:
        after = self.image
        # OpenOnlyByAssignee: an accepted open of a partition's stream came from the
        # partition's broker, at its leader epoch.
        if isinstance(event, OpenStream) and response.ok:
            stream = before.streams[event.stream_id]
            key = stream.partition_key
            if key is not None:
                assignment = before.topics[key[0]].partitions[key[1]]
                assert (event.node_id, event.stream_epoch) == (
                    assignment.leader,
                    assignment.leader_epoch,
                ), (event, assignment)
        for topic_id, placed in before.topics.items():
            later = after.topics.get(topic_id)
            for index, assignment in placed.partitions.items():
                if later is not None and index in later.partitions:
                    assert later.partitions[index].leader_epoch >= assignment.leader_epoch
                    if later.partitions[index].leader != assignment.leader:
                        assert later.partitions[index].leader_epoch > assignment.leader_epoch
        for node_id, node in before.nodes.items():
            assert after.nodes[node_id].node_epoch >= node.node_epoch

    def tick(self, elapsed_ms: int) -> int:
        self.now_ms += elapsed_ms
        return self.now_ms

    def epoch_for(self, node_id: int, delta: int) -> int:
        return max(0, self.node_epochs.get(node_id, 0) + delta)

    def live(self) -> set[int]:
        return {broker.node_id for broker in sm.live_brokers(self.image)}

    def placed(self) -> list[tuple[str, str, int]]:
        """(topic name, topic id, partition) of every placed partition."""
        return sorted(
            (placed.name, placed.topic_id, index)
            for placed in self.image.topics.values()
            for index in placed.partitions
        )

    def tagged_streams(self) -> list[sm.StreamMetadata]:
        return [s for s in self.image.streams.values() if s.partition_key is not None]

    # ------------------------------------------------------------------ rules (TLA+ actions)

    @initialize()
    def start_two_brokers(self) -> None:
        """Two live brokers and a topic of three partitions, each with a stream open."""
        for node_id in NODES[:2]:
            self.register_node(node_id)
            self.broker_heartbeat(node_id, 0, 1_000, False)
        assert self.apply(CreateTopic("t0", topic_value("t0", 3))).ok
        self.brokers_follow_the_image()

    @rule(node_id=st.sampled_from(NODES))
    def register_node(self, node_id: int) -> None:
        response = self.apply(RegisterNode(node_id, 0, RACK_OF[node_id], listeners(node_id)))
        assert response.ok and response.node_epoch is not None
        self.node_epochs[node_id] = response.node_epoch
        broker = self.image.brokers[node_id]
        assert broker.fenced and broker.rack == RACK_OF[node_id]
        assert not sm.broker_partitions(self.image, node_id)

    @rule(
        node_id=st.sampled_from(NODES),
        delta=st.sampled_from([0, 0, 0, -1]),
        elapsed_ms=st.sampled_from([0, 1_000, 2_000, 5_000]),
        report=st.booleans(),
    )
    def broker_heartbeat(self, node_id: int, delta: int, elapsed_ms: int, report: bool) -> None:
        reported = tuple(
            PartitionLoad(topic_id, index, 1024 * 1024 * (1 + index), 512 * 1024)
            for name, topic_id, index in self.placed()
            if report and sm.assigned_broker(self.image, name, index) == node_id
        )
        was = self.image.brokers.get(node_id)
        epoch = self.epoch_for(node_id, delta)
        response = self.apply(BrokerHeartbeat(node_id, epoch, self.tick(elapsed_ms), reported))
        if response.ok:
            assert was is not None
            broker = self.image.brokers[node_id]
            assert response.fenced == broker.fenced == was.in_controlled_shutdown
            if not broker.fenced:
                assert self.image.sessions[node_id] == self.now_ms + SESSION_MS
        elif was is not None and epoch == self.image.nodes[node_id].node_epoch:
            raise AssertionError(response)

    @rule(elapsed_ms=st.sampled_from([0, 3_000, 10_000]))
    def expire_sessions(self, elapsed_ms: int) -> None:
        now_ms = self.tick(elapsed_ms)
        lapsed = {
            node_id
            for node_id in self.live()
            if (deadline := self.image.sessions.get(node_id)) is not None and deadline < now_ms
        }
        epochs = {node_id: self.image.nodes[node_id].node_epoch for node_id in lapsed}
        response = self.apply(ExpireSessions(now_ms))
        assert response.ok
        for node_id in lapsed:
            assert self.image.brokers[node_id].fenced
            assert self.image.nodes[node_id].node_epoch == epochs[node_id] + 1
            assert not sm.broker_partitions(self.image, node_id)
        assert all(node_id in self.image.sessions for node_id in self.live())

    @rule(node_id=st.sampled_from(NODES))
    def controlled_shutdown(self, node_id: int) -> None:
        response = self.apply(ControlledShutdown(node_id, self.epoch_for(node_id, 0)))
        if response.ok:
            assert self.image.brokers[node_id].in_controlled_shutdown
            assert not sm.broker_partitions(self.image, node_id)

    @rule(node_id=st.sampled_from(NODES))
    def unregister_broker(self, node_id: int) -> None:
        holds_open = bool(sm.opening_streams(self.image, node_id))
        response = self.apply(UnregisterBroker(node_id))
        if response.ok:
            assert node_id not in self.image.brokers and not holds_open
        elif node_id in self.image.brokers:
            assert response.error is E.STREAM_NOT_CLOSED and holds_open

    @rule(
        name=st.sampled_from(TOPICS),
        partitions=st.integers(0, 4),
        by_hand=st.booleans(),
        data=st.data(),
    )
    def create_topic(self, name: str, partitions: int, by_hand: bool, data: st.DataObject) -> None:
        self.generation += 1
        value = topic_value(name, partitions, self.generation)
        assignments: tuple[int, ...] = ()
        if by_hand:
            choices = st.sampled_from([*sorted(self.live()), *NODES])
            assignments = tuple(data.draw(choices) for _ in range(partitions))
        existed = topic_key(name) in self.image.kv
        response = self.apply(CreateTopic(name, value, assignments))
        if existed:
            assert response.error is E.KEY_EXIST
        elif response.ok:
            placed = sm.placed_topic(self.image, name)
            assert placed is not None and len(placed.partitions) == partitions
            if assignments:
                leaders = tuple(placed.partitions[i].leader for i in range(partitions))
                assert leaders == assignments
        elif partitions >= 1 and self.live() and not assignments:
            raise AssertionError(response)

    @precondition(lambda self: bool(self.image.topics))
    @rule(data=st.data(), extra=st.integers(0, 2))
    def create_partitions(self, data: st.DataObject, extra: int) -> None:
        placed = data.draw(st.sampled_from(sorted(self.image.topics.values(), key=repr)))
        expected = self.image.kv[topic_key(placed.name)]
        topic = decode_topic(placed.name, expected)
        grown = Topic(topic.name, topic.topic_id, topic.partitions + extra, topic.configs)
        response = self.apply(CreatePartitions(placed.name, grown.encode(), expected))
        if response.ok:
            after = self.image.topics[placed.topic_id]
            assert sorted(after.partitions) == list(range(grown.partitions))

    @precondition(lambda self: bool(self.image.topics))
    @rule(data=st.data())
    def delete_topic(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(TOPICS))
        response = self.apply(DeleteTopic(name))
        assert response.ok
        assert sm.placed_topic(self.image, name) is None and topic_key(name) not in self.image.kv

    @precondition(lambda self: bool(self.image.topics))
    @rule(data=st.data(), broker=st.sampled_from(NODES))
    def reassign_partition(self, data: st.DataObject, broker: int) -> None:
        name, _, index = data.draw(st.sampled_from(self.placed()))
        self._reassign(name, index, broker)

    def _reassign(self, name: str, index: int, broker: int) -> None:
        before = sm.partition_assignment(self.image, name, index)
        response = self.apply(ReassignPartition(name, index, broker))
        assert before is not None
        if broker in self.live():
            assert response.ok and sm.assigned_broker(self.image, name, index) == broker
        else:
            assert response.error is E.INVALID_REPLICA_ASSIGNMENT

    @precondition(lambda self: bool(self.image.topics) and len(self.live()) >= 2)
    @rule(data=st.data())
    def move_and_follow(self, data: st.DataObject) -> None:
        """A move by hand, then the brokers act on it (the old one closes, the new one opens)."""
        name, _, index = data.draw(st.sampled_from(self.placed()))
        broker = data.draw(st.sampled_from(sorted(self.live())))
        self._reassign(name, index, broker)
        self.brokers_follow_the_image()

    @precondition(lambda self: bool(self.image.topics))
    @rule(data=st.data())
    def elect_leaders(self, data: st.DataObject) -> None:
        name, _, index = data.draw(st.sampled_from(self.placed()))
        response = self.apply(ElectLeaders(name, index))
        # Every partition is on a live broker whenever one is live: nothing to elect.
        assert response.error in (E.ELECTION_NOT_NEEDED, E.ELIGIBLE_LEADERS_NOT_AVAILABLE)

    @rule(elapsed_ms=st.sampled_from([0, 1_000, 70_000]))
    def balance_partitions(self, elapsed_ms: int) -> None:
        response = self.apply(BalancePartitions(self.tick(elapsed_ms)))
        assert response.ok

    @precondition(lambda self: bool(self.image.topics))
    @rule(data=st.data(), any_node=st.booleans())
    def create_stream(self, data: st.DataObject, any_node: bool) -> None:
        if len(self.tagged_streams()) >= MAX_STREAMS:
            return
        name, topic_id, index = data.draw(st.sampled_from(self.placed()))
        leader = sm.assigned_broker(self.image, name, index)
        node_id = data.draw(st.sampled_from(NODES)) if any_node else leader
        if node_id is None or node_id == NO_LEADER:
            return
        response = self.apply(CreateStream(node_id, self.epoch_for(node_id, 0), topic_id, index))
        if node_id != leader:
            assert response.error in (
                E.NOT_LEADER_OR_FOLLOWER,
                E.NODE_EPOCH_NOT_EXIST,
                E.NODE_EPOCH_EXPIRED,
            )

    @precondition(lambda self: bool(self.tagged_streams()))
    @rule(data=st.data(), epoch_delta=st.sampled_from([0, 0, 0, -1, 1]))
    def open_stream(self, data: st.DataObject, epoch_delta: int) -> None:
        stream = data.draw(st.sampled_from(self.tagged_streams()))
        key = stream.partition_key
        assert key is not None
        placed = self.image.topics.get(key[0])
        assignment = placed.partitions.get(key[1]) if placed is not None else None
        leader = assignment.leader if assignment is not None else 0
        node_id = data.draw(st.sampled_from([leader, leader, *NODES]))
        epoch = (assignment.leader_epoch if assignment is not None else 0) + epoch_delta
        response = self.apply(
            OpenStream(node_id, self.epoch_for(node_id, 0), stream.stream_id, max(0, epoch))
        )
        if response.ok:
            assert self.image.streams[stream.stream_id].state is StreamState.OPENED

    @precondition(lambda self: bool(self.tagged_streams()))
    @rule(data=st.data())
    def close_stream(self, data: st.DataObject) -> None:
        stream = data.draw(st.sampled_from(self.tagged_streams()))
        current = stream.current_range
        owner = current.node_id if current is not None else 0
        self.apply(
            CloseStream(owner, self.epoch_for(owner, 0), stream.stream_id, max(stream.epoch, 0))
        )

    @precondition(lambda self: bool(self.image.brokers))
    @rule(elapsed_ms=st.sampled_from([1_000, 2_000]))
    def heartbeat_all(self, elapsed_ms: int) -> None:
        """Healthy brokers, composed of the actions above: every registered broker heartbeats
        at the same moment; one that was fenced by its session (its epoch bumped) registers
        again, as a restarted broker does."""
        now_ms = self.tick(elapsed_ms)
        for node_id in sorted(self.image.brokers):
            response = self.apply(BrokerHeartbeat(node_id, self.epoch_for(node_id, 0), now_ms))
            if response.error is E.NODE_EPOCH_EXPIRED:
                self.register_node(node_id)
                self.apply(BrokerHeartbeat(node_id, self.epoch_for(node_id, 0), now_ms))

    @precondition(lambda self: bool(self.image.topics))
    @rule()
    def brokers_follow_the_image(self) -> None:
        """Well-behaved brokers, composed of the actions above: each partition's broker creates
        a stream for it if it has none; each broker closes the open streams of partitions that
        moved away from it; then each partition's broker opens its streams at the leader epoch."""
        for name, topic_id, index in self.placed():
            leader = sm.assigned_broker(self.image, name, index)
            missing = not sm.partition_streams(self.image, topic_id, index)
            if missing and leader not in (None, NO_LEADER) and len(self.tagged_streams()) < 6:
                assert leader is not None
                self.apply(CreateStream(leader, self.epoch_for(leader, 0), topic_id, index))
        for stream in self.tagged_streams():
            current = stream.current_range
            key = stream.partition_key
            assert key is not None
            placed = self.image.topics.get(key[0])
            assignment = placed.partitions.get(key[1]) if placed is not None else None
            moved = assignment is None or (
                current is not None and current.node_id != assignment.leader
            )
            if stream.state is StreamState.OPENED and current is not None and moved:
                owner = current.node_id
                response = self.apply(
                    CloseStream(owner, self.epoch_for(owner, 0), stream.stream_id, stream.epoch)
                )
                # A broker fenced by its session cannot close (its epoch was bumped): its
                # streams wait for a failover, which this machine leaves out.
                assert response.ok or response.error is E.NODE_EPOCH_EXPIRED
        for stream in self.tagged_streams():
            key = stream.partition_key
            assert key is not None
            placed = self.image.topics.get(key[0])
            assignment = placed.partitions.get(key[1]) if placed is not None else None
            if assignment is None or assignment.leader == NO_LEADER:
                continue
            leader = assignment.leader
            previous = stream.current_range
            response = self.apply(
                OpenStream(
                    leader, self.epoch_for(leader, 0), stream.stream_id, assignment.leader_epoch
                )
            )
            assert response.ok or response.error is E.STREAM_NOT_CLOSED, response
            if response.ok and previous is not None and previous.node_id != leader:
                event("a partition's stream reopened on another broker (a completed move)")

    # ------------------------------------------------------------------------- invariants

    @invariant()
    def partitions_on_live_brokers(self) -> None:
        sm.inv_partitions_on_live_brokers(self.image)

    @invariant()
    def one_owner_per_partition(self) -> None:
        sm.inv_one_owner_per_partition(self.image)

    @invariant()
    def single_opener_per_epoch(self) -> None:
        sm.inv_single_opener_per_epoch(self.image)

    @invariant()
    def stream_invariants_hold(self) -> None:
        sm.check_invariants(self.image)

    @invariant()
    def image_is_the_replay_of_its_records(self) -> None:
        assert sm.replay_all(EMPTY_IMAGE, self.records) == self.image
        assert sm.replay_all(EMPTY_IMAGE, sm.image_records(self.image)) == self.image


TestPlacementMachine = PlacementMachine.TestCase


# ======================================================== the machine: examples by hand


def run(image: StreamMetadataImage, *events: sm.StreamMetadataEvent) -> StreamMetadataImage:
    for request in events:
        transition = sm.step(image, request, PARAMS)
        assert sm.response_of(transition).ok, (request, sm.response_of(transition))
        image = transition.state
    return image


def counts_of(image: StreamMetadataImage) -> dict[int, int]:
    counts: dict[int, int] = {}
    for placed in image.topics.values():
        for assignment in placed.partitions.values():
            counts[assignment.leader] = counts.get(assignment.leader, 0) + 1
    return counts


def two_brokers_one_sided() -> StreamMetadataImage:
    """Brokers 1 and 2 live; topic t0's four partitions all on broker 1 (by hand)."""
    image = run(
        EMPTY_IMAGE,
        RegisterNode(1, 0, "a"),
        RegisterNode(2, 0, "b"),
        BrokerHeartbeat(1, 0, 1_000),
        BrokerHeartbeat(2, 0, 1_000),
    )
    return run(image, CreateTopic("t0", topic_value("t0", 4), (1, 1, 1, 1)))


def test_a_controller_that_took_over_moves_nothing_until_brokers_report() -> None:
    image = two_brokers_one_sided()
    # A new controller replays the log: no sessions, no reports.
    taken_over = sm.replay_all(EMPTY_IMAGE, sm.image_records(image))
    assert taken_over == image and not taken_over.reports and not taken_over.sessions
    assert sm.records_of(sm.step(taken_over, BalancePartitions(2_000), PARAMS)) == ()
    # Its first tick gives every live broker a whole session, and fences nobody.
    ticked = run(taken_over, ExpireSessions(2_000))
    assert ticked.sessions == {1: 2_000 + SESSION_MS, 2: 2_000 + SESSION_MS}
    assert ticked == taken_over
    reported = run(ticked, BrokerHeartbeat(1, 0, 3_000), BrokerHeartbeat(2, 0, 3_000))
    balanced = run(reported, BalancePartitions(3_000))
    assert counts_of(balanced) == {1: 2, 2: 2}  # no load reported: by count


def test_loads_older_than_the_metrics_delay_are_not_used() -> None:
    image = two_brokers_one_sided()
    placed = sm.placed_topic(image, "t0")
    assert placed is not None
    heavy = tuple(PartitionLoad(placed.topic_id, index, 4 * 1024 * 1024, 0) for index in range(4))
    image = run(image, BrokerHeartbeat(1, 0, 2_000, heavy), BrokerHeartbeat(2, 0, 2_000))
    assert counts_of(run(image, BalancePartitions(3_000))) == {1: 2, 2: 2}
    # A minute later nobody has reported since: nobody takes part.
    late = 2_000 + PARAMS.autobalancer_metrics_delay_ms + 1
    assert sm.records_of(sm.step(image, BalancePartitions(late), PARAMS)) == ()


def test_a_new_empty_broker_receives_its_share_under_load() -> None:
    """Two brokers carry twelve partitions whose load is uneven; a third joins and takes its
    share by count at once, then the next balancing round evens the load."""
    image = run(
        EMPTY_IMAGE,
        RegisterNode(1, 0, "a"),
        RegisterNode(2, 0, "b"),
        BrokerHeartbeat(1, 0, 1_000),
        BrokerHeartbeat(2, 0, 1_000),
        CreateTopic("t0", topic_value("t0", 12)),
    )
    placed = sm.placed_topic(image, "t0")
    assert placed is not None and counts_of(image) == {1: 6, 2: 6}

    def heartbeat(image: StreamMetadataImage, node_id: int, now_ms: int) -> StreamMetadataImage:
        """Broker ``node_id`` reports its partitions: partition i carries (1 + i % 3) MiB/s
        in, and as much out (one consumer)."""
        mib = 1024 * 1024
        loads = tuple(
            PartitionLoad(placed.topic_id, index, (1 + index % 3) * mib, (1 + index % 3) * mib)
            for _, index, _ in sm.broker_partitions(image, node_id)
        )
        return run(image, BrokerHeartbeat(node_id, 0, now_ms, loads))

    image = heartbeat(heartbeat(image, 1, 2_000), 2, 2_000)
    image = run(image, RegisterNode(3, 0, "c"), BrokerHeartbeat(3, 0, 3_000))
    assert counts_of(image) == {1: 4, 2: 4, 3: 4}  # its share, at once
    for node_id in (1, 2, 3):
        image = heartbeat(image, node_id, 4_000)
    balanced = run(image, BalancePartitions(5_000))
    totals = dict.fromkeys((1, 2, 3), 0)
    for placed_topic in balanced.topics.values():
        for index, assignment in placed_topic.partitions.items():
            totals[assignment.leader] += (1 + index % 3) * 1024 * 1024
    mean = sum(totals.values()) / 3
    assert max(totals.values()) <= mean * 1.2, totals


def test_a_controlled_shutdown_moves_the_partitions_in_batches_one_a_tick() -> None:
    """250 partitions on broker 1, which shuts down: the first 100 move at the request, 100 at
    each session tick after; meanwhile a broker that joins takes none of them, and every step
    keeps PartitionsOnLiveBrokers (broker 1 is draining)."""
    image = run(
        EMPTY_IMAGE,
        RegisterNode(1, 0, "a"),
        RegisterNode(2, 0, "b"),
        BrokerHeartbeat(1, 0, 1_000),
        BrokerHeartbeat(2, 0, 1_000),
    )
    image = run(image, CreateTopic("t0", topic_value("t0", 250), (1,) * 250))
    image = run(image, ControlledShutdown(1, 0))
    sm.inv_partitions_on_live_brokers(image)
    assert counts_of(image) == {1: 150, 2: 100}
    image = run(image, RegisterNode(3, 0, "c"), BrokerHeartbeat(3, 0, 1_500))
    assert counts_of(image)[1] == 150  # held: only the drain moves them
    image = run(image, ExpireSessions(2_000))
    sm.inv_partitions_on_live_brokers(image)
    assert counts_of(image)[1] == 50
    image = run(image, ExpireSessions(3_000))
    assert 1 not in counts_of(image) and sum(counts_of(image).values()) == 250
    assert sm.records_of(sm.step(image, ExpireSessions(4_000), PARAMS)) == ()
    # It comes back: a new registration, no longer draining, and it takes its share.
    image = run(image, RegisterNode(1, 0, "a"), BrokerHeartbeat(1, 1, 4_500))
    assert not image.brokers[1].in_controlled_shutdown and counts_of(image)[1] >= 83


def test_a_lapsed_session_fences_and_moves_and_the_broker_must_register_again() -> None:
    image = two_brokers_one_sided()
    image = run(image, BrokerHeartbeat(2, 0, 9_000))
    image = run(image, ExpireSessions(10_001))  # broker 1's session ended at 10_000
    assert image.brokers[1].fenced and image.nodes[1].node_epoch == 1
    assert counts_of(image) == {2: 4}
    assert sm.live_brokers(image, 10_001) == [image.brokers[2]]
    refused = sm.step(image, BrokerHeartbeat(1, 0, 10_002), PARAMS)
    assert sm.response_of(refused).error is E.NODE_EPOCH_EXPIRED
    # Nor at the bumped epoch (what failover acts at): that registration is over.
    refused = sm.step(image, BrokerHeartbeat(1, 1, 10_002), PARAMS)
    assert sm.response_of(refused).error is E.NODE_EPOCH_EXPIRED
    refused = sm.step(image, ControlledShutdown(1, 1), PARAMS)
    assert sm.response_of(refused).error is E.NODE_EPOCH_EXPIRED
    image = run(image, RegisterNode(1, 0, "a"), BrokerHeartbeat(1, 2, 10_003))
    assert counts_of(image) == {1: 2, 2: 2}
    image = run(image, BrokerHeartbeat(1, 2, 15_000), ExpireSessions(18_001))
    # Broker 2's session ended (at 18_000): everything is on broker 1 ...
    assert counts_of(image) == {1: 4}
    image = run(image, ExpireSessions(24_001))
    # ... and then broker 1's: nothing is live, the partitions have no broker.
    assert counts_of(image) == {NO_LEADER: 4} and not sm.live_brokers(image)
    image = run(image, RegisterNode(2, 0, "b"), BrokerHeartbeat(2, 2, 50_000))
    assert counts_of(image) == {2: 4}  # partitions without a broker come to the one that joins
