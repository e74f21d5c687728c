"""runtime.vlm_train end to end: transformers' Qwen2.5-VL trained by real torchrun ranks (FSDP2 on gloo) on
MindSpeed-MM's MLLM data, from an `hf_to_mm` conversion, into MindSpeed-MM-layout checkpoints that resume
exactly after kill -9, that mm_to_hf exports, and whose LoRA adapter merges into a model answering like the
adapter does.

The job is what `render_job(runtime="bundled")` writes for the tiny weights (`runtime.synth_vlm`), the data
what `prepare_dataset` writes for the synthetic shapes; the training command is the job script's flags.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("psutil")

from test_runtime_train import LINE, ROOT, env, kill_after_the_iteration_2_save, losses  # noqa: E402

from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.schema import ConvertRequest  # noqa: E402
from mm_agent.dataset import DatasetRequest, prepare_dataset  # noqa: E402
from mm_agent.render import RenderRequest, render_job  # noqa: E402
from runtime.synth_vlm import build_tiny_qwen25vl, make_vlm_dataset  # noqa: E402

LORA = ["--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "linear_qkv", "linear_fc2"]


@pytest.fixture(scope="module")
def vjob(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlm")
    weights = build_tiny_qwen25vl(root / "weights", seed=0)
    made = make_vlm_dataset(root / "data", count=8, heldout=2, seed=0)
    prepared = prepare_dataset(
        DatasetRequest(dir=str(root / "data"), model="qwen2.5vl", task="sft", runtime="bundled",
                       index=str(made.train), confirm=True)
    )  # fmt: skip
    assert prepared.accepted == made.train_records
    execute(ConvertRequest(converter="Qwen2_5_VLConverter", method="hf_to_mm", source=str(weights),
                           target=str(root / "converted"), confirm=True))  # fmt: skip
    render_job(
        RenderRequest(model="qwen2.5vl", task="sft", size="3b", runtime="bundled", out_dir=str(root / "job"),
                      weights_dir=str(weights), load_path=str(root / "converted"), dataset_dir=str(root / "data"),
                      dataset_file=str(root / "data" / "data.json"), npus_per_node=2, confirm=True)
    )  # fmt: skip
    return {"root": root, "weights": weights, "job": root / "job", "converted": root / "converted"}


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "runtime.vlm_train"]  # fmt: skip


def args(v: dict[str, Path], save: Path, *extra: str, iters: int = 6, gbs: int = 4) -> list[str]:
    job = v["job"]
    return [
        "--mm-data", str(job / "data.json"), "--mm-model", str(job / "model.json"),
        "--micro-batch-size", "1", "--global-batch-size", str(gbs), "--num-workers", "0",
        "--lr", "2e-3", "--min-lr", "2e-3", "--lr-decay-style", "constant", "--weight-decay", "0",
        "--clip-grad", "1.0", "--train-iters", str(iters), "--seed", "7", "--seq-length", "1024",
        "--log-interval", "1", "--save-interval", "2", "--load", str(v["converted"]), "--save", str(save),
        "--device", "cpu", "--bf16", "--use-torch-fsdp2", *extra,
    ]  # fmt: skip


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(vjob: dict[str, Path]) -> dict[str, Any]:
    save = vjob["root"] / "save_a"
    done = run([*torchrun(2), *args(vjob, save, "--auto-resume")])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return {"save": save, "stdout": done.stdout}


@pytest.mark.slow
def test_two_ranks_train_from_the_conversion_and_save_mindspeed_mm_checkpoints(
    vjob: dict[str, Path], uninterrupted: dict[str, Any]
) -> None:
    out, save = uninterrupted["stdout"], uninterrupted["save"]
    lines = [line for line in out.splitlines() if "| consumed samples:" in line]
    assert len(lines) == 6 and all(LINE.match(line) for line in lines), "\n".join(lines)
    assert f" loading release checkpoint from {vjob['converted']}" in out
    assert "frozen by model.json: image_encoder.vision_encoder, image_encoder.vision_projector" in out
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "6"
    assert (save / "loss_curve.png").stat().st_size > 0
    payload = torch.load(save / "iter_0000006" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)
    converted = torch.load(
        vjob["converted"] / "release" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False
    )
    assert set(payload["model"]) == set(
        converted["model"]
    )  # MindSpeed-MM's names, as the converter wrote them
    assert payload["optimizer"] and len(payload["rng_state"]) == 2 and payload["iteration"] == 6
    # the frozen ViT did not move; the LLM did
    vit = "image_encoder.encoder.blocks.layers.0.self_attention.linear_qkv.weight"
    llm = "text_decoder.decoder.layers.0.self_attention.linear_qkv.weight"
    assert torch.equal(payload["model"][vit], converted["model"][vit])
    assert not torch.equal(payload["model"][llm], converted["model"][llm])


@pytest.mark.slow
def test_resume_after_kill_is_exact(vjob: dict[str, Path], uninterrupted: dict[str, Any]) -> None:
    save = vjob["root"] / "save_b"
    argv = [*torchrun(2), *args(vjob, save, "--auto-resume")]
    kill_after_the_iteration_2_save(argv, save)
    resumed = run(argv)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {save} (--auto-resume)" in resumed.stdout
    assert losses(save) == losses(uninterrupted["save"])  # every iteration, bit for bit


@pytest.mark.slow
def test_export_loads_in_transformers_with_the_trained_weights(
    vjob: dict[str, Path], uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    from runtime.vlm_load import build, merged_state

    report = execute(ConvertRequest(converter="Qwen2_5_VLConverter", method="mm_to_hf",
                                    source=str(uninterrupted["save"]), target=str(tmp_path / "hf"),
                                    hf_dir=str(vjob["weights"]), confirm=True))  # fmt: skip
    assert report.status == "converted"
    exported = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    state, _ = merged_state(vjob["weights"], str(uninterrupted["save"]), None)
    in_memory = build(vjob["weights"], state, "test")
    for name, tensor in in_memory.state_dict().items():
        assert torch.equal(tensor, exported.state_dict()[name]), name


@pytest.mark.slow
def test_lora_adapter_merges_into_a_model_that_answers_like_the_adapter(
    vjob: dict[str, Path], tmp_path: Path
) -> None:
    from runtime import lora
    from runtime.vlm_load import build, merged_state
    from runtime.vlm_train import hf_targets

    save = tmp_path / "lora"
    done = run([*torchrun(1), *args(vjob, save, *LORA, iters=4, gbs=2)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainable params:" in done.stdout
    adapter = torch.load(save / "iter_0000004" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)
    assert adapter["model"] and all(lora.is_adapter_key(k) for k in adapter["model"])
    manifest = json.loads((save / "lora_adapter.json").read_text())
    assert manifest["target_modules"] == ["linear_qkv", "linear_fc2"]  # MindSpeed-MM's names
    assert any(".self_attn.q_proj" in m for m in manifest["wrapped_modules"])
    assert any(m.endswith("attn.qkv") for m in manifest["wrapped_modules"])

    merged_dir = tmp_path / "merged"
    merge = run([sys.executable, "-m", "runtime.vlm_merge", "--model", str(vjob["weights"]), "--base",
                 str(vjob["converted"]), "--lora", str(save), "--out", str(merged_dir)])  # fmt: skip
    assert merge.returncode == 0, merge.stderr[-2000:]
    execute(ConvertRequest(converter="Qwen2_5_VLConverter", method="mm_to_hf", source=str(merged_dir),
                           target=str(tmp_path / "hf"), hf_dir=str(vjob["weights"]), confirm=True))  # fmt: skip
    exported = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()

    # the adapter model: the base with PEFT on the same modules and the trained adapter loaded
    base_state, _ = merged_state(vjob["weights"], str(vjob["converted"]), None)
    with_adapter = build(vjob["weights"], base_state, "base")
    settings = lora.LoraSettings(4, 8, 0.0, hf_targets(with_adapter, ("linear_qkv", "linear_fc2")), ())
    lora.apply(with_adapter, settings)
    lora.load_adapter(with_adapter, adapter["model"], "adapter")
    with_adapter.eval()

    ids = torch.tensor([[5, 9, 12, 30, 7, 2]])
    with torch.no_grad():
        a, b = with_adapter(input_ids=ids).logits, exported(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()


@pytest.mark.slow
def test_a_model_json_of_another_network_is_refused_naming_the_field(
    vjob: dict[str, Path], tmp_path: Path
) -> None:
    model = json.loads((vjob["job"] / "model.json").read_text())
    model["text_decoder"]["num_layers"] = 5
    (tmp_path / "model.json").write_text(json.dumps(model))
    argv = [*torchrun(1), *args(vjob, tmp_path / "save")]
    argv[argv.index("--mm-model") + 1] = str(tmp_path / "model.json")
    done = run(argv)
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "error: model.json describes another network" in text and "text_decoder.num_layers 5" in text
    assert "fix: render the job again with --weights-dir" in text
    assert "Traceback" not in done.stdout


def test_the_lora_target_table_names_real_modules_on_both_sides(weights_only: Path) -> None:
    """Every transformers suffix is a Linear of the real class; every MindSpeed-MM name is one its Qwen2.5-VL
    source assigns (checked where ../shared/upstream is)."""
    import os
    import re

    from runtime.vlm_train import lora_targets

    config = transformers.Qwen2_5_VLConfig.from_pretrained(weights_only)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for name, suffixes in lora_targets().items():
        for suffix in suffixes:
            assert any(n == suffix or n.endswith("." + suffix) for n in linear), (name, suffix)
    root = os.environ.get("MM_UPSTREAM")
    if not root:
        pytest.skip("MM_UPSTREAM is not set: the MindSpeed-MM side is not checked")
    mm = Path(root) / "MindSpeed-MM" / "v26.0.0" / "mindspeed_mm" / "models"
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in mm.rglob("*.py"))
    for name in lora_targets():
        assert re.search(rf"self\.{name}\s*=", text), name


@pytest.fixture(scope="module")
def weights_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen25vl(tmp_path_factory.mktemp("w") / "weights", seed=0)


@pytest.mark.slow
def test_the_job_manager_runs_stops_and_resumes_a_vlm_job(
    vjob: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered finetune.sh under the job manager: progress in job_status, lines in tail_logs, stop_job ends
    every process it started, and starting the stage again continues from the last checkpoint (--auto-resume)."""
    import time

    from mm_agent.jobs import StageRequest, job_status, start_stage, stop_job, tail_logs, wait_job
    from runtime.train import SLOW_ENV

    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(SLOW_ENV, "0.5")  # half a second after each step: time to stop it mid-run
    job, save = tmp_path / "job", tmp_path / "save"
    render_job(
        RenderRequest(model="qwen2.5vl", task="sft", size="3b", runtime="bundled", out_dir=str(job),
                      weights_dir=str(vjob["weights"]), load_path=str(vjob["converted"]),
                      dataset_dir=str(vjob["root"] / "data"), dataset_file=str(vjob["root"] / "data" / "data.json"),
                      save_path=str(save), npus_per_node=1, mbs=1, grad_acc=1, train_iters=12, save_interval=3,
                      num_workers=0, recompute=False, device="cpu", confirm=True)
    )  # fmt: skip
    launch = start_stage(StageRequest(job_dir=str(job), stage="train", confirm=True))
    assert launch.run_id is not None
    deadline = time.monotonic() + 120
    while not (save / "latest_checkpointed_iteration.txt").is_file() and time.monotonic() < deadline:
        time.sleep(0.3)
    status = job_status(launch.run_id)
    assert status.state == "running" and status.total == 12 and (status.iteration or 0) >= 1
    assert any("| consumed samples:" in line for line in tail_logs(launch.run_id, 20).lines)
    stopped = stop_job(launch.run_id, confirm=True, timeout_s=5)
    assert stopped.status == "stopped" and job_status(launch.run_id).state == "stopped"
    kept = int((save / "latest_checkpointed_iteration.txt").read_text())
    assert 3 <= kept < 12

    monkeypatch.delenv(SLOW_ENV)
    again = start_stage(StageRequest(job_dir=str(job), stage="train", confirm=True))
    assert again.run_id is not None
    final = wait_job(again.run_id, 180, lambda s: None, 0.3)
    assert final.state == "succeeded", final.message
    log = Path(final.log).read_text()
    assert f"resuming from {save} (--auto-resume)" in log and f"at iteration {kept}" in log
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "12"
