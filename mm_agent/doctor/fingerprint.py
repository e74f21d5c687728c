"""Node fingerprints (CLI `mm-agent doctor --fingerprint FILE` on every node, then `doctor --hosts FILE ...`):
a multi-node MindSpeed-MM job hangs with no error when its nodes differ (CANN, torch_npu, the checkout's
commit), when a node cannot reach MASTER_ADDR, or when a socket IFNAME picks a NIC off the master's network.
One host cannot see any of that; the fingerprints of all of them side by side can.

A fingerprint is written from what the doctor's checks already gathered (the probes cached in `Context`),
plus one TCP connect to MASTER_ADDR:MASTER_PORT; `load_fingerprint` reads one back, and `doctor/hosts.py`
compares them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from mm_agent.doctor import check_environment
from mm_agent.doctor.checks_multinode import IFNAME_VARS
from mm_agent.doctor.context import Context
from mm_agent.doctor.gitinfo import git_head, installed_commit
from mm_agent.doctor.models import DoctorReport, DoctorRequest
from mm_agent.doctor.probes import ProbeError, ascend_bases, cann_toolkit, driver_info, read_kv
from mm_agent.errors import MMAgentError, os_error
from mm_agent.paths import read_file

KIND: Final = "mm-agent node fingerprint"
FORMAT: Final = 1
MAX_FINGERPRINT = 1024 * 1024  # a fingerprint is a few KiB
_PACKAGE_INFO = re.compile(r"^(MAJOR|MINOR|PATCH)\s*=\s*(\d+)", re.MULTILINE)
REWRITE_FIX = (
    "rerun `mm-agent doctor --fingerprint FILE` on that node (with this mm-agent), then compare again"
)

Reach = Literal["local", "listening", "refused", "unreachable", "unresolved"]


def _ipv4(value: str) -> str:
    try:
        ipaddress.IPv4Address(value)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an IPv4 address ({exc})") from None
    return value


def _netmask(value: str) -> str:
    try:
        ipaddress.IPv4Network(f"0.0.0.0/{value}")
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an IPv4 netmask ({exc})") from None
    return value


# Addresses are checked when a fingerprint is read: `doctor --hosts` computes with them (subnets, loopback),
# and a file edited by hand or written by something else must be an error naming the field, not a traceback.
IPv4Text = Annotated[str, AfterValidator(_ipv4)]
NetmaskText = Annotated[str, AfterValidator(_netmask)]


class NicAddress(BaseModel):
    address: IPv4Text
    netmask: NetmaskText | None = None


class Nic(BaseModel):
    name: str
    up: bool | None = None
    ipv4: list[NicAddress] = Field(default_factory=list)


class Layout(BaseModel):
    """The node layout the launch scripts would use here: the environment over the job's (as the rendered
    scripts read NNODES/NODE_RANK/MASTER_ADDR); MASTER_PORT as the doctor resolved it."""

    job: str | None = Field(default=None, description="the rendered job given with --job")
    runtime: str | None = Field(default=None, description="the job's runtime (mindspeed-mm | bundled)")
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None


class MasterReach(BaseModel):
    addr: str
    port: int
    ip: IPv4Text | None = Field(default=None, description="MASTER_ADDR resolved to IPv4")
    status: Reach = Field(
        description="local: this node is the master; refused: the host answered, nothing listens"
    )
    detail: str


class NodeFingerprint(BaseModel):
    """What must agree across the nodes of one job, as seen on one node."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["mm-agent node fingerprint"] = KIND
    format: Literal[1] = FORMAT
    written: str
    hostname: str
    nics: list[Nic]
    python: str | None = None
    cann: str | None = None
    driver: str | None = None
    firmware: str | None = None
    torch: str | None = None
    torch_npu: str | None = None
    mindspeed: str | None = None
    mindspeed_commit: str | None = None
    megatron: str | None = None
    mindspeed_mm: str | None = Field(default=None, description="the installed mindspeed_mm distribution")
    mindspeed_mm_commit: str | None = Field(default=None, description="HEAD of the MindSpeed-MM checkout")
    mm_version: str = Field(description="the MindSpeed-MM version the doctor checked against")
    pdsh: str | None = None
    socket_ifname: dict[str, str] = Field(default_factory=dict)
    layout: Layout
    master: MasterReach | None = None


# ---------------------------------------------------------------------------------------------------------
# writing


