"""MindSpeed-MM's own merge accepts the bundled runtime's LoRA checkpoints.

A LoRA run of `python -m runtime.train` (MindSpeed-MM's --lora-* flags) on a converted tiny Wan base saves a
LoRA-only checkpoint; MindSpeed-MM's `WanConverter.merge_lora_to_base` (run from the v26.0.0 tree in a child
process, `upstream_lora_merge.py`) merges it into the base, and the merged weights are base + alpha / r * B @ A
on every wrapped Linear and the base itself everywhere else. Skipped without MM_UPSTREAM.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fidelity.conftest import MMTrees

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("peft")

from test_runtime_train import run, train_args, write_job  # noqa: E402

from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.schema import ConvertRequest  # noqa: E402
from runtime.lora import merge  # noqa: E402
from runtime.synth import build_tiny_wan  # noqa: E402

HERE = Path(__file__).resolve().parent
R, ALPHA = 4, 8


def _train_lora(tmp: Path) -> tuple[Path, Path]:
    weights = build_tiny_wan(tmp / "weights", seed=0)
    base = tmp / "base"
    req = ConvertRequest(converter="WanConverter", method="hf_to_mm", source=str(weights / "transformer"),
                         target=str(base), confirm=True)  # fmt: skip
    assert execute(req).status == "converted"
    job = write_job(tmp / "job", count=4)
    save = tmp / "lora"
    lora = ["--load", str(base), "--lora-r", str(R), "--lora-alpha", str(ALPHA), "--lora-target-modules",
            "ffn.2", "ffn.0", "proj_q", "proj_k", "proj_v", "proj_out"]  # fmt: skip
    done = run([sys.executable, "-m", "runtime.train", *train_args(job, save, *lora, iters=3, gbs=2)])
    assert done.returncode == 0, done.stderr[-3000:]
    return base, save


def _model(root: Path, iteration: str) -> dict[str, torch.Tensor]:
    return torch.load(root / iteration / "mp_rank_00/model_optim_rng.pt", weights_only=False)["model"]


@pytest.mark.slow
def test_mindspeed_mm_merge_accepts_runtime_lora(mm_tree: MMTrees, tmp_path: Path) -> None:
    tree = mm_tree.version_dir("26.0.0")
    if tree is None:
        pytest.skip("MindSpeed-MM v26.0.0 is not in MM_UPSTREAM")
    base, save = _train_lora(tmp_path)
    target = tmp_path / "merged"
    done = subprocess.run(
        [sys.executable, str(HERE / "upstream_lora_merge.py"), str(tree), str(base), str(save), str(target),
         str(R), str(ALPHA)],
        capture_output=True, text=True, timeout=300, cwd=HERE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["ok"], line["error"]
    assert line["checkpoint"].startswith(str(tree))  # upstream's converter really ran
    assert (target / "latest_checkpointed_iteration.txt").read_text() == "release"

    merged, original = _model(target, "release"), _model(base, "release")
    adapter = _model(save, "iter_0000003")
    assert set(merged) == set(original)
    layers = {k.split(".lora_")[0] for k in adapter}
    assert len(layers) == 20  # 2 blocks x (4 self-attn + 4 cross-attn + 2 FFN) Linears
    for name, weight in original.items():
        layer = name.removesuffix(".weight")
        if layer in layers and name.endswith(".weight"):
            b, a = adapter[f"{layer}.lora_B.default.weight"], adapter[f"{layer}.lora_A.default.weight"]
            assert b.abs().sum() > 0, layer  # trained: the merge really moves the weight
            want = weight + (ALPHA / R) * (b @ a)
            torch.testing.assert_close(merged[name], want, rtol=1e-6, atol=1e-7)
            assert not torch.equal(merged[name], weight), name
        else:
            assert torch.equal(merged[name], weight), name

    ours = merge(original, adapter, ALPHA / R)  # the runtime's in-memory merge (runtime.sample) agrees
    for name, weight in merged.items():
        torch.testing.assert_close(ours[name], weight, rtol=1e-6, atol=1e-7)
