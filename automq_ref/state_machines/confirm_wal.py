"""ConfirmWAL replay by proxies: snapshot reads of a main's partition in another zone.

Spec: specs/ConfirmWal.tla. Properties: tests/properties/test_confirm_wal.py.

Theory of operation
-------------------
A partition is led by its *main* in zone A; every other zone has a *proxy* for that main. A
client in zone B produces to its zone's proxy, which writes the data into its own
*RouterChannel* (a WAL in shared storage, readable by any node at the returned
``channel_offset``) and sends the main only that offset. The main reads the data, assigns it the
next partition offset, keeps the full records in its LogCache and appends to its own WAL, the
*ConfirmWAL*, a **Link Record**: ``magic | sourceNodeId | channelOffset | partitionOffset |
timestamp`` (``LinkRecord``). Data with no link (a produce from the main's own zone in direct
mode) is appended in full (``DataRecord``), and so are records that are not partition data at
all: time and transaction index entries, MetaStream updates (``MetaRecord``). WAL appends
complete in order; the **confirm offset** is the end of the durable prefix, and only records
below it are acknowledged.

The proxy in zone B keeps a read-only copy of the partition:

1. ``Poll``: it asks the main for the incremental partition snapshot; the main answers with its
   confirm offset (``wal_end``) and the partition end offset of the durable prefix
   (``partition_end``), read when it answers.
2. ``ReceiveAnswer``: it keeps the newest answer (by ``wal_end``). A stale or duplicated answer
   changes nothing: the main's confirm offset only grows, even across a crash (the durable
   prefix survives it), so "newest" is well defined whatever order answers arrive in.
3. ``ReplayRecord``: it replays the records ``(last_replayed, wal_end]`` into its snapshot-read
   cache, one at a time. A record lands at the partition offset it carries, so replaying it
   again (``ReplayDuplicate``: overlapping or retried replays) changes nothing; a link that was
   resolved in between stays resolved.
4. ``ResolveLink``: a cached Link Record is turned into data by reading ``channel_offset`` from
   the RouterChannel of ``source_node_id`` (never the proxy's own: channel offsets are per
   channel), keeping the partition offset and timestamp the main assigned.
5. ``ApplySnapshot``: once the replay has reached the answer's ``wal_end`` and every offset
   below its ``partition_end`` is data, fetches may read up to that end.
6. ``ServeRead``: a fetch below the applied end is answered from the cache; at or past it,
   ``OFFSET_OUT_OF_RANGE`` (the real fetch would wait).

The main may crash (``RestartMain``): the records past the confirm offset are lost and their
partition offsets are assigned again. Because the proxy only ever replays below the confirm
offset, nothing it has cached or served is taken back.

State covers the whole protocol, as the spec does: the RouterChannels, the main and the proxy.
Every event has the name of a TLA+ action; ``step`` returns ``Transition(state, effects)``: what
the event gives back is a ``Respond`` effect, and an event whose action is not enabled is refused
with a ``Rejected`` effect and leaves the state unchanged (a stutter in a trace). ``tla_state``
maps a state onto the spec's variables for trace validation. WAL offsets are record counts here
(the S3 WAL's are sparse byte positions; only their order matters).

Not modelled: RouterChannel trimming (route epochs), cache eviction and the fallback to the block
cache, WAL trimming, sessions and their epochs, the v2 inline delta data, MetaStream contents.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

from automq_ref.state_machines.transition import InvariantViolation as InvariantViolation
from automq_ref.state_machines.transition import Rejected as Rejected
from automq_ref.state_machines.transition import Transition as Transition

NO_OFFSET: Final = -1  # a MetaRecord's partition offset; lost_from before any loss
NO_PRODUCE: Final = 0  # the produce id of a record that carries no data
NO_CHANNEL: Final = -1  # the channel offset of a record that has no link
SOURCE_MODEL_PREFIX: Final = "n"  # source node k is the model value n<k> in the TLA+ models
NO_NODE_MODEL: Final = "NoNode"


class ConfirmWalError(enum.Enum):
    """Why an event was refused (the ``Rejected`` effect's error; the state is unchanged)."""

    UNKNOWN_SOURCE = "UNKNOWN_SOURCE"
    CHANNEL_OFFSET_OUT_OF_RANGE = "CHANNEL_OFFSET_OUT_OF_RANGE"
    ALREADY_LINKED = "ALREADY_LINKED"
    INVALID_CONFIRM_OFFSET = "INVALID_CONFIRM_OFFSET"
    UNKNOWN_ANSWER = "UNKNOWN_ANSWER"
    STALE_ANSWER = "STALE_ANSWER"
    NOTHING_TO_REPLAY = "NOTHING_TO_REPLAY"
    NOT_REPLAYED = "NOT_REPLAYED"
    NOT_A_LINK = "NOT_A_LINK"
    REPLAY_INCOMPLETE = "REPLAY_INCOMPLETE"
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"


# ========================================================================== records and state


@dataclass(frozen=True, slots=True)
class ChannelRecord:
    """What a source proxy wrote into its RouterChannel: the producer's data."""

    produce_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class LinkRecord:
    """magic | sourceNodeId | channelOffset | partitionOffset | timestamp (no data)."""

    source_node_id: int
    channel_offset: int
    partition_offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class DataRecord:
    """Partition data written into the ConfirmWAL in full (no link)."""

    partition_offset: int
    produce_id: int
    payload: bytes
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class MetaRecord:
    """A ConfirmWAL record that is not partition data: an index entry, a MetaStream update."""

    description: str = ""


WalRecord: TypeAlias = LinkRecord | DataRecord | MetaRecord


@dataclass(frozen=True, slots=True)
class PollAnswer:
    """A GetPartitionSnapshot answer: the ConfirmWAL end and the partition's end offset."""

    wal_end: int
    partition_end: int


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A snapshot-read cache entry: an unresolved link (``produce_id is None``) or data.

    A resolved link keeps its source and channel offset, so replaying its Link Record again
    recognises it and leaves it resolved.
    """

    source_node_id: int | None
    channel_offset: int
    produce_id: int | None
    payload: bytes | None
    timestamp_ms: int

    @property
    def resolved(self) -> bool:
        return self.produce_id is not None


@dataclass(frozen=True, slots=True)
class ServedRead:
    partition_offset: int
    produce_id: int
    payload: bytes
    timestamp_ms: int
    via_link: bool


@dataclass(frozen=True, slots=True)
class MainState:
    wal: tuple[WalRecord, ...] = ()
    confirm_offset: int = 0  # wal[:confirm_offset] is durable
    restarts: int = 0
    lost_from: int = NO_OFFSET  # history: the lowest partition offset a crash took back

    def partition_end(self, wal_end: int) -> int:
        """The partition end offset after the first ``wal_end`` records."""
        return sum(not isinstance(record, MetaRecord) for record in self.wal[:wal_end])

    @property
    def next_offset(self) -> int:
        return self.partition_end(len(self.wal))

    @property
    def confirmed_end(self) -> int:
        return self.partition_end(self.confirm_offset)


NO_ANSWER: Final = PollAnswer(0, 0)


@dataclass(frozen=True, slots=True)
class ProxyState:
    answers: frozenset[PollAnswer] = frozenset()  # every answer the main sent
    target: PollAnswer = NO_ANSWER  # the newest answer taken: replay up to its wal_end
    last_replayed: int = 0  # wal[:last_replayed] is in the cache
    cache: Mapping[int, CacheEntry] = field(default_factory=dict)  # never mutated in place
    exposed_end: int = 0  # fetches may read offsets below it
    last_read: ServedRead | None = None


@dataclass(frozen=True, slots=True)
class ConfirmWalState:
    channels: Mapping[int, tuple[ChannelRecord, ...]]  # RouterChannel per source node
    next_produce_id: int = 1
    main: MainState = MainState()
    proxy: ProxyState = ProxyState()


def initial_state(sources: Iterable[int]) -> ConfirmWalState:
    return ConfirmWalState(channels={source: () for source in sources})


# ==================================================================================== events


@dataclass(frozen=True, slots=True)
class Produce:
    """A produce at source proxy ``source_node_id``, written into its RouterChannel."""

    source_node_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class AppendLink:
    """The main handles a ZoneRouteRequest: a Link Record for a channel offset."""

    source_node_id: int
    channel_offset: int
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class AppendDirect:
    """A produce in the main's own zone, written into the ConfirmWAL in full."""

    payload: bytes
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class AppendMeta:
    description: str = ""


@dataclass(frozen=True, slots=True)
class AdvanceConfirm:
    """WAL uploads completed in order: the first ``confirm_offset`` records are durable."""

    confirm_offset: int


@dataclass(frozen=True, slots=True)
class RestartMain:
    """The main crashed; its recovered WAL is the durable prefix."""


@dataclass(frozen=True, slots=True)
class Poll:
    """The proxy's GetPartitionSnapshotRequest and the main's answer."""


@dataclass(frozen=True, slots=True)
class ReceiveAnswer:
    answer: PollAnswer


@dataclass(frozen=True, slots=True)
class ReplayRecord:
    """Replay the next record of (last_replayed, target.wal_end]."""


@dataclass(frozen=True, slots=True)
class ReplayDuplicate:
    """Replay record ``record_index`` (0-based, already replayed) once more."""

    record_index: int


@dataclass(frozen=True, slots=True)
class ResolveLink:
    partition_offset: int


@dataclass(frozen=True, slots=True)
class ApplySnapshot:
    pass


@dataclass(frozen=True, slots=True)
class ServeRead:
    partition_offset: int


ConfirmWalEvent: TypeAlias = (
    Produce
    | AppendLink
    | AppendDirect
    | AppendMeta
    | AdvanceConfirm
    | RestartMain
    | Poll
    | ReceiveAnswer
    | ReplayRecord
    | ReplayDuplicate
    | ResolveLink
    | ApplySnapshot
    | ServeRead
)

Response: TypeAlias = PollAnswer | ServedRead | int  # int: an assigned partition offset


@dataclass(frozen=True, slots=True)
class Respond:
    """What the event gives back to its caller: the channel offset a Produce wrote at, the
    partition offset an append was assigned, the answer to a Poll, the record a read served."""

    response: Response


ConfirmWalEffect: TypeAlias = Respond | Rejected[ConfirmWalError]
ConfirmWalTransition: TypeAlias = Transition[ConfirmWalState, ConfirmWalEffect]


def response_of(transition: ConfirmWalTransition) -> Response | None:
    """The response a transition gives (None: the event answers nothing, or was refused)."""
    for effect in transition.effects:
        if isinstance(effect, Respond):
            return effect.response
    return None


# ================================================================== the transition table


@dataclass(frozen=True, slots=True)
class ActionInfo:
    """One row of the transition table: who acts, what it reads and what it writes."""

    name: str  # the TLA+ action and the event class
    actor: str  # "producer", "main" or "proxy"
    reads: tuple[str, ...]
    writes: tuple[str, ...]


# Parts of the state, by the names the diagram uses.
CHANNEL: Final = "RouterChannel"
WAL: Final = "ConfirmWAL"
CONFIRM: Final = "confirm offset"
ANSWERS: Final = "poll answers"
TARGET: Final = "newest answer"
REPLAYED: Final = "lastReplayed"
CACHE: Final = "snapshot-read cache"
EXPOSED: Final = "applied end"
READS: Final = "fetch responses"

ACTIONS: Final = (
    ActionInfo("Produce", "producer", (), (CHANNEL,)),
    ActionInfo("AppendLink", "main", (CHANNEL, WAL), (WAL,)),
    ActionInfo("AppendDirect", "main", (WAL,), (WAL,)),
    ActionInfo("AppendMeta", "main", (), (WAL,)),
    ActionInfo("AdvanceConfirm", "main", (WAL,), (CONFIRM,)),
    ActionInfo("RestartMain", "main", (CONFIRM,), (WAL,)),
    ActionInfo("Poll", "main", (CONFIRM, WAL), (ANSWERS,)),
    ActionInfo("ReceiveAnswer", "proxy", (ANSWERS,), (TARGET,)),
    ActionInfo("ReplayRecord", "proxy", (TARGET, WAL), (CACHE, REPLAYED)),
    ActionInfo("ReplayDuplicate", "proxy", (REPLAYED, WAL), (CACHE,)),
    ActionInfo("ResolveLink", "proxy", (CACHE, CHANNEL), (CACHE,)),
    ActionInfo("ApplySnapshot", "proxy", (TARGET, REPLAYED, CACHE), (EXPOSED,)),
    ActionInfo("ServeRead", "proxy", (EXPOSED, CACHE), (READS,)),
)


def mermaid_flowchart() -> str:
    """The transition table as a mermaid data-flow chart: state parts and actions, with an
    edge from each part an action reads and to each part it writes."""
    parts: list[str] = []
    for action in ACTIONS:
        for part in (*action.reads, *action.writes):
            if part not in parts:
                parts.append(part)
    ids = {part: f"s{index}" for index, part in enumerate(parts)}
    lines = ["flowchart LR"]
    for actor in ("producer", "main", "proxy"):
        lines.append(f"  subgraph {actor}")
        for action in ACTIONS:
            if action.actor == actor:
                lines.append(f"    {action.name}([{action.name}])")
        lines.append("  end")
    for part in parts:
        lines.append(f'  {ids[part]}[("{part}")]')
    for action in ACTIONS:
        for part in action.reads:
            lines.append(f"  {ids[part]} -.-> {action.name}")
        for part in action.writes:
            lines.append(f"  {action.name} --> {ids[part]}")
    return "\n".join(lines)


# =================================================================================== step


def step(state: ConfirmWalState, event: ConfirmWalEvent) -> ConfirmWalTransition:
    match event:
        case Produce():
            return _on_produce(state, event)
        case AppendLink():
            return _on_append_link(state, event)
        case AppendDirect():
            return _on_append_direct(state, event)
        case AppendMeta():
            return _on_append_meta(state, event)
        case AdvanceConfirm():
            return _on_advance_confirm(state, event)
        case RestartMain():
            return _on_restart_main(state, event)
        case Poll():
            return _on_poll(state, event)
        case ReceiveAnswer():
            return _on_receive_answer(state, event)
        case ReplayRecord():
            return _on_replay_record(state, event)
        case ReplayDuplicate():
            return _on_replay_duplicate(state, event)
        case ResolveLink():
            return _on_resolve_link(state, event)
        case ApplySnapshot():
            return _on_apply_snapshot(state, event)
        case ServeRead():
            return _on_serve_read(state, event)


def _reject(state: ConfirmWalState, error: ConfirmWalError, message: str) -> ConfirmWalTransition:
    return Transition(state, (Rejected(error, message),))


def _with_main(state: ConfirmWalState, **changes: object) -> ConfirmWalState:
    return replace(state, main=replace(state.main, **changes))  # type: ignore[arg-type]


def _with_proxy(state: ConfirmWalState, **changes: object) -> ConfirmWalState:
    return replace(state, proxy=replace(state.proxy, **changes))  # type: ignore[arg-type]


# ------------------------------------------------------------------- producers and the main


def _on_produce(state: ConfirmWalState, event: Produce) -> ConfirmWalTransition:
    channel = state.channels.get(event.source_node_id)
    if channel is None:
        return _reject(state, ConfirmWalError.UNKNOWN_SOURCE, f"no channel {event.source_node_id}")
    record = ChannelRecord(state.next_produce_id, event.payload)
    channels = {**state.channels, event.source_node_id: (*channel, record)}
    after = replace(state, channels=channels, next_produce_id=state.next_produce_id + 1)
    return Transition(after, (Respond(len(channel)),))  # the channel offset


def _is_linked(main: MainState, source_node_id: int, channel_offset: int) -> bool:
    return any(
        isinstance(record, LinkRecord)
        and record.source_node_id == source_node_id
        and record.channel_offset == channel_offset
        for record in main.wal
    )


def _on_append_link(state: ConfirmWalState, event: AppendLink) -> ConfirmWalTransition:
    channel = state.channels.get(event.source_node_id)
    if channel is None:
        return _reject(state, ConfirmWalError.UNKNOWN_SOURCE, f"no channel {event.source_node_id}")
    if not 0 <= event.channel_offset < len(channel):
        return _reject(
            state,
            ConfirmWalError.CHANNEL_OFFSET_OUT_OF_RANGE,
            f"channel {event.source_node_id} has {len(channel)} records",
        )
    if _is_linked(state.main, event.source_node_id, event.channel_offset):
        return _reject(state, ConfirmWalError.ALREADY_LINKED, "this channel record is in the WAL")
    offset = state.main.next_offset
    link = LinkRecord(event.source_node_id, event.channel_offset, offset, event.timestamp_ms)
    return Transition(_with_main(state, wal=(*state.main.wal, link)), (Respond(offset),))


def _on_append_direct(state: ConfirmWalState, event: AppendDirect) -> ConfirmWalTransition:
    offset = state.main.next_offset
    record = DataRecord(offset, state.next_produce_id, event.payload, event.timestamp_ms)
    after = _with_main(state, wal=(*state.main.wal, record))
    return Transition(replace(after, next_produce_id=state.next_produce_id + 1), (Respond(offset),))


def _on_append_meta(state: ConfirmWalState, event: AppendMeta) -> ConfirmWalTransition:
    return Transition(_with_main(state, wal=(*state.main.wal, MetaRecord(event.description))))


def _on_advance_confirm(state: ConfirmWalState, event: AdvanceConfirm) -> ConfirmWalTransition:
    """The confirm offset only moves forward, and never past the WAL end.

    post: __return__.state.main.confirm_offset >= state.main.confirm_offset
    post: __return__.rejection or __return__.state.main.confirm_offset <= len(state.main.wal)
    post: __return__.rejection is None or __return__.state == state
    """
    main = state.main
    if not main.confirm_offset <= event.confirm_offset <= len(main.wal):
        return _reject(
            state,
            ConfirmWalError.INVALID_CONFIRM_OFFSET,
            f"{event.confirm_offset} outside [{main.confirm_offset}, {len(main.wal)}]",
        )
    return Transition(_with_main(state, confirm_offset=event.confirm_offset))


def _on_restart_main(state: ConfirmWalState, event: RestartMain) -> ConfirmWalTransition:
    main = state.main
    if main.confirm_offset == len(main.wal):
        return Transition(state)  # nothing to lose: the restart changes nothing
    lost_from = main.lost_from
    if main.next_offset > main.confirmed_end:
        lost_from = (
            main.confirmed_end if lost_from == NO_OFFSET else min(lost_from, main.confirmed_end)
        )
    after = _with_main(
        state,
        wal=main.wal[: main.confirm_offset],
        restarts=main.restarts + 1,
        lost_from=lost_from,
    )
    return Transition(after)


# ------------------------------------------------------------------------------- the proxy


def reported_answer(main: MainState) -> PollAnswer:
    """What the main answers a poll with: its confirm offset, never its WAL end."""
    return PollAnswer(main.confirm_offset, main.confirmed_end)


def _on_poll(state: ConfirmWalState, event: Poll) -> ConfirmWalTransition:
    answer = reported_answer(state.main)
    answers = state.proxy.answers | {answer}
    return Transition(_with_proxy(state, answers=answers), (Respond(answer),))


def _on_receive_answer(state: ConfirmWalState, event: ReceiveAnswer) -> ConfirmWalTransition:
    proxy = state.proxy
    if event.answer not in proxy.answers:
        return _reject(state, ConfirmWalError.UNKNOWN_ANSWER, "the main never sent it")
    if event.answer.wal_end <= proxy.target.wal_end:
        return _reject(state, ConfirmWalError.STALE_ANSWER, "not newer than the one held")
    return Transition(_with_proxy(state, target=event.answer))


def entry_of(record: LinkRecord | DataRecord) -> CacheEntry:
    """The cache entry a replayed partition record becomes (a link is not yet resolved).

    post: __return__.resolved == isinstance(record, DataRecord)
    post: _same_origin(__return__, __return__)
    """
    if isinstance(record, LinkRecord):
        return CacheEntry(
            record.source_node_id, record.channel_offset, None, None, record.timestamp_ms
        )
    return CacheEntry(None, NO_CHANNEL, record.produce_id, record.payload, record.timestamp_ms)


def _same_origin(cached: CacheEntry, replayed: CacheEntry) -> bool:
    """Whether both entries come from the same WAL record (symmetric).

    post: __return__ == _same_origin(replayed, cached)
    """
    if cached.source_node_id != replayed.source_node_id:
        return False
    if cached.channel_offset != replayed.channel_offset:
        return False
    return replayed.source_node_id is not None or cached.produce_id == replayed.produce_id


def replay_one(cache: Mapping[int, CacheEntry], record: WalRecord) -> Mapping[int, CacheEntry]:
    """Replay one ConfirmWAL record into a snapshot-read cache; returns the new cache.

    The entry goes to the partition offset the record carries, unless the entry there came
    from this very record (a link resolved meanwhile stays resolved): replaying twice is
    replaying once.

    post: replay_one(__return__, record) == __return__
    """
    if isinstance(record, MetaRecord):
        return cache
    entry = entry_of(record)
    cached = cache.get(record.partition_offset)
    if cached is not None and _same_origin(cached, entry):
        return cache
    return {**cache, record.partition_offset: entry}


def _on_replay_record(state: ConfirmWalState, event: ReplayRecord) -> ConfirmWalTransition:
    proxy, wal = state.proxy, state.main.wal
    if proxy.last_replayed >= min(proxy.target.wal_end, len(wal)):
        return _reject(state, ConfirmWalError.NOTHING_TO_REPLAY, "caught up with the answer")
    cache = replay_one(proxy.cache, wal[proxy.last_replayed])
    return Transition(_with_proxy(state, cache=cache, last_replayed=proxy.last_replayed + 1))


def _on_replay_duplicate(state: ConfirmWalState, event: ReplayDuplicate) -> ConfirmWalTransition:
    proxy, wal = state.proxy, state.main.wal
    if not 0 <= event.record_index < min(proxy.last_replayed, len(wal)):
        return _reject(state, ConfirmWalError.NOT_REPLAYED, f"record {event.record_index}")
    return Transition(_with_proxy(state, cache=replay_one(proxy.cache, wal[event.record_index])))


def resolve(
    entry: CacheEntry, channels: Mapping[int, tuple[ChannelRecord, ...]]
) -> CacheEntry | None:
    """Read a cached link's data from the RouterChannel of its source (None: not there).

    post: __return__ is None or (__return__.resolved and _same_origin(entry, __return__))
    """
    if entry.source_node_id is None:
        return None
    channel = channels.get(entry.source_node_id, ())
    if not 0 <= entry.channel_offset < len(channel):
        return None
    record = channel[entry.channel_offset]
    return replace(entry, produce_id=record.produce_id, payload=record.payload)


def _on_resolve_link(state: ConfirmWalState, event: ResolveLink) -> ConfirmWalTransition:
    cache = state.proxy.cache
    entry = cache.get(event.partition_offset)
    if entry is None or entry.resolved:
        return _reject(state, ConfirmWalError.NOT_A_LINK, f"offset {event.partition_offset}")
    resolved = resolve(entry, state.channels)
    if resolved is None:
        return _reject(
            state, ConfirmWalError.CHANNEL_OFFSET_OUT_OF_RANGE, "the channel record is gone"
        )
    cache = {**cache, event.partition_offset: resolved}
    return Transition(_with_proxy(state, cache=cache))


def _readable(proxy: ProxyState, partition_offset: int) -> bool:
    entry = proxy.cache.get(partition_offset)
    return entry is not None and entry.resolved


def _on_apply_snapshot(state: ConfirmWalState, event: ApplySnapshot) -> ConfirmWalTransition:
    proxy = state.proxy
    target = proxy.target
    if target.partition_end <= proxy.exposed_end:
        return _reject(state, ConfirmWalError.REPLAY_INCOMPLETE, "nothing new to apply")
    if proxy.last_replayed < target.wal_end:
        return _reject(state, ConfirmWalError.REPLAY_INCOMPLETE, "the replay is behind")
    if not all(
        _readable(proxy, offset) for offset in range(proxy.exposed_end, target.partition_end)
    ):
        return _reject(state, ConfirmWalError.REPLAY_INCOMPLETE, "a link is not resolved")
    return Transition(_with_proxy(state, exposed_end=target.partition_end))


def read(state: ConfirmWalState, partition_offset: int) -> ServedRead | None:
    """What a fetch of ``partition_offset`` gets from the proxy (None: out of range).

    post: __return__ is None or 0 <= partition_offset < state.proxy.exposed_end
    """
    proxy = state.proxy
    if not 0 <= partition_offset < proxy.exposed_end:
        return None
    entry = proxy.cache.get(partition_offset)
    if entry is None or entry.produce_id is None or entry.payload is None:
        return None
    return ServedRead(
        partition_offset,
        entry.produce_id,
        entry.payload,
        entry.timestamp_ms,
        entry.source_node_id is not None,
    )


def _on_serve_read(state: ConfirmWalState, event: ServeRead) -> ConfirmWalTransition:
    served = read(state, event.partition_offset)
    if served is None:
        return _reject(
            state,
            ConfirmWalError.OFFSET_OUT_OF_RANGE,
            f"offset {event.partition_offset}, applied end {state.proxy.exposed_end}",
        )
    return Transition(_with_proxy(state, last_read=served), (Respond(served),))


# ==================================================================================== views


def payload_of(state: ConfirmWalState, record: LinkRecord | DataRecord) -> tuple[int, bytes]:
    """The data a partition record stands for: (produce id, payload)."""
    if isinstance(record, DataRecord):
        return record.produce_id, record.payload
    channel_record = state.channels[record.source_node_id][record.channel_offset]
    return channel_record.produce_id, channel_record.payload


def main_view(state: ConfirmWalState, wal_end: int) -> dict[int, tuple[int, bytes]]:
    """The main's partition after its first ``wal_end`` WAL records: offset -> data."""
    return {
        record.partition_offset: payload_of(state, record)
        for record in state.main.wal[:wal_end]
        if not isinstance(record, MetaRecord)
    }


def cache_view(state: ConfirmWalState) -> dict[int, tuple[int, bytes]]:
    """What the proxy's cache stands for, each link read through its own source's channel."""
    view: dict[int, tuple[int, bytes]] = {}
    for offset, entry in state.proxy.cache.items():
        if entry.produce_id is not None and entry.payload is not None:
            view[offset] = (entry.produce_id, entry.payload)
        else:
            resolved = resolve(entry, state.channels)
            if resolved is None or resolved.produce_id is None or resolved.payload is None:
                raise InvariantViolation(f"offset {offset}: a link to nothing: {entry}")
            view[offset] = (resolved.produce_id, resolved.payload)
    return view


# =============================================================================== invariants


def inv_no_read_beyond_confirm(state: ConfirmWalState) -> None:
    """NoReadBeyondConfirm: nothing past the main's confirm offset is replayed, exposed or
    served."""
    main, proxy = state.main, state.proxy
    if proxy.last_replayed > main.confirm_offset:
        raise InvariantViolation(
            f"replayed {proxy.last_replayed} records, {main.confirm_offset} are durable"
        )
    if proxy.exposed_end > main.confirmed_end:
        raise InvariantViolation(
            f"exposes offsets below {proxy.exposed_end}, durable below {main.confirmed_end}"
        )
    if proxy.last_read is not None and proxy.last_read.partition_offset >= main.confirmed_end:
        raise InvariantViolation(f"served {proxy.last_read}, durable below {main.confirmed_end}")


def inv_replay_idempotent(state: ConfirmWalState) -> None:
    """ReplayIdempotent: replaying any record already replayed leaves the cache as it is."""
    cache = state.proxy.cache
    for index, record in enumerate(state.main.wal[: state.proxy.last_replayed]):
        if replay_one(cache, record) != cache:
            raise InvariantViolation(f"replaying record {index} again changes the cache")


def _main_data_at(state: ConfirmWalState, partition_offset: int) -> tuple[int, bytes] | None:
    for record in state.main.wal:
        if not isinstance(record, MetaRecord) and record.partition_offset == partition_offset:
            return payload_of(state, record)
    return None


def inv_resolved_data_matches(state: ConfirmWalState) -> None:
    """ResolvedDataMatches: cached data and served reads are what the producer sent, at the
    offset the main assigned to it."""
    for offset, entry in state.proxy.cache.items():
        if entry.resolved:
            expected = _main_data_at(state, offset)
            if expected != (entry.produce_id, entry.payload):
                raise InvariantViolation(f"offset {offset}: cache {entry}, main {expected}")
    last = state.proxy.last_read
    if last is not None:
        expected = _main_data_at(state, last.partition_offset)
        if expected != (last.produce_id, last.payload):
            raise InvariantViolation(f"served {last}, main {expected}")


def inv_snapshots_converge(state: ConfirmWalState) -> None:
    """SnapshotsConverge: once replayed up to the confirm offset, the cache is the main's
    durable partition."""
    if state.proxy.last_replayed != state.main.confirm_offset:
        return
    cached, durable = cache_view(state), main_view(state, state.main.confirm_offset)
    if cached != durable:
        raise InvariantViolation(f"caught up, but cache {cached} != main {durable}")


def inv_exposed_readable(state: ConfirmWalState) -> None:
    """ExposedReadable: every offset below the applied end is data in the cache."""
    for offset in range(state.proxy.exposed_end):
        if not _readable(state.proxy, offset):
            raise InvariantViolation(f"offset {offset} exposed but {state.proxy.cache.get(offset)}")


INVARIANTS: Final = (
    inv_no_read_beyond_confirm,
    inv_replay_idempotent,
    inv_resolved_data_matches,
    inv_snapshots_converge,
    inv_exposed_readable,
)


def check_invariants(state: ConfirmWalState) -> None:
    for invariant in INVARIANTS:
        invariant(state)


# ============================================================================ trace mapping


def _node(source_node_id: int | None) -> dict[str, object]:
    if source_node_id is None:
        return {"model": NO_NODE_MODEL}
    return {"model": f"{SOURCE_MODEL_PREFIX}{source_node_id}"}


def _wal_record(record: WalRecord) -> dict[str, object]:
    fields: dict[str, object]
    match record:
        case LinkRecord():
            fields = {
                "kind": "LINK",
                "src": _node(record.source_node_id),
                "ch": record.channel_offset,
                "prod": NO_PRODUCE,
                "off": record.partition_offset,
            }
        case DataRecord():
            fields = {
                "kind": "DATA",
                "src": _node(None),
                "ch": NO_CHANNEL,
                "prod": record.produce_id,
                "off": record.partition_offset,
            }
        case MetaRecord():
            fields = {
                "kind": "META",
                "src": _node(None),
                "ch": NO_CHANNEL,
                "prod": NO_PRODUCE,
                "off": NO_OFFSET,
            }
    return {"record": fields}


def _answer(answer: PollAnswer) -> dict[str, object]:
    return {"record": {"walEnd": answer.wal_end, "partEnd": answer.partition_end}}


def _entry(entry: CacheEntry) -> dict[str, object]:
    return {
        "record": {
            "kind": "DATA" if entry.resolved else "LINK",
            "src": _node(entry.source_node_id),
            "ch": entry.channel_offset,
            "prod": entry.produce_id if entry.produce_id is not None else NO_PRODUCE,
        }
    }


def _last_read(last: ServedRead | None) -> dict[str, object]:
    if last is None:
        return {"record": {"off": NO_OFFSET, "prod": NO_PRODUCE, "link": False}}
    return {
        "record": {"off": last.partition_offset, "prod": last.produce_id, "link": last.via_link}
    }


def tla_state(state: ConfirmWalState) -> dict[str, object]:
    """The state as the spec's variables (JSON values as in the project's trace format).

    Source node ``k`` is the model value ``n<k>`` (as in the other specs' models); a record
    without a source is ``NoNode``.
    """
    main, proxy = state.main, state.proxy
    return {
        "channel": {
            "fn": [
                [_node(source), {"seq": [record.produce_id for record in channel]}]
                for source, channel in sorted(state.channels.items())
            ]
        },
        "nextProduce": state.next_produce_id,
        "wal": {"seq": [_wal_record(record) for record in main.wal]},
        "confirm": main.confirm_offset,
        "restarts": main.restarts,
        "lostFrom": main.lost_from,
        "answers": {
            "set": [
                _answer(a)
                for a in sorted(proxy.answers, key=lambda a: (a.wal_end, a.partition_end))
            ]
        },
        "target": _answer(proxy.target),
        "replayed": proxy.last_replayed,
        "cache": {"fn": [[offset, _entry(entry)] for offset, entry in sorted(proxy.cache.items())]},
        "exposed": proxy.exposed_end,
        "lastRead": _last_read(proxy.last_read),
    }