def _nics(ctx: Context) -> list[Nic]:
    addrs, stats = ctx.nics()
    return [
        Nic(
            name=name,
            up=stats[name].isup if name in stats else None,
            ipv4=[
                NicAddress(address=a.address, netmask=a.netmask)
                for a in addrs[name]
                if a.family == socket.AF_INET
            ],
        )
        for name in sorted(addrs)
    ]


def _env_int(ctx: Context, var: str) -> int | None:
    value = ctx.env.get(var, "").strip()
    return int(value) if value.isdigit() else None


def _layout(ctx: Context) -> Layout:
    spec = ctx.job.spec if ctx.job is not None else None
    addr = ctx.env.get("MASTER_ADDR", "").strip() or (spec.master_addr if spec else None)
    node_rank = _env_int(ctx, "NODE_RANK")
    return Layout(
        job=str(ctx.job_dir) if ctx.job_dir else None,
        runtime=ctx.runtime if ctx.job is not None else None,
        nnodes=_env_int(ctx, "NNODES") or (ctx.nnodes if ctx.job is not None else None),
        node_rank=node_rank if node_rank is not None else (spec.node_rank if spec else None),
        master_addr=addr,
        master_port=ctx.master_port if addr else None,
    )


def _connect(ip: str, port: int, timeout_s: float) -> tuple[Reach, str]:
    try:
        with socket.create_connection((ip, port), timeout=timeout_s):
            return "listening", f"{ip}:{port} accepted a TCP connection"
    except ConnectionRefusedError:
        return "refused", f"{ip} answered (nothing listens on {port} yet: fine before the launch)"
    except TimeoutError:
        return "unreachable", f"no answer from {ip}:{port} within {timeout_s:g} s"
    except OSError as exc:
        return "unreachable", f"connect to {ip}:{port}: {exc.strerror or exc}"


