"""Typical classic consumer group flows, step by step, against the Group coordinator machine."""

from __future__ import annotations

import itertools

from automq_ref.errors import KafkaErrorCode as E
from automq_ref.state_machines import group as g
from automq_ref.state_machines.group import (
    CoordinatorState,
    GroupParams,
    GroupState,
    JoinGroupResponse,
    Protocol,
    SyncGroupResponse,
)

PARAMS = GroupParams(
    group_min_session_timeout_ms=100,
    group_max_session_timeout_ms=100_000,
    group_initial_rebalance_delay_ms=0,
    member_id_token="t",
)
RANGE = (Protocol("range", b"sub-a"),)


class Coordinator:
    """Plays the shell: numbers requests, keeps answers by request id, persists on demand."""

    def __init__(self, params: GroupParams = PARAMS, state: CoordinatorState | None = None):
        self.params = params
        self.state = state if state is not None else CoordinatorState()
        self.now_ms = 0
        self.request_ids = itertools.count(1)
        self.answers: dict[int, g.Response] = {}
        self.writes: list[g.DurableRecord] = []
        self.refusals: list[g.Rejected[E]] = []

    def apply(self, event: g.GroupEvent) -> None:
        before = self.state
        transition = g.step(self.state, event, self.params)
        self.state = transition.state
        g.check_invariants(self.state)
        for check in g.TRANSITION_INVARIANTS:
            check(before, self.state)
        for effect in transition.effects:
            match effect:
                case g.Respond():
                    assert effect.request_id not in self.answers, "answered twice"
                    self.answers[effect.request_id] = effect.response
                case g.PersistOffsets() | g.PersistGroupDeletion() | g.PersistOffsetDeletion():
                    self.writes.append(effect)
                case g.Rejected():
                    assert transition.state == before, "a refusal changed the state"
                    self.refusals.append(effect)

    def request(self, make: object, **fields: object) -> int:
        request_id = next(self.request_ids)
        assert callable(make)
        self.apply(make(request_id=request_id, now_ms=self.now_ms, **fields))
        return request_id

    def tick(self, elapsed_ms: int = 0) -> None:
        self.now_ms += elapsed_ms
        self.apply(g.Tick(self.now_ms))

    def join(
        self,
        member_id: str = "",
        *,
        group_id: str = "g",
        instance: str | None = None,
        client: str = "c",
        protocols: tuple[Protocol, ...] = RANGE,
        session_ms: int = 1_000,
        rebalance_ms: int = 5_000,
    ) -> int:
        return self.request(
            g.JoinGroup,
            group_id=group_id,
            member_id=member_id,
            group_instance_id=instance,
            client_id=client,
            client_host="/127.0.0.1",
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            protocol_type="consumer",
            protocols=protocols,
        )

    def join_response(self, request_id: int) -> JoinGroupResponse:
        response = self.answers[request_id]
        assert isinstance(response, JoinGroupResponse)
        return response

    def sync_response(self, request_id: int) -> SyncGroupResponse:
        response = self.answers[request_id]
        assert isinstance(response, SyncGroupResponse)
        return response

    def new_member(self, client: str = "c", group_id: str = "g") -> str:
        """JoinGroup v4+: the first join only hands out a member id."""
        rid = self.join(client=client, group_id=group_id)
        response = self.join_response(rid)
        assert response.error_code is E.MEMBER_ID_REQUIRED
        return response.member_id

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        group_id: str = "g",
        instance: str | None = None,
    ) -> int:
        return self.request(
            g.SyncGroup,
            group_id=group_id,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=instance,
            assignments=tuple(g.MemberAssignment(m, a) for m, a in (assignments or {}).items()),
        )

    def heartbeat(self, member_id: str, generation: int, group_id: str = "g") -> E:
        rid = self.request(
            g.Heartbeat, group_id=group_id, generation_id=generation, member_id=member_id
        )
        response = self.answers[rid]
        assert isinstance(response, g.HeartbeatResponse)
        return response.error_code

    def group(self, group_id: str = "g") -> g.Group:
        return self.state.groups[group_id]


