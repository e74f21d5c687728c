"""Checks that nothing already holds what the job will bind: MASTER_PORT, the HCCL host-NIC port range, the
NPU-NIC port, and no training processes left over from an earlier run. Holders are named with PID, user and
command line through `mm_agent.procs`; a stop is suggested only for processes mm-agent started.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mm_agent import procs
from mm_agent.doctor.context import Context
from mm_agent.doctor.registry import Outcome, check, fail, ok, skip, warn
from mm_agent.doctor.runowners import RunOwner, owner_of, run_processes

HCCL_BASE_PORT = 60000  # HCCL host-NIC listen port base (HCCL_IF_BASE_PORT)
HCCL_PORT_COUNT = 32  # 60000-60031 by default
NPU_NIC_PORT = 16666


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if days else f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def holder_line(p: procs.ProcInfo) -> str:
    return f"PID {p.pid} (user {p.user or '?'}, up {_age(p.age_s)}): {p.command}"


def _foreign(ctx: Context, run: RunOwner | None) -> bool:
    """A run of another workspace than the one this server serves (the CLI, with no root, answers for all)."""
    return run is not None and ctx.root is not None and not run.serves(ctx.root)


def _stop_hint(p: procs.ProcInfo, run: RunOwner | None) -> str:
    """How to stop a process of this workspace: its run's `mm-agent stop` when a run recorded it."""
    if run is None:
        return p.stop_hint
    return (
        f"run {run.run_id} ({run.whose()}): `mm-agent stop {run.run_id}` (dry run), then "
        f"`mm-agent stop {run.run_id} --yes` (stop_job run_id={run.run_id})"
    )


def _hints(ctx: Context, holders: Iterable[procs.ProcInfo]) -> str:
    """How to free what `holders` hold: a stop command for this workspace's processes; another workspace's run
    is named, not offered to be stopped (its own server or CLI stops it)."""
    table = run_processes()
    seen: list[str] = []
    for h in holders:
        run = owner_of(h.pid, table)
        hint = (
            f"PID {h.pid} belongs to run {run.run_id} of {run.whose()}, not this workspace's: stop it from there"
            if run is not None and _foreign(ctx, run)
            else _stop_hint(h, run)
        )
        if hint not in seen:
            seen.append(hint)
    return " ".join(seen)


def _free_port_near(port: int, listeners: dict[int, set[int | None]]) -> int | None:
    return next((p for p in range(port + 1, min(port + 200, 65536)) if p not in listeners), None)


def _holders(ctx: Context, ports: Iterable[int]) -> tuple[list[int], list[procs.ProcInfo], bool]:
    """(busy ports, their visible holders, whether some holder is invisible)."""
    listeners = ctx.listeners()
    busy = [p for p in ports if p in listeners]
    found: dict[int, procs.ProcInfo] = {}
    hidden = False
    for port in busy:
        hidden |= None in listeners[port]
        for info in procs.port_holders(port, listeners=listeners, records=ctx.records()):
            found.setdefault(info.pid, info)
    return busy, list(found.values()), hidden


_HIDDEN = "a holder is not visible to this user: `sudo ss -ltnp 'sport = :{port}'` shows it"


@check("master_port", "MASTER_PORT free")
def master_port(ctx: Context) -> Outcome:
    port = ctx.master_port
    if ctx.job is not None and ctx.job.spec.node_rank != 0:
        return skip(
            f"only the master node (node_rank 0) listens on MASTER_PORT; this job is node_rank {ctx.job.spec.node_rank}"
        )
    busy, holders, hidden = _holders(ctx, [port])
    evidence = [f"MASTER_PORT {port} (from {ctx.master_port_source})"]
    if not busy:
        return ok(f"port {port} is free", evidence)
    evidence += [holder_line(h) for h in holders]
    if hidden:
        evidence.append(_HIDDEN.format(port=port))
    spare = _free_port_near(port, ctx.listeners())
    move = (
        f"use another port (--master-port {spare} / master_port: {spare} in job.yaml, then re-render)"
        if spare
        else "use another port"
    )
    who = ", ".join(f"PID {h.pid}" for h in holders) or "an invisible process"
    return fail(
        f"port {port} is in use by {who}: torchrun fails with `Address already in use` (errno 98)",
        f"{move}, or stop the holder: {_hints(ctx, holders) or _HIDDEN.format(port=port)}",
        evidence,
    )


def _hccl_ports(ctx: Context) -> tuple[list[int], str] | None:
    """Ports HCCL binds on the host NIC and where that range comes from; None for `auto`."""
    explicit = ctx.env.get("HCCL_HOST_SOCKET_PORT_RANGE", "").strip()
    if explicit:
        if explicit.lower() == "auto":
            return None
        ports: list[int] = []
        for lo, hi in re.findall(r"(\d+)(?:\s*-\s*(\d+))?", explicit):
            ports += range(int(lo), int(hi or lo) + 1)
        return ports, f"HCCL_HOST_SOCKET_PORT_RANGE={explicit}"
    raw = ctx.env.get("HCCL_IF_BASE_PORT", "")
    base = int(raw) if raw.isdigit() else HCCL_BASE_PORT
    source = f"HCCL_IF_BASE_PORT={raw}" if raw.isdigit() else f"default base {HCCL_BASE_PORT}"
    return list(range(base, base + HCCL_PORT_COUNT)), f"{source}, {HCCL_PORT_COUNT} ports"


