"""runtime.wandit / flow / checkpoint: numerically diffusers' Wan, loads every converted split, exports back.

A tiny Wan2.1 pipeline (4 blocks) is built once by `runtime.synth` and converted by mm-agent's own
WanConverter (PP=1, PP=2, PP=4, VPP), so names and layouts are the real MindSpeed-MM ones; diffusers'
`WanTransformer3DModel` is the reference for the forward pass.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.schema import ConvertRequest  # noqa: E402
from runtime.checkpoint import TRACKER, load_checkpoint, save_checkpoint  # noqa: E402
from runtime.errors import RuntimeFailure  # noqa: E402
from runtime.flow import FlowConfig, FlowMatching, euler_sample, sigma_schedule  # noqa: E402
from runtime.synth import TinyWanConfig, build_tiny_wan  # noqa: E402
from runtime.wandit import WanDiT, WanDiTConfig, load_weights  # noqa: E402

LAYERS = 4


def predictor_from(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The predictor block a job renders from transformer/config.json (contract C6)."""
    return {
        "model_id": "wandit",
        "model_type": "t2v",
        "hidden_size": hf_config["num_attention_heads"] * hf_config["attention_head_dim"],
        "num_heads": hf_config["num_attention_heads"],
        "ffn_dim": hf_config["ffn_dim"],
        "freq_dim": hf_config["freq_dim"],
        "text_dim": hf_config["text_dim"],
        "in_dim": hf_config["in_channels"],
        "out_dim": hf_config["out_channels"],
        "num_layers": hf_config["num_layers"],
        "patch_size": list(hf_config["patch_size"]),
        "qk_norm": True,
        "cross_attn_norm": hf_config["cross_attn_norm"],
        "eps": hf_config["eps"],
        "max_seq_len": 1024,
    }


def convert(source: Path, target: Path, method: str = "hf_to_mm", **extra: Any) -> None:
    req = ConvertRequest(
        converter="WanConverter", method=method, source=str(source), target=str(target), confirm=True, **extra
    )
    assert execute(req).status == "converted"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("wan")
    weights = build_tiny_wan(root / "weights", TinyWanConfig(num_layers=LAYERS), seed=0)
    hf = weights / "transformer"
    convert(hf, root / "mm_pp1")
    hf_config = json.loads((hf / "config.json").read_text())
    return {"root": root, "hf": hf, "pp1": root / "mm_pp1", "predictor": predictor_from(hf_config)}


def build(tiny: dict[str, Any], checkpoint_dir: Path) -> WanDiT:
    model = WanDiT(WanDiTConfig.from_predictor(tiny["predictor"], "pretrain_model.json"))
    load_weights(model, load_checkpoint(str(checkpoint_dir)).model, str(checkpoint_dir))
    return model.eval()


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(2, 16, 3, 8, 12, generator=g)
    text = torch.randn(2, 32, 32, generator=g)
    return latents, torch.tensor([999.0, 17.25]), text


def reference(
    hf_dir: Path, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor
) -> torch.Tensor:
    ref = diffusers.WanTransformer3DModel.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        return ref(hidden_states=latents, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]


def test_forward_matches_diffusers(tiny: dict[str, Any]) -> None:
    latents, timestep, text = inputs()
    model = build(tiny, tiny["pp1"])
    with torch.no_grad():
        ours = model(latents, timestep, text)
    theirs = reference(tiny["hf"], latents, timestep, text)
    assert ours.shape == theirs.shape == latents.shape
    assert (ours - theirs).abs().max().item() <= 1e-5
    assert theirs.abs().max().item() > 0.1  # a real signal, not two zero heads agreeing


def test_recompute_gives_the_same_output_and_gradients(tiny: dict[str, Any]) -> None:
    latents, timestep, text = inputs(1)
    grads = []
    for recompute in (False, True):
        model = build(tiny, tiny["pp1"]).train()
        model.recompute = recompute
        out = model(latents, timestep, text)
        out.square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-6, rtol=1e-5), name


@pytest.mark.parametrize("pp_layers", [[2, 2], [1, 1, 1, 1], [[1, 1], [1, 1]]], ids=["pp2", "pp4", "vpp2x2"])
def test_split_checkpoints_load_merged(tiny: dict[str, Any], pp_layers: list[Any]) -> None:
    target = tiny["root"] / f"mm_{json.dumps(pp_layers).replace(' ', '')}"
    convert(tiny["hf"], target, pp_layers=pp_layers)
    loaded = load_checkpoint(str(target))
    flat = load_checkpoint(str(tiny["pp1"])).model
    assert loaded.release and loaded.iteration == 0
    assert sorted(loaded.model) == sorted(flat)
    assert all(torch.equal(loaded.model[k], flat[k]) for k in flat)
    latents, timestep, text = inputs(2)
    with torch.no_grad():
        assert torch.equal(
            build(tiny, target)(latents, timestep, text), build(tiny, tiny["pp1"])(latents, timestep, text)
        )