def form_group(c: Coordinator, count: int) -> tuple[list[str], int]:
    """``count`` members join, the first leads and assigns; returns (member ids, generation)."""
    ids = [c.new_member(client=f"c{i}") for i in range(count)]
    joins = [c.join(member_id, client=f"c{i}") for i, member_id in enumerate(ids)]
    assert not any(rid in c.answers for rid in joins)  # waiting for the initial delay
    c.tick()
    responses = [c.join_response(rid) for rid in joins]
    generation = responses[0].generation_id
    assert {r.error_code for r in responses} == {E.NONE}
    assert {r.generation_id for r in responses} == {generation}
    leader = responses[0].leader
    syncs = [c.sync(m, generation) for m in ids if m != leader]
    assignments = {m: f"part-{m}".encode() for m in ids}
    syncs.append(c.sync(leader, generation, assignments))
    for rid, member_id in zip(syncs, [m for m in ids if m != leader] + [leader], strict=True):
        assert c.sync_response(rid).assignment == assignments[member_id]
    assert c.group().state is GroupState.STABLE
    return ids, generation


def test_two_members_join_sync_and_heartbeat() -> None:
    c = Coordinator()
    a = c.new_member(client="a")
    b = c.new_member(client="b")
    assert a != b and a.startswith("a-t-")
    join_a, join_b = c.join(a, client="a"), c.join(b, client="b")
    assert c.group().state is GroupState.PREPARING_REBALANCE
    c.tick()
    ra, rb = c.join_response(join_a), c.join_response(join_b)
    assert (ra.generation_id, rb.generation_id) == (1, 1)
    assert ra.leader == rb.leader == a
    assert [m.member_id for m in ra.members] == [a, b]  # the leader sees everyone's metadata
    assert ra.members[1].metadata == b"sub-a"
    assert rb.members == ()
    assert ra.protocol_name == "range" and ra.protocol_type == "consumer"
    assert c.group().state is GroupState.COMPLETING_REBALANCE
    assert c.heartbeat(b, 1) is E.NONE
    sync_b = c.sync(b, 1)
    assert sync_b not in c.answers  # the follower waits for the leader
    sync_a = c.sync(a, 1, {a: b"p0", b: b"p1"})
    assert c.sync_response(sync_a).assignment == b"p0"
    assert c.sync_response(sync_b).assignment == b"p1"
    assert c.group().state is GroupState.STABLE
    assert c.heartbeat(a, 1) is E.NONE
    assert c.heartbeat(a, 0) is E.ILLEGAL_GENERATION
    assert c.heartbeat("nobody", 1) is E.UNKNOWN_MEMBER_ID


def test_third_member_triggers_a_rebalance() -> None:
    c = Coordinator()
    (a, b), generation = form_group(c, 2)
    new = c.new_member(client="c2")
    join_new = c.join(new, client="c2")
    assert c.group().state is GroupState.PREPARING_REBALANCE
    assert c.heartbeat(a, generation) is E.REBALANCE_IN_PROGRESS
    join_a = c.join(a, client="c0")
    assert join_new not in c.answers
    join_b = c.join(b, client="c1")  # the last one in completes the join at once
    responses = [c.join_response(rid) for rid in (join_new, join_a, join_b)]
    assert {r.generation_id for r in responses} == {generation + 1}
    assert responses[1].leader == a  # the leader stays the leader
    assert len(responses[1].members) == 3


def test_rebalance_timeout_removes_members_that_did_not_rejoin() -> None:
    c = Coordinator()
    (a, b), generation = form_group(c, 2)
    join_a = c.join(a, client="c0", protocols=(Protocol("range", b"new-sub"),))
    assert c.group().state is GroupState.PREPARING_REBALANCE
    for _ in range(5):  # b stays alive but never rejoins
        c.tick(999)
        assert c.heartbeat(b, generation) is E.REBALANCE_IN_PROGRESS
    assert join_a not in c.answers
    c.tick(5)
    response = c.join_response(join_a)
    assert response.generation_id == generation + 1
    assert [m.member_id for m in response.members] == [a]
    assert list(c.group().members) == [a]
    assert c.heartbeat(b, generation) is E.UNKNOWN_MEMBER_ID