def master_reach(addr: str, port: int, own_ips: set[str], timeout_s: float) -> MasterReach:
    """Whether this node reaches MASTER_ADDR:MASTER_PORT: resolve (in a thread, so a hung resolver costs at
    most `timeout_s`), then one TCP connect. A refusal counts as reachable: the master's host answered."""
    found: list[str] = []

    def resolve() -> None:
        with contextlib.suppress(OSError, UnicodeError):
            found.append(str(socket.getaddrinfo(addr, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]))

    start = time.monotonic()
    worker = threading.Thread(target=resolve, name="doctor-resolve-master", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not found:
        return MasterReach(
            addr=addr, port=port, status="unresolved", detail=f"{addr} does not resolve to IPv4 here"
        )
    ip = found[0]
    if ip in own_ips or ipaddress.ip_address(ip).is_loopback:
        return MasterReach(
            addr=addr, port=port, ip=ip, status="local", detail=f"{ip} is an address of this node"
        )
    status, detail = _connect(ip, port, max(0.2, timeout_s - (time.monotonic() - start)))
    return MasterReach(addr=addr, port=port, ip=ip, status=status, detail=detail)


def _megatron(ctx: Context) -> str | None:
    """The core version of the checkout's megatron/ copy (what MindSpeed-MM imports), else megatron-core's."""
    root = ctx.checkout()
    info = root / "megatron" / "core" / "package_info.py" if root else None
    if info is not None and info.is_file():
        with contextlib.suppress(MMAgentError):
            parts = dict(
                _PACKAGE_INFO.findall(
                    read_file(info, ctx.root, "mm_root", 64 * 1024).decode("utf-8", "replace")
                )
            )
            return ".".join(parts.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH"))
    with contextlib.suppress(ProbeError):
        return ctx.pyenv().dists.get("megatron_core")
    return None


def _firmware(ctx: Context) -> str | None:
    for base in ascend_bases(ctx.env):
        info = base / "firmware" / "version.info"
        if info.is_file():
            with contextlib.suppress(OSError):
                return read_kv(info).get("version")
    return None


def node_fingerprint(ctx: Context) -> NodeFingerprint:
    """This node's fingerprint from a doctor run's context: the interpreter probe the checks cached, the
    CANN/driver install files, the NICs, and the master reachability (one connect, the probe timeout)."""
    ctx.deadline = max(
        ctx.deadline, time.monotonic() + ctx.timeout_s
    )  # probes no check asked for get a budget
    dists: dict[str, str] = {}
    python = mindspeed_commit = None
    with contextlib.suppress(ProbeError):
        env = ctx.pyenv()
        dists, python = env.dists, env.python
        if "mindspeed" in dists:
            mindspeed_commit = installed_commit(env, "mindspeed", ctx.root)[0]
    checkout = ctx.checkout()
    toolkit, driver = cann_toolkit(ctx.env), driver_info(ctx.env)
    nics = _nics(ctx)
    layout = _layout(ctx)
    master = None
    if layout.master_addr and layout.master_port:
        own = {a.address for n in nics for a in n.ipv4}
        master = master_reach(layout.master_addr, layout.master_port, own, ctx.timeout_s)
    return NodeFingerprint(
        written=datetime.now(UTC).isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
        nics=nics,
        python=python,
        cann=toolkit.version if toolkit else None,
        driver=driver.version if driver else None,
        firmware=_firmware(ctx),
        torch=dists.get("torch"),
        torch_npu=dists.get("torch_npu"),
        mindspeed=dists.get("mindspeed"),
        mindspeed_commit=mindspeed_commit,
        megatron=_megatron(ctx),
        mindspeed_mm=dists.get("mindspeed_mm"),
        mindspeed_mm_commit=git_head(checkout, ctx.root)[0] if checkout and checkout.is_dir() else None,
        mm_version=ctx.version.id,
        pdsh=shutil.which("pdsh", path=ctx.env.get("PATH")),
        socket_ifname={v: ctx.env[v] for v in IFNAME_VARS if ctx.env.get(v)},
        layout=layout,
        master=master,
    )


def _is_fingerprint(path: Path) -> bool:
    try:
        data = json.loads(read_file(path, None, "fingerprint", MAX_FINGERPRINT))
    except (MMAgentError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == KIND


def _refuse_foreign(path: Path) -> None:
    """An existing file is only replaced when it is an mm-agent fingerprint: anything else there is the user's."""
    if path.is_dir() or (path.exists() and not _is_fingerprint(path)):
        raise MMAgentError(
            f"{path} exists and is not an mm-agent fingerprint; it is not replaced",
            file=str(path),
            field="--fingerprint",
            fix="pass another --fingerprint path (e.g. fingerprint-$(hostname).json), or move that file away",
        )


def write_fingerprint(fp: NodeFingerprint, path: Path) -> None:
    """Write `fp` to `path` atomically: a temp file beside it, renamed over it (readers never see half)."""
    _refuse_foreign(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(fp.model_dump_json(indent=2) + "\n")
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise os_error(exc, file=str(path), field="--fingerprint") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def doctor_with_fingerprint(req: DoctorRequest, path: Path) -> tuple[DoctorReport, NodeFingerprint]:
    """The normal doctor run, and this node's fingerprint written to `path` from what its checks gathered
    (a path that may not be written is refused before the checks run)."""
    _refuse_foreign(path)
    taken: list[NodeFingerprint] = []

    def collect(ctx: Context) -> None:
        taken.append(node_fingerprint(ctx))

    report = check_environment(req, inspect=collect)
    write_fingerprint(taken[0], path)
    return report, taken[0]


def load_fingerprint(path: Path) -> NodeFingerprint:
    """A fingerprint file; anything else is an error naming the file and the fix."""
    try:
        data = json.loads(read_file(path, None, "--hosts", MAX_FINGERPRINT))
    except ValueError as exc:
        raise MMAgentError(
            f"not JSON ({exc})",
            file=str(path),
            fix=f"pass the file `mm-agent doctor --fingerprint` wrote; {REWRITE_FIX}",
        ) from None
    except MMAgentError as exc:
        raise MMAgentError(exc.message, file=str(path), fix=f"check the path; {REWRITE_FIX}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise MMAgentError(
            'not an mm-agent node fingerprint (no "kind": "mm-agent node fingerprint")',
            file=str(path),
            fix=f"pass the files `mm-agent doctor --fingerprint FILE` wrote on each node; {REWRITE_FIX}",
        )
    if data.get("format") != FORMAT:
        raise MMAgentError(
            f"fingerprint format {data.get('format')!r}; this mm-agent reads format {FORMAT}",
            file=str(path),
            field="format",
            fix=f"use the same mm-agent version on every node: {REWRITE_FIX}",
        )
    try:
        return NodeFingerprint.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise MMAgentError(
            f"invalid fingerprint: {err['msg'].removeprefix('Value error, ')}",
            file=str(path),
            field=".".join(str(p) for p in err["loc"]) or None,
            fix=REWRITE_FIX,
        ) from None
