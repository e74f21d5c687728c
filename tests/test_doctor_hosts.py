"""`mm-agent doctor --fingerprint` on each node and `doctor --hosts` comparing them (issue 16, item 2): real
fingerprints of this machine written by the CLI, copies edited to stand for a second node that differs, and
a real pair of hosts (two network namespaces, tests/twohosts.py) fingerprinting each other's reachability."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from twohosts import two_hosts, unavailable

from mm_agent.doctor.fingerprint import NodeFingerprint
from mm_agent.doctor.hosts import HostsReport, compare_fingerprints
from mm_agent.render import RenderRequest, render_job

# Settings of the machine running the tests that would leak into the "node" being fingerprinted.
NODE_VARS = ("MM_ROOT", "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "HCCL_SOCKET_IFNAME",
             "GLOO_SOCKET_IFNAME", "PYTHONPATH", "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "MM_AGENT_ASCEND_BASE")  # fmt: skip


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NODE_VARS}
    return {**env, "MM_AGENT_STATE_DIR": str(tmp_path / "state"), **extra}


def doctor(tmp_path: Path, *args: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [*prefix, sys.executable, "-m", "mm_agent", "doctor", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def fingerprint(tmp_path: Path, name: str, *args: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> Path:  # fmt: skip
    out = tmp_path / name
    done = doctor(tmp_path, "--fingerprint", str(out), *args, env=env, prefix=prefix)
    assert done.returncode in {0, 1}, done.stderr
    assert f"fingerprint of this node written to {out}" in done.stderr
    return out


def edited(src: Path, dst: Path, **changes: Any) -> Path:
    """A copy of a real fingerprint standing for another node: top-level fields (or dotted ones) replaced."""
    data = json.loads(src.read_text())
    for key, value in changes.items():
        target = data
        *parents, leaf = key.split("__")
        for part in parents:
            target = target[part]
        target[leaf] = value
    dst.write_text(json.dumps(data))
    return dst


def by_id(report: HostsReport) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for f in report.checks:
        found.setdefault(f.id, []).append(f)
    return found


def only(report: HostsReport, rule: str) -> Any:
    (finding,) = by_id(report)[rule]
    return finding


def this_nic() -> tuple[str, str, str]:
    """(name, IPv4, netmask) of an up NIC other than lo; the test needs one to stand for node 0's."""
    stats = psutil.net_if_stats()
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        for a in addrs:
            if (
                name != "lo"
                and a.family.name == "AF_INET"
                and name in stats
                and stats[name].isup
                and a.netmask
            ):
                return name, a.address, a.netmask
    pytest.skip("this machine has no up NIC with an IPv4 address besides lo")


def test_edited_copies_name_the_odd_node(tmp_path: Path) -> None:
    nic, ip, mask = this_nic()
    render_job(
        RenderRequest(model="wan2.1", task="t2v", out_dir="job", confirm=True, nnodes=2, master_addr=ip, num_workers=0),
        root=tmp_path,
    )  # fmt: skip
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "pdsh").write_text("#!/bin/sh\nexit 0\n")
    (fake / "pdsh").chmod(0o755)
    base = cli_env(tmp_path, GLOO_SOCKET_IFNAME=nic)
    with_pdsh = {**base, "PATH": f"{fake}{os.pathsep}{base['PATH']}"}
    a = fingerprint(tmp_path, "a.json", "--job", "job", "--python", sys.executable, env=with_pdsh)
    no_pdsh = {**base, "PATH": os.pathsep.join(p for p in base["PATH"].split(os.pathsep) if not (Path(p) / "pdsh").exists())}  # fmt: skip
    a_nopdsh = fingerprint(tmp_path, "a-nopdsh.json", "--job", "job", env=no_pdsh)

    fp = NodeFingerprint.model_validate_json(a.read_text())
    assert fp.layout.nnodes == 2 and fp.layout.runtime == "mindspeed-mm" and fp.layout.master_addr == ip
    assert fp.master is not None and fp.master.status == "local"  # MASTER_ADDR is this machine's address
    assert fp.pdsh == str(fake / "pdsh") and fp.socket_ifname == {"GLOO_SOCKET_IFNAME": nic}
    assert fp.python == f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    assert any(n.name == nic and any(x.address == ip for x in n.ipv4) for n in fp.nics)

    # node B: the same install, another address on node 0's subnet, MASTER_ADDR answered (nothing listens yet)
    net = ipaddress.IPv4Network(f"{ip}/{mask}", strict=False)
    b_ip = str(next(h for h in net.hosts() if str(h) != ip))
    b_nics = [{"name": nic, "up": True, "ipv4": [{"address": b_ip, "netmask": mask}]}]
    master_b = {**fp.master.model_dump(), "status": "refused", "detail": "answered"}
    b = edited(a, tmp_path / "b.json", hostname="nodeB", nics=b_nics, master=master_b, layout__node_rank=1)
    clean = compare_fingerprints([a, b])
    assert clean.ok, [f for f in clean.checks if f.status != "ok"]
    assert [n.master for n in clean.nodes] == [True, False]
    assert {f.id for f in clean.checks if f.status == "ok"} >= {
        "master_reachable",
        "socket_ifname",
        "pdsh",
        "nnodes",
    }
    node_a = clean.nodes[0].name
    assert node_a == fp.hostname

    odd = compare_fingerprints(
        [a, edited(b, tmp_path / "b-npu.json", torch_npu="2.1.0.post8", cann="8.0.RC1")]
    )
    for rule in ("same_torch_npu", "same_cann"):
        finding = only(odd, rule)
        assert finding.status == "fail" and finding.nodes == ["nodeB"], finding
        assert finding.fix and "nodeB" in finding.fix
    assert "2.1.0.post8" in only(odd, "same_torch_npu").summary and not odd.ok

    far = edited(
        b, tmp_path / "b-far.json", master={**master_b, "status": "unreachable", "detail": "no answer"}
    )
    master = only(compare_fingerprints([a, far]), "master_reachable")
    assert master.status == "fail" and master.nodes == ["nodeB"] and ip in master.summary

    pdsh = only(compare_fingerprints([a_nopdsh, b]), "pdsh")  # node 0 is the one MASTER_ADDR belongs to
    assert pdsh.status == "fail" and pdsh.nodes == [node_a] and "apt install pdsh" in (pdsh.fix or "")
    assert only(compare_fingerprints([b, a]), "pdsh").nodes == [node_a]  # whatever the order of the files

    twice = compare_fingerprints([a, a_nopdsh, b])
    dup = only(twice, "duplicate_node")
    assert dup.status == "warn" and dup.nodes == [f"{node_a} ({a})", f"{node_a} ({a_nopdsh})"]
    nnodes = only(twice, "nnodes")
    assert nnodes.status == "warn" and "3 fingerprint(s)" in nnodes.summary

    other_net = edited(b, tmp_path / "b-net.json", nics=[{"name": nic, "ipv4": [{"address": "10.254.0.2", "netmask": "255.255.255.0"}]}])  # fmt: skip
    subnet = only(compare_fingerprints([a, other_net]), "socket_ifname")
    assert subnet.status == "fail" and subnet.nodes == ["nodeB"] and "subnet" in subnet.summary

    done = doctor(tmp_path, "--hosts", str(a), str(tmp_path / "b-npu.json"), "--json", env=base)
    assert done.returncode == 1, done.stderr
    cli = HostsReport.model_validate_json(done.stdout)
    assert only(cli, "same_torch_npu").nodes == ["nodeB"]
    text = doctor(tmp_path, "--hosts", str(a), str(b), env=base)
    assert text.returncode == 0 and "NODES AGREE" in text.stdout, text.stdout + text.stderr