def test_leave_and_session_expiry() -> None:
    c = Coordinator()
    (a, b, _d), generation = form_group(c, 3)
    leave = c.request(g.LeaveGroup, group_id="g", members=(g.LeavingMember(b),))
    response = c.answers[leave]
    assert isinstance(response, g.LeaveGroupResponse)
    assert response.members[0].error_code is E.NONE
    assert c.group().state is GroupState.PREPARING_REBALANCE
    join_a = c.join(a, client="c0")
    # d never rejoins and stops heartbeating: its session (1 s) runs out before the rebalance
    # timeout (5 s), which lets the join complete early.
    c.tick(999)
    assert join_a not in c.answers
    c.tick(1)
    assert c.join_response(join_a).generation_id == generation + 1
    assert list(c.group().members) == [a]
    c.tick(2_000)  # a's session expires too: the group empties, and is forgotten
    assert "g" not in c.state.groups


def test_member_waiting_on_a_request_is_not_expired() -> None:
    c = Coordinator()
    (a, _b), generation = form_group(c, 2)
    join_a = c.join(a, client="c0")
    c.tick(2_000)  # b's session is over; a waits on its JoinGroup
    assert c.join_response(join_a).generation_id == generation + 1
    assert list(c.group().members) == [a]


def test_inconsistent_protocol_and_invalid_requests() -> None:
    c = Coordinator()
    form_group(c, 1)
    rid = c.join(client="x", protocols=(Protocol("roundrobin", b""),))
    assert c.join_response(rid).error_code is E.INCONSISTENT_GROUP_PROTOCOL
    rid = c.join(group_id="")
    assert c.join_response(rid).error_code is E.INVALID_GROUP_ID
    rid = c.join(session_ms=1)
    assert c.join_response(rid).error_code is E.INVALID_SESSION_TIMEOUT
    rid = c.join("stale", group_id="other")
    assert c.join_response(rid).error_code is E.UNKNOWN_MEMBER_ID


def test_protocol_selection_by_votes() -> None:
    c = Coordinator()
    rr, rng = Protocol("roundrobin", b"r"), Protocol("range", b"g")
    ids = [c.new_member(client=f"c{i}") for i in range(3)]
    prefs = [(rr, rng), (rng, rr), (rng, rr)]
    joins = [
        c.join(m, client=f"c{i}", protocols=p)
        for i, (m, p) in enumerate(zip(ids, prefs, strict=True))
    ]
    c.tick()
    response = c.join_response(joins[0])
    assert response.protocol_name == "range"
    assert [m.metadata for m in response.members] == [b"g", b"g", b"g"]


def test_sync_errors() -> None:
    c = Coordinator()
    (a, b), generation = form_group(c, 2)
    assert c.sync_response(c.sync(a, generation + 5)).error_code is E.ILLEGAL_GENERATION
    assert c.sync_response(c.sync("x", generation)).error_code is E.UNKNOWN_MEMBER_ID
    c.join(a, client="c0", protocols=(Protocol("range", b"other"),))
    assert c.sync_response(c.sync(b, generation)).error_code is E.REBALANCE_IN_PROGRESS


def test_rebalance_during_completing_answers_waiting_syncs() -> None:
    c = Coordinator()
    ids = [c.new_member(client=f"c{i}") for i in range(2)]
    joins = [c.join(m, client=f"c{i}") for i, m in enumerate(ids)]
    c.tick()
    follower = ids[1]
    sync_follower = c.sync(follower, 1)
    late = c.new_member(client="late")
    c.join(late, client="late")
    assert c.sync_response(sync_follower).error_code is E.REBALANCE_IN_PROGRESS
    assert c.group().state is GroupState.PREPARING_REBALANCE
    assert all(c.join_response(rid).generation_id == 1 for rid in joins)


