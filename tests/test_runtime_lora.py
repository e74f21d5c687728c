"""LoRA in the bundled runtime end to end: MindSpeed-MM's --lora-* flags under real torchrun (FSDP2 on gloo),
LoRA-only checkpoints in MindSpeed-MM's layout and key names, exact resume after kill -9, sampling with the
adapter, export to diffusers LoRA safetensors loaded by diffusers' own `load_lora_adapter`, and the refusals."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("peft")
psutil = pytest.importorskip("psutil")

from test_runtime_train import (  # noqa: E402
    inference_config,
    kill_after_the_iteration_2_save,
    losses,
    run,
    torchrun,
    train_args,
    write_job,
)

from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.mapping import load_mapping  # noqa: E402
from mm_agent.convert.schema import ConvertRequest  # noqa: E402
from runtime.lora import merge  # noqa: E402
from runtime.synth import build_tiny_wan  # noqa: E402

LORA = ["--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "ffn.2", "ffn.0", "proj_q", "proj_k",
        "proj_v", "proj_out", "--lora-register-forward-hook", "patch_embedding"]  # fmt: skip
KEY = re.compile(r"^blocks\.[01]\.(self_attn\.proj_[qkv]|self_attn\.proj_out|cross_attn\.proj_[qkv]|cross_attn\.proj_out"
                 r"|ffn\.[02])\.lora_[AB]\.default\.weight$")  # fmt: skip


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_wan(tmp_path_factory.mktemp("tiny") / "weights", seed=0)


@pytest.fixture(scope="module")
def base(weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("base") / "mm"
    req = ConvertRequest(converter="WanConverter", method="hf_to_mm", source=str(weights / "transformer"),
                         target=str(target), confirm=True)  # fmt: skip
    assert execute(req).status == "converted"
    return target


@pytest.fixture(scope="module")
def lora_run(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2-rank FSDP2 LoRA run of 6 iterations from the converted base, saving every 2."""
    job = write_job(tmp_path_factory.mktemp("job"))
    save = job / "save_a"
    argv = [
        *torchrun(2),
        *train_args(job, save, "--load", str(base), "--recompute-granularity", "full", *LORA),
    ]
    done = run(argv)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"job": job, "save": save, "stdout": done.stdout}


def payload(save: Path, iteration: int) -> dict[str, Any]:
    return torch.load(save / f"iter_{iteration:07d}/mp_rank_00/model_optim_rng.pt", weights_only=False)


@pytest.mark.slow
def test_lora_checkpoint_is_mindspeed_mm_layout(lora_run: dict[str, Any], base: Path) -> None:
    save, out = lora_run["save"], lora_run["stdout"]
    assert "LoRA r=4 alpha=8 on 20 modules: trainable params: 5,632 || all params: 46,496" in out
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "6"
    obj = payload(save, 6)
    model = obj["model"]
    assert len(model) == 40 and all(KEY.match(k) for k in model), sorted(model)[:5]
    assert model["blocks.1.ffn.0.lora_A.default.weight"].shape == (4, 32)  # [r, in], gathered, not a shard
    assert model["blocks.1.ffn.0.lora_B.default.weight"].shape == (64, 4)  # [out, r]
    assert all(model[k].abs().sum() > 0 for k in model if ".lora_B." in k)  # trained (B starts at zero)
    assert set(obj["optimizer"]["state"]) == set(model)  # only the adapter is optimised
    assert len(obj["rng_state"]) == 2 and (obj["iteration"], obj["consumed_samples"]) == (6, 24)
    manifest = json.loads((save / "lora_adapter.json").read_text())
    assert obj["lora"] == manifest
    assert (manifest["base"], manifest["r"], manifest["alpha"], manifest["scaling"]) == (str(base), 4, 8, 2.0)
    assert (obj["args"].lora_r, obj["args"].lora_alpha) == (4, 8)
    assert sorted(p.name for p in (save / "iter_0000006").iterdir()) == [
        "mp_rank_00"
    ]  # load_from_mm lists it
    assert all(loss == loss for _, loss in losses(save))


