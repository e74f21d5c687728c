"""`estimate_resources` / `mm-agent estimate`: token counts, memory parts that move the right way, verdicts
and levers, the device table, the CLI and MCP faces, bad input, and the validation warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client
from upstream_tree import mindspeed_mm_tree

from mm_agent.cli import main
from mm_agent.errors import MMAgentError
from mm_agent.estimate import EstimateRequest, EstimateResult, estimate_resources
from mm_agent.estimate.devices import DEVICES_FILE, load_devices, load_devices_file
from mm_agent.estimate.profiles import load_profiles
from mm_agent.registry import get_registry
from mm_agent.render import RenderRequest, render_job
from mm_agent.server import build_server
from mm_agent.validate import ValidateRequest, validate_configs

CONTRACT = {"fits", "per_device_gb", "device_gb", "breakdown", "step_seconds", "levers"}


def est(**kwargs: object) -> EstimateResult:
    return estimate_resources(EstimateRequest.model_validate(kwargs))


def test_wan21_14b_clip_is_32760_tokens() -> None:
    r = est(model="wan2.1", size="14b", frames=81, height=480, width=832)
    assert r.seq_tokens == 21 * 30 * 52 == 32_760
    assert 13.5 < r.params_b < 14.5 and r.params_source.startswith("registry arch")


def test_every_generative_and_vlm_model_and_size_answers() -> None:
    count = 0
    for entry in get_registry().models.values():
        if entry.family not in ("generative", "vlm"):
            continue
        for size in entry.sizes:
            r = est(model=entry.id, size=size.id)
            assert r.per_device_gb > 0 and r.params_b > 0 and r.seq_tokens > 0, (entry.id, size.id)
            assert r.step_seconds is not None and r.step_seconds > 0, (entry.id, size.id)
            assert abs(sum(r.breakdown.values()) - r.per_device_gb) < 0.05, (entry.id, size.id)
            assert r.fits == (r.per_device_gb <= r.device_gb)
            count += 1
    assert count > 50


def test_parameter_count_sources() -> None:
    assert est(model="qwen2.5vl", size="7b").params_b == pytest.approx(8.3, abs=0.2)  # LLM + ViT from arch
    moe = est(model="qwen3vl", size="30b")
    assert moe.params_b > 30 and moe.active_params_b < 4  # Qwen3-VL-30B-A3B: the hf id's active count
    assert "size id" in moe.params_source and any("expert parallelism" in n for n in moe.notes)
    assert "shapes.yaml" in est(model="flux").params_source


def test_memory_moves_the_right_way() -> None:
    base = est(model="wan2.1", size="14b", frames=49)
    more = est(model="wan2.1", size="14b", frames=81)
    assert more.breakdown["activations"] > base.breakdown["activations"]
    assert more.per_device_gb > base.per_device_gb
    none = est(model="wan2.1", size="14b", recompute="none")
    full = est(model="wan2.1", size="14b", recompute="full")
    assert full.breakdown["activations"] < none.breakdown["activations"] / 5
    assert full.step_seconds is not None and none.step_seconds is not None
    assert full.step_seconds == pytest.approx(none.step_seconds * 4 / 3, rel=0.01)
    cp1 = est(model="wan2.1", size="14b", recompute="none", cp=1)
    cp2 = est(model="wan2.1", size="14b", recompute="none", cp=2)
    assert cp2.breakdown["activations"] == pytest.approx(cp1.breakdown["activations"] / 2, rel=0.01)
    few = est(model="wan2.1", size="14b", sharding="layerzero", npus=8)
    many = est(model="wan2.1", size="14b", sharding="layerzero", npus=32)
    assert many.per_device_gb < few.per_device_gb
    assert many.breakdown["weights"] == pytest.approx(few.breakdown["weights"] / 4, abs=0.02)


def test_online_encoders_counted_only_without_feature_extraction() -> None:
    assert "frozen_encoders" not in est(model="wan2.1", size="14b").breakdown  # trains on extracted features
    assert est(model="wan2.2", size="5b").breakdown["frozen_encoders"] > 5  # encodes online (FSDP2 backend)


def test_a_device_that_trains_in_fp32_gets_the_bundled_runtimes_profile() -> None:
    """Only the bundled runtime trains on CPU, in fp32 (devices.yaml `precision`): its profile's 4 + 4 + 8
    bytes per parameter instead of MindSpeed-MM's 2 + 4 + 12, and its own activations per token."""
    base = {"model": "wan2.1", "size": "1.3b", "npus": 1, "sharding": "none", "recompute": "none"}
    npu = estimate_resources(EstimateRequest(**base, device="910b"))
    cpu = estimate_resources(EstimateRequest(**base, device="cpu"))
    assert (npu.runtime, cpu.runtime) == ("mindspeed-mm", "bundled")
    assert load_devices().find("cpu").precision == "fp32" and load_devices().find("910b").precision == "bf16"
    assert cpu.breakdown["weights"] == pytest.approx(2 * npu.breakdown["weights"], rel=0.01)
    assert cpu.breakdown["gradients"] == pytest.approx(npu.breakdown["gradients"], rel=0.01)
    assert cpu.breakdown["optimizer"] == pytest.approx(npu.breakdown["optimizer"] * 8 / 12, rel=0.01)
    mindspeed, bundled = load_profiles().find("mindspeed-mm", "bf16"), load_profiles().find("bundled", "fp32")
    h, f = 1536, 8960  # Wan2.1-1.3B: per token, MindSpeed-MM 27 h + 4 f bytes, the bundled runtime 88 h + 8 f
    ratio = (bundled.per_hidden * h + bundled.per_ffn * f) / (
        (mindspeed.per_hidden + mindspeed.cross_per_hidden) * h + mindspeed.per_ffn * f
    )
    assert cpu.breakdown["activations"] == pytest.approx(ratio * npu.breakdown["activations"], rel=0.02)


