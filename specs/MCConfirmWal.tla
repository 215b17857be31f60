---------------------------- MODULE MCConfirmWal ----------------------------
(***************************************************************************)
(* Model of ConfirmWal for TLC: the "this interesting state is             *)
(* unreachable" invariants that the *Reach models expect TLC to VIOLATE    *)
(* (a violation proves the behaviour is reachable, so the real invariants  *)
(* are not vacuously true), and the symmetry set of the main models.       *)
(***************************************************************************)
EXTENDS ConfirmWal

\* Source proxies are interchangeable as long as the spec never names one: Reader appears only
\* in the ResolveViaSource = FALSE mutation, whose model therefore has no symmetry; nor has
\* the liveness model (symmetry and liveness checking do not mix soundly).
SourceSymmetry == Permutations(Sources)

\* lostFrom is a history variable no action reads and only the ReachRestart invariant
\* mentions: the models that do not check it leave it out of the fingerprint.
ViewWithoutHistory == <<channel, nextProduce, wal, confirm, restarts, proxyVars>>

\* Reach: the proxy serves a read whose data came from a resolved Link Record.
NoResolvedLinkServed == ~lastRead.link

\* ReachRestart: a crash of the main took back an offset it had assigned (to a record that was
\* not yet durable), the restarted main assigned it again, and the proxy serves it.
NoServeOfReassignedOffset ==
    ~(lostFrom # NoOffset /\ lastRead.off >= lostFrom)
=============================================================================
