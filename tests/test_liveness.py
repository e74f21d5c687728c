"""runtime.liveness: the words a survivor prints for a lost node are what `diagnose` reports as node_lost, a
collective's peer address maps to the node it belongs to, and the watch itself (real TCPStore, real threads)
calls a silent node lost after MM_AGENT_LOST_NODE_S while a rank that finished on purpose is not."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed")

from mm_agent.diagnose import DiagnoseRequest, diagnose_errors  # noqa: E402
from runtime import liveness  # noqa: E402
from runtime.errors import RuntimeFailure  # noqa: E402
from runtime.liveness import Liveness, NodeOf  # noqa: E402

NODES = [NodeOf(0, 0, "a", "10.0.0.1"), NodeOf(1, 0, "a", "10.0.0.1"), NodeOf(2, 1, "b", "10.0.0.2"),
         NodeOf(3, 1, "b", "10.0.0.2")]  # fmt: skip


def watcher(monkeypatch: pytest.MonkeyPatch, rank: int = 0, world: int = 4, nodes: int = 2) -> Liveness:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setenv("GROUP_WORLD_SIZE", str(nodes))
    live = Liveness(rank, world)
    live.nodes = list(NODES)
    return live


def test_the_survivors_words_are_diagnosed_as_the_lost_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    live = watcher(monkeypatch)
    live.iteration, live.save_dir = 7, tmp_path
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("6")
    for failure, title in (
        (live.failure(1, "no sign of life for 9 s", "the network went down"), "lost node 1 of 2 (10.0.0.2, host b, global ranks 2-3)"),
        (live.failure(None, "no sign of life for 9 s", "the network went down"), "lost the master node (127.0.0.1:29999, node 0)"),
    ):  # fmt: skip
        assert "resumes from its last checkpoint (iteration 6)" in (failure.fix or "")
        log = tmp_path / "rank0.log"
        log.write_text("iteration 7 ...\n" + failure.render() + "\nTraceback (most recent call last):\n")
        cause = diagnose_errors(DiagnoseRequest(paths=[str(log)])).root_cause
        assert cause is not None and cause.rule_id == "node_lost", cause
        assert cause.title == title


def test_a_peer_address_names_its_node_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    live = watcher(monkeypatch)
    closed = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:23456")
    found = live.peer_failure(closed)
    assert found is not None and found.message.startswith(
        "lost node 1 of 2 (10.0.0.2, host b, global ranks 2-3)"
    )
    assert "the connection to it closed at iteration" in found.message
    assert (
        live.peer_failure(RuntimeError("Connection closed by peer [10.9.9.9]:1")) is None
    )  # not one of ours
    assert live.peer_failure(RuntimeError("Connection closed by peer [10.0.0.1]:1")) is None  # this node
    assert live.peer_failure(RuntimeError("CUDA out of memory")) is None
    live.nodes = [NodeOf(0, 0, "a", "10.0.0.1"), NodeOf(1, 1, "a", "10.0.0.1"), NodeOf(2, 2, "a", "10.0.0.1")]
    assert live.peer_failure(RuntimeError("closed by peer [10.0.0.1]:1")) is None  # two other nodes behind it


def test_off_on_one_node_with_zero_and_refused_when_not_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not watcher(monkeypatch, nodes=1).enabled
    assert watcher(monkeypatch).enabled
    monkeypatch.setenv(liveness.ENV, "0")
    assert not watcher(monkeypatch).enabled
    monkeypatch.setenv(liveness.ENV, "soon")
    with pytest.raises(RuntimeFailure) as bad:
        watcher(monkeypatch)
    assert bad.value.field == liveness.ENV


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_silent_node_is_lost_and_a_finished_one_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks on two 'nodes' against a real TCPStore: rank 1 finishing on purpose is never lost; rank 1
    going silent (its threads stopped without the `done` mark) is lost after the limit."""
    port = _free_port()
    server = dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv(liveness.ENV, "1.2")
    lost: list[tuple[int | None, int]] = []

    def run(silence: bool) -> None:
        ranks = []
        for rank in (0, 1):
            monkeypatch.setenv("GROUP_RANK", str(rank))
            live = Liveness(rank, 2)
            monkeypatch.setattr(live, "_lost", lambda node, quiet, r=rank: lost.append((node, r)))
            ranks.append(live)
        # each start waits for the other's node record, as the ranks of a run do
        starting = [threading.Thread(target=live.start) for live in ranks]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join(timeout=20)
        assert [n.node for n in ranks[0].nodes] == [0, 1]
        time.sleep(1.0)
        if silence:
            ranks[1]._stop.set()  # its counter stops, no done mark: what a vanished node looks like
        else:
            ranks[1].finish()
        time.sleep(3.0)
        ranks[0].finish()

    run(silence=False)
    assert lost == []
    server.delete_key("mm-agent/liveness/done/1")
    run(silence=True)
    assert (1, 0) in lost  # rank 0 calls node 1 lost
