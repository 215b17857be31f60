----------------------------- MODULE Placement -----------------------------
(***************************************************************************)
(* Brokers, their sessions and fencing, and where each partition lives:    *)
(* the controller's cluster metadata, and the one rule that makes moving a *)
(* partition safe without copying it.                                      *)
(*                                                                         *)
(* Machine: automq_ref/state_machines/stream_metadata/ (cluster.py, with   *)
(* the placement arithmetic in automq_ref/state_machines/placement.py).    *)
(* Properties: tests/properties/test_placement.py::PlacementMachine.       *)
(* Sources: Kafka's KRaft controller (broker registration, heartbeats and  *)
(* broker.session.timeout.ms, fenced brokers, RegisterBrokerRecord,        *)
(* BrokerRegistrationChangeRecord, PartitionRecord/PartitionChangeRecord   *)
(* with a leader and a leader epoch) and AutoMQ's use of it: one replica   *)
(* per partition, whose streams the leader opens at the leader epoch       *)
(* (ElasticLog), and node epochs that fence a node's old incarnation.      *)
(*                                                                         *)
(* WHAT IS MODELLED.  One controller applies requests one at a time, each  *)
(* atomically.  A broker registers (a new node epoch; it starts fenced),   *)
(* heartbeats (the first unfences it: it joins), may have its session      *)
(* expire (fenced, node epoch bumped: that registration is over; it must   *)
(* register again), may shut down (fenced, epoch kept; its partitions      *)
(* leave it in batches, held on it meanwhile) or be unregistered.          *)
(* Every partition is assigned to one broker at a                          *)
(* leader epoch; each change of the live brokers moves partitions in the   *)
(* same step, and so do reassignments and balancing rounds; every move     *)
(* bumps the leader epoch.  A partition's streams are created and opened   *)
(* by brokers: the controller lets a broker open one only if it is the     *)
(* partition's broker, at exactly its leader epoch, while no other stream  *)
(* of the partition is open on another broker; a stream opened at a        *)
(* higher epoch must be closed first (StreamMetadata.tla's rule).          *)
(*                                                                         *)
(* WHAT IS ABSTRACTED AWAY, AND WHY.                                       *)
(* - Time: a session "may lapse at any moment": ExpireSessions fences any  *)
(*   set of live brokers (empty too, when it only moves a batch off a      *)
(*   broker in controlled shutdown); a heartbeat of a live broker changes  *)
(*   nothing here (it renews the controller's soft state).                 *)
(* - Where partitions go: the machine picks targets by counts, racks and   *)
(*   loads (placement.py, property-tested); the spec lets a move pick any  *)
(*   live broker, so it covers every choice the arithmetic can make.       *)
(* - Data, offsets, objects, the WAL: StreamMetadata.tla and Failover.tla. *)
(*   A stream here is its state, epoch and owner (its current range's      *)
(*   node).  The close of a fenced broker's streams by failover is a       *)
(*   CloseStream by that node at its stored epoch, which the survivor      *)
(*   uses.                                                                 *)
(* - Topic deletion, CreatePartitions (as CreateTopic: new partitions at   *)
(*   leader epoch 0), ElectLeaders (it moves only a partition without a    *)
(*   broker while one is live, which PartitionsOnLiveBrokers excludes),    *)
(*   the KV record of a topic, racks, listeners and the WAL location a     *)
(*   broker publishes (data failover only carries to a survivor).          *)
(* - A request's node epoch: every request here is sent at the node's      *)
(*   stored epoch (an older one is refused, a stutter); a broker fenced by *)
(*   its session cannot send at it, but failover can, acting as the node.  *)
(*                                                                         *)
(* BOUNDS AND SWITCHES.  Node and leader epochs are bounded (MaxNodeEpoch, *)
(* MaxLeaderEpoch): a step that would pass a bound is disabled.  The       *)
(* Check* and BumpLeaderEpoch constants are TRUE in the real spec; each    *)
(* mutation model sets one to FALSE and must make TLC report a named       *)
(* invariant (specs/README.md).                                            *)
(***************************************************************************)
EXTENDS Naturals, Integers, FiniteSets

CONSTANTS
    Brokers,          \* node ids (a symmetry set in the model)
    Partitions,       \* partitions (topic and index)
    Streams,          \* stream ids
    NoBroker,         \* the leader of a partition when no broker is live (Kafka's -1)
    NoPartition,      \* the partition of a stream not created yet
    MaxNodeEpoch,     \* node epochs are -1 (never registered) .. MaxNodeEpoch
    MaxLeaderEpoch,   \* leader epochs are -1 (not created) .. MaxLeaderEpoch
    \* Switches for mutation models; all TRUE in the real spec.
    CheckLiveTarget,  \* a partition moves (or is created) only onto a live broker
    CheckAssignee,    \* a stream opens only on its partition's broker, at its leader epoch
    CheckSiblings,    \* ... and only while no other stream of it is open on another broker
    BumpLeaderEpoch   \* every move raises the partition's leader epoch

ASSUME
    /\ Brokers # {} /\ NoBroker \notin Brokers /\ NoPartition \notin Partitions
    /\ MaxNodeEpoch \in Nat /\ MaxLeaderEpoch \in Nat
    /\ {CheckLiveTarget, CheckAssignee, CheckSiblings, BumpLeaderEpoch} \subseteq BOOLEAN

NodeEpochs == -1..MaxNodeEpoch
LeaderEpochs == -1..MaxLeaderEpoch
StreamStates == {"NONE", "CLOSED", "OPENED"}   \* NONE: not created yet

VARIABLES
    nodeEpoch,        \* NodeWALMetadataRecord.nodeEpoch (-1: never registered)
    regEpoch,         \* RegisterBrokerRecord.nodeEpoch of the standing registration (-1: none)
    fenced,           \* BrokerRegistrationChangeRecord.fenced
    shutdown,         \* BrokerRegistrationChangeRecord.inControlledShutdown
    leader,           \* PartitionRecord/PartitionChangeRecord.leader
    leaderEpoch,      \* ... .leaderEpoch (-1: the partition is not created)
    streamPartition,  \* the stream's tags (S3StreamRecord)
    streamState,      \* S3StreamRecord.state ("NONE" before it is created)
    streamEpoch,      \* S3StreamRecord.epoch (-1 until opened)
    owner,            \* the current range's node (NoBroker until opened)
    openers,          \* history: [p, e, b] for every accepted open
    strayOpen         \* history: an open was accepted from another than the partition's
                      \* broker at its leader epoch

brokerVars == <<nodeEpoch, regEpoch, fenced, shutdown>>
partitionVars == <<leader, leaderEpoch>>
streamVars == <<streamPartition, streamState, streamEpoch, owner>>
historyVars == <<openers, strayOpen>>
vars == <<brokerVars, partitionVars, streamVars, historyVars>>

-----------------------------------------------------------------------------
(* Helpers *)

Registered(b) == regEpoch[b] >= 0
\* The registration is the node's current incarnation's: its node epoch was not bumped since
\* (by a lapsed session), so the broker may still heartbeat and shut down under it.
Current(b) == Registered(b) /\ regEpoch[b] = nodeEpoch[b]
\* Registered, unfenced, not shutting down: the brokers partitions may live on.
Live == {b \in Brokers : Registered(b) /\ ~fenced[b] /\ ~shutdown[b]}
\* In controlled shutdown: their partitions stay on them until a batch moves them.
Draining == {b \in Brokers : shutdown[b]}
Created == {p \in Partitions : leaderEpoch[p] >= 0}
StreamsOf(p) == {s \in Streams : streamPartition[s] = p}
OpenStreamsOf(p) == {s \in StreamsOf(p) : streamState[s] = "OPENED"}

\* Where the controller may put a partition (the mutation: anywhere).
Targets(L) == IF CheckLiveTarget THEN L ELSE Brokers

NewEpoch(p) == IF BumpLeaderEpoch THEN leaderEpoch[p] + 1 ELSE leaderEpoch[p]

\* The moves are written as constraints on leader' (which partitions may go where), not as a
\* choice of targets: TLC enumerates the (few) functions of the model, and a trace, which
\* observes leader' first, is checked instead of enumerated (trace_validate.py's observe_first).

\* Partitions that changed broker in this step.
Moved == {p \in Partitions : leader'[p] # leader[p]}

\* leader' may send each partition p to a broker of Dest(p) (or keep it where it is if Dest(p)
\* contains its broker); the moved ones get their next leader epoch.
MoveWithin(Dest(_)) ==
    /\ leader' \in [Partitions -> Brokers \cup {NoBroker}]
    /\ \A p \in Partitions : leader'[p] \in Dest(p)
    /\ \A p \in Moved : NewEpoch(p) <= MaxLeaderEpoch
    /\ leaderEpoch' = [p \in Partitions |-> IF p \in Moved THEN NewEpoch(p) ELSE leaderEpoch[p]]

\* With L the live brokers and D the draining ones after a step: the created partitions that
\* are on none of them (and are not already without a broker while none is live).
Stranded(L, D) ==
    {p \in Created : leader[p] \notin L \cup D /\ ~(L = {} /\ leader[p] = NoBroker)}

\* Where a stranded partition may go: a live broker, or none if none is live.
StrandedTargets(L) == IF L = {} /\ CheckLiveTarget THEN {NoBroker} ELSE Targets(L)

\* Brokers left (L and D are the live and draining sets after the step): the stranded
\* partitions move to live brokers (or to none if none is live); any partitions of the
\* draining brokers may move the same way (a batch: placement.drain picks which) or stay; no
\* other partition moves.
Rehome(L, D) ==
    MoveWithin(LAMBDA p :
        IF p \in Stranded(L, D) THEN StrandedTargets(L)
        ELSE IF p \in Created /\ leader[p] \in D THEN StrandedTargets(L) \cup {leader[p]}
        ELSE {leader[p]})

\* Broker j joined (L is the live set after the step, j in it): the stranded partitions move
\* to live brokers, and any partitions of the others may move to j (its share).
Join(L, j) ==
    MoveWithin(LAMBDA p :
        IF p \in Stranded(L, Draining) THEN StrandedTargets(L)
        ELSE IF p \in Created /\ leader[p] \in L \ {j} THEN {leader[p], j}
        ELSE {leader[p]})

-----------------------------------------------------------------------------
(* Controller checks: each returns an error name (Kafka's or AutoMQ's) or "NONE". *)

OpenStreamError(b, s, e) ==
    LET p == streamPartition[s] IN
    IF streamState[s] = "NONE" THEN "STREAM_NOT_EXIST"
    ELSE IF CheckAssignee /\ leader[p] # b THEN "NOT_LEADER_OR_FOLLOWER"
    ELSE IF CheckAssignee /\ e < leaderEpoch[p] THEN "FENCED_LEADER_EPOCH"
    ELSE IF CheckAssignee /\ e > leaderEpoch[p] THEN "UNKNOWN_LEADER_EPOCH"
    ELSE IF CheckSiblings /\ \E t \in OpenStreamsOf(p) \ {s} : owner[t] # b
        THEN "STREAM_NOT_CLOSED"
    ELSE IF streamEpoch[s] > e THEN "STREAM_FENCED"
    ELSE IF streamEpoch[s] = e THEN IF owner[s] = b THEN "NONE" ELSE "STREAM_FENCED"
    ELSE IF streamState[s] = "OPENED" THEN "STREAM_NOT_CLOSED"
    ELSE "NONE"

CreateStreamError(b, p) ==
    IF p \notin Created THEN "UNKNOWN_TOPIC_OR_PARTITION"
    ELSE IF leader[p] # b THEN "NOT_LEADER_OR_FOLLOWER"
    ELSE "NONE"

-----------------------------------------------------------------------------
(* Initial state: no broker, no partition, no stream. *)

Init ==
    /\ nodeEpoch = [b \in Brokers |-> -1]
    /\ regEpoch = [b \in Brokers |-> -1]
    /\ fenced = [b \in Brokers |-> TRUE]
    /\ shutdown = [b \in Brokers |-> FALSE]
    /\ leader = [p \in Partitions |-> NoBroker]
    /\ leaderEpoch = [p \in Partitions |-> -1]
    /\ streamPartition = [s \in Streams |-> NoPartition]
    /\ streamState = [s \in Streams |-> "NONE"]
    /\ streamEpoch = [s \in Streams |-> -1]
    /\ owner = [s \in Streams |-> NoBroker]
    /\ openers = {}
    /\ strayOpen = FALSE

-----------------------------------------------------------------------------
(* Actions *)

\* ACTION: RegisterNode(b) mirrors a broker's registration (getOpeningStreams and KRaft's
\* BrokerRegistration): a node epoch above the stored one, the broker fenced; what its
\* previous incarnation held moves to live brokers.  Never refused.
RegisterNode(b) ==
    /\ \E e \in (nodeEpoch[b] + 1)..MaxNodeEpoch :
        /\ nodeEpoch' = [nodeEpoch EXCEPT ![b] = e]
        /\ regEpoch' = [regEpoch EXCEPT ![b] = e]
    /\ fenced' = [fenced EXCEPT ![b] = TRUE]
    /\ shutdown' = [shutdown EXCEPT ![b] = FALSE]
    /\ Rehome(Live \ {b}, Draining \ {b})
    /\ UNCHANGED <<streamVars, historyVars>>

\* ACTION: BrokerHeartbeat(b) mirrors the first heartbeat of a registered broker: it is
\* unfenced and joins (partitions without a broker come to live brokers, and it takes a
\* share).  Errors: NODE_EPOCH_EXPIRED (another epoch than its registration's, or a
\* registration whose session lapsed), NODE_EPOCH_NOT_EXIST (stutters); a heartbeat of a live
\* broker only renews its session (a stutter here).
BrokerHeartbeat(b) ==
    /\ Current(b) /\ fenced[b] /\ ~shutdown[b]
    /\ fenced' = [fenced EXCEPT ![b] = FALSE]
    /\ Join(Live \cup {b}, b)
    /\ UNCHANGED <<nodeEpoch, regEpoch, shutdown, streamVars, historyVars>>

\* ACTION: ExpireSessions(S) mirrors the controller's session check, once a second: the live
\* brokers S, whose sessions lapsed, are fenced and their node epochs bumped; their partitions
\* move; and the next batch leaves each broker in controlled shutdown (S may then be empty).
ExpireSessions(S) ==
    /\ (S # {} \/ Draining # {}) /\ S \subseteq Live
    /\ \A b \in S : nodeEpoch[b] < MaxNodeEpoch
    /\ nodeEpoch' = [b \in Brokers |-> IF b \in S THEN nodeEpoch[b] + 1 ELSE nodeEpoch[b]]
    /\ fenced' = [b \in Brokers |-> b \in S \/ fenced[b]]
    /\ Rehome(Live \ S, Draining)
    /\ UNCHANGED <<regEpoch, shutdown, streamVars, historyVars>>

\* ACTION: ControlledShutdown(b) mirrors a stopping broker's request: fenced, the first batch
\* of its partitions moves now, the rest at the next ExpireSessions ticks; it keeps its node
\* epoch to close its streams.
ControlledShutdown(b) ==
    /\ Current(b) /\ ~shutdown[b]
    /\ fenced' = [fenced EXCEPT ![b] = TRUE]
    /\ shutdown' = [shutdown EXCEPT ![b] = TRUE]
    /\ Rehome(Live \ {b}, Draining \cup {b})
    /\ UNCHANGED <<nodeEpoch, regEpoch, streamVars, historyVars>>

\* ACTION: UnregisterBroker(b) mirrors Kafka's UnregisterBroker: refused (STREAM_NOT_CLOSED)
\* while the broker holds a stream open; its node epoch is bumped, its partitions move.
UnregisterBroker(b) ==
    /\ Registered(b)
    /\ ~\E s \in Streams : streamState[s] = "OPENED" /\ owner[s] = b
    /\ nodeEpoch[b] < MaxNodeEpoch
    /\ nodeEpoch' = [nodeEpoch EXCEPT ![b] = @ + 1]
    /\ regEpoch' = [regEpoch EXCEPT ![b] = -1]
    /\ fenced' = [fenced EXCEPT ![b] = TRUE]
    /\ shutdown' = [shutdown EXCEPT ![b] = FALSE]
    /\ Rehome(Live \ {b}, Draining \ {b})
    /\ UNCHANGED <<streamVars, historyVars>>

\* ACTION: CreateTopic mirrors CreateTopics (and CreatePartitions): new partitions, each on a
\* live broker at leader epoch 0.  Errors: INVALID_REPLICATION_FACTOR (no live broker),
\* INVALID_REPLICA_ASSIGNMENT (a broker given by hand is not live), KEY_EXIST.
CreateTopic ==
    /\ Live # {}
    /\ leaderEpoch' \in [Partitions -> LeaderEpochs]
    /\ \A p \in Partitions :
        leaderEpoch'[p] = leaderEpoch[p] \/ (p \notin Created /\ leaderEpoch'[p] = 0)
    /\ leaderEpoch' # leaderEpoch
    /\ leader' \in [Partitions -> Brokers \cup {NoBroker}]
    /\ \A p \in Partitions :
        IF leaderEpoch'[p] # leaderEpoch[p] THEN leader'[p] \in Targets(Live)
        ELSE leader'[p] = leader[p]
    /\ UNCHANGED <<brokerVars, streamVars, historyVars>>

\* ACTION: ReassignPartition(p, b) mirrors AlterPartitionReassignments of one partition.
\* Errors: UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT (b is not live).
ReassignPartition(p, b) ==
    /\ p \in Created /\ b \in Targets(Live) /\ b # leader[p]
    /\ MoveWithin(LAMBDA x : IF x = p THEN {b} ELSE {leader[x]})
    /\ UNCHANGED <<brokerVars, streamVars, historyVars>>

\* ACTION: BalancePartitions mirrors a round of the autobalancer: some partitions on live
\* brokers move to other live brokers.
BalancePartitions ==
    /\ MoveWithin(LAMBDA p :
           IF p \in Created /\ leader[p] \in Live THEN Targets(Live) \cup {leader[p]}
           ELSE {leader[p]})
    /\ Moved # {}
    /\ UNCHANGED <<brokerVars, streamVars, historyVars>>

\* ACTION: CreateStream(b, s, p) mirrors createStream with the partition's tags, by the
\* partition's broker.
CreateStream(b, s, p) ==
    /\ streamState[s] = "NONE"
    /\ nodeEpoch[b] >= 0
    /\ CreateStreamError(b, p) = "NONE"
    /\ streamState' = [streamState EXCEPT ![s] = "CLOSED"]
    /\ streamPartition' = [streamPartition EXCEPT ![s] = p]
    /\ UNCHANGED <<brokerVars, partitionVars, streamEpoch, owner, historyVars>>

\* ACTION: OpenStream(b, s, e) mirrors openStream of a partition's stream at epoch e.
\* Errors: OpenStreamError.  A retried open of an OPENED stream by its owner is a no-op.
OpenStream(b, s, e) ==
    /\ nodeEpoch[b] >= 0
    /\ OpenStreamError(b, s, e) = "NONE"
    /\ ~(streamState[s] = "OPENED" /\ streamEpoch[s] = e /\ owner[s] = b)
    /\ streamState' = [streamState EXCEPT ![s] = "OPENED"]
    /\ streamEpoch' = [streamEpoch EXCEPT ![s] = e]
    /\ owner' = [owner EXCEPT ![s] = b]
    /\ openers' = openers \cup {[p |-> streamPartition[s], e |-> e, b |-> b]}
    /\ strayOpen' =
        (strayOpen \/ b # leader[streamPartition[s]] \/ e # leaderEpoch[streamPartition[s]])
    /\ UNCHANGED <<brokerVars, partitionVars, streamPartition>>

\* ACTION: CloseStream(b, s) mirrors closeStream by the stream's owner (itself, or failover
\* acting as it), after it uploaded what its WAL held for the stream.
CloseStream(b, s) ==
    /\ streamState[s] = "OPENED" /\ owner[s] = b
    /\ streamState' = [streamState EXCEPT ![s] = "CLOSED"]
    /\ UNCHANGED <<brokerVars, partitionVars, streamPartition, streamEpoch, owner, historyVars>>

Next ==
    \/ \E b \in Brokers : RegisterNode(b)
    \/ \E b \in Brokers : BrokerHeartbeat(b)
    \/ \E S \in SUBSET Brokers : ExpireSessions(S)
    \/ \E b \in Brokers : ControlledShutdown(b)
    \/ \E b \in Brokers : UnregisterBroker(b)
    \/ CreateTopic
    \/ \E p \in Partitions, b \in Brokers : ReassignPartition(p, b)
    \/ BalancePartitions
    \/ \E b \in Brokers, s \in Streams, p \in Partitions : CreateStream(b, s, p)
    \/ \E b \in Brokers, s \in Streams, e \in 0..MaxLeaderEpoch : OpenStream(b, s, e)
    \/ \E b \in Brokers, s \in Streams : CloseStream(b, s)

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
(* Invariants (the Python machine has inv_<snake_case> for each, or checks it between *)
(* steps: OpenOnlyByAssignee).                                                        *)

TypeOK ==
    /\ nodeEpoch \in [Brokers -> NodeEpochs]
    /\ regEpoch \in [Brokers -> NodeEpochs]
    /\ fenced \in [Brokers -> BOOLEAN]
    /\ shutdown \in [Brokers -> BOOLEAN]
    /\ leader \in [Partitions -> Brokers \cup {NoBroker}]
    /\ leaderEpoch \in [Partitions -> LeaderEpochs]
    /\ streamPartition \in [Streams -> Partitions \cup {NoPartition}]
    /\ streamState \in [Streams -> StreamStates]
    /\ streamEpoch \in [Streams -> LeaderEpochs]
    /\ owner \in [Streams -> Brokers \cup {NoBroker}]
    /\ openers \subseteq [p : Partitions, e : 0..MaxLeaderEpoch, b : Brokers]
    /\ strayOpen \in BOOLEAN

\* Once the controller has acted, no partition is on a broker that is not live: each is on a
\* live broker, or on one draining in a controlled shutdown (until its batch), or on none when
\* no broker is live.
PartitionsOnLiveBrokers ==
    \A p \in Created :
        leader[p] \in Live \cup Draining \/ (leader[p] = NoBroker /\ Live = {})

\* A partition's open streams are all on one broker; one open at the partition's leader epoch
\* is on the partition's broker; none is at a higher epoch.  So the streams are open only on
\* the partition's broker, or on the one it is moving from until that one closes them.
OneOwnerPerPartition ==
    \A p \in Created :
        /\ Cardinality({owner[s] : s \in OpenStreamsOf(p)}) <= 1
        /\ \A s \in StreamsOf(p) :
              /\ streamEpoch[s] <= leaderEpoch[p]
              /\ (streamState[s] = "OPENED" /\ streamEpoch[s] = leaderEpoch[p])
                    => owner[s] = leader[p]

\* Two brokers never opened a partition at the same epoch: at most one open owner per stream
\* epoch.
SingleOpenerPerEpoch ==
    \A o1, o2 \in openers : (o1.p = o2.p /\ o1.e = o2.e) => o1.b = o2.b

\* Every open was by the partition's broker, at its leader epoch at the time.
OpenOnlyByAssignee == ~strayOpen

=============================================================================
