--------------------------- MODULE StreamMetadata ---------------------------
(***************************************************************************)
(* The AutoMQ controller's stream metadata: who may write a stream, which  *)
(* objects hold which offsets, and when an object may be destroyed.        *)
(*                                                                         *)
(* Machine: automq_ref/state_machines/stream_metadata/.  Properties:      *)
(* tests/properties/test_stream_metadata.py::StreamMetadataMachine.        *)
(* Sources: AutoMQ's controller metadata at AutoMQ/automq f1ce98e: object  *)
(* ids and their expiry, the metadata records, the node epoch check, the   *)
(* stream requests, the KV store and the object lookup                     *)
(* (StreamControlManager.java, S3ObjectControlManager.java,                *)
(* S3StreamsMetadataImage.java); docs/machines/stream_metadata.md lists    *)
(* every request and its errors.                                           *)
(*                                                                         *)
(* WHAT IS MODELLED.  One controller applies requests one at a time; every *)
(* request is atomic, as a KRaft controller write is.  The requests come   *)
(* from nodes that may act on old beliefs: any node may send any request   *)
(* at any time with any node epoch it has held (a zombie of an older       *)
(* incarnation) and any stream epoch it was ever granted for that stream   *)
(* (a stale belief); opens may carry any epoch (KRaft picks leader         *)
(* epochs).  That nondeterminism IS the environment: the spec has no       *)
(* broker state, no WAL, no network and no clock.                          *)
(* The controller's answers come from the error operators (OpenStreamError *)
(* and so on), one per request, which return the AutoMQ error name or      *)
(* "NONE"; an action is enabled exactly when a node could send its request *)
(* and the request would succeed AND change something.  A rejected request *)
(* (STREAM_FENCED, OFFSET_NOT_MATCHED, ...)                                *)
(* or a success that writes no record (retried close, REDUNDANT_OPERATION  *)
(* commit) is a stutter step, which every TLA+ spec allows; the error      *)
(* operators are kept so that a trace of the Python machine can be checked *)
(* against them.                                                           *)
(*                                                                         *)
(* Streams: created CLOSED with epoch -1 and no range (AutoMQ's INIT_EPOCH *)
(* and INIT_RANGE_INDEX); opened with a higher epoch, which seals the      *)
(* current range at the stream's end offset and starts a new range there,  *)
(* owned by the opener; closed; trimmed (also past the end); deleted.      *)
(* Objects: ids handed out in order, PREPARED, then COMMITTED by a stream  *)
(* set object commit (a WAL upload, or the output of a compaction) or a    *)
(* stream object commit (compaction), or MARK_DESTROYED when their TTL     *)
(* passes or a compaction replaces them, then REMOVED after the            *)
(* retention.  Nodes: a node epoch per node (a restart is                  *)
(* granted a higher one), and a failover mode set when a survivor takes    *)
(* the node over.                                                          *)
(*                                                                         *)
(* WHAT IS ABSTRACTED AWAY, AND WHY.                                       *)
(* - Fast close and historical WAL responsibilities                        *)
(*   (NodeWALUncommittedOffsetsRecord, PR #3495): feature-gated, and the   *)
(*   classic close is what the reference implements first.  The client's   *)
(*   force-upload before a classic close is modelled by letting commits    *)
(*   happen at any time before the close.                                  *)
(* - Huge-cluster mode (SSO records without ranges, S3StreamEndOffsets):   *)
(*   an encoding choice; the spec keeps the ranges in the record.          *)
(* - A stream set object holds ONE stream range here (AutoMQ: many, one    *)
(*   per stream). The controller checks each range of a commit             *)
(*   independently and applies them atomically, so one range per object    *)
(*   loses only the "several streams in one object" bookkeeping. Stream    *)
(*   objects split off at upload time are not modelled separately: an      *)
(*   upload is always a stream set object here. A compaction's new stream  *)
(*   set object holds one run too; the models have one stream, where       *)
(*   AutoMQ's would hold one range as well, and letting an output hold a   *)
(*   set of runs would make TLC enumerate sets of runs for every request,  *)
(*   beyond the models' time budget.                                       *)
(* - Compaction, in two requests. CommitStreamObject (commitStreamObject)  *)
(*   merges the stream objects holding [start, end) of one stream into one *)
(*   stream object; its sources are the stream objects the controller      *)
(*   holds for that interval (that compactor's view is never stale here);  *)
(*   its pure cleanup (objectId -1) is left out.                           *)
(*   CommitStreamSetObjectCompaction (commitStreamSetObject naming         *)
(*   compactedObjectIds) replaces stream set objects of one node by at     *)
(*   most one new stream set object (the merged run) and at most one       *)
(*   stream object (a split run), or by nothing: the pure cleanup          *)
(*   (objectId -1) of sources that held only a deleted stream's data or    *)
(*   data below the start. The request may name any sources and outputs (a *)
(*   stale compactor names objects already gone, a confused one another    *)
(*   node's, or outputs that lose a run); the controller refuses sources   *)
(*   that are not COMMITTED stream set objects of the node                 *)
(*   (COMPACTED_OBJECTS_NOT_FOUND) and outputs that do not hold exactly    *)
(*   the sources' live offsets (OFFSET_NOT_MATCHED), as the Python machine *)
(*   does. AutoMQ's controller trusts the compactor for the second         *)
(*   (MCStreamMetadataNoCoverageCheck.cfg shows what that trust must       *)
(*   cover). Compaction requests are never in failover mode.               *)
(* - OrderIds, dataTime and attributes. The new stream set object takes    *)
(*   the smallest orderId and dataTime of its sources (the Python machine  *)
(*   does; its property test checks it), so that AutoMQ's lookup, which    *)
(*   scans the range owner's objects in orderId order, meets a stream's    *)
(*   offsets in order. The spec has no such lookup (nor has the Python     *)
(*   machine: get_objects walks every candidate), so no invariant here     *)
(*   reads orderIds; stating one would also need nodes that commit their   *)
(*   uploads in object-id order, which the environment here (any node      *)
(*   commits any prepared object) does not promise.                        *)
(* - Time: TTLs and retention are "may happen at any time" (ExpireObject   *)
(*   any time before commit, RemoveObject any time after destroy).         *)
(* - The KV store (putKV/deleteKV, with put-if-absent, compare-and-set     *)
(*   and compare-and-delete) and the producer-id blocks kept in it         *)
(*   (AllocateProducerIds): a map that no invariant here reads; the Python *)
(*   machine has it, the spec does not.                                    *)
(* - Brokers (registration, sessions, fencing by session) and where each   *)
(*   partition lives, with the partition guards on opening a tagged        *)
(*   stream: Placement.tla.  Here RegisterNode only grants the node epoch  *)
(*   and the streams carry no tags.                                        *)
(* - Byte sizes, object keys, buckets, tags, locked nodes (NODE_LOCKED),   *)
(*   unknown nodes (NODE_EPOCH_NOT_EXIST: every node is registered at      *)
(*   epoch 0 initially), and replay order of metadata records (the spec    *)
(*   applies a request's records atomically, as the controller does).      *)
(*                                                                         *)
(* MODELLING CHOICES THAT DIFFER FROM AUTOMQ (documented in specs/README). *)
(* - A commit range carries the stream epoch the node believed it wrote    *)
(*   under, and the controller checks it (CheckStreamEpoch).  AutoMQ's     *)
(*   commitStreamSetObject only compares the current range's owner node    *)
(*   and relies on the client pipeline (force upload before close, halt on *)
(*   commit failure) for the rest.                                         *)
(* - The current range's end is kept equal to the stream's end offset on   *)
(*   every commit.  AutoMQ stores it lazily (sealed at the next open) and  *)
(*   reads the current range's end as the stream's end offset.             *)
(* - On open, ranges that no lookup needs are dropped as in the Python     *)
(*   machine: empty ones (the just-sealed range included) and those below  *)
(*   the prefix of stream objects contiguous from the stream's start.      *)
(*   AutoMQ's checkRemovableRanges never drops the just-sealed range and   *)
(*   measures the prefix from the first stream object, not from the start. *)
(* - PrepareObject and DeleteStream make no node check (AutoMQ's           *)
(*   prepareObject and deleteStream make none); CreateStream does.         *)
(*                                                                         *)
(* BOUNDS AND SWITCHES.  Node, stream and object sets, epochs and offsets  *)
(* are small constants; MaxPerturbedNodes bounds how many nodes ever       *)
(* restart or get failed over ("one crash").  The Check* / TrimMovesEnd    *)
(* constants are TRUE in the real spec; each mutation model sets one to    *)
(* FALSE and must make TLC report a named invariant (specs/README.md).     *)
(***************************************************************************)
EXTENDS Naturals, Integers, FiniteSets

CONSTANTS
    Nodes,            \* node ids (a symmetry set in the model)
    Streams,          \* stream ids, handed out in order: 0..k-1
    Objects,          \* object ids, handed out in order: 0..k-1
    MaxNodeEpoch,     \* node epochs are 0..MaxNodeEpoch (one restart per unit)
    MaxStreamEpoch,   \* stream epochs a request may carry: 0..MaxStreamEpoch
    MaxOffset,        \* offsets are 0..MaxOffset
    MaxPerturbedNodes, \* how many nodes may ever restart or be failed over
    \* Switches for mutation models; all TRUE in the real spec.
    CheckRangeOwner,  \* a stream set object commit must come from the current range's owner
    CheckStreamEpoch, \* ... and carry the stream's current epoch (a spec addition, see README)
    CheckObjectState, \* a commit refuses an object that is not PREPARED
    CheckContinuity,  \* a commit must start exactly at the stream's end offset
    CheckOpenFence,   \* open refuses a stream epoch below the stored one
    CheckExpireState, \* the TTL task expires an object only while it is still PREPARED
    TrimMovesEnd,     \* a trim past the end moves the current range's and stream's end
    CheckCompactedObjects,   \* a compaction's sources must be the requester's committed SSOs
    CheckCompactionCoverage  \* ... and its outputs hold exactly their live offsets

ASSUME
    /\ Nodes # {}
    /\ Streams = 0..(Cardinality(Streams) - 1)
    /\ Objects = 0..(Cardinality(Objects) - 1)
    /\ MaxNodeEpoch \in Nat /\ MaxStreamEpoch \in Nat /\ MaxOffset \in Nat \ {0}
    /\ MaxPerturbedNodes \in Nat
    /\ {CheckRangeOwner, CheckStreamEpoch, CheckObjectState, CheckContinuity, CheckOpenFence,
        CheckExpireState, TrimMovesEnd, CheckCompactedObjects, CheckCompactionCoverage}
           \subseteq BOOLEAN

NoEpoch == -1          \* the epoch of a stream that was never opened
NoRange == -1          \* its range index
AnyStreamEpoch == -1   \* a compaction request that claims no stream epoch (AutoMQ sends -1)
NoObject == -1         \* objectId -1: a compaction that writes no new stream set object
NodeEpochs == 0..MaxNodeEpoch
StreamEpochs == 0..MaxStreamEpoch
Offsets == 0..MaxOffset

StreamStates == {"NONE", "CLOSED", "OPENED", "DELETED"}   \* NONE/DELETED: not in the map
ObjectStates == {"NONE", "PREPARED", "COMMITTED", "MARK_DESTROYED", "REMOVED"}

\* A range of a stream: [start, end) written by `node` while it held stream epoch `epoch`.
RangeRecords == [index : StreamEpochs, epoch : StreamEpochs, node : Nodes,
                 start : Offsets, end : Offsets]
\* S3StreamSetObjectRecord (one range) and S3StreamObjectRecord.
SsoRecords == [object : Objects, node : Nodes, stream : Streams, start : Offsets, end : Offsets]
SoRecords == [object : Objects, stream : Streams, start : Offsets, end : Offsets]
\* History: every accepted stream set object commit that extended a live stream.
CommitRecords == [object : Objects, stream : Streams, start : Offsets, end : Offsets,
                  node : Nodes, streamEpoch : StreamEpochs, failover : BOOLEAN]
\* History: every range ever granted by an open.
GrantRecords == [stream : Streams, epoch : StreamEpochs, node : Nodes]

VARIABLES
    nodeEpoch,        \* NodeWALMetadataRecord.nodeEpoch per node
    failoverMode,     \* NodeWALMetadataRecord.failoverMode per node
    nextStreamId,     \* AssignedStreamIdRecord + 1
    streamState,      \* "NONE" | "CLOSED" | "OPENED" | "DELETED"
    streamEpoch,      \* S3StreamRecord.epoch (NoEpoch until the first open)
    rangeIndex,       \* S3StreamRecord.rangeIndex (NoRange until the first open)
    streamStart,      \* S3StreamRecord.startOffset (only grows)
    streamEnd,        \* the stream's end offset (only grows)
    ranges,           \* the retained RangeRecords of each stream
    nextObjectId,     \* AssignedS3ObjectIdRecord + 1
    objectState,      \* S3ObjectRecord.state; "REMOVED" after RemoveS3ObjectRecord
    streamSetObjects, \* S3StreamSetObjectRecords
    streamObjects,    \* S3StreamObjectRecords
    grants,           \* history: ranges granted by opens
    commits,          \* history: accepted stream set object commits
    expired           \* history: objects destroyed because their TTL passed

nodeVars == <<nodeEpoch, failoverMode>>
streamVars ==
    <<nextStreamId, streamState, streamEpoch, rangeIndex, streamStart, streamEnd, ranges>>
objectVars == <<nextObjectId, objectState, streamSetObjects, streamObjects>>
historyVars == <<grants, commits, expired>>
vars == <<nodeVars, streamVars, objectVars, historyVars>>

-----------------------------------------------------------------------------
(* Helpers *)

Max(a, b) == IF a >= b THEN a ELSE b
Min(a, b) == IF a <= b THEN a ELSE b

Live(s) == streamState[s] \in {"CLOSED", "OPENED"}
CurrentRanges(s) == {r \in ranges[s] : r.index = rangeIndex[s]}
HasCurrentRange(s) == CurrentRanges(s) # {}
CurrentRange(s) == CHOOSE r \in CurrentRanges(s) : TRUE

\* The data objects of a stream, stream set objects and stream objects alike.
DataRefs(s) ==
    {[object |-> r.object, start |-> r.start, end |-> r.end] :
        r \in {x \in streamSetObjects : x.stream = s}}
    \cup {[object |-> r.object, start |-> r.start, end |-> r.end] :
        r \in {x \in streamObjects : x.stream = s}}

\* The end of the run of stream objects that is contiguous from offset x.
RECURSIVE CoveredFrom(_, _)
CoveredFrom(s, x) ==
    LET covering == {r \in streamObjects : r.stream = s /\ r.start <= x /\ x < r.end}
    IN IF covering = {} THEN x ELSE CoveredFrom(s, (CHOOSE r \in covering : TRUE).end)

\* The environment.  A request carries a node epoch the node has held (an old one comes from a
\* zombie of an earlier incarnation) and, except for OpenStream, a stream epoch the node was
\* granted for that stream at some time (an old one is a stale belief).  OpenStream may carry
\* any epoch: a new partition leader epoch comes from KRaft, not from the node.
HeldEpochs(n, s) == {g.epoch : g \in {x \in grants : x.node = n /\ x.stream = s}}
HeldNodeEpoch(n, e) == e <= nodeEpoch[n]
HeldStreamEpoch(n, s, se) == se \in HeldEpochs(n, s)

\* The object states a commit accepts.
CommittableStates == IF CheckObjectState THEN {"PREPARED"} ELSE {"PREPARED", "MARK_DESTROYED"}

\* The nodes that ever restarted or were failed over, if n is one of them next.
Perturbed(n) == {m \in Nodes : nodeEpoch[m] > 0 \/ failoverMode[m]} \cup {n}

\* The current range with its end moved to `newEnd`.
ExtendCurrent(s, newEnd) ==
    {IF r.index = rangeIndex[s] THEN [r EXCEPT !.end = newEnd] ELSE r : r \in ranges[s]}

-----------------------------------------------------------------------------
(* Controller checks: each returns an AutoMQ error name or "NONE" (StreamControlManager). *)

\* nodeEpochCheck: a request from an older incarnation is expired; a node taken over by
\* failover is fenced unless the check is skipped (closeStream, failover-mode commits).
NodeCheck(n, e, checkFailover) ==
    IF e < nodeEpoch[n] THEN "NODE_EPOCH_EXPIRED"
    ELSE IF checkFailover /\ failoverMode[n] THEN "NODE_FENCED"
    ELSE "NONE"

\* streamOwnershipCheck (close, trim, compaction).
OwnershipCheck(n, s, se) ==
    IF ~Live(s) THEN "STREAM_NOT_EXIST"
    ELSE IF streamEpoch[s] > se THEN "STREAM_FENCED"
    ELSE IF streamEpoch[s] < se THEN "STREAM_INNER_ERROR"
    ELSE IF ~HasCurrentRange(s) THEN "STREAM_INNER_ERROR"
    ELSE IF CurrentRange(s).node # n THEN "STREAM_FENCED"
    ELSE "NONE"

\* S3ObjectControlManager.commitObject.
ObjectCommitCheck(o) ==
    IF objectState[o] = "COMMITTED" THEN "REDUNDANT_OPERATION"
    ELSE IF objectState[o] = "PREPARED" THEN "NONE"
    ELSE IF ~CheckObjectState /\ objectState[o] = "MARK_DESTROYED" THEN "NONE"
    ELSE "OBJECT_NOT_EXIST"

CreateStreamError(n, e) == NodeCheck(n, e, TRUE)

OpenStreamError(n, e, s, se) ==
    LET nc == NodeCheck(n, e, TRUE) IN
    IF nc # "NONE" THEN nc
    ELSE IF ~Live(s) THEN "STREAM_NOT_EXIST"
    ELSE IF CheckOpenFence /\ streamEpoch[s] > se THEN "STREAM_FENCED"
    ELSE IF streamEpoch[s] = se THEN
        \* A retried open: only by the owner of the current range.
        IF ~HasCurrentRange(s) THEN "STREAM_INNER_ERROR"
        ELSE IF CurrentRange(s).node # n THEN "STREAM_FENCED"
        ELSE "NONE"
    ELSE IF streamState[s] = "OPENED" THEN "STREAM_NOT_CLOSED"
    ELSE "NONE"

CloseStreamError(n, e, s, se) ==
    LET nc == NodeCheck(n, e, FALSE) IN
    IF nc # "NONE" THEN nc ELSE OwnershipCheck(n, s, se)

TrimStreamError(n, e, s, se, newStart) ==
    LET nc == NodeCheck(n, e, TRUE)
        oc == OwnershipCheck(n, s, se)
    IN IF nc # "NONE" THEN nc
       ELSE IF oc # "NONE" THEN oc
       ELSE IF streamState[s] = "CLOSED" THEN "STREAM_NOT_OPENED"
       ELSE IF newStart < streamStart[s] THEN "OFFSET_NOT_MATCHED"
       ELSE "NONE"

\* deleteStream: a missing stream is a success; an open one cannot be deleted.
DeleteStreamError(s) ==
    IF ~Live(s) THEN "NONE"
    ELSE IF streamState[s] = "OPENED" THEN "STREAM_NOT_CLOSED"
    ELSE "NONE"

\* verifyStreamContinuous for one range [start, end) of stream s: the last check of a
\* commitStreamSetObject that is not a compaction, in AutoMQ's StreamControlManager.
ContinuityCheck(n, s, se, start, end) ==
    IF ~Live(s) THEN "NONE"                         \* deleted meanwhile: accepted, moves nothing
    ELSE IF end <= streamStart[s] THEN "NONE"       \* wholly trimmed: accepted, moves nothing
    ELSE IF streamState[s] # "OPENED" THEN "STREAM_NOT_OPENED"
    ELSE IF ~HasCurrentRange(s) THEN "STREAM_INNER_ERROR"
    ELSE IF CheckRangeOwner /\ CurrentRange(s).node # n THEN "STREAM_FENCED"
    ELSE IF CheckStreamEpoch /\ streamEpoch[s] # se THEN "STREAM_FENCED"
    ELSE IF ~CheckContinuity THEN "NONE"
    ELSE IF streamEnd[s] > streamStart[s]
        THEN IF start = streamEnd[s] THEN "NONE" ELSE "OFFSET_NOT_MATCHED"
        \* Trimmed up to its end: a range from at or below the start fits.
        ELSE IF start <= streamStart[s] THEN "NONE" ELSE "OFFSET_NOT_MATCHED"

CommitStreamSetObjectError(n, e, o, s, se, start, end, failover) ==
    LET nc == NodeCheck(n, e, ~failover)
        oc == ObjectCommitCheck(o)
    IN IF nc # "NONE" THEN nc
       ELSE IF oc # "NONE" THEN oc
       ELSE ContinuityCheck(n, s, se, start, end)

\* The objects a stream object compaction of [start, end) of stream s replaces: the stream's
\* stream objects inside the interval.  (Stream set objects are replaced by the compaction form
\* of commitStreamSetObject, CommitStreamSetObjectCompaction.)
CompactionSources(s, start, end) ==
    {[object |-> r.object, start |-> r.start, end |-> r.end] :
        r \in {x \in streamObjects : x.stream = s /\ start <= x.start /\ x.end <= end}}

\* The sources tile [start, end): every offset lies in exactly one of them.  A compactor only
\* asks for such a merge; AutoMQ's controller trusts it to (the spec makes it a precondition).
WellFormedCompaction(s, start, end) ==
    LET sources == CompactionSources(s, start, end) IN
    /\ sources # {}
    /\ \A x \in start..(end - 1) : Cardinality({r \in sources : r.start <= x /\ x < r.end}) = 1

CommitStreamObjectError(n, e, o, s, se, start, end) ==
    LET nc == NodeCheck(n, e, TRUE)
        oc == IF se = AnyStreamEpoch THEN "NONE" ELSE OwnershipCheck(n, s, se)
        cc == ObjectCommitCheck(o)
    IN IF nc # "NONE" THEN nc
       ELSE IF ~Live(s) THEN "STREAM_NOT_EXIST"
       ELSE IF oc # "NONE" THEN oc
       ELSE IF cc # "NONE" THEN cc
       ELSE IF \E r \in CompactionSources(s, start, end) : objectState[r.object] # "COMMITTED"
            THEN "COMPACTED_OBJECTS_NOT_FOUND"
       ELSE "NONE"

\* The compaction form of commitStreamSetObject.  The request names the stream set objects it
\* replaces (compactedObjectIds) and its outputs: at most one new stream set object o holding
\* one run (streamRanges) and at most one stream object so holding one run (streamObjects);
\* NoObject for an absent output, both absent for a pure cleanup.  A run is [start, end) of a
\* stream; NoRun stands in for the run of an absent output.
Runs == {r \in [stream : Streams, start : Offsets, end : Offsets] : r.start < r.end}
NoRun == [stream |-> -1, start |-> 0, end |-> 0]

\* The runs an output object may be given: any run of a stream that was created (a compactor
\* only names streams it read from its sources, as an upload only names created streams).
OutputRuns(x) == IF x = NoObject THEN {NoRun} ELSE {r \in Runs : streamState[r.stream] # "NONE"}

Holds(r, t, x) == r.stream = t /\ r.start <= x /\ x < r.end
LiveOffset(t, x) == Live(t) /\ streamStart[t] <= x

\* The ids of n's stream set objects (its NodeRuntimeMetadata.streamSetObjects).
NodeSsoIds(n) == {r.object : r \in {x \in streamSetObjects : x.node = n}}

\* The records the controller finds for the sources: n's own (with CheckCompactedObjects =
\* FALSE, the mutation, any node's).
CompactionInputs(n, compacted) ==
    {r \in streamSetObjects : r.object \in compacted /\ (CheckCompactedObjects => r.node = n)}

\* Every source is a COMMITTED stream set object of n.
CompactedFound(n, compacted) ==
    \A x \in compacted : objectState[x] = "COMMITTED" /\ x \in NodeSsoIds(n)

\* The outputs hold exactly the live offsets of the inputs, each in one output: per live offset,
\* as many outputs hold it as inputs do (zero or one; committed objects never overlap).  Dead
\* offsets (a deleted stream's, or below the start) may be kept or dropped.
CoverageMatches(inputs, o, ssoRun, so, soRun) ==
    \A t \in Streams, x \in Offsets : LiveOffset(t, x) =>
        (IF o # NoObject /\ Holds(ssoRun, t, x) THEN 1 ELSE 0)
            + (IF so # NoObject /\ Holds(soRun, t, x) THEN 1 ELSE 0)
        = (IF \E r \in inputs : Holds(r, t, x) THEN 1 ELSE 0)

CommitStreamSetObjectCompactionError(n, e, compacted, o, ssoRun, so, soRun) ==
    LET nc == NodeCheck(n, e, TRUE)
        oc == IF o = NoObject THEN "NONE" ELSE ObjectCommitCheck(o)
        sc == IF so = NoObject THEN "NONE" ELSE ObjectCommitCheck(so)
    IN IF nc # "NONE" THEN nc
       ELSE IF oc # "NONE" THEN oc
       ELSE IF CheckCompactedObjects /\ ~CompactedFound(n, compacted)
            THEN "COMPACTED_OBJECTS_NOT_FOUND"
       ELSE IF CheckCompactionCoverage
               /\ ~CoverageMatches(CompactionInputs(n, compacted), o, ssoRun, so, soRun)
            THEN "OFFSET_NOT_MATCHED"
       ELSE sc

-----------------------------------------------------------------------------
(* Initial state: every node registered at epoch 0, nothing else. *)

Init ==
    /\ nodeEpoch = [n \in Nodes |-> 0]
    /\ failoverMode = [n \in Nodes |-> FALSE]
    /\ nextStreamId = 0
    /\ streamState = [s \in Streams |-> "NONE"]
    /\ streamEpoch = [s \in Streams |-> NoEpoch]
    /\ rangeIndex = [s \in Streams |-> NoRange]
    /\ streamStart = [s \in Streams |-> 0]
    /\ streamEnd = [s \in Streams |-> 0]
    /\ ranges = [s \in Streams |-> {}]
    /\ nextObjectId = 0
    /\ objectState = [o \in Objects |-> "NONE"]
    /\ streamSetObjects = {}
    /\ streamObjects = {}
    /\ grants = {}
    /\ commits = {}
    /\ expired = {}

-----------------------------------------------------------------------------
(* Actions *)

\* ACTION: RegisterNode(n) mirrors getOpeningStreams(nodeId, nodeEpoch, failoverMode=false)
\* at a broker's start.  The node proposes an epoch (its clock); the controller grants
\* Max(proposed, stored + 1), above every epoch it stored for n, writes
\* NodeWALMetadataRecord(n, granted, false) and answers the granted epoch, which the node uses
\* from then on.  Never refused: a clock that went backwards still gets a fresh epoch.  A
\* proposal may skip epochs, so any epoch above the stored one can be granted.  The node's
\* OPENED streams stay OPENED and owned by it.
RegisterNode(n) ==
    /\ Cardinality(Perturbed(n)) <= MaxPerturbedNodes
    /\ \E proposed \in NodeEpochs :
           LET granted == Max(proposed, nodeEpoch[n] + 1)
           IN  /\ granted <= MaxNodeEpoch
               /\ nodeEpoch' = [nodeEpoch EXCEPT ![n] = granted]
    /\ failoverMode' = [failoverMode EXCEPT ![n] = FALSE]
    /\ UNCHANGED <<streamVars, objectVars, historyVars>>

\* ACTION: FenceNode(n) mirrors a failover target's getOpeningStreams(n, nodeEpoch[n],
\* failoverMode=true): NodeWALMetadataRecord(n, epoch, true).  From then on every request of n
\* except CloseStream and failover-mode commits gets NODE_FENCED.  (AutoMQ only fails over a
\* node whose heartbeat is fenced; the spec lets it happen at any time, a superset.)
FenceNode(n) ==
    /\ ~failoverMode[n]
    /\ Cardinality(Perturbed(n)) <= MaxPerturbedNodes
    /\ failoverMode' = [failoverMode EXCEPT ![n] = TRUE]
    /\ UNCHANGED <<nodeEpoch, streamVars, objectVars, historyVars>>

\* ACTION: CreateStream(n, e) mirrors createStream: AssignedStreamIdRecord +
\* S3StreamRecord(epoch -1, rangeIndex -1, start 0, CLOSED).  Errors: NODE_EPOCH_EXPIRED,
\* NODE_FENCED.
CreateStream(n, e) ==
    /\ HeldNodeEpoch(n, e)
    /\ nextStreamId \in Streams
    /\ CreateStreamError(n, e) = "NONE"
    /\ streamState' = [streamState EXCEPT ![nextStreamId] = "CLOSED"]
    /\ nextStreamId' = nextStreamId + 1
    /\ UNCHANGED <<nodeVars, streamEpoch, rangeIndex, streamStart, streamEnd, ranges,
                   objectVars, historyVars>>

\* ACTION: OpenStream(n, e, s, se) mirrors openStream(nodeId, nodeEpoch, streamId, epoch).
\* Errors: NODE_EPOCH_EXPIRED, NODE_FENCED, STREAM_NOT_EXIST, STREAM_FENCED (stored epoch >
\* se, or a retry by a node that does not own the current range), STREAM_INNER_ERROR,
\* STREAM_NOT_CLOSED (se > stored while OPENED: the new owner waits for the old one).
\* A retry at the stored epoch reopens a CLOSED stream on the same range.  A higher epoch seals
\* the current range at the stream's end, starts range rangeIndex+1 there owned by n, and drops
\* ranges no lookup needs (empty ones, and those under the stream-object prefix).
OpenStream(n, e, s, se) ==
    /\ HeldNodeEpoch(n, e)
    /\ OpenStreamError(n, e, s, se) = "NONE"
    /\ IF streamEpoch[s] = se
       THEN /\ streamState[s] = "CLOSED"   \* a retry on an OPENED stream writes nothing
            /\ streamState' = [streamState EXCEPT ![s] = "OPENED"]
            /\ UNCHANGED <<rangeIndex, streamEpoch, ranges, grants>>
       ELSE LET end == streamEnd[s]
                sealed == ExtendCurrent(s, end)
                covered == CoveredFrom(s, streamStart[s])
                kept == {r \in sealed : r.start < r.end /\ r.end > covered}
                new == [index |-> rangeIndex[s] + 1, epoch |-> se, node |-> n,
                        start |-> end, end |-> end]
            IN /\ streamState' = [streamState EXCEPT ![s] = "OPENED"]
               /\ streamEpoch' = [streamEpoch EXCEPT ![s] = se]
               /\ rangeIndex' = [rangeIndex EXCEPT ![s] = @ + 1]
               /\ ranges' = [ranges EXCEPT ![s] = kept \cup {new}]
               /\ grants' = grants \cup {[stream |-> s, epoch |-> se, node |-> n]}
    /\ UNCHANGED <<nodeVars, nextStreamId, streamStart, streamEnd, objectVars, commits, expired>>

\* ACTION: CloseStream(n, e, s, se) mirrors the classic closeStream(..., endOffset = -1).
\* Errors: NODE_EPOCH_EXPIRED (no failover check: a failover target closes a failed node's
\* streams as that node), STREAM_NOT_EXIST, STREAM_FENCED (stored epoch > se, or n does not own
\* the current range), STREAM_INNER_ERROR (stored epoch < se).  Closing a CLOSED stream is a
\* success that writes nothing.
CloseStream(n, e, s, se) ==
    /\ HeldNodeEpoch(n, e) /\ HeldStreamEpoch(n, s, se)
    /\ CloseStreamError(n, e, s, se) = "NONE"
    /\ streamState[s] = "OPENED"
    /\ streamState' = [streamState EXCEPT ![s] = "CLOSED"]
    /\ UNCHANGED <<nodeVars, nextStreamId, streamEpoch, rangeIndex, streamStart, streamEnd,
                   ranges, objectVars, historyVars>>

\* ACTION: TrimStream(n, e, s, se, newStart) mirrors trimStream.  Errors: NODE_EPOCH_EXPIRED,
\* NODE_FENCED, the ownership errors, STREAM_NOT_OPENED (CLOSED), OFFSET_NOT_MATCHED
\* (newStart < start); newStart = start is a success that writes nothing.  Ranges wholly
\* below newStart go, the one containing it starts there; the current range (and the stream)
\* end at max(newStart, end): trimming past the end is allowed.  Objects are not touched.
TrimStream(n, e, s, se, newStart) ==
    /\ HeldNodeEpoch(n, e) /\ HeldStreamEpoch(n, s, se)
    /\ TrimStreamError(n, e, s, se, newStart) = "NONE"
    /\ newStart > streamStart[s]
    /\ LET newEnd == IF TrimMovesEnd THEN Max(newStart, streamEnd[s]) ELSE streamEnd[s]
           retained == {r \in ranges[s] : r.index = rangeIndex[s] \/ r.end > newStart}
           trimmed(r) == IF r.start >= newStart THEN r
                         ELSE IF r.index = rangeIndex[s]
                              THEN [r EXCEPT !.start = newStart, !.end = newEnd]
                              ELSE [r EXCEPT !.start = newStart]
       IN /\ ranges' = [ranges EXCEPT ![s] = {trimmed(r) : r \in retained}]
          /\ streamStart' = [streamStart EXCEPT ![s] = newStart]
          /\ streamEnd' = [streamEnd EXCEPT ![s] = newEnd]
    /\ UNCHANGED <<nodeVars, nextStreamId, streamState, streamEpoch, rangeIndex,
                   objectVars, historyVars>>

\* ACTION: DeleteStream(s) mirrors deleteStream.  Errors: STREAM_NOT_CLOSED (OPENED); a missing
\* stream is a success that writes nothing.  RemoveS3StreamRecord; the stream's stream objects
\* are MARK_DESTROYED (DEEP_DELETE) with their records; its ranges inside stream set objects stay
\* COMMITTED until a compaction drops them (CommitStreamSetObjectCompaction, a pure cleanup).
DeleteStream(s) ==
    /\ DeleteStreamError(s) = "NONE"
    /\ Live(s)
    /\ LET gone == {r.object : r \in {x \in streamObjects : x.stream = s}} IN
       /\ objectState' = [o \in Objects |-> IF o \in gone THEN "MARK_DESTROYED" ELSE objectState[o]]
       /\ streamObjects' = {r \in streamObjects : r.stream # s}
    /\ streamState' = [streamState EXCEPT ![s] = "DELETED"]
    \* Forget the rest (AutoMQ removes the whole entry); keeps deleted streams alike.
    /\ streamEpoch' = [streamEpoch EXCEPT ![s] = NoEpoch]
    /\ rangeIndex' = [rangeIndex EXCEPT ![s] = NoRange]
    /\ streamStart' = [streamStart EXCEPT ![s] = 0]
    /\ streamEnd' = [streamEnd EXCEPT ![s] = 0]
    /\ ranges' = [ranges EXCEPT ![s] = {}]
    /\ UNCHANGED <<nodeVars, nextStreamId, nextObjectId, streamSetObjects, historyVars>>

\* ACTION: PrepareObject(n, e) mirrors prepareObject(count = 1, ttl): AssignedS3ObjectIdRecord +
\* S3ObjectRecord(PREPARED, deadline).  No errors (AutoMQ makes no node check here; n and e only
\* name the requester).  The deadline is abstracted: ExpireObject may fire at any time.
PrepareObject(n, e) ==
    /\ HeldNodeEpoch(n, e)
    /\ nextObjectId \in Objects
    /\ objectState' = [objectState EXCEPT ![nextObjectId] = "PREPARED"]
    /\ nextObjectId' = nextObjectId + 1
    /\ UNCHANGED <<nodeVars, streamVars, streamSetObjects, streamObjects, historyVars>>

\* ACTION: ExpireObject(o) mirrors the controller's lifecycle task: a PREPARED object whose TTL
\* passed becomes MARK_DESTROYED (bucket MATCH_ALL).  Remembered in `expired`.  (With
\* CheckExpireState = FALSE, the mutation, it also fires on an object committed meanwhile.)
ExpireObject(o) ==
    /\ IF CheckExpireState THEN objectState[o] = "PREPARED"
                            ELSE objectState[o] \in {"PREPARED", "COMMITTED"}
    /\ objectState' = [objectState EXCEPT ![o] = "MARK_DESTROYED"]
    /\ expired' = expired \cup {o}
    /\ UNCHANGED <<nodeVars, streamVars, nextObjectId, streamSetObjects, streamObjects,
                   grants, commits>>

\* ACTION: CommitStreamSetObject(n, e, o, s, se, start, end, failover) mirrors
\* commitStreamSetObject for a WAL upload holding [start, end) of stream s, written by n while
\* it believed stream epoch se; `failover` is the request's failoverMode (a failover target
\* acting as n; it is only sent after FenceNode(n)).  Errors: NODE_EPOCH_EXPIRED, NODE_FENCED
\* (n in failover mode and the request is not), OBJECT_NOT_EXIST (o not PREPARED: expired,
\* removed), REDUNDANT_OPERATION (o already COMMITTED: a success that writes nothing),
\* STREAM_NOT_OPENED, STREAM_INNER_ERROR, STREAM_FENCED (n does not own the current range, or
\* se is not the stream's epoch), OFFSET_NOT_MATCHED (start is not the stream's end).  A range
\* of a deleted stream, or one wholly below the start, is accepted and moves nothing.
CommitStreamSetObject(n, e, o, s, se, start, end, failover) ==
    /\ start < end
    /\ objectState[o] \in CommittableStates   \* implied by the error check; checked first for speed
    /\ streamState[s] # "NONE"
    /\ HeldNodeEpoch(n, e) /\ HeldStreamEpoch(n, s, se)
    /\ failover => failoverMode[n]
    /\ CommitStreamSetObjectError(n, e, o, s, se, start, end, failover) = "NONE"
    /\ objectState' = [objectState EXCEPT ![o] = "COMMITTED"]
    /\ streamSetObjects' = streamSetObjects \cup
           {[object |-> o, node |-> n, stream |-> s, start |-> start, end |-> end]}
    /\ IF Live(s) /\ end > streamStart[s]
       THEN /\ streamEnd' = [streamEnd EXCEPT ![s] = Max(@, end)]
            /\ ranges' = [ranges EXCEPT ![s] = ExtendCurrent(s, Max(streamEnd[s], end))]
            /\ commits' = commits \cup
                   {[object |-> o, stream |-> s, start |-> start, end |-> end, node |-> n,
                     streamEpoch |-> se, failover |-> failover]}
       ELSE UNCHANGED <<streamEnd, ranges, commits>>
    /\ UNCHANGED <<nodeVars, nextStreamId, streamState, streamEpoch, rangeIndex, streamStart,
                   nextObjectId, streamObjects, grants, expired>>

\* ACTION: CommitStreamObject(n, e, o, s, se, start, end) mirrors commitStreamObject
\* (compaction): the objects holding [start, end) of s are merged into the new stream object o
\* and MARK_DESTROYED (DELETE), their records replaced by S3StreamObjectRecord(o).  se = -1
\* skips the ownership check, as in AutoMQ.  Errors: NODE_EPOCH_EXPIRED, NODE_FENCED,
\* STREAM_NOT_EXIST, the ownership errors, OBJECT_NOT_EXIST, REDUNDANT_OPERATION (a success that
\* writes nothing), COMPACTED_OBJECTS_NOT_FOUND.
CommitStreamObject(n, e, o, s, se, start, end) ==
    /\ start < end
    /\ objectState[o] \in CommittableStates   \* implied by the error check; checked first for speed
    /\ Live(s)                                 \* likewise
    /\ HeldNodeEpoch(n, e)
    /\ se = AnyStreamEpoch \/ HeldStreamEpoch(n, s, se)
    /\ WellFormedCompaction(s, start, end)
    /\ CommitStreamObjectError(n, e, o, s, se, start, end) = "NONE"
    /\ LET sources == {r.object : r \in CompactionSources(s, start, end)} IN
       /\ objectState' = [x \in Objects |->
                              IF x = o THEN "COMMITTED"
                              ELSE IF x \in sources THEN "MARK_DESTROYED"
                              ELSE objectState[x]]
       /\ streamSetObjects' = {r \in streamSetObjects : r.object \notin sources}
       /\ streamObjects' = {r \in streamObjects : r.object \notin sources} \cup
              {[object |-> o, stream |-> s, start |-> start, end |-> end]}
    /\ UNCHANGED <<nodeVars, streamVars, nextObjectId, historyVars>>

\* ACTION: CommitStreamSetObjectCompaction(n, e, compacted, o, so) mirrors the compaction form
\* of commitStreamSetObject (compactedObjectIds not empty), sent by n's stream set object
\* compactor: the sources `compacted` are MARK_DESTROYED (DELETE) and their records removed
\* (RemoveStreamSetObjectRecord); the new stream set object o (objectId, or NoObject) holds one
\* merged run, the stream object so (or NoObject) one split run; with neither it is a pure
\* cleanup of sources that held only a deleted stream's data or data below the start.  No
\* ownership, stream epoch or continuity check: the data moves between objects, the stream does
\* not change.  A stream object of a deleted stream is MARK_DESTROYED at once, with no record.
\* Errors: NODE_EPOCH_EXPIRED, NODE_FENCED (a compactor never sends failoverMode), OBJECT_NOT_EXIST
\* (o or so not PREPARED), REDUNDANT_OPERATION (already COMMITTED: a success that writes
\* nothing), COMPACTED_OBJECTS_NOT_FOUND (a source is not a COMMITTED stream set object of n: a
\* stale view, another node's object), OFFSET_NOT_MATCHED (the outputs lose, add or duplicate a
\* live offset of the sources).  The new object's orderId and dataTime (the smallest of the
\* sources') are not modelled; see the header.
CommitStreamSetObjectCompaction(n, e, compacted, o, so) ==
    /\ compacted # {}
    /\ CheckCompactedObjects => compacted \subseteq NodeSsoIds(n)   \* implied by the error check
    \* (IF, not \/: TLC explores both sides of a disjunction in an action.)
    /\ IF o = NoObject THEN TRUE ELSE objectState[o] \in CommittableStates   \* likewise
    /\ IF so = NoObject THEN TRUE ELSE so # o /\ objectState[so] \in CommittableStates
    /\ HeldNodeEpoch(n, e)
    /\ \E ssoRun \in OutputRuns(o), soRun \in OutputRuns(so) :
          LET inputs == CompactionInputs(n, compacted) IN
          /\ CommitStreamSetObjectCompactionError(n, e, compacted, o, ssoRun, so, soRun) = "NONE"
          /\ objectState' = [x \in Objects |->
                 IF x = o THEN "COMMITTED"
                 ELSE IF x = so THEN IF Live(soRun.stream) THEN "COMMITTED" ELSE "MARK_DESTROYED"
                 ELSE IF x \in compacted THEN "MARK_DESTROYED"
                 ELSE objectState[x]]
          /\ streamSetObjects' = (streamSetObjects \ inputs) \cup
                 (IF o = NoObject THEN {}
                  ELSE {[object |-> o, node |-> n, stream |-> ssoRun.stream,
                         start |-> ssoRun.start, end |-> ssoRun.end]})
          /\ streamObjects' = streamObjects \cup
                 (IF so = NoObject \/ ~Live(soRun.stream) THEN {}
                  ELSE {[object |-> so, stream |-> soRun.stream, start |-> soRun.start,
                         end |-> soRun.end]})
    /\ UNCHANGED <<nodeVars, streamVars, nextObjectId, historyVars>>

\* ACTION: RemoveObject(o) mirrors the physical delete of a MARK_DESTROYED object after the
\* retention, then RemoveS3ObjectRecord.  The retention is abstracted: any time later.
RemoveObject(o) ==
    /\ objectState[o] = "MARK_DESTROYED"
    /\ objectState' = [objectState EXCEPT ![o] = "REMOVED"]
    /\ UNCHANGED <<nodeVars, streamVars, nextObjectId, streamSetObjects, streamObjects,
                   historyVars>>

-----------------------------------------------------------------------------

\* Every request with every parameter; the actions' own preconditions say which requests a node
\* can send (HeldNodeEpoch, HeldStreamEpoch) and which ones the controller accepts.
Next ==
    \/ \E n \in Nodes : RegisterNode(n)
    \/ \E n \in Nodes : FenceNode(n)
    \/ \E n \in Nodes, e \in NodeEpochs : CreateStream(n, e)
    \/ \E n \in Nodes, e \in NodeEpochs, s \in Streams, se \in StreamEpochs :
          OpenStream(n, e, s, se)
    \/ \E n \in Nodes, e \in NodeEpochs, s \in Streams, se \in StreamEpochs :
          CloseStream(n, e, s, se)
    \/ \E n \in Nodes, e \in NodeEpochs, s \in Streams, se \in StreamEpochs, x \in Offsets :
          TrimStream(n, e, s, se, x)
    \/ \E s \in Streams : DeleteStream(s)
    \/ \E n \in Nodes, e \in NodeEpochs : PrepareObject(n, e)
    \/ \E o \in Objects : ExpireObject(o)
    \/ \E n \in Nodes, e \in NodeEpochs, o \in Objects, s \in Streams, se \in StreamEpochs,
          start \in Offsets, failover \in BOOLEAN : \E end \in (start + 1)..MaxOffset :
          CommitStreamSetObject(n, e, o, s, se, start, end, failover)
    \/ \E n \in Nodes, e \in NodeEpochs, o \in Objects, s \in Streams,
          se \in StreamEpochs \cup {AnyStreamEpoch}, start \in Offsets :
          \E end \in (start + 1)..MaxOffset :
          CommitStreamObject(n, e, o, s, se, start, end)
    \/ \E n \in Nodes, e \in NodeEpochs, compacted \in SUBSET Objects,
          o \in Objects \cup {NoObject}, so \in Objects \cup {NoObject} :
          CommitStreamSetObjectCompaction(n, e, compacted, o, so)
    \/ \E o \in Objects : RemoveObject(o)

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
(* Invariants (the Python machine has inv_<snake_case> for each). *)

TypeOK ==
    /\ nodeEpoch \in [Nodes -> NodeEpochs]
    /\ failoverMode \in [Nodes -> BOOLEAN]
    /\ nextStreamId \in 0..Cardinality(Streams)
    /\ streamState \in [Streams -> StreamStates]
    /\ streamEpoch \in [Streams -> StreamEpochs \cup {NoEpoch}]
    /\ rangeIndex \in [Streams -> StreamEpochs \cup {NoRange}]
    /\ streamStart \in [Streams -> Offsets]
    /\ streamEnd \in [Streams -> Offsets]
    /\ ranges \in [Streams -> SUBSET RangeRecords]
    /\ nextObjectId \in 0..Cardinality(Objects)
    /\ objectState \in [Objects -> ObjectStates]
    /\ streamSetObjects \subseteq SsoRecords
    /\ streamObjects \subseteq SoRecords
    /\ grants \subseteq GrantRecords
    /\ commits \subseteq CommitRecords
    /\ expired \subseteq Objects

\* For each stream and stream epoch, at most one node ever owned a range of that epoch.
SingleWriter ==
    \A g1, g2 \in grants :
        (g1.stream = g2.stream /\ g1.epoch = g2.epoch) => g1.node = g2.node

\* Retained ranges are ordered by index, non-overlapping and contiguous; the last one is the
\* current range and ends at the stream's end; start <= end.
RangesContiguous ==
    \A s \in Streams :
        LET rs == ranges[s] IN
        /\ streamStart[s] <= streamEnd[s]
        /\ \A r \in rs : r.start <= r.end
        /\ \A r1, r2 \in rs : r1.index < r2.index => r1.end <= r2.start
        /\ \A r1 \in rs :
              (\E r2 \in rs : r2.index > r1.index)
                  => \E r2 \in rs : r2.index > r1.index /\ r2.start = r1.end
        /\ (Live(s) /\ rangeIndex[s] # NoRange) => HasCurrentRange(s)
        /\ \A r \in rs : r.index <= rangeIndex[s]
        /\ HasCurrentRange(s) => CurrentRange(s).end = streamEnd[s]

\* The committed data objects of a live stream tile [start, end): every offset in it lies in
\* exactly one of them, and none reaches past the end.
ObjectsCoverStream ==
    \A s \in Streams : Live(s) =>
        LET refs == {r \in DataRefs(s) : objectState[r.object] = "COMMITTED"} IN
        /\ \A x \in streamStart[s]..(streamEnd[s] - 1) :
              Cardinality({r \in refs : r.start <= x /\ x < r.end}) = 1
        /\ \A r \in refs : r.end <= streamEnd[s]

\* Every visible offset of every accepted commit lies only in ranges owned by the committing
\* node at the stream epoch it committed under: data written under a fenced epoch or by a
\* non-owner never becomes readable.  (Offsets whose range was dropped because stream objects
\* cover them are not constrained.)
NoFencedCommitVisible ==
    /\ \A c \in commits : Live(c.stream) =>
          \A x \in Max(c.start, streamStart[c.stream])..(Min(c.end, streamEnd[c.stream]) - 1) :
              \A r \in ranges[c.stream] :
                  (r.start <= x /\ x < r.end) => (r.node = c.node /\ r.epoch = c.streamEpoch)
    \* ... and a node's stream set objects (compaction outputs too) hold live offsets only of
    \* ranges that node owned: where a reader looks for them (AutoMQ: the range owner's list).
    /\ \A o \in streamSetObjects : Live(o.stream) =>
          \A x \in Max(o.start, streamStart[o.stream])..(o.end - 1) :
              \A r \in ranges[o.stream] : (r.start <= x /\ x < r.end) => r.node = o.node

\* An object destroyed because its TTL passed is never COMMITTED.
ExpiredNeverCommitted == \A o \in expired : objectState[o] # "COMMITTED"

\* Every object a stream set object or stream object record refers to is COMMITTED.
NothingReferencedIsDestroyed ==
    /\ \A r \in streamSetObjects : objectState[r.object] = "COMMITTED"
    /\ \A r \in streamObjects : objectState[r.object] = "COMMITTED"

\* A live stream's epoch never goes down (a temporal action property, checked as PROPERTY).
EpochNeverDecreases ==
    [][\A s \in Streams :
          (Live(s) /\ streamState'[s] \in {"CLOSED", "OPENED"})
              => streamEpoch'[s] >= streamEpoch[s]]_vars

=============================================================================
