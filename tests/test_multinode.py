"""Multi-node jobs as rendered are runnable (issue 14, item 5).

- Every launch script of a 2-node job, one per template set, run with real bash and stand-ins for the launchers
  (which record their argv and the node layout they were handed): with `NODE_RANK=1 MASTER_ADDR=10.0.0.2
  MASTER_PORT=6123` in the environment the launcher gets node rank 1 and that master; without them, the
  rendered defaults (rank 0, the rendered master address and port, 2 nodes).
- `next_steps` gives one command per node for each launch script, and a loopback master address puts the
  re-render with --master-addr first.
- `multinode.master_addr`: an error on a multi-node job whose master address is loopback or unset (from
  job.yaml, or from the scripts alone), none with a real address or on one node.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from mm_agent.render import RenderRequest, RenderResult, render_job
from mm_agent.validate import ValidateRequest, validate_configs
from mm_agent.validate.rules_multinode import RULE, unreachable
from mm_agent.validate.shell import parse_script

BASH = shutil.which("bash") or "/bin/bash"
LAUNCHERS = ("torchrun", "python", "python3", "accelerate", "deepspeed")
# Records argv (NUL-separated) and the layout variables it inherited (the stock script a custom job runs
# reads them from the environment).
STAND_IN = """#!/bin/bash
printf '%s\\0' "$0" "$@" "ENV:${NNODES-}:${NODE_RANK-}:${MASTER_ADDR-}:${MASTER_PORT-}" \\
    > "$(mktemp "$ARGV_DIR/call.XXXXXX")"