def test_a_bundled_job_is_estimated_with_the_bundled_runtimes_profile(tmp_path: Path) -> None:
    job = _render(tmp_path, model="wan2.1", task="t2v", size="1.3b", runtime="bundled", device="auto")
    r = estimate_resources(EstimateRequest(job_dir=str(job)), root=tmp_path)
    assert (r.runtime, r.device) == ("bundled", "910b2")
    assert (
        r.breakdown["weight_casts"] > 0
    )  # bf16 autocast keeps a copy of the fp32 weights; MindSpeed-MM does not
    stock = estimate_resources(EstimateRequest(model="wan2.1", size="1.3b", task="t2v"))
    assert stock.runtime == "mindspeed-mm" and "weight_casts" not in stock.breakdown


def test_14b_full_finetune_on_one_npu_does_not_fit_and_says_how() -> None:
    r = est(model="wan2.1", size="14b", npus=1, sharding="none", device="910b")
    assert not r.fits and r.device_gb == 64 and r.per_device_gb > 200
    changes = [lever.change for lever in r.levers]
    assert any("layerzero" in c or "fsdp2" in c for c in changes), changes
    assert any("LoRA" in c for c in changes), changes
    assert r.levers[0].fits and r.levers[0].per_device_gb < r.device_gb
    assert all(lever.per_device_gb < r.per_device_gb for lever in r.levers)
    asked = {"model": "wan2.1", "size": "14b", "npus": 1, "sharding": "none", "device": "910b"}
    redone = est(**(asked | r.levers[0].args))
    assert redone.per_device_gb == r.levers[0].per_device_gb


def test_time_for_the_run_and_the_epoch() -> None:
    r = est(model="wan2.1", size="1.3b", train_iters=1000, dataset_size=8000)
    assert r.step_seconds is not None and r.run_hours == pytest.approx(1000 * r.step_seconds / 3600, rel=0.01)
    assert r.epoch_hours == pytest.approx(8000 / r.global_batch * r.step_seconds / 3600, rel=0.01)


