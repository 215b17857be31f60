-------------------------- MODULE MCStreamMetadata --------------------------
(***************************************************************************)
(* Model of StreamMetadata for TLC: the symmetry set and the "this         *)
(* interesting state is unreachable" invariants that the *Reach models     *)
(* expect TLC to VIOLATE (a violation proves the behaviour is reachable,   *)
(* so the real invariants are not vacuously true).                         *)
(***************************************************************************)
EXTENDS StreamMetadata, TLC

\* Nodes are interchangeable: no action or invariant orders or names them.  Streams and
\* objects are not: their ids are handed out in order (nextStreamId, nextObjectId).
NodeSymmetry == Permutations(Nodes)

\* Reach: a node committed data to a stream, then ANOTHER node reopened it with a higher epoch.
NoStreamEverReopenedByAnotherNode ==
    ~\E c \in commits, g \in grants :
        /\ g.stream = c.stream
        /\ g.node # c.node
        /\ g.epoch > c.streamEpoch

\* ReachFailover: a failover target committed a fenced node's data, and another node then
\* reopened the stream.
NoReopenAfterFailoverCommit ==
    ~\E c \in commits, g \in grants :
        /\ c.failover
        /\ g.stream = c.stream
        /\ g.node # c.node
        /\ g.epoch > c.streamEpoch

\* ReachCompaction: an object that held committed data was compacted away and physically
\* removed while its stream lives on with data.
NoCommittedObjectRemoved ==
    ~\E c \in commits :
        /\ objectState[c.object] = "REMOVED"
        /\ Live(c.stream)
        /\ streamEnd[c.stream] > streamStart[c.stream]

\* ReachTrim: a stream was trimmed past its end and then took a commit that crosses the
\* trim point (start below the stream's start, end above it).
NoCommitAcrossTrimPoint ==
    ~\E c \in commits :
        /\ Live(c.stream)
        /\ c.start < streamStart[c.stream]
        /\ c.end > streamStart[c.stream]

\* ReachMerge (an action property, exit 13): a node's stream set objects are merged, two or
\* more of them replaced by one new stream set object in one step (three objects needed).
NoStreamSetObjectsMerged ==
    [][~(/\ Cardinality(streamSetObjects \ streamSetObjects') >= 2
         /\ streamSetObjects' \ streamSetObjects # {})]_vars

\* ReachCleanup (an action property, exit 13): a pure cleanup, stream set object records go and
\* no object and no record takes their place (objectId -1, no stream objects).
NoPureCleanup ==
    [][~(/\ streamSetObjects' \subseteq streamSetObjects /\ streamSetObjects' # streamSetObjects
         /\ streamObjects' \subseteq streamObjects
         /\ \A x \in Objects : objectState'[x] = "COMMITTED" => objectState[x] = "COMMITTED")]_vars
=============================================================================
