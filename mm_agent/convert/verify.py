"""`--verify`: prove a native conversion exact after it ran, the way ms-swift's --test_convert_precision does,
but with exact criteria because every native transform is a lossless rename, merge or split.

Two checks:
* round trip: the result is converted back by the same engine into a temp dir next to the target and every
  tensor is compared with the source bitwise (same key set, dtype, shape and bytes). Tensors are read from
  memory-mapped files one at a time, so this costs a second copy of the checkpoint on disk (removed
  afterwards) but no host memory.
* forward: the model is built twice in fp32, from the HF weights and from the converted ones, and both run
  on the same seeded input; the outputs must be identical (max |diff| == 0). For Wan the second model takes
  its weights straight from the MM rank files, merged and renamed back by the converter's own inverse
  mapping (`mmio.load_merged` + `mapping.map_names`) and loaded with `strict=True`, so it does not depend on
  the mm_to_hf writer; for Qwen2.5-VL (Megatron's model cannot be built here) it is the transformers model
  loaded from the round-trip export. The models are built one after the other, so the peak is one fp32
  copy of the model: verification is for small and medium models and is refused when that does not fit in
  the available memory (the conversion itself stays valid; run it without --verify).

torch, diffusers and transformers are imported inside the functions: the engine imports this module lazily
and the MCP server never imports it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from mm_agent.convert.headers import read_header
from mm_agent.convert.layout import find_checkpoint
from mm_agent.convert.manifest import MANIFEST, read_manifest
from mm_agent.convert.mapping import load_mapping, map_names
from mm_agent.convert.native import read_hf_source
from mm_agent.convert.schema import ConvertReport, ConvertRequest, VerifyReport
from mm_agent.errors import MMAgentError

if TYPE_CHECKING:
    import torch

SEED = 1234
# interpreter, torch, diffusers/transformers and the activations of the tiny inputs
OVERHEAD_BYTES = 768 * 1024 * 1024
MAX_LISTED = 20  # mismatches listed in the report; the count is always complete


def verify_conversion(req: ConvertRequest, report: ConvertReport) -> VerifyReport:
    """Round trip bitwise plus, where a model can be built on this host, the fp32 forward comparison."""
    check = _CHECKS.get((req.converter, req.method))
    if check is None:
        return VerifyReport(ok=False, details=[f"not verified: no check for {req.converter}.{req.method}"])
    try:
        require_fit(req)
        return check(req, report)
    except MMAgentError as exc:
        return VerifyReport(ok=False, details=[f"not verified: {exc.render()}"])


def forward_bytes(req: ConvertRequest) -> int:
    """Anonymous memory the forward check needs: one fp32 copy of the model plus the runtime."""
    if req.method == "resplit":
        return 0  # bitwise comparison of memory-mapped tensors only
    hf_dir = Path(req.source if req.method == "hf_to_mm" else req.target)
    if hf_dir.is_dir() and any(hf_dir.glob("*.safetensors")):
        numel = 0
        for path in sorted(hf_dir.glob("*.safetensors")):
            numel += sum(_numel(t.shape) for t in read_header(path).tensors.values())
    else:  # mm_to_hf checked before the export exists: count the rank files' elements
        numel = _mm_numel(Path(req.source))
    return 4 * numel + OVERHEAD_BYTES


def require_fit(req: ConvertRequest) -> None:
    """Refuse verification the host cannot hold (call before converting to fail early)."""
    need = forward_bytes(req)
    free = psutil.virtual_memory().available
    if need > free:
        raise MMAgentError(
            f"verification builds the model in fp32 and needs about {need / 2**30:.1f} GiB of memory, "
            f"but {free / 2**30:.1f} GiB is available",
            field="verify",
            fix="convert without --verify (the conversion is exact by construction), or verify on a host "
            "with more memory",
        )


# ---------------------------------------------------------------------------------------------------------
# bitwise comparison


def _numel(shape: tuple[int, ...] | Any) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _mm_numel(root: Path) -> int:
    from mm_agent.convert.tensors import load_pt

    total = 0
    for path in find_checkpoint(root).files.values():
        for sd in _state_dicts(load_pt(path)).values():
            total += sum(t.numel() for t in sd.values())
    return total


class Diff:
    """Mismatches found, listed by name (first MAX_LISTED) and counted."""

    def __init__(self) -> None:
        self.compared = 0
        self.problems: list[str] = []

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def details(self, what: str) -> list[str]:
        lines = [f"{what}: {self.compared} tensors compared, {len(self.problems)} mismatch(es)"]
        lines += [f"  {p}" for p in self.problems[:MAX_LISTED]]
        if len(self.problems) > MAX_LISTED:
            lines.append(f"  ... and {len(self.problems) - MAX_LISTED} more")
        return lines


def compare_tensor(name: str, a: torch.Tensor, b: torch.Tensor, diff: Diff) -> None:
    """Bitwise: dtype, shape and raw bytes (torch.equal would call NaN != NaN and -0.0 == 0.0)."""
    import torch

    diff.compared += 1
    if a.dtype != b.dtype or a.shape != b.shape:
        diff.add(f"{name}: {a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}")
        return
    if a.numel() == 0:
        return
    raw_a = a.contiguous().reshape(-1).view(torch.uint8)
    raw_b = b.contiguous().reshape(-1).view(torch.uint8)
    if not torch.equal(raw_a, raw_b):
        worst = ""
        if a.is_floating_point():
            worst = f" (max |diff| {(a.float() - b.float()).abs().max().item():.3g})"
        diff.add(f"{name}: values differ{worst}")


def compare_keys(a: set[str], b: set[str], diff: Diff, other: str = "the round trip") -> None:
    for name in sorted(a - b):
        diff.add(f"{name}: in the source only")
    for name in sorted(b - a):
        diff.add(f"{name}: in {other} only")


def compare_hf(source: Path, back: Path, dropped: set[str]) -> Diff:
    """Two HF dirs (any sharding): same keys (less those the conversion dropped), same bytes."""
    from mm_agent.convert.tensors import SafetensorsFile

    diff = Diff()
    a, b = read_hf_source(source), read_hf_source(back)
    compare_keys(set(a.where) - dropped, set(b.where), diff)
    readers: dict[Path, SafetensorsFile] = {}

    def get(where: dict[str, Any], name: str) -> torch.Tensor:
        header, _ = where[name]
        if header.path not in readers:
            readers[header.path] = SafetensorsFile(header.path, header)
        return readers[header.path].get(name)

    for name in sorted(set(a.where) & set(b.where)):
        compare_tensor(name, get(a.where, name), get(b.where, name), diff)
    return diff


def _state_dicts(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`model` / `model0..N` state dicts of a rank file (optimizer state and args are not weights)."""
    return {k: v for k, v in obj.items() if isinstance(v, dict) and (k == "model" or k[5:].isdigit())}