def test_member_that_never_syncs_is_removed() -> None:
    c = Coordinator()
    ids = [c.new_member(client=f"c{i}") for i in range(2)]
    for i, m in enumerate(ids):
        c.join(m, client=f"c{i}")
    c.tick()
    leader, follower = ids
    c.sync(leader, 1, {leader: b"x", follower: b"y"})
    assert c.group().state is GroupState.STABLE
    for _ in range(6):
        c.tick(900)
        c.heartbeat(leader, 1)  # the follower heartbeats neither
    assert follower not in c.group().members


def test_static_member_replacement_fences_the_old_one() -> None:
    c = Coordinator()
    j1 = c.join(instance="i1", client="a")
    j2 = c.join(instance="i2", client="b")
    c.tick()
    m1, m2 = c.join_response(j1).member_id, c.join_response(j2).member_id
    assert m1.startswith("i1-t-")
    c.sync(m2, 1, instance="i2")
    c.sync(m1, 1, {m1: b"A", m2: b"B"}, instance="i1")
    assert c.group().state is GroupState.STABLE
    # i2 restarts with an empty member id: no rebalance, same generation, same assignment.
    j3 = c.join(instance="i2", client="b")
    r3 = c.join_response(j3)
    assert r3.error_code is E.NONE and r3.generation_id == 1 and r3.leader == m1
    m3 = r3.member_id
    assert c.group().state is GroupState.STABLE
    assert c.sync_response(c.sync(m3, 1, instance="i2")).assignment == b"B"
    old = c.request(
        g.Heartbeat, group_id="g", generation_id=1, member_id=m2, group_instance_id="i2"
    )
    assert c.answers[old] == g.HeartbeatResponse(E.FENCED_INSTANCE_ID)
    # The leader instance restarts: it is told the old leader id, so it does not reassign.
    j4 = c.join(instance="i1", client="a")
    r4 = c.join_response(j4)
    assert r4.leader == m1 and r4.member_id != m1 and r4.members == ()
    assert c.group().leader_id == r4.member_id


def test_static_member_replaced_while_rebalancing() -> None:
    c = Coordinator()
    j1 = c.join(instance="i1", client="a")
    j_again = c.join(instance="i1", client="a")  # a second incarnation before the join ends
    assert c.join_response(j1).error_code is E.FENCED_INSTANCE_ID
    c.tick()
    assert c.join_response(j_again).generation_id == 1


def test_leave_by_instance_id_and_unknown_group() -> None:
    c = Coordinator()
    j1 = c.join(instance="i1", client="a")
    c.tick()
    leave = c.request(g.LeaveGroup, group_id="g", members=(g.LeavingMember("", "i1"),))
    response = c.answers[leave]
    assert isinstance(response, g.LeaveGroupResponse)
    assert response.members[0].error_code is E.NONE
    assert c.join_response(j1).generation_id == 1
    assert c.group().state is GroupState.EMPTY
    leave = c.request(g.LeaveGroup, group_id="nope", members=(g.LeavingMember("m"),))
    assert c.answers[leave] == g.LeaveGroupResponse(
        E.NONE, (g.LeaveGroupMemberResult("m", None, E.UNKNOWN_MEMBER_ID),)
    )


def test_pending_member_expires_and_holds_up_the_rebalance() -> None:
    c = Coordinator()
    (a,), generation = form_group(c, 1)
    pending = c.new_member(client="slow")
    assert pending in c.group().pending_members
    join_a = c.join(a, client="c0", protocols=(Protocol("range", b"x"),))
    assert join_a not in c.answers  # the pending member may still come
    c.tick(1_000)  # its session timeout
    assert c.join_response(join_a).generation_id == generation + 1
    rid = c.join(pending, client="slow")
    assert c.join_response(rid).error_code is E.UNKNOWN_MEMBER_ID


