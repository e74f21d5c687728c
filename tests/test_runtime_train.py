"""runtime.train / runtime.sample end to end: real torchrun ranks on gloo, real checkpoints, exact resume after kill -9.

Features are written here in the contract's format (`{"video", "prompt_ids", "prompt_mask"}` .pt files plus
data.jsonl), the predictor is the tiny Wan that `runtime.synth` builds, and everything runs as the job
scripts run it: `python -m torch.distributed.run ... -m runtime.train ARGS`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
psutil = pytest.importorskip("psutil")

from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.schema import ConvertRequest  # noqa: E402
from runtime.synth import build_tiny_wan, make_dataset  # noqa: E402
from runtime.train import SLOW_ENV, build_parser, lr_at  # noqa: E402
from runtime.trainlog import iteration_line  # noqa: E402
from runtime.trainsets import RankSlice, StreamSampler  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PREDICTOR = {
    "model_id": "wandit", "dtype": "bf16", "model_type": "t2v", "patch_size": [1, 2, 2], "text_len": 32,
    "in_dim": 16, "hidden_size": 32, "ffn_dim": 64, "freq_dim": 32, "text_dim": 32, "out_dim": 16,
    "num_heads": 2, "num_layers": 2, "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6, "max_seq_len": 1024,
}  # fmt: skip
DIFFUSION = {"model_id": "wan_flow_match_scheduler", "num_train_timesteps": 1000, "shift": 5, "sigma_min": 0.0,
             "extra_one_step": True}  # fmt: skip
# Megatron's iteration line (reference §5.6), with the numbers captured.
LINE = re.compile(
    r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +(\d+)/ +(\d+) \| consumed samples: +(\d+) \| "
    r"elapsed time per iteration \(ms\): [\d.]+ \| learning rate: \d\.\d{6}E[-+]\d\d \| global batch size: +(\d+) \| "
    r"loss: \d\.\d{6}E[-+]\d\d \| loss scale: 1\.0 \| grad norm: [\d.]+ \| number of skipped iterations: +0 \| "
    r"number of nan iterations: +0 \|$"
)


def write_job(job: Path, count: int = 8) -> Path:
    """Feature files + feature_data.json + pretrain_model.json + tools.json, as a rendered job has them."""
    folder = job / "sora_features"
    (folder / "features").mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    lines = []
    for i in range(count):
        name = f"features/set_a-clip{i:04d}_mp4-{i:08x}.pt"
        # MindSpeed-MM's layout ([1, L, D] / [1, L], what runtime.extract writes) and the runtime's earlier [L, D]:
        # the trainer reads both.
        lead = (1,) if i % 2 == 0 else ()
        feature = {
            "video": torch.randn(16, 3, 8, 8, generator=g),
            "prompt_ids": torch.randn(*lead, 32, 32, generator=g),
            "prompt_mask": torch.ones(*lead, 32, dtype=torch.long),
        }
        torch.save(feature, folder / name)
        lines.append(json.dumps({"path": f"set_a/clip{i:04d}.mp4", "cap": f"clip {i}", "file": name}))
    (folder / "data.jsonl").write_text("\n".join(lines) + "\n")
    data = {"dataset_param": {"dataset_type": "feature",
                              "basic_parameters": {"data_path": str(folder / "data.jsonl"), "data_folder": str(folder)}},
            "dataloader_param": {"shuffle": True}}  # fmt: skip
    (job / "feature_data.json").write_text(json.dumps(data))
    model = {"load_video_features": True, "load_text_features": True, "task": "t2v", "diffusion": DIFFUSION,
             "predictor": PREDICTOR}  # fmt: skip
    (job / "pretrain_model.json").write_text(json.dumps(model))
    (job / "tools.json").write_text(json.dumps({"sorafeature": {"save_path": str(folder)}}))
    return job


def train_args(job: Path, save: Path, *extra: str, iters: int = 6, gbs: int = 4) -> list[str]:
    return [
        "--mm-data", str(job / "feature_data.json"), "--mm-model", str(job / "pretrain_model.json"),
        "--mm-tool", str(job / "tools.json"),
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--context-parallel-size", "1",
        "--micro-batch-size", "1", "--global-batch-size", str(gbs), "--num-workers", "0",
        "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1",
        "--weight-decay", "0.01", "--adam-beta1", "0.9", "--adam-beta2", "0.999", "--adam-eps", "1e-8",
        "--clip-grad", "1.0", "--train-iters", str(iters), "--seed", "42", "--log-interval", "1",
        "--save-interval", "2", "--save", str(save), "--device", "cpu", *extra,
    ]  # fmt: skip


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def torchrun(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "runtime.train",
    ]


def run(argv: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env(**extra), cwd=ROOT, timeout=300)


def losses(save: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (save / "losses.jsonl").read_text().splitlines()]
    return [(r["iteration"], r["loss"]) for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-rank FSDP2 run of 6 iterations, saving every 2 (the reference for resume)."""
    job = write_job(tmp_path_factory.mktemp("job"))
    save = job / "save_a"
    done = run([*torchrun(2), *train_args(job, save, "--recompute-granularity", "full")])
    assert done.returncode == 0, done.stderr[-3000:]
    return {"job": job, "save": save, "stdout": done.stdout}