def compare_mm(source: Path, back: Path, dropped: Callable[[str], bool]) -> Diff:
    """Two MM checkpoints: same rank files, same state dicts per file, same bytes per tensor."""
    from mm_agent.convert.tensors import load_pt

    diff = Diff()
    a, b = find_checkpoint(source), find_checkpoint(back)
    if set(a.files) != set(b.files):
        diff.add(f"rank files differ: {sorted(map(str, a.files))} vs {sorted(map(str, b.files))}")
        return diff
    for rank, path in sorted(a.files.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        rel = path.relative_to(a.root)
        sds_a, sds_b = _state_dicts(load_pt(path)), _state_dicts(load_pt(b.files[rank]))
        compare_keys({f"{rel}[{k}]" for k in sds_a}, {f"{rel}[{k}]" for k in sds_b}, diff)
        for key in sorted(set(sds_a) & set(sds_b)):
            sa = {f"{rel}[{key}] {k}": v for k, v in sds_a[key].items() if not dropped(k)}
            sb = {f"{rel}[{key}] {k}": v for k, v in sds_b[key].items()}
            compare_keys(set(sa), set(sb), diff)
            for name in sorted(set(sa) & set(sb)):
                compare_tensor(name, sa[name], sb[name], diff)
    return diff


# ---------------------------------------------------------------------------------------------------------
# round trips through the engine


@contextmanager
def _scratch_dir(target: Path) -> Iterator[Path]:
    """A temp dir beside the target (same file system, same workspace), always removed."""
    parent = target.resolve().parent
    path = Path(tempfile.mkdtemp(prefix=".mm-agent-verify-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _convert_back(req: ConvertRequest, **update: Any) -> None:
    from mm_agent.convert.engine import execute

    back = req.model_copy(update={"verify": False, "confirm": True, **update})
    report = execute(back)
    if report.status != "converted":
        raise MMAgentError(f"round trip {back.method} did not convert: {report.message}", field="verify")


def _dropped_hf(report: ConvertReport) -> set[str]:
    return {k.source for k in report.keys_dropped if k.target is None}


def _drop_rule(converter: str) -> Callable[[str], bool]:
    """Keys the converter drops by rule (e.g. `_extra_state`); none when it has no rename table."""
    try:
        drops = load_mapping(converter).drop
    except MMAgentError:
        drops = []
    return lambda name: any(d.contains in name for d in drops)


# ---------------------------------------------------------------------------------------------------------
# forward comparisons


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        raise MMAgentError(f"forward outputs have different shapes {tuple(a.shape)} vs {tuple(b.shape)}")
    return float((a.double() - b.double()).abs().max().item())


def _load_clean(cls: Any, path: Path, **kwargs: Any) -> Any:
    """`cls.from_pretrained` that fails on missing, unexpected or mismatched keys (the libraries only warn
    and initialise missing weights randomly, which would make any comparison meaningless)."""
    model, info = cls.from_pretrained(path, output_loading_info=True, **kwargs)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(kind):
            raise MMAgentError(f"{path} does not load cleanly: {kind} {list(info[kind])[:5]}", field="verify")
    # from_pretrained may leave fp32 weights as views of the mapped file at unaligned addresses, and CPU
    # kernels pick other code paths (other summation orders, ~1 ulp) for unaligned operands: give every
    # tensor its own allocation, as load_state_dict does for the other model, so both run the same kernels.
    for tensor in [*model.parameters(), *model.buffers()]:
        tensor.data = tensor.data.clone()
    return model


def _wan_inputs(config: Any) -> dict[str, Any]:
    """Small seeded inputs valid for any Wan variant: t2v, i2v (image_dim) and flf2v (pos_embed_seq_len)."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    pt, ph, pw = config.patch_size
    inputs: dict[str, Any] = {
        "hidden_states": torch.randn(1, config.in_channels, 2 * pt, 4 * ph, 4 * pw, generator=gen),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": torch.randn(1, 8, config.text_dim, generator=gen),
        "return_dict": False,
    }
    if config.image_dim is not None:
        # flf2v stacks first and last frame embeddings: (2, S/2, D) is viewed as (1, S, D) + pos_embed
        shape = (2, config.pos_embed_seq_len // 2) if config.pos_embed_seq_len else (1, 4)
        inputs["encoder_hidden_states_image"] = torch.randn(*shape, config.image_dim, generator=gen)
    return inputs


def wan_forward(hf_dir: Path, mm_dir: Path) -> tuple[float, list[str]]:
    """Max |diff| of WanTransformer3DModel from `hf_dir` vs the same model loaded from the MM checkpoint."""
    import torch
    from diffusers import WanTransformer3DModel

    from mm_agent.convert.mmio import load_merged

    details: list[str] = []
    reference = _load_clean(WanTransformer3DModel, hf_dir, torch_dtype=torch.float32)
    config = reference.config
    inputs = _wan_inputs(config)
    with torch.no_grad():
        expected = reference(**inputs)[0]
    del reference

    mapping = load_mapping("WanConverter")
    merged, split = load_merged(find_checkpoint(mm_dir), mapping.layer_prefix)
    kept, dropped = map_names(mapping, list(merged), "mm_to_hf")
    state = {hf: merged[mm] for mm, hf in kept.items()}
    model = WanTransformer3DModel.from_config(config)  # fp32, the default dtype
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise MMAgentError(
            f"the converted weights do not fit WanTransformer3DModel: {str(exc).splitlines()[0]}"
            + "".join(f"\n  {line.strip()}" for line in str(exc).splitlines()[1:6]),
            field="verify",
        ) from exc
    del merged, state
    details.append(
        f"forward: model from {mm_dir.name} ({split.describe()}, {len(kept)} tensors mapped back, "
        f"{len(dropped)} dropped) loaded strict=True"
    )
    with torch.no_grad():
        actual = model(**inputs)[0]
    return _max_diff(expected, actual), details


def _qwen_inputs(config: Any) -> tuple[dict[str, Any], str]:
    """Text plus one image (a 2x2 grid of merged tokens), so the ViT, the merger and the LLM all run; text
    only when the config's image token ids lie outside the vocabulary (tiny test configs)."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    special = [
        config.image_token_id,
        config.video_token_id,
        config.vision_start_token_id,
        config.vision_end_token_id,
    ]
    vocab = config.text_config.vocab_size
    text = torch.randint(0, min([*special, vocab]), (8,), generator=gen).tolist()
    if max(special) >= vocab:
        return {"input_ids": torch.tensor([text])}, "8 text tokens (image token ids are outside the vocab)"
    vision = config.vision_config
    merge = vision.spatial_merge_size
    grid = torch.tensor([[1, 2 * merge, 2 * merge]])
    patches = int(grid.prod())
    pixels = torch.randn(
        patches, vision.in_channels * vision.temporal_patch_size * vision.patch_size**2, generator=gen
    )
    ids = text[:4] + [config.vision_start_token_id] + [config.image_token_id] * (patches // merge**2)
    ids += [config.vision_end_token_id, *text[4:]]
    inputs = {"input_ids": torch.tensor([ids]), "pixel_values": pixels, "image_grid_thw": grid}
    return inputs, f"8 text tokens and one image of {patches} patches"


def qwen_forward(reference_dir: Path, converted_dir: Path) -> tuple[float, list[str]]:
    """Max |diff| of the logits of Qwen2_5_VLForConditionalGeneration loaded from the two dirs."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    outputs = []
    what = ""
    for path in (reference_dir, converted_dir):
        model = _load_clean(Qwen2_5_VLForConditionalGeneration, path, dtype=torch.float32)
        model.eval()
        inputs, what = _qwen_inputs(model.config)
        with torch.no_grad():
            outputs.append(model(**inputs).logits)
        del model
    detail = f"forward: transformers model from the source vs from the mm_to_hf export of the conversion, on {what}"
    return _max_diff(outputs[0], outputs[1]), [detail]


# ---------------------------------------------------------------------------------------------------------
# per converter and method


def _result(round_trip: Diff, what: str, max_diff: float | None, extra: list[str]) -> VerifyReport:
    bitwise = not round_trip.problems
    ok = bitwise and (max_diff is None or max_diff == 0.0)
    details = round_trip.details(what) + extra
    if max_diff is not None:
        details.append(
            f"forward fp32 max |diff| = {max_diff:.3g}" + ("" if max_diff == 0.0 else "  (must be 0)")
        )
    return VerifyReport(
        ok=ok, round_trip_bitwise=bitwise, max_abs_diff=max_diff, dtype="float32", details=details
    )


def _wan_hf_to_mm(req: ConvertRequest, report: ConvertReport) -> VerifyReport:
    source, target = Path(req.source), Path(req.target)
    with _scratch_dir(target) as tmp:
        _convert_back(
            req,
            method="mm_to_hf",
            source=str(target),
            target=str(tmp / "hf"),
            hf_dir=str(source),
            pp_layers=None,
        )
        diff = compare_hf(source, tmp / "hf", _dropped_hf(report))
    max_diff, extra = wan_forward(source, target)
    return _result(diff, "round trip hf_to_mm -> mm_to_hf", max_diff, extra)


def _back_to_mm(req: ConvertRequest) -> Diff:
    """mm_to_hf's round trip: the export converted back with the source's own split (which the export's
    manifest records, read from the rank files) must reproduce every rank file bitwise."""
    source, target = Path(req.source), Path(req.target)
    manifest = read_manifest(target)
    if manifest is None:
        raise MMAgentError(f"{target} has no {MANIFEST}", field="verify", fix="re-run the export")
    with _scratch_dir(target) as tmp:
        _convert_back(
            req,
            method="hf_to_mm",
            source=str(target),
            target=str(tmp / "mm"),
            hf_dir=None,
            tp=manifest.tp,
            pp_layers=manifest.pp_layers,
            vit_pp_layers=manifest.vit_pp_layers,
        )
        return compare_mm(source, tmp / "mm", _drop_rule(req.converter))


def _wan_mm_to_hf(req: ConvertRequest, report: ConvertReport) -> VerifyReport:
    diff = _back_to_mm(req)
    max_diff, extra = wan_forward(Path(req.target), Path(req.source))
    return _result(diff, "round trip mm_to_hf -> hf_to_mm", max_diff, extra)


def _wan_resplit(req: ConvertRequest, report: ConvertReport) -> VerifyReport:
    """Resplit only moves tensors between files: the merged state dicts must be identical."""
    from mm_agent.convert.mmio import load_merged

    prefix = load_mapping(req.converter).layer_prefix
    a, _ = load_merged(find_checkpoint(Path(req.source)), prefix)
    b, split = load_merged(find_checkpoint(Path(req.target)), prefix)
    diff = Diff()
    dropped = _drop_rule(req.converter)
    compare_keys({k for k in a if not dropped(k)}, set(b), diff, other="the target")
    for name in sorted(set(a) & set(b)):
        compare_tensor(name, a[name], b[name], diff)
    return _result(diff, f"merged source vs merged {split.describe()}", None, [])


def _qwen_hf_to_mm(req: ConvertRequest, report: ConvertReport) -> VerifyReport:
    source, target = Path(req.source), Path(req.target)
    with _scratch_dir(target) as tmp:
        _convert_back(req, method="mm_to_hf", source=str(target), target=str(tmp / "hf"), hf_dir=str(source))
        diff = compare_hf(source, tmp / "hf", _dropped_hf(report))
        max_diff, extra = qwen_forward(source, tmp / "hf")
    return _result(diff, "round trip hf_to_mm -> mm_to_hf", max_diff, extra)


def _qwen_mm_to_hf(req: ConvertRequest, report: ConvertReport) -> VerifyReport:
    diff = _back_to_mm(req)
    extra = ["forward: not run (the MM side is a Megatron model; the bitwise round trip covers it)"]
    return _result(diff, "round trip mm_to_hf -> hf_to_mm", None, extra)


_CHECKS: dict[tuple[str, str], Callable[[ConvertRequest, ConvertReport], VerifyReport]] = {
    ("WanConverter", "hf_to_mm"): _wan_hf_to_mm,
    ("WanConverter", "mm_to_hf"): _wan_mm_to_hf,
    ("WanConverter", "resplit"): _wan_resplit,
    ("Qwen2_5_VLConverter", "hf_to_mm"): _qwen_hf_to_mm,
    ("Qwen2_5_VLConverter", "mm_to_hf"): _qwen_mm_to_hf,
}
