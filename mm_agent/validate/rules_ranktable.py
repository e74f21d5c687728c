"""Rank-table rules (`ranktable.*`): a job's hccl.json must describe the nodes and NPUs the job starts.

A table is the job's when a launch script sets `RANK_TABLE_FILE` (read statically like every script value;
one taken from the environment at run time is not judged; relative paths resolve next to the script), or
when the job holds `hccl.json`, `rank_table*.json` / `ranktable*.json`, or any JSON object with a
`server_list`. The layout it is held against is the script's own training launch (`--nnodes`/`NNODES`,
`--nproc_per_node`/`NPUS_PER_NODE`) for a referenced table, else job.yaml's `nnodes`/`npus_per_node`, else the
first training launch whose sizes are known. The checks themselves are `mm_agent.ranktable.check_ranktable`
(status, server_count, devices per server, rank ids, device ids and IPs); a referenced file that is missing is
`ranktable.missing` (a warning: it may exist only on the cluster).
"""

from __future__ import annotations

from pathlib import Path

from mm_agent.ranktable import check_ranktable
from mm_agent.validate.files import ConfigFile
from mm_agent.validate.job import Job, Launch, ScriptFile, to_int

_NAMES = ("hccl.json",)
_PREFIXES = ("rank_table", "ranktable")

Layout = tuple[int | None, int | None]


def _is_table(cfg: ConfigFile) -> bool:
    name = cfg.path.name
    if cfg.path.suffix != ".json":
        return False
    named = name in _NAMES or name.startswith(_PREFIXES)
    return named or (isinstance(cfg.data, dict) and "server_list" in cfg.data)


def launch_layout(launch: Launch) -> Layout:
    flags = launch.cmd.launcher_flags
    nproc = next(
        (to_int(flags[f][0]) for f in ("--nproc_per_node", "--nproc-per-node") if flags.get(f)), None
    )
    nnodes_raw = flags["--nnodes"][0] if flags.get("--nnodes") else None
    nnodes = to_int(nnodes_raw.split(":")[-1]) if nnodes_raw else None
    return (
        nnodes if nnodes is not None else to_int(launch.env("NNODES")),
        nproc if nproc is not None else to_int(launch.env("NPUS_PER_NODE")),
    )


def _job_layout(job: Job) -> Layout:
    for cfg in job.of_kind("job_yaml"):
        nnodes, npus = to_int(cfg.get("nnodes")), to_int(cfg.get("npus_per_node"))
        if nnodes is not None and npus is not None:
            return nnodes, npus
    for launch in job.launches:
        if launch.is_training and None not in (layout := launch_layout(launch)):
            return layout
    return None, None


def _script_layout(job: Job, script: ScriptFile) -> Layout:
    for launch in job.launches:
        if launch.script is script and launch.is_training and None not in (layout := launch_layout(launch)):
            return layout
    return _job_layout(job)


def _check(job: Job, cfg: ConfigFile, layout: Layout) -> None:
    if cfg.data is None:
        job.sink.error(
            "ranktable.json",
            str(cfg.path),
            "the rank table is not valid JSON: HCCL cannot read it",
            "fix the JSON syntax (see json.syntax), or regenerate it: mm-agent ranktable HOSTS_FILE --yes",
        )
        return
    nnodes, npus = layout
    for problem in check_ranktable(cfg.data, nnodes=nnodes, npus_per_node=npus):
        job.sink.error(
            problem.rule,
            str(cfg.path),
            problem.message,
            problem.fix,
            field=problem.field,
            line=cfg.line(problem.field) if problem.field else None,
        )


def _referenced(job: Job) -> dict[Path, Layout]:
    tables: dict[Path, Layout] = {}
    for script in list(job.scripts.values()):
        raw = script.info.env.get("RANK_TABLE_FILE")
        if not raw:
            continue  # unset, or taken from the environment at run time
        line = script.info.var_lines.get("RANK_TABLE_FILE")
        path = job.check_path(
            raw,
            file=str(script.path),
            field="RANK_TABLE_FILE",
            line=line,
            what="rank table",
            rule="ranktable.missing",
            fix="write it with mm-agent ranktable HOSTS_FILE --out <that path> --yes, or point RANK_TABLE_FILE "
            "at the cluster's hccl.json (fine if it only exists on the cluster)",
            base=script.path.parent,
        )
        if path is None:
            continue
        cfg = job.load(path)
        if cfg is not None:
            tables[cfg.path] = _script_layout(job, script)
    return tables


def check(job: Job) -> None:
    tables = _referenced(job)
    for cfg in list(job.configs.values()):
        if cfg.path not in tables and _is_table(cfg):
            tables[cfg.path] = _job_layout(job)
    for path, layout in tables.items():
        _check(job, job.configs[path], layout)
