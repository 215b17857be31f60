"""Route epochs on a real cluster, validated against specs/RouteEpoch.tla with TLC.

Three in-process brokers on a test etcd and one local object store (the code ``serve`` runs:
``start_node``), with the zone router on (``automq.zonerouter.channels``), a bump every
1.5 s, a report loop every 0.2 s and recording on (``automq.zonerouter.route.epoch.trace.dir``).
Nothing routes yet, so the test plays the router: broker 2 (and 3) as the proxy tags writes
for a main (``tag``), the main admits them (``begin``), appends real records to a partition it
leads, and ends them (``end``); one write stays in flight past a bump (its main must not report
its epoch until it ends), and one is tagged and held until its main fenced its epoch (refused).
Meanwhile the active controller bumps and publishes and every broker learns and reports.

Checked: the committed epoch advances past every write; each broker heard new epochs and
committed epochs in order (each new record: the epoch first, then the trim); the merged trace
replays through the machine with the shell doing exactly what the machine did (the records
written, the verdicts, the epochs reported); and TLC accepts it, and rejects a copy with two
lines swapped at the line that breaks it.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from automq_ref.io.metadata import route_epoch_trace as rt
from automq_ref.io.metadata.route_epochs import stored_record
from automq_ref.io.storage.route_epoch_node import RouteEpochNode
from automq_ref.node import Node
from automq_ref.state_machines.route_epoch import RouteEpochError
from tests.etcd_fixture import EtcdServer, running_etcd
from tests.unit.test_cluster_balancing import cluster, held, produce, until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="TLC needs a Java runtime")

BUMP_MS = 1500


@pytest.fixture(scope="module")
def etcd() -> Any:
    with running_etcd() as server:
        yield server


def epochs_of(node: Node) -> RouteEpochNode:
    assert node.route_epochs is not None, "the zone router is on"
    return node.route_epochs


def committed(node: Node) -> int:
    stored = stored_record(node.view.image)
    return -10 if stored is None else stored.committed


def in_order(heard: list[tuple[str, int]]) -> bool:
    """New epochs strictly increase, committed epochs too; each committed epoch is at least
    two below the epoch heard before it (committed <= fenced = current - 2)."""
    epochs = [e for kind, e in heard if kind == "epoch"]
    trims = [e for kind, e in heard if kind == "trim"]
    current = None
    for kind, epoch in heard:
        if kind == "epoch":
            current = epoch
        elif current is None or epoch > current - 2:
            return False
    return epochs == sorted(set(epochs)) and trims == sorted(set(trims))


def listeners(log: list[Any]) -> tuple[Callable[[int], None], Callable[[int], None]]:
    def on_new_epoch(epoch: int) -> None:
        log.append(("epoch", epoch))

    def on_committed(epoch: int) -> None:
        log.append(("trim", epoch))

    return on_new_epoch, on_committed


async def routed_run(tmp_path: Path, etcd: EtcdServer) -> tuple[Path, dict[int, list[Any]]]:
    directory = tmp_path / "trace"
    overrides = (
        f"automq.zonerouter.channels=0@dir://{tmp_path / 'channels'}",
        f"automq.zonerouter.route.epoch.bump.interval.ms={BUMP_MS}",
        "automq.zonerouter.route.epoch.commit.interval.ms=200",
        "automq.zonerouter.route.epoch.commit.linger.ms=300",
        f"automq.zonerouter.route.epoch.trace.dir={directory}",
    )
    heard: dict[int, list[Any]] = {}
    async with cluster(tmp_path, etcd, *overrides) as running:
        nodes = {n: await running.start(n) for n in (1, 2, 3)}
        for n, node in nodes.items():
            heard[n] = []
            epochs_of(node).subscribe(*listeners(heard[n]))
        await nodes[1].topics.create_topic("routed", 1, {}, assignments=[1])
        await nodes[2].topics.create_topic("back", 1, {}, assignments=[2])
        await until(lambda: held(nodes[1], "routed") == {0}, "broker 1 leading routed")
        await until(lambda: held(nodes[2], "back") == {0}, "broker 2 leading back")
        main, proxy, other = epochs_of(nodes[1]), epochs_of(nodes[2]), epochs_of(nodes[3])
        await until(lambda: min(e.current_epoch for e in (main, proxy)) >= 1, "a first bump")

        async def write(proxy: RouteEpochNode, main: Node, key: str) -> int:
            epoch = proxy.tag(main.config.node_id, key)
            assert epochs_of(main).begin(epoch, key), (key, epoch)
            topic = "routed" if main is nodes[1] else "back"
            await produce(main.topics.partitions[(topic, 0)], 3)
            epochs_of(main).end(epoch, key)
            return epoch

        written = [await write(proxy, nodes[1], "w1"), await write(other, nodes[2], "w2")]
        # A slow write: in flight at broker 1 while its epoch gets fenced there.
        slow = proxy.tag(1, "slow")
        assert main.begin(slow, "slow")
        await until(lambda: main.record.fenced >= slow + 1, "the slow write's epoch fenced")
        assert main.state.reported is not None and main.state.reported < slow
        await produce(nodes[1].topics.partitions[("routed", 0)], 2)
        main.end(slow, "slow")
        # A stale write: tagged, then held until its main fenced its epoch.
        stale = other.tag(1, "stale")
        await until(lambda: main.record.fenced >= stale, "the stale write's epoch fenced")
        assert not main.begin(stale, "stale")
        written += [slow, await write(proxy, nodes[1], "w3")]
        target = max(written)
        await until(lambda: all(committed(n) >= target for n in nodes.values()), "committed")
        for node in nodes.values():
            assert epochs_of(node).state.trimmed >= target
    return directory, heard


async def test_route_epochs_of_a_real_cluster_are_a_behaviour_of_the_spec(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    directory, heard = await routed_run(tmp_path, etcd)
    for node_id, log in heard.items():
        assert in_order(log), (node_id, log)
        assert sum(kind == "epoch" for kind, _ in log) >= 3, (node_id, log)
    steps = rt.merge(rt.read_steps(directory))
    replayed = rt.replay(steps)
    assert rt.mismatches(replayed) == []
    actions = [type(e).__name__ for e in replayed.events]
    for action in ("BumpRouteEpoch", "PublishCommittedEpoch", "ReportCommittedEpoch"):
        assert actions.count(action) >= 3, actions
    assert actions.count("ForwardWrite") == 5 and actions.count("AppendLinkRecord") == 4
    print(f"\nreal route-epoch trace: {len(actions)} events, {len(replayed.refused)} stutters")
    print({action: actions.count(action) for action in sorted(set(actions))})
    final = replayed.states[-1]
    assert [r.state.value for r in final.requests].count("REJECTED") == 1
    # Only stutters of a known kind: learning a record the broker's restart already gave it.
    kinds = {(type(e).__name__, error) for _, e, error in replayed.refused}
    assert kinds <= {("LearnRouteEpoch", RouteEpochError.NOTHING_TO_DO)}, kinds

    lines = [tv.TraceLine(action, state) for action, state in rt.tla_lines(replayed)]
    assert rt.main([str(directory), str(tmp_path / "route.ndjson")]) == 0
    assert tv.read_ndjson(tmp_path / "route.ndjson") == lines
    slow_end = 1 + next(
        number
        for number, step in enumerate(replayed.steps, start=1)
        if step.action == "AppendLinkRecord" and step.args.get("key") == "slow"
    )
    broken = list(lines)
    broken[slow_end - 1], broken[slow_end] = lines[slow_end], lines[slow_end - 1]
    verdicts = tv.validate_many([lines, broken], "RouteEpoch")
    assert verdicts[0].accepted, f"{verdicts[0]}\n{verdicts[0].log_tail}"
    assert verdicts[0].matched == len(lines)
    assert not verdicts[1].accepted, verdicts[1]
    assert verdicts[1].matched == slow_end - 1, verdicts[1]
