"""runtime.device / runtime.dist: device choice without hardware, the torch_npu guard, Megatron's layout arithmetic.

Hardware detection is injected (`Probes`), so every branch — NPU, CUDA with and without bf16, CPU, explicit
requests for missing devices, the env override — runs on this CPU box. The guard is exercised against a
real broken `torch_npu` package (its import fails like one without CANN, and it registers torch's backend
auto-load entry point), in a subprocess. The microbatch arithmetic is checked against megatron-core's own
calculator.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runtime.device import Probes, pick_device, requested_device
from runtime.dist import check_layout, num_microbatches
from runtime.errors import RuntimeFailure

ROOT = Path(__file__).resolve().parents[1]


def probes(
    npu: bool = False, cuda: bool = False, bf16: bool = True, why: str = "no NPU here", count: int = 8
) -> Probes:
    return Probes(
        npu=lambda: (npu, None if npu else why),
        cuda=lambda: cuda,
        cuda_bf16=lambda: bf16,
        count=lambda kind: count,
    )


def never() -> Probes:
    def fail() -> bool:
        raise AssertionError("probe called although the device was requested explicitly")

    return Probes(npu=lambda: (fail(), None), cuda=fail, cuda_bf16=fail)


def test_npu_first_with_hccl_and_bf16() -> None:
    d = pick_device(None, 3, bf16=True, probes=probes(npu=True, cuda=True), env={})
    assert (d.kind, d.name, d.backend, d.autocast) == ("npu", "npu:3", "hccl", "bfloat16")


def test_cuda_when_no_npu_bf16_only_if_supported() -> None:
    d = pick_device(None, 1, bf16=True, probes=probes(cuda=True, bf16=True), env={})
    assert (d.kind, d.name, d.backend, d.autocast) == ("cuda", "cuda:1", "nccl", "bfloat16")
    old = pick_device(None, 0, bf16=True, probes=probes(cuda=True, bf16=False), env={})
    assert old.kind == "cuda" and old.autocast is None


def test_more_local_ranks_than_accelerators_is_an_error_with_fix() -> None:
    with pytest.raises(RuntimeFailure) as cuda:
        pick_device(None, 1, probes=probes(cuda=True, count=1), env={})
    assert "local rank 1 has no CUDA: 1 visible" in cuda.value.message
    assert "at most 1 process(es) per node" in (cuda.value.fix or "")
    assert pick_device(None, 0, probes=probes(cuda=True, count=1), env={}).name == "cuda:0"
    assert pick_device(None, 5, probes=probes(count=0), env={}).name == "cpu"  # the CPU has no such limit


def test_cpu_fallback_never_autocasts() -> None:
    d = pick_device(None, 0, bf16=True, probes=probes(), env={})
    assert (d.kind, d.name, d.backend, d.autocast) == ("cpu", "cpu", "gloo", None)
    assert pick_device(None, 0, bf16=False, probes=probes(npu=True), env={}).autocast is None


def test_explicit_cpu_skips_probes_and_wins_over_env() -> None:
    d = pick_device("cpu", 0, bf16=True, probes=never(), env={"MM_AGENT_DEVICE": "npu"})
    assert d.kind == "cpu"


def test_env_override_and_auto() -> None:
    env = {"MM_AGENT_DEVICE": "cpu"}
    assert pick_device(None, 0, probes=probes(npu=True, cuda=True), env=env).kind == "cpu"
    assert pick_device("auto", 0, probes=probes(npu=True, cuda=True), env=env).kind == "cpu"
    assert pick_device("auto", 0, probes=probes(cuda=True), env={}).kind == "cuda"
    assert requested_device(None, {"MM_AGENT_DEVICE": " CUDA "}) == "cuda"


def test_unavailable_explicit_devices_are_errors_with_fix() -> None:
    with pytest.raises(RuntimeFailure) as npu:
        pick_device("npu", 0, probes=probes(cuda=True, why="torch_npu is not installed"), env={})
    assert "torch_npu is not installed" in npu.value.message and "set_env.sh" in (npu.value.fix or "")
    with pytest.raises(RuntimeFailure) as cuda:
        pick_device(None, 0, probes=probes(npu=True), env={"MM_AGENT_DEVICE": "cuda"})
    assert "CUDA was requested" in cuda.value.message and "--device cpu" in (cuda.value.fix or "")


def test_unknown_device_names_its_source() -> None:
    with pytest.raises(RuntimeFailure) as env:
        pick_device(None, 0, probes=probes(), env={"MM_AGENT_DEVICE": "tpu"})
    assert env.value.field == "MM_AGENT_DEVICE"
    with pytest.raises(RuntimeFailure) as cli:
        pick_device("gpu", 0, probes=probes(), env={})
    assert cli.value.field == "--device"


BROKEN_NPU = {
    "torch_npu/__init__.py": 'raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n',
    "torch_npu-2.13.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n",
    "torch_npu-2.13.0.dist-info/entry_points.txt": "[torch.backends]\ntorch_npu = torch_npu:_autoload\n",
}


@pytest.fixture(scope="module")
def broken_npu_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("broken_npu")
    for rel, text in BROKEN_NPU.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return str(root)


def run_python(code: str, pythonpath: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pythonpath, str(ROOT)])}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


def test_broken_torch_npu_breaks_plain_import_torch(broken_npu_path: str) -> None:
    """The environment the guard exists for: without it, `import torch` itself dies."""
    plain = run_python("import torch", broken_npu_path)
    assert plain.returncode != 0 and "torch_npu" in plain.stderr


def test_guard_keeps_torch_working_and_explains_npu(broken_npu_path: str) -> None:
    guarded = run_python(
        """
        from runtime.device import guard_torch_npu, pick_device
        from runtime.errors import RuntimeFailure
        reason = guard_torch_npu()
        import torch, importlib.util
        assert importlib.util.find_spec("torch_npu") is None
        print("reason:", reason)
        print("auto:", pick_device(None, 0, env={}).kind)
        try:
            pick_device("npu", 0, env={})
        except RuntimeFailure as exc:
            print("npu:", exc.message)
            print("fix:", exc.fix)
        """,
        broken_npu_path,
    )
    assert guarded.returncode == 0, guarded.stderr
    assert "reason: ImportError: libhccl.so" in guarded.stdout
    assert "auto: cpu" in guarded.stdout
    assert (
        "npu: the NPU was requested but is not usable: torch_npu is installed but cannot be imported"
        in guarded.stdout
    )
    assert "set_env.sh" in guarded.stdout


def test_layout_rules_and_refusal() -> None:
    ok = check_layout(4, 1, 1, 1, 2, 16)
    assert (ok.dp, ok.grad_acc, ok.global_batch_size) == (4, 2, 16)
    with pytest.raises(RuntimeFailure, match=r"world_size \(6\) is not divisible"):
        check_layout(6, 4, 1, 1, 1, 6)
    with pytest.raises(
        RuntimeFailure,
        match=r"global batch size \(6\) is not divisible by micro batch size \(1\) times data parallel size \(4\)",
    ):
        check_layout(4, 1, 1, 1, 1, 6)
    with pytest.raises(RuntimeFailure) as refused:
        check_layout(8, 2, 2, 1, 1, 2)
    assert "trains data-parallel" in refused.value.message and "PP-split checkpoints are merged" in (
        refused.value.fix or ""
    )


def test_microbatches_match_megatron_core() -> None:
    calc = pytest.importorskip("megatron.core.num_microbatches_calculator")
    for gbs in (1, 2, 4, 6, 8, 12, 16, 24):
        for mbs in (1, 2, 3, 4):
            for dp in (1, 2, 3, 4, 8):
                try:
                    theirs = calc.ConstantNumMicroBatchesCalculator(gbs, mbs, dp, False, 0).get()
                except AssertionError:
                    theirs = None
                try:
                    ours = num_microbatches(gbs, mbs, dp)
                except RuntimeFailure:
                    ours = None
                assert ours == theirs, (gbs, mbs, dp)
