"""Which node was lost: in a multi-node run every rank says where it runs and keeps saying it is alive.

A node that dies or drops off the network leaves the others in a collective: gloo fails at once with
"Connection closed by peer [ip]" when the peer's kernel closes the socket, and waits for the process group
timeout (30 minutes) when the machine or its network is simply gone. Either way the survivors' logs never
say *which node* to look at. Here each rank publishes its node (torchrun's GROUP_RANK), host and address in
the job's rendezvous store (torchrun's agent store at MASTER_ADDR:MASTER_PORT, through a client of our own
with a short timeout), and a daemon thread bumps a counter in it every few seconds. The same thread watches
the others' counters (counted, not time-stamped, so the nodes' clocks do not matter): a node whose ranks stop
counting for `MM_AGENT_LOST_NODE_S` seconds (default 120; 0 turns this off) is lost, and a store that stops
answering that long means the master node is. The survivor then prints the runtime's `error:`/`fix:` lines
naming the node and exits, so torchrun, the job manager and `diagnose` (signature `node_lost`) all see the
cause at once instead of a timeout. A collective that fails with a peer address is mapped to the same words.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from runtime.checkpoint import TRACKER
from runtime.errors import RuntimeFailure

ENV = "MM_AGENT_LOST_NODE_S"
DEFAULT_LOST_S = 120.0
PREFIX = "mm-agent/liveness"  # PrefixStore adds the "/"
LOST_EXIT = 3  # a survivor that saw a node go: not the user's input (2), not a crash (1)
_PEER = re.compile(r"\[(\d{1,3}(?:\.\d{1,3}){3})\]:\d+")


@dataclass(frozen=True)
class NodeOf:
    rank: int
    node: int
    host: str
    addr: str


def lost_after_s() -> float:
    raw = os.environ.get(ENV, "")
    try:
        return float(raw) if raw else DEFAULT_LOST_S
    except ValueError:
        raise RuntimeFailure(
            f"{ENV}={raw!r} is not a number of seconds", field=ENV, fix=f"unset {ENV} or set it to e.g. 120"
        ) from None


def _local_addr(master: str, port: int) -> str:
    """This host's address on the route to the master (a UDP connect sends nothing)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, port))
        return str(s.getsockname()[0])
    return "unknown"


def describe(nodes: list[NodeOf], node: int) -> str:
    """`node 1 of 2 (10.0.0.2, host b, global ranks 8-15)`: "ranks", never "rank N", which the log
    diagnoser would take for the rank that wrote the line."""
    ranks = sorted(n.rank for n in nodes if n.node == node)
    first = next(n for n in nodes if n.node == node)
    total = len({n.node for n in nodes})
    span = (
        f"{ranks[0]}-{ranks[-1]}"
        if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1))
        else ", ".join(map(str, ranks))
    )
    return f"node {node} of {total} ({first.addr}, host {first.host}, global ranks {span})"


