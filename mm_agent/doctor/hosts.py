"""`mm-agent doctor --hosts FILE ...`: the fingerprints of every node of a multi-node job side by side
(`doctor/fingerprint.py` writes them), reported in the doctor's result shape, each finding naming the node(s)
and the fix: versions that differ from node 0's, a master that a node cannot reach, a socket IFNAME that
picks no NIC or one off the master's network, pdsh missing on node 0, a node given twice, NNODES that
disagrees with the number of fingerprints.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from mm_agent.doctor.checks_multinode import ifname_matches
from mm_agent.doctor.fingerprint import NodeFingerprint, load_fingerprint
from mm_agent.doctor.models import STATUS_ORDER, Status
from mm_agent.errors import MMAgentError
from mm_agent.validate.rules_multinode import unreachable


class HostNode(BaseModel):
    name: str = Field(
        description="how the findings name this node: its hostname (and file when hostnames repeat)"
    )
    file: str
    hostname: str
    master: bool = Field(description="node 0: MASTER_ADDR is one of its addresses (else NODE_RANK 0)")
    ipv4: list[str]


class HostFinding(BaseModel):
    id: str
    title: str
    status: Status
    summary: str
    nodes: list[str] = Field(default_factory=list, description="the nodes the finding is about")
    evidence: list[str] = Field(default_factory=list)
    fix: str | None = None


class HostsReport(BaseModel):
    ok: bool = Field(description="true when no finding failed")
    counts: dict[str, int]
    nodes: list[HostNode]
    checks: list[HostFinding]


_Node = tuple[HostNode, NodeFingerprint]

# (field, what it is, the fix's verb, fail or only warn)
_SAME: tuple[tuple[str, str, str, Status], ...] = (
    ("cann", "CANN toolkit", "install the CANN toolkit (and kernels, NNAL) of", "fail"),
    ("driver", "NPU driver", "install the NPU driver", "fail"),
    ("firmware", "NPU firmware", "install the NPU firmware", "warn"),
    ("python", "Python", "use a training env with Python", "warn"),
    ("torch", "torch", "pip install torch==", "fail"),
    ("torch_npu", "torch_npu", "pip install torch_npu==", "fail"),
    ("mindspeed", "MindSpeed", "install MindSpeed", "fail"),
    ("mindspeed_commit", "MindSpeed commit", "git checkout in the MindSpeed checkout:", "fail"),
    ("megatron", "Megatron core (the checkout's megatron/)", "copy the Megatron tree of", "fail"),
    ("mindspeed_mm", "MindSpeed-MM", "pip install -e . in a MindSpeed-MM checkout at", "fail"),
    ("mindspeed_mm_commit", "MindSpeed-MM commit", "git checkout in the MindSpeed-MM checkout:", "fail"),
)


def _finding(
    rule: str,
    title: str,
    status: Status,
    summary: str,
    nodes: Sequence[HostNode] = (),
    evidence: Sequence[str] = (),
    fix: str | None = None,
) -> HostFinding:
    return HostFinding(
        id=rule,
        title=title,
        status=status,
        summary=summary,
        nodes=[n.name for n in nodes],
        evidence=list(evidence),
        fix=fix,
    )


def _same(nodes: list[_Node], ref: _Node) -> list[HostFinding]:
    out = []
    for field, what, verb, status in _SAME:
        rule, title = f"same_{field}", f"{what} the same on every node"
        want = getattr(ref[1], field)
        values = [getattr(fp, field) for _, fp in nodes]
        if all(v is None for v in values):
            out.append(_finding(rule, title, "skip", f"{what}: not found on any node"))
            continue
        odd = [(n, getattr(fp, field)) for n, fp in nodes if getattr(fp, field) != want]
        evidence = [f"{n.name}: {getattr(fp, field) or '-'}" for n, fp in nodes]
        if not odd:
            out.append(
                _finding(rule, title, "ok", f"{what} {want} on all {len(nodes)} nodes", evidence=evidence)
            )
            continue
        have = ", ".join(f"{n.name} has {v or 'none'}" for n, v in odd)
        out.append(
            _finding(
                rule,
                title,
                status,
                f"{what} differs: node 0 ({ref[0].name}) has {want or 'none'}, {have}",
                [n for n, _ in odd],
                evidence,
                f"{verb} {want} on {', '.join(n.name for n, _ in odd)} (as on node 0), or change every node to "
                "one version: mixed versions hang or fail at communicator init",
            )
        )
    return out


def _master(nodes: list[_Node]) -> HostFinding:
    rule, title = "master_reachable", "MASTER_ADDR:MASTER_PORT reachable from every node"
    known = [(n, fp.master) for n, fp in nodes if fp.master is not None]
    if not known:
        return _finding(
            rule, title, "skip", "no node had MASTER_ADDR (set it, or pass --job, when fingerprinting)"
        )
    evidence = [f"{n.name}: {m.addr}:{m.port} {m.status} ({m.detail})" for n, m in known]
    loop = [n for n, m in known if unreachable(m.addr)]
    if loop and len(nodes) > 1:
        return _finding(
            rule,
            title,
            "fail",
            f"MASTER_ADDR is a loopback address on {', '.join(n.name for n in loop)}",
            loop,
            evidence,
            "export MASTER_ADDR=<node 0's IP that every node can reach> on every node",
        )
    bad = [n for n, m in known if m.status in ("unreachable", "unresolved")]
    if bad:
        addrs = sorted({m.addr for _, m in known})
        return _finding(
            rule,
            title,
            "fail",
            f"MASTER_ADDR {', '.join(addrs)} is not reachable from {', '.join(n.name for n in bad)}",
            bad,
            evidence,
            "set MASTER_ADDR to node 0's address on the network every node shares (`ip -4 addr` on node 0), and "
            "open MASTER_PORT in the firewall between the nodes",
        )
    return _finding(rule, title, "ok", f"reachable from all {len(known)} node(s)", evidence=evidence)


def _networks(fp: NodeFingerprint, names: list[str]) -> list[ipaddress.IPv4Network]:
    return [
        ipaddress.IPv4Network(f"{a.address}/{a.netmask or '32'}", strict=False)
        for n in fp.nics
        if n.name in names
        for a in n.ipv4
    ]


def _ifname(nodes: list[_Node]) -> list[HostFinding]:
    rule, title = "socket_ifname", "socket IFNAME selects a NIC on MASTER_ADDR's network on every node"
    out, evidence = [], []
    for node, fp in nodes:
        nics = [n.name for n in fp.nics if n.name != "lo"]
        listing = "; ".join(
            f"{n.name} {', '.join(a.address for a in n.ipv4) or 'no IPv4'}" for n in fp.nics if n.name != "lo"
        )
        master_ip = fp.master.ip if fp.master else None
        for var, value in fp.socket_ifname.items():
            chosen = ifname_matches(value, nics)
            evidence.append(
                f"{node.name}: {var}={value} selects {', '.join(chosen) or 'nothing'} (NICs: {listing})"
            )
            if not chosen:
                out.append(
                    _finding(
                        rule,
                        title,
                        "fail",
                        f"{var}={value} selects no NIC on {node.name}: comm init times out there",
                        [node],
                        evidence[-1:],
                        f"on {node.name}, export {var} to its NIC on MASTER_ADDR's network: one of {', '.join(nics)}",
                    )
                )
            elif (
                master_ip
                and not ipaddress.ip_address(master_ip).is_loopback
                and not any(ipaddress.ip_address(master_ip) in net for net in _networks(fp, chosen))
            ):
                on_net = [
                    n
                    for n in nics
                    if any(ipaddress.ip_address(master_ip) in net for net in _networks(fp, [n]))
                ]
                out.append(
                    _finding(
                        rule,
                        title,
                        "fail",
                        f"{var}={value} on {node.name} selects {', '.join(chosen)}, not on MASTER_ADDR {master_ip}'s subnet",
                        [node],
                        evidence[-1:],
                        f"on {node.name}, `export {var}={shlex.quote(on_net[0])}`"
                        if on_net
                        else f"on {node.name}, use a NIC on {master_ip}'s network (none of its NICs is on it: check MASTER_ADDR)",
                    )
                )
    if out:
        return out
    if not evidence:
        return [_finding(rule, title, "skip", "no HCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME set on any node")]
    return [
        _finding(rule, title, "ok", "every IFNAME selects a NIC on MASTER_ADDR's network", evidence=evidence)
    ]


def _pdsh(nodes: list[_Node], ref: _Node) -> HostFinding:
    rule, title = "pdsh", "pdsh on node 0 (multi-node MindSpeed-MM)"
    node, fp = ref
    nnodes = max(len(nodes), fp.layout.nnodes or 0)
    if fp.layout.runtime != "mindspeed-mm" or nnodes <= 1:
        why = "no job given (--job) on node 0" if fp.layout.runtime is None else f"{fp.layout.runtime} job"
        return _finding(rule, title, "skip", f"not a multi-node MindSpeed-MM job ({why})")
    if fp.pdsh:
        return _finding(rule, title, "ok", f"{node.name}: {fp.pdsh}", [node])
    return _finding(
        rule,
        title,
        "fail",
        f"pdsh not found on node 0 ({node.name}): a {nnodes}-node MindSpeed-MM launch hangs with no error",
        [node],
        fix="apt install pdsh (Debian/Ubuntu) or yum install pdsh (EulerOS/openEuler/CentOS) on node 0",
    )


def _duplicates(nodes: list[_Node]) -> HostFinding:
    rule, title = "duplicate_node", "every fingerprint is a different node"
    seen: dict[str, list[_Node]] = {}
    for n in nodes:
        seen.setdefault(n[1].hostname, []).append(n)
    dups = [group for group in seen.values() if len(group) > 1]
    if not dups:
        return _finding(rule, title, "ok", f"{len(nodes)} different hostnames")
    twice = [g for g in dups if len({tuple(g_n[0].ipv4) for g_n in g}) == 1]
    group = (twice or dups)[0]
    files = ", ".join(n.file for n, _ in group)
    if twice:
        return _finding(
            rule,
            title,
            "warn",
            f"the same node's fingerprint is given {len(group)} times ({files})",
            [n for n, _ in group],
            fix="pass one fingerprint per node (written on that node)",
        )
    return _finding(
        rule,
        title,
        "warn",
        f"{len(group)} nodes share the hostname {group[0][1].hostname} ({files})",
        [n for n, _ in group],
        fix="give every node its own hostname: tools that list nodes by name (pdsh, hostfiles) mix them up",
    )


def _nnodes(nodes: list[_Node]) -> HostFinding:
    rule, title = "nnodes", "NNODES equals the number of fingerprints"
    said = [(n, fp.layout.nnodes) for n, fp in nodes if fp.layout.nnodes is not None]
    if not said:
        return _finding(
            rule, title, "skip", "no node had NNODES (export it, or pass --job, when fingerprinting)"
        )
    off = [(n, v) for n, v in said if v != len(nodes)]
    if not off:
        return _finding(rule, title, "ok", f"NNODES={len(nodes)} on every node that set it")
    return _finding(
        rule,
        title,
        "warn",
        f"{len(nodes)} fingerprint(s), but NNODES is {', '.join(f'{v} on {n.name}' for n, v in off)}",
        [n for n, _ in off],
        fix=f"pass one fingerprint per node, or set NNODES={len(nodes)} (re-render with --nnodes) on every node",
    )


def _node0(nodes: list[_Node]) -> _Node:
    """The master: MASTER_ADDR is one of its addresses, else NODE_RANK 0, else the first file."""
    for node in nodes:
        if (
            node[1].master is not None
            and node[1].master.status == "local"
            and not unreachable(node[1].master.addr)
        ):
            return node
    return next((n for n in nodes if n[1].layout.node_rank == 0), nodes[0])


def compare_fingerprints(paths: Sequence[Path]) -> HostsReport:
    """Compare the fingerprints of a job's nodes: what differs, who cannot reach the master, a wrong NIC."""
    if not paths:
        raise MMAgentError("no fingerprint files given", field="--hosts", fix="pass the file each node wrote")
    fps = [(Path(p), load_fingerprint(Path(p))) for p in paths]
    count: dict[str, int] = {}
    for _, fp in fps:
        count[fp.hostname] = count.get(fp.hostname, 0) + 1
    hosts = [
        HostNode(
            name=fp.hostname if count[fp.hostname] == 1 else f"{fp.hostname} ({p})",
            file=str(p),
            hostname=fp.hostname,
            master=False,
            ipv4=sorted(a.address for n in fp.nics if n.name != "lo" for a in n.ipv4),
        )
        for p, fp in fps
    ]
    nodes: list[_Node] = list(zip(hosts, (fp for _, fp in fps), strict=True))
    ref = _node0(nodes)
    ref[0].master = True
    findings = [
        *_same(nodes, ref),
        _master(nodes),
        *_ifname(nodes),
        _pdsh(nodes, ref),
        _duplicates(nodes),
        _nnodes(nodes),
    ]
    findings.sort(key=lambda f: STATUS_ORDER[f.status])
    counts = {s: sum(f.status == s for f in findings) for s in ("ok", "warn", "fail", "skip")}
    return HostsReport(ok=counts["fail"] == 0, counts=counts, nodes=hosts, checks=findings)
