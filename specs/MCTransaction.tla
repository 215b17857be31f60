---------------------------- MODULE MCTransaction ----------------------------
(***************************************************************************)
(* Model of Transaction for TLC: the symmetry sets and the "this           *)
(* interesting behaviour is unreachable" invariants that the Reach models  *)
(* expect TLC to VIOLATE (a violation proves the behaviour is reachable,   *)
(* so the real invariants are not vacuously true).                         *)
(***************************************************************************)
EXTENDS Transaction, TLC

\* Instances and partitions are interchangeable: no action or invariant orders or names them.
Symmetry == Permutations(Instances) \cup Permutations(Partitions)

\* Reach: a transaction of two writes committed (both under a COMMIT marker).
NoTwoWriteCommit ==
    ~\E x, y \in Landed : x.a = y.a /\ x.w # y.w /\ x.fate = "COMMIT" /\ y.fate = "COMMIT"

\* Reach: a write given up on lands after all, and its transaction aborts.
NoLateWriteAborted ==
    ~\E x \in Landed, i \in Instances : x.a[1] = i /\ x.fate = "ABORT" /\ mustBump[i]

\* Reach: an instance's ongoing transaction is aborted by another instance's InitProducerId,
\* which fences it; it stops (FatalError), while the other commits.
NoFencedInstanceStopped ==
    ~\E i \in Instances :
        /\ instanceState[i] = "FatalError"
        /\ i \in fenced
        /\ \E n \in 1..MaxAttempts : <<i, n>> \in aborts
        /\ \E d \in decisions : d.result = "COMMIT" /\ d.a[1] # i
=============================================================================