@pytest.mark.slow
def test_two_rank_run_logs_like_megatron(uninterrupted: dict[str, Any]) -> None:
    out = uninterrupted["stdout"].splitlines()
    its = [LINE.match(line) for line in out if "iteration" in line and "consumed samples" in line]
    assert all(its) and [int(m.group(1)) for m in its if m] == [1, 2, 3, 4, 5, 6]
    first = its[0]
    assert first is not None and (first.group(2), first.group(3), first.group(4)) == ("6", "4", "4")
    assert out.count("building SoRA model ...") == 1  # rank 0 only
    save = uninterrupted["save"]
    for it in (2, 4, 6):
        assert f"saving checkpoint at iteration {it:7d} to {save} in torch format" in out
        assert f"  successfully saved checkpoint from iteration {it:7d} to {save}" in out
    assert out[-1] == "training finished: 6 iterations"
    step_field = next(line for line in out if "elapsed time per iteration" in line).split(":")[4]
    assert re.match(r"^ [\d.]+ \| learning rate$", step_field)  # MindSpeed-MM's `awk -F ':' '{print$5}'`


@pytest.mark.slow
def test_checkpoint_artefacts(uninterrupted: dict[str, Any]) -> None:
    save = uninterrupted["save"]
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "6"
    assert sorted(p.name for p in save.iterdir() if p.name.startswith("iter_")) == [
        "iter_0000002", "iter_0000004", "iter_0000006"]  # fmt: skip
    obj = torch.load(save / "iter_0000006/mp_rank_00/model_optim_rng.pt", weights_only=False)
    assert {
        "model",
        "optimizer",
        "rng_state",
        "iteration",
        "consumed_samples",
        "checkpoint_version",
        "args",
    } <= set(obj)
    assert (obj["iteration"], obj["consumed_samples"], obj["checkpoint_version"]) == (6, 24, 3.0)
    assert len(obj["rng_state"]) == 2 and "np_rng_state" in obj["rng_state"][1]
    assert "blocks.1.self_attn.proj_q.weight" in obj["model"] and "head.modulation" in obj["model"]
    assert obj["model"]["blocks.0.ffn.0.weight"].shape == (64, 32)  # gathered, not an FSDP shard
    assert [i for i, _ in losses(save)] == [1, 2, 3, 4, 5, 6]
    assert (save / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((save / "tensorboard").glob("events.out.tfevents.*"))
    assert not [p for p in save.rglob(".*")]  # no temp files left behind


@pytest.mark.slow
def kill_after_the_iteration_2_save(argv: list[str], save: Path) -> None:
    """Run `argv` slowly, SIGKILL it and every process it started right after its iteration-2 checkpoint,
    and check that nothing is left and the tracker names iteration 2."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(**{SLOW_ENV: "1.0"}),
        cwd=ROOT,
    )
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("  successfully saved checkpoint from iteration       2"):
                break
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for child in reversed(tree):  # workers run in their own sessions: kill each process we started
            os.kill(child.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert any("successfully saved checkpoint from iteration       2" in s for s in seen), "".join(seen)[
        -2000:
    ]
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"


def test_resume_after_kill_is_exact(uninterrupted: dict[str, Any]) -> None:
    """SIGKILL the 2-rank run after its iteration-2 checkpoint; resuming from it gives the same losses."""
    job, reference = uninterrupted["job"], uninterrupted["save"]
    save = job / "save_b"
    argv = [*torchrun(2), *train_args(job, save, "--recompute-granularity", "full")]
    kill_after_the_iteration_2_save(argv, save)
    assert sorted(p.name for p in save.iterdir() if p.name.startswith("iter_")) == ["iter_0000002"]

    # The job script's form: re-running the same command with --auto-resume continues from --save.
    resumed = run([*torchrun(2), *train_args(job, save, "--recompute-granularity", "full", "--auto-resume")])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {save} (--auto-resume)" in resumed.stdout
    assert f" loading checkpoint from {save} at iteration 2" in resumed.stdout
    assert f"  successfully loaded checkpoint from {save} [ t 1/1, p 1/1 ] at iteration 2" in resumed.stdout
    assert losses(save) == losses(reference)  # every iteration, bit for bit
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "6"


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_wan(tmp_path_factory.mktemp("tiny") / "weights", seed=0)


@pytest.mark.slow
def test_finetune_from_pp2_checkpoint_and_export(weights: Path, tmp_path: Path) -> None:
    """A PP=2 converted checkpoint trains (stages merged); the save converts back and loads in diffusers."""
    converted = tmp_path / "mm"
    req = ConvertRequest(converter="WanConverter", method="hf_to_mm", source=str(weights / "transformer"),
                         target=str(converted), pp_layers=[1, 1], confirm=True)  # fmt: skip
    assert execute(req).status == "converted"
    job = write_job(tmp_path / "job", count=2)
    save = tmp_path / "save"
    done = run([*torchrun(1), *train_args(job, save, "--load", str(converted), iters=2, gbs=1)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f" loading release checkpoint from {converted}" in done.stdout
    assert " checkpoint layout: PP=2 pp_layers=[1, 1] (stages merged)" in done.stdout
    assert f"  successfully loaded checkpoint from {converted} [ t 1/1, p 1/1 ] at iteration 0" in done.stdout
    export = tmp_path / "hf"
    req = ConvertRequest(converter="WanConverter", method="mm_to_hf", source=str(save), target=str(export),
                         hf_dir=str(weights / "transformer"), confirm=True)  # fmt: skip
    assert execute(req).status == "converted"
    from diffusers import WanTransformer3DModel

    trained = WanTransformer3DModel.from_pretrained(export)
    original = WanTransformer3DModel.from_pretrained(weights / "transformer")
    moved = [n for n, p in trained.named_parameters() if not torch.equal(p, original.state_dict()[n])]
    assert "proj_out.weight" in moved and len(moved) > 40  # trained weights, all names mapped back


@pytest.mark.slow
def test_online_encoding_wan22_style(weights: Path, tmp_path: Path) -> None:
    """load_video_features false: raw mp4 + captions are decoded and encoded (VAE, UMT5) inside training."""
    data_json = make_dataset(tmp_path / "ds", count=2, frames=9, height=32, width=32)
    (tmp_path / "data.txt").write_text(f"{tmp_path / 'ds'},{data_json}\n")
    data = {"dataset_param": {"dataset_type": "t2v",
                              "basic_parameters": {"data_path": str(tmp_path / "data.txt"), "data_storage_mode": "combine"},
                              "preprocess_parameters": {"num_frames": 9, "max_height": 32, "max_width": 32,
                                                        "frame_interval": 1, "auto_interval": False},
                              "text_preprocess_methods": [{"method": "whitespace_clean"}],
                              "tokenizer_config": {"from_pretrained": str(weights / "tokenizer"), "model_max_length": 32}},
            "dataloader_param": {"shuffle": False}}  # fmt: skip
    model = {"load_video_features": False, "load_text_features": False, "task": "t2v", "diffusion": DIFFUSION,
             "predictor": PREDICTOR,
             "ae": {"model_id": "wan_video_vae", "from_pretrained": str(weights / "vae"), "dtype": "bf16",
                    "norm_latents": True, "norm_mode": "channel_specified_shift_scale"},
             "text_encoder": {"model_id": "UMT5", "from_pretrained": str(weights / "text_encoder"), "dtype": "bf16"}}  # fmt: skip
    (tmp_path / "data.json").write_text(json.dumps(data))
    (tmp_path / "model.json").write_text(json.dumps(model))
    argv = ["--mm-data", str(tmp_path / "data.json"), "--mm-model", str(tmp_path / "model.json"), "--lr", "1e-3",
            "--train-iters", "2", "--log-interval", "1", "--global-batch-size", "2", "--num-workers", "1",
            "--device", "cpu"]  # fmt: skip
    done = run([sys.executable, "-m", "runtime.train", *argv])
    assert done.returncode == 0, done.stderr[-3000:]
    assert len([line for line in done.stdout.splitlines() if LINE.match(line)]) == 2


@pytest.mark.slow
def test_user_errors_exit_2_without_traceback(tmp_path: Path) -> None:
    job = write_job(tmp_path / "job", count=2)
    cases = [
        (["--bogus-flag", "1"], "error: unknown flag '--bogus-flag' for the bundled runtime"),
        (["--load", str(tmp_path / "missing")], "does not exist or is not a directory"),
    ]
    for extra, expected in cases:
        done = run(
            [sys.executable, "-m", "runtime.train", *train_args(job, tmp_path / "s", *extra, iters=1, gbs=1)]
        )
        assert done.returncode == 2 and expected in done.stderr and "fix: " in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    (job / "sora_features/features/set_a-clip0001_mp4-00000001.pt").unlink()
    done = run(
        [
            sys.executable,
            "-m",
            "runtime.train",
            *train_args(job, tmp_path / "s", "--num-workers", "1", iters=2, gbs=2),
        ]
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "error: feature file not found" in done.stderr and "--skip-existing" in done.stderr


def test_lr_schedule_matches_megatron() -> None:
    sched = pytest.importorskip("megatron.core.optimizer_param_scheduler")
    parser = build_parser()
    for style, warmup in (("constant", 0), ("linear", 3), ("cosine", 2), ("cosine", 0)):
        args = parser.parse_args(["--mm-data", "d", "--mm-model", "m", "--lr", "1e-3", "--min-lr", "1e-5",
                                  "--lr-decay-style", style, "--lr-warmup-iters", str(warmup), "--train-iters", "10",
                                  "--lr-warmup-init", "1e-6"])  # fmt: skip
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        theirs = sched.OptimizerParamScheduler(
            opt, init_lr=1e-6, max_lr=1e-3, min_lr=1e-5, lr_warmup_steps=warmup, lr_decay_steps=10,
            lr_decay_style=style, start_wd=0.01, end_wd=0.01, wd_incr_steps=10, wd_incr_style="constant",
        )  # fmt: skip
        for done in range(12):
            assert lr_at(args, done) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12), (style, done)
            theirs.step(1)


def test_stream_sampler_splits_and_resumes() -> None:
    """Rank r, micro batch m, slot j of global batch b reads stream position b*GBS + m*MBS*DP + r*MBS + j."""
    mbs, acc, dp = 2, 3, 2
    gbs = mbs * acc * dp

    def take(ranks: RankSlice, consumed: int, n: int) -> list[int]:
        it = iter(StreamSampler(5, ranks, seed=7, consumed=consumed, shuffle=True))
        return [next(it) for _ in range(n)]

    stream = take(RankSlice(1, 1, 1, 0), 0, 2 * gbs)
    assert sorted(stream[:5]) == list(range(5)) and sorted(stream[5:10]) == list(
        range(5)
    )  # epochs are permutations
    assert stream[:5] != stream[5:10]  # reshuffled per epoch
    for r in range(dp):
        ranks = RankSlice(mbs, acc, dp, r)
        got = take(ranks, 0, 2 * mbs * acc)
        want = [
            stream[b * gbs + m * mbs * dp + r * mbs + j]
            for b in range(2)
            for m in range(acc)
            for j in range(mbs)
        ]
        assert got == want
        assert take(ranks, gbs, mbs * acc) == got[mbs * acc :]  # resuming after one global batch


def test_iteration_line_is_megatrons() -> None:
    line = iteration_line(1, 5000, 8, 13707.5, 1e-5, 8, 0.4024374, 0.123, 0, 0)
    assert LINE.match(line), line
    assert line.split(" iteration")[1].startswith("        1/    5000 | consumed samples:            8 |")
    assert "learning rate: 1.000000E-05 | global batch size:     8 | loss: 4.024374E-01 |" in line


def inference_config(weights: Path, guidance: float) -> dict[str, Any]:
    """inference_model.json for the tiny Wan of `runtime.synth` (9 frames of 32x32, the predictor above)."""
    return {"fps": 8, "pipeline_config": {"input_size": [9, 32, 32]}, "predictor": PREDICTOR,
            "ae": {"model_id": "wan_video_vae", "from_pretrained": str(weights / "vae"), "dtype": "float32",
                   "norm_latents": True},
            "tokenizer": {"from_pretrained": str(weights / "tokenizer")},
            "text_encoder": {"model_id": "UMT5", "from_pretrained": str(weights / "text_encoder"), "dtype": "bf16"},
            "diffusion": {"model_id": "UniPCMultistepScheduler", "num_inference_steps": 50,
                          "guidance_scale": guidance, "flow_shift": 5.0}}  # fmt: skip


@pytest.mark.slow
def test_sample_writes_mp4_from_trained_checkpoint(weights: Path, tmp_path: Path) -> None:
    from decord import VideoReader

    converted = tmp_path / "mm"
    req = ConvertRequest(converter="WanConverter", method="hf_to_mm", source=str(weights / "transformer"),
                         target=str(converted), confirm=True)  # fmt: skip
    assert execute(req).status == "converted"
    (tmp_path / "inference_model.json").write_text(json.dumps(inference_config(weights, guidance=3.0)))
    (tmp_path / "prompts.txt").write_text("a red square moving left\n\na blue circle moving up\n")
    out = tmp_path / "samples"
    argv = [sys.executable, "-m", "runtime.sample", "--mm-model", str(tmp_path / "inference_model.json"),
            "--load", str(converted), "--prompt-file", str(tmp_path / "prompts.txt"), "--save-path", str(out),
            "--num-inference-steps", "2", "--device", "cpu"]  # fmt: skip
    done = run(argv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == [
        f"saved sample to {out / 'sample_0.mp4'}",
        f"saved sample to {out / 'sample_1.mp4'}",
    ]
    frames = VideoReader(str(out / "sample_1.mp4"))
    assert (len(frames), *frames[0].shape) == (9, 32, 32, 3)
    assert sorted(p.name for p in out.iterdir()) == ["sample_0.mp4", "sample_1.mp4"]  # no temp files
