"""`python -m runtime.user_train`: train the user's own DiT (MindSpeed-MM's new-model flow) with the bundled runtime.

The flags are `runtime.train`'s (MindSpeed-MM's `--mm-data/--mm-model/--mm-tool` + Megatron's) plus
`--predictor-file PATH --predictor-class NAME` (the DiT file and class the scaffold wrote, imported from the
file itself: `runtime.user_dit`) and MindSpeed-MM's `--fsdp2-config-path`. model.json is MindSpeed-MM's:
`predictor` is passed to the class as `PredictModel` passes it (`model_cls(**config.to_dict())`, model_id
included), `diffusion` is `wan_flow_match_scheduler` (`runtime.flow`, as the Wan trainer uses it), and the
data are the features `runtime.extract` wrote (`load_video_features` true, a feature data config; online
encoding is the Wan trainer's code, not exercised here for a user's DiT). The DiT is called as the guide's
`forward(hidden_states, timestep, encoder_hidden_states)`.

Everything else is the Wan trainer's (`runtime.train.Trainer`): FSDP2 over every rank, AdamW, Megatron's
schedule and log lines, exact resume, checkpoints in MindSpeed-MM's layout holding the predictor's own state
dict names (what `CustomModel.state_dict()` returns in MindSpeed-MM), so `python -m runtime.sample` with the
same two flags samples from them.

FSDP2 units come from the fsdp2 config's `sub_modules_to_wrap` with MindSpeed-MM's syntax
(`predictor.blocks.{*}`, `predictor.blocks.{0-3,5}`; paths are relative to MindSpeed-MM's CustomModel, so
`predictor.` is stripped: the model here is the predictor). A path that names no module is refused, where
MindSpeed-MM only prints `Warning: Module not found at path ...` and trains that part unsharded
(`get_submodules_by_path`, mindspeed_mm/models/transformers/base_model.py). `recompute_modules` (or
`--recompute-granularity full`: the wrapped units) get activation checkpointing as MindSpeed-MM applies it
(`checkpoint_wrapper` before `fully_shard`). Without the flag, the model's `blocks` are the units.
"""

from __future__ import annotations

from runtime.device import guard_torch_npu

guard_torch_npu()  # before torch: a torch_npu without CANN must not crash `import torch`

import argparse  # noqa: E402
import functools  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, cast  # noqa: E402

import torch  # noqa: E402

from runtime import checkpoint as ckpt  # noqa: E402
from runtime import train as base  # noqa: E402
from runtime import user_dit  # noqa: E402
from runtime.dist import log0  # noqa: E402
from runtime.errors import RuntimeFailure, run_main  # noqa: E402
from runtime.flow import FlowConfig, FlowMatching  # noqa: E402
from runtime.mmconfig import require  # noqa: E402

# model.json parts of MindSpeed-MM's CustomModel that are not the predictor (frozen; not held here)
OTHER_PARTS = ("ae", "text_encoder", "diffusion")
# fsdp2_config.yaml keys the bundled runtime applies (the rest, dtypes, offload, prefetch, are logged as not applied)
HONOURED = {"sub_modules_to_wrap", "recompute_modules", "use_reentrant", "ignored_modules"}
UPSTREAM_RESOLVER = "get_submodules_by_path in mindspeed_mm/models/transformers/base_model.py"


def build_parser() -> argparse.ArgumentParser:
    p = base.build_parser("python -m runtime.user_train", (__doc__ or "").split("\n")[0])
    add_predictor_arguments(p)
    p.add_argument(
        "--fsdp2-config-path",
        default=None,
        help="MindSpeed-MM's fsdp2_config.yaml: sub_modules_to_wrap (and recompute_modules) are honoured",
    )
    return p


def add_predictor_arguments(p: argparse.ArgumentParser) -> None:
    """--predictor-file / --predictor-class (runtime.sample takes the same two)."""
    p.add_argument(
        "--predictor-file",
        required=True,
        help="the DiT's .py file (mindspeed_mm/models/predictor/dits/<name>_dit.py)",
    )
    p.add_argument("--predictor-class", required=True, help="the DiT class in that file")