def test_initial_rebalance_delay_is_extended_by_new_members() -> None:
    c = Coordinator(
        GroupParams(group_min_session_timeout_ms=100, group_initial_rebalance_delay_ms=3_000)
    )
    a = c.new_member(client="a")
    join_a = c.join(a, client="a", rebalance_ms=10_000)
    c.tick(2_000)
    b = c.new_member(client="b")
    join_b = c.join(b, client="b", rebalance_ms=10_000)
    c.tick(1_000)  # the first delay is over, but b came in it: one more delay
    assert join_a not in c.answers
    c.tick(3_000)
    assert c.join_response(join_a).generation_id == 1
    assert c.join_response(join_b).generation_id == 1


def test_offsets_commit_fetch_and_visibility_after_persistence() -> None:
    c = Coordinator()
    (a, _b), generation = form_group(c, 2)
    commit = c.request(
        g.OffsetCommit,
        group_id="g",
        generation_id=generation,
        member_id=a,
        group_instance_id=None,
        offsets=(g.OffsetCommitEntry("t", 0, 42, 3, "meta"), g.OffsetCommitEntry("t", 1, 7)),
    )
    assert commit not in c.answers
    (write,) = c.writes
    assert isinstance(write, g.PersistOffsets)
    fetch = c.request(g.OffsetFetch, groups=(g.OffsetFetchGroup("g", (("t", 0),)),))
    before = c.answers[fetch]
    assert isinstance(before, g.OffsetFetchResponse)
    assert before.groups[0].partitions[0].offset == g.NO_OFFSET  # not durable yet
    c.apply(g.OffsetsPersisted(commit))
    result = c.answers[commit]
    assert isinstance(result, g.OffsetCommitResponse)
    assert {p.error_code for p in result.partitions} == {E.NONE}
    fetch = c.request(g.OffsetFetch, groups=(g.OffsetFetchGroup("g", None),))
    after = c.answers[fetch]
    assert isinstance(after, g.OffsetFetchResponse)
    assert [
        (p.topic, p.partition, p.offset, p.leader_epoch, p.metadata)
        for p in after.groups[0].partitions
    ] == [
        ("t", 0, 42, 3, "meta"),
        ("t", 1, 7, -1, ""),
    ]
    stale = c.request(
        g.OffsetCommit,
        group_id="g",
        generation_id=generation - 1,
        member_id=a,
        group_instance_id=None,
        offsets=(g.OffsetCommitEntry("t", 0, 1),),
    )
    stale_result = c.answers[stale]
    assert isinstance(stale_result, g.OffsetCommitResponse)
    assert stale_result.partitions[0].error_code is E.ILLEGAL_GENERATION
    standalone = c.request(
        g.OffsetCommit,
        group_id="g",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=(g.OffsetCommitEntry("t", 0, 1),),
    )
    standalone_result = c.answers[standalone]
    assert isinstance(standalone_result, g.OffsetCommitResponse)
    assert standalone_result.partitions[0].error_code is E.UNKNOWN_MEMBER_ID  # group has members


def test_standalone_consumer_commits_and_recovery() -> None:
    c = Coordinator()

    def commit(offset: int, metadata: str = "") -> int:
        return c.request(
            g.OffsetCommit,
            group_id="solo",
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            offsets=(g.OffsetCommitEntry("t", 0, offset, -1, metadata),),
        )

    first, second = commit(10), commit(20)
    too_large = commit(30, "x" * 5_000)
    result = c.answers[too_large]
    assert isinstance(result, g.OffsetCommitResponse)
    assert result.partitions[0].error_code is E.OFFSET_METADATA_TOO_LARGE
    c.apply(g.OffsetsPersisted(second))  # completions out of order: the later write wins
    c.apply(g.OffsetsPersisted(first))
    assert g.committed_offset(c.state, "solo", ("t", 0)).offset == 20
    assert c.group("solo").state is GroupState.EMPTY
    recovered = g.recover(c.writes)
    assert recovered.offsets["solo"][("t", 0)].offset == 20
    assert recovered.groups["solo"].state is GroupState.EMPTY


