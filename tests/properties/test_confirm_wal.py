"""ConfirmWalMachine: every TLA+ action of specs/ConfirmWal.tla as a rule on the real step.

Producers write into two RouterChannels, the main links, appends directly, writes index
records, makes prefixes durable and crashes; the proxy polls, takes answers in any order (stale
and duplicated ones included), replays, replays again, resolves links, applies snapshots and
serves reads. After every step the spec's invariants are checked. The reference model is an
atomic log: the produces the main acknowledged (those below its confirm offset), in offset
order; every read the proxy serves must be the acknowledged record at that offset, and a proxy
that has caught up serves exactly that log. The run is recorded as a trace (TLA+ action name,
``tla_state``) in the project's NDJSON format.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from automq_ref.state_machines import confirm_wal as cw
from automq_ref.state_machines.confirm_wal import (
    AdvanceConfirm,
    AppendDirect,
    AppendLink,
    AppendMeta,
    ApplySnapshot,
    CacheEntry,
    ConfirmWalError,
    ConfirmWalEvent,
    ConfirmWalState,
    LinkRecord,
    MetaRecord,
    Poll,
    PollAnswer,
    Produce,
    ReceiveAnswer,
    ReplayDuplicate,
    ReplayRecord,
    ResolveLink,
    RestartMain,
    ServedRead,
    ServeRead,
)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (1, 2)
MAX_WAL = 6
MAX_PRODUCES = 8
payloads = st.binary(min_size=1, max_size=3)


def rarely(one_in: int) -> st.SearchStrategy[bool]:
    """True about once in ``one_in`` draws (st.integers would favour its bounds)."""
    return st.sampled_from([False] * (one_in - 1) + [True])


class ConfirmWalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state: ConfirmWalState = cw.initial_state(SOURCES)
        self.trace: list[dict[str, object]] = [
            {"action": "Init", "state": cw.tla_state(self.state)}
        ]
        # The reference model: what each producer sent, the main's WAL as the test asked for it
        # (None for an index record, else the data), and how much of it is durable.
        self.sent: dict[int, list[bytes]] = {source: [] for source in SOURCES}
        self.model_wal: list[bytes | None] = []
        self.model_durable = 0
        self.acked_before: list[bytes] = []

    # ----------------------------------------------------------------------------- helpers

    def apply(self, action: str, event: ConfirmWalEvent) -> cw.ConfirmWalTransition:
        assert type(event).__name__ == action
        before = self.state
        transition = cw.step(self.state, event)
        if (refused := transition.rejection) is not None:
            assert transition.state == before, (event, refused)
            assert transition.effects == (refused,), transition.effects
        self.state = transition.state
        cw.check_invariants(self.state)  # also between the steps of a composite rule
        self.trace.append({"action": action, "state": cw.tla_state(self.state)})
        return transition

    def acked(self) -> list[bytes]:
        """The atomic log: acknowledged produces in offset order."""
        return [data for data in self.model_wal[: self.model_durable] if data is not None]

    def linked(self) -> set[tuple[int, int]]:
        return {
            (record.source_node_id, record.channel_offset)
            for record in self.state.main.wal
            if isinstance(record, LinkRecord)
        }

    def unresolved(self) -> list[int]:
        return sorted(o for o, entry in self.state.proxy.cache.items() if not entry.resolved)

    def snapshot_ready(self) -> bool:
        proxy = self.state.proxy
        return (
            proxy.target.partition_end > proxy.exposed_end
            and proxy.last_replayed >= proxy.target.wal_end
            and all(
                (entry := proxy.cache.get(o)) is not None and entry.resolved
                for o in range(proxy.exposed_end, proxy.target.partition_end)
            )
        )

    def trace_ndjson(self) -> str:
        return "".join(json.dumps(line, sort_keys=True) + "\n" for line in self.trace)

    # ------------------------------------------------------------------ rules (TLA+ actions)

    @precondition(lambda self: self.state.next_produce_id <= MAX_PRODUCES)
    @rule(source=st.sampled_from((*SOURCES, 7)), payload=payloads)
    def produce(self, source: int, payload: bytes) -> None:
        transition = self.apply("Produce", Produce(source, payload))
        if source in SOURCES:
            assert cw.response_of(transition) == len(self.sent[source])
            self.sent[source].append(payload)
        else:
            assert transition.refusal is ConfirmWalError.UNKNOWN_SOURCE

    @precondition(
        lambda self: len(self.state.main.wal) < MAX_WAL and any(self.sent[s] for s in SOURCES)
    )
    @rule(data=st.data(), timestamp_ms=st.integers(0, 5))
    def append_link(self, data: st.DataObject, timestamp_ms: int) -> None:
        candidates = [(s, c) for s in SOURCES for c in range(len(self.sent[s]))]
        fresh = [pair for pair in candidates if pair not in self.linked()]
        source, channel_offset = data.draw(st.sampled_from(fresh * 4 + candidates + [(2, 9)]))
        expected_offset = self.state.main.next_offset
        transition = self.apply("AppendLink", AppendLink(source, channel_offset, timestamp_ms))
        if (source, channel_offset) in fresh:
            assert transition.rejection is None and cw.response_of(transition) == expected_offset
            self.model_wal.append(self.sent[source][channel_offset])
        else:
            assert transition.rejection is not None

    @precondition(
        lambda self: (
            len(self.state.main.wal) < MAX_WAL and self.state.next_produce_id <= MAX_PRODUCES
        )
    )
    @rule(payload=payloads, timestamp_ms=st.integers(0, 5), really=rarely(2))
    def append_direct(self, payload: bytes, timestamp_ms: int, really: bool) -> None:
        if not really:  # links are what this protocol is about
            return
        transition = self.apply("AppendDirect", AppendDirect(payload, timestamp_ms))
        assert transition.rejection is None
        self.model_wal.append(payload)

    @precondition(lambda self: len(self.state.main.wal) < MAX_WAL)
    @rule(
        description=st.sampled_from(["time index", "txn index", "MetaStream"]),
        really=rarely(3),
    )
    def append_meta(self, description: str, really: bool) -> None:
        if not really:  # index records are rarer than data
            return
        assert self.apply("AppendMeta", AppendMeta(description)).rejection is None
        self.model_wal.append(None)

    @precondition(lambda self: self.state.main.confirm_offset < len(self.state.main.wal))
    @rule(data=st.data())
    def advance_confirm(self, data: st.DataObject) -> None:
        main = self.state.main
        offset = data.draw(st.integers(main.confirm_offset + 1, len(main.wal) + 1))
        transition = self.apply("AdvanceConfirm", AdvanceConfirm(offset))
        if offset <= len(self.model_wal):
            assert transition.rejection is None
            self.model_durable = offset
        else:
            assert transition.refusal is ConfirmWalError.INVALID_CONFIRM_OFFSET

    @precondition(lambda self: self.state.main.confirm_offset < len(self.state.main.wal))
    @rule(really=rarely(8))
    def restart_main(self, really: bool) -> None:
        if not really:  # crashes are rare: most draws of this rule do nothing
            return
        assert self.apply("RestartMain", RestartMain()).rejection is None
        del self.model_wal[self.model_durable :]
        assert len(self.state.main.wal) == self.model_durable

    @precondition(lambda self: cw.reported_answer(self.state.main) not in self.state.proxy.answers)
    @rule()
    def poll(self) -> None:
        transition = self.apply("Poll", Poll())
        answer = cw.response_of(transition)
        assert isinstance(answer, PollAnswer)
        assert answer.wal_end == self.model_durable
        assert answer.partition_end == len(self.acked())

    @precondition(
        lambda self: any(
            answer.wal_end > self.state.proxy.target.wal_end for answer in self.state.proxy.answers
        )
    )
    @rule(data=st.data())
    def receive_answer(self, data: st.DataObject) -> None:
        """Any answer the main ever sent, any number of times: stale, reordered, duplicated
        (enabled, as in the spec, while a newer answer than the one held exists)."""
        answers = sorted(self.state.proxy.answers, key=lambda a: a.wal_end)
        answer = data.draw(st.sampled_from([answers[-1]] * 4 + [*answers, PollAnswer(99, 99)]))
        held = self.state.proxy.target
        transition = self.apply("ReceiveAnswer", ReceiveAnswer(answer))
        if answer not in answers:
            assert transition.refusal is ConfirmWalError.UNKNOWN_ANSWER
        elif answer.wal_end <= held.wal_end:
            assert transition.refusal is ConfirmWalError.STALE_ANSWER
        else:
            assert self.state.proxy.target == answer

    @precondition(
        lambda self: (
            self.state.proxy.last_replayed
            < min(self.state.proxy.target.wal_end, len(self.state.main.wal))
        )
    )
    @rule()
    def replay_record(self) -> None:
        before = self.state.proxy.last_replayed
        assert self.apply("ReplayRecord", ReplayRecord()).rejection is None
        assert self.state.proxy.last_replayed == before + 1

    @precondition(lambda self: self.state.proxy.last_replayed > 0)
    @rule(data=st.data(), really=rarely(4))
    def replay_duplicate(self, data: st.DataObject, really: bool) -> None:
        if not really:  # always enabled once something is replayed: keep it from crowding out
            return
        index = data.draw(st.integers(0, self.state.proxy.last_replayed))
        before = self.state
        transition = self.apply("ReplayDuplicate", ReplayDuplicate(index))
        if index < self.state.proxy.last_replayed:
            assert transition.rejection is None
        assert self.state == before  # replaying again changes nothing

    @precondition(lambda self: bool(self.unresolved()))
    @rule(data=st.data())
    def resolve_link(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(self.unresolved()))
        assert self.apply("ResolveLink", ResolveLink(offset)).rejection is None
        entry = self.state.proxy.cache[offset]
        assert entry.resolved and entry.payload == self.acked()[offset]

    @precondition(lambda self: self.snapshot_ready())
    @rule()
    def apply_snapshot(self) -> None:
        assert self.apply("ApplySnapshot", ApplySnapshot()).rejection is None
        assert self.state.proxy.exposed_end == self.state.proxy.target.partition_end

    @precondition(lambda self: self.state.proxy.exposed_end > 0)
    @rule(data=st.data(), really=rarely(2))
    def serve_read(self, data: st.DataObject, really: bool) -> None:
        if not really:  # always enabled once something is exposed
            return
        exposed = self.state.proxy.exposed_end
        offset = data.draw(st.integers(0, exposed + 1))
        transition = self.apply("ServeRead", ServeRead(offset))
        if offset < exposed:
            served = cw.response_of(transition)
            assert isinstance(served, ServedRead)
            assert served.payload == self.acked()[offset]
            assert served.partition_offset == offset
        else:
            assert transition.refusal is ConfirmWalError.OFFSET_OUT_OF_RANGE

    @precondition(lambda self: self.state.main.confirmed_end > self.state.proxy.exposed_end)
    @rule(data=st.data())
    def proxy_catches_up(self, data: st.DataObject) -> None:
        """A healthy proxy, composed of the actions above: poll, take the answer, replay it,
        resolve every link, apply the snapshot and read every offset, so that later actions meet
        a proxy with data (random rules alone rarely get that far)."""
        if cw.reported_answer(self.state.main) not in self.state.proxy.answers:
            self.poll()
        newest = max(self.state.proxy.answers, key=lambda answer: answer.wal_end)
        if newest.wal_end > self.state.proxy.target.wal_end:
            self.apply("ReceiveAnswer", ReceiveAnswer(newest))
        while self.apply("ReplayRecord", ReplayRecord()).rejection is None:
            pass
        self.trace.pop()  # the refused last ReplayRecord: keep the trace free of the stutter
        for offset in self.unresolved():
            assert self.apply("ResolveLink", ResolveLink(offset)).rejection is None
        assert self.apply("ApplySnapshot", ApplySnapshot()).rejection is None
        acked = self.acked()
        assert self.state.proxy.exposed_end == len(acked)
        for offset in range(len(acked)):
            transition = self.apply("ServeRead", ServeRead(offset))
            served = cw.response_of(transition)
            assert isinstance(served, ServedRead)
            assert served.payload == acked[offset]

    # ------------------------------------------------------------------------- invariants

    @invariant()
    def no_read_beyond_confirm(self) -> None:
        cw.inv_no_read_beyond_confirm(self.state)

    @invariant()
    def replay_idempotent(self) -> None:
        cw.inv_replay_idempotent(self.state)

    @invariant()
    def resolved_data_matches(self) -> None:
        cw.inv_resolved_data_matches(self.state)

    @invariant()
    def snapshots_converge(self) -> None:
        cw.inv_snapshots_converge(self.state)

    @invariant()
    def exposed_readable(self) -> None:
        cw.inv_exposed_readable(self.state)

    @invariant()
    def acked_log_only_grows(self) -> None:
        """The atomic log: an acknowledged record is never taken back or changed."""
        acked = self.acked()
        assert acked[: len(self.acked_before)] == self.acked_before
        self.acked_before = acked
        durable = cw.main_view(self.state, self.state.main.confirm_offset)
        assert [durable[offset][1] for offset in sorted(durable)] == acked

    @invariant()
    def caught_up_proxy_serves_the_acked_log(self) -> None:
        proxy = self.state.proxy
        if proxy.exposed_end != self.state.main.confirmed_end:
            return
        reads = [cw.read(self.state, offset) for offset in range(proxy.exposed_end)]
        assert [served.payload for served in reads if served is not None] == self.acked()

    def teardown(self) -> None:
        lines = self.trace_ndjson().splitlines()
        assert json.loads(lines[0])["action"] == "Init"
        assert len(lines) == len(self.trace)


ConfirmWalMachine.TestCase.settings = settings(
    ConfirmWalMachine.TestCase.settings, stateful_step_count=60
)
TestConfirmWalMachine = ConfirmWalMachine.TestCase


# ------------------------------------------------------------------------ examples and checks


def run(state: ConfirmWalState, *events: ConfirmWalEvent) -> ConfirmWalState:
    for event in events:
        transition = cw.step(state, event)
        assert transition.rejection is None, (event, transition)
        state = transition.state
        cw.check_invariants(state)
    return state


def test_proxy_serves_a_link_resolved_through_its_source_channel() -> None:
    state = run(
        cw.initial_state(SOURCES),
        Produce(1, b"mine"),
        Produce(2, b"theirs"),
        AppendLink(2, 0, timestamp_ms=7),  # offset 0: channel 2, offset 0
        AppendMeta("time index"),
        AppendLink(1, 0),  # offset 1: channel 1, offset 0 (the same channel offset)
        AdvanceConfirm(3),
        Poll(),
        ReceiveAnswer(PollAnswer(3, 2)),
        ReplayRecord(),
        ReplayRecord(),
        ReplayRecord(),
        ReplayDuplicate(0),
        ResolveLink(0),
        ResolveLink(1),
        ApplySnapshot(),
    )
    assert cw.read(state, 0) == cw.ServedRead(0, 2, b"theirs", 7, via_link=True)
    assert cw.read(state, 1) == cw.ServedRead(1, 1, b"mine", 0, via_link=True)
    assert cw.read(state, 2) is None


def test_unconfirmed_records_are_never_replayed_and_a_crash_reassigns_them() -> None:
    state = run(
        cw.initial_state(SOURCES),
        AppendDirect(b"a"),
        AdvanceConfirm(1),
        AppendDirect(b"lost"),
        Poll(),
        ReceiveAnswer(PollAnswer(1, 1)),
        ReplayRecord(),
    )
    assert cw.step(state, ReplayRecord()).refusal is ConfirmWalError.NOTHING_TO_REPLAY
    state = run(state, RestartMain(), AppendDirect(b"b"), AdvanceConfirm(2), ApplySnapshot())
    assert state.main.lost_from == 1
    assert cw.read(state, 0) is not None and cw.read(state, 1) is None
    state = run(state, Poll(), ReceiveAnswer(PollAnswer(2, 2)), ReplayRecord(), ApplySnapshot())
    served = cw.read(state, 1)
    assert served is not None and served.payload == b"b"


def test_stale_answers_change_nothing() -> None:
    state = run(cw.initial_state(SOURCES), AppendMeta(), Poll(), AdvanceConfirm(1), Poll())
    state = run(state, ReceiveAnswer(PollAnswer(1, 0)))
    stale = cw.step(state, ReceiveAnswer(PollAnswer(0, 0)))
    assert stale.refusal is ConfirmWalError.STALE_ANSWER and stale.state == state
    duplicate = cw.step(state, ReceiveAnswer(PollAnswer(1, 0)))
    assert duplicate.refusal is ConfirmWalError.STALE_ANSWER and duplicate.state == state


# Each invariant catches the state the matching mutation model of the spec reaches.


def linked_state() -> ConfirmWalState:
    return run(
        cw.initial_state(SOURCES),
        Produce(1, b"mine"),
        Produce(2, b"theirs"),
        AppendLink(2, 0),
        AdvanceConfirm(1),
        Poll(),
        ReceiveAnswer(PollAnswer(1, 1)),
        ReplayRecord(),
    )


def test_no_read_beyond_confirm_catches_a_replay_to_the_wal_end() -> None:
    state = run(cw.initial_state(SOURCES), AppendDirect(b"a"))
    bad = cw._with_proxy(state, target=PollAnswer(1, 1), last_replayed=1)
    with pytest.raises(cw.InvariantViolation):
        cw.inv_no_read_beyond_confirm(bad)


def test_replay_idempotent_catches_an_appending_cache() -> None:
    state = linked_state()
    entry = state.proxy.cache[0]
    bad = cw._with_proxy(state, cache={0: entry, 1: entry})  # the record landed twice
    cw.inv_replay_idempotent(state)
    moved = cw._with_proxy(state, cache={1: entry})
    with pytest.raises(cw.InvariantViolation):
        cw.inv_replay_idempotent(moved)
    with pytest.raises(cw.InvariantViolation):
        cw.inv_snapshots_converge(bad)


def test_resolved_data_matches_catches_resolution_through_the_wrong_channel() -> None:
    state = linked_state()
    wrong = CacheEntry(2, 0, 1, b"mine", 0)  # channel 1's record 0, not channel 2's
    with pytest.raises(cw.InvariantViolation):
        cw.inv_resolved_data_matches(cw._with_proxy(state, cache={0: wrong}))


def test_snapshots_converge_catches_a_lost_replay() -> None:
    state = linked_state()
    with pytest.raises(cw.InvariantViolation):
        cw.inv_snapshots_converge(cw._with_proxy(state, cache={}))


def test_exposed_readable_catches_an_unresolved_exposed_link() -> None:
    state = linked_state()
    with pytest.raises(cw.InvariantViolation):
        cw.inv_exposed_readable(cw._with_proxy(state, exposed_end=1))


def test_tla_state_is_json_in_the_trace_format() -> None:
    state = linked_state()
    encoded = cw.tla_state(state)
    assert json.loads(json.dumps(encoded)) == encoded
    assert encoded["wal"] == {
        "seq": [
            {
                "record": {
                    "kind": "LINK",
                    "src": {"model": "n2"},
                    "ch": 0,
                    "prod": 0,
                    "off": 0,
                }
            }
        ]
    }
    assert encoded["lostFrom"] == -1 and isinstance(state.main.wal[0], LinkRecord)
    assert not isinstance(state.main.wal[0], MetaRecord)


def test_events_are_the_spec_actions_and_the_transition_table() -> None:
    spec = (ROOT / "specs" / "ConfirmWal.tla").read_text()
    actions = set(re.findall(r"\\\* ACTION: ([A-Z][A-Za-z]*)\b", spec))
    events = {cls.__name__ for cls in cw.ConfirmWalEvent.__args__}
    assert actions == events == {action.name for action in cw.ACTIONS}
    for action in cw.ACTIONS:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", action.name).lower()
        assert callable(getattr(cw, f"_on_{snake}")), snake
        assert callable(getattr(ConfirmWalMachine, snake)), snake


def test_invariants_are_the_spec_invariants() -> None:
    spec = (ROOT / "specs" / "ConfirmWal.tla").read_text()
    for checker in cw.INVARIANTS:
        name = "".join(part.title() for part in checker.__name__.removeprefix("inv_").split("_"))
        assert re.search(rf"^{name} ==", spec, re.MULTILINE), name
        assert callable(getattr(ConfirmWalMachine, checker.__name__.removeprefix("inv_")))


def test_machine_doc_shows_the_generated_diagram() -> None:
    doc = (ROOT / "docs" / "machines" / "confirm_wal.md").read_text()
    assert f"```mermaid\n{cw.mermaid_flowchart()}\n```" in doc
