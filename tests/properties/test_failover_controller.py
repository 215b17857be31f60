"""The controller's projection of the Failover machine (``failover/controller.py``), on any view
of up to five nodes and any stored contexts: a round keeps the machine's OneFailoverInFlight
(``inv_one_failover_in_flight`` on the projected state), assigns only candidates to live nodes
with no task of their own, forgets exactly the contexts the machine's ``ClearFailover`` finds no
longer needed, and is stable (a second round on its own result changes nothing).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from automq_ref.state_machines.failover import (
    FailoverContext,
    Session,
    inv_one_failover_in_flight,
)
from automq_ref.state_machines.failover.controller import (
    NodeView,
    failover_round,
    project,
)

NODE_IDS = range(1, 6)


@st.composite
def views(draw: st.DrawFn) -> list[NodeView]:
    ids = draw(st.lists(st.sampled_from(NODE_IDS), min_size=1, max_size=5, unique=True))
    nodes = []
    next_stream = 0
    for node_id in sorted(ids):
        count = draw(st.integers(0, 2))
        streams = frozenset(range(next_stream, next_stream + count))
        next_stream += count
        nodes.append(
            NodeView(
                node_id,
                draw(st.integers(1, 3)),
                draw(st.sampled_from(list(Session))),
                draw(st.booleans()),
                streams,
            )
        )
    return nodes


@st.composite
def stored(draw: st.DrawFn) -> list[FailoverContext]:
    """At most one context, as the controller stores them (it never writes two)."""
    if not draw(st.booleans()):
        return []
    failed, target = draw(st.lists(st.sampled_from(NODE_IDS), min_size=2, max_size=2, unique=True))
    return [FailoverContext(failed, draw(st.integers(1, 3)), target)]


@given(views(), stored())
def test_a_round_keeps_one_failover_in_flight_and_assigns_only_candidates(
    nodes: list[NodeView], contexts: list[FailoverContext]
) -> None:
    decided = failover_round(nodes, contexts)
    after = project(nodes, decided.contexts)
    inv_one_failover_in_flight(after)
    by_id = {node.node_id: node for node in nodes}
    for context in decided.assigned:
        failed, target = by_id[context.failed_node_id], by_id[context.target_node_id]
        assert failed.session is Session.FENCED and not failed.in_grace and failed.opened
        assert context.node_epoch == failed.node_epoch
        assert target.session is Session.ACTIVE
    assert set(decided.cleared) <= set(contexts)
    assert decided.contexts == (set(contexts) - set(decided.cleared)) | set(decided.assigned)
    again = failover_round(nodes, decided.contexts)
    assert not again.assigned and not again.cleared


@given(views())
def test_some_candidate_is_assigned_whenever_a_live_node_can_take_it(
    nodes: list[NodeView],
) -> None:
    decided = failover_round(nodes, [])
    candidates = [n for n in nodes if n.session is Session.FENCED and not n.in_grace and n.opened]
    live = [n for n in nodes if n.session is Session.ACTIVE]
    assert bool(decided.assigned) == bool(candidates and live)
