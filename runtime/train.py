"""`python -m runtime.train`: train the Wan `wandit` predictor with MindSpeed-MM's configs, flags and layout.

Run it under torchrun like `pretrain_sora.py` (`--mm-data feature_data.json --mm-model pretrain_model.json
--mm-tool tools.json` + Megatron flags). Data parallel over every rank with FSDP2 (`fully_shard` per block,
then the root); one process trains the plain module. Each micro batch draws its timestep and noise from a
generator seeded by (seed, iteration, DP rank, micro batch), and the data order is a function of consumed
samples, so a run resumed from a checkpoint reproduces the uninterrupted run's losses exactly (tested on CPU
after `kill -9`). Logs are Megatron's lines; see `runtime.trainlog` and `runtime.checkpoint`.
"""

from __future__ import annotations

from runtime.device import guard_torch_npu

guard_torch_npu()  # before torch: a torch_npu without CANN must not crash `import torch`

import argparse  # noqa: E402
import contextlib  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from runtime import checkpoint as ckpt  # noqa: E402
from runtime import lora  # noqa: E402
from runtime.device import Device, pick_device  # noqa: E402
from runtime.dist import (  # noqa: E402
    DistInfo,
    all_reduce_mean,
    barrier,
    check_layout,
    destroy,
    env_ranks,
    init_distributed,
    log0,
)
from runtime.errors import RuntimeFailure, run_main  # noqa: E402
from runtime.flow import FlowConfig, FlowMatching  # noqa: E402
from runtime.liveness import Liveness  # noqa: E402
from runtime.mmconfig import load_json, require  # noqa: E402
from runtime.trainlog import TrainLog  # noqa: E402
from runtime.trainsets import ClipSource, Failed, FeatureSource, RankSlice, StreamSampler, collate  # noqa: E402
from runtime.wandit import WanDiT, WanDiTConfig, load_weights  # noqa: E402

# Test-only: seconds to sleep after each iteration, so a test can SIGKILL a run mid-way. Unset in real use.
SLOW_ENV = "MM_AGENT_TRAIN_TEST_DELAY"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise RuntimeFailure(message, fix=f"see `{self.prog} --help` for the accepted flags")