def test_device_table_entries_are_complete() -> None:
    table = load_devices_file(DEVICES_FILE)
    ids = {d.id for d in table.devices}
    assert {"910b1", "910b2", "910b3", "910b4", "910c", "atlas-a3", "atlas-800t-a2", "cpu"} <= ids
    assert {"a100-40g", "a100-80g", "h100", "h200", "h20", "l40s", "rtx4090"} <= ids
    for device in table.devices:
        assert device.source.startswith(("http", "unverified", "NVIDIA")), device.id
        assert 0 < device.mfu < 0.7 and device.memory_gb >= 24 and device.workspace_gb < device.memory_gb / 4
    assert load_devices().find("910B").memory_gb == 64
    assert load_devices().find("H200").memory_gb == 141


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"model": "wan9"}, "model", "did you mean"),
        ({"model": "wan2.1", "size": "99b"}, "size", "1.3b, 14b"),
        ({"model": "wan2.1", "device": "tpu-v9"}, "device", "910b2"),
        ({"model": "wan2.1", "frames": 80}, "frames", "77 or 81"),
        ({"model": "wan2.1", "height": 490}, "height", "480 or 496"),
        ({"model": "wan2.1", "task": "sft"}, "task", "t2v"),
        ({"model": "whisper"}, "model", "generative or VLM"),
        ({"model": "wan2.1", "npus": 3, "cp": 2}, "npus", "multiple of 2"),
        ({}, "model", "job_dir"),
    ],
)
def test_bad_input_names_field_and_fix(kwargs: dict[str, object], field: str, fix: str) -> None:
    with pytest.raises(MMAgentError) as err:
        est(**kwargs)
    assert err.value.field == field and fix in (err.value.fix or ""), err.value.render()