def test_bad_input_is_an_error_with_the_fix(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    good = fingerprint(tmp_path, "good.json", "--check", "shm", env=env)
    (tmp_path / "notjson.json").write_text("{oops")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    edited(good, tmp_path / "future.json", format=2)
    edited(good, tmp_path / "broken.json", nics="eth0")
    cases = {
        "missing.json": "check the path",
        "notjson.json": "not JSON",
        "other.json": "not an mm-agent node fingerprint",
        "future.json": "format 2; this mm-agent reads format 1",
        "broken.json": "invalid fingerprint",
    }
    for name, words in cases.items():
        done = doctor(tmp_path, "--hosts", str(good), str(tmp_path / name), env=env)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert words in done.stderr and str(tmp_path / name) in done.stderr and "fix:" in done.stderr, (
            done.stderr
        )

    mine = tmp_path / "notes.txt"
    mine.write_text("my notes\n")
    refused = doctor(tmp_path, "--fingerprint", str(mine), env=env)
    assert (
        refused.returncode == 2
        and "is not an mm-agent fingerprint" in refused.stderr
        and "fix:" in refused.stderr
    )
    assert mine.read_text() == "my notes\n"
    again = fingerprint(tmp_path, "good.json", "--check", "shm", env=env)  # its own file is replaced
    assert NodeFingerprint.model_validate_json(again.read_text()).hostname
    assert [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".good.json")
    ] == []  # no temp left behind
    both = doctor(tmp_path, "--hosts", str(good), "--fingerprint", str(tmp_path / "x.json"), env=env)
    assert both.returncode == 2 and "not both" in both.stderr


@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_two_hosts_in_namespaces(tmp_path: Path) -> None:
    """Each namespace fingerprints itself (its own hostname via a UTS namespace), MASTER_ADDR = host A."""

    def both(case: str, master: str, ifname_b: str) -> HostsReport:
        procs = []
        for host, name, ifname in ((a, "hostA", a.dev), (b, "hostB", ifname_b)):
            env = cli_env(
                tmp_path, GLOO_SOCKET_IFNAME=ifname, MASTER_ADDR=master, MASTER_PORT=str(port), NNODES="2"
            )
            out = tmp_path / f"{case}-{name}.json"
            argv = host.argv(["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, sys.executable,
                              "-m", "mm_agent", "doctor", "--check", "socket_ifname", "--timeout", "2",
                              "--fingerprint", str(out)])  # fmt: skip
            procs.append((subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), out))  # fmt: skip
        for proc, _ in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode in {0, 1}, err
        return compare_fingerprints([out for _, out in procs])

    port = 29000 + os.getpid() % 900
    with two_hosts() as (a, b):
        clean = both("clean", a.ip, b.dev)
        assert clean.ok and clean.counts["warn"] == 0, [f for f in clean.checks if f.status != "ok"]
        assert [(n.name, n.master) for n in clean.nodes] == [("hostA", True), ("hostB", False)]
        reach = only(clean, "master_reachable")
        assert (
            f"hostA: {a.ip}:{port} local" in reach.evidence[0]
            and f"hostB: {a.ip}:{port} refused" in reach.evidence[1]
        )

        wrong = only(both("wrongnic", a.ip, a.dev), "socket_ifname")  # node B told to use A's NIC name
        assert (
            wrong.status == "fail"
            and wrong.nodes == ["hostB"]
            and f"GLOO_SOCKET_IFNAME={a.dev}" in wrong.summary
        )
        assert wrong.fix and b.dev in wrong.fix

        nobody = str(ipaddress.ip_address(a.ip) + 8)  # on the veth's subnet, no host there
        lost = only(both("nobody", nobody, b.dev), "master_reachable")
        assert lost.status == "fail" and lost.nodes == ["hostA", "hostB"] and nobody in lost.summary