def split_path(path: str, file: str, field: str) -> tuple[str, str, str] | None:
    """(before, pattern, after) of a `a.b.{...}.c` path, or None without braces; one pair at most."""
    opens, closes = path.count("{"), path.count("}")
    if opens == closes == 0:
        return None
    match = re.fullmatch(r"([^{}]*)\{([^{}]*)\}([^{}]*)", path)
    if opens != 1 or closes != 1 or match is None:
        raise RuntimeFailure(
            f"{path!r} must hold at most one {{...}} pattern (MindSpeed-MM raises ValueError on it)",
            file=file,
            field=field,
            fix="write e.g. predictor.blocks.{*} or predictor.blocks.{0-3,5}",
        )
    return match.group(1).rstrip("."), match.group(2).strip(), match.group(3).lstrip(".")


def nested(model: torch.nn.Module, path: str) -> Any:
    node: Any = model
    for part in path.split(".") if path else []:
        if not hasattr(node, part):
            return None
        node = getattr(node, part)
    return node


def resolve_paths(model: torch.nn.Module, paths: Any, file: str, key: str) -> list[torch.nn.Module]:
    """The modules an fsdp2 config list names (MindSpeed-MM's `{*}` and `{a-b,c}` syntax), in order, once each.

    Paths are MindSpeed-MM's, relative to its CustomModel; the model here is the predictor, so `predictor.` is
    stripped and the encoders' paths (`ae...`, `text_encoder...`) are skipped. Anything that names no module
    of the predictor is refused with the field to fix."""
    if paths is None:
        return []
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise RuntimeFailure(
            f"{key} must be a list of module paths, got {paths!r}",
            file=file,
            field=key,
            fix="e.g.\n  sub_modules_to_wrap:\n  - predictor.blocks.{*}",
        )
    children = ", ".join(n for n, _ in model.named_children())
    found: list[torch.nn.Module] = []
    for index, path in enumerate(paths):
        field = f"{key}[{index}]"
        head = path.split(".", 1)[0]
        if head in OTHER_PARTS:
            continue  # a frozen encoder's module: not part of the model trained here
        if head != "predictor":
            raise RuntimeFailure(
                f"{path!r} does not start with predictor.: MindSpeed-MM resolves these paths on the whole "
                f"model (ae, text_encoder, diffusion, predictor), where it names nothing",
                file=file,
                field=field,
                fix=f"write predictor.{path}",
            )
        inner = path.removeprefix("predictor").lstrip(".")
        pattern = split_path(inner, file, field)
        if pattern is None:
            expanded = [inner]
        else:
            before, spec, after = pattern
            container = nested(model, before)
            if spec == "*":
                if not isinstance(container, torch.nn.Module) or not hasattr(container, "__len__"):
                    raise RuntimeFailure(
                        f"{path!r}: predictor.{before} is no module list in {type(model).__name__} (MindSpeed-MM "
                        f"raises ValueError in {UPSTREAM_RESOLVER})",
                        file=file,
                        field=field,
                        fix=f"name a list of blocks; the predictor's modules: {children}",
                    )
                indices = list(range(len(cast(Any, container))))
            else:
                indices = _indices(spec, path, file, field)
            expanded = [".".join(p for p in (before, str(i), after) if p) for i in indices]
        for sub in expanded:
            target = nested(model, sub)
            if not isinstance(target, torch.nn.Module):
                what = "is not a module" if target is not None else "names no module"
                raise RuntimeFailure(
                    f"{path!r}: predictor.{sub} {what} of {type(model).__name__}; MindSpeed-MM would print "
                    f"'Warning: Module not found' and train it unsharded ({UPSTREAM_RESOLVER})",
                    file=file,
                    field=field,
                    fix=f"remove it or name one of the predictor's modules: {children}",
                )
            if target is not model and all(target is not m for m in found):
                found.append(target)
    return found