@check("hccl_ports", "HCCL host port range free")
def hccl_ports(ctx: Context) -> Outcome:
    if ctx.runtime == "bundled":
        device = ctx.device_choice()[0]
        if device in ("cpu", "cuda"):
            backend = "gloo" if device == "cpu" else "nccl"
            return skip(f"the bundled runtime on {device} communicates with {backend}, not HCCL")
    spec = _hccl_ports(ctx)
    if spec is None:
        return ok("HCCL_HOST_SOCKET_PORT_RANGE=auto: HCCL picks free ports itself")
    ports, source = spec
    evidence = [f"ports {ports[0]}-{ports[-1]} ({source})"]
    busy, holders, hidden = _holders(ctx, ports)
    if not busy:
        return ok(f"{len(ports)} port(s) from {ports[0]} free", evidence)
    evidence.append(f"busy: {', '.join(map(str, busy))}")
    evidence += [holder_line(h) for h in holders]
    if hidden:
        evidence.append(_HIDDEN.format(port=busy[0]))
    listeners = ctx.listeners()
    base = next(
        (
            b
            for b in range(ports[-1] + 1, 65536 - HCCL_PORT_COUNT, HCCL_PORT_COUNT)
            if not any(p in listeners for p in range(b, b + HCCL_PORT_COUNT))
        ),
        None,
    )
    move = f"export HCCL_IF_BASE_PORT={base}" if base else "set HCCL_IF_BASE_PORT to a free range"
    return fail(
        f"{len(busy)} HCCL port(s) in use: HCCL fails with EI0019 `... have already been bound`",
        f"stop the leftover job ({_hints(ctx, holders) or 'holder not visible'}) or {move} (A2/A3: HCCL_HOST_SOCKET_PORT_RANGE)",
        evidence,
    )


def _job_devices(ctx: Context, count: int) -> set[int]:
    visible = ctx.env.get("ASCEND_RT_VISIBLE_DEVICES", "")
    if visible:
        return {int(x) for x in re.findall(r"\d+", visible)}
    return set(range(min(count, ctx.npus_per_node or count)))


@check("npu_nic_port", "NPU-NIC port 16666 not held by another process")
def npu_nic_port(ctx: Context) -> Outcome:
    info = ctx.npu()
    if info is None or info.error or not info.chips:
        return skip(f"no NPUs: the NPU-NIC port {NPU_NIC_PORT} exists only on NPU machines")
    explicit = ctx.env.get("HCCL_NPU_SOCKET_PORT_RANGE", "").strip()
    if explicit.lower() == "auto":
        return ok("HCCL_NPU_SOCKET_PORT_RANGE=auto: HCCL picks free NPU-NIC ports itself")
    index = {(c.npu, c.chip): i for i, c in enumerate(info.chips)}
    mine = _job_devices(ctx, len(info.chips))
    records = ctx.records()
    clashes = []
    evidence = [f"port {explicit or NPU_NIC_PORT} on the NPU NICs, taken by every process using an NPU"]
    for p in info.processes:
        logical = index.get((p.npu, p.chip))
        holder = procs.describe_pid(p.pid, records, p.name)
        evidence.append(f"NPU {p.npu} chip {p.chip} (device {logical}): {holder_line(holder)}")
        if logical in mine:
            clashes.append(holder)
    if not clashes:
        return ok("no other process uses the job's NPUs", evidence)
    return fail(
        f"{len(clashes)} process(es) already use the job's NPUs and hold their NPU-NIC port: HCCL fails to bind",
        f"wait for or stop them ({_hints(ctx, clashes)}), use other NPUs (ASCEND_RT_VISIBLE_DEVICES), or set "
        "HCCL_NPU_SOCKET_PORT_RANGE=auto",
        evidence,
    )


@check("stale_processes", "No leftover training processes")
def stale_processes(ctx: Context) -> Outcome:
    """Training processes running now. One that a run of another workspace started (every workspace of a user
    shares the state directory, `runowners.py`) is named with its run and workspace, not counted as this
    workspace's leftover, and never offered for stopping here; the CLI serves no one workspace and names whose
    each is."""
    found = procs.stale_training_processes(ctx.records())
    if not found:
        return ok("no torchrun / pretrain_*.py / MindSpeed processes running")
    table = run_processes()
    mine: list[tuple[procs.ProcInfo, RunOwner | None]] = []
    others: list[tuple[procs.ProcInfo, RunOwner]] = []
    for p in found:
        run = owner_of(p.pid, table)
        if run is not None and _foreign(ctx, run):
            others.append((p, run))
        else:
            mine.append((p, run))
    evidence = [holder_line(p) + (f" [run {run.run_id} of {run.whose()}]" if run else "") for p, run in mine]
    evidence += [
        f"{holder_line(p)} [run {run.run_id} of {run.whose()}: not this workspace's, left alone]"
        for p, run in others
    ]
    foreign = sorted({run.run_id for _, run in others})
    if not mine:
        return ok(
            f"no leftover training processes of this workspace; {len(others)} running belong to another "
            f"workspace's run(s) {', '.join(foreign)}",
            evidence,
        )
    own = [p for p, _ in mine if p.started_by_mm_agent]
    hints: list[str] = []
    for p, run in mine:
        hint = _stop_hint(p, run)
        if hint not in hints:
            hints.append(hint)
    also = f"; {len(others)} more belong to other workspaces' runs ({', '.join(foreign)})" if others else ""
    return warn(
        f"{len(mine)} training process(es) running"
        + (f" ({len(own)} started by mm-agent)" if own else "")
        + f": leftovers hold ports, NPUs and HBM{also}",
        f"if they belong to an earlier run: {' '.join(hints)} Then wait ~10 s for the NPUs to be released.",
        evidence,
    )
