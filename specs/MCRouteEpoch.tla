---------------------------- MODULE MCRouteEpoch ----------------------------
(***************************************************************************)
(* Model of RouteEpoch for TLC: the symmetry set and the "this interesting *)
(* state is unreachable" invariants that the *Reach models expect TLC to   *)
(* VIOLATE (a violation proves the behaviour is reachable, so the real     *)
(* invariants are not vacuously true).                                     *)
(***************************************************************************)
EXTENDS RouteEpoch, TLC

\* Nodes are interchangeable: no action or invariant orders them.  Request ids are not (they are
\* positions in `reqs`), so only Nodes is a symmetry set.  The liveness models use no symmetry.
NodeSymmetry == Permutations(Nodes)

\* Reach: a write went the whole way: accepted, its Link Record committed (uploaded) by its main,
\* and then its data trimmed from the proxy's RouterChannel.
NoCommittedDataTrimmed == ~\E i \in Ids : reqs[i].state = "COMMITTED" /\ Trimmed(i)

\* ReachFailover: a node crashed with a Link Record in its WAL, a survivor failed it over
\* (uploading that record), the committed epoch moved on without the crashed node, and the
\* proxy trimmed the data.
NoTrimAfterFailover ==
    ~\E i \in Ids, n \in Nodes :
        /\ reqs[i].main = n
        /\ ~up[n] /\ ~openStreams[n]
        /\ reqs[i].state = "COMMITTED"
        /\ Trimmed(i)
        /\ committed > reported[n]

\* ReachReject: the fence check fired: a main rejected a request.
NoRequestRejected == ~\E i \in Ids : reqs[i].state = "REJECTED"
=============================================================================
