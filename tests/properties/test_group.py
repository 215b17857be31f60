"""GroupMachine: clients and an administrator drive the classic group coordinator at random.

The test plays the shell and the clients. Clients follow the protocol loosely: they join with
the member id they were given, with none, or with a stale one; sync with the generation they
were told (the leader with an assignment for the members it was shown); heartbeat, leave and
commit; some are static members sharing an instance id (two incarnations of one process).
Durable writes complete in any order, some fail. After every step the machine's invariants
hold, plus a reference behaviour:

* every answer goes to a request that is still unanswered, and the requests the coordinator
  still owes are exactly the ones unanswered;
* when a join completes, every member that was waiting got a JoinGroup answer of the new
  generation naming the group's leader, the leader's answer lists every member, and the leader
  is a member that rejoined;
* a SyncGroup answered NONE carries the member's assignment, which is the leader's (empty for a
  member the leader left out); a SyncGroup or Heartbeat answered NONE named the current
  generation;
* after a Tick no timer is overdue, and no member waiting on a JoinGroup or SyncGroup expired;
* committed offsets read back (OffsetFetch) as the replay of the durable writes in log order,
  and ``recover`` of those writes gives the coordinator's offsets;
* at the end, with writes completed and time passing, every request has been answered and
  every group is Empty.

Well-behaved clients (``client_acts``, ``clients_act``, the live clients of ``tick``) keep
rebalances running to Stable, which random requests alone rarely reach.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from automq_ref.errors import KafkaErrorCode as E
from automq_ref.state_machines import group as g
from automq_ref.state_machines.group import (
    CoordinatorState,
    GroupParams,
    GroupState,
    Protocol,
)

PARAMS = GroupParams(
    group_min_session_timeout_ms=10,
    group_max_session_timeout_ms=10_000,
    group_initial_rebalance_delay_ms=30,
    new_member_join_timeout_ms=500,
    offset_metadata_max_bytes=8,
    member_id_token="t",
)
GROUPS = ("g1", "g2")
COMMIT_GROUPS = (*GROUPS, "solo")  # "solo": only standalone consumers commit there
# Two dynamic clients, and three static ones of which two are incarnations of instance "i0".
CLIENTS = {"c0": None, "c1": None, "s0": "i0", "s0b": "i0", "s1": "i1"}
WELL_BEHAVED = ("c0", "c1", "s0", "s1")  # s0b only turns up through the random rules
RANGE, ROUNDROBIN = Protocol("range", b"R"), Protocol("roundrobin", b"O")
PROTOCOLS = (
    (RANGE,),
    (RANGE, ROUNDROBIN),
    (ROUNDROBIN, RANGE),
    (ROUNDROBIN,),
    (Protocol("range", b"R2"),),
)
PARTITIONS = (("t", 0), ("t", 1), ("u", 0))
PRODUCERS = (1, 2)  # transactional producers' ids (TxnOffsetCommit)


@dataclass
class ClientView:
    """What a client knows of its membership in one group."""

    member_id: str = ""
    generation_id: int = -1
    leader: bool = False
    members: tuple[str, ...] = ()
    protocol_name: str | None = None
    synced: bool = False


@dataclass
class Outstanding:
    kind: str
    client: str | None
    group_id: str | None
    member_id: str = ""
    generation_id: int = -1


@dataclass
class Write:
    record: g.DurableRecord | g.TxnMarker  # a marker is in the log once stepped
    status: str = "in flight"  # "persisted", "failed"
    emptied: bool = False  # its group was deleted while it was in flight: it applies nothing
    # Its keys an OffsetDelete deleted while it was in flight: those apply nothing.
    dropped: frozenset[tuple[str, int]] = frozenset()

    @property
    def request_id(self) -> int:
        assert not isinstance(self.record, g.TxnMarker)
        return self.record.request_id


def response_error(response: g.Response) -> E | None:
    error = getattr(response, "error_code", None)
    assert error is None or isinstance(error, E)
    return error


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = CoordinatorState()
        self.now_ms = 0
        self.request_ids = itertools.count(1)
        self.views = {(c, grp): ClientView() for c in CLIENTS for grp in GROUPS}
        self.outstanding: dict[int, Outstanding] = {}
        self.writes: list[Write] = []
        self.issued_ids: list[str] = []

    # ------------------------------------------------------------------------------ plumbing

    def apply(self, event: g.GroupEvent, outstanding: Outstanding | None = None) -> None:
        request_id = getattr(event, "request_id", None)
        if outstanding is not None:
            assert isinstance(request_id, int)
            self.outstanding[request_id] = outstanding
        before = self.state
        transition = g.step(before, event, PARAMS)
        self.state = transition.state
        for check in g.TRANSITION_INVARIANTS:
            check(before, self.state)
        answers: dict[int, g.Response] = {}
        for effect in transition.effects:
            match effect:
                case g.Respond():
                    assert effect.request_id in self.outstanding, f"{effect} answers nothing"
                    assert effect.request_id not in answers, "answered twice in one step"
                    answers[effect.request_id] = effect.response
                case g.PersistOffsets() | g.PersistGroupDeletion() | g.PersistOffsetDeletion():
                    if isinstance(effect, g.PersistOffsetDeletion):
                        for write in self._in_flight():
                            if (
                                isinstance(write.record, g.PersistOffsets)
                                and write.record.group_id == effect.group_id
                            ):
                                write.dropped |= frozenset(effect.partitions)
                    if isinstance(effect, g.PersistGroupDeletion):
                        for write in self._in_flight():
                            if (
                                isinstance(write.record, g.PersistOffsets)
                                and write.record.group_id in effect.group_ids
                            ):
                                write.emptied = True
                    self.writes.append(Write(effect))
                case g.Rejected():
                    raise AssertionError(f"the clients kept the contract, yet {event}: {effect}")
        self._check_join_completions(before, answers)
        self._check_assignments(before, event, answers)
        self._check_generations(answers)
        if isinstance(event, g.Tick):
            self._check_timers(before)
        for request_id, response in answers.items():
            self._client_learns(self.outstanding.pop(request_id), response)
        assert sorted(g.waiting_requests(self.state)) == sorted(self.outstanding)

    def _check_join_completions(
        self, before: CoordinatorState, answers: dict[int, g.Response]
    ) -> None:
        for group_id, group in self.state.groups.items():
            old = before.groups.get(group_id)
            if old is None or group.generation_id == old.generation_id:
                continue
            if group.state is GroupState.EMPTY:
                continue
            assert group.state is GroupState.COMPLETING_REBALANCE
            for member_id in group.members:
                waited = old.members[member_id].awaiting_join if member_id in old.members else None
                if waited is None:
                    continue
                response = answers[waited]
                assert isinstance(response, g.JoinGroupResponse)
                assert response.error_code is E.NONE
                assert response.generation_id == group.generation_id
                assert response.member_id == member_id
                assert response.leader == group.leader_id
                assert response.protocol_name == group.protocol_name
                if member_id == group.leader_id:
                    assert [m.member_id for m in response.members] == list(group.members)
                else:
                    assert response.members == ()
            # The leader is a member that rejoined: it was just told it leads.
            assert any(
                isinstance(r, g.JoinGroupResponse)
                and r.error_code is E.NONE
                and r.member_id == group.leader_id
                and r.generation_id == group.generation_id
                for r in answers.values()
            )

    def _check_assignments(
        self, before: CoordinatorState, event: g.GroupEvent, answers: dict[int, g.Response]
    ) -> None:
        for request_id, response in answers.items():
            outstanding = self.outstanding[request_id]
            if not isinstance(response, g.SyncGroupResponse) or response.error_code is not E.NONE:
                continue
            assert outstanding.group_id is not None
            group = self.state.groups[outstanding.group_id]
            assert group.state is GroupState.STABLE
            assert response.assignment == group.members[outstanding.member_id].assignment
            assert response.protocol_name == group.protocol_name
        if isinstance(event, g.SyncGroup):
            old = before.groups.get(event.group_id)
            new = self.state.groups.get(event.group_id)
            if (
                old is not None
                and new is not None
                and old.state is GroupState.COMPLETING_REBALANCE
                and new.state is GroupState.STABLE
            ):
                leader_map = {a.member_id: a.assignment for a in event.assignments}
                for member_id, member in new.members.items():
                    assert member.assignment == leader_map.get(member_id, b"")

    def _check_generations(self, answers: dict[int, g.Response]) -> None:
        """A SyncGroup or Heartbeat is only answered NONE if it named the current generation."""
        for request_id, response in answers.items():
            outstanding = self.outstanding[request_id]
            if outstanding.kind not in ("sync", "heartbeat") or response_error(response) != E.NONE:
                continue
            assert outstanding.group_id is not None
            group = self.state.groups[outstanding.group_id]
            assert outstanding.generation_id == group.generation_id

    def _check_timers(self, before: CoordinatorState) -> None:
        """After a Tick no timer is overdue, and no member waiting on a JoinGroup (unless new)
        or a SyncGroup was expired: its request is its proof of life."""
        deadline = g.next_deadline_ms(self.state)
        assert deadline is None or deadline > self.now_ms, (deadline, self.now_ms)
        for group_id, old in before.groups.items():
            for member_id, member in old.members.items():
                waiting = (member.awaiting_join is not None and not member.is_new) or (
                    member.awaiting_sync is not None
                )
                if waiting:
                    group = self.state.groups.get(group_id)
                    assert group is not None and member_id in group.members, member_id

    def _client_learns(self, outstanding: Outstanding, response: g.Response) -> None:
        if outstanding.client is None or outstanding.group_id is None:
            return
        view = self.views[(outstanding.client, outstanding.group_id)]
        error = getattr(response, "error_code", None)
        if isinstance(response, g.JoinGroupResponse):
            if error is E.NONE:
                view.member_id = response.member_id
                view.generation_id = response.generation_id
                view.leader = response.leader == response.member_id
                view.members = tuple(m.member_id for m in response.members)
                view.protocol_name = response.protocol_name
                view.synced = False
            elif error is E.MEMBER_ID_REQUIRED:
                view.member_id = response.member_id
                view.generation_id = -1
        if isinstance(response, g.SyncGroupResponse):
            view.synced = error is E.NONE
            if error is E.REBALANCE_IN_PROGRESS:
                view.generation_id = -1  # rejoin
        if isinstance(response, g.HeartbeatResponse) and error in (
            E.REBALANCE_IN_PROGRESS,
            E.ILLEGAL_GENERATION,
        ):
            view.generation_id = -1
        if error in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
            self.views[(outstanding.client, outstanding.group_id)] = ClientView()
        if isinstance(response, g.JoinGroupResponse) and response.member_id:
            self.issued_ids.append(response.member_id)

    def next_request_id(self) -> int:
        return next(self.request_ids)

    def _waiting(self, client: str, group_id: str) -> bool:
        return any(o.client == client and o.group_id == group_id for o in self.outstanding.values())

    # --------------------------------------------------------------------------------- rules

    @rule(
        client=st.sampled_from(sorted(CLIENTS)),
        group_id=st.sampled_from(GROUPS),
        drop_one=st.booleans(),
    )
    def client_acts(self, client: str, group_id: str, drop_one: bool = False) -> None:
        """A well-behaved client's next request: join until it has a generation, then sync
        once, then heartbeat; nothing while a request of it is unanswered."""
        if self._waiting(client, group_id):
            return
        view = self.views[(client, group_id)]
        if view.generation_id < 0:
            self.join_group(
                client, group_id, "own", (RANGE, ROUNDROBIN), "consumer", 2_000, 300, True, None
            )
        elif not view.synced:
            self.sync_group(client, group_id, 0, drop_one, False)
        else:
            self.heartbeat(client, group_id)

    @rule(
        group_id=st.sampled_from(GROUPS),
        clients=st.lists(st.sampled_from(WELL_BEHAVED), min_size=1, max_size=4, unique=True),
        drop_one=st.booleans(),
    )
    def clients_act(self, group_id: str, clients: list[str], drop_one: bool) -> None:
        """Several well-behaved clients act on one group, so rebalances run to the end."""
        for client in clients:
            self.client_acts(client, group_id, drop_one)

    @rule(
        client=st.sampled_from(sorted(CLIENTS)),
        group_id=st.sampled_from(GROUPS),
        member_choice=st.sampled_from(["own", "own", "own", "empty", "stale"]),
        protocols=st.sampled_from(PROTOCOLS),
        protocol_type=st.sampled_from(["consumer", "consumer", "consumer", "connect"]),
        session_timeout_ms=st.sampled_from([200, 400, 5]),
        rebalance_timeout_ms=st.sampled_from([100, 500]),
        require_known_member_id=st.booleans(),
        data=st.data(),
    )
    def join_group(
        self,
        client: str,
        group_id: str,
        member_choice: str,
        protocols: tuple[Protocol, ...],
        protocol_type: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        require_known_member_id: bool,
        data: st.DataObject | None,
    ) -> None:
        view = self.views[(client, group_id)]
        member_id = view.member_id
        if member_choice == "empty":
            member_id = ""
        elif member_choice == "stale" and self.issued_ids and data is not None:
            member_id = data.draw(st.sampled_from(self.issued_ids))
        request_id = self.next_request_id()
        event = g.JoinGroup(
            request_id=request_id,
            now_ms=self.now_ms,
            group_id=group_id,
            member_id=member_id,
            group_instance_id=CLIENTS[client],
            client_id=client,
            client_host="/127.0.0.1",
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            protocol_type=protocol_type,
            protocols=protocols,
            require_known_member_id=require_known_member_id,
        )
        self.apply(event, Outstanding("join", client, group_id, member_id))

    @rule(
        client=st.sampled_from(sorted(CLIENTS)),
        group_id=st.sampled_from(GROUPS),
        generation_offset=st.sampled_from([0, -1]),
        drop_one=st.booleans(),
        with_protocol=st.booleans(),
    )
    def sync_group(
        self,
        client: str,
        group_id: str,
        generation_offset: int,
        drop_one: bool,
        with_protocol: bool,
    ) -> None:
        view = self.views[(client, group_id)]
        assignments: tuple[g.MemberAssignment, ...] = ()
        if view.leader:
            # Leave out the first member (often the leader itself, assigned in an earlier
            # generation): it must get empty bytes, not what it had.
            members = view.members[1:] if drop_one else view.members
            assignments = tuple(
                g.MemberAssignment(m, f"{m}@{view.generation_id}".encode()) for m in members
            )
        event = g.SyncGroup(
            request_id=self.next_request_id(),
            now_ms=self.now_ms,
            group_id=group_id,
            generation_id=view.generation_id + generation_offset,
            member_id=view.member_id,
            group_instance_id=CLIENTS[client],
            assignments=assignments,
            protocol_type="consumer" if with_protocol else None,
            protocol_name=view.protocol_name if with_protocol else None,
        )
        outstanding = Outstanding("sync", client, group_id, view.member_id, event.generation_id)
        self.apply(event, outstanding)

    @rule(client=st.sampled_from(sorted(CLIENTS)), group_id=st.sampled_from(GROUPS))
    def heartbeat(self, client: str, group_id: str) -> None:
        view = self.views[(client, group_id)]
        event = g.Heartbeat(
            request_id=self.next_request_id(),
            now_ms=self.now_ms,
            group_id=group_id,
            generation_id=view.generation_id,
            member_id=view.member_id,
            group_instance_id=CLIENTS[client],
        )
        outstanding = Outstanding(
            "heartbeat", client, group_id, view.member_id, event.generation_id
        )
        self.apply(event, outstanding)

    @rule(
        client=st.sampled_from(sorted(CLIENTS)),
        group_id=st.sampled_from(GROUPS),
        by_instance=st.booleans(),
    )
    def leave_group(self, client: str, group_id: str, by_instance: bool) -> None:
        view = self.views[(client, group_id)]
        instance = CLIENTS[client]
        leaving = g.LeavingMember("", instance) if by_instance else g.LeavingMember(view.member_id)
        event = g.LeaveGroup(self.next_request_id(), self.now_ms, group_id, (leaving,))
        self.apply(event, Outstanding("leave", client, group_id, view.member_id))
        if not by_instance:
            self.views[(client, group_id)] = ClientView()

    def _waiting_members(self) -> list[Outstanding]:
        return [
            o
            for o in self.outstanding.values()
            if o.kind in ("join", "sync") and o.member_id and o.client is not None
        ]

    @precondition(lambda self: bool(self._waiting_members()))
    @rule(data=st.data())
    def leave_group_while_waiting(self, data: st.DataObject) -> None:
        """A member leaves while its JoinGroup or SyncGroup waits: the wait must be answered."""
        waiting = data.draw(st.sampled_from(self._waiting_members()))
        assert waiting.client is not None and waiting.group_id is not None
        leaving = (g.LeavingMember(waiting.member_id, CLIENTS[waiting.client]),)
        event = g.LeaveGroup(self.next_request_id(), self.now_ms, waiting.group_id, leaving)
        self.apply(event, Outstanding("leave", waiting.client, waiting.group_id))
        self.views[(waiting.client, waiting.group_id)] = ClientView()

    @rule(
        client=st.sampled_from(sorted(CLIENTS)),
        group_id=st.sampled_from(COMMIT_GROUPS),
        standalone=st.booleans(),
        entries=st.lists(
            st.tuples(
                st.sampled_from(PARTITIONS),
                st.integers(0, 100),
                st.sampled_from(["", "m", "too-long-metadata"]),
            ),
            min_size=1,
            max_size=3,
        ),
    )
    def offset_commit(
        self,
        client: str,
        group_id: str,
        standalone: bool,
        entries: list[tuple[tuple[str, int], int, str]],
    ) -> None:
        view = self.views.get((client, group_id), ClientView())
        standalone = standalone or group_id == "solo"
        offsets = tuple(
            g.OffsetCommitEntry(t, p, offset, offset // 10, metadata)
            for (t, p), offset, metadata in entries
        )
        event = g.OffsetCommit(
            request_id=self.next_request_id(),
            now_ms=self.now_ms,
            group_id=group_id,
            generation_id=-1 if standalone else view.generation_id,
            member_id="" if standalone else view.member_id,
            group_instance_id=None if standalone else CLIENTS[client],
            offsets=offsets,
        )
        self.apply(event, Outstanding("commit", None, group_id))

    @rule(offset=st.integers(0, 100))
    def standalone_commit(self, offset: int) -> None:
        """A standalone consumer commits one partition, often while an earlier commit of it is
        still in flight (completions then come back newest first)."""
        entry = g.OffsetCommitEntry("t", 0, offset)
        event = g.OffsetCommit(self.next_request_id(), self.now_ms, "solo", -1, "", None, (entry,))
        self.apply(event, Outstanding("commit", None, "solo"))

    @rule(
        group_id=st.sampled_from(COMMIT_GROUPS),
        producer_id=st.sampled_from(PRODUCERS),
        key=st.sampled_from(PARTITIONS),
        offset=st.integers(0, 100),
    )
    def txn_offset_commit(
        self, group_id: str, producer_id: int, key: tuple[str, int], offset: int
    ) -> None:
        """A transactional producer commits its consumer's offset inside its transaction."""
        entry = g.OffsetCommitEntry(key[0], key[1], offset)
        event = g.TxnOffsetCommit(
            self.next_request_id(), self.now_ms, group_id, producer_id, 0, -1, "", None, (entry,)
        )
        self.apply(event, Outstanding("commit", None, group_id))

    @rule(producer_id=st.sampled_from(PRODUCERS), commit=st.booleans())
    def txn_marker(self, producer_id: int, commit: bool) -> None:
        """The producer's transaction ends at the group's partition: only once every commit of
        it was answered (a producer ends its transaction after its TxnOffsetCommit answers)."""
        if any(
            isinstance(w.record, g.PersistOffsets) and w.record.producer_id == producer_id
            for w in self._in_flight()
        ):
            return
        marker = g.TxnMarker(producer_id, commit)
        self.writes.append(Write(marker, "persisted"))
        self.apply(marker)

    def _in_flight(self) -> list[Write]:
        """Writes not yet completed, newest first: the simplest choice completes out of order."""
        return [w for w in reversed(self.writes) if w.status == "in flight"]

    @precondition(lambda self: bool(self._in_flight()))
    @rule(data=st.data())
    def offsets_persisted(self, data: st.DataObject) -> None:
        write = data.draw(st.sampled_from(self._in_flight()))
        write.status = "persisted"
        self.apply(g.OffsetsPersisted(write.request_id))

    @precondition(
        lambda self: any(isinstance(w.record, g.PersistOffsets) for w in self._in_flight())
    )
    @rule(data=st.data())
    def offsets_persist_failed(self, data: st.DataObject) -> None:
        # Only commits fail here: a failed tombstone leaves memory and log apart by design
        # (the client was told the deletion failed); tests/unit covers it.
        commits = [w for w in self._in_flight() if isinstance(w.record, g.PersistOffsets)]
        write = data.draw(st.sampled_from(commits))
        write.status = "failed"
        self.apply(g.OffsetsPersistFailed(write.request_id))

    @rule(
        group_id=st.sampled_from(COMMIT_GROUPS),
        partitions=st.none() | st.lists(st.sampled_from(PARTITIONS), max_size=3).map(tuple),
        require_stable=st.booleans(),
    )
    def offset_fetch(
        self,
        group_id: str,
        partitions: tuple[tuple[str, int], ...] | None,
        require_stable: bool = False,
    ) -> None:
        request_id = self.next_request_id()
        asked = (g.OffsetFetchGroup(group_id, partitions),)
        event = g.OffsetFetch(request_id, self.now_ms, asked, require_stable)
        transition = g.step(self.state, event, PARAMS)
        assert transition.state == self.state
        (answer,) = transition.effects
        assert isinstance(answer, g.Respond)
        assert isinstance(answer.response, g.OffsetFetchResponse)
        fetched = {(p.topic, p.partition): p for p in answer.response.groups[0].partitions}
        unsettled = self._unsettled(group_id) if require_stable else set()
        for key, result in fetched.items():
            unstable = result.error_code is E.UNSTABLE_OFFSET_COMMIT
            assert unstable == (key in unsettled), (key, result, unsettled)
            assert result.error_code in (E.NONE, E.UNSTABLE_OFFSET_COMMIT)
            if unstable:
                assert (result.offset, result.metadata) == (g.NO_OFFSET, "")
        if self._deletion_in_flight():
            return
        durable = g.recover(self._persisted()).offsets.get(group_id, {})
        expected = partitions if partitions is not None else tuple(sorted(durable))
        assert list(fetched) == list(dict.fromkeys(expected))
        for key, result in fetched.items():
            if key in unsettled:
                continue
            committed = durable.get(key)
            assert result.offset == (committed.offset if committed else g.NO_OFFSET)
            assert result.metadata == (committed.metadata if committed else "")

    @rule(group_id=st.sampled_from(COMMIT_GROUPS))
    def offset_fetch_stable(self, group_id: str) -> None:
        """A read_committed consumer's OffsetFetch (require_stable) of every partition: random
        fetches rarely ask for the one partition a transaction holds."""
        self.offset_fetch(group_id, PARTITIONS, require_stable=True)

    @rule(states=st.sampled_from([(), ("Stable",), ("empty", "preparingrebalance")]))
    def list_groups(self, states: tuple[str, ...]) -> None:
        request_id = self.next_request_id()
        self.apply(g.ListGroups(request_id, self.now_ms, states), Outstanding("list", None, None))

    @rule(group_ids=st.lists(st.sampled_from(GROUPS), min_size=1, max_size=2).map(tuple))
    def describe_groups(self, group_ids: tuple[str, ...]) -> None:
        request_id = self.next_request_id()
        event = g.DescribeGroups(request_id, self.now_ms, group_ids)
        self.apply(event, Outstanding("describe", None, None))

    @rule(group_id=st.sampled_from(COMMIT_GROUPS))
    def delete_groups(self, group_id: str) -> None:
        request_id = self.next_request_id()
        was = self.state.groups.get(group_id)
        event = g.DeleteGroups(request_id, self.now_ms, (group_id,))
        self.apply(event, Outstanding("delete", None, None))
        if was is not None and was.state is GroupState.EMPTY:
            assert group_id not in self.state.groups

    @rule(
        group_id=st.sampled_from(COMMIT_GROUPS),
        keys=st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=2, unique=True).map(tuple),
    )
    def offset_delete(self, group_id: str, keys: tuple[tuple[str, int], ...]) -> None:
        """OffsetDelete: the keys not refused leave the group's offsets at once, whatever is
        in flight; the refusals are Kafka's."""
        request_id = self.next_request_id()
        was = self.state.groups.get(group_id)
        event = g.OffsetDelete(request_id, self.now_ms, group_id, keys)
        self.apply(event, Outstanding("offset_delete", None, None))
        if was is None:
            return
        if was.state is not GroupState.EMPTY and was.protocol_type != g.CONSUMER_PROTOCOL_TYPE:
            return
        for topic, index in keys:
            if was.state is GroupState.EMPTY or not was.is_subscribed_to(topic):
                assert (topic, index) not in self.state.offsets.get(group_id, {})

    @rule(
        elapsed_ms=st.sampled_from([0, 1, 10, 30, 30, 60, 60, 120, 250, 1_000]),
        live=st.lists(st.sampled_from(WELL_BEHAVED), max_size=len(WELL_BEHAVED), unique=True),
        drop_one=st.booleans(),
    )
    def tick(self, elapsed_ms: int, live: list[str], drop_one: bool) -> None:
        """Time passes; the ``live`` clients act on each group first (as a real client
        heartbeats well within its session timeout); the others may be gone."""
        for client in live:
            for group_id in GROUPS:
                self.client_acts(client, group_id, drop_one)
        self.now_ms += elapsed_ms
        self.apply(g.Tick(self.now_ms))

    # ---------------------------------------------------------------------------- reference

    def _persisted(self) -> list[g.DurableRecord | g.TxnMarker]:
        return [w.record for w in self.writes if w.status == "persisted"]

    def _unsettled(self, group_id: str) -> set[tuple[str, int]]:
        """The group's partitions with a commit not settled: one in flight (not emptied by a
        deletion of its group), or a producer's durable one with neither that producer's
        marker nor a deletion of the group after it in the log."""
        unsettled: set[tuple[str, int]] = set()
        for position, write in enumerate(self.writes):
            record = write.record
            if not isinstance(record, g.PersistOffsets) or record.group_id != group_id:
                continue
            if write.emptied or write.status == "failed":
                continue
            keys = {(r.topic, r.partition) for r in record.offsets} - write.dropped
            if write.status == "persisted":
                if record.producer_id < 0:
                    continue
                later = [w.record for w in self.writes[position + 1 :]]
                if any(
                    (isinstance(r, g.TxnMarker) and r.producer_id == record.producer_id)
                    or (isinstance(r, g.PersistGroupDeletion) and group_id in r.group_ids)
                    for r in later
                ):
                    continue  # its transaction ended, or its group was deleted since
                for r in later:
                    if isinstance(r, g.PersistOffsetDeletion) and r.group_id == group_id:
                        keys -= set(r.partitions)  # offsets deleted since
            unsettled.update(keys)
        return unsettled

    def _deletion_in_flight(self) -> bool:
        return any(
            isinstance(w.record, g.PersistGroupDeletion | g.PersistOffsetDeletion)
            for w in self._in_flight()
        )

    @invariant()
    def committed_offsets_are_the_durable_ones(self) -> None:
        if self._deletion_in_flight():
            return
        recovered = g.recover(self._persisted())

        def plain(offsets: object) -> dict[str, dict[tuple[str, int], tuple[int, int, str, int]]]:
            assert isinstance(offsets, dict)
            return {
                group_id: {
                    key: (c.offset, c.leader_epoch, c.metadata, c.commit_timestamp_ms)
                    for key, c in committed.items()
                }
                for group_id, committed in offsets.items()
                if committed
            }

        assert plain(dict(self.state.offsets)) == plain(dict(recovered.offsets))

    def teardown(self) -> None:
        """With every write completed and time passing, every request gets its answer."""
        for write in self._in_flight():
            write.status = "persisted"
            self.apply(g.OffsetsPersisted(write.request_id))
        for _ in range(4):
            self.now_ms += 20_000
            self.apply(g.Tick(self.now_ms))
        assert not self.outstanding, self.outstanding
        assert all(group.state is GroupState.EMPTY for group in self.state.groups.values())

    # ---------------------------------------------------------------------------- invariants

    @invariant()
    def member_ids_unique(self) -> None:
        g.inv_member_ids_unique(self.state)

    @invariant()
    def leader_is_member(self) -> None:
        g.inv_leader_is_member(self.state)

    @invariant()
    def empty_group_is_empty(self) -> None:
        g.inv_empty_group_is_empty(self.state)

    @invariant()
    def common_protocol_exists(self) -> None:
        g.inv_common_protocol_exists(self.state)

    @invariant()
    def awaiting_join_only_while_preparing(self) -> None:
        g.inv_awaiting_join_only_while_preparing(self.state)

    @invariant()
    def awaiting_sync_only_while_completing(self) -> None:
        g.inv_awaiting_sync_only_while_completing(self.state)

    @invariant()
    def stable_group_is_assigned(self) -> None:
        g.inv_stable_group_is_assigned(self.state)

    @invariant()
    def rebalance_timers_armed(self) -> None:
        g.inv_rebalance_timers_armed(self.state)

    @invariant()
    def static_instance_ids_unique(self) -> None:
        g.inv_static_instance_ids_unique(self.state)

    @invariant()
    def deferred_requests_unique(self) -> None:
        g.inv_deferred_requests_unique(self.state)

    @invariant()
    def offsets_belong_to_groups(self) -> None:
        g.inv_offsets_belong_to_groups(self.state)


# Rebalances need a few dozen steps to go round twice (Stable, rebalance, Stable again).
GroupMachine.TestCase.settings = settings(GroupMachine.TestCase.settings, stateful_step_count=100)
TestGroupMachine = GroupMachine.TestCase
