"""`python -m runtime.sample`: videos from a trained (or converted) `wandit` checkpoint, closing the pipeline.

Reads inference_model.json (`predictor`, `ae`, `text_encoder`, `tokenizer`, `diffusion`,
`pipeline_config.input_size`, `fps`), loads `--load` in MM layout (release or iter_*, any PP/VPP split),
denoises seeded noise with Euler steps on the flow-matching sigma schedule (`diffusion.flow_shift`; the
config's UniPC name is MindSpeed-MM's solver, the schedule is the same), applies classifier-free guidance
when `guidance_scale` > 1, decodes with the VAE and writes `<save-path>/sample_<i>.mp4` atomically.
A LoRA checkpoint (`--load` of a `--lora-r` training run) is merged into its base in memory
(base + alpha / r * B @ A, MindSpeed-MM's merge); the base is `--load-base-model`, else the one its manifest names.
Under torchrun with several processes the prompts are split across ranks.
With `--predictor-file PATH --predictor-class NAME` the predictor is the user's own DiT (MindSpeed-MM's
new-model flow, trained by `runtime.user_train`), built from the `predictor` block as MindSpeed-MM builds it
(`runtime.user_dit`); everything else is the same sampler.
"""

from __future__ import annotations

from runtime.device import guard_torch_npu

guard_torch_npu()  # before torch: a torch_npu without CANN must not crash `import torch`

