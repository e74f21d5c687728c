"""Run and parse `npu-smi info`: the NPU table (id, name, health, HBM) and the process table.

The text format is the only interface the driver offers on every release (there is no JSON mode), so the
parser keys on the table's structure, not on column offsets: device rows come in pairs (`NPU Name | Health`
then `Chip [Phy-ID] | Bus-Id | ... HBM used / total`), process rows are `NPU Chip | PID | name | MB`.
Both the 910B layout (`Chip`) and the A2/A3 layout (`Chip Phy-ID`, two chips per NPU) are handled.
"""

from __future__ import annotations

import re
import shutil

from pydantic import BaseModel, Field

from mm_agent.contained import Scope, run_contained

_FIRST_ROW = re.compile(r"^(\d+)\s+(.*\S)$")
_SECOND_ROW = re.compile(r"^(\d+)(?:\s+(\d+))?$")
_PROC_NPU = re.compile(r"^(\d+)\s+(\d+)$")
_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")
_VERSION = re.compile(r"npu-smi\s+(\S+)")
_NO_PROCS = re.compile(r"No running processes found in NPU (\d+)")


class NpuChip(BaseModel):
    """One logical device (what ASCEND_RT_VISIBLE_DEVICES counts)."""

    npu: int
    chip: int
    phy_id: int | None = None
    name: str
    health: str
    bus_id: str | None = None
    hbm_used_mb: int | None = None
    hbm_total_mb: int | None = None


class NpuProcess(BaseModel):
    npu: int
    chip: int
    pid: int
    name: str
    memory_mb: int | None = None


class NpuSmiInfo(BaseModel):
    version: str | None = None
    chips: list[NpuChip] = Field(default_factory=list)
    processes: list[NpuProcess] = Field(default_factory=list)
    error: str | None = Field(default=None, description="set when npu-smi ran but failed or timed out")

    @property
    def unhealthy(self) -> list[NpuChip]:
        return [c for c in self.chips if c.health.upper() != "OK"]


def _cells(line: str) -> list[str] | None:
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")):
        return None
    return [c.strip() for c in line[1:-1].split("|")]


def parse(text: str) -> NpuSmiInfo:
    """Parse the text of `npu-smi info`."""
    info = NpuSmiInfo()
    section = ""
    pending: tuple[int, str, str] | None = None  # (npu, name, health) of a device's first row
    for line in text.splitlines():
        if info.version is None and (m := _VERSION.search(line)):
            info.version = m.group(1)
            continue
        cells = _cells(line)
        if not cells:
            continue
        head = cells[0]
        if len(cells) > 1 and cells[1].startswith("Process id"):
            section, pending = "proc", None
            continue
        if head.startswith("NPU") and "Name" in head:
            section = "dev"
            continue
        if section == "dev" and len(cells) >= 3:
            second = _SECOND_ROW.match(head)
            if second and pending is not None:
                npu, name, health = pending
                usage = _USAGE.findall(cells[2])
                used, total = (int(usage[-1][0]), int(usage[-1][1])) if usage else (None, None)
                info.chips.append(
                    NpuChip(
                        npu=npu,
                        chip=int(second.group(1)),
                        phy_id=int(second.group(2)) if second.group(2) else None,
                        name=name,
                        health=health,
                        bus_id=cells[1] or None,
                        hbm_used_mb=used,
                        hbm_total_mb=total,
                    )
                )
                pending = None
            elif (first := _FIRST_ROW.match(head)) and not second:
                pending = (int(first.group(1)), first.group(2), cells[1])
        elif section == "proc" and len(cells) >= 3 and (m := _PROC_NPU.match(head)) and cells[1].isdigit():
            mem = cells[3] if len(cells) > 3 else ""
            info.processes.append(
                NpuProcess(
                    npu=int(m.group(1)),
                    chip=int(m.group(2)),
                    pid=int(cells[1]),
                    name=cells[2],
                    memory_mb=int(mem) if mem.isdigit() else None,
                )
            )
    return info


def query(timeout_s: float = 2.5, scope: Scope | None = None) -> NpuSmiInfo | None:
    """`npu-smi info` parsed; None when npu-smi is not on PATH; `error` set when it fails or hangs. It runs
    contained (`mm_agent.contained`, in `scope` when given): a hung npu-smi is killed with anything it
    started."""
    exe = shutil.which("npu-smi")
    if exe is None:
        return None
    try:
        out = run_contained([exe, "info"], timeout_s=timeout_s, scope=scope)
    except OSError as exc:
        return NpuSmiInfo(error=f"cannot run {exe}: {exc}")
    if out.timed_out:
        return NpuSmiInfo(error=f"`npu-smi info` did not answer within {timeout_s:.1f} s")
    if out.returncode != 0:
        detail = (out.stderr or out.stdout).strip().splitlines()
        return NpuSmiInfo(
            error=f"`npu-smi info` exited {out.returncode}: {detail[-1] if detail else 'no output'}"
        )
    info = parse(out.stdout)
    if not info.chips:
        info.error = "`npu-smi info` printed no NPU table"
    return info