def build_parser(
    prog: str = "python -m runtime.train", description: str | None = None
) -> argparse.ArgumentParser:
    """The flags; a trainer for another model (runtime.user_train) adds its own to these."""
    p = _Parser(prog=prog, allow_abbrev=False, description=description or (__doc__ or "").split("\n")[0])
    p.add_argument("--mm-data", required=True, help="feature_data.json, or data.json for online encoding")
    p.add_argument("--mm-model", required=True, help="pretrain_model.json")
    p.add_argument("--mm-tool", help="tools.json (read to check it parses)")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--virtual-pipeline-model-parallel-size", type=int, default=None)
    p.add_argument("--context-parallel-size", type=int, default=1)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--global-batch-size", type=int, default=None, help="default: MBS x DP")
    p.add_argument("--num-workers", type=int, default=2, help="data loader worker processes per rank")
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--lr-decay-style", choices=["constant", "linear", "cosine"], default="linear")
    p.add_argument("--lr-decay-iters", type=int, default=None, help="default: --train-iters")
    p.add_argument("--lr-warmup-iters", type=int, default=0)
    p.add_argument("--lr-warmup-init", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--adam-beta1", type=float, default=0.9)
    p.add_argument("--adam-beta2", type=float, default=0.999)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument(
        "--clip-grad", type=float, default=1.0, help="0 disables clipping (the norm is still logged)"
    )
    p.add_argument("--train-iters", type=int, required=True)
    p.add_argument(
        "--seq-length",
        type=int,
        default=None,
        help="VLM: the token cutoff of a sample (MindSpeed-MM's, 1024)",
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--bf16", action="store_true", help="bf16 autocast on NPU / bf16-capable CUDA; fp32 on CPU"
    )
    p.add_argument("--recompute-granularity", choices=["full"], default=None)
    p.add_argument("--recompute-method", choices=["block", "uniform"], default="block")
    p.add_argument("--recompute-num-layers", type=int, default=None, help="blocks recomputed (default all)")
    p.add_argument(
        "--use-torch-fsdp2", action="store_true", help="accepted; multi-rank runs always use FSDP2"
    )
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--load", default=None, help="MM checkpoint dir (release or iter_*); omit for random init")
    p.add_argument("--save", default=None, help="where iter_XXXXXXX/ checkpoints, losses and the curve go")
    p.add_argument(
        "--auto-resume",
        action="store_true",
        help="when --save already holds a checkpoint, continue it (weights, optimizer, RNG, data position) "
        "instead of loading --load: re-running a killed job resumes exactly",
    )
    p.add_argument("--no-load-optim", action="store_true")
    p.add_argument("--no-load-rng", action="store_true")
    p.add_argument("--no-save-optim", action="store_true")
    p.add_argument("--no-save-rng", action="store_true")
    p.add_argument("--tensorboard-dir", default=None, help="default: <save>/tensorboard")
    p.add_argument("--device", choices=["auto", "npu", "cuda", "cpu"], default=None)
    lora.add_arguments(p)
    return p


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    parser = parser or build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise RuntimeFailure(
            f"unknown flag {unknown[0]!r} for the bundled runtime",
            field=unknown[0],
            fix=f"remove it, or run the job with MindSpeed-MM (`{parser.prog} --help` lists the flags)",
        )
    if args.virtual_pipeline_model_parallel_size not in (None, 1):
        raise RuntimeFailure(
            "the bundled runtime trains data-parallel; VPP needs pipeline parallelism",
            field="--virtual-pipeline-model-parallel-size",
            fix="drop the flag — VPP-split checkpoints are merged at load",
        )
    for flag, value in (("--train-iters", args.train_iters), ("--log-interval", args.log_interval)):
        if value < 1:
            raise RuntimeFailure(
                f"{flag} must be >= 1, got {value}", field=flag, fix=f"set {flag} to 1 or more"
            )
    if args.save_interval is not None and args.save_interval < 1:
        raise RuntimeFailure(
            "--save-interval must be >= 1", field="--save-interval", fix="omit it or use >= 1"
        )
    lora.LoraSettings.from_args(args)  # refuse bad LoRA flags before anything starts
    return args


def lr_at(args: argparse.Namespace, steps_done: int) -> float:
    """Megatron's OptimizerParamScheduler: linear warmup from --lr-warmup-init, then constant/linear/cosine."""
    warmup = args.lr_warmup_iters
    if warmup > 0 and steps_done <= warmup:
        return args.lr_warmup_init + (args.lr - args.lr_warmup_init) * steps_done / warmup
    if args.lr_decay_style == "constant":
        return args.lr
    decay = args.lr_decay_iters or args.train_iters
    if steps_done > decay:
        return args.min_lr
    ratio = (steps_done - warmup) / max(1, decay - warmup)
    coeff = 1.0 - ratio if args.lr_decay_style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return args.min_lr + coeff * (args.lr - args.min_lr)


def micro_generator(seed: int, iteration: int, dp_rank: int, micro: int) -> torch.Generator:
    """The generator for one micro batch's timestep and noise: a function of its place in training only."""
    mixed = np.random.SeedSequence([seed, iteration, dp_rank, micro]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed))


@dataclass
class StepStats:
    iteration: int
    loss: float
    grad_norm: float
    lr: float
    seconds: float
    skipped: bool