def test_failed_persistence_answers_an_error() -> None:
    c = Coordinator()
    rid = c.request(
        g.OffsetCommit,
        group_id="solo",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=(g.OffsetCommitEntry("t", 0, 5),),
    )
    c.apply(g.OffsetsPersistFailed(rid))
    result = c.answers[rid]
    assert isinstance(result, g.OffsetCommitResponse)
    assert result.partitions[0].error_code is E.COORDINATOR_NOT_AVAILABLE
    assert g.committed_offset(c.state, "solo", ("t", 0)).offset == g.NO_OFFSET
    # A completion for a write no longer in flight breaks the shell's contract: refused.
    c.apply(g.OffsetsPersisted(rid))
    assert c.refusals == [g.Rejected(E.INVALID_REQUEST, f"no write in flight for request {rid}")]


def test_require_stable_answers_unsettled_commits_unstable() -> None:
    """OffsetFetch with ``require_stable``: a partition whose commit is in flight, or held for
    a transaction's marker, is UNSTABLE_OFFSET_COMMIT (offset -1); the others, and every
    partition without ``require_stable``, answer the last offset shown."""
    c = Coordinator()
    keys = (("t", 0), ("t", 1), ("u", 0))

    def fetch(require_stable: bool) -> list[tuple[tuple[str, int], int, E]]:
        rid = c.request(
            g.OffsetFetch, groups=(g.OffsetFetchGroup("g", keys),), require_stable=require_stable
        )
        response = c.answers[rid]
        assert isinstance(response, g.OffsetFetchResponse)
        (group,) = response.groups
        assert group.error_code is E.NONE
        return [((p.topic, p.partition), p.offset, p.error_code) for p in group.partitions]

    def commit(key: tuple[str, int], offset: int, producer_id: int | None = None) -> int:
        entry = g.OffsetCommitEntry(key[0], key[1], offset)
        if producer_id is None:
            return c.request(
                g.OffsetCommit,
                group_id="g",
                generation_id=-1,
                member_id="",
                group_instance_id=None,
                offsets=(entry,),
            )
        return c.request(
            g.TxnOffsetCommit,
            group_id="g",
            producer_id=producer_id,
            producer_epoch=0,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            offsets=(entry,),
        )

    c.apply(g.OffsetsPersisted(commit(("t", 0), 5)))
    c.apply(g.OffsetsPersisted(commit(("t", 1), 6)))
    txn = commit(("t", 0), 10, producer_id=7)  # in flight
    assert fetch(True) == [
        (("t", 0), -1, E.UNSTABLE_OFFSET_COMMIT),
        (("t", 1), 6, E.NONE),
        (("u", 0), -1, E.NONE),
    ]
    c.apply(g.OffsetsPersisted(txn))  # durable, held for producer 7's marker
    assert c.answers[txn] == g.OffsetCommitResponse(
        (g.OffsetCommitPartitionResult("t", 0, E.NONE),)
    )
    plain = commit(("u", 0), 3)  # a plain commit in flight is unsettled too
    assert fetch(True) == [
        (("t", 0), -1, E.UNSTABLE_OFFSET_COMMIT),
        (("t", 1), 6, E.NONE),
        (("u", 0), -1, E.UNSTABLE_OFFSET_COMMIT),
    ]
    assert fetch(False) == [(("t", 0), 5, E.NONE), (("t", 1), 6, E.NONE), (("u", 0), -1, E.NONE)]
    c.apply(g.OffsetsPersisted(plain))
    # A replay of the log holds the transaction's offsets the same way.
    assert g.unstable_offset(g.recover(c.writes), "g", ("t", 0))
    c.apply(g.TxnMarker(7, commit=True))
    assert fetch(True) == [(("t", 0), 10, E.NONE), (("t", 1), 6, E.NONE), (("u", 0), 3, E.NONE)]
    aborted = commit(("t", 1), 99, producer_id=8)
    c.apply(g.OffsetsPersisted(aborted))
    assert fetch(True)[1] == (("t", 1), -1, E.UNSTABLE_OFFSET_COMMIT)
    c.apply(g.TxnMarker(8, commit=False))
    assert fetch(True)[1] == (("t", 1), 6, E.NONE)


