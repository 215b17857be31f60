----------------------------- MODULE ConfirmWal -----------------------------
(***************************************************************************)
(* Snapshot reads in another zone: a proxy replays its main's ConfirmWAL,  *)
(* resolves Link Records through the source proxies' RouterChannels, and   *)
(* serves reads of the main's partition from its snapshot-read cache.      *)
(*                                                                         *)
(* Machine: automq_ref/state_machines/confirm_wal.py.  Properties:         *)
(* tests/properties/test_confirm_wal.py::ConfirmWalMachine.                *)
(* Sources: AutoMQ's S3 WAL and ConfirmWAL, its append path                *)
(* (S3Storage.append), the zone router's produce path (RouterOutV2,        *)
(* RouterInV2) and its snapshot-read partitions (GetPartitionSnapshot);    *)
(* the ZeroZone 2.0 design, AutoMQ/automq issue #2642 (ConfirmWAL, Link  *)
(* Records, snapshot read);                                                *)
(* docs/machines/confirm_wal.md.                                           *)
(*                                                                         *)
(* THE PROTOCOL.  A client in zone B produces to proxy p, which writes the *)
(* data into its own RouterChannel (a WAL in shared storage; the write     *)
(* returns a channelOffset readable from any node) and sends the main, the *)
(* partition leader in zone A, a ZoneRouteRequest carrying only that       *)
(* channelOffset.  The main reads the data, assigns it the next partition  *)
(* offset, keeps the full records in its LogCache and writes to its WAL    *)
(* (the ConfirmWAL) a Link Record: magic | sourceNodeId | channelOffset |  *)
(* partitionOffset | timestamp.  Data that has no link (a produce in the   *)
(* main's own zone in direct mode) is written into the WAL in full, and so *)
(* are records that are not partition data at all (time and transaction    *)
(* index entries, MetaStream updates).  WAL appends complete in order; the *)
(* main's confirm offset is the end of the durable prefix.                 *)
(* The proxy in zone B keeps a read-only copy of the partition: it polls   *)
(* the main (GetPartitionSnapshot) for the incremental partition snapshot  *)
(* and the ConfirmWAL end, replays the WAL records (lastReplayed, end]     *)
(* into its snapshot-read cache, resolves every Link Record by reading     *)
(* channelOffset from the RouterChannel of sourceNodeId (inserting the     *)
(* partitionOffset and timestamp the main assigned), then applies the      *)
(* snapshot, which moves the end offset its fetches may read up to.        *)
(*                                                                         *)
(* WHAT IS MODELLED.  One partition, one main, one reading proxy, a set of *)
(* source proxies (Sources) each with an append-only RouterChannel.  A     *)
(* produce is named by a number (1, 2, ...): "the data the producer sent"  *)
(* is that number, written once into a channel (Produce) or into the WAL   *)
(* by the main itself (AppendDirect).  The main: AppendLink, AppendDirect, *)
(* AppendMeta each append one WAL record (LINK, DATA, META) and LINK/DATA  *)
(* take the next partition offset; AdvanceConfirm makes a prefix durable;  *)
(* RestartMain loses the records past the confirm offset (a crash; the     *)
(* restarted or failover incarnation recovers exactly the durable prefix), *)
(* after which their offsets are assigned again, maybe to other data.      *)
(* The proxy: Poll (the main answers with its confirm offset and the       *)
(* partition end of the durable prefix, read at the time it answers),      *)
(* ReceiveAnswer, ReplayRecord (one record at a time: replay is            *)
(* asynchronous and may stop anywhere), ReplayDuplicate (a record already  *)
(* replayed is replayed again), ResolveLink, ApplySnapshot, ServeRead.     *)
(*                                                                         *)
(* THE ENVIRONMENT, AND WHY IT MAY DO WHAT IT DOES.  Answers are kept in a *)
(* set and never consumed: the proxy may take any answer at any time, any  *)
(* number of times, so answers arrive stale (the main has moved on since), *)
(* reordered and duplicated, and some are never taken (lost).  AutoMQ's    *)
(* subscriber sends one request at a time over one TCP connection, which   *)
(* rules out reordering within a session; but sessions expire and are      *)
(* re-created, responses of an abandoned connection may still be in the    *)
(* proxy's queue, and replays run asynchronously, so a proxy that relied   *)
(* on order would be one refactor from a bug.  The model grants the        *)
(* strongest network and demands that the proxy be correct under it:       *)
(* ReceiveAnswer keeps the newest answer by WAL end (a stale or duplicate  *)
(* one changes nothing), which is sound because the main's confirm offset  *)
(* only grows, even across RestartMain (the durable prefix survives).      *)
(* Replays may also repeat (ReplayDuplicate: overlapping replays of two    *)
(* answers, or a replay retried after a RouterChannel read failed), so the *)
(* cache must absorb a record replayed twice.                              *)
(*                                                                         *)
(* WHAT IS ABSTRACTED AWAY, AND WHY.                                       *)
(* - Byte offsets: the WAL offset is a record count and the confirm offset *)
(*   the length of the durable prefix (the S3 WAL's offsets are sparse     *)
(*   64 MiB-aligned byte positions; only their order matters here).        *)
(* - One record per produce and one partition offset per record (batches   *)
(*   of n records would move offsets by n; nothing here depends on n).     *)
(* - Timestamps: inserted like the partition offset, from the Link Record; *)
(*   no property reads them (the machine carries them).                    *)
(* - RouterChannel trimming (route epochs): a channel is trimmed only      *)
(*   after every main uploaded the data its links point to, and the proxy  *)
(*   then reads from main storage; that is RouteEpoch's subject.  Here     *)
(*   channels are never trimmed, so a link always resolves.                *)
(* - Cache eviction and the block-cache fallback, WAL trimming (delayed    *)
(*   30 s for snapshot readers), the v2 delta data in the answer (the same *)
(*   records, delivered inline), sessions and their epochs, leader epochs, *)
(*   partition moves and the MetaStream contents (a META record replays to *)
(*   nothing here).                                                        *)
(* - A main restart keeps the proxy's session: its cache holds only        *)
(*   durable records, which the restarted main still has.                  *)
(*                                                                         *)
(* BOUNDS AND SWITCHES.  MaxProduces bounds the produces, MaxWal the WAL   *)
(* length, MaxRestarts the crashes of the main.  The four switches are     *)
(* TRUE in the real spec; each mutation model sets one to FALSE and must   *)
(* make TLC report the invariant it protects (specs/README.md).            *)
(***************************************************************************)
EXTENDS Naturals, Integers, Sequences, FiniteSets, TLC

CONSTANTS
    Sources,          \* source proxies, each with a RouterChannel (model values)
    NoNode,           \* the source of a record that has no link (a model value)
    Reader,           \* the reading proxy (one of Sources; used by a mutation only)
    MaxProduces,      \* produces are numbered 1..MaxProduces
    MaxWal,           \* the ConfirmWAL holds at most MaxWal records
    MaxRestarts,      \* how often the main may crash and come back
    \* Switches for mutation models; all TRUE in the real spec.
    ReportConfirmed,         \* the main answers with its confirm offset, not its WAL end
    ReplayAtPartitionOffset, \* replay puts a record at the partition offset it carries
    ResolveViaSource,        \* a link is resolved through sourceNodeId's RouterChannel
    ReplayBeforeAdvance      \* lastReplayed moves only when a record has been replayed

ASSUME
    /\ Sources # {} /\ Reader \in Sources /\ NoNode \notin Sources
    /\ MaxProduces \in Nat /\ MaxWal \in Nat /\ MaxRestarts \in Nat
    /\ {ReportConfirmed, ReplayAtPartitionOffset, ResolveViaSource, ReplayBeforeAdvance}
           \subseteq BOOLEAN

NoProduce == 0                  \* the produce field of a record that carries no data
NoChannel == -1                 \* the channel field of a record that has no link
NoOffset == -1                  \* the partition offset of a META record
Produces == 1..MaxProduces
ChannelOffsets == 0..(MaxProduces - 1)
Offsets == 0..(MaxWal - 1)      \* at most one partition offset per WAL record

\* A ConfirmWAL record.  LINK: a Link Record (the data stays in src's RouterChannel at ch);
\* DATA: partition data written in full; META: an index entry or MetaStream update.
WalRecords == [kind : {"LINK", "DATA", "META"}, src : Sources \cup {NoNode},
               ch : ChannelOffsets \cup {NoChannel}, prod : Produces \cup {NoProduce},
               off : Offsets \cup {NoOffset}]
\* A snapshot-read cache entry: an unresolved link, or data (resolved, or replayed in full).
Entries == [kind : {"LINK", "DATA"}, src : Sources \cup {NoNode},
            ch : ChannelOffsets \cup {NoChannel}, prod : Produces \cup {NoProduce}]
\* A GetPartitionSnapshot answer: the ConfirmWAL end and the partition end offset.
Answers == [walEnd : 0..MaxWal, partEnd : 0..MaxWal]
\* A read the proxy served (link: the data came from a resolved Link Record).
Reads == [off : Offsets, prod : Produces, link : BOOLEAN]
NoRead == [off |-> NoOffset, prod |-> NoProduce, link |-> FALSE]

VARIABLES
    channel,      \* RouterChannel contents per source proxy: produce at channelOffset i is [i+1]
    nextProduce,  \* the next produce number
    wal,          \* the main's ConfirmWAL records, durable or not
    confirm,      \* the main's confirm offset: wal[1..confirm] is durable
    restarts,     \* how often the main crashed
    lostFrom,     \* history: the lowest partition offset a crash took back (NoOffset if none)
    answers,      \* every answer the main ever sent (the proxy may take any, any time)
    target,       \* the newest answer the proxy took: replay up to target.walEnd
    replayed,     \* the proxy's lastReplayed: wal[1..replayed] is in its cache
    cache,        \* the snapshot-read cache: partition offset -> Entries
    exposed,      \* the partition end offset the proxy's fetches may read below
    lastRead      \* the last read the proxy served (NoRead before the first)

mainVars == <<channel, nextProduce, wal, confirm, restarts, lostFrom>>
proxyVars == <<answers, target, replayed, cache, exposed, lastRead>>
vars == <<mainVars, proxyVars>>

-----------------------------------------------------------------------------
(* Helpers *)

Min(a, b) == IF a <= b THEN a ELSE b

\* The number of partition records among the first n WAL records: the partition end offset
\* once they are durable.
PartitionEnd(n) == Cardinality({i \in 1..n : wal[i].kind # "META"})
NextOffset == PartitionEnd(Len(wal))
ConfirmedEnd == PartitionEnd(confirm)

\* The data a partition record stands for: the channel's contents for a Link Record.
Payload(r) == IF r.kind = "LINK" THEN channel[r.src][r.ch + 1] ELSE r.prod

\* The main's partition after its first n WAL records: offset -> produce.
MainView(n) ==
    [o \in 0..(PartitionEnd(n) - 1) |->
        Payload(wal[CHOOSE i \in 1..n : wal[i].kind # "META" /\ wal[i].off = o])]

\* What the proxy's cache stands for, each link read through its own source's channel.
CacheView == [o \in DOMAIN cache |->
                 IF cache[o].kind = "LINK" THEN channel[cache[o].src][cache[o].ch + 1]
                 ELSE cache[o].prod]

\* The answer the main gives now (the mutation reports its WAL end, durable or not).
Reported ==
    IF ReportConfirmed THEN [walEnd |-> confirm, partEnd |-> ConfirmedEnd]
    ELSE [walEnd |-> Len(wal), partEnd |-> NextOffset]

\* Replaying record r into cache c: META changes nothing; LINK and DATA write the entry at the
\* record's partition offset, unless the entry already there came from this very record (a
\* link that was resolved meanwhile stays resolved).  The mutation places it at the first free
\* slot instead, as a cache that appends what it replays would.
EntryOf(r) == [kind |-> r.kind, src |-> r.src, ch |-> r.ch, prod |-> r.prod]
SameOrigin(x, e) == x.src = e.src /\ x.ch = e.ch /\ (e.kind = "LINK" \/ x.prod = e.prod)
ReplayOne(c, r) ==
    IF r.kind = "META" THEN c
    ELSE LET o == IF ReplayAtPartitionOffset THEN r.off ELSE Cardinality(DOMAIN c)
             e == EntryOf(r)
         IN IF o \in DOMAIN c /\ SameOrigin(c[o], e) THEN c ELSE (o :> e) @@ c

-----------------------------------------------------------------------------

Init ==
    /\ channel = [s \in Sources |-> <<>>]
    /\ nextProduce = 1
    /\ wal = <<>>
    /\ confirm = 0
    /\ restarts = 0
    /\ lostFrom = NoOffset
    /\ answers = {}
    /\ target = [walEnd |-> 0, partEnd |-> 0]
    /\ replayed = 0
    /\ cache = <<>>
    /\ exposed = 0
    /\ lastRead = NoRead

-----------------------------------------------------------------------------
(* Actions: the producers and the main *)

\* ACTION: Produce(s) mirrors a produce arriving at source proxy s for a partition led in
\* another zone: RouterOutV2 appends the data to s's RouterChannel, which returns the
\* channelOffset.  The ZoneRouteRequest to the main is AppendLink.
Produce(s) ==
    /\ nextProduce \in Produces
    /\ channel' = [channel EXCEPT ![s] = Append(@, nextProduce)]
    /\ nextProduce' = nextProduce + 1
    /\ UNCHANGED <<wal, confirm, restarts, lostFrom, proxyVars>>

\* ACTION: AppendLink(s, c) mirrors the main handling a ZoneRouteRequest for channelOffset c of
\* s (RouterInV2): it reads the data, assigns the next partition offset, and appends a Link
\* Record to its ConfirmWAL.  Each channel record is linked at most once per WAL (a record lost
\* by RestartMain may be linked again: the proxy retries the request).
AppendLink(s, c) ==
    /\ Len(wal) < MaxWal
    /\ c < Len(channel[s])
    /\ ~\E i \in 1..Len(wal) : wal[i].kind = "LINK" /\ wal[i].src = s /\ wal[i].ch = c
    /\ wal' = Append(wal, [kind |-> "LINK", src |-> s, ch |-> c, prod |-> NoProduce,
                           off |-> NextOffset])
    /\ UNCHANGED <<channel, nextProduce, confirm, restarts, lostFrom, proxyVars>>

\* ACTION: AppendDirect mirrors a produce from the main's own zone in direct mode: the data is
\* written to the ConfirmWAL in full, at the next partition offset.
AppendDirect ==
    /\ Len(wal) < MaxWal
    /\ nextProduce \in Produces
    /\ wal' = Append(wal, [kind |-> "DATA", src |-> NoNode, ch |-> NoChannel,
                           prod |-> nextProduce, off |-> NextOffset])
    /\ nextProduce' = nextProduce + 1
    /\ UNCHANGED <<channel, confirm, restarts, lostFrom, proxyVars>>

\* ACTION: AppendMeta mirrors a ConfirmWAL record that is not partition data: a time or
\* transaction index entry, a MetaStream update.  It takes a WAL position, no partition offset.
AppendMeta ==
    /\ Len(wal) < MaxWal
    /\ wal' = Append(wal, [kind |-> "META", src |-> NoNode, ch |-> NoChannel,
                           prod |-> NoProduce, off |-> NoOffset])
    /\ UNCHANGED <<channel, nextProduce, confirm, restarts, lostFrom, proxyVars>>

\* ACTION: AdvanceConfirm(n) mirrors WAL uploads completing: completions are processed in
\* order, so the durable prefix grows to n records (the S3 WAL's flushedOffset; the WAL's
\* confirmOffset()).  The appends of those records are now acknowledged.
AdvanceConfirm(n) ==
    /\ confirm < n /\ n <= Len(wal)
    /\ confirm' = n
    /\ UNCHANGED <<channel, nextProduce, wal, restarts, lostFrom, proxyVars>>

\* ACTION: RestartMain mirrors a crash of the main and the recovery of its WAL (by itself or by
\* a failover target): exactly the durable prefix survives; the offsets of the lost records
\* are assigned again by later appends (lostFrom remembers the lowest such offset).
RestartMain ==
    /\ restarts < MaxRestarts
    /\ confirm < Len(wal)
    /\ wal' = SubSeq(wal, 1, confirm)
    /\ restarts' = restarts + 1
    /\ lostFrom' = IF NextOffset = ConfirmedEnd THEN lostFrom
                   ELSE IF lostFrom = NoOffset THEN ConfirmedEnd ELSE Min(lostFrom, ConfirmedEnd)
    /\ UNCHANGED <<channel, nextProduce, confirm, proxyVars>>

-----------------------------------------------------------------------------
(* Actions: the proxy *)

\* ACTION: Poll mirrors the proxy's GetPartitionSnapshotRequest and the main's answer, read
\* when the main handles it: the ConfirmWAL end (confirmWalEndOffset: the confirm offset) and
\* the partition's end offset.  The answer joins the set the proxy may take from.
Poll ==
    /\ Reported \notin answers
    /\ answers' = answers \cup {Reported}
    /\ UNCHANGED <<mainVars, target, replayed, cache, exposed, lastRead>>

\* ACTION: ReceiveAnswer(a) mirrors the proxy taking answer a off the connection.  Only an
\* answer newer than the one it holds (by WAL end) changes anything; a stale or duplicate one
\* is a stutter.  In the mutation the proxy moves lastReplayed to the answer's end at once and
\* replays asynchronously, a replay that may be lost.
ReceiveAnswer(a) ==
    /\ a \in answers
    /\ a.walEnd > target.walEnd
    /\ target' = a
    /\ replayed' = IF ReplayBeforeAdvance THEN replayed ELSE a.walEnd
    /\ UNCHANGED <<mainVars, answers, cache, exposed, lastRead>>

\* ACTION: ReplayRecord mirrors the proxy replaying the next ConfirmWAL record of
\* (lastReplayed, target.walEnd] into its snapshot-read cache.
ReplayRecord ==
    /\ replayed < Min(target.walEnd, Len(wal))
    /\ cache' = ReplayOne(cache, wal[replayed + 1])
    /\ replayed' = replayed + 1
    /\ UNCHANGED <<mainVars, answers, target, exposed, lastRead>>

\* ACTION: ReplayDuplicate(i) mirrors record i being replayed once more (overlapping replays,
\* a retried replay).  With a correct cache it changes nothing.
ReplayDuplicate(i) ==
    /\ i <= Min(replayed, Len(wal))
    /\ cache' = ReplayOne(cache, wal[i])
    /\ UNCHANGED <<mainVars, answers, target, replayed, exposed, lastRead>>

\* ACTION: ResolveLink(o) mirrors reading the data of the Link Record cached at partition
\* offset o: RouterChannel#get(channelOffset) on the channel of sourceNodeId; the record keeps
\* the partition offset (and timestamp) the main assigned.  The mutation reads the reading
\* proxy's own channel.
ResolveLink(o) ==
    /\ o \in DOMAIN cache
    /\ cache[o].kind = "LINK"
    /\ LET via == IF ResolveViaSource THEN cache[o].src ELSE Reader IN
       /\ cache[o].ch < Len(channel[via])
       /\ cache' = [cache EXCEPT ![o].kind = "DATA", ![o].prod = channel[via][cache[o].ch + 1]]
    /\ UNCHANGED <<mainVars, answers, target, replayed, exposed, lastRead>>

\* ACTION: ApplySnapshot mirrors the proxy applying the partition snapshot of its newest answer
\* once the replay up to that answer's WAL end is done and every link below its partition end
\* is resolved: fetches may now read up to that end (and waiting fetches are woken).
ApplySnapshot ==
    /\ target.partEnd > exposed
    /\ replayed >= target.walEnd
    /\ \A o \in exposed..(target.partEnd - 1) : o \in DOMAIN cache /\ cache[o].kind = "DATA"
    /\ exposed' = target.partEnd
    /\ UNCHANGED <<mainVars, answers, target, replayed, cache, lastRead>>

\* ACTION: ServeRead(o) mirrors a fetch of offset o answered from the snapshot-read cache.
\* Offsets at or past the applied end are not served (OFFSET_OUT_OF_RANGE, or the fetch waits).
ServeRead(o) ==
    /\ o < exposed
    /\ o \in DOMAIN cache /\ cache[o].kind = "DATA"
    /\ lastRead' = [off |-> o, prod |-> cache[o].prod, link |-> cache[o].src # NoNode]
    /\ UNCHANGED <<mainVars, answers, target, replayed, cache, exposed>>

-----------------------------------------------------------------------------

Next ==
    \/ \E s \in Sources : Produce(s)
    \/ \E s \in Sources, c \in ChannelOffsets : AppendLink(s, c)
    \/ AppendDirect
    \/ AppendMeta
    \/ \E n \in 1..MaxWal : AdvanceConfirm(n)
    \/ RestartMain
    \/ Poll
    \/ \E a \in Answers : ReceiveAnswer(a)
    \/ ReplayRecord
    \/ \E i \in 1..MaxWal : ReplayDuplicate(i)
    \/ \E o \in Offsets : ResolveLink(o)
    \/ ApplySnapshot
    \/ \E o \in Offsets : ServeRead(o)

Spec == Init /\ [][Next]_vars

\* The proxy's side and Poll are weakly fair; the main and the producers need no fairness
\* (their steps are bounded, so they stop).
FairSpec ==
    /\ Spec
    /\ WF_vars(Poll)
    /\ WF_vars(\E a \in Answers : ReceiveAnswer(a))
    /\ WF_vars(ReplayRecord)
    /\ WF_vars(\E o \in Offsets : ResolveLink(o))
    /\ WF_vars(ApplySnapshot)

-----------------------------------------------------------------------------
(* Invariants (the Python machine has inv_<snake_case> for each). *)

TypeOK ==
    /\ channel \in [Sources -> Seq(Produces)]
    /\ nextProduce \in 1..(MaxProduces + 1)
    /\ wal \in Seq(WalRecords) /\ Len(wal) <= MaxWal
    /\ confirm \in 0..Len(wal)
    /\ restarts \in 0..MaxRestarts
    /\ lostFrom \in Offsets \cup {NoOffset}
    /\ answers \subseteq Answers
    /\ target \in Answers
    /\ replayed \in 0..MaxWal
    /\ DOMAIN cache \subseteq Offsets /\ \A o \in DOMAIN cache : cache[o] \in Entries
    /\ exposed \in 0..MaxWal
    /\ lastRead \in Reads \cup {NoRead}

\* The proxy never learns, exposes or serves anything past the main's durable confirm offset.
NoReadBeyondConfirm ==
    /\ replayed <= confirm
    /\ exposed <= ConfirmedEnd
    /\ lastRead.off < ConfirmedEnd

\* Replaying any record already replayed, once more, leaves the cache as it is.
ReplayIdempotent ==
    \A i \in 1..Min(replayed, Len(wal)) : ReplayOne(cache, wal[i]) = cache

\* Every data entry in the cache, and every read served, holds the data the producer sent, at
\* an offset the main assigned to exactly that data.
ResolvedDataMatches ==
    /\ \A o \in DOMAIN cache : cache[o].kind = "DATA" =>
           \E i \in 1..Len(wal) : wal[i].off = o /\ Payload(wal[i]) = cache[o].prod
    /\ lastRead # NoRead =>
           \E i \in 1..Len(wal) : wal[i].off = lastRead.off /\ Payload(wal[i]) = lastRead.prod

\* Safety form of convergence: once the proxy has replayed up to the main's confirm offset,
\* its cache (links read through their channels) equals the main's durable partition.
SnapshotsConverge == replayed = confirm => CacheView = MainView(confirm)

\* Every offset below the applied end is in the cache as data: a fetch never finds a hole.
ExposedReadable == \A o \in 0..(exposed - 1) : o \in DOMAIN cache /\ cache[o].kind = "DATA"

\* Liveness (checked with FairSpec): the proxy eventually catches up with the main for good.
EventuallyConverges == <>[](replayed = confirm /\ exposed = ConfirmedEnd)

=============================================================================
