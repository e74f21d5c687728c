"""Multi-node rules: a job on several nodes needs a master address that every node can reach.

`multinode.master_addr` (error): the job runs on more than one node (`nnodes` > 1 in job.yaml, or statically
`NNODES`/`--nnodes`/`--num_machines` > 1 in a launch script) and its master address is a loopback address
(localhost, 127.x, ::1), the unspecified address (0.0.0.0, ::) or unset/empty. Every other node would
connect to itself and wait at the rendezvous until it times out. Values the script takes from the
environment or a command at run time (a hostfile) are not judged; a script that uses MASTER_ADDR without
ever setting it is "unset". A job rendered with a cluster launcher (job.yaml `launcher`) is not judged
here: the launcher sets MASTER_ADDR on every node (the first host, or the cluster's own variable). A wrapper
that runs another launch script (mm-agent's `custom` jobs run the stock launcher) is judged on the layout it
sets for that script.
"""

from __future__ import annotations

import ipaddress
import shlex
from pathlib import Path

from mm_agent.validate.job import Job, Launch, ScriptFile, to_int

RULE = "multinode.master_addr"
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
_NNODES_FLAGS = ("--nnodes", "--num_machines")
_ADDR_FLAGS = ("--master_addr", "--main_process_ip")
_LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "msrun")


def unreachable(addr: str | None) -> str | None:
    """Why `addr` cannot be a multi-node master address (None: it can, as far as a static reading tells)."""
    if addr is None or not addr.strip():
        return "unset or empty"
    text = addr.strip().strip("[]").lower()
    if text in _LOOPBACK_NAMES or text.endswith(".localhost"):
        return f"{addr!r} is a loopback name"
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if ip.is_loopback:
        return f"{addr!r} is a loopback address"
    if ip.is_unspecified:
        return f"{addr!r} is the unspecified address"
    return None


def fix_text(job_dir: str | None = None) -> str:
    """The re-render that sets a reachable master address (the job dir shell-quoted: it is pasted)."""
    where = shlex.quote(job_dir) if job_dir is not None else "<job dir>"
    yaml_file = shlex.quote(job_dir + "/job.yaml") if job_dir is not None else "<job dir>/job.yaml"
    return (
        "set master_addr to the IP address of node 0 that every node can reach: "
        f"`mm-agent render --from {yaml_file} --out {where} --master-addr <node-0-ip> --force` "
        "(or render_job with master_addr)"
    )


def check(job: Job) -> None:
    if _job_yaml(job):
        return  # the source of the scripts' value is reported; the scripts repeat it
    for launch in job.launches:
        _launch(job, launch)
    launching = {launch.script.path for launch in job.launches}
    for script in job.scripts.values():
        handed = [Path(p) for p, _ in script.info.delegates if p is not None]
        if script.path not in launching and handed and not any(p in launching for p in handed):
            _wrapper(job, script)  # (a delegate read here is judged at its own launch)


def _wrapper(job: Job, script: ScriptFile) -> None:
    """A wrapper that hands its layout to another script (a stock launcher that is not here to read): its own
    NNODES and MASTER_ADDR are what that launcher's rendezvous gets."""
    env = script.info.env
    nnodes = to_int(env.get("NNODES"))
    if nnodes is None or nnodes <= 1 or "MASTER_ADDR" not in env or env["MASTER_ADDR"] is None:
        return  # one node, or an address only known at run time
    why = unreachable(env["MASTER_ADDR"])
    if why is None:
        return
    job.sink.error(
        RULE,
        str(script.path),
        f"this script hands {nnodes} nodes to the launcher it runs, but its master address {why}: the other "
        "nodes cannot reach the master",
        fix_text(str(script.path.parent)),
        field="MASTER_ADDR",
        line=script.info.var_lines.get("MASTER_ADDR"),
    )


def _job_yaml(job: Job) -> bool:
    flagged = False
    for cfg in job.configs.values():
        if cfg.kind != "job_yaml" or not isinstance(cfg.data, dict):
            continue
        nnodes = to_int(cfg.data.get("nnodes"))
        if nnodes is None or nnodes <= 1:
            continue
        if cfg.data.get("launcher"):
            flagged = True  # its launcher gives every node the master's address (rules_launcher checks it)
            continue
        raw = cfg.data.get("master_addr", "localhost")  # the JobSpec default
        why = unreachable(raw if isinstance(raw, str) else None)
        if why is None:
            continue
        flagged = True
        job.sink.error(
            RULE,
            str(cfg.path),
            f"the job runs on {nnodes} nodes but master_addr {why}: the other nodes cannot reach the master",
            fix_text(str(cfg.path.parent)),
            field="master_addr",
            line=cfg.line("master_addr"),
        )
    return flagged


def _launch(job: Job, launch: Launch) -> None:
    if launch.cmd.launcher not in _LAUNCHERS:
        return  # a plain `python` step (a plot, a merge) joins no rendezvous
    info = launch.script.info
    flags = launch.cmd.launcher_flags
    nnodes: int | None = None
    for flag in _NNODES_FLAGS:
        if flag in flags:
            nnodes = to_int(flags[flag][0] if flags[flag] else None)
            break
    else:
        nnodes = to_int(info.env.get("NNODES"))
    if nnodes is None or nnodes <= 1:
        return
    field, addr, known = "MASTER_ADDR", info.env.get("MASTER_ADDR"), "MASTER_ADDR" in info.env
    for flag in _ADDR_FLAGS:
        if flag in flags:
            field, addr, known = flag, (flags[flag][0] if flags[flag] else ""), True
            break
    if known and addr is None:
        return  # read from the environment or a command at run time: not known statically
    why = unreachable(addr)
    if why is None:
        return
    if "MASTER_ADDR" in info.var_lines:
        field = "MASTER_ADDR"  # the flag's value comes from the script's variable: report where it is set
    file, _, line = launch.where(flag=field if field.startswith("--") else None, var="MASTER_ADDR")
    job.sink.error(
        RULE,
        file,
        f"this launch runs on {nnodes} nodes but its master address {why}: the other nodes cannot reach "
        "the master",
        fix_text(str(launch.script.path.parent)),
        field=field,
        line=line,
    )
