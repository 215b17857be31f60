----------------------------- MODULE MCFailover -----------------------------
(***************************************************************************)
(* Model of Failover for TLC: the symmetry set and the "this interesting   *)
(* state is unreachable" invariants that the *Reach models expect TLC to   *)
(* VIOLATE (a violation proves the behaviour is reachable, so the real     *)
(* invariants are not vacuously true).                                     *)
(***************************************************************************)
EXTENDS Failover, TLC

\* Nodes are interchangeable: no action or invariant orders them.  Streams and records are
\* not made symmetric: records are handed out in order (nextRecord).
NodeSymmetry == Permutations(Nodes)

\* Reach: a node crashed, a failover of it completed after uploading records, and a record the
\* crashed node had acknowledged is committed while its stream is OPENED again on another node at
\* a higher stream epoch.
NoFailoverHandOff ==
    ~\E c \in completed, a \in acked :
        /\ c.uploaded
        /\ crashes > 0 /\ phase[c.failed] = "DOWN"
        /\ a.node = c.failed /\ a.nepoch = c.epoch
        /\ a.rec \in committed
        /\ streamState[a.stream] = "OPENED"
        /\ streamOwner[a.stream] # c.failed
        /\ streamEpoch[a.stream] > a.sepoch

\* ReachZombie: a node whose WAL a failover target fenced is still running and has appended a
\* record, for a stream that is meanwhile OPENED on another node at a higher epoch.
NoZombieAppendAfterFence ==
    ~\E n \in Nodes, w \in WalEntries :
        /\ w \in pending[n]
        /\ phase[n] = "SERVING"
        /\ reservation[n].failover
        /\ streamState[w.stream] = "OPENED"
        /\ streamOwner[w.stream] # n
        /\ streamEpoch[w.stream] > w.sepoch

\* ReachShutdown: a node stopped gracefully after committing a record it acknowledged, and the
\* record's stream is OPENED on another node.
NoShutdownHandOff ==
    ~\E n \in Nodes, a \in acked :
        /\ phase[n] = "STOPPED"
        /\ a.node = n
        /\ a.rec \in committed
        /\ streamState[a.stream] = "OPENED"
        /\ streamOwner[a.stream] # n

\* ReachOverlap: two failover targets hold tasks for the same failed node at once (the first
\* target lost its session, the controller cleared the context and assigned another).
NoRecoverersOverlap ==
    ~\E t1, t2 \in Nodes :
        /\ t1 # t2 /\ HasTask(t1) /\ HasTask(t2)
        /\ task[t1].failed = task[t2].failed
        /\ task[t1].stage # "ASSIGNED" /\ task[t2].stage # "ASSIGNED"
=============================================================================
