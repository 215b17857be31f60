----------------------------- MODULE Transaction -----------------------------
(***************************************************************************)
(* One transactional id: its transaction coordinator, the producer         *)
(* instances that share the id, and the partitions they write to, with     *)
(* the two defences against late and zombie writes: epoch bumps that fence *)
(* an aborted transaction's writes, and partition verification (KIP-890   *)
(* part 1) before the first write of a transaction to a partition.         *)
(*                                                                         *)
(* Machine: automq_ref/state_machines/transaction.py (the coordinator,     *)
(* and the partition's side in transaction_partition.py).                  *)
(* Properties: tests/properties/test_transaction.py::TransactionMachine.   *)
(* Traces: tests/properties/test_transaction_trace.py (its runs, with TLC).*)
(* Sources: Kafka's transaction coordinator (TransactionCoordinator,       *)
(* TransactionMetadata: the states and their valid previous states;        *)
(* InitProducerId, AddPartitionsToTxn, EndTxn, the timeout abort through   *)
(* PrepareEpochFence), the partition's producer state (ProducerAppendInfo, *)
(* VerificationGuard), KIP-360 (a producer bumps its epoch with            *)
(* InitProducerId after an abort whose writes' fate it does not know) and  *)
(* KIP-890 part 1 (verification).                                          *)
(*                                                                         *)
(* WHAT IS MODELLED.  The coordinator applies one request at a time, each  *)
(* atomically, its transaction log write included (a decision is durable   *)
(* when it is taken).  An instance initializes (InitProducerId: a new      *)
(* epoch; an older instance is fenced), adds partitions to its            *)
(* transaction, sends writes to them, which travel to the partition and    *)
(* may be delayed, lost or given up on by the instance (a produce timeout: *)
(* the write's fate is unknown to it, so it must abort, and bump its epoch *)
(* before its next transaction), and ends the transaction (EndTxn, answered *)
(* once the decision is durable, before the markers).  The coordinator     *)
(* writes a marker to each partition of the transaction, then completes    *)
(* it; a transaction that runs too long is aborted by the coordinator with *)
(* an epoch bump (PrepareEpochFence), as is the ongoing transaction of an  *)
(* instance that another one initializes over.  A partition verifies with  *)
(* the coordinator before the first write of a transaction lands: the      *)
(* coordinator must be Ongoing with the partition in the transaction, at   *)
(* the write's epoch; the guard the verification leaves is cleared by the  *)
(* next marker, so a write verified before a marker does not land after it.*)
(*                                                                         *)
(* WHAT IS ABSTRACTED AWAY, AND WHY.                                       *)
(* - Time: a transaction "may time out at any moment" (TimeOut), and a    *)
(*   write may arrive at any later moment (Append), or never (Lose).       *)
(* - One producer id: ids are only reissued when an epoch runs out or the  *)
(*   id expires (Dead), and a new id starts a new producer state at every  *)
(*   partition, which the bounded epochs stand for.  Dead and id           *)
(*   expiration are in the machine, not here.                              *)
(* - Offsets, record contents, sequence numbers (idempotence is per        *)
(*   partition and checked apart), AddOffsetsToTxn and TxnOffsetCommit     *)
(*   (the group offsets of a transaction are one more partition of it),    *)
(*   coordinator failover (a new coordinator loads the durable state this  *)
(*   spec keeps) and coordinator epochs.                                   *)
(* - Retries of coordinator requests: each request is answered; a retry    *)
(*   is a new request on the state the answer left.                        *)
(* - EndTxn v5 (KIP-890 part 2, an epoch bump on every EndTxn): the       *)
(*   clients served here end transactions with v4 or lower.               *)
(*                                                                         *)
(* BOUNDS AND SWITCHES.  Epochs run up to MaxEpoch, writes up to MaxWrites *)
(* and transactions (attempts) per instance up to MaxAttempts: a step that *)
(* would pass a bound is disabled.  BumpOnFence and VerifyPartitions are  *)
(* TRUE in the real spec; each mutation model sets one to FALSE and must   *)
(* make TLC report a named invariant (specs/README.md).                    *)
(***************************************************************************)
EXTENDS Naturals, Integers, Sequences, FiniteSets

CONSTANTS
    Instances,        \* producer instances of the one transactional id (a symmetry set)
    Partitions,       \* the partitions they write to
    MaxEpoch,         \* producer epochs are -1 (none) .. MaxEpoch
    MaxWrites,        \* writes sent in all
    MaxAttempts,      \* transactions an instance begins
    \* Switches for mutation models; both TRUE in the real spec.
    BumpOnFence,      \* the coordinator's own abort (timeout, fencing) bumps the epoch
    VerifyPartitions  \* a transaction's first write to a partition is verified first

ASSUME
    /\ Instances # {} /\ Partitions # {}
    /\ MaxEpoch \in Nat /\ MaxWrites \in Nat /\ MaxAttempts \in Nat \ {0}
    /\ {BumpOnFence, VerifyPartitions} \subseteq BOOLEAN

Epochs == -1..MaxEpoch
NoEpoch == -1
States == {"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
           "CompleteAbort", "PrepareEpochFence"}
Results == {"COMMIT", "ABORT"}
\* An instance (the client's TransactionManager): not initialized, between transactions, in
\* one, or stopped by a fatal error (PRODUCER_FENCED, INVALID_TXN_STATE).
InstanceStates == {"Uninitialized", "Ready", "InTransaction", "FatalError"}

VARIABLES
    \* The coordinator (TransactionMetadata of the id).
    txnState,         \* its state ("Empty" before the first InitProducerId, epoch -1)
    producerEpoch,    \* the id's producer epoch (-1: never initialized)
    txnPartitions,    \* the partitions of the transaction (topicPartitions)
    pendingMarkers,   \* the partitions whose marker is still to be written (Prepare*)
    \* The partitions (each one's producer state for the id's producer id).
    log,              \* the partition's batches of the producer: data and markers
    partitionEpoch,   \* the producer epoch the partition last accepted (-1: none)
    openTxn,          \* the epoch of the transaction open at the partition (-1: none)
    verified,         \* the epoch a verification guard was left for (-1: none)
    \* The instances.
    instanceState,
    instanceEpoch,    \* the epoch the instance holds (-1: none)
    attempt,          \* the instance's current or next transaction's count: an attempt is
                      \* one transaction as the instance sees it, <<instance, count>>
    added,            \* the partitions it was told are in its transaction
    abortable,        \* a write of this transaction failed or was given up: it must abort
    fateUnknown,      \* ... given up (a produce timeout): the write may still land
    mustBump,         \* it aborted with a write's fate unknown: InitProducerId next (KIP-360)
    \* The network.
    inFlight,         \* writes sent and not yet landed or lost: [a, e, p, w]
    pending,          \* writes an instance still waits for (w ids)
    \* History.
    sent,             \* writes sent so far (their ids are 1..sent)
    decisions,        \* [a, result, zombie]: the EndTxn answers NONE an instance got;
                      \* zombie: its attempt was aborted by the coordinator, or the
                      \* instance fenced, when the answer was given
    aborts,           \* attempts the coordinator aborted on its own (timeout, fence)
    fenced            \* instances another instance's InitProducerId fenced

coordinatorVars == <<txnState, producerEpoch, txnPartitions, pendingMarkers>>
partitionVars == <<log, partitionEpoch, openTxn, verified>>
instanceVars == <<instanceState, instanceEpoch, attempt, added, abortable, fateUnknown, mustBump>>
networkVars == <<inFlight, pending>>
historyVars == <<sent, decisions, aborts, fenced>>
vars == <<coordinatorVars, partitionVars, instanceVars, networkVars, historyVars>>

-----------------------------------------------------------------------------
(* Helpers *)

Max(a, b) == IF a >= b THEN a ELSE b

Data(a, e, w) == [kind |-> "DATA", a |-> a, e |-> e, w |-> w]
Marker(r, e) == [kind |-> r, e |-> e]

\* The instance's current attempt.
AttemptOf(i) == <<i, attempt[i]>>

\* The attempt of the transaction the coordinator holds: the instance that holds the epoch.
Holder == {i \in Instances : instanceEpoch[i] = producerEpoch /\ producerEpoch # NoEpoch}

\* A bump, or none in the mutation of the coordinator's own abort.
FenceEpoch == IF BumpOnFence THEN producerEpoch + 1 ELSE producerEpoch

Completed == {"CompleteCommit", "CompleteAbort"}
Preparing == {"PrepareCommit", "PrepareAbort"}

\* The fate of the k-th batch of partition p's log: the result of the first marker after it
\* ("NONE" while no marker follows it).
Fate(p, k) ==
    LET later == {j \in (k + 1)..Len(log[p]) : log[p][j].kind # "DATA"}
    IN IF later = {} THEN "NONE"
       ELSE log[p][CHOOSE j \in later : \A j2 \in later : j <= j2].kind

\* Every landed write, with its fate: [a, w, fate].
Landed == UNION {{[a |-> log[p][k].a, w |-> log[p][k].w, fate |-> Fate(p, k)] :
                     k \in {k \in 1..Len(log[p]) : log[p][k].kind = "DATA"}} : p \in Partitions}

-----------------------------------------------------------------------------
(* Initial state *)

Init ==
    /\ txnState = "Empty"
    /\ producerEpoch = NoEpoch
    /\ txnPartitions = {}
    /\ pendingMarkers = {}
    /\ log = [p \in Partitions |-> <<>>]
    /\ partitionEpoch = [p \in Partitions |-> NoEpoch]
    /\ openTxn = [p \in Partitions |-> NoEpoch]
    /\ verified = [p \in Partitions |-> NoEpoch]
    /\ instanceState = [i \in Instances |-> "Uninitialized"]
    /\ instanceEpoch = [i \in Instances |-> NoEpoch]
    /\ attempt = [i \in Instances |-> 1]
    /\ added = [i \in Instances |-> {}]
    /\ abortable = [i \in Instances |-> FALSE]
    /\ fateUnknown = [i \in Instances |-> FALSE]
    /\ mustBump = [i \in Instances |-> FALSE]
    /\ inFlight = {}
    /\ pending = [i \in Instances |-> {}]
    /\ sent = 0
    /\ decisions = {}
    /\ aborts = {}
    /\ fenced = {}

-----------------------------------------------------------------------------
(* The coordinator's answers *)

\* ACTION: InitProducerId(transactionalId) from a new instance, or with the instance's
\* producer id and epoch (KIP-360) after an abort whose writes' fate it does not know.
\* Empty or Complete*: a new epoch (an exhausted epoch would take a new producer id,
\* abstracted: the step is disabled at MaxEpoch); every other instance that held one is
\* fenced. Ongoing: CONCURRENT_TRANSACTIONS, and the coordinator fences the transaction
\* (FenceOngoing); Prepare*, PrepareEpochFence: CONCURRENT_TRANSACTIONS. Both are stutters
\* here: the instance asks again. With the instance's own epoch while another is current:
\* PRODUCER_FENCED.
InitProducerId(i) ==
    /\ \/ instanceState[i] = "Uninitialized"
       \/ instanceState[i] = "Ready" /\ mustBump[i]
    /\ IF instanceState[i] = "Ready" /\ instanceEpoch[i] # producerEpoch
       THEN \* PRODUCER_FENCED: another instance holds the id now.
            /\ instanceState' = [instanceState EXCEPT ![i] = "FatalError"]
            /\ UNCHANGED <<coordinatorVars, instanceEpoch, mustBump, fenced>>
       ELSE /\ txnState \in {"Empty"} \cup Completed
            /\ producerEpoch + 1 <= MaxEpoch
            /\ producerEpoch' = producerEpoch + 1
            /\ txnState' = "Empty"
            /\ txnPartitions' = {}
            /\ UNCHANGED pendingMarkers
            /\ instanceState' = [instanceState EXCEPT ![i] = "Ready"]
            /\ instanceEpoch' = [instanceEpoch EXCEPT ![i] = producerEpoch + 1]
            /\ mustBump' = [mustBump EXCEPT ![i] = FALSE]
            /\ fenced' = fenced \cup {j \in Instances \ {i} : instanceEpoch[j] # NoEpoch}
    /\ UNCHANGED <<partitionVars, attempt, added, abortable, fateUnknown, networkVars, sent,
                   decisions, aborts>>

\* The fencing half of InitProducerId over an ongoing transaction, and the timeout abort
\* (transaction.timeout.ms passed): Ongoing -> PrepareEpochFence at a bumped epoch. The
\* instance that began the transaction is not told.
FenceOngoing ==
    /\ txnState = "Ongoing"
    /\ FenceEpoch <= MaxEpoch
    /\ txnState' = "PrepareEpochFence"
    /\ producerEpoch' = FenceEpoch
    /\ aborts' = aborts \cup {AttemptOf(i) : i \in Holder}
    /\ UNCHANGED <<txnPartitions, pendingMarkers, partitionVars, instanceVars, networkVars,
                   sent, decisions, fenced>>

\* The abort after the fence: PrepareEpochFence -> PrepareAbort, its markers to be written.
AbortFenced ==
    /\ txnState = "PrepareEpochFence"
    /\ txnState' = "PrepareAbort"
    /\ pendingMarkers' = txnPartitions
    /\ UNCHANGED <<producerEpoch, txnPartitions, partitionVars, instanceVars, networkVars,
                   historyVars>>

\* ACTION: AddPartitionsToTxn(transactionalId, producerId, epoch, partitions) from an
\* instance (v3 and lower: the client's form). Another epoch: PRODUCER_FENCED (the instance
\* stops). Prepare*, PrepareEpochFence: CONCURRENT_TRANSACTIONS (a stutter: it asks again).
\* Empty, Ongoing, Complete*: Ongoing, with the partitions added. The instance sends it while
\* its transaction may commit, but one of its writes may be refused or given up on before the
\* answer comes (a request takes time in the machine and in a client), so the answer may find
\* it abortable: the partitions are added all the same, and it can only abort.
AddPartitionsToTxn(i, P) ==
    /\ instanceState[i] \in {"Ready", "InTransaction"}
    /\ ~mustBump[i]
    /\ instanceState[i] = "Ready" => attempt[i] <= MaxAttempts
    /\ P # {} /\ ~(P \subseteq added[i])
    /\ IF instanceEpoch[i] # producerEpoch
       THEN /\ instanceState' = [instanceState EXCEPT ![i] = "FatalError"]
            /\ UNCHANGED <<coordinatorVars, added>>
       ELSE /\ txnState \in {"Empty", "Ongoing"} \cup Completed
            /\ txnState' = "Ongoing"
            /\ txnPartitions' = IF txnState = "Ongoing" THEN txnPartitions \cup P ELSE P
            /\ instanceState' = [instanceState EXCEPT ![i] = "InTransaction"]
            /\ added' = [added EXCEPT ![i] = added[i] \cup P]
            /\ UNCHANGED <<producerEpoch, pendingMarkers>>
    /\ UNCHANGED <<partitionVars, instanceEpoch, attempt, abortable, fateUnknown, mustBump,
                   networkVars, historyVars>>

\* ACTION: EndTxn(transactionalId, producerId, epoch, result) from an instance that waits
\* for none of its writes; COMMIT only when none failed. Another epoch: PRODUCER_FENCED.
\* Ongoing: PrepareCommit / PrepareAbort, answered NONE once durable (before the markers).
\* Prepare*, PrepareEpochFence: CONCURRENT_TRANSACTIONS (a stutter). Empty, Complete*:
\* INVALID_TXN_STATE (fatal to the instance). After an abort with a write's fate unknown the
\* instance bumps its epoch before its next transaction (KIP-360).
EndTxn(i, r) ==
    /\ instanceState[i] = "InTransaction"
    /\ pending[i] = {}
    /\ r = "COMMIT" => ~abortable[i]
    /\ IF instanceEpoch[i] = producerEpoch /\ txnState = "Ongoing"
       THEN /\ txnState' = IF r = "COMMIT" THEN "PrepareCommit" ELSE "PrepareAbort"
            /\ pendingMarkers' = txnPartitions
            /\ decisions' = decisions \cup
                   {[a |-> AttemptOf(i), result |-> r,
                     zombie |-> AttemptOf(i) \in aborts \/ i \in fenced]}
            /\ instanceState' = [instanceState EXCEPT ![i] = "Ready"]
            /\ attempt' = [attempt EXCEPT ![i] = attempt[i] + 1]
            /\ added' = [added EXCEPT ![i] = {}]
            /\ abortable' = [abortable EXCEPT ![i] = FALSE]
            /\ fateUnknown' = [fateUnknown EXCEPT ![i] = FALSE]
            /\ mustBump' = [mustBump EXCEPT ![i] = fateUnknown[i]]
            /\ UNCHANGED <<producerEpoch, txnPartitions>>
       ELSE \* PRODUCER_FENCED, or INVALID_TXN_STATE: fatal either way.
            /\ instanceEpoch[i] # producerEpoch \/ txnState \in {"Empty"} \cup Completed
            /\ instanceState' = [instanceState EXCEPT ![i] = "FatalError"]
            /\ UNCHANGED <<coordinatorVars, decisions, attempt, added, abortable, fateUnknown,
                           mustBump>>
    /\ UNCHANGED <<partitionVars, instanceEpoch, networkVars, sent, aborts, fenced>>

\* ACTION: MarkerWritten(transactionalId, partition): the marker of the transaction the
\* coordinator prepares is written to one partition (WriteTxnMarkers), at the coordinator's
\* epoch: the partition's open transaction ends, its guard goes.
MarkerWritten(p) ==
    /\ txnState \in Preparing
    /\ p \in pendingMarkers
    /\ LET r == IF txnState = "PrepareCommit" THEN "COMMIT" ELSE "ABORT"
       IN log' = [log EXCEPT ![p] = Append(log[p], Marker(r, producerEpoch))]
    /\ partitionEpoch' = [partitionEpoch EXCEPT ![p] = Max(partitionEpoch[p], producerEpoch)]
    /\ openTxn' = [openTxn EXCEPT ![p] = NoEpoch]
    /\ verified' = [verified EXCEPT ![p] = NoEpoch]
    /\ pendingMarkers' = pendingMarkers \ {p}
    /\ UNCHANGED <<txnState, producerEpoch, txnPartitions, instanceVars, networkVars,
                   historyVars>>

\* Every marker written: CompleteCommit / CompleteAbort.
CompleteTransaction ==
    /\ txnState \in Preparing
    /\ pendingMarkers = {}
    /\ txnState' = IF txnState = "PrepareCommit" THEN "CompleteCommit" ELSE "CompleteAbort"
    /\ txnPartitions' = {}
    /\ UNCHANGED <<producerEpoch, pendingMarkers, partitionVars, instanceVars, networkVars,
                   historyVars>>

-----------------------------------------------------------------------------
(* Writes *)

\* The instance learns that its write w was refused, if it still waits for it: its
\* transaction must abort.
Refused(m) ==
    IF m.w \in pending[m.a[1]]
    THEN /\ pending' = [pending EXCEPT ![m.a[1]] = pending[m.a[1]] \ {m.w}]
         /\ abortable' = [abortable EXCEPT ![m.a[1]] = TRUE]
    ELSE UNCHANGED <<pending, abortable>>

\* An instance sends a transactional write to a partition of its transaction.
Send(i, p) ==
    /\ instanceState[i] = "InTransaction"
    /\ p \in added[i]
    /\ ~abortable[i]
    /\ sent < MaxWrites
    /\ sent' = sent + 1
    /\ inFlight' = inFlight \cup {[a |-> AttemptOf(i), e |-> instanceEpoch[i], p |-> p,
                                   w |-> sent + 1]}
    /\ pending' = [pending EXCEPT ![i] = pending[i] \cup {sent + 1}]
    /\ UNCHANGED <<coordinatorVars, partitionVars, instanceVars, decisions, aborts, fenced>>

\* ACTION: AddPartitionsToTxnVerify, AddPartitionsToTxn(transactionalId, producerId, epoch,
\* [partition], verifyOnly) in its v4+ form, the broker's: the partition asks the coordinator
\* before the first write of a transaction lands. Ongoing, the partition in it, at the
\* write's epoch: NONE, and the partition keeps a guard for that epoch. Otherwise (PRODUCER_FENCED, CONCURRENT_TRANSACTIONS,
\* TRANSACTION_ABORTABLE) the write is refused (INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE).
AddPartitionsToTxnVerify(m) ==
    /\ VerifyPartitions
    /\ openTxn[m.p] = NoEpoch
    /\ m.e >= partitionEpoch[m.p]
    /\ verified[m.p] # m.e
    /\ IF txnState = "Ongoing" /\ m.p \in txnPartitions /\ m.e = producerEpoch
       THEN /\ verified' = [verified EXCEPT ![m.p] = m.e]
            /\ UNCHANGED <<inFlight, pending, abortable>>
       ELSE /\ inFlight' = inFlight \ {m}
            /\ Refused(m)
            /\ UNCHANGED verified
    /\ UNCHANGED <<coordinatorVars, log, partitionEpoch, openTxn, instanceState, instanceEpoch,
                   attempt, added, fateUnknown, mustBump, historyVars>>

\* The write's Produce request reaches the partition. An older epoch than the
\* partition's: refused (INVALID_PRODUCER_EPOCH). The first write of a transaction needs the
\* guard of its epoch (unless VerifyPartitions is off), else INVALID_TXN_STATE; a later one
\* joins the open transaction. Any batch of the producer that lands clears the guard.
Produce(m) ==
    /\ inFlight' = inFlight \ {m}
    /\ IF m.e < partitionEpoch[m.p]
          \/ (openTxn[m.p] = NoEpoch /\ VerifyPartitions /\ verified[m.p] # m.e)
       THEN /\ Refused(m)
            /\ UNCHANGED partitionVars
       ELSE /\ pending' = [pending EXCEPT ![m.a[1]] = pending[m.a[1]] \ {m.w}]
            /\ log' = [log EXCEPT ![m.p] = Append(log[m.p], Data(m.a, m.e, m.w))]
            /\ partitionEpoch' = [partitionEpoch EXCEPT ![m.p] = m.e]
            /\ openTxn' = [openTxn EXCEPT ![m.p] = IF openTxn[m.p] = NoEpoch
                                                   THEN m.e ELSE openTxn[m.p]]
            /\ verified' = [verified EXCEPT ![m.p] = NoEpoch]  \* a batch of it landed
            /\ UNCHANGED abortable
    /\ UNCHANGED <<coordinatorVars, instanceState, instanceEpoch, attempt, added, fateUnknown,
                   mustBump, historyVars>>

\* The network loses a write (the instance will give up on it).
Lose(m) ==
    /\ inFlight' = inFlight \ {m}
    /\ UNCHANGED <<coordinatorVars, partitionVars, instanceVars, pending, historyVars>>

\* The instance stops waiting for a write (a produce timeout): its fate is unknown to it,
\* so its transaction must abort; the write may still land.
GiveUp(i, w) ==
    /\ w \in pending[i]
    /\ pending' = [pending EXCEPT ![i] = pending[i] \ {w}]
    /\ abortable' = [abortable EXCEPT ![i] = TRUE]
    /\ fateUnknown' = [fateUnknown EXCEPT ![i] = TRUE]
    /\ UNCHANGED <<coordinatorVars, partitionVars, instanceState, instanceEpoch, attempt,
                   added, mustBump, inFlight, historyVars>>

-----------------------------------------------------------------------------

Next ==
    \/ \E i \in Instances : InitProducerId(i)
    \/ FenceOngoing
    \/ AbortFenced
    \/ \E i \in Instances, P \in SUBSET Partitions : AddPartitionsToTxn(i, P)
    \/ \E i \in Instances, r \in Results : EndTxn(i, r)
    \/ \E p \in Partitions : MarkerWritten(p)
    \/ CompleteTransaction
    \/ \E i \in Instances, p \in Partitions : Send(i, p)
    \/ \E m \in inFlight : AddPartitionsToTxnVerify(m)
    \/ \E m \in inFlight : Produce(m)
    \/ \E m \in inFlight : Lose(m)
    \/ \E i \in Instances, w \in 1..MaxWrites : GiveUp(i, w)

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
(* Invariants *)

TypeOK ==
    /\ txnState \in States
    /\ producerEpoch \in Epochs
    /\ txnPartitions \subseteq Partitions
    /\ pendingMarkers \subseteq txnPartitions
    /\ \A p \in Partitions :
        /\ partitionEpoch[p] \in Epochs /\ openTxn[p] \in Epochs /\ verified[p] \in Epochs
    /\ instanceState \in [Instances -> InstanceStates]
    /\ instanceEpoch \in [Instances -> Epochs]
    /\ attempt \in [Instances -> 1..(MaxAttempts + 1)]
    /\ sent \in 0..MaxWrites

\* A transaction's writes share one fate: no attempt has a write under a COMMIT marker and
\* another under an ABORT marker.
AllOrNothing ==
    \A x, y \in Landed : x.a = y.a => ~(x.fate = "COMMIT" /\ y.fate = "ABORT")

\* An attempt that ended in an abort (the instance's or the coordinator's) has no write
\* under a COMMIT marker; one the instance was told is committed has none under an ABORT.
OutcomeAsAnswered ==
    \A x \in Landed :
        /\ x.fate = "COMMIT" => x.a \notin aborts
                                /\ ~\E d \in decisions : d.a = x.a /\ d.result = "ABORT"
        /\ x.fate = "ABORT" => ~\E d \in decisions : d.a = x.a /\ d.result = "COMMIT"

\* No instance is told its commit succeeded once the coordinator aborted that transaction
\* or another instance fenced it.
NoZombieCommit ==
    \A d \in decisions : d.result = "COMMIT" => ~d.zombie

\* A transaction open at a partition is one the coordinator has not finished: Ongoing (or
\* being fenced) with the partition in it, or preparing with its marker still to come. A
\* write that opened a transaction the coordinator does not know would hold the partition's
\* last stable offset back for ever (a hanging transaction).
NoHangingTransaction ==
    \A p \in Partitions : openTxn[p] # NoEpoch =>
        \/ txnState \in {"Ongoing", "PrepareEpochFence"} /\ p \in txnPartitions
        \/ txnState \in Preparing /\ p \in pendingMarkers

\* A marker is never older than the partition's producer epoch (it would be refused).
MarkersNotStale ==
    txnState \in Preparing => \A p \in pendingMarkers : partitionEpoch[p] <= producerEpoch
=============================================================================