def _indices(spec: str, path: str, file: str, field: str) -> list[int]:
    out: set[int] = set()
    try:
        for part in (p.strip() for p in spec.split(",")):
            if "-" in part:
                start, end = (int(v) for v in part.split("-"))
                out.update(range(start, end + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise RuntimeFailure(
            f"{path!r}: {{{spec}}} is neither * nor a list of indices and ranges",
            file=file,
            field=field,
            fix="write {*} or e.g. {0-3,5}",
        ) from None
    return sorted(out)


class UserDiTTrainer(base.Trainer):
    """The Wan trainer's loop and checkpoints around the user's own DiT class."""

    def _read_model_config(self, model_cfg: dict[str, Any], data_cfg: dict[str, Any]) -> None:
        args = self.args
        if args.lora_r is not None:
            raise RuntimeFailure(
                "LoRA is not offered for a user's own DiT by the bundled runtime",
                field="--lora-r",
                fix="drop the --lora-* flags (full training), or train LoRA with MindSpeed-MM",
            )
        predictor = require(model_cfg, "predictor", args.mm_model)
        if not isinstance(predictor, dict):
            raise RuntimeFailure(
                "predictor must be an object",
                file=args.mm_model,
                field="predictor",
                fix="see examples/<name>/model.json",
            )
        require(model_cfg, "predictor.model_id", args.mm_model)
        self.predictor_cfg = predictor
        self.dit_class = user_dit.load_dit_class(args.predictor_file, args.predictor_class)
        self.flow = FlowMatching(
            FlowConfig.from_diffusion(
                require(model_cfg, "diffusion", args.mm_model), args.mm_model, training=True
            )
        )
        self.online = not bool(model_cfg.get("load_video_features", True))
        self.fsdp2 = self._read_fsdp2()

    def _read_fsdp2(self) -> dict[str, Any] | None:
        path = self.args.fsdp2_config_path
        if not path:
            return None
        import yaml

        file = Path(path)
        if not file.is_file():
            raise RuntimeFailure(
                f"--fsdp2-config-path {file} not found",
                file=str(file),
                field="--fsdp2-config-path",
                fix="pass examples/<name>/fsdp2_config.yaml",
            )
        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise RuntimeFailure(
                f"{file} is not valid YAML: {exc}", file=str(file), fix="fix the YAML syntax"
            ) from exc
        if not isinstance(data, dict):
            raise RuntimeFailure(
                f"{file} must be a mapping", file=str(file), fix="see the guide's fsdp2_config.yaml"
            )
        return data

    def _build(self, loaded: ckpt.Loaded | None) -> torch.nn.Module:
        args = self.args
        cls = self.dit_class
        log0(self.rank, f"building {cls.__name__} from {args.predictor_file} ...")
        torch.manual_seed(args.seed)
        model = user_dit.build_dit(cls, self.predictor_cfg, args.mm_model)
        loose = user_dit.loose_keys(cls, self.predictor_cfg)
        if loose:
            log0(
                self.rank,
                f"note: predictor.{', predictor.'.join(loose)} reach {cls.__name__} only through **kwargs "
                "(a misspelt size there is ignored, as in MindSpeed-MM)",
            )
        if loaded is not None:
            self._log_loading(loaded)
            user_dit.load_weights(model, loaded.model, str(loaded.root))
        file = args.fsdp2_config_path or ""
        if self.fsdp2 is not None:
            self.units = resolve_paths(
                model, self.fsdp2.get("sub_modules_to_wrap"), file, "sub_modules_to_wrap"
            )
            recompute = resolve_paths(model, self.fsdp2.get("recompute_modules"), file, "recompute_modules")
            reentrant = bool(self.fsdp2.get("use_reentrant", True))
            others = sorted(set(self.fsdp2) - HONOURED)
            if others:
                log0(
                    self.rank,
                    f"fsdp2 config: {len(self.units)} FSDP2 units from sub_modules_to_wrap (sharded over every "
                    f"rank when there are several); not applied by the bundled runtime: {', '.join(others)}",
                )
        else:
            blocks = getattr(model, "blocks", None)
            if not isinstance(blocks, torch.nn.ModuleList) or not len(blocks):
                raise RuntimeFailure(
                    f"{cls.__name__} has no `blocks` ModuleList to shard as FSDP2 units",
                    file=args.predictor_file,
                    field="--fsdp2-config-path",
                    fix="pass --fsdp2-config-path with sub_modules_to_wrap naming the repeated layers "
                    "(e.g. predictor.layers.{*})",
                )
            self.units, recompute, reentrant = list(blocks), [], True
        if args.recompute_granularity == "full" and not recompute:
            recompute = list(self.units)
        if recompute:
            self._recompute(model, recompute, reentrant)
            log0(self.rank, f"activation checkpointing on {len(recompute)} modules")
        return model

    def _recompute(self, model: torch.nn.Module, modules: list[torch.nn.Module], reentrant: bool) -> None:
        """MindSpeed-MM's `set_recompute_modules_to_wrap`: torch's checkpoint_wrapper on the named modules
        (the state dict keeps its names: torch strips the wrapper's prefix)."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
        ids = {id(m) for m in modules}
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=impl),
            check_fn=lambda m: id(m) in ids,
        )
        # the FSDP2 units are now the wrappers around them
        wrappers = {
            id(m._checkpoint_wrapped_module): m
            for m in model.modules()
            if hasattr(m, "_checkpoint_wrapped_module")
        }
        self.units = [wrappers.get(id(u), u) for u in self.units]

    def _fsdp_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return list(self.units)

    def _check_shapes(self, latents: torch.Tensor, text: torch.Tensor) -> None:
        """Data and model must agree where the predictor block says how (the guide's key names)."""
        cfg = self.predictor_cfg
        problems = []
        channels = cfg.get("in_channels")
        if isinstance(channels, int) and (latents.ndim != 5 or latents.shape[1] != channels):
            problems.append(
                f"latents {tuple(latents.shape)} do not have predictor.in_channels={channels} channels"
            )
        patch = cfg.get("patch_size")
        if (
            latents.ndim == 5
            and isinstance(patch, list)
            and len(patch) == 3
            and all(isinstance(p, int) and p > 0 for p in patch)
            and any(s % p for s, p in zip(latents.shape[2:], patch, strict=True))
        ):
            problems.append(f"latent grid {tuple(latents.shape[2:])} is not divisible by patch_size {patch}")
        width = cfg.get("text_dim")
        if isinstance(width, int) and text.shape[-1] != width:
            problems.append(f"text features {tuple(text.shape)} do not have predictor.text_dim={width}")
        if problems:
            raise RuntimeFailure(
                "; ".join(problems),
                file=self.args.mm_model,
                field="predictor",
                fix="size the predictor like the VAE/text encoder the features came from (in_channels = VAE "
                "z_dim, text_dim = text encoder width), or re-extract features",
            )
        self.checked = True

    def _predict(
        self, x_t: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        """The user's forward; its first call failing, or returning anything but a tensor of the latents' shape,
        is the user's to fix (not a traceback, not a broadcast)."""
        first = not getattr(self, "forwarded", False)
        name = self.dit_class.__name__
        fix = (
            "the DiT is called as forward(hidden_states [B,C,T,H,W], timestep [B], encoder_hidden_states [B,L,D]) "
            "and must return a tensor of hidden_states' shape; check model.json's predictor sizes against the features"
        )
        try:
            prediction = super()._predict(x_t, timestep, text, target)
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            if not first or isinstance(exc, RuntimeFailure):
                raise
            raise RuntimeFailure(
                f"{name}.forward failed on the first batch (latents {tuple(x_t.shape)}, text "
                f"{tuple(text.shape)}): {type(exc).__name__}: {exc}",
                file=self.args.predictor_file,
                field="forward",
                fix=fix,
            ) from exc
        if first:
            got = (
                tuple(prediction.shape) if isinstance(prediction, torch.Tensor) else type(prediction).__name__
            )
            if got != tuple(target.shape):
                raise RuntimeFailure(
                    f"{name}.forward returned {got} for latents {tuple(x_t.shape)}: the flow-matching target has "
                    "the latents' shape",
                    file=self.args.predictor_file,
                    field="forward",
                    fix=fix,
                )
            self.forwarded = True
        return prediction


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """runtime.train's checks over this entry's flags (what a rendered job's launch line must pass)."""
    return base.parse_args(argv, build_parser())


def main(argv: list[str] | None = None) -> int:
    return base.main(argv, trainer=UserDiTTrainer, parser=build_parser())


if __name__ == "__main__":
    run_main(main)