def test_reusing_the_request_id_of_a_write_in_flight_is_refused() -> None:
    c = Coordinator()
    rid = next(c.request_ids)
    commit = g.OffsetCommit(rid, c.now_ms, "solo", -1, "", None, (g.OffsetCommitEntry("t", 0, 5),))
    c.apply(commit)
    c.apply(commit)
    message = f"request id {rid} is already waiting for a write"
    assert c.refusals == [g.Rejected(E.INVALID_REQUEST, message)]
    assert len(c.writes) == 1 and rid not in c.answers
    c.apply(g.OffsetsPersisted(rid))
    assert isinstance(c.answers[rid], g.OffsetCommitResponse)


def test_list_describe_and_delete_groups() -> None:
    c = Coordinator()
    (a, b), _ = form_group(c, 2)
    solo = c.request(
        g.OffsetCommit,
        group_id="solo",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=(g.OffsetCommitEntry("t", 0, 5),),
    )
    c.apply(g.OffsetsPersisted(solo))
    listed = c.answers[c.request(g.ListGroups)]
    assert isinstance(listed, g.ListGroupsResponse)
    assert [(x.group_id, x.group_state, x.protocol_type) for x in listed.groups] == [
        ("g", "Stable", "consumer"),
        ("solo", "Empty", ""),
    ]
    only_empty = c.answers[c.request(g.ListGroups, states_filter=("empty",))]
    assert isinstance(only_empty, g.ListGroupsResponse)
    assert [x.group_id for x in only_empty.groups] == ["solo"]
    described = c.answers[c.request(g.DescribeGroups, group_ids=("g", "nope"))]
    assert isinstance(described, g.DescribeGroupsResponse)
    stable, missing = described.groups
    assert (stable.group_state, stable.protocol_data) == ("Stable", "range")
    assert [m.member_assignment for m in stable.members] == [
        f"part-{a}".encode(),
        f"part-{b}".encode(),
    ]
    assert (missing.error_code, missing.group_state) == (E.GROUP_ID_NOT_FOUND, "Dead")
    delete = c.request(g.DeleteGroups, group_ids=("g", "solo", "nope"))
    assert delete not in c.answers  # waits for the tombstone
    assert "solo" not in c.state.groups and "solo" not in c.state.offsets
    assert isinstance(c.writes[-1], g.PersistGroupDeletion)
    c.apply(g.OffsetsPersisted(delete))
    assert c.answers[delete] == g.DeleteGroupsResponse(
        (
            g.DeletedGroupResult("g", E.NON_EMPTY_GROUP),
            g.DeletedGroupResult("solo", E.NONE),
            g.DeletedGroupResult("nope", E.GROUP_ID_NOT_FOUND),
        )
    )
    assert "solo" not in g.recover(c.writes).offsets


def test_commit_in_flight_when_its_group_is_deleted() -> None:
    c = Coordinator()
    rid = c.request(
        g.OffsetCommit,
        group_id="solo",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=(g.OffsetCommitEntry("t", 0, 5),),
    )
    delete = c.request(g.DeleteGroups, group_ids=("solo",))
    c.apply(g.OffsetsPersisted(delete))
    c.apply(g.OffsetsPersisted(rid))
    assert c.state.offsets.get("solo") is None
    assert g.recover(c.writes).offsets == {}