echo " iteration 1/1 | elapsed time per iteration (ms): 1.0 | loss: 1.0"
"""
MASTER = "10.0.0.1"
PORT = 6011
# (model, task, backend, runtime): one job per template set.
CASES = [
    ("wan2.1", "t2v", "megatron", "mindspeed-mm"),  # megatron_generative (+ feature extraction)
    ("qwen2.5vl", "sft", "megatron", "mindspeed-mm"),  # megatron_vlm
    ("hunyuanvideo_1.5", "t2v", "megatron+fsdp2", "mindspeed-mm"),  # megatron_fsdp2_generative
    ("ltx2", "t2v", "fsdp2-native", "mindspeed-mm"),  # fsdp2_native
    ("qwen3vl", "sft", "megatron+fsdp2", "mindspeed-mm"),  # transformers_fsdp2
    ("flux", "lora", "accelerate+deepspeed", "mindspeed-mm"),  # accelerate_deepspeed
    ("deepseekocr", "sft", "custom", "mindspeed-mm"),  # custom
    ("wan2.1", "t2v", "megatron", "bundled"),  # bundled_generative
]
# What each launcher calls the layout: nodes, rank, master address, master port.
LAYOUT_FLAGS = {
    "torchrun": ("--nnodes", "--node_rank", "--master_addr", "--master_port"),
    "accelerate": ("--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port"),
}


def _render(tmp: Path, model: str, task: str, backend: str, runtime: str, **extra: object) -> RenderResult:
    tmp.mkdir(parents=True, exist_ok=True)
    return render_job(
        RenderRequest(
            model=model,
            task=task,  # type: ignore[arg-type]
            backend=backend,  # type: ignore[arg-type]
            runtime=runtime,  # type: ignore[arg-type]
            out_dir=str(tmp / "job"),
            mm_root="mm",
            load_path="ckpt",
            dataset_dir="data",
            weights_dir="weights",
            confirm=True,
            **extra,  # type: ignore[arg-type]
        ),
        root=tmp,
    )


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STAND_IN, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _layout(words: list[str]) -> tuple[str | None, ...] | None:
    """(nnodes, node_rank, master_addr, master_port) from one recorded call's argv, or its environment
    when it is the stock script of a custom job; None when the call is not a launch."""
    name = Path(words[0]).name
    args = words[1:-1]
    if name == "python" and args[:2] == ["-m", "torch.distributed.run"]:
        name = "torchrun"
    if name in LAYOUT_FLAGS:
        flags = LAYOUT_FLAGS[name]
        return tuple(args[args.index(f) + 1] if f in args else None for f in flags)
    if name.endswith(".sh"):  # a custom job's stock launcher: the wrapper exports the layout to it
        return tuple(words[-1].removeprefix("ENV:").split(":"))
    return None


def _run(script: Path, home: Path, bin_dir: Path, argv_dir: Path, extra: dict[str, str]) -> list[tuple]:
    argv_dir.mkdir(parents=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "LC_ALL": "C", "ARGV_DIR": str(argv_dir)}
    env |= {"PYTHON": str(bin_dir / "python"), **extra}
    info = parse_script(str(script), script.read_text(encoding="utf-8"))
    for delegate, _ in info.delegates:  # a custom job runs the stock launcher from MM_ROOT
        assert delegate is not None and info.env.get("MM_ROOT"), script
        _executable(Path(str(info.env["MM_ROOT"])) / delegate)
    if info.env.get("TRAIN_SCRIPT"):
        _executable(Path(str(info.env["TRAIN_SCRIPT"])))
    done = subprocess.run([BASH, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{script} exited {done.returncode}: {done.stderr[-1500:]}"
    calls = [p.read_text(encoding="utf-8").split("\0")[:-1] for p in sorted(argv_dir.iterdir())]
    return [layout for call in calls if (layout := _layout(call)) is not None]


@pytest.mark.parametrize(("model", "task", "backend", "runtime"), CASES, ids=["-".join(c) for c in CASES])
def test_launch_scripts_take_the_layout_from_the_environment(
    model: str, task: str, backend: str, runtime: str, tmp_path: Path
) -> None:
    extra: dict[str, object] = {"nnodes": 2, "master_addr": MASTER, "master_port": PORT}
    if runtime == "bundled":
        extra["npus_per_node"] = 2
    result = _render(tmp_path, model, task, backend, runtime, **extra)
    job = Path(result.job_dir)
    for sub in ("data", "weights", "mm", "ckpt"):
        (tmp_path / sub).mkdir(exist_ok=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("release\n", encoding="utf-8")
    (tmp_path / "weights" / "modeling_internvl_chat.py").write_text("", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    for name in LAUNCHERS:
        _executable(bin_dir / name)
    # the launch scripts are the ones next_steps runs on every node
    per_node = [s for s in result.next_steps if s.startswith("NODE_RANK=")]
    scripts = sorted({Path(s.split(" bash ", 1)[1].split("  #", 1)[0]) for s in per_node})
    assert scripts, result.next_steps
    for n, script in enumerate(scripts):
        default = _run(script, tmp_path, bin_dir, tmp_path / f"argv-{n}-default", {})
        node1 = _run(
            script,
            tmp_path,
            bin_dir,
            tmp_path / f"argv-{n}-node1",
            {"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "6123"},
        )
        where = script.relative_to(job)
        assert default and node1, f"{where} reached no launcher"
        assert set(default) == {("2", "0", MASTER, str(PORT))}, f"{where}: {default}"
        assert set(node1) == {("2", "1", "10.0.0.2", "6123")}, f"{where}: {node1}"


def test_next_steps_name_every_node_and_the_master_address_first(tmp_path: Path) -> None:
    loop = _render(tmp_path / "a", "wan2.1", "t2v", "megatron", "mindspeed-mm", nnodes=2)
    assert loop.next_steps[1].startswith("mm-agent render --from "), loop.next_steps
    assert "--master-addr <node-0-ip>" in loop.next_steps[1]
    assert "loopback" in loop.next_steps[0]
    per_node = [s for s in loop.next_steps if s.startswith("NODE_RANK=")]
    job = loop.job_dir
    assert per_node == [
        f"NODE_RANK={rank} MASTER_ADDR=<node-0-ip> bash {job}/{script}  # {where}"
        for script in ("feature_extract/feature_extraction.sh", "pretrain.sh")
        for rank, where in ((0, "on node 0 (the master)"), (1, "on node 1"))
    ]
    assert any("same path" in s and "shared storage" in s for s in loop.next_steps)

    real = _render(
        tmp_path / "b", "qwen2.5vl", "sft", "megatron", "mindspeed-mm", nnodes=4, master_addr=MASTER
    )
    assert not any("--master-addr" in s for s in real.next_steps)
    ranks = [re.match(r"NODE_RANK=(\d+) MASTER_ADDR=10\.0\.0\.1 bash ", s) for s in real.next_steps]
    assert [int(m[1]) for m in ranks if m] == [0, 1, 2, 3]

    many = _render(
        tmp_path / "c", "qwen2.5vl", "sft", "megatron", "mindspeed-mm", nnodes=32, master_addr=MASTER
    )
    assert len(many.next_steps) < 12, many.next_steps  # bounded: node 0, node 1 and one line for the rest
    assert any(s.startswith("NODE_RANK=<rank> ") and "2 .. 31" in s for s in many.next_steps)

    bundled = _render(tmp_path / "d", "wan2.1", "t2v", "megatron", "bundled", nnodes=2, npus_per_node=2)
    assert not any(s.startswith(("mm-agent train", "mm-agent extract")) for s in bundled.next_steps)
    assert sum(s.startswith("NODE_RANK=") for s in bundled.next_steps) == 4  # extraction and training

    one = _render(tmp_path / "e", "wan2.1", "t2v", "megatron", "mindspeed-mm", nnodes=1)
    assert not any("NODE_RANK" in s or "--master-addr" in s for s in one.next_steps)
    assert one.next_steps[-1] == f"bash {one.job_dir}/pretrain.sh"


def _rule_findings(paths: list[Path]) -> list[tuple[str, str | None]]:
    report = validate_configs(ValidateRequest(paths=[str(p) for p in paths]))
    found = [f for f in report.findings if f.rule == RULE]
    assert all(f.severity == "error" and "--master-addr" in f.fix for f in found), found
    return [(Path(f.file).name, f.field) for f in found]


def test_validator_errors_on_a_loopback_master_of_a_multi_node_job(tmp_path: Path) -> None:
    loop = Path(_render(tmp_path / "a", "wan2.1", "t2v", "megatron", "mindspeed-mm", nnodes=2).job_dir)
    assert _rule_findings([loop]) == [("job.yaml", "master_addr")]  # the source, once
    # the scripts alone (no job.yaml): each multi-node launch is reported where it sets MASTER_ADDR
    scripts = [loop / "pretrain.sh", loop / "feature_extract" / "feature_extraction.sh"]
    assert sorted(_rule_findings(scripts)) == [
        ("feature_extraction.sh", "MASTER_ADDR"),
        ("pretrain.sh", "MASTER_ADDR"),
    ]
    real = _render(tmp_path / "b", "wan2.1", "t2v", "megatron", "mindspeed-mm", nnodes=2, master_addr=MASTER)
    assert _rule_findings([Path(real.job_dir)]) == []
    acc = _render(tmp_path / "c", "flux", "lora", "accelerate+deepspeed", "mindspeed-mm", nnodes=2)
    assert _rule_findings([Path(acc.job_dir) / "finetune.sh"]) == [("finetune.sh", "MASTER_ADDR")]
    one = _render(tmp_path / "d", "wan2.1", "t2v", "megatron", "mindspeed-mm", nnodes=1)
    assert _rule_findings([Path(one.job_dir)]) == []
    # a hand-edited script: the master address removed, or emptied
    text = (Path(real.job_dir) / "pretrain.sh").read_text(encoding="utf-8")
    for n, edit in enumerate(("MASTER_ADDR_DEFAULT=''", "# no master")):
        edited = tmp_path / f"edited-{n}" / "pretrain.sh"
        edited.parent.mkdir()
        body = re.sub(r"^MASTER_ADDR_DEFAULT=.*$", edit, text, flags=re.M)
        if n == 1:
            body = re.sub(r'^MASTER_ADDR="\$\{MASTER_ADDR:-\$MASTER_ADDR_DEFAULT\}"$', "", body, flags=re.M)
        edited.write_text(body, encoding="utf-8")
        assert _rule_findings([edited]) == [("pretrain.sh", "MASTER_ADDR")]


@pytest.mark.parametrize(
    ("addr", "reachable"),
    [
        ("localhost", False),
        ("LOCALHOST", False),
        ("127.0.0.1", False),
        ("127.1.2.3", False),
        ("::1", False),
        ("[::1]", False),
        ("0.0.0.0", False),
        ("", False),
        (None, False),
        ("10.0.0.2", True),
        ("192.168.1.10", True),
        ("fe80::1", True),
        ("node0.cluster", True),
        ("localhost-node", True),
    ],
)
def test_unreachable_addresses(addr: str | None, reachable: bool) -> None:
    assert (unreachable(addr) is None) is reachable