def test_trained_state_dict_exports_to_diffusers(tiny: dict[str, Any], tmp_path: Path) -> None:
    """A training save (after a real AdamW step) converts back with mm_to_hf and runs in diffusers."""
    model = build(tiny, tiny["pp1"]).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    latents, timestep, text = inputs(3)
    model(latents, timestep, text).square().mean().backward()
    optimizer.step()
    save = tmp_path / "save"
    state = {
        "random_rng_state": (3, (*range(625), 0), None),
        "torch_rng_state": torch.get_rng_state(),
    }
    save_checkpoint(
        save, 1, model.state_dict(), optimizer.state_dict(), [state], 2, argparse.Namespace(lr=1e-2)
    )
    assert (save / TRACKER).read_text() == "1"
    assert not [p for p in save.iterdir() if p.name.startswith(".")]
    convert(save, tmp_path / "hf", method="mm_to_hf", hf_dir=str(tiny["hf"]))
    model.eval()
    with torch.no_grad():
        ours = model(latents, timestep, text)
    theirs = reference(tmp_path / "hf", latents, timestep, text)
    assert (ours - theirs).abs().max().item() <= 1e-5
    resumed = load_checkpoint(str(save))
    assert (resumed.iteration, resumed.consumed_samples, resumed.release) == (1, 2, False)
    assert resumed.optimizer is not None and resumed.rng_state is not None


def failure(load: Path) -> RuntimeFailure:
    with pytest.raises(RuntimeFailure) as caught:
        load_checkpoint(str(load))
    assert caught.value.field == "--load" and caught.value.fix
    return caught.value


def test_bad_load_dirs_are_refused_loudly(tiny: dict[str, Any], tmp_path: Path) -> None:
    assert "does not exist" in failure(tmp_path / "nowhere").message
    assert "holds diffusers safetensors: convert them first" in failure(tiny["hf"]).message
    bad = tmp_path / "bad"
    shutil.copytree(tiny["pp1"], bad)
    (bad / TRACKER).write_text("latest")
    assert "neither 'release' nor an iteration number" in failure(bad).message
    (bad / TRACKER).write_text("7")
    assert "iter_0000007" in failure(bad).message
    staged = tmp_path / "staged"
    convert(tiny["hf"], staged, pp_layers=[2, 2])
    shutil.rmtree(staged / "release" / "mp_rank_00_001")
    problem = failure(staged)
    assert "mp_rank_00_001" in problem.message


def test_wrong_size_predictor_is_refused(tiny: dict[str, Any]) -> None:
    predictor = {**tiny["predictor"], "ffn_dim": 48}
    model = WanDiT(WanDiTConfig.from_predictor(predictor, "pretrain_model.json"))
    with pytest.raises(
        RuntimeFailure, match=r"with other shapes \(e\.g\. blocks\.0\.ffn\.0\.weight: checkpoint \(64, 32\)"
    ):
        load_weights(model, load_checkpoint(str(tiny["pp1"])).model, "ckpt")


@pytest.mark.parametrize(
    ("change", "field"),
    [({"model_type": "i2v"}, "predictor.model_type"), ({"model_id": "sat"}, "predictor.model_id"),
     ({"hidden_size": None}, "predictor.hidden_size"), ({"num_heads": 3}, "predictor.num_heads")],
)  # fmt: skip
def test_predictor_errors_name_the_field(tiny: dict[str, Any], change: dict[str, Any], field: str) -> None:
    with pytest.raises(RuntimeFailure) as caught:
        WanDiTConfig.from_predictor({**tiny["predictor"], **change}, "pretrain_model.json")
    assert caught.value.field == field and caught.value.file == "pretrain_model.json"


def test_flow_schedule_is_mindspeed_mm_formula() -> None:
    cfg = FlowConfig(num_train_timesteps=1000, shift=5.0, sigma_min=0.0, extra_one_step=True)
    flow = FlowMatching(cfg)
    for i in (0, 1, 250, 999):
        base = 1.0 - i / 1000  # linspace(1, 0, 1001)[:-1]
        assert math.isclose(flow.sigmas[i].item(), 5 * base / (1 + 4 * base), rel_tol=1e-6)
    assert math.isclose(flow.timesteps[0].item(), 1000.0) and flow.sigmas.diff().lt(0).all()
    assert math.isclose(flow.weights.mean().item(), 1.0, rel_tol=1e-5)
    x0 = torch.randn(1, 16, 2, 4, 4)
    first = flow.draw(x0, torch.Generator().manual_seed(5))
    again = flow.draw(x0, torch.Generator().manual_seed(5))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    x_t, timestep, target, _ = first
    sigma = timestep[0].item() / 1000
    noise = target + x0
    assert torch.allclose(x_t, (1 - sigma) * x0 + sigma * noise, atol=1e-5)


def test_wan22_timestep_boundaries_limit_the_draw() -> None:
    cfg = FlowConfig.from_diffusion(
        {
            "model_id": "wan_flow_match_scheduler",
            "max_timestep_boundary": 1.0,
            "min_timestep_boundary": 0.417,
        },
        "pretrain_model_low.json",
        training=True,
    )
    flow = FlowMatching(cfg)
    x0 = torch.zeros(1, 1, 1, 1, 1)
    highest = flow.timesteps[flow.low].item()
    assert all(flow.draw(x0, torch.Generator().manual_seed(s))[1].item() <= highest for s in range(50))
    with pytest.raises(RuntimeFailure) as caught:
        FlowConfig.from_diffusion({"model_id": "UniPCMultistepScheduler"}, "m.json", training=True)
    assert caught.value.field == "diffusion.model_id"


def test_euler_sampler_integrates_the_velocity_exactly() -> None:
    """With the true velocity (noise - x0), Euler from sigma 1 to 0 lands on x0 for any step count."""
    x0, noise = torch.randn(1, 4, 2, 4, 4), torch.randn(1, 4, 2, 4, 4)
    cfg = FlowConfig(shift=3.0)
    for steps in (1, 3, 10):
        out = euler_sample(lambda x, t: noise - x0, noise, cfg, steps)
        assert torch.allclose(out, x0, atol=1e-5)
    assert sigma_schedule(cfg, 4)[0].item() == 1.0