class Trainer:
    """Everything one rank needs to train: configs, data stream, model, optimizer, checkpoint state."""

    def __init__(self, args: argparse.Namespace, device: Device, info: DistInfo) -> None:
        self.args = args
        self.device = device
        self.info = info
        self.rank = info.rank
        model_cfg = load_json(args.mm_model, "model config (--mm-model)")
        data_cfg = load_json(args.mm_data, "data config (--mm-data)")
        if args.mm_tool:
            load_json(args.mm_tool, "tools config (--mm-tool)")
        mbs = args.micro_batch_size
        gbs = args.global_batch_size or mbs * info.world_size
        self.layout = check_layout(
            info.world_size,
            args.tensor_model_parallel_size,
            args.pipeline_model_parallel_size,
            args.context_parallel_size,
            mbs,
            gbs,
        )
        self.ranks = RankSlice(mbs, self.layout.grad_acc, self.layout.dp, info.rank)
        self._read_model_config(model_cfg, data_cfg)
        self.lora = lora.LoraSettings.from_args(args)
        if args.auto_resume and args.save and (Path(args.save) / ckpt.TRACKER).is_file():
            log0(
                self.rank,
                f"resuming from {args.save} (--auto-resume): its checkpoint replaces --load {args.load}",
            )
            # LoRA: the adapter continues from --save, the base stays (MindSpeed-MM's --load-base-model)
            if self.lora is not None:
                args.load_base_model = args.load_base_model or args.load
            args.load, args.no_load_optim, args.no_load_rng = args.save, False, False
        loaded, resume = self._checkpoints()  # checked before encoders load
        dataset = self._dataset(data_cfg, model_cfg)
        if args.bf16 and device.autocast is None:
            log0(
                self.rank,
                f"--bf16: no bf16 autocast on {device.name}, training in fp32 (see runtime/device.py)",
            )
        model = self._build(loaded)
        self.iteration, self.consumed = 0, 0
        if self.lora is not None:
            self._wrap(model, resume)
        if resume is not None and not resume.release:
            self.iteration, self.consumed = resume.iteration, resume.consumed_samples
        self.model = self._parallelize(model.to(device.torch_device))
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self._optimizer()
        if resume is not None and not resume.release:
            if resume.optimizer and not args.no_load_optim:
                ckpt.restore_optimizer(self.model, self.optimizer, resume.optimizer)
            if resume.rng_state and not args.no_load_rng:
                ckpt.restore_rng(resume.rng_state, self.rank, device.kind)
            log0(
                self.rank,
                f"  successfully loaded checkpoint from {resume.root} [ t 1/1, p 1/1 ] at iteration {resume.iteration}",
            )
        elif resume is not None:
            log0(
                self.rank,
                f"  successfully loaded checkpoint from {resume.root} [ t 1/1, p 1/1 ] at iteration 0",
            )
        self.saved_at = self.iteration
        self.batches = self._batches(dataset, data_cfg)
        self.checked = False
        save = Path(args.save) if args.save else None
        board = (
            Path(args.tensorboard_dir) if args.tensorboard_dir else (save / "tensorboard" if save else None)
        )
        self.log = TrainLog(
            save, board, args.train_iters, args.log_interval, self.iteration, enabled=self.rank == 0
        )

    # -- construction (the model-specific parts: runtime.vlm_train overrides these) ----------------------

    def _read_model_config(self, model_cfg: dict[str, Any], data_cfg: dict[str, Any]) -> None:
        args = self.args
        self.wan = WanDiTConfig.from_predictor(require(model_cfg, "predictor", args.mm_model), args.mm_model)
        self.flow = FlowMatching(
            FlowConfig.from_diffusion(
                require(model_cfg, "diffusion", args.mm_model), args.mm_model, training=True
            )
        )
        self.online = not bool(model_cfg.get("load_video_features", True))

    def _build(self, loaded: ckpt.Loaded | None) -> torch.nn.Module:
        """The model with --load's weights (random without --load), before LoRA and FSDP2."""
        log0(self.rank, "building SoRA model ...")
        torch.manual_seed(self.args.seed)
        model = WanDiT(self.wan)
        if loaded is not None:
            self._log_loading(loaded)
            load_weights(model, loaded.model, str(loaded.root))
        model.recompute = self.args.recompute_granularity == "full"
        model.recompute_layers = self.args.recompute_num_layers
        return model

    def _load(self, path: str) -> ckpt.Loaded:
        return ckpt.load_checkpoint(path)

    def _fsdp_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The modules FSDP2 shards as their own units (gathered just in time), before the root."""
        return list(model.blocks)  # type: ignore[arg-type]

    def _checkpoint_state(self, model_sd: dict[str, Any]) -> dict[str, Any]:
        """The gathered model state as the checkpoint stores it (MindSpeed-MM's names)."""
        return model_sd

    def _dataset(self, data_cfg: dict[str, Any], model_cfg: dict[str, Any]) -> Any:
        args = self.args
        kind = require(data_cfg, "dataset_param.dataset_type", args.mm_data)
        if not self.online:
            if kind != "feature":
                raise RuntimeFailure(
                    f"dataset_type is {kind!r} but the model config loads extracted features "
                    "(load_video_features is true)",
                    file=args.mm_data,
                    field="dataset_param.dataset_type",
                    fix="pass feature_data.json (dataset_type feature), or set load_video_features false in "
                    "pretrain_model.json to encode clips online",
                )
            basic = require(data_cfg, "dataset_param.basic_parameters", args.mm_data)
            return FeatureSource(
                require(basic, "data_path", args.mm_data), require(basic, "data_folder", args.mm_data)
            )
        if kind == "feature":
            raise RuntimeFailure(
                "load_video_features is false (online encoding) but --mm-data is a feature dataset",
                file=args.mm_model,
                field="load_video_features",
                fix="pass the raw data.json, or set load_video_features true to train on features",
            )
        from runtime.encoders import TextEncoder, VideoEncoder, compute_dtype, dtype_of

        dev = self.device.torch_device
        ae = require(model_cfg, "ae", args.mm_model)
        te = require(model_cfg, "text_encoder", args.mm_model)
        ae_dtype = compute_dtype(dtype_of(ae.get("dtype"), field="ae.dtype", source=args.mm_model), dev)
        te_dtype = compute_dtype(
            dtype_of(te.get("dtype"), field="text_encoder.dtype", source=args.mm_model), dev
        )
        self.vae = VideoEncoder.from_config(ae, dev, ae_dtype, source=args.mm_model)
        tokenizer = require(data_cfg, "dataset_param.tokenizer_config", args.mm_data)
        self.text = TextEncoder.from_config(te, tokenizer, dev, te_dtype, source=args.mm_model)
        return ClipSource(args.mm_data, data_cfg, args.seed)

    def _checkpoints(self) -> tuple[ckpt.Loaded | None, ckpt.Loaded | None]:
        """(weights, resume): the checkpoint the model's weights come from, and the one whose iteration,
        optimizer and RNG continue. Full training: both are --load. LoRA: the weights are the base
        (--load-base-model, else --load) and, when --load-base-model is given, --load is the LoRA checkpoint
        to continue, as in MindSpeed-MM."""
        args = self.args
        if self.lora is None:
            loaded = self._load(args.load) if args.load else None
            if loaded is not None and lora.is_adapter_state(loaded.model):
                raise RuntimeFailure(
                    f"--load {loaded.root} is a LoRA checkpoint (adapter weights only), not a model",
                    field="--load",
                    fix="continue it with the --lora-* flags it was trained with and --load-base-model BASE, or "
                    "merge it into its base first (mm-agent convert WanConverter merge_lora_to_base)",
                )
            return loaded, loaded
        base_dir = args.load_base_model or args.load
        base = self._load(base_dir)
        if lora.is_adapter_state(base.model):
            raise RuntimeFailure(
                f"{base.root} is a LoRA checkpoint, not a base model",
                field="--load-base-model" if args.load_base_model else "--load",
                fix="pass the base as --load-base-model BASE and the LoRA checkpoint as --load",
            )
        adapter = self._load(args.load) if args.load_base_model and args.load else None
        if adapter is not None and not lora.is_adapter_state(adapter.model):
            raise RuntimeFailure(
                f"--load {adapter.root} holds no LoRA adapter (with --load-base-model, --load is the LoRA checkpoint)",
                field="--load",
                fix="pass the LoRA training's --save dir as --load, or drop --load-base-model to start a new adapter",
            )
        self.base_dir = str(base.root)
        return base, adapter

    def _wrap(self, model: torch.nn.Module, adapter: ckpt.Loaded | None) -> None:
        """Freeze the base, wrap the targets with PEFT, and load the adapter being continued."""
        assert self.lora is not None
        self.lora_modules = lora.apply(model, self.lora)
        if adapter is not None:
            lora.load_adapter(model, adapter.model, str(adapter.root))
        trainable, total = lora.trainable_share(model)
        log0(
            self.rank,
            f"LoRA r={self.lora.r} alpha={self.lora.alpha} on {len(self.lora_modules)} modules: "
            f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {100 * trainable / total:.4f}",
        )

    def _log_loading(self, loaded: ckpt.Loaded) -> None:
        if loaded.release:
            log0(self.rank, f" loading release checkpoint from {loaded.root}")
            log0(self.rank, f" checkpoint layout: {loaded.layout} (stages merged)")
        else:
            log0(self.rank, f" loading checkpoint from {loaded.root} at iteration {loaded.iteration}")

    def _parallelize(self, model: torch.nn.Module) -> torch.nn.Module:
        """FSDP2 over all ranks: each block is its own unit (gathered just in time), then the root."""
        self.sharded = self.info.world_size > 1
        if not self.sharded:
            return model
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.kind, (self.info.world_size,))
        for unit in self._fsdp_units(model):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def _optimizer(self) -> torch.optim.Optimizer:
        """AdamW; like Megatron, biases and 1-D parameters (norm weights) get no weight decay."""
        decay: list[torch.nn.Parameter] = []
        no_decay: list[torch.nn.Parameter] = []
        for name, param in self.model.named_parameters():
            if not param.requires_grad:  # a LoRA run's frozen base
                continue
            (no_decay if name.endswith(".bias") or param.ndim == 1 else decay).append(param)
        groups = [
            {"params": decay, "weight_decay": self.args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(
            groups,
            lr=self.args.lr,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_eps,
        )

    def _collate(self) -> Any:
        return collate

    def _batches(self, dataset: Any, data_cfg: dict[str, Any]) -> Iterator[Any]:
        shuffle = bool((data_cfg.get("dataloader_param") or {}).get("shuffle", True))
        sampler = StreamSampler(len(dataset), self.ranks, self.args.seed, self.consumed, shuffle)
        workers = max(0, self.args.num_workers)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=self.ranks.micro_batch_size,
            sampler=sampler,
            num_workers=workers,
            collate_fn=self._collate(),
            persistent_workers=workers > 0,
        )
        return iter(loader)

    # -- training -----------------------------------------------------------------------------------------

    def _inputs(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(batch, Failed):
            batch.raise_()
        dev = self.device.torch_device
        if self.online:
            from runtime.video import to_model_input

            latents = self.vae.encode(to_model_input(batch["pixels"]))
            text, _ = self.text.encode(batch["caption"])
        else:
            latents, text = batch["video"], batch["prompt_ids"]
        latents = latents.to(dev, torch.float32, non_blocking=True)
        text = text.to(dev, torch.float32, non_blocking=True)
        if not self.checked:
            self._check_shapes(latents, text)
        return latents, text

    def _check_shapes(self, latents: torch.Tensor, text: torch.Tensor) -> None:
        """Data and model must agree; caught here with the field to fix, not as a conv/matmul error."""
        cfg = self.wan
        problems = []
        if latents.ndim != 5 or latents.shape[1] != cfg.in_dim:
            problems.append(
                f"latents {tuple(latents.shape)} do not have predictor.in_dim={cfg.in_dim} channels"
            )
        elif any(s % p for s, p in zip(latents.shape[2:], cfg.patch_size, strict=True)):
            problems.append(
                f"latent grid {tuple(latents.shape[2:])} is not divisible by patch_size {cfg.patch_size}"
            )
        if text.ndim != 3 or text.shape[-1] != cfg.text_dim:
            problems.append(
                f"text features {tuple(text.shape)} do not have predictor.text_dim={cfg.text_dim}"
            )
        if problems:
            raise RuntimeFailure(
                "; ".join(problems),
                file=self.args.mm_model,
                field="predictor",
                fix="size the predictor like the VAE/text encoder the features came from (in_dim = VAE z_dim, "
                "text_dim = text encoder width), or re-extract features",
            )
        self.checked = True

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = self.device.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.kind, dtype=dtype)

    def _micro_loss(self, batch: Any, iteration: int, micro: int) -> torch.Tensor:
        """One micro batch's loss (flow matching: its timestep and noise drawn from its own generator)."""
        latents, text = self._inputs(batch)
        x_t, timestep, target, weight = self.flow.draw(
            latents, micro_generator(self.args.seed, iteration, self.info.rank, micro)
        )
        return FlowMatching.loss(self._predict(x_t, timestep, text, target), target, weight)

    def _predict(
        self, x_t: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        """The model's prediction of the flow-matching `target` (runtime.user_train checks a user's DiT here)."""
        with self._autocast():
            return self.model(x_t, timestep, text)

    def step(self) -> StepStats:
        """One optimizer step over a global batch (grad-acc micro batches on every DP rank)."""
        started = time.perf_counter()
        iteration = self.iteration + 1
        lr = lr_at(self.args, self.iteration)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        grad_acc = self.ranks.grad_acc
        total = torch.zeros((), device=self.device.torch_device)
        for micro in range(grad_acc):
            if self.sharded and grad_acc > 1:
                self.model.set_requires_gradient_sync(micro == grad_acc - 1)  # type: ignore[operator]
            loss = self._micro_loss(next(self.batches), iteration, micro)
            (loss / grad_acc).backward()
            total += loss.detach()
        max_norm = self.args.clip_grad if self.args.clip_grad > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        grad_norm = float(norm)
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = float(all_reduce_mean(total / grad_acc))
        self.iteration = iteration
        self.consumed += self.ranks.global_batch_size
        return StepStats(iteration, loss_value, grad_norm, lr, time.perf_counter() - started, skipped)

    def save(self) -> None:
        """Gather full state dicts (collective), rank 0 writes iter_XXXXXXX atomically, everyone waits."""
        args = self.args
        model_sd, optim_sd = ckpt.gather_full_state(
            self.model, self.optimizer, trainable_only=self.lora is not None
        )
        manifest = None
        if self.lora is not None:
            model_sd = lora.adapter_state(model_sd)
            manifest = self.lora.manifest(self.base_dir, self.lora_modules)
        states: list[Any] = [None] * self.info.world_size
        if dist.is_initialized() and self.info.world_size > 1:
            dist.all_gather_object(states, ckpt.rng_state(self.device.kind))
        else:
            states = [ckpt.rng_state(self.device.kind)]
        if self.rank == 0:
            save_dir = Path(args.save)
            print(
                f"saving checkpoint at iteration {self.iteration:7d} to {save_dir} in torch format",
                flush=True,
            )
            ckpt.save_checkpoint(
                save_dir,
                self.iteration,
                model_sd if self.lora is not None else self._checkpoint_state(model_sd),  # (full on rank 0)
                {} if args.no_save_optim else optim_sd,
                [] if args.no_save_rng else states,
                self.consumed,
                argparse.Namespace(**{**vars(args), "consumed_train_samples": self.consumed}),
                lora=manifest,
            )
            print(
                f"  successfully saved checkpoint from iteration {self.iteration:7d} to {save_dir}",
                flush=True,
            )
            self.log.flush()
        barrier()
        self.saved_at = self.iteration

    def run(self, liveness: Liveness) -> int:
        delay = float(os.environ.get(SLOW_ENV) or 0)
        try:
            return self._loop(liveness, delay)
        except RuntimeFailure:
            raise
        except Exception as exc:  # a collective that lost its peer: name the node when the error says which
            failure = liveness.peer_failure(exc)
            if failure is None:
                raise
            raise failure from None

    def _loop(self, liveness: Liveness, delay: float) -> int:
        args = self.args
        while self.iteration < args.train_iters:
            liveness.iteration = self.iteration + 1
            s = self.step()
            self.log.record(
                s.iteration,
                self.consumed,
                s.seconds,
                s.lr,
                self.ranks.global_batch_size,
                s.loss,
                s.grad_norm,
                s.skipped,
            )
            if args.save and args.save_interval and s.iteration % args.save_interval == 0:
                self.save()
            if delay:
                time.sleep(delay)
        if args.save and self.saved_at != self.iteration:
            self.save()
        self.log.close()
        peak, what = self.device.peak_memory_mb()
        log0(self.rank, f"peak memory: {peak:.1f} MiB ({what}, rank 0)")
        log0(self.rank, f"training finished: {self.iteration} iterations")
        return 0


def main(
    argv: list[str] | None = None,
    trainer: type[Trainer] = Trainer,
    parser: argparse.ArgumentParser | None = None,
) -> int:
    args = parse_args(argv, parser)
    device = pick_device(args.device, env_ranks().local_rank, bf16=args.bf16)
    info = init_distributed(device)
    liveness = Liveness(info.rank, info.world_size)
    try:
        liveness.save_dir = Path(args.save) if args.save else None
        liveness.start()
        code = trainer(args, device, info).run(liveness)
        liveness.finish()
        barrier()  # every rank done with its collectives before any tears its process group down
        return code
    finally:
        destroy()


if __name__ == "__main__":
    run_main(main)