def test_transactional_offsets_of_a_deleted_group_are_dropped() -> None:
    """A group deleted while a transaction holds offsets of it (durable, or still in flight):
    the transaction's COMMIT shows nothing of it, in memory as in a replay of the log (Kafka 4:
    an offset's tombstone removes the pending transactional offsets of its key)."""
    c = Coordinator()

    def txn_commit(producer_id: int, key: tuple[str, int]) -> int:
        return c.request(
            g.TxnOffsetCommit,
            group_id="g",
            producer_id=producer_id,
            producer_epoch=0,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            offsets=(g.OffsetCommitEntry(key[0], key[1], 5),),
        )

    held = txn_commit(1, ("t", 0))
    c.apply(g.OffsetsPersisted(held))
    c.tick(60_000)  # a group whose only offsets are held is kept, as Kafka's hasOffsets
    assert c.group("g").state is GroupState.EMPTY
    assert g.recover(c.writes).groups.keys() == {"g"}
    in_flight = txn_commit(2, ("t", 1))
    delete = c.request(g.DeleteGroups, group_ids=("g",))
    assert c.answers.get(delete) is None  # answered once the tombstones are durable
    assert not g.unstable_offset(c.state, "g", ("t", 0))
    c.apply(g.OffsetsPersisted(in_flight))
    c.apply(g.OffsetsPersisted(delete))
    log: list[g.DurableRecord | g.TxnMarker] = [*c.writes]
    for producer_id in (1, 2):
        c.apply(g.TxnMarker(producer_id, commit=True))
        log.append(g.TxnMarker(producer_id, commit=True))
    assert c.state.offsets.get("g") is None
    assert g.recover(log).offsets == {}
    deleted = c.answers[delete]
    assert isinstance(deleted, g.DeleteGroupsResponse)
    assert deleted.results == (g.DeletedGroupResult("g", E.NONE),)


def test_next_deadline_and_forgetting_empty_groups() -> None:
    c = Coordinator()
    assert g.next_deadline_ms(c.state) is None
    form_group(c, 1)
    assert g.next_deadline_ms(c.state) == 1_000  # the member's session
    commit = c.request(
        g.OffsetCommit,
        group_id="g",
        generation_id=1,
        member_id=c.group().leader_id,
        group_instance_id=None,
        offsets=(g.OffsetCommitEntry("t", 0, 5),),
    )
    c.tick(1_000)
    assert c.group().state is GroupState.EMPTY  # kept: a commit is in flight
    assert c.group().generation_id == 2
    c.apply(g.OffsetsPersisted(commit))
    c.tick()
    assert c.group().state is GroupState.EMPTY  # kept: it has offsets
    assert g.next_deadline_ms(c.state) is None


def test_leader_that_does_not_rejoin_is_replaced_by_one_that_did() -> None:
    c = Coordinator()
    j1 = c.join(instance="i1", client="a")
    j2 = c.join(instance="i2", client="b")
    c.tick()
    m1, m2 = c.join_response(j1).member_id, c.join_response(j2).member_id
    assert c.group().leader_id == m1
    c.sync(m1, 1, {m1: b"A", m2: b"B"}, instance="i1")
    # i2 changes its subscription; the static leader i1 is offline and does not rejoin.
    rejoin = c.join(m2, instance="i2", client="b", protocols=(Protocol("range", b"new"),))
    for _ in range(5):  # i1 is alive (it heartbeats: REBALANCE_IN_PROGRESS) but never rejoins
        c.tick(900)
        assert c.heartbeat(m1, 1) is E.REBALANCE_IN_PROGRESS
    c.tick(500)  # the rebalance timeout: static i1 stays a member, i2 becomes the leader
    response = c.join_response(rejoin)
    assert response.generation_id == 2 and response.leader == m2
    assert [m.member_id for m in response.members] == [m1, m2]
    assert c.group().leader_id == m2


def test_member_left_out_by_the_leader_gets_an_empty_assignment() -> None:
    c = Coordinator()
    (a, b), generation = form_group(c, 2)
    joins = [c.join(a, client="c0", protocols=(Protocol("range", b"x"),)), c.join(b, client="c1")]
    assert all(c.join_response(rid).generation_id == generation + 1 for rid in joins)
    sync_b = c.sync(b, generation + 1)
    c.sync(a, generation + 1, {a: b"all"})
    assert c.sync_response(sync_b) == SyncGroupResponse(E.NONE, "consumer", "range", b"")


def test_a_late_stamped_request_happens_now() -> None:
    c = Coordinator()
    (a,), generation = form_group(c, 1)
    c.tick(500)
    c.apply(
        g.Heartbeat(request_id=500, now_ms=0, group_id="g", generation_id=generation, member_id=a)
    )
    assert c.group().members[a].session_deadline_ms == 1_500
