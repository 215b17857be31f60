"""ConsumerGroupMachine: clients drive KIP-848 consumer groups of the Group machine at random.

The test plays the shell and the clients. Clients join with a subscription, heartbeat with the
epoch and the partitions they own, reconcile (give up what they were no longer told, take what
they were told) at their own pace, commit with their member epoch, leave (a static member for a
while, with -2) and are fenced when time passes their session; some send stale epochs, one
static instance has two incarnations, topics grow. After every step the machine's invariants
hold (``INVARIANTS``, and between two states ``TRANSITION_INVARIANTS``: a live member's epoch
never goes down), plus, from the clients' side:

* every heartbeat is answered at once, with the member's id and an epoch no lower than the
  client's;
* a partition is owned by one live client at most, and what a live client owns is what the
  coordinator counts it as owning (told, or told and not yet revoked);
* a commit naming the member's current epoch is accepted, any other epoch is
  ``STALE_MEMBER_EPOCH``;
* once every client heartbeats and reconciles for a few rounds without time passing, the group
  is Stable and every partition of every subscribed topic is owned by exactly one client
  subscribed to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from automq_ref.errors import KafkaErrorCode as E
from automq_ref.state_machines import group as g

PARAMS = g.GroupParams(
    consumer_session_timeout_ms=1_000,
    consumer_heartbeat_interval_ms=100,
    consumer_max_size=4,
)
GROUP = "cg"
# Four dynamic clients and one static instance "i" with two incarnations.
CLIENTS = {"c0": None, "c1": None, "c2": None, "s0": "i", "s0b": "i"}
TOPIC_NAMES = ("t", "u")
REBALANCE_TIMEOUT_MS = 5_000
SETTLE_ROUNDS = 8


@dataclass
class Client:
    member_id: str
    instance_id: str | None
    epoch: int = -1  # -1: not in the group (as far as it knows)
    subscription: tuple[str, ...] = ()
    told: frozenset[tuple[str, int]] = frozenset()
    owned: frozenset[tuple[str, int]] = frozenset()

    def reset(self) -> None:
        self.epoch, self.told, self.owned = -1, frozenset(), frozenset()


@dataclass
class Shell:
    state: g.CoordinatorState = field(default_factory=g.CoordinatorState)
    now_ms: int = 0
    next_request: int = 0

    def step(self, event: g.GroupEvent) -> g.GroupTransition:
        before = self.state
        transition = g.step(before, event, PARAMS)
        assert transition.rejection is None, transition
        self.state = transition.state
        g.check_invariants(self.state)
        for check in g.TRANSITION_INVARIANTS:
            check(before, self.state)
        return transition

    def request_id(self) -> int:
        self.next_request += 1
        return self.next_request


class ConsumerGroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.shell = Shell()
        self.topics: dict[str, int] = {"t": 3, "u": 2}
        self.clients = {name: Client(f"m-{name}", instance) for name, instance in CLIENTS.items()}

    # ------------------------------------------------------------------------------ helpers

    def group(self) -> g.ConsumerGroup | None:
        return self.shell.state.consumer_groups.get(GROUP)

    def live(self, name: str) -> g.ConsumerMember | None:
        """The client's member as the coordinator holds it, when the client is in the group."""
        client, group = self.clients[name], self.group()
        if client.epoch < 0 or group is None:
            return None
        member = group.members.get(client.member_id)
        return member if member is not None and member.member_epoch >= 0 else None

    def heartbeat(
        self, name: str, epoch: int, *, names: tuple[str, ...] | None = None, full: bool = False
    ) -> g.ConsumerGroupHeartbeatResponse:
        client = self.clients[name]
        joining = epoch == 0  # also a member still at epoch 0 (it must heartbeat as a join)
        if joining and names is None:
            names = client.subscription
        event = g.ConsumerGroupHeartbeat(
            self.shell.request_id(),
            self.shell.now_ms,
            GROUP,
            client.member_id,
            epoch,
            instance_id=client.instance_id,
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS if joining or full else -1,
            subscribed_topic_names=names if joining or full else None,
            owned=() if joining else tuple(sorted(client.owned)),
            topics=dict(self.topics),
        )
        transition = self.shell.step(event)
        (answer,) = transition.effects
        assert isinstance(answer, g.Respond) and answer.request_id == event.request_id
        response = answer.response
        assert isinstance(response, g.ConsumerGroupHeartbeatResponse)
        return response

    def apply(self, name: str, response: g.ConsumerGroupHeartbeatResponse) -> None:
        """The client takes a heartbeat's answer."""
        client = self.clients[name]
        if response.error_code is E.NONE:
            assert response.member_id == client.member_id
            assert response.member_epoch >= max(client.epoch, 0), (client, response)
            client.epoch = response.member_epoch
            if response.assignment is not None:
                client.told = response.assignment  # taken up (and the rest given up) later
        elif response.error_code in (
            E.FENCED_MEMBER_EPOCH,
            E.UNKNOWN_MEMBER_ID,
            E.FENCED_INSTANCE_ID,
        ):
            client.reset()  # it abandons its partitions and may rejoin

    # -------------------------------------------------------------------------------- rules

    @rule(name=st.sampled_from(sorted(CLIENTS)), topics=st.sets(st.sampled_from(TOPIC_NAMES)))
    def join(self, name: str, topics: set[str]) -> None:
        client = self.clients[name]
        if client.epoch >= 0:
            return
        client.subscription = tuple(sorted(topics))
        response = self.heartbeat(name, 0, names=client.subscription)
        assert response.error_code in (
            E.NONE,
            E.UNRELEASED_INSTANCE_ID,
            E.GROUP_MAX_SIZE_REACHED,
        ), response
        if response.error_code is E.NONE:
            assert response.assignment is not None  # a join is a full request
        self.apply(name, response)

    @rule(name=st.sampled_from(sorted(CLIENTS)))
    def heartbeats(self, name: str) -> None:
        if self.clients[name].epoch < 0:
            return
        self.apply(name, self.heartbeat(name, self.clients[name].epoch))

    @rule(name=st.sampled_from(sorted(CLIENTS)), revoke_only=st.booleans())
    def reconciles(self, name: str, revoke_only: bool) -> None:
        """The client gives up what it was not told any more, and maybe takes the rest."""
        client = self.clients[name]
        client.owned = client.owned & client.told if revoke_only else client.told

    @rule(name=st.sampled_from(sorted(CLIENTS)), delta=st.integers(-3, 3))
    def stale_epoch(self, name: str, delta: int) -> None:
        client = self.clients[name]
        if client.epoch < 0 or delta == 0 or client.epoch + delta <= 0:
            return
        response = self.heartbeat(name, client.epoch + delta)
        if response.error_code is E.NONE:
            assert delta < 0  # only the previous epoch is let through, with a subset owned
        self.apply(name, response)

    @rule(name=st.sampled_from(sorted(CLIENTS)), topics=st.sets(st.sampled_from(TOPIC_NAMES)))
    def resubscribes(self, name: str, topics: set[str]) -> None:
        client = self.clients[name]
        if client.epoch < 0:
            return
        client.subscription = tuple(sorted(topics))
        self.apply(name, self.heartbeat(name, client.epoch, names=client.subscription, full=True))

    @rule(name=st.sampled_from(sorted(CLIENTS)), temporarily=st.booleans())
    def leaves(self, name: str, temporarily: bool) -> None:
        client = self.clients[name]
        if client.epoch < 0:
            return
        epoch = g.LEAVE_GROUP_STATIC_MEMBER_EPOCH if temporarily and client.instance_id else -1
        response = self.heartbeat(name, epoch)
        if response.error_code is E.NONE:
            assert response.member_epoch == epoch
        client.reset()

    @rule(delta_ms=st.sampled_from([50, 400, 1_200, 6_000]))
    def time_passes(self, delta_ms: int) -> None:
        self.shell.now_ms += delta_ms
        self.shell.step(g.Tick(self.shell.now_ms))
        deadline = g.next_deadline_ms(self.shell.state)
        assert deadline is None or deadline > self.shell.now_ms

    @rule(topic=st.sampled_from(TOPIC_NAMES))
    def topic_grows(self, topic: str) -> None:
        if self.topics[topic] < 5:
            self.topics[topic] += 1

    @rule(name=st.sampled_from(sorted(CLIENTS)), off_by=st.sampled_from([0, 0, -1, 1]))
    def commits(self, name: str, off_by: int) -> None:
        client, member = self.clients[name], self.live(name)
        if member is None:
            return
        epoch = client.epoch + off_by
        request_id = self.shell.request_id()
        entry = g.OffsetCommitEntry("t", 0, 7)
        event = g.OffsetCommit(
            request_id, self.shell.now_ms, GROUP, epoch, client.member_id, None, (entry,), 9
        )
        effects = self.shell.step(event).effects
        if any(isinstance(e, g.PersistOffsets) for e in effects):
            effects = self.shell.step(g.OffsetsPersisted(request_id)).effects
        (answer,) = effects
        assert isinstance(answer, g.Respond)
        assert isinstance(answer.response, g.OffsetCommitResponse)
        (result,) = answer.response.partitions
        expected = E.NONE if epoch == member.member_epoch else E.STALE_MEMBER_EPOCH
        assert result.error_code is expected, (result, member, epoch)

    @rule()
    def describes(self) -> None:
        """ConsumerGroupDescribe answers at once with what the clients were told: each live
        client a member at its epoch, with what it was told (and not yet given up) as its
        assignment; an unknown group is GROUP_ID_NOT_FOUND."""
        request_id = self.shell.request_id()
        event = g.ConsumerGroupDescribe(request_id, self.shell.now_ms, (GROUP, "nobody"))
        (answer,) = self.shell.step(event).effects
        assert isinstance(answer, g.Respond) and answer.request_id == request_id
        assert isinstance(answer.response, g.ConsumerGroupDescribeResponse)
        described, unknown = answer.response.groups
        assert unknown.error_code is E.GROUP_ID_NOT_FOUND and not unknown.members
        group = self.group()
        if group is None:
            assert described.error_code is E.GROUP_ID_NOT_FOUND
            return
        assert described.error_code is E.NONE
        assert (described.group_epoch, described.assignment_epoch) == (
            group.group_epoch,
            group.assignment_epoch,
        )
        assert described.group_state == group.state.value
        members = {m.member_id: m for m in described.members}
        assert set(members) == set(group.members)
        for name, client in self.clients.items():
            if self.live(name) is None:
                continue
            member = members[client.member_id]
            assert member.member_epoch == client.epoch, (member, client)
            assert member.assignment <= client.told | client.owned, (member, client)

    @precondition(lambda self: any(c.epoch >= 0 for c in self.clients.values()))
    @rule()
    def settles(self) -> None:
        """Every client in the group heartbeats and reconciles, rounds on end, time standing
        still: the group becomes Stable and every subscribed partition is owned, once."""
        for _ in range(SETTLE_ROUNDS):
            for name in sorted(self.clients):
                client, group = self.clients[name], self.group()
                if client.epoch >= 0:
                    self.apply(name, self.heartbeat(name, client.epoch))
                    client.owned = client.told
                elif (
                    group is not None
                    and client.member_id in group.members
                    and group.members[client.member_id].member_epoch >= 0
                ):
                    # Fenced by its epoch, it rejoins (keeping what the group gave it).
                    self.apply(name, self.heartbeat(name, 0, names=client.subscription))
        group = self.group()
        if group is None or not group.members:
            assert all(c.epoch < 0 for c in self.clients.values())
            return
        live = {n: m for n in self.clients if (m := self.live(n)) is not None}
        if any(m.member_epoch < 0 for m in group.members.values()):
            return  # a static member away for a while keeps its partitions from the others
        assert group.state is g.ConsumerGroupState.STABLE, group
        subscribed = {t for n in live for t in self.clients[n].subscription}
        every = {(t, p) for t in subscribed for p in range(self.topics[t])}
        owners: dict[tuple[str, int], str] = {}
        for name in live:
            client = self.clients[name]
            assert client.owned == live[name].assigned, (name, client, live[name])
            for tp in client.owned:
                assert tp[0] in client.subscription
                assert tp not in owners, (tp, owners[tp], name)
                owners[tp] = name
        assert set(owners) == every, (sorted(owners), sorted(every))
        event(f"settled: {len(live)} members, {len(every)} partitions")

    # --------------------------------------------------------------------------- invariants

    @invariant()
    def live_clients_own_disjoint_partitions_the_coordinator_counts(self) -> None:
        seen: dict[tuple[str, int], str] = {}
        for name, client in self.clients.items():
            member = self.live(name)
            if member is None:
                continue
            assert client.owned <= member.owned, (name, client.owned, member)
            for tp in client.owned:
                assert tp not in seen, f"{tp} owned by {seen[tp]} and {name}"
                seen[tp] = name


TestConsumerGroupMachine = ConsumerGroupMachine.TestCase
TestConsumerGroupMachine.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None
)
