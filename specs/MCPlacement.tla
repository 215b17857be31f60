----------------------------- MODULE MCPlacement -----------------------------
(***************************************************************************)
(* Model of Placement for TLC: the symmetry set and the "this interesting  *)
(* state is unreachable" invariant that the Reach model expects TLC to     *)
(* VIOLATE (a violation proves the behaviour is reachable, so the real     *)
(* invariants are not vacuously true).                                     *)
(***************************************************************************)
EXTENDS Placement, TLC

\* Brokers are interchangeable: no action or invariant orders or names them.
BrokerSymmetry == Permutations(Brokers)

\* Reach: a partition was opened by one broker, then by another (a move that completed).
NoHandOff == ~\E o1, o2 \in openers : o1.p = o2.p /\ o1.b # o2.b
=============================================================================