import argparse  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from runtime import checkpoint as ckpt  # noqa: E402
from runtime import lora  # noqa: E402
from runtime.device import Device, pick_device  # noqa: E402
from runtime.dist import env_ranks  # noqa: E402
from runtime.errors import RuntimeFailure, run_main  # noqa: E402
from runtime.flow import FlowConfig, euler_sample  # noqa: E402
from runtime.mmconfig import load_json, require  # noqa: E402
from runtime.wandit import WanDiT, WanDiTConfig, load_weights  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise RuntimeFailure(message, fix="see `python -m runtime.sample --help` for the accepted flags")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(
        prog="python -m runtime.sample", allow_abbrev=False, description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--mm-model", required=True, help="inference_model.json")
    p.add_argument(
        "--load", required=True, help="MM checkpoint dir (release or iter_*), or a LoRA checkpoint"
    )
    p.add_argument(
        "--load-base-model",
        default=None,
        help="the base of a LoRA --load (default: the one its manifest names)",
    )
    p.add_argument("--prompt-file", default=None, help="one prompt per line (default: the json's `prompt`)")
    p.add_argument("--save-path", default=None, help="output dir (default: the json's `save_path`)")
    p.add_argument(
        "--num-inference-steps", type=int, default=None, help="default: diffusion.num_inference_steps"
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", choices=["auto", "npu", "cuda", "cpu"], default=None)
    p.add_argument("--predictor-file", default=None, help="a user's DiT .py file (runtime.user_train's)")
    p.add_argument("--predictor-class", default=None, help="the DiT class in --predictor-file")
    args, unknown = p.parse_known_args(argv)
    if unknown:
        raise RuntimeFailure(
            f"unknown flag {unknown[0]!r} for the bundled runtime",
            field=unknown[0],
            fix="remove it (`python -m runtime.sample --help` lists the flags)",
        )
    if (args.predictor_file is None) != (args.predictor_class is None):
        given, other = (
            ("--predictor-file", "--predictor-class")
            if args.predictor_class is None
            else ("--predictor-class", "--predictor-file")
        )
        raise RuntimeFailure(
            f"{given} needs {other}",
            field=other,
            fix="pass both (the DiT file and its class), or neither for Wan",
        )
    return args


def read_prompts(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise RuntimeFailure(f"prompt file not found: {p}", file=str(p), fix="write one prompt per line")
    prompts = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise RuntimeFailure("the prompt file holds no prompts", file=str(p), fix="write one prompt per line")
    return prompts


def to_frames(video: torch.Tensor) -> Any:
    """[3,T,H,W] in [-1,1] → uint8 numpy [T,H,W,3] for the mp4 writer."""
    return ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).cpu().numpy()


class Sampler:
    def __init__(self, args: argparse.Namespace, cfg: dict[str, Any], device: Device) -> None:
        from runtime.encoders import TextEncoder, VideoEncoder, compute_dtype, dtype_of

        self.args = args
        self.device = device
        file = args.mm_model
        self.cfg = cfg
        predictor = require(cfg, "predictor", file)
        self.flow = FlowConfig.from_diffusion(require(cfg, "diffusion", file), file, training=False)
        diffusion = cfg["diffusion"]
        self.steps = args.num_inference_steps or int(diffusion.get("num_inference_steps", 50))
        if self.steps < 1:
            raise RuntimeFailure(
                "--num-inference-steps must be >= 1", field="--num-inference-steps", fix="use 1+"
            )
        self.guidance = float(diffusion.get("guidance_scale", 1.0))
        size = require(cfg, "pipeline_config.input_size", file)
        if not (
            isinstance(size, list) and len(size) == 3 and all(isinstance(v, int) and v > 0 for v in size)
        ):
            raise RuntimeFailure(
                f"pipeline_config.input_size must be [frames, height, width], got {size!r}",
                file=file,
                field="pipeline_config.input_size",
                fix="e.g. [81, 480, 832]",
            )
        self.frames, self.height, self.width = size
        self.fps = int(cfg.get("fps", 16))
        dev = device.torch_device
        ae = require(cfg, "ae", file)
        te = require(cfg, "text_encoder", file)
        tokenizer = dict(require(cfg, "tokenizer", file))
        tokenizer.setdefault("model_max_length", predictor.get("text_len"))
        ae_dtype = compute_dtype(dtype_of(ae.get("dtype"), field="ae.dtype", source=file), dev)
        te_dtype = compute_dtype(dtype_of(te.get("dtype"), field="text_encoder.dtype", source=file), dev)
        self.vae = VideoEncoder.from_config(ae, dev, ae_dtype, source=file)
        self.text = TextEncoder.from_config(te, tokenizer, dev, te_dtype, source=file)
        loaded = ckpt.load_checkpoint(args.load)
        kind = "release checkpoint" if loaded.release else "checkpoint"
        print(f" loading {kind} from {loaded.root}", flush=True)
        self.model = self._predictor(predictor, file, loaded)
        self.model.to(dev).eval().requires_grad_(False)
        print(
            f"  successfully loaded checkpoint from {loaded.root} [ t 1/1, p 1/1 ] at iteration {loaded.iteration}",
            flush=True,
        )
        self.negative = str(cfg.get("negative_prompt", ""))

    def _predictor(self, predictor: dict[str, Any], file: str, loaded: ckpt.Loaded) -> torch.nn.Module:
        """The Wan DiT, or the user's own (--predictor-file/--predictor-class), with the checkpoint's weights."""
        if self.args.predictor_file is None:
            wan = WanDiT(WanDiTConfig.from_predictor(predictor, file))
            load_weights(wan, self._weights(loaded), str(loaded.root))
            return wan
        from runtime import user_dit

        cls = user_dit.load_dit_class(self.args.predictor_file, self.args.predictor_class)
        model = user_dit.build_dit(cls, predictor, file)
        user_dit.load_weights(model, self._weights(loaded), str(loaded.root))
        return model

    def _weights(self, loaded: ckpt.Loaded) -> dict[str, torch.Tensor]:
        """The model's weights: the checkpoint's own, or for a LoRA checkpoint its base with the adapter merged."""
        if not lora.is_adapter_state(loaded.model):
            return loaded.model
        base_dir = self.args.load_base_model or (loaded.lora or {}).get("base")
        if not base_dir:
            raise RuntimeFailure(
                f"--load {loaded.root} is a LoRA checkpoint and does not name its base",
                field="--load-base-model",
                fix="pass the base checkpoint it was trained on as --load-base-model",
            )
        scaling = lora.scaling_of(loaded.lora, loaded.args, str(loaded.root))
        base = ckpt.load_checkpoint(str(base_dir))
        print(
            f" merging LoRA adapter from {loaded.root} into base {base.root} (scaling {scaling:g})",
            flush=True,
        )
        return lora.merge(base.model, loaded.model, scaling)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = self.device.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.kind, dtype=dtype)

    @torch.no_grad()
    def sample(self, prompt: str, seed: int) -> torch.Tensor:
        dev = self.device.torch_device
        text, _ = self.text.encode([prompt])
        text = text.float()
        uncond = self.text.encode([self.negative])[0].float() if self.guidance > 1.0 else None
        shape = (1, *self.vae.latent_shape(self.frames, self.height, self.width))
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32).to(dev)

        def velocity(x: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
            with self._autocast():
                v = self.model(x, timestep, text).float()
                if uncond is not None:
                    v_uncond = self.model(x, timestep, uncond).float()
                    v = v_uncond + self.guidance * (v - v_uncond)
            return v

        latents = euler_sample(velocity, noise, self.flow, self.steps)
        return self.vae.decode(latents)[0]


def main(argv: list[str] | None = None) -> int:
    from runtime.synth import write_mp4

    args = parse_args(argv)
    info = env_ranks()
    model_cfg_path = args.mm_model
    cfg = load_json(model_cfg_path, "inference config (--mm-model)")
    bf16 = str((cfg.get("predictor") or {}).get("dtype", "bf16")).lower() in ("bf16", "bfloat16")
    device = pick_device(args.device, info.local_rank, bf16=bf16)
    sampler = Sampler(args, cfg, device)
    prompt_file = args.prompt_file or sampler.cfg.get("prompt")
    save_path = args.save_path or sampler.cfg.get("save_path")
    if not prompt_file or not save_path:
        raise RuntimeFailure(
            "no prompt file or save path: pass --prompt-file/--save-path or set `prompt`/`save_path`",
            file=model_cfg_path,
            fix="add --prompt-file PROMPTS.txt --save-path OUT_DIR",
        )
    prompts = read_prompts(str(prompt_file))
    out = Path(save_path)
    out.mkdir(parents=True, exist_ok=True)
    for index in range(info.rank, len(prompts), info.world_size):
        video = sampler.sample(prompts[index], args.seed + index)
        path = out / f"sample_{index}.mp4"
        write_mp4(path, to_frames(video), sampler.fps)
        print(f"saved sample to {path}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_main(main)