class Liveness:
    """The publishing and watching thread of one rank (a no-op outside multi-node runs)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.limit = lost_after_s()
        self.master = os.environ.get("MASTER_ADDR", "")
        self.port = int(os.environ.get("MASTER_PORT", "0") or 0)
        nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)  # torchrun: nodes, and this one's rank
        self.node_rank = int(os.environ.get("GROUP_RANK", "0") or 0)
        self.enabled = world_size > 1 and nodes > 1 and self.limit > 0 and bool(self.master) and self.port > 0
        self.nodes: list[NodeOf] = []
        self.iteration = 0  # set by the trainer: where the run was when a node went
        self.save_dir: Path | None = None  # the trainer's --save: its tracker says where a restart resumes
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._store: Any = None
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (its count, when it last changed)
        self._last_ok = 0.0  # when the store last answered a whole round

    # -- setup ------------------------------------------------------------------------------------------

    def start(self) -> None:
        if not self.enabled:
            return
        beat = min(5.0, self.limit / 4)
        store = dist.TCPStore(
            self.master,
            self.port,
            is_master=False,
            timeout=timedelta(seconds=max(beat, 1.0)),
            wait_for_workers=False,
        )
        self._store = dist.PrefixStore(PREFIX, store)
        me = NodeOf(
            self.rank,
            self.node_rank,
            socket.gethostname(),
            _local_addr(self.master, self.port),
        )
        self._store.set(f"node/{self.rank}", json.dumps(me.__dict__))
        self._store.set_timeout(timedelta(seconds=max(self.limit, 10.0)))  # every rank publishes at start
        self.nodes = [NodeOf(**json.loads(self._store.get(f"node/{r}"))) for r in range(self.world_size)]
        self._store.set_timeout(timedelta(seconds=max(beat, 1.0)))
        self._last_ok = time.monotonic()
        self._threads = [
            threading.Thread(target=fn, args=(beat,), name=f"mm-liveness-{fn.__name__[1:]}", daemon=True)
            for fn in (self._beat, self._judge)
        ]
        for thread in self._threads:
            thread.start()

    def finish(self) -> None:
        """A rank that ends on purpose says so first, or the others would take it for lost."""
        if not self._threads:
            return
        self._stop.set()  # first: a slow `done` write must not let the judge see silence and end this rank
        with contextlib.suppress(Exception):
            self._store.set(f"done/{self.rank}", "1")
        for thread in self._threads:
            thread.join(timeout=10)

    # -- the watch --------------------------------------------------------------------------------------

    def _beat(self, beat: float) -> None:
        """Count this rank alive and read the others' counts. A store call to a vanished host can block far
        past its timeout, so this thread only records what it learns; `_judge` decides on a clock."""
        while not self._stop.wait(beat):
            try:
                self._store.add(f"alive/{self.rank}", 1)
                counts = {
                    r: self._store.add(f"alive/{r}", 0) for r in range(self.world_size) if r != self.rank
                }
                done = {r for r in counts if self._store.check([f"done/{r}"])}
            except Exception:  # the store lives on the master node: it is gone, or the way to it is
                continue
            now = time.monotonic()
            with self._lock:
                self._last_ok = now
                for r, count in counts.items():
                    if r in done or self._seen.get(r, (-1, 0.0))[0] != count:
                        self._seen[r] = (count, now)

    def _judge(self, beat: float) -> None:
        while not self._stop.wait(beat):
            now = time.monotonic()
            with self._lock:
                quiet = {r: now - since for r, (_, since) in self._seen.items()}
                store_quiet = now - self._last_ok
            if store_quiet >= self.limit:
                self._lost(None, store_quiet)
            silent = sorted({self._node(r) for r, q in quiet.items() if q >= self.limit})
            if silent:
                self._lost(silent[0], max(q for r, q in quiet.items() if self._node(r) == silent[0]))

    def _node(self, rank: int) -> int:
        return next((n.node for n in self.nodes if n.rank == rank), rank)

    def _lost(self, node: int | None, quiet_s: float) -> None:
        if self._stop.is_set():  # this rank is finishing on purpose
            return
        failure = self.failure(
            node, f"no sign of life for {quiet_s:.0f} s", "the machine or the network to it went down"
        )
        sys.stdout.flush()
        print(failure.render(), file=sys.stderr, flush=True)
        os._exit(LOST_EXIT)  # the main thread is stuck in a collective; nothing else can end it

    # -- words ------------------------------------------------------------------------------------------

    def failure(self, node: int | None, what: str, why: str) -> RuntimeFailure:
        """The runtime's error for a lost node (None: the master, i.e. the store's node)."""
        where = f"at iteration {self.iteration}"
        if node is None:
            name = f"the master node ({self.master}:{self.port}, node 0)"
            message = f"lost {name}: its rendezvous store stopped answering ({what}) {where}; {why}"
        else:
            name = describe(self.nodes, node)
            message = f"lost {name}: {what} {where}; {why}"
        saved = self._saved()
        resume = (
            f"training resumes from its last checkpoint (iteration {saved})"
            if saved
            else "training starts again from the loaded checkpoint (none was saved yet)"
        )
        target = "node 0" if node is None else f"node {node}"
        return RuntimeFailure(
            message,
            field="MASTER_ADDR" if node is None else None,
            fix=f"find out why on {target} (its own log: mm-agent diagnose; dmesg; the network to it), then start "
            f"the job again on every node: {resume}",
        )

    def _saved(self) -> int | None:
        """The iteration the save directory's tracker names (rank 0 may have saved while this rank waited)."""
        try:
            text = (self.save_dir / TRACKER).read_text(encoding="utf-8").strip() if self.save_dir else ""
            return int(text)
        except (OSError, ValueError):
            return None

    def peer_failure(self, exc: BaseException) -> RuntimeFailure | None:
        """A collective's error naming a peer address (gloo: "Connection closed by peer [ip]:port") as the
        node it belongs to; None when it names none of this run's nodes."""
        found = _PEER.search(str(exc))
        if not self.nodes or found is None:
            return None
        mine = self._node(self.rank)
        owners = sorted({n.node for n in self.nodes if n.addr == found.group(1) and n.node != mine})
        if len(owners) != 1:  # not one of ours, or several nodes behind one address (one host, in tests)
            return None
        return self.failure(
            owners[0], "the connection to it closed", "its training process ended (read its log)"
        )