@pytest.mark.slow
def test_lora_resume_after_kill_is_exact(lora_run: dict[str, Any], base: Path) -> None:
    """SIGKILL after the iteration-2 save; the same command with --auto-resume gives the same losses."""
    job, reference = lora_run["job"], lora_run["save"]
    save = job / "save_b"
    argv = [
        *torchrun(2),
        *train_args(job, save, "--load", str(base), "--recompute-granularity", "full", *LORA),
    ]
    kill_after_the_iteration_2_save(argv, save)
    resumed = run([*argv, "--auto-resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {save} (--auto-resume)" in resumed.stdout
    assert f" loading release checkpoint from {base}" in resumed.stdout  # the base, then the adapter
    assert f"  successfully loaded checkpoint from {save} [ t 1/1, p 1/1 ] at iteration 2" in resumed.stdout
    assert losses(save) == losses(reference)  # bit for bit
    for key, tensor in payload(reference, 6)["model"].items():
        assert torch.equal(payload(save, 6)["model"][key], tensor), key


def diffusers_forward(model: Any, seed: int = 3) -> Any:
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(1, 16, 3, 8, 8, generator=g)
    text = torch.randn(1, 32, 32, generator=g)
    with torch.no_grad():
        return model(hidden_states=latents, timestep=torch.tensor([500.0]), encoder_hidden_states=text).sample


@pytest.mark.slow
def test_export_loads_in_diffusers_like_the_merge(lora_run: dict[str, Any], base: Path, weights: Path,
                                                  tmp_path: Path) -> None:  # fmt: skip
    from diffusers import WanTransformer3DModel
    from safetensors.torch import load_file

    out = tmp_path / "wan_lora.safetensors"
    done = run(
        [sys.executable, "-m", "runtime.export_lora", "--load", str(lora_run["save"]), "--out", str(out)]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote 40 tensors (rank 4, alpha/r 2 folded into lora_B) to {out}" in done.stdout
    exported = load_file(out)
    assert "transformer.blocks.0.attn1.to_q.lora_A.weight" in exported
    assert "transformer.blocks.1.attn2.to_out.0.lora_B.weight" in exported
    assert "transformer.blocks.1.ffn.net.0.proj.lora_B.weight" in exported
    assert "transformer.blocks.1.ffn.net.2.lora_A.weight" in exported

    adapted = WanTransformer3DModel.from_pretrained(weights / "transformer")
    adapted.load_lora_adapter(str(out), prefix="transformer")
    lora_sd = payload(lora_run["save"], 6)["model"]
    base_sd = torch.load(base / "release/mp_rank_00/model_optim_rng.pt", weights_only=False)["model"]
    mapping = load_mapping("WanConverter")
    merged = {mapping.mm_to_hf(k): v for k, v in merge(base_sd, lora_sd, 2.0).items()}
    reference = WanTransformer3DModel.from_pretrained(weights / "transformer")
    reference.load_state_dict(merged, strict=True)
    plain = WanTransformer3DModel.from_pretrained(weights / "transformer")
    want, got = diffusers_forward(reference), diffusers_forward(adapted)
    assert not torch.allclose(want, diffusers_forward(plain), atol=1e-5)  # the adapter changes the output
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_sample_with_lora_checkpoint(
    lora_run: dict[str, Any], base: Path, weights: Path, tmp_path: Path
) -> None:
    from decord import VideoReader

    (tmp_path / "inference_model.json").write_text(json.dumps(inference_config(weights, guidance=1.0)))
    (tmp_path / "prompts.txt").write_text("a red square moving left\n")
    out = tmp_path / "samples"
    argv = [sys.executable, "-m", "runtime.sample", "--mm-model", str(tmp_path / "inference_model.json"),
            "--load", str(lora_run["save"]), "--prompt-file", str(tmp_path / "prompts.txt"), "--save-path", str(out),
            "--num-inference-steps", "2", "--device", "cpu"]  # fmt: skip
    done = run(argv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f" merging LoRA adapter from {lora_run['save']} into base {base} (scaling 2)" in done.stdout
    assert done.stdout.splitlines()[-1] == f"saved sample to {out / 'sample_0.mp4'}"
    frames = VideoReader(str(out / "sample_0.mp4"))
    assert (len(frames), *frames[0].shape) == (9, 32, 32, 3)


@pytest.mark.slow
def test_lora_user_errors_exit_2(lora_run: dict[str, Any], base: Path, tmp_path: Path) -> None:
    job = write_job(tmp_path / "job", count=2)
    cases = [
        (["--load", str(base), "--lora-r", "4", "--lora-target-modules", "to_q"],
         "error: --lora-target-modules 'to_q' matches no module of the wandit model"),
        (["--load", str(base), "--lora-r", "0"], "error: --lora-r must be >= 1, got 0"),
        (["--lora-r", "4"], "error: LoRA trains an adapter on a base model, but no --load was given"),
        (["--load", str(base), "--lora-r", "4", "--lora-target-modules", "self_attn"],
         "matches Attention modules; LoRA here wraps Linear layers"),
        (["--load", str(lora_run["save"])], "is a LoRA checkpoint (adapter weights only), not a model"),
        (["--load", str(lora_run["save"]), "--lora-r", "4"], "is a LoRA checkpoint, not a base model"),
        (["--load", str(lora_run["save"]), "--load-base-model", str(base), "--lora-r", "8"],
         "the LoRA checkpoint does not fit the adapter these flags build"),
    ]  # fmt: skip
    for extra, expected in cases:
        argv = [
            sys.executable,
            "-m",
            "runtime.train",
            *train_args(job, tmp_path / "s", *extra, iters=1, gbs=1),
        ]
        done = run(argv)
        assert done.returncode == 2 and expected in done.stderr and "fix: " in done.stderr, (
            extra,
            done.stderr,
        )
        assert "Traceback" not in done.stderr
    done = run(
        [
            sys.executable,
            "-m",
            "runtime.export_lora",
            "--load",
            str(base),
            "--out",
            str(tmp_path / "x.safetensors"),
        ]
    )
    assert (
        done.returncode == 2 and "is not a LoRA checkpoint" in done.stderr and "Traceback" not in done.stderr
    )