def test_cli_json_has_the_contract_keys(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "wan2.1", "--size", "14b", "--npus", "1", "--sharding", "none", "--frames", "81"]
    assert main([*argv, "--height", "480", "--width", "832", "--device", "910b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= CONTRACT and data["fits"] is False and data["device_gb"] == 64
    assert all({"change", "per_device_gb"} <= set(lever) for lever in data["levers"])
    assert main(["estimate", "wan2.1", "--size", "14b"]) == 0
    assert "fits" in capsys.readouterr().out
    assert main(["estimate", "wan2.1", "--frames", "80"]) == 2
    assert "77 or 81" in capsys.readouterr().err


def _render(tmp_path: Path, **kwargs: object) -> Path:
    tmp_path.mkdir(exist_ok=True)
    out = tmp_path / "job"
    req = RenderRequest.model_validate({"out_dir": str(out), "confirm": True, **kwargs})
    assert render_job(req, root=tmp_path).status == "written"
    return out


def test_job_dir_reads_its_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = _render(tmp_path, model="wan2.1", task="t2v", size="14b", num_frames=49)
    r = estimate_resources(EstimateRequest(job_dir=str(job)), root=tmp_path)
    assert (r.model, r.size, r.npus, r.sharding, r.recompute, r.frames) == (
        "wan2.1",
        "14b",
        8,
        "layerzero",
        "full",
        49,
    )
    assert main(["estimate", str(job), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["frames"] == 49


def test_validate_warns_on_an_over_budget_job(tmp_path: Path) -> None:
    job = _render(tmp_path, model="wan2.1", task="t2v", size="14b", npus_per_node=1)
    report = validate_configs(ValidateRequest(paths=[str(job)]), root=tmp_path)
    over = [f for f in report.findings if f.rule == "estimate.over_budget"]
    assert len(over) == 1 and over[0].severity == "warning" and "GB" in over[0].message and over[0].fix
    # the validation's figures are the estimate's own (it reuses the texts it loaded; the levers only here)
    alone = estimate_resources(EstimateRequest(job_dir=str(job)), root=tmp_path)
    assert f"estimated {alone.per_device_gb:g} GB per device" in over[0].message
    assert alone.levers and over[0].fix.startswith(alone.levers[0].change)
    fits = _render(tmp_path / "ok", model="wan2.1", task="t2v", size="1.3b")
    report = validate_configs(ValidateRequest(paths=[str(fits)]), root=tmp_path / "ok")
    assert not [f for f in report.findings if f.rule in ("estimate.over_budget", "validator.crash")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_tool_answers_briefly_and_in_full(tmp_path: Path) -> None:
    args = {"model": "wan2.1", "size": "14b", "npus": 1, "sharding": "none", "device": "910b"}
    async with Client(build_server(tmp_path), raise_exceptions=True) as client:
        brief = await client.call_tool("estimate_resources", args)
        full = await client.call_tool("estimate_resources", {**args, "detail": True})
        bad = await client.call_tool("estimate_resources", {**args, "frames": 80})
    data = brief.structured_content or {}
    assert set(data) >= CONTRACT and data["fits"] is False
    assert "does NOT fit" in brief.content[0].text and "Best lever" in brief.content[0].text  # type: ignore[union-attr]
    assert (full.structured_content or {})["params_source"].startswith("registry arch")
    assert bad.is_error and "frames" in bad.content[0].text and "77 or 81" in bad.content[0].text  # type: ignore[union-attr]


def test_render_picks_the_cp_that_makes_an_asked_device_count_fit(tmp_path: Path) -> None:
    """Wan2.1-14B, 121 frames at 720p on 16 NPUs: 81.7 GB per NPU with the stock CP 1, so render_job
    writes CP 2 (the 40 heads divide) and says why; the validator accepts the job."""
    shape = {"model": "wan2.1", "task": "t2v", "size": "14b", "num_frames": 121, "max_height": 720,
             "max_width": 1280}  # fmt: skip
    req = RenderRequest.model_validate(
        {"out_dir": str(tmp_path / "job"), "confirm": True, "npus_per_node": 16, **shape}
    )
    result = render_job(req, root=tmp_path)
    assert result.fit is not None and result.fit.startswith("CP 2 so it fits 16 x 910b2"), result.fit
    job = tmp_path / "job"
    assert "CP=2\n" in (job / "pretrain.sh").read_text() and "cp: 2" in (job / "job.yaml").read_text()
    report = validate_configs(ValidateRequest(paths=[str(job)]), root=tmp_path)
    assert not [f for f in report.findings if f.severity == "error"], report.findings
    estimate = estimate_resources(EstimateRequest(job_dir=str(job)), root=tmp_path)
    assert estimate.fits and estimate.cp == 2
    # the user's own CP is kept (only the verdict), and the stock count keeps the stock layout
    own = RenderRequest.model_validate({"out_dir": "own", "npus_per_node": 16, "cp": 1, **shape})
    kept = render_job(own, root=tmp_path)
    assert kept.fit is not None and kept.fit.startswith("does not fit 16 x 910b2")
    assert any(f.content and "CP=1\n" in f.content for f in kept.files if f.path == "pretrain.sh")
    stock = render_job(RenderRequest.model_validate({"out_dir": "stock", **shape}), root=tmp_path)
    assert stock.fit is None


def test_route_gives_the_memory_verdict_for_the_count_asked() -> None:
    from mm_agent.route import RouteRequest, route_model

    over = route_model(RouteRequest(request="fine-tune Wan2.1 14B text-to-video on 4 NPUs")).candidates[0]
    assert (
        over.fit is not None and over.fit.startswith("does not fit 4 x 910b2") and "best change" in over.fit
    )
    fits = route_model(RouteRequest(request="Wan2.1 14B LoRA on 2 NPUs")).candidates[0]
    assert fits.task == "lora" and fits.fit is not None and fits.fit.startswith("fits 2 x 910b2")
    assert route_model(RouteRequest(request="Wan2.1 14B text-to-video")).candidates[0].fit is None
    # at the stock device count render_job keeps the stock layout: the verdict offers no CP
    stock = route_model(RouteRequest(request="Wan2.1 14B DPO on 8 NPUs")).candidates[0]
    assert stock.task == "dpo" and stock.fit is not None and not stock.fit.startswith("CP"), stock.fit
    bundled = route_model(RouteRequest(request="Wan2.1 1.3B text-to-video on 1 GPU", runtime="bundled"))
    assert bundled.candidates[0].fit is not None


def test_stock_layouts_shard_as_their_configs_say() -> None:
    """MindSpeed-MM's DeepSpeed examples run ZeRO stage 2 (bf16_accelerate_config.yaml `zero_stage: 2`), Open-Sora
    2.0 ships a LayerZero config: with those, their stock 8-NPU jobs fit a 64 GB NPU; CP is offered only to
    Megatron jobs."""
    for model in ("flux", "sd3"):
        r = est(model=model)
        assert (r.sharding, r.fits) == ("zero2", True), (model, r.per_device_gb)
        assert not any("context parallel" in lever.change for lever in r.levers)
        replicated = est(model=model, sharding="distributed-optimizer")
        assert replicated.breakdown["gradients"] == pytest.approx(8 * r.breakdown["gradients"], rel=0.02)
    sora = est(model="opensora2.0")
    assert (sora.sharding, sora.fits) == ("layerzero", True)


def test_job_dir_reads_the_deepspeed_stage(tmp_path: Path) -> None:
    job = _render(tmp_path, model="flux", task="t2i")
    assert estimate_resources(EstimateRequest(job_dir=str(job)), root=tmp_path).sharding == "zero2"
    config = job / "accelerate_config.yaml"
    config.write_text(config.read_text().replace("zero_stage: 2", "zero_stage: 3"))
    assert estimate_resources(EstimateRequest(job_dir=str(job)), root=tmp_path).sharding == "zero3"


def test_a_wrapped_stock_script_is_read_from_the_checkout(tmp_path: Path) -> None:
    """The `custom` template runs MindSpeed-MM's own script: Wan2.1-14B DPO (14b/i2v/posttrain.sh) trains with
    PP 8 and its model config (MM_MODEL) builds 8 layers, which only those files say; read from the job's
    MindSpeed-MM checkout, it fits."""
    tree = mindspeed_mm_tree("v26.0.0", "read the stock DPO script a wrapper job runs")
    job = tmp_path / "job"
    req = RenderRequest(
        out_dir=str(job), confirm=True, model="wan2.1", task="dpo", size="14b", mm_root=str(tree)
    )
    assert render_job(req).status == "written"  # the CLI's view: no workspace, the checkout where it lies
    r = estimate_resources(EstimateRequest(job_dir=str(job)))
    assert (r.pp, r.sharding, r.fits) == (8, "distributed-optimizer", True), r.per_device_gb
    # its posttrain_model.json builds 8 of the 40 layers: a fifth of the 14B DiT's parameters
    assert "builds 8 of the size's 40 layers" in " ".join(r.notes) and r.params_b < 0.25 * 14
    without = _render(tmp_path / "bare", model="wan2.1", task="dpo", size="14b")
    assert estimate_resources(EstimateRequest(job_dir=str(without)), root=tmp_path / "bare").pp == 1


def test_job_dir_reads_the_depth_its_model_config_builds(tmp_path: Path) -> None:
    """The script's MM_MODEL ($JOB_DIR/pretrain_model.json) is what MindSpeed-MM builds: a user who cuts the
    DiT to 15 of Wan2.1-1.3B's 30 layers gets half the parameters."""
    job = _render(tmp_path, model="wan2.1", task="t2v", size="1.3b")
    full = estimate_resources(EstimateRequest(job_dir=str(job)), root=tmp_path)
    config = job / "pretrain_model.json"
    model = json.loads(config.read_text())
    assert model["predictor"]["num_layers"] == 30
    model["predictor"]["num_layers"] = 15
    config.write_text(json.dumps(model))
    cut = estimate_resources(EstimateRequest(job_dir=str(job)), root=tmp_path)
    assert cut.params_b == pytest.approx(full.params_b / 2, rel=0.02)
    assert "builds 15 of the size's 30 layers" in " ".join(cut.notes)
