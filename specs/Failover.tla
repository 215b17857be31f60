------------------------------ MODULE Failover ------------------------------
(***************************************************************************)
(* Node sessions, graceful shutdown and crash failover: who may write a    *)
(* node's WAL, and why no acknowledged record is lost when a node goes     *)
(* away, even when it is not really gone.                                  *)
(*                                                                         *)
(* Machine: automq_ref/state_machines/failover/.  Properties:             *)
(* tests/properties/test_failover.py::FailoverMachine.                     *)
(* Sources: AutoMQ's block and S3 WALs with their reservation, ConfirmWal, *)
(* startup recovery (S3Storage.recover0), the controller's node epoch      *)
(* check, graceful shutdown and crash failover (FailoverControlManager,    *)
(* Failover.java); AutoMQ's description of single-replica cloud disks      *)
(* (graceful shutdown uploads the Delta WAL then the partitions move; a    *)
(* crash is taken over by a survivor that fences the dead node's volume    *)
(* before it reads and uploads it); docs/machines/failover.md.             *)
(*                                                                         *)
(* THE PROBLEM.  Each node has its own WAL, written by one process.        *)
(* Records are acknowledged to producers once they are durable in that     *)
(* WAL; they reach object storage ("committed objects") later, when the    *)
(* node uploads them.  If a node stops, its acknowledged records exist     *)
(* only in its WAL until somebody uploads them, and its streams stay       *)
(* OPENED on it, so nobody else may take the partitions.                   *)
(* - Graceful shutdown: the node stops taking appends, uploads its WAL     *)
(*   (force upload), closes its streams, and only then do the partitions   *)
(*   reopen elsewhere.                                                     *)
(* - Crash: the controller notices the missed session, picks ONE live      *)
(*   node (one failover in flight at a time, none for a node that has just *)
(*   restarted and is recovering by itself), and that node FENCES the      *)
(*   dead node's WAL, then reads and uploads it acting as the dead node,   *)
(*   then closes the dead node's streams; the partitions reopen elsewhere  *)
(*   with higher stream epochs.                                            *)
(* The hard part: "dead" is the controller's opinion.  A node whose        *)
(* session expired may be paused (GC, SIGSTOP, a partition from the        *)
(* controller but not from storage) and carry on appending afterwards: a   *)
(* ZOMBIE.  The fence is what makes the takeover safe: the WAL is          *)
(* reserved for the recoverer BEFORE it is read, and a writer acknowledges *)
(* a record only after the record is durable AND its reservation still     *)
(* verifies.  So a zombie's record either landed before the fence (and the *)
(* recoverer reads it) or it is never acknowledged.                        *)
(*                                                                         *)
(* THE RESERVATION (FenceWal).  One abstract action for two mechanisms:    *)
(* on a block WAL (cloud disk) the recoverer attaches the volume and takes *)
(* an NVMe reservation, after which the old host's writes fail; on the S3  *)
(* WAL it overwrites the reservation object with (failed node, failed      *)
(* epoch, failover = TRUE), which the old writer's next verification       *)
(* (after each upload group) no longer matches.  Both are "the WAL now     *)
(* belongs to someone else" and both are checked by the writer after the   *)
(* data lands and before the acknowledgement; reservation[n] is that       *)
(* state: [epoch, failover].  The owner's own reservation is [its node     *)
(* epoch, FALSE]; a restart takes it back with the new epoch.              *)
(*                                                                         *)
(* WHAT IS MODELLED.  Per node: its process phase (SERVING, DRAINING in a  *)
(* graceful shutdown, RECOVERING its own WAL after a restart, STOPPED,     *)
(* DOWN), its node epoch, the controller's session view (ACTIVE, FENCED:   *)
(* missed heartbeats or just registered, STOPPED: controlled shutdown      *)
(* done), the restart grace flag, the WAL reservation, the WAL contents    *)
(* (records that landed and are not trimmed), the appends waiting for      *)
(* their verification, and the node's own belief of which streams it has   *)
(* open at which epoch (leads).  Per stream: the controller's state,       *)
(* owner and epoch.  The controller's failover contexts and each node's    *)
(* failover task.  History: every acknowledged record, the records in      *)
(* committed objects, completed failovers.                                 *)
(*                                                                         *)
(* TIME.  No clock: time passes as events.  ExpireSession(n) is the        *)
(* controller's session timeout firing (any time: a running node may miss  *)
(* its heartbeats, which is how zombies are born); Heartbeat(n) is the     *)
(* heartbeat that matters, the one that unfences a node (a heartbeat that  *)
(* changes nothing is a stutter); EndGrace(n) is the 1-minute grace after  *)
(* a restart running out.  A pause is not a state: in an interleaving      *)
(* model a paused process is one that takes no steps, and what a pause     *)
(* leaves behind is exactly a running process whose session expired.       *)
(*                                                                         *)
(* WHAT IS ABSTRACTED AWAY, AND WHY.                                       *)
(* - Offsets, ranges, objects and the controller's continuity checks:      *)
(*   specs/StreamMetadata.tla.  Here "committed" is the set of records in  *)
(*   committed objects, and the controller accepts a WAL record into a     *)
(*   commit only while the record's stream is OPENED, owned by the writing *)
(*   node, at the stream epoch the record was written under (Committable). *)
(*   Duplicates (a record committed twice) are invisible in a set; the     *)
(*   continuity check removes them in StreamMetadata.                      *)
(* - The node-epoch check and failover mode of the controller (NODE_FENCED)*)
(*   are not needed for these invariants: the stream check above already   *)
(*   refuses a zombie's commits once its streams are closed.  The failover *)
(*   target's commits and closes do carry the failed node's epoch and are  *)
(*   refused (NODE_EPOCH_EXPIRED) once the node restarted.                 *)
(* - The LogCache: a node uploads the records it acknowledged (the cache   *)
(*   holds exactly those) and trims them from its WAL in one step.         *)
(* - One process per node id at a time: a restart follows a crash, halt or *)
(*   stop.  (A restarted S3-WAL node elsewhere while the old one is a      *)
(*   zombie meets the same reservation check with a newer epoch.)          *)
(* - Partition leader election: any SERVING node with an ACTIVE session    *)
(*   may open a CLOSED stream; the MetaStream and leader epochs are the    *)
(*   stream epoch.                                                         *)
(* - Retries and backoff of the failover task: an aborted task is gone;    *)
(*   the controller reassigns once the context is cleared.                 *)
(* - A reassignment away from a live node: the same force upload and close *)
(*   as in a graceful shutdown, so CloseStream is taken only while         *)
(*   DRAINING, which keeps the model small.                                *)
(*                                                                         *)
(* BOUNDS AND SWITCHES.  Records, node epochs (restarts), stream epochs    *)
(* (reopens) and crashes are bounded, and MaxPerturbed bounds how many     *)
(* distinct nodes ever crash, begin a shutdown or lose their session;      *)
(* healing actions (heartbeats, the failover steps) are not bounded.  The  *)
(* switches are TRUE in the real protocol; each mutation model sets one    *)
(* to FALSE and TLC must report the named invariant (specs/README.md).     *)
(***************************************************************************)
EXTENDS Naturals, Integers, FiniteSets

CONSTANTS
    Nodes,             \* node ids (a symmetry set in the model)
    Streams,           \* stream ids
    MaxRecords,        \* records are 1..MaxRecords, appended in order
    MaxNodeEpoch,      \* node epochs are 0..MaxNodeEpoch (a restart bumps it)
    MaxStreamEpoch,    \* stream epochs are 0..MaxStreamEpoch (an open bumps it)
    MaxCrashes,        \* how many crashes may happen in a behaviour
    MaxPerturbed,      \* how many nodes may ever crash, shut down or lose their session
    MaxInFlight,       \* failovers in flight at once (AutoMQ: 1)
    \* Switches for mutation models; all TRUE in the real protocol.
    FenceBeforeRead,   \* the recoverer reserves the WAL before it reads it
    VerifyReservation, \* a writer acknowledges only while its reservation verifies
    OpenBumpsEpoch,    \* reopening a stream takes a higher stream epoch
    UploadBeforeClose  \* a node force-uploads a stream's records before closing it

ASSUME
    /\ Nodes # {} /\ Streams # {}
    /\ MaxRecords \in Nat /\ MaxNodeEpoch \in Nat /\ MaxStreamEpoch \in Nat
    /\ MaxCrashes \in Nat /\ MaxPerturbed \in Nat /\ MaxInFlight \in Nat \ {0}
    /\ {FenceBeforeRead, VerifyReservation, OpenBumpsEpoch, UploadBeforeClose} \subseteq BOOLEAN

NoEpoch == -1                 \* a stream never opened; a node that holds no epoch of a stream
NoNode == "NONE"              \* the owner of a stream never opened
NodeEpochs == 0..MaxNodeEpoch
StreamEpochs == 0..MaxStreamEpoch
Records == 1..MaxRecords

Phases == {"SERVING", "DRAINING", "RECOVERING", "STOPPED", "DOWN"}
Sessions == {"ACTIVE", "FENCED", "STOPPED"}
Stages == {"ASSIGNED", "FENCED", "RECOVERED"}

\* A record in a WAL: written for `stream` while its writer believed stream epoch `sepoch`.
WalEntries == [rec : Records, stream : Streams, sepoch : StreamEpochs]
\* The content of a WAL's reservation (volume reservation or reservation object).
Reservations == [epoch : NodeEpochs, failover : BOOLEAN]
\* History: an acknowledged record and who acknowledged it at which node epoch.
AckEntries == [rec : Records, node : Nodes, nepoch : NodeEpochs, stream : Streams,
               sepoch : StreamEpochs]
\* The controller's failover context (KV __a.failover) and a target's failover task.
Contexts == [failed : Nodes, epoch : NodeEpochs, target : Nodes]
NoTask == [stage |-> "NONE"]
Tasks == [failed : Nodes, epoch : NodeEpochs, stage : Stages, uploaded : BOOLEAN]
Completions == [failed : Nodes, epoch : NodeEpochs, uploaded : BOOLEAN]

VARIABLES
    phase,        \* the node's process: SERVING | DRAINING | RECOVERING | STOPPED | DOWN
    nodeEpoch,    \* the node epoch (its start time), bumped by a restart
    session,      \* the controller's view: ACTIVE | FENCED | STOPPED
    grace,        \* the node restarted less than the grace period ago
    reservation,  \* who may write each node's WAL: [epoch, failover]
    wal,          \* each node's WAL: entries that landed and are not trimmed
    pending,      \* each node's appends that landed but are not yet verified/acknowledged
    leads,        \* the node's belief: leads[n][s] = stream epoch it has s open at, or NoEpoch
    streamState,  \* controller: CLOSED | OPENED
    streamOwner,  \* controller: the node that opened the stream last
    streamEpoch,  \* controller: the stream epoch (NoEpoch before the first open)
    nextRecord,   \* the next record id to append
    acked,        \* history: every acknowledged record
    committed,    \* records in committed objects
    contexts,     \* controller: failovers in flight
    task,         \* each node's failover task (as a target), or NoTask
    completed,    \* history: failovers that finished
    crashes,      \* how many crashes happened so far
    perturbed,    \* the nodes that ever crashed, began a shutdown or lost their session
    zombieAcks    \* history: records acknowledged while the writer's WAL was fenced

nodeVars == <<phase, nodeEpoch, session, grace, leads>>
walVars == <<reservation, wal, pending>>
streamVars == <<streamState, streamOwner, streamEpoch>>
dataVars == <<nextRecord, acked, committed>>
failoverVars == <<contexts, task, completed>>
ghostVars == <<crashes, perturbed, zombieAcks>>
vars == <<nodeVars, walVars, streamVars, dataVars, failoverVars, ghostVars>>

-----------------------------------------------------------------------------
(* Helpers *)

Up(n) == phase[n] \in {"SERVING", "DRAINING", "RECOVERING"}
\* A node that may append, upload and act as a failover target (recovery done).
Running(n) == phase[n] \in {"SERVING", "DRAINING"}
\* The reservation a process of the node's current epoch writes under.
Own(n) == [epoch |-> nodeEpoch[n], failover |-> FALSE]
\* The writer's check after its data landed: does the WAL still belong to it?
Verified(n) == ~VerifyReservation \/ reservation[n] = Own(n)
OpenedBy(n) == {s \in Streams : streamState[s] = "OPENED" /\ streamOwner[s] = n}
AckedRecords == {a.rec : a \in acked}
Recs(entries) == {w.rec : w \in entries}
\* The controller accepts a WAL record written by n into a commit.
Committable(n, w) ==
    /\ streamState[w.stream] = "OPENED"
    /\ streamOwner[w.stream] = n
    /\ streamEpoch[w.stream] = w.sepoch
\* The controller's failover candidate: session lost, open streams, not just restarted.
Candidate(n) == session[n] = "FENCED" /\ ~grace[n] /\ OpenedBy(n) # {}
HasTask(t) == task[t] # NoTask
NoLeads == [s \in Streams |-> NoEpoch]
\* The environment's bound: a fault or a shutdown may hit only MaxPerturbed distinct nodes.
Perturb(n) ==
    /\ Cardinality(perturbed \cup {n}) <= MaxPerturbed
    /\ perturbed' = perturbed \cup {n}
\* The node's local state after its process ends (crash or halt).
Gone(n) ==
    /\ phase' = [phase EXCEPT ![n] = "DOWN"]
    /\ leads' = [leads EXCEPT ![n] = NoLeads]
    /\ pending' = [pending EXCEPT ![n] = {}]
    /\ task' = [task EXCEPT ![n] = NoTask]
\* Closing every stream the controller has OPENED on node n.
CloseAllOf(n) ==
    streamState' = [s \in Streams |-> IF s \in OpenedBy(n) THEN "CLOSED" ELSE streamState[s]]
NewStreamEpoch(s) ==
    IF OpenBumpsEpoch \/ streamEpoch[s] = NoEpoch THEN streamEpoch[s] + 1 ELSE streamEpoch[s]

-----------------------------------------------------------------------------

Init ==
    /\ phase = [n \in Nodes |-> "SERVING"]
    /\ nodeEpoch = [n \in Nodes |-> 0]
    /\ session = [n \in Nodes |-> "ACTIVE"]
    /\ grace = [n \in Nodes |-> FALSE]
    /\ reservation = [n \in Nodes |-> [epoch |-> 0, failover |-> FALSE]]
    /\ wal = [n \in Nodes |-> {}]
    /\ pending = [n \in Nodes |-> {}]
    /\ leads = [n \in Nodes |-> NoLeads]
    /\ streamState = [s \in Streams |-> "CLOSED"]
    /\ streamOwner = [s \in Streams |-> NoNode]
    /\ streamEpoch = [s \in Streams |-> NoEpoch]
    /\ nextRecord = 1
    /\ acked = {}
    /\ committed = {}
    /\ contexts = {}
    /\ task = [n \in Nodes |-> NoTask]
    /\ completed = {}
    /\ crashes = 0
    /\ perturbed = {}
    /\ zombieAcks = {}

-----------------------------------------------------------------------------
(* Sessions and time *)

\* ACTION: Heartbeat(n) mirrors a broker heartbeat that the controller answers by unfencing
\* the node (KRaft: a fenced broker that is caught up is unfenced).  A node that finished its
\* own recovery after a restart gets its session this way; so does a zombie whose heartbeats
\* get through again (its WAL may be fenced meanwhile: then its next append fails).  A
\* heartbeat on an ACTIVE session changes nothing (a stutter).  Refused: a node still
\* RECOVERING is not caught up.
Heartbeat(n) ==
    /\ Running(n)
    /\ session[n] = "FENCED"
    /\ session' = [session EXCEPT ![n] = "ACTIVE"]
    /\ UNCHANGED <<phase, nodeEpoch, grace, leads, walVars, streamVars, dataVars,
                   failoverVars, ghostVars>>

\* ACTION: ExpireSession(n) mirrors the controller's session timeout
\* (broker.session.timeout.ms, 9 s): no heartbeat in time, the node is FENCED.  It may fire
\* for a running node too (heartbeats delayed, process paused): that node is then a zombie.
ExpireSession(n) ==
    /\ session[n] = "ACTIVE"
    /\ Perturb(n)
    /\ session' = [session EXCEPT ![n] = "FENCED"]
    /\ UNCHANGED <<phase, nodeEpoch, grace, leads, walVars, streamVars, dataVars,
                   failoverVars, crashes, zombieAcks>>

\* ACTION: EndGrace(n) mirrors DONT_FAILOVER_AFTER_NEW_EPOCH_MS (1 min) running out: a node
\* that restarted that long ago may be failed over again.
EndGrace(n) ==
    /\ grace[n]
    /\ grace' = [grace EXCEPT ![n] = FALSE]
    /\ UNCHANGED <<phase, nodeEpoch, session, leads, walVars, streamVars, dataVars,
                   failoverVars, ghostVars>>

-----------------------------------------------------------------------------
(* A node's life *)

\* ACTION: Crash(n) mirrors kill -9, a kernel panic or a lost host: the process ends with no
\* further step; what landed in its WAL stays; appends in flight are never acknowledged.  The
\* controller finds out only when the session expires.
Crash(n) ==
    /\ Up(n)
    /\ crashes < MaxCrashes
    /\ Perturb(n)
    /\ Gone(n)
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<nodeEpoch, session, grace, reservation, wal, streamVars, dataVars,
                   contexts, completed, zombieAcks>>

\* ACTION: Restart(n) mirrors a node process starting on the node's WAL with a new node epoch
\* (its start time) and registering (getOpeningStreams, failoverMode = false): the session is
\* FENCED until it has recovered, the grace period starts, and the WAL reservation is taken
\* with the new epoch (ConfirmWal acquires permission), which fences any older holder,
\* including a failover target still working on the previous epoch.
Restart(n) ==
    /\ phase[n] \in {"DOWN", "STOPPED"}
    /\ nodeEpoch[n] < MaxNodeEpoch
    /\ phase' = [phase EXCEPT ![n] = "RECOVERING"]
    /\ nodeEpoch' = [nodeEpoch EXCEPT ![n] = @ + 1]
    /\ session' = [session EXCEPT ![n] = "FENCED"]
    /\ grace' = [grace EXCEPT ![n] = TRUE]
    /\ reservation' = [reservation EXCEPT ![n] = [epoch |-> nodeEpoch[n] + 1, failover |-> FALSE]]
    /\ UNCHANGED <<leads, wal, pending, streamVars, dataVars, failoverVars, ghostVars>>

\* ACTION: RecoverOwnWal(n) mirrors AutoMQ's S3Storage.recover0 at start: read the
\* whole WAL, upload and commit the records of the node's still-OPENED streams, reset the
\* WAL, close those streams; then the node serves.  Refused (the node halts, see
\* DetectFence) when the reservation no longer verifies: a failover target took the WAL.
RecoverOwnWal(n) ==
    /\ phase[n] = "RECOVERING"
    /\ Verified(n)
    /\ LET uploaded == {w \in wal[n] : Committable(n, w)} IN
       committed' = committed \cup Recs(uploaded)
    /\ wal' = [wal EXCEPT ![n] = {}]
    /\ CloseAllOf(n)
    /\ phase' = [phase EXCEPT ![n] = "SERVING"]
    /\ UNCHANGED <<nodeEpoch, session, grace, leads, reservation, pending, streamOwner,
                   streamEpoch, nextRecord, acked, failoverVars, ghostVars>>

\* ACTION: BeginShutdown(n) mirrors SIGTERM: a graceful shutdown starts; the node takes no new
\* appends (in-flight ones still complete), and will upload and close before it stops.
BeginShutdown(n) ==
    /\ phase[n] = "SERVING"
    /\ Perturb(n)
    /\ phase' = [phase EXCEPT ![n] = "DRAINING"]
    /\ UNCHANGED <<nodeEpoch, session, grace, leads, walVars, streamVars, dataVars,
                   failoverVars, crashes, zombieAcks>>

\* ACTION: FinishShutdown(n) mirrors the end of a controlled shutdown: every stream of the node
\* is closed and no append is in flight; the WAL is shut, the controller no longer expects
\* heartbeats (no failover for a node that left cleanly).  A failover task it was running is
\* dropped.
FinishShutdown(n) ==
    /\ phase[n] = "DRAINING"
    /\ leads[n] = NoLeads
    /\ pending[n] = {}
    /\ phase' = [phase EXCEPT ![n] = "STOPPED"]
    /\ session' = [session EXCEPT ![n] = "STOPPED"]
    /\ task' = [task EXCEPT ![n] = NoTask]
    /\ UNCHANGED <<nodeEpoch, grace, leads, walVars, streamVars, dataVars, contexts,
                   completed, ghostVars>>

-----------------------------------------------------------------------------
(* Streams and records *)

\* ACTION: OpenStream(n, s) mirrors partition leader election followed by openStream with a
\* higher stream epoch: only a CLOSED stream (STREAM_NOT_CLOSED otherwise: the new leader waits
\* for the old owner, or its failover target, to close it), only on a SERVING node with an
\* ACTIVE session (KRaft elects unfenced brokers).
OpenStream(n, s) ==
    /\ phase[n] = "SERVING"
    /\ session[n] = "ACTIVE"
    /\ streamState[s] = "CLOSED"
    /\ NewStreamEpoch(s) \in StreamEpochs
    /\ streamState' = [streamState EXCEPT ![s] = "OPENED"]
    /\ streamOwner' = [streamOwner EXCEPT ![s] = n]
    /\ streamEpoch' = [streamEpoch EXCEPT ![s] = NewStreamEpoch(s)]
    /\ leads' = [leads EXCEPT ![n][s] = NewStreamEpoch(s)]
    /\ UNCHANGED <<phase, nodeEpoch, session, grace, walVars, dataVars, failoverVars,
                   ghostVars>>

\* ACTION: CloseStream(n, s) mirrors a partition leaving its leader (reassignment, graceful
\* shutdown): the node force-uploads the stream's records first (no acknowledged, still
\* committable record of s left in its WAL) and waits for its in-flight appends, then calls
\* closeStream.  If the controller no longer agrees the node owns s at that epoch
\* (STREAM_FENCED: a failover target closed it, someone reopened it), the node just drops its
\* belief (EXPIRED_STREAM_EPOCH counts as closed).
CloseStream(n, s) ==
    /\ phase[n] = "DRAINING"
    /\ leads[n][s] # NoEpoch
    /\ ~\E w \in pending[n] : w.stream = s
    /\ UploadBeforeClose =>
           ~\E w \in wal[n] : w.stream = s /\ w.rec \in AckedRecords /\ Committable(n, w)
    /\ IF streamState[s] = "OPENED" /\ streamOwner[s] = n /\ streamEpoch[s] = leads[n][s]
       THEN streamState' = [streamState EXCEPT ![s] = "CLOSED"]
       ELSE UNCHANGED streamState
    /\ leads' = [leads EXCEPT ![n][s] = NoEpoch]
    /\ UNCHANGED <<phase, nodeEpoch, session, grace, walVars, streamOwner, streamEpoch,
                   dataVars, failoverVars, ghostVars>>

\* ACTION: AppendRecord(n, s) mirrors a produce request reaching S3Storage.append on a node
\* that believes it leads s: the record lands in the node's WAL (the block write, the S3 WAL
\* PUT) tagged with the stream epoch the node believes in.  It lands even when the WAL was
\* fenced meanwhile (an S3 PUT always succeeds; the writer finds out at verification); it is
\* not acknowledged yet.  A zombie does exactly this.
AppendRecord(n, s) ==
    /\ phase[n] = "SERVING"
    /\ leads[n][s] # NoEpoch
    /\ nextRecord \in Records
    /\ LET w == [rec |-> nextRecord, stream |-> s, sepoch |-> leads[n][s]] IN
       /\ wal' = [wal EXCEPT ![n] = @ \cup {w}]
       /\ pending' = [pending EXCEPT ![n] = @ \cup {w}]
    /\ nextRecord' = nextRecord + 1
    /\ UNCHANGED <<nodeVars, reservation, streamVars, acked, committed, failoverVars,
                   ghostVars>>

\* ACTION: AckAppend(n, r) mirrors the append completing: the record is durable and the
\* writer's reservation still verifies (S3 WAL: the reservation object re-read after the upload
\* group; block WAL: the write was not refused by a reservation conflict), so the producer gets
\* its acknowledgement.  zombieAcks records a violation of the fence for ZombieNeverAcked.
AckAppend(n, r) ==
    /\ Running(n)
    /\ \E w \in pending[n] :
        /\ w.rec = r
        /\ Verified(n)
        /\ pending' = [pending EXCEPT ![n] = @ \ {w}]
        /\ acked' = acked \cup {[rec |-> r, node |-> n, nepoch |-> nodeEpoch[n],
                                 stream |-> w.stream, sepoch |-> w.sepoch]}
        /\ zombieAcks' = IF reservation[n] # Own(n) THEN zombieAcks \cup {r} ELSE zombieAcks
    /\ UNCHANGED <<nodeVars, reservation, wal, streamVars, nextRecord, committed,
                   failoverVars, crashes, perturbed>>

\* ACTION: DetectFence(n) mirrors WALFencedException: a writer's verification fails (an
\* append's, or the WAL start check of a node recovering itself), the storage failure handler
\* closes what it can and halts the process.  The appends in flight are never acknowledged.
DetectFence(n) ==
    /\ VerifyReservation
    /\ Up(n)
    /\ reservation[n] # Own(n)
    /\ pending[n] # {} \/ phase[n] = "RECOVERING"
    /\ Gone(n)
    /\ UNCHANGED <<nodeEpoch, session, grace, reservation, wal, streamVars, dataVars,
                   contexts, completed, ghostVars>>

\* ACTION: UploadWal(n) mirrors AutoMQ's upload pipeline (prepare, upload, commit in block
\* order, and only then trim the WAL): the node uploads the records it acknowledged (its
\* LogCache), commits them (commitStreamSetObject) and trims its WAL.  The controller accepts
\* only records of streams still OPENED by n at the epoch they were written under
\* (STREAM_FENCED / OFFSET_NOT_MATCHED otherwise); those stay in the WAL.
UploadWal(n) ==
    /\ Running(n)
    /\ LET uploaded == {w \in wal[n] : w.rec \in AckedRecords /\ Committable(n, w)} IN
       /\ uploaded # {}
       /\ committed' = committed \cup Recs(uploaded)
       /\ wal' = [wal EXCEPT ![n] = @ \ uploaded]
    /\ UNCHANGED <<nodeVars, reservation, pending, streamVars, nextRecord, acked,
                   failoverVars, ghostVars>>

-----------------------------------------------------------------------------
(* Failover *)

\* ACTION: AssignFailover(n, t) mirrors FailoverControlManager's scan: n is a candidate (its
\* session is FENCED, it has OPENED streams, its epoch is older than the grace period), fewer
\* than MaxInFlight failovers are in flight and none for n, and t is another live node with an
\* ACTIVE session and no failover of its own.  The context goes to the KV store and t's
\* failover listener starts the task (one step here).
AssignFailover(n, t) ==
    /\ Candidate(n)
    /\ Cardinality(contexts) < MaxInFlight
    /\ ~\E c \in contexts : c.failed = n
    /\ t # n
    /\ phase[t] = "SERVING" /\ session[t] = "ACTIVE" /\ ~HasTask(t)
    /\ contexts' = contexts \cup {[failed |-> n, epoch |-> nodeEpoch[n], target |-> t]}
    /\ task' = [task EXCEPT ![t] = [failed |-> n, epoch |-> nodeEpoch[n], stage |-> "ASSIGNED",
                                    uploaded |-> FALSE]]
    /\ UNCHANGED <<nodeVars, walVars, streamVars, dataVars, completed, ghostVars>>

\* ACTION: FenceWal(t) mirrors the target's first step: take the failed node's WAL reservation
\* (block WAL: multi-attach the volume and NVMe Reservation Acquire; S3 WAL: overwrite the
\* reservation object with (failed node, failed epoch, failover = TRUE)).  Refused when the WAL
\* already belongs to a newer epoch (the request epoch must be >= the WAL's): the node
\* restarted, see AbortFailover.
FenceWal(t) ==
    /\ Running(t)
    /\ HasTask(t)
    /\ task[t].stage = "ASSIGNED"
    /\ LET n == task[t].failed IN
       /\ reservation[n].epoch <= task[t].epoch
       /\ reservation' = [reservation EXCEPT ![n] = [epoch |-> task[t].epoch, failover |-> TRUE]]
    /\ task' = [task EXCEPT ![t].stage = "FENCED"]
    /\ UNCHANGED <<nodeVars, wal, pending, streamVars, dataVars, contexts, completed,
                   ghostVars>>

\* ACTION: RecoverFailedWal(t) mirrors the target opening the failed node's WAL in FAILOVER
\* mode and running the standard recovery as that node: read every record, upload and commit
\* those of its still-OPENED streams, reset the WAL.  Only after the fence (FenceBeforeRead),
\* only while the reservation is still the target's, only while the node epoch is the failed
\* one (NODE_EPOCH_EXPIRED otherwise: see AbortFailover).
RecoverFailedWal(t) ==
    /\ Running(t)
    /\ HasTask(t)
    /\ IF FenceBeforeRead THEN task[t].stage = "FENCED"
                          ELSE task[t].stage \in {"ASSIGNED", "FENCED"}
    /\ LET n == task[t].failed IN
       /\ nodeEpoch[n] = task[t].epoch
       /\ task[t].stage = "FENCED" => reservation[n] = [epoch |-> task[t].epoch, failover |-> TRUE]
       /\ LET uploaded == {w \in wal[n] : Committable(n, w)} IN
          /\ committed' = committed \cup Recs(uploaded)
          /\ task' = [task EXCEPT ![t].stage = "RECOVERED", ![t].uploaded = uploaded # {}]
       /\ wal' = [wal EXCEPT ![n] = {}]
    /\ UNCHANGED <<nodeVars, reservation, pending, streamVars, nextRecord, acked, contexts,
                   completed, ghostVars>>

\* ACTION: CloseFailedStreams(t) mirrors the target closing every stream still OPENED on the
\* failed node (closeStream as that node, its epoch) and releasing the WAL: the task is done and
\* the partitions can reopen elsewhere.  The controller, which handles those closes, sees that
\* the node is no longer a candidate and removes the context at once: left behind, a context
\* for the same node and epoch would block a later failover of that node at that epoch (found
\* by MCFailoverLiveness.cfg: the node came back, reopened streams and died again).  Refused
\* (NODE_EPOCH_EXPIRED) if the node restarted.
CloseFailedStreams(t) ==
    /\ Running(t)
    /\ HasTask(t)
    /\ task[t].stage = "RECOVERED"
    /\ LET n == task[t].failed
           e == task[t].epoch
       IN /\ nodeEpoch[n] = e
          /\ CloseAllOf(n)
          /\ contexts' = {c \in contexts : c.failed # n \/ c.epoch # e}
          /\ completed' =
                 completed \cup {[failed |-> n, epoch |-> e, uploaded |-> task[t].uploaded]}
    /\ task' = [task EXCEPT ![t] = NoTask]
    /\ UNCHANGED <<nodeVars, walVars, streamOwner, streamEpoch, dataVars, ghostVars>>

\* ACTION: AbortFailover(t) mirrors a failover task failing for good: the failed node restarted
\* (its epoch moved on, so the controller answers NODE_EPOCH_EXPIRED and the WAL belongs to the
\* new incarnation).  The restarted node recovers its WAL itself.
AbortFailover(t) ==
    /\ Up(t)
    /\ HasTask(t)
    /\ nodeEpoch[task[t].failed] # task[t].epoch
    /\ task' = [task EXCEPT ![t] = NoTask]
    /\ UNCHANGED <<nodeVars, walVars, streamVars, dataVars, contexts, completed, ghostVars>>

\* ACTION: ClearFailover(n) mirrors the controller removing n's failover context: n is no
\* longer a candidate (no OPENED streams left, or its session is back, or it restarted), or
\* the target is no longer live to the controller (crashed, stopped, session expired), in
\* which case n may be assigned again: a target that is merely a zombie may still be working,
\* so two recoverers can overlap.  They write the same reservation and their commits and
\* closes are checked by the controller like any other.
ClearFailover(n) ==
    /\ \E c \in contexts :
        /\ c.failed = n
        /\ \/ session[n] # "FENCED"
           \/ OpenedBy(n) = {}
           \/ nodeEpoch[n] # c.epoch
           \/ ~Running(c.target)
           \/ session[c.target] # "ACTIVE"
        /\ contexts' = contexts \ {c}
    /\ UNCHANGED <<nodeVars, walVars, streamVars, dataVars, task, completed, ghostVars>>

-----------------------------------------------------------------------------

Next ==
    \/ \E n \in Nodes : Heartbeat(n)
    \/ \E n \in Nodes : ExpireSession(n)
    \/ \E n \in Nodes : EndGrace(n)
    \/ \E n \in Nodes : Crash(n)
    \/ \E n \in Nodes : Restart(n)
    \/ \E n \in Nodes : RecoverOwnWal(n)
    \/ \E n \in Nodes : BeginShutdown(n)
    \/ \E n \in Nodes : FinishShutdown(n)
    \/ \E n \in Nodes, s \in Streams : OpenStream(n, s)
    \/ \E n \in Nodes, s \in Streams : CloseStream(n, s)
    \/ \E n \in Nodes, s \in Streams : AppendRecord(n, s)
    \/ \E n \in Nodes, r \in Records : AckAppend(n, r)
    \/ \E n \in Nodes : DetectFence(n)
    \/ \E n \in Nodes : UploadWal(n)
    \/ \E n, t \in Nodes : AssignFailover(n, t)
    \/ \E t \in Nodes : FenceWal(t)
    \/ \E t \in Nodes : RecoverFailedWal(t)
    \/ \E t \in Nodes : CloseFailedStreams(t)
    \/ \E t \in Nodes : AbortFailover(t)
    \/ \E n \in Nodes : ClearFailover(n)

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
(* Invariants (the Python machine has inv_<snake_case> for each). *)

TypeOK ==
    /\ phase \in [Nodes -> Phases]
    /\ nodeEpoch \in [Nodes -> NodeEpochs]
    /\ session \in [Nodes -> Sessions]
    /\ grace \in [Nodes -> BOOLEAN]
    /\ reservation \in [Nodes -> Reservations]
    /\ \A n \in Nodes : wal[n] \subseteq WalEntries /\ pending[n] \subseteq WalEntries
    /\ leads \in [Nodes -> [Streams -> StreamEpochs \cup {NoEpoch}]]
    /\ streamState \in [Streams -> {"CLOSED", "OPENED"}]
    /\ streamOwner \in [Streams -> Nodes \cup {NoNode}]
    /\ streamEpoch \in [Streams -> StreamEpochs \cup {NoEpoch}]
    /\ nextRecord \in 1..(MaxRecords + 1)
    /\ acked \subseteq AckEntries
    /\ committed \subseteq Records
    /\ contexts \subseteq Contexts
    /\ \A t \in Nodes : task[t] = NoTask \/ task[t] \in Tasks
    /\ completed \subseteq Completions
    /\ crashes \in 0..MaxCrashes
    /\ perturbed \subseteq Nodes
    /\ zombieAcks \subseteq Records

\* The range an acknowledged record was written in is no longer open: its writer no longer
\* holds the stream at that epoch at the controller (it closed it, a failover target closed
\* it, or it was reopened elsewhere).
Settled(a) ==
    ~(/\ streamState[a.stream] = "OPENED"
      /\ streamOwner[a.stream] = a.node
      /\ streamEpoch[a.stream] = a.sepoch)

\* Every acknowledged record whose range is settled is in committed objects.  In particular,
\* once a failover has closed a dead node's streams, and once a graceful shutdown (or a
\* reassignment) has closed them, every record the node acknowledged on them is committed:
\* the partitions reopen elsewhere with nothing missing.
NoAckedRecordLost ==
    \A a \in acked : Settled(a) => a.rec \in committed

\* Acknowledged records are durable at all times: in committed objects or still in the WAL of
\* the node that acknowledged them, across crashes and failovers.
AckedRecordDurable ==
    \A a \in acked : a.rec \in committed \/ a.rec \in Recs(wal[a.node])

\* No writer gets a record acknowledged while its WAL reservation is someone else's.
ZombieNeverAcked == zombieAcks = {}

\* No two nodes believe they have the same stream open at the same stream epoch.
SingleOpenerPerEpoch ==
    \A s \in Streams, n1, n2 \in Nodes :
        (n1 # n2 /\ leads[n1][s] # NoEpoch) => leads[n1][s] # leads[n2][s]

\* At most MaxInFlight (one) failover contexts, at most one per failed node, never a node its
\* own target, and a target runs one task at a time.
OneFailoverInFlight ==
    /\ Cardinality(contexts) <= 1
    /\ \A c1, c2 \in contexts : c1.failed = c2.failed => c1 = c2
    /\ \A c \in contexts : c.target # c.failed
    /\ \A t \in Nodes : HasTask(t) => task[t].failed # t

-----------------------------------------------------------------------------
(* Liveness (MCFailoverLiveness.cfg): a dead node with open streams is eventually taken over,
   its streams closed, as long as the controller and the failover steps keep being taken. *)

DeadWithOpenStreams(n) == phase[n] = "DOWN" /\ OpenedBy(n) # {}

Fairness ==
    /\ \A n \in Nodes : WF_vars(ExpireSession(n)) /\ WF_vars(EndGrace(n))
    /\ \A n \in Nodes : SF_vars(\E t \in Nodes : AssignFailover(n, t))
    /\ \A n \in Nodes : WF_vars(ClearFailover(n)) /\ WF_vars(Heartbeat(n))
    /\ \A t \in Nodes : WF_vars(FenceWal(t)) /\ WF_vars(RecoverFailedWal(t))
    /\ \A t \in Nodes : WF_vars(CloseFailedStreams(t)) /\ WF_vars(AbortFailover(t))
    /\ \A n \in Nodes : WF_vars(RecoverOwnWal(n)) /\ WF_vars(DetectFence(n))

LiveSpec == Spec /\ Fairness

DeadNodeRecovered == \A n \in Nodes : DeadWithOpenStreams(n) ~> OpenedBy(n) = {}
=============================================================================
