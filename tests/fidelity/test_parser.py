"""MindSpeed-MM's real argument parser judges every rendered script (issue 13).

Every registry (model, task, backend, size) is rendered at 26.0.0 and 26.1.0 (where the model has that
version) with `mm_root` pointing at that version's upstream tree, and each `.sh` is run with bash and a
stand-in `torchrun` (and `python`, `accelerate`, ...) first on PATH that records its argv, its environment
and its working directory. Every recorded torchrun (or `python x.py`) argv whose entry script reads MindSpeed-MM's arguments
is then parsed and validated by `mm_agent.validate.mmparser` — the parser that checkout really builds
(Megatron + MindSpeed + every MindSpeed feature + MindSpeed-MM), `validate_args` of MindSpeed-MM, and the
FSDP2-native YAML reader — one child process per version.

A failure not declared below fails the test naming the job, the script and the flag; a declared failure
that no longer fails fails too, so the list cannot go stale.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mm_agent.registry import get_registry
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate.mmparser import ParseJob, ParserReport, judge, locate, split_torchrun

VERSIONS = ("26.0.0", "26.1.0")
LAUNCHERS = ("torchrun", "python", "python3", "accelerate", "deepspeed", "msrun", "npu-smi")
STAND_IN = """#!/bin/bash
out="$(mktemp "$ARGV_DIR/call.XXXXXX")"
printf '%s\\0' "$0" "$@" > "$out"
env -0 > "$out.env"
pwd > "$out.cwd"
echo " iteration 1/1 | elapsed time per iteration (ms): 1.0 | loss: 1.0"
"""
BASE_ENV = (
    "PATH",
    "HOME",
    "LC_ALL",
    "ARGV_DIR",
    "PYTHON",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "ALLOW_RANDOM_INIT",
)
# Jobs whose launch MindSpeed-MM's own code rejects today, with why (job id prefix -> reason). Each must
# still fail; anything else must pass.
KNOWN_REJECTED: dict[str, str] = {
    "funasr-asr-custom-default-26.1.0/": "upstream's own examples/funasr/funasr_config.yaml sets training.save and "
    "training.load to null, which 26.1.0's ConfigManager refuses (pydantic: 'Input should be a valid string'); "
    "the custom job runs the stock script unchanged",
}
# Scripts that stop before their launcher on this machine, and why that is not the parser's business.
KNOWN_NOT_LAUNCHED = {
    "accelerate+deepspeed": "runs a diffusers/DiffSynth training script from a checkout next to MindSpeed-MM "
    "(TRAIN_ROOT), which the upstream trees do not hold; not a MindSpeed-MM argument parser",
    "verl_examples-grpo-custom": "runs upstream's verl recipe with bash (ray and verl's own CLI), which stops "
    "on this machine before any launcher; not a MindSpeed-MM argument parser",
}
MIN_PARSED = 150  # argv lists judged by the real parser over both versions


@dataclass
class Call:
    job: str
    script: str
    argv: list[str]
    env: dict[str, str]
    cwd: str


@dataclass
class Capture:
    calls: list[Call] = field(default_factory=list)
    scripts: int = 0
    jobs: int = 0
    not_launched: dict[str, str] = field(default_factory=dict)


def _cases(version: str) -> list[tuple[str, str, str, str]]:
    reg = get_registry()
    out = []
    for entry in reg.models.values():
        if not entry.versions.contains(version):
            continue
        for task in entry.tasks:
            for size in entry.sizes:
                if task.sizes is None or size.id in task.sizes:
                    out.append((entry.id, task.id, task.backend, size.id))
    return out


def _stand_ins(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    for name in LAUNCHERS:
        path = where / name
        path.write_text(STAND_IN, encoding="utf-8")
        path.chmod(0o755)
    return where


def _capture(tmp: Path, version: str, mm_root: Path) -> Capture:
    bin_dir = _stand_ins(tmp / "bin")
    capture = Capture()
    for model, task, backend, size in _cases(version):
        name = f"{model}-{task}-{backend}-{size}-{version}"
        job_dir = tmp / "ws" / name
        weights = tmp / "weights" / name  # each job its own (a Wan job sizes itself from a non-empty one)
        weights.mkdir(parents=True, exist_ok=True)
        if model.startswith("internvl"):
            (weights / "modeling_internvl_chat.py").write_text("", encoding="utf-8")  # its scripts check it
        render_job(
            RenderRequest(
                model=model,
                task=task,  # type: ignore[arg-type]
                backend=backend,  # type: ignore[arg-type]
                size=size,
                mm_version=version,
                mm_root=str(mm_root),
                weights_dir=str(weights),
                out_dir=str(job_dir),
                confirm=True,
            ),
            root=None,
        )
        capture.jobs += 1
        for script in sorted(job_dir.rglob("*.sh")):
            capture.scripts += 1
            argv_dir = tmp / "argv" / name / script.relative_to(job_dir).as_posix().replace("/", "_")
            argv_dir.mkdir(parents=True)
            env = {
                "PATH": f"{bin_dir}:/usr/bin:/bin",
                "HOME": str(tmp),
                "LC_ALL": "C",
                "ARGV_DIR": str(argv_dir),
                "PYTHON": str(bin_dir / "python"),
                "ALLOW_RANDOM_INIT": "1",  # the scripts refuse to start without weights otherwise
            }
            done = subprocess.run(
                ["bash", str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=120
            )
            recorded = sorted(argv_dir.glob("call.??????"))
            if not recorded:
                capture.not_launched[f"{name}/{script.name}"] = (
                    f"exit {done.returncode}: {done.stderr[-300:]}"
                )
            for path in recorded:
                words = path.read_text(encoding="utf-8").split("\0")[:-1]
                env_text = Path(f"{path}.env").read_text(encoding="utf-8")
                exported = dict(kv.split("=", 1) for kv in env_text.split("\0") if "=" in kv)
                capture.calls.append(
                    Call(
                        job=name,
                        script=script.relative_to(job_dir).as_posix(),
                        argv=words,
                        env={k: v for k, v in exported.items() if k not in BASE_ENV},
                        cwd=Path(f"{path}.cwd").read_text(encoding="utf-8").strip(),
                    )
                )
    return capture


HAND = "hand/"


def _hand_made() -> list[ParseJob]:
    """Launches of pretrain_sora.py with a real 26.0.0 model config, each with one known defect."""
    model = "examples/wan2.1/1.3b/t2v/pretrain_model.json"
    data = "examples/wan2.1/1.3b/t2v/feature_data.json"
    base = ["--mm-model", model, "--mm-data", data, "--seq-length", "24", "--max-position-embeddings", "24"]
    good = [*base, "--micro-batch-size", "1", "--global-batch-size", "8", "--tensor-model-parallel-size", "1"]
    cases = {
        "good": good,
        "no-mbs": [*base, "--global-batch-size", "8"],
        "tp3": [*good, "--tensor-model-parallel-size", "3"],
        "gbs": [*good, "--global-batch-size", "7"],
        "bogus": [*good, "--no-such-flag"],
    }
    jobs = [ParseJob(id=HAND + k, entry="pretrain_sora.py", argv=v, world_size=8) for k, v in cases.items()]
    return [*jobs, ParseJob(id=HAND + "other-cli", entry="no_such_entry.py", argv=good, world_size=8)]


def _parse_jobs(capture: Capture) -> list[ParseJob]:
    jobs = []
    for number, call in enumerate(capture.calls):
        program = os.path.basename(call.argv[0])
        if program == "torchrun":
            world, entry, args = split_torchrun(call.argv[1:])
        elif program in ("python", "python3") and len(call.argv) > 1 and call.argv[1].endswith(".py"):
            world, entry, args = 1, call.argv[1], call.argv[2:]  # one process
        else:
            continue
        jobs.append(
            ParseJob(
                id=f"{call.job}/{call.script}#{number}",
                entry=entry,
                argv=args,
                world_size=world,
                env=call.env,
                cwd=call.cwd,
            )
        )
    return jobs


@pytest.fixture(scope="module")
def verdicts(
    mm_tree: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Capture, ParserReport]]:
    out = {}
    for version in VERSIONS:
        mm_root = mm_tree.version_dir(version)
        assert mm_root is not None, f"no MindSpeed-MM {version} tree under {mm_tree.root}"
        capture = _capture(tmp_path_factory.mktemp(f"parser-{version}"), version, mm_root)
        extra = _hand_made() if version == "26.0.0" else []  # judged in the same child process
        out[version] = (capture, judge(locate(mm_root), _parse_jobs(capture) + extra))
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_launch_is_accepted_by_mindspeed_mm_s_parser(
    verdicts: dict[str, tuple[Capture, ParserReport]], version: str
) -> None:
    capture, report = verdicts[version]
    assert report.parser_options > 600, "the parser MindSpeed-MM builds has ~700 options"
    assert report.validator and "validate_args" in report.validator
    judged = [v for v in report.verdicts if v.judged and not v.id.startswith(HAND)]
    rejected = {v.id: v for v in judged if not v.ok}
    unexpected = {
        k: v for k, v in rejected.items() if not any(k.startswith(prefix) for prefix in KNOWN_REJECTED)
    }
    assert not unexpected, "MindSpeed-MM rejects these rendered launches:\n" + "\n".join(
        f"{k}: [{v.stage}] {v.flag or ''} {v.error}" for k, v in sorted(unexpected.items())
    )
    stale = [
        p for p in KNOWN_REJECTED if p.endswith(f"{version}/") and not any(k.startswith(p) for k in rejected)
    ]
    assert not stale, f"declared as rejected but accepted now (remove them from KNOWN_REJECTED): {stale}"
    silent = {
        k: why
        for k, why in capture.not_launched.items()
        if not any(marker in k for marker in KNOWN_NOT_LAUNCHED)
    }
    assert not silent, f"scripts that never reached their launcher: {silent}"


def test_counts(verdicts: dict[str, tuple[Capture, ParserReport]]) -> None:
    parsed = sum(len([v for v in r.verdicts if v.judged]) for _, r in verdicts.values())
    assert parsed >= MIN_PARSED, parsed
    for version, (capture, report) in verdicts.items():
        kinds = {v.stage for v in report.verdicts}
        assert "done" in kinds, (version, kinds)
        assert capture.jobs >= 60, (version, capture.jobs)


def test_the_parser_rejects_what_megatron_rejects(verdicts: dict[str, tuple[Capture, ParserReport]]) -> None:
    """Hand-made argv judged in the 26.0.0 batch: a good one, a missing micro batch size, a world size
    TP does not divide, a global batch not divisible by MBS x DP, an unknown flag, an entry that does not
    read MindSpeed-MM's arguments."""
    got = {v.id[len(HAND) :]: v for v in verdicts["26.0.0"][1].verdicts if v.id.startswith(HAND)}
    assert got["good"].ok and got["good"].stage == "done", got["good"]
    assert not got["no-mbs"].ok and got["no-mbs"].flag == "--micro-batch-size", got["no-mbs"]
    assert not got["tp3"].ok and "world size" in (got["tp3"].error or ""), got["tp3"]
    assert not got["gbs"].ok and got["gbs"].stage == "microbatches", got["gbs"]
    assert got["gbs"].flag == "--global-batch-size" and "divisible" in (got["gbs"].error or ""), got["gbs"]
    assert not got["bogus"].ok and got["bogus"].flag == "--no-such-flag", got["bogus"]
    assert not got["other-cli"].judged


