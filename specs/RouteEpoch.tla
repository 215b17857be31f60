------------------------------ MODULE RouteEpoch ------------------------------
(***************************************************************************)
(* Route epochs of the zone router: when may a proxy trim its              *)
(* RouterChannel?                                                          *)
(*                                                                         *)
(* Machine: automq_ref/state_machines/route_epoch.py.  Properties:         *)
(* tests/properties/test_route_epoch.py::RouteEpochMachine.                *)
(* Sources: AutoMQ's S3 WAL, its ConfirmWAL, the zone router's produce     *)
(* path and its route epochs (AutoMQ/automq                                *)
(* RouterChannelEpochControlManager.java, CommittedEpochManager.java,      *)
(* ObjectRouterChannel.java, RouterInV2.java), and the "RouterChannel      *)
(* Cleanup" section of the ZeroZone 2.0 design (AutoMQ/automq #2642);     *)
(* docs/machines/route_epoch.md tells the protocol in prose.               *)
(*                                                                         *)
(* THE PROTOCOL.  A produce request from a client in another zone reaches  *)
(* a PROXY in the client's zone.  The proxy appends the data to its own    *)
(* RouterChannel (a WAL in shared storage that any node can read), tagged  *)
(* with the newest ROUTE EPOCH the proxy has seen, and forwards a small    *)
(* ZoneRouteRequest carrying that epoch and the channel offset to the MAIN *)
(* (the partition leader).  The main reads the data from the channel and   *)
(* appends to its own WAL only a LINK RECORD that points into the proxy's  *)
(* channel; its LogCache keeps the full data, and the next upload (a       *)
(* commit) puts the full data in object storage.  Until that upload, the   *)
(* Link Record in the main's WAL is the only durable trace of an           *)
(* acknowledged write, and it is useless without the channel data it       *)
(* points to: after a crash, recovery (or a failover target) reads the     *)
(* channel to turn Link Records back into data.  So a proxy may trim its   *)
(* channel data of epoch E only when every Link Record that points to it   *)
(* is in committed storage.  Route epochs are how the cluster learns that: *)
(*                                                                         *)
(*  - every 10 s the controller bumps the route epoch and the FENCED epoch *)
(*    (fenced = route - FenceGap) in one KV record, which KRaft carries to *)
(*    every node, each at its own pace (BumpRouteEpoch, LearnRouteEpoch);  *)
(*  - a main rejects every request whose epoch is at or below the fenced   *)
(*    epoch it knows (ReceiveRequest);                                     *)
(*  - a main picks as its WAITING epoch the largest epoch E at or below    *)
(*    its fenced epoch such that no accepted request of epoch <= E is      *)
(*    still in flight, uploads its LogCache (which holds the full data of  *)
(*    every Link Record it appended) and then writes E as its committed    *)
(*    route epoch (ReportCommittedEpoch);                                  *)
(*  - the controller publishes committed = the minimum of the reports of   *)
(*    the counted nodes (a node that is FENCED and has no open streams is  *)
(*    not counted; any counted node that never reported leaves it          *)
(*    undefined) (PublishCommittedEpoch, and again at every bump);         *)
(*  - a proxy trims its channel up to the committed epoch it knows, in the *)
(*    same callback that delivers the record (LearnRouteEpoch).            *)
(*                                                                         *)
(* Why it is safe: a main reports E only once it rejects every epoch <= E  *)
(* and has nothing of epoch <= E in flight, so after its report no new     *)
(* Link Record of epoch <= E can appear there, and every earlier one was   *)
(* uploaded before the report.  The minimum over counted nodes extends     *)
(* that to every main that can still hold a Link Record; a node that is    *)
(* not counted is down and its streams are closed, which in AutoMQ means   *)
(* its WAL was uploaded by a failover (or by its own recovery).            *)
(*                                                                         *)
(* THE FENCE GAP.  The seed sets fenced = new - 1, AutoMQ's controller     *)
(* keeps fenced = new - 2.  FenceGap is a constant; TLC's answer, under    *)
(* arbitrary delays of the epoch record to each node: both gaps are SAFE   *)
(* (MCRouteEpoch.cfg with 2, MCRouteEpochGap1.cfg with 1), because safety  *)
(* rests on the main's own fence check and its own report, never on the    *)
(* proxy being up to date.  The gap decides AVAILABILITY: with gap 1 a     *)
(* proxy only one bump behind the main has its writes rejected             *)
(* (MCRouteEpochGap1Reject.cfg violates NoRejectionWithinOneBump), with    *)
(* gap 2 a proxy must lag two bumps (20 s) before that happens.            *)
(*                                                                         *)
(* WHAT IS MODELLED.  Nodes are proxies and mains at once; a write goes    *)
(* from a proxy to a main in another node.  Each node keeps its own view   *)
(* of the epoch record (KRaft delivers records in order, so a view is      *)
(* always some earlier record of the controller: learning the newest one   *)
(* at any later time covers every delay).  A request is SENT (data in the  *)
(* channel, request on the wire, for as long as the network likes),        *)
(* REJECTED or ACCEPTED by the main (in flight: the main has issued the    *)
(* channel read), APPENDED (the Link Record is durable in the main's WAL   *)
(* and the write acknowledged), COMMITTED (uploaded to object storage), or *)
(* LOST (the main crashed while it was in flight: never acknowledged).     *)
(* Nodes crash (at most MaxCrashes times), are failed over (a survivor     *)
(* uploads their WAL and closes their streams) and restart (recovery       *)
(* uploads the WAL, the node catches up with the metadata log before it    *)
(* is unfenced, then leads partitions again).                              *)
(*                                                                         *)
(* WHAT IS ABSTRACTED AWAY, AND WHY.                                       *)
(* - Time: "every 10 s", "every 1 s", "a commit forced at least every      *)
(*   10 s" are events that may happen at any time; fairness (LiveSpec)     *)
(*   says they keep happening.                                             *)
(* - Channel offsets and WAL records: a channel is trimmed by epoch        *)
(*   (AutoMQ trims the channel WAL up to the last record of the highest    *)
(*   epoch <= committed; tags never decrease along the channel, so that    *)
(*   is a prefix and "trimmed up to epoch E" says the same).               *)
(* - The channel read and the WAL append of the Link Record are one step   *)
(*   (AppendLinkRecord); TrimSafe counts an ACCEPTED request as already    *)
(*   holding a Link Record, since its read may have returned.              *)
(* - The upload of other data, the snapshot-read path, order hints,        *)
(*   batching of requests and the content of the data.                     *)
(* - Proxies do not crash: a proxy crash only loses writes that were never *)
(*   acknowledged, and its channel stays in shared storage.                *)
(*                                                                         *)
(* PROPERTIES.  TrimSafe, EpochsOrdered (invariants); EpochsNeverDecrease, *)
(* NoAppendAtOrBelowFenced, NoRejectionWithinOneBump (action properties);  *)
(* CommittedAdvances, ChannelsTrimmed (liveness under LiveSpec).           *)
(*                                                                         *)
(* SWITCHES (specs/README.md).  CheckFence, WaitEarlierEpochs,             *)
(* CommittedMonotone and RestartCatchesUp are TRUE and CountRule is        *)
(* "UpOrOpenStreams" in the protocol; each mutation model changes one and  *)
(* names the invariant TLC must report.  WaitEarlierEpochs = FALSE is      *)
(* AutoMQ's CommittedEpochManager loop as read (it does not stop at an     *)
(* epoch that still has requests in flight); CommittedMonotone = FALSE is  *)
(* AutoMQ's controller at a bump (it takes the new minimum without         *)
(* comparing it with the old committed epoch).                             *)
(***************************************************************************)
EXTENDS Naturals, Integers, FiniteSets, Sequences

CONSTANTS
    Nodes,              \* node ids (a symmetry set in the safety models)
    MaxEpoch,           \* route epochs are 0..MaxEpoch (BumpRouteEpoch stops there)
    MaxWrites,          \* at most this many forwarded writes
    MaxCrashes,         \* at most this many node crashes in a behaviour
    FenceGap,           \* fenced = route - FenceGap (seed: 1, AutoMQ: 2)
    \* Switches for mutation models (TRUE / "UpOrOpenStreams" in the protocol).
    CheckFence,         \* a main rejects epochs at or below the fenced epoch it knows
    WaitEarlierEpochs,  \* the waiting epoch stays below every epoch still in flight
    CommittedMonotone,  \* the controller never publishes a lower committed epoch
    RestartCatchesUp,   \* a restarted node learns the current epoch record before serving
    CountRule           \* which nodes the committed minimum counts

ASSUME
    /\ Nodes # {}
    /\ MaxEpoch \in Nat /\ MaxWrites \in Nat /\ MaxCrashes \in Nat /\ FenceGap \in Nat
    /\ {CheckFence, WaitEarlierEpochs, CommittedMonotone, RestartCatchesUp} \subseteq BOOLEAN
    /\ CountRule \in {"UpOrOpenStreams", "UpOnly", "All"}

InitRoute == 0
InitFenced == InitRoute - FenceGap
\* AutoMQ starts at (committed, fenced, current) = (-3, -2, 0).
InitCommitted == InitFenced - 1
NoReport == InitCommitted - 1          \* a node that never wrote its committed epoch
Epochs == NoReport..MaxEpoch

RequestStates == {"SENT", "REJECTED", "ACCEPTED", "APPENDED", "COMMITTED", "LOST"}
\* Requests whose Link Record exists (or may be being made) and is not in committed storage.
LinkedStates == {"ACCEPTED", "APPENDED"}

EpochRecords == [route : Epochs, fenced : Epochs, committed : Epochs]
\* A forwarded write: the proxy's RouterChannel entry and the ZoneRouteRequest that names it.
Requests == [proxy : Nodes, main : Nodes, epoch : Epochs, state : RequestStates]

VARIABLES
    route,        \* the controller's current route epoch (KV __a_r_c/metadata: current)
    fenced,       \* ... its fenced epoch (always route - FenceGap)
    committed,    \* ... its committed epoch
    view,         \* per node: the epoch record it has learned from the metadata log
    up,           \* per node: running and heartbeating (AutoMQ NodeState not FENCED)
    openStreams,  \* per node: has opening streams (its WAL may hold data not yet uploaded)
    reported,     \* per node: its committed route epoch in KV (__a_r_c_nce/<id>), or NoReport
    trimmed,      \* per node: its RouterChannel is trimmed up to this epoch
    reqs,         \* every forwarded write, in the order they were made
    crashes       \* how many crashes happened (bounded by MaxCrashes)

vars == <<route, fenced, committed, view, up, openStreams, reported, trimmed, reqs, crashes>>

-----------------------------------------------------------------------------
(* Helpers *)

Max(a, b) == IF a >= b THEN a ELSE b
Min(a, b) == IF a <= b THEN a ELSE b
SetMin(S) == CHOOSE x \in S : \A y \in S : x <= y
SetMax(S) == CHOOSE x \in S : \A y \in S : x >= y

ControllerRecord == [route |-> route, fenced |-> fenced, committed |-> committed]

Ids == DOMAIN reqs
RequestsAt(m, states) == {i \in Ids : reqs[i].main = m /\ reqs[i].state \in states}
\* The epochs a main still has requests in flight for (AutoMQ's epoch2inflight > 0).
BusyEpochs(m) == {reqs[i].epoch : i \in RequestsAt(m, {"ACCEPTED"})}
\* The epochs a main has finished requests of (an epoch2inflight entry that reached 0).
DoneEpochs(m) == {reqs[i].epoch : i \in RequestsAt(m, {"APPENDED", "COMMITTED"})}

\* A request's data is gone from its proxy's RouterChannel.
Trimmed(i) == reqs[i].epoch <= trimmed[reqs[i].proxy]

\* Every Link Record in a node's WAL becomes data in object storage (an upload / recovery).
UploadWal(n) ==
    [i \in Ids |-> IF reqs[i].main = n /\ reqs[i].state = "APPENDED"
                   THEN [reqs[i] EXCEPT !.state = "COMMITTED"] ELSE reqs[i]]

\* The nodes the committed minimum is taken over (RouterChannelEpochControlManager).
Counted(n) ==
    CASE CountRule = "UpOrOpenStreams" -> up[n] \/ openStreams[n]
      [] CountRule = "UpOnly" -> up[n]
      [] CountRule = "All" -> TRUE

\* calCommitedEpoch: the minimum report of the counted nodes; NoReport when a counted node
\* has not reported or no node is counted.
MinReport ==
    LET counted == {n \in Nodes : Counted(n)} IN
    IF counted = {} \/ \E n \in counted : reported[n] = NoReport THEN NoReport
    ELSE SetMin({reported[n] : n \in counted})

\* CommittedEpochManager.tryBumpCommittedEpoch0: the epoch a main may commit now.
WaitingEpoch(m) ==
    LET f == view[m].fenced
        busy == BusyEpochs(m)
    IN IF busy = {} THEN f
       ELSE IF WaitEarlierEpochs THEN Min(f, SetMin(busy) - 1)
       ELSE \* AutoMQ's loop: the largest finished epoch <= fenced with nothing in flight,
            \* skipping over earlier epochs that still have requests in flight.
            LET idle == {e \in DoneEpochs(m) : e <= f /\ e \notin busy} IN
            IF idle = {} THEN reported[m] ELSE SetMax(idle)

-----------------------------------------------------------------------------

Init ==
    /\ route = InitRoute
    /\ fenced = InitFenced
    /\ committed = InitCommitted
    /\ view = [n \in Nodes |-> [route |-> InitRoute, fenced |-> InitFenced,
                                committed |-> InitCommitted]]
    /\ up = [n \in Nodes |-> TRUE]
    /\ openStreams = [n \in Nodes |-> TRUE]
    /\ reported = [n \in Nodes |-> NoReport]
    /\ trimmed = [n \in Nodes |-> InitCommitted]
    /\ reqs = <<>>
    /\ crashes = 0

\* ACTION: BumpRouteEpoch mirrors RouterChannelEpochControlManager.run0 when 10 s passed since
\* the last bump: current + 1, fenced + 1, and committed recomputed from the reports (kept when
\* undefined).  AutoMQ takes the new minimum as it is; CommittedMonotone keeps the larger one.
BumpRouteEpoch ==
    /\ route < MaxEpoch
    /\ route' = route + 1
    /\ fenced' = fenced + 1
    /\ committed' = IF MinReport = NoReport THEN committed
                    ELSE IF CommittedMonotone THEN Max(committed, MinReport)
                    ELSE MinReport
    /\ UNCHANGED <<view, up, openStreams, reported, trimmed, reqs, crashes>>

\* ACTION: PublishCommittedEpoch mirrors run0 between bumps: the minimum of the counted nodes'
\* reports, written only when it is defined and above the committed epoch.
PublishCommittedEpoch ==
    /\ MinReport # NoReport
    /\ MinReport > committed
    /\ committed' = MinReport
    /\ UNCHANGED <<route, fenced, view, up, openStreams, reported, trimmed, reqs, crashes>>

\* ACTION: LearnRouteEpoch(n) mirrors node n replaying the KV record __a_r_c/metadata
\* (DefaultRouterChannelProvider.onChange): its view becomes the controller's record.  In the same
\* callback its RouterChannel takes the new route epoch for later writes (nextEpoch) and is
\* trimmed up to the committed epoch (RouterChannel#trim(committed)); as a main, the new fenced
\* epoch applies to requests that arrive from now on.
LearnRouteEpoch(n) ==
    /\ up[n]
    /\ view[n] # ControllerRecord
    /\ view' = [view EXCEPT ![n] = ControllerRecord]
    /\ trimmed' = [trimmed EXCEPT ![n] = Max(@, committed)]
    /\ UNCHANGED <<route, fenced, committed, up, openStreams, reported, reqs, crashes>>

\* ACTION: ForwardWrite(p, m) mirrors RouterOutV2: proxy p appends the produce data to its
\* RouterChannel, tagged with the route epoch p knows, then sends main m a ZoneRouteRequest with
\* that epoch and the channel offset.  The request may stay on the wire for any time.
ForwardWrite(p, m) ==
    /\ p # m
    /\ up[p]
    /\ Len(reqs) < MaxWrites
    /\ reqs' = Append(reqs, [proxy |-> p, main |-> m, epoch |-> view[p].route, state |-> "SENT"])
    /\ UNCHANGED <<route, fenced, committed, view, up, openStreams, reported, trimmed, crashes>>

\* ACTION: ReceiveRequest(i) mirrors RouterInV2.handleZoneRouterRequest (under the
\* CommittedEpochManager read lock): a request whose epoch is at or below the fenced epoch the
\* main knows is rejected ("The router request epoch ... is less than fenced epoch"); any other
\* is counted in flight for its epoch and the channel read is issued.
ReceiveRequest(i) ==
    LET r == reqs[i] IN
    /\ i \in Ids
    /\ r.state = "SENT"
    /\ up[r.main]
    /\ reqs' = [reqs EXCEPT ![i].state = IF CheckFence /\ r.epoch <= view[r.main].fenced
                                          THEN "REJECTED" ELSE "ACCEPTED"]
    /\ UNCHANGED <<route, fenced, committed, view, up, openStreams, reported, trimmed, crashes>>

\* ACTION: AppendLinkRecord(i) mirrors the main's append with acks = -1: the channel data was
\* read, the Link Record is durable in the main's WAL (the full data in its LogCache), the write
\* is acknowledged and the request leaves the in-flight count.
AppendLinkRecord(i) ==
    /\ i \in Ids
    /\ reqs[i].state = "ACCEPTED"
    /\ up[reqs[i].main]
    /\ reqs' = [reqs EXCEPT ![i].state = "APPENDED"]
    /\ UNCHANGED <<route, fenced, committed, view, up, openStreams, reported, trimmed, crashes>>

\* ACTION: ReportCommittedEpoch(m) mirrors CommittedEpochManager.tryBumpCommittedEpoch (every
\* 1 s): the waiting epoch, then confirmWAL.commit (upload of the LogCache: every appended Link
\* Record becomes data in object storage), then putKV(__a_r_c_nce/<m>, waiting epoch).  Enabled
\* when the waiting epoch is above the last report.
ReportCommittedEpoch(m) ==
    /\ up[m]
    /\ WaitingEpoch(m) > reported[m]
    /\ reqs' = UploadWal(m)
    /\ reported' = [reported EXCEPT ![m] = WaitingEpoch(m)]
    /\ UNCHANGED <<route, fenced, committed, view, up, openStreams, trimmed, crashes>>

\* ACTION: CrashNode(n) mirrors a node stopping (the controller sees it FENCED): its in-flight
\* requests are lost (never acknowledged); Link Records already in its WAL stay there, and its
\* streams stay open until failover or recovery uploads them.
CrashNode(n) ==
    /\ up[n]
    /\ crashes < MaxCrashes
    /\ up' = [up EXCEPT ![n] = FALSE]
    /\ reqs' = [i \in Ids |-> IF reqs[i].main = n /\ reqs[i].state = "ACCEPTED"
                              THEN [reqs[i] EXCEPT !.state = "LOST"] ELSE reqs[i]]
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<route, fenced, committed, view, openStreams, reported, trimmed>>

\* ACTION: FailoverNode(n) mirrors a failover of the crashed node n by a survivor: n's WAL is
\* recovered (its Link Records are resolved through the RouterChannels) and uploaded, and n's
\* streams are closed.  From now on n is FENCED with no opening streams: not counted.
FailoverNode(n) ==
    /\ ~up[n]
    /\ openStreams[n]
    /\ \E s \in Nodes : s # n /\ up[s]
    /\ reqs' = UploadWal(n)
    /\ openStreams' = [openStreams EXCEPT ![n] = FALSE]
    /\ UNCHANGED <<route, fenced, committed, view, up, reported, trimmed, crashes>>

\* ACTION: RestartNode(n) mirrors the crashed node n starting again: recovery uploads what its
\* WAL still holds, the node catches up with the metadata log before it is unfenced (so it knows
\* the current epoch record), and it leads partitions again.  Its old report stays in KV.
RestartNode(n) ==
    /\ ~up[n]
    /\ up' = [up EXCEPT ![n] = TRUE]
    /\ openStreams' = [openStreams EXCEPT ![n] = TRUE]
    /\ reqs' = UploadWal(n)
    /\ IF RestartCatchesUp
       THEN /\ view' = [view EXCEPT ![n] = ControllerRecord]
            /\ trimmed' = [trimmed EXCEPT ![n] = Max(@, committed)]
       ELSE UNCHANGED <<view, trimmed>>
    /\ UNCHANGED <<route, fenced, committed, reported, crashes>>

-----------------------------------------------------------------------------

Next ==
    \/ BumpRouteEpoch
    \/ PublishCommittedEpoch
    \/ \E n \in Nodes : LearnRouteEpoch(n)
    \/ \E p \in Nodes, m \in Nodes : ForwardWrite(p, m)
    \/ \E i \in 1..MaxWrites : ReceiveRequest(i)
    \/ \E i \in 1..MaxWrites : AppendLinkRecord(i)
    \/ \E m \in Nodes : ReportCommittedEpoch(m)
    \/ \E n \in Nodes : CrashNode(n)
    \/ \E n \in Nodes : FailoverNode(n)
    \/ \E n \in Nodes : RestartNode(n)

Spec == Init /\ [][Next]_vars

\* The timers keep firing, KRaft keeps delivering, requests are eventually handled, and a
\* crashed node is eventually failed over (a restart is not promised).
Fairness ==
    /\ WF_vars(BumpRouteEpoch)
    /\ WF_vars(PublishCommittedEpoch)
    /\ \A n \in Nodes : WF_vars(LearnRouteEpoch(n))
    /\ \A i \in 1..MaxWrites : WF_vars(ReceiveRequest(i))
    /\ \A i \in 1..MaxWrites : WF_vars(AppendLinkRecord(i))
    /\ \A m \in Nodes : WF_vars(ReportCommittedEpoch(m))
    /\ \A n \in Nodes : WF_vars(FailoverNode(n))

LiveSpec == Spec /\ Fairness

-----------------------------------------------------------------------------
(* Invariants (the Python machine has inv_<snake_case> for each). *)

TypeOK ==
    /\ route \in 0..MaxEpoch
    /\ fenced \in Epochs
    /\ committed \in Epochs
    /\ view \in [Nodes -> EpochRecords]
    /\ up \in [Nodes -> BOOLEAN]
    /\ openStreams \in [Nodes -> BOOLEAN]
    /\ reported \in [Nodes -> Epochs]
    /\ trimmed \in [Nodes -> Epochs]
    /\ reqs \in Seq(Requests)
    /\ Len(reqs) <= MaxWrites
    /\ crashes \in 0..MaxCrashes

\* RouterChannel data of epoch E is trimmed only after every Link Record that points to it is in
\* committed storage: no request whose data is trimmed is in flight at its main or has a Link
\* Record in the main's WAL that was not uploaded.
TrimSafe == \A i \in Ids : Trimmed(i) => reqs[i].state \notin LinkedStates

\* The epochs keep their order: committed <= fenced = route - FenceGap at the controller; every
\* node's view is an earlier record, its report is at most the fenced epoch it knows, and its
\* channel is trimmed at most to the committed epoch it knows.
EpochsOrdered ==
    /\ fenced = route - FenceGap
    /\ committed <= fenced
    /\ \A n \in Nodes :
          /\ view[n].fenced = view[n].route - FenceGap
          /\ view[n].route <= route
          /\ view[n].committed <= committed
          /\ reported[n] <= view[n].fenced
          /\ trimmed[n] <= view[n].committed

\* A main never accepts (so never appends a Link Record for) a request whose epoch is at or
\* below the fenced epoch it knows when the request arrives (an action property: the check is
\* on the main's view at that step).
NoAppendAtOrBelowFenced ==
    [][\A i \in Ids :
          (reqs[i].state = "SENT" /\ reqs'[i].state = "ACCEPTED")
              => reqs[i].epoch > view[reqs[i].main].fenced]_vars

\* Availability, not safety: a request tagged with the route epoch its main knows, or the one
\* before, is never rejected (the proxy must lag the main by two bumps to be rejected).  An
\* action property, like the one above.
NoRejectionWithinOneBump ==
    [][\A i \in Ids :
          (reqs[i].state = "SENT" /\ reqs'[i].state = "REJECTED")
              => reqs[i].epoch < view[reqs[i].main].route - 1]_vars

\* Route, fenced and committed epochs (and every node's view, report and trim point) never go
\* down (an action property, checked as PROPERTY).
EpochsNeverDecrease ==
    [][/\ route' >= route
       /\ fenced' >= fenced
       /\ committed' >= committed
       /\ \A n \in Nodes :
             /\ view'[n].route >= view[n].route
             /\ view'[n].committed >= view[n].committed
             /\ reported'[n] >= reported[n]
             /\ trimmed'[n] >= trimmed[n]]_vars

\* Liveness (LiveSpec): once an epoch is fenced, the committed epoch reaches it, and every
\* running proxy trims its channel up to it.
CommittedAdvances == \A e \in 0..MaxEpoch : (fenced >= e) ~> (committed >= e)
ChannelsTrimmed ==
    \A e \in 0..MaxEpoch : (committed >= e) ~> (\A p \in Nodes : up[p] => trimmed[p] >= e)

=============================================================================
