"""HCCL rank tables (hccl.json): build one from each node's /etc/hccn.conf, and check one against a job.

A job started with `RANK_TABLE_FILE` set has HCCL build its communicator from that file instead of from the
torchrun rendezvous: every NPU of every node is listed with its NIC IP (`device_ip`) and its global rank. A
table that disagrees with the launch (a node missing, 7 devices where the job starts 8, a rank listed twice)
hangs or fails at the first collective, far from its cause; so mm-agent writes the table from the nodes' own
NIC configuration and `validate` checks a given one (`mm_agent/validate/rules_ranktable.py`).

Format (Atlas training / Atlas A2 training products, 910B, Atlas 800T A2; template 1, `version` "1.0"); every
value is a JSON string:
  {"status": "completed", "version": "1.0", "server_count": "2",
   "server_list": [{"server_id": "<host ip>", "device": [{"device_id": "0", "device_ip": "<NIC ip>",
                                                           "rank_id": "0"}, ...]}, ...]}
`status` "completed" marks the table usable ("initializing": not yet); `server_id` is unique per server (the
Ascend Operator writes the host IP there, as we do); `rank_id` runs from 0 and is globally unique; `device_id`
is the NPU's physical id. Optional keys (`host_nic_ip`, `container_ip`, `hardware_type`, A3's
`super_device_id`/`super_pod_list` in `version` "1.2") are kept when read, never required.
Sources: hiascend.com CANN "ranktable file" pages (TensorFlowCommercial/800 migration tfmigr1_000030 and
tfmigr2_000031, table 1 of the ranktable options; canncommercial/82RC1 hccl/hcclug/hcclug_000014; 850
commlib/hcclug/hcclug_000063: a rank table and the HCCL environment variables cannot be used together),
MindCluster 730 "hccl.json File Description" (clustersched/schedulingug/mxdlug_appendices_009), and the
rank tables in Ascend/MindIE-PyMotor tests/jsons/hccl_a2.json and Ascend/MindIE-LLM
tests/fuzztest_llmmanager/llm_manager/ranktable.json (gitcode.com).

/etc/hccn.conf is what `hccn_tool -i <dev> -ip -s address <ip> netmask <mask>` (and its -gateway, -netdetect
... options) writes: one `<key>_<device id>=<value>` line per setting, e.g. `address_0=192.168.10.11`,
`netmask_0=255.255.255.0`; the device IP is `address_<dev>`. MindSpore's model_zoo/utils/hccl_tools reads it
the same way (lines starting with `address_`).

MindSpeed-MM and MindSpeed do not read `RANK_TABLE_FILE` themselves (no mention in
/work/shared/upstream/MindSpeed-MM/{v26.0.0,v26.1.0,master-57069cd} or MindSpeed/26.x: `rank_table` there is
the data-balance feature's sample table); torch_npu's HCCL backend picks the variable up from the environment.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.dataset.write import check_writable, write_bytes
from mm_agent.errors import MMAgentError, os_error
from mm_agent.fields import MAX_ITEMS, PathText
from mm_agent.paths import open_file

VERSION = "1.0"
COMPLETED = "completed"
MAX_TEXT = 1 << 20  # a hosts file or hccn.conf is a few hundred bytes; more is not one
_HCCN_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z][A-Za-z0-9]*)*)_(\d+)\s*=\s*(\S*)$")
_COPY_FIX = "copy each node's /etc/hccn.conf (scp <node>:/etc/hccn.conf <node-ip>.hccn.conf), unedited"


class RankTableDevice(BaseModel):
    model_config = ConfigDict(extra="allow")
    device_id: str = Field(description="the NPU's physical id on its server")
    device_ip: str = Field(description="the NPU's NIC address (address_<dev> of /etc/hccn.conf)")
    rank_id: str = Field(description="global rank, 0 .. world size - 1")


class RankTableServer(BaseModel):
    model_config = ConfigDict(extra="allow")
    server_id: str = Field(description="the server's host IP, unique in the table")
    device: list[RankTableDevice]


class RankTable(BaseModel):
    """hccl.json as HCCL reads it (all values strings)."""

    model_config = ConfigDict(extra="allow")
    version: str = VERSION
    server_count: str
    server_list: list[RankTableServer]
    status: str = COMPLETED


class HostEntry(BaseModel):
    server_ip: str = Field(description="the host's IP address (becomes server_id)")
    hccn_conf: PathText = Field(description="a copy of that host's /etc/hccn.conf")


class RankTableRequest(BaseModel):
    hosts_file: PathText | None = Field(
        default=None,
        description="one host per line: '<server_ip> [hccn_conf_path]' (path relative to this file; default "
        "<server_ip>.hccn.conf next to it); '#' comments and blank lines allowed",
    )
    hosts: list[HostEntry] | None = Field(
        default=None, max_length=MAX_ITEMS, description="the hosts in node-rank order (instead of hosts_file)"
    )
    devices: int | None = Field(
        default=None, ge=1, le=64, description="NPUs per node, ids 0..N-1 (default: all in each hccn.conf)"
    )
    out: PathText = Field(default="hccl.json", description="rank table file to write")
    confirm: bool = Field(default=False, description="write the file (false: dry run)")


class RankTableResult(BaseModel):
    out: str
    state: str = Field(description="'dry run', 'written' or 'unchanged'")
    nnodes: int
    npus_per_node: int
    world_size: int
    table: RankTable


class Problem(BaseModel):
    """One defect of a rank table: `rule` is the validate rule id, `field` the dotted path inside the table."""

    rule: str
    field: str | None
    message: str
    fix: str


def _read(path: Path, field: str) -> str:
    try:
        missing = not os.path.lexists(path)
    except ValueError:  # a NUL byte in a name read from the hosts file
        missing = True
    if missing:
        fix = _COPY_FIX if field == "hccn_conf" else "check the path"
        raise MMAgentError("no such file", file=str(path), field=field, fix=fix)
    try:
        with open_file(path, None, field) as fh:
            text = fh.read(MAX_TEXT + 1).decode("utf-8", errors="replace")
    except OSError as exc:
        raise os_error(exc, file=str(path), field=field) from None
    if len(text) > MAX_TEXT:
        raise MMAgentError(
            f"over {MAX_TEXT} characters", file=str(path), field=field, fix=f"pass the {field}"
        )
    return text


def _ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def parse_hccn_conf(text: str, *, file: str | None = None) -> dict[int, str]:
    """Device id -> device IP from /etc/hccn.conf text; a malformed line is refused with its line number
    (a hand-edited file silently giving a wrong IP would hang HCCL at the first collective)."""
    ips: dict[int, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _HCCN_LINE.match(line)
        if match is None:
            raise MMAgentError(
                f"not a '<key>_<device id>=<value>' line: {line[:80]!r}",
                file=file,
                field=f"line {number}",
                fix=_COPY_FIX,
            )
        key, device, value = match.group(1), int(match.group(2)), match.group(3)
        if key != "address":
            continue
        if not _ip(value):
            raise MMAgentError(
                f"line {number}: address_{device}={value!r} is not an IP address",
                file=file,
                field=f"address_{device}",
                fix=f"set it with hccn_tool -i {device} -ip -s address <ip> netmask <mask>, then copy the file again",
            )
        if device in ips:
            raise MMAgentError(
                f"line {number}: address_{device} is set twice",
                file=file,
                field=f"address_{device}",
                fix=_COPY_FIX,
            )
        ips[device] = value
    if not ips:
        raise MMAgentError(
            "no address_<device id>= line: no NPU NIC is configured",
            file=file,
            fix="configure each NPU NIC with hccn_tool -i <dev> -ip -s address <ip> netmask <mask>; "
            + _COPY_FIX,
        )
    return ips


def read_hosts_file(path: Path) -> list[HostEntry]:
    """The hosts of a hosts file in order; a path left out is `<server_ip>.hccn.conf` next to the file."""
    hosts: list[HostEntry] = []
    for number, raw in enumerate(_read(path, "hosts_file").splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 2:
            raise MMAgentError(
                f"line {number} has {len(words)} words",
                file=str(path),
                field=f"line {number}",
                fix="write one host per line: <server_ip> [hccn_conf_path]",
            )
        conf = Path(words[1]).expanduser() if len(words) == 2 else Path(f"{words[0]}.hccn.conf")
        hosts.append(HostEntry(server_ip=words[0], hccn_conf=str(path.parent / conf)))
    if not hosts:
        raise MMAgentError(
            "no hosts", file=str(path), fix="write one host per line: <server_ip> [hccn_conf_path]"
        )
    return hosts


def _devices(hosts: list[HostEntry], ips: list[dict[int, str]], wanted: int | None) -> list[list[int]]:
    """The device ids used on each host, in device order."""
    if wanted is not None:
        for host, table in zip(hosts, ips, strict=True):
            missing = [d for d in range(wanted) if d not in table]
            if missing:
                raise MMAgentError(
                    f"device {missing[0]} of {host.server_ip} has no address_{missing[0]}= line "
                    f"(--devices {wanted} uses devices 0..{wanted - 1})",
                    file=host.hccn_conf,
                    field=f"address_{missing[0]}",
                    fix=f"configure it (hccn_tool -i {missing[0]} -ip -s address <ip> netmask <mask>) and copy "
                    "the file again, or pass fewer --devices",
                )
        return [list(range(wanted)) for _ in hosts]
    counts = {len(table) for table in ips}
    if len(counts) > 1:
        detail = ", ".join(f"{h.server_ip}: {len(t)}" for h, t in zip(hosts, ips, strict=True))
        raise MMAgentError(
            f"the hosts have different device counts ({detail})",
            file=hosts[0].hccn_conf,
            field="devices",
            fix="pass --devices N to use devices 0..N-1 on every host, or configure the missing NICs",
        )
    return [sorted(table) for table in ips]


def _check_hosts(hosts: list[HostEntry]) -> None:
    seen: set[str] = set()
    for host in hosts:
        if not _ip(host.server_ip):
            raise MMAgentError(
                f"server id {host.server_ip!r} is not an IP address",
                file=host.hccn_conf,
                field="server_ip",
                fix="name each host by the IP address the nodes reach it on (not a host name)",
            )
        if host.server_ip in seen:
            raise MMAgentError(
                f"host {host.server_ip} is listed twice",
                field="server_ip",
                fix="list each node once, in node-rank order",
            )
        seen.add(host.server_ip)


def build_table(hosts: list[HostEntry], devices: int | None) -> RankTable:
    """The rank table of `hosts` (node-rank order): ranks host by host in device order."""
    _check_hosts(hosts)
    ips = [parse_hccn_conf(_read(Path(h.hccn_conf), "hccn_conf"), file=h.hccn_conf) for h in hosts]
    used = _devices(hosts, ips, devices)
    owner: dict[str, str] = {}
    servers: list[RankTableServer] = []
    rank = 0
    for host, table, ids in zip(hosts, ips, used, strict=True):
        entries: list[RankTableDevice] = []
        for device in ids:
            ip = table[device]
            if ip in owner:
                raise MMAgentError(
                    f"device IP {ip} of {host.server_ip} device {device} is also {owner[ip]}'s",
                    file=host.hccn_conf,
                    field=f"address_{device}",
                    fix="give every NPU NIC of the cluster its own address (hccn_tool -i <dev> -ip -s address ...)",
                )
            owner[ip] = f"{host.server_ip} device {device}"
            entries.append(RankTableDevice(device_id=str(device), device_ip=ip, rank_id=str(rank)))
            rank += 1
        servers.append(RankTableServer(server_id=host.server_ip, device=entries))
    return RankTable(server_count=str(len(servers)), server_list=servers)


def render_table(table: RankTable) -> bytes:
    return (json.dumps(table.model_dump(exclude_none=True), indent=4) + "\n").encode()


def build_ranktable(req: RankTableRequest) -> RankTableResult:
    """Build hccl.json; write it (temp name + rename, never over a file mm-agent did not write) only with
    `confirm`."""
    if (req.hosts_file is None) == (req.hosts is None):
        raise MMAgentError(
            "pass either a hosts file or the hosts", field="hosts_file", fix="mm-agent ranktable HOSTS_FILE"
        )
    hosts = read_hosts_file(Path(req.hosts_file).expanduser()) if req.hosts_file else list(req.hosts or [])
    if not hosts:
        raise MMAgentError("no hosts", field="hosts", fix="list each node's IP and hccn.conf copy")
    table = build_table(hosts, req.devices)
    data = render_table(table)
    out = Path(req.out).expanduser().absolute()
    check_writable(out, None)  # the user's own file is refused in a dry run too
    state = write_bytes(out, data, None) if req.confirm else "dry run"
    per_node = len(table.server_list[0].device)
    return RankTableResult(
        out=str(out),
        state=state,
        nnodes=len(hosts),
        npus_per_node=per_node,
        world_size=per_node * len(hosts),
        table=table,
    )


# ---- checking a given table ------------------------------------------------------------------------------
def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _problem(rule: str, field: str | None, message: str, fix: str) -> Problem:
    return Problem(rule=rule, field=field, message=message, fix=fix)


def _server_problems(
    index: int, server: Any, npus_per_node: int | None, ips: dict[str, str], ranks: dict[int, str]
) -> list[Problem]:
    where = f"server_list[{index}]"
    if not isinstance(server, dict) or not isinstance(server.get("device"), list):
        return [
            Problem(
                rule="ranktable.schema",
                field=where,
                message="not an object with a 'device' list",
                fix='write each server as {"server_id": ..., "device": [...]} (mm-agent ranktable)',
            )
        ]
    out: list[Problem] = []
    devices: list[Any] = server["device"]
    if npus_per_node is not None and len(devices) != npus_per_node:
        out.append(
            _problem(
                "ranktable.devices",
                f"{where}.device",
                f"server {server.get('server_id')!r} lists {len(devices)} devices; the job starts "
                f"{npus_per_node} processes per node",
                f"list {npus_per_node} devices per server (mm-agent ranktable HOSTS --devices {npus_per_node}), "
                "or render the job with --npus-per-node matching the table",
            )
        )
    ids: set[str] = set()
    for j, device in enumerate(devices):
        at = f"{where}.device[{j}]"
        if not isinstance(device, dict):
            out.append(
                _problem(
                    "ranktable.schema",
                    at,
                    "not an object",
                    'write each device as {"device_id", "device_ip", "rank_id"}',
                )
            )
            continue
        device_id = str(device.get("device_id"))
        if _int(device.get("device_id")) is None:
            out.append(
                _problem(
                    "ranktable.device_id",
                    f"{at}.device_id",
                    f"device_id {device.get('device_id')!r} is not a device number",
                    "use the NPU's physical id (0..7 on an 8-NPU server), as a string",
                )
            )
        elif device_id in ids:
            out.append(
                _problem(
                    "ranktable.device_id",
                    f"{at}.device_id",
                    f"device_id {device_id} is listed twice on this server",
                    "list each NPU of a server once (mm-agent ranktable builds it from hccn.conf)",
                )
            )
        ids.add(device_id)
        ip = device.get("device_ip")
        if not isinstance(ip, str) or not _ip(ip):
            out.append(
                _problem(
                    "ranktable.device_ip",
                    f"{at}.device_ip",
                    f"device_ip {ip!r} is not an IP address",
                    "use the NPU's NIC address, address_<dev> of that node's /etc/hccn.conf",
                )
            )
        elif ip in ips:
            out.append(
                _problem(
                    "ranktable.device_ip",
                    f"{at}.device_ip",
                    f"device_ip {ip} is also {ips[ip]}'s",
                    "each NPU has its own NIC address: take them from each node's /etc/hccn.conf",
                )
            )
        else:
            ips[ip] = at
        rank = _int(device.get("rank_id"))
        if rank is None:
            out.append(
                _problem(
                    "ranktable.rank_id",
                    f"{at}.rank_id",
                    f"rank_id {device.get('rank_id')!r} is not a number",
                    "number the ranks 0 .. world size - 1, host by host in device order",
                )
            )
        elif rank in ranks:
            out.append(
                _problem(
                    "ranktable.rank_id",
                    f"{at}.rank_id",
                    f"rank_id {rank} is also {ranks[rank]}'s",
                    "give every device its own rank, 0 .. world size - 1 (mm-agent ranktable)",
                )
            )
        else:
            ranks[rank] = at
    return out


def check_ranktable(table: object, *, nnodes: int | None, npus_per_node: int | None) -> list[Problem]:
    """What is wrong with `table` for a job on `nnodes` x `npus_per_node` (None: that size is not known)."""
    if not isinstance(table, dict):
        return [
            Problem(
                rule="ranktable.json",
                field=None,
                message="the rank table is not a JSON object",
                fix="regenerate it: mm-agent ranktable HOSTS_FILE --out <file> --yes",
            )
        ]
    out: list[Problem] = []
    if table.get("status") != COMPLETED:
        out.append(
            _problem(
                "ranktable.status",
                "status",
                f"status is {table.get('status')!r}: HCCL only uses a table marked 'completed'",
                'set "status": "completed" once every server is listed',
            )
        )
    servers = table.get("server_list")
    if not isinstance(servers, list):
        out.append(
            _problem(
                "ranktable.schema",
                "server_list",
                "no server_list array",
                "regenerate it: mm-agent ranktable HOSTS_FILE --out <file> --yes",
            )
        )
        return out
    count = _int(table.get("server_count"))
    if count != len(servers):
        out.append(
            _problem(
                "ranktable.server_count",
                "server_count",
                f"server_count is {table.get('server_count')!r} but server_list has {len(servers)} servers",
                f'set "server_count": "{len(servers)}" (the number of servers listed)',
            )
        )
    if nnodes is not None and len(servers) != nnodes:
        out.append(
            _problem(
                "ranktable.server_count",
                "server_list",
                f"the table lists {len(servers)} servers; the job runs on {nnodes} nodes",
                f"list the job's {nnodes} nodes (one line each in the hosts file of "
                "mm-agent ranktable), or render the job with --nnodes matching the table",
            )
        )
    seen: dict[str, int] = {}
    ips: dict[str, str] = {}
    ranks: dict[int, str] = {}
    for index, server in enumerate(servers):
        out.extend(_server_problems(index, server, npus_per_node, ips, ranks))
        if isinstance(server, dict):
            sid = str(server.get("server_id"))
            if sid in seen:
                out.append(
                    _problem(
                        "ranktable.server_id",
                        f"server_list[{index}].server_id",
                        f"server_id {sid} is also server_list[{seen[sid]}]'s",
                        "list each server once, with its own host IP as server_id",
                    )
                )
            seen.setdefault(sid, index)
    total = sum(
        len(s["device"]) for s in servers if isinstance(s, dict) and isinstance(s.get("device"), list)
    )
    missing = [r for r in range(total) if r not in ranks]
    beyond = sorted(r for r in ranks if r >= total)
    if missing or beyond:
        out.append(
            _problem(
                "ranktable.rank_id",
                "server_list",
                f"rank ids are not 0..{total - 1} each once: missing {missing[:8]}, "
                f"beyond the range {beyond[:8]}",
                "number the ranks 0 .. world size - 1, host by host in device order",
            )
        )
    return out