# --------------------------------------------------------------- validate --mm-root: the same judge, per job


def _wan_job(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    render_job(
        RenderRequest(
            model="wan2.1", task="t2v", size="1.3b", mm_version="26.0.0", out_dir=str(job), confirm=True
        ),
        root=None,
    )
    return job


def test_validate_cli_with_mm_root_accepts_a_good_job_and_rejects_one_without_micro_batch_size(
    mm_tree: Any, tmp_path: Path
) -> None:
    """`mm-agent validate GOOD BAD --mm-root <26.0.0>`: one child process judges both jobs' launches."""
    import json
    import re
    import sys

    mm_root = mm_tree.version_dir("26.0.0")
    good, bad = _wan_job(tmp_path / "good"), _wan_job(tmp_path / "bad")
    script = bad / "pretrain.sh"
    text = script.read_text(encoding="utf-8")
    cut = re.sub(r"(?m)^\s*--micro-batch-size \S+ \\\n", "", text)
    assert cut != text
    script.write_text(cut, encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mm_agent",
            "validate",
            str(good),
            str(bad),
            "--mm-root",
            str(mm_root),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    findings = json.loads(done.stdout)["findings"]
    judged = [f for f in findings if f["rule"].startswith("mmparser.")]
    accepted = {
        Path(f["file"]).relative_to(tmp_path).as_posix() for f in judged if f["rule"] == "mmparser.accepted"
    }
    assert accepted == {
        "good/job/pretrain.sh",
        "good/job/inference.sh",
        "good/job/feature_extract/feature_extraction.sh",
        "bad/job/inference.sh",
        "bad/job/feature_extract/feature_extraction.sh",
    }, judged
    (rejected,) = [f for f in judged if f["rule"] == "mmparser.rejected"]
    assert Path(rejected["file"]) == script.resolve()
    assert rejected["severity"] == "error" and rejected["field"] == "--micro-batch-size", rejected
    assert "micro_batch_size" in rejected["message"] and "--micro-batch-size" in rejected["fix"]


@pytest.mark.parametrize("version", VERSIONS)
def test_qwen25vl_inference_and_evaluation_of_every_size_are_judged(
    verdicts: dict[str, tuple[Capture, ParserReport]], version: str
) -> None:
    """inference.sh (inference_vlm.py) and evaluate.sh (evaluate_vlm.py) of every Qwen2.5-VL size, 3B and 32B
    adapted from the 7B scripts, reach MindSpeed-MM's parser and pass it (the test above fails any rejection)."""
    _, report = verdicts[version]
    judged = {v.id.split("#")[0]: v for v in report.verdicts if v.judged}
    for size in ("3b", "7b", "32b", "72b"):
        for script in ("inference.sh", "evaluate.sh"):
            key = f"qwen2.5vl-sft-megatron-{size}-{version}/{script}"
            assert key in judged and judged[key].ok, (key, judged.get(key))
