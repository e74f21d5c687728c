"""The Megatron checkpoint layout MindSpeed-MM's mm-convert writes (reference mindspeed-mm.md §2.3).

    <target>/latest_checkpointed_iteration.txt   "release" (no newline)
    <target>/release/mp_rank_{tp:02d}/model_optim_rng.pt          PP == 1
    <target>/release/mp_rank_{tp:02d}_{pp:03d}/model_optim_rng.pt PP > 1

A file holds `{"model": sd}`, or with VPP (nested `pp_layers`) `{"model0": sd, "model1": sd, ...,
"checkpoint_version": 3.0}`. Layers are split by cumulative counts and renumbered from 0 inside each stage
or chunk; with VPP the global layer order is chunk-major (`pp_layers[chunk][stage]`), as Megatron's
interleaved schedule and MindSpeed-MM's `_pp_vpp_split` lay them out. Pure Python: the MCP server plans
conversions with it without importing torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mm_agent.convert.schema import RankFile
from mm_agent.errors import MMAgentError

TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
CKPT_NAME = "model_optim_rng.pt"
CHECKPOINT_VERSION = 3.0
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")


def rank_dir(tp_rank: int, pp_rank: int | None) -> str:
    """`mp_rank_TT` (PP == 1, pp_rank None) or `mp_rank_TT_PPP`."""
    return f"mp_rank_{tp_rank:02d}" if pp_rank is None else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def rank_file(tp_rank: int, pp_rank: int | None, iteration: str = RELEASE) -> str:
    """Path of one rank file relative to the checkpoint dir."""
    return f"{iteration}/{rank_dir(tp_rank, pp_rank)}/{CKPT_NAME}"


@dataclass(frozen=True)
class Split:
    """A PP/VPP split: `counts[chunk][stage]` layers; `vpp` False for a flat `pp_layers` list.

    `[7, 8, 8, 7]` is PP=4 without VPP; `[[3, 4], [4, 4]]` is VPP=2 x PP=2 (files hold model0/model1);
    `[[30]]` is upstream's single-chunk VPP form (one file with `model0`).
    """

    counts: tuple[tuple[int, ...], ...]
    vpp: bool

    @property
    def pp(self) -> int:
        return len(self.counts[0])

    @property
    def chunks(self) -> int:
        return len(self.counts)

    @property
    def num_layers(self) -> int:
        return sum(sum(c) for c in self.counts)

    @property
    def pp_layers(self) -> list[int] | list[list[int]]:
        """The `pp_layers` value that produces this split (the manifest records it)."""
        if self.vpp:
            return [list(c) for c in self.counts]
        return list(self.counts[0])

    def model_keys(self) -> list[str]:
        """Keys of the state dicts in a rank file: `model`, or `model0..N` with VPP."""
        return [f"model{c}" for c in range(self.chunks)] if self.vpp else ["model"]

    def pp_rank(self, stage: int) -> int | None:
        """The `_PPP` suffix of a stage's dir: None when the layout has a single stage."""
        return stage if self.pp > 1 else None

    def first_layer(self, chunk: int, stage: int) -> int:
        """Global id of the first layer of (chunk, stage); chunk-major order."""
        flat = [n for c in self.counts for n in c]
        return sum(flat[: chunk * self.pp + stage])

    def layers(self, stage: int) -> list[list[int]]:
        """Global layer ids held by a stage, one list per chunk."""
        out = []
        for chunk in range(self.chunks):
            start = self.first_layer(chunk, stage)
            out.append(list(range(start, start + self.counts[chunk][stage])))
        return out

    def locate(self, layer: int) -> tuple[int, int, int]:
        """(stage, chunk, local id) of a global layer id."""
        for chunk in range(self.chunks):
            for stage in range(self.pp):
                start = self.first_layer(chunk, stage)
                if start <= layer < start + self.counts[chunk][stage]:
                    return stage, chunk, layer - start
        raise IndexError(f"layer {layer} is outside the split ({self.num_layers} layers)")

    def is_first(self, stage: int, chunk: int) -> bool:
        """Pre-process weights (embeddings) live on the first stage's first chunk."""
        return stage == 0 and chunk == 0

    def is_last(self, stage: int, chunk: int) -> bool:
        """Post-process weights (head) live on the last stage's last chunk."""
        return stage == self.pp - 1 and chunk == self.chunks - 1

    def describe(self) -> str:
        if self.vpp:
            return f"PP={self.pp} VPP={self.chunks} pp_layers={self.pp_layers}"
        return f"PP={self.pp} pp_layers={self.pp_layers}"


def parse_split(
    pp_layers: list[int] | list[list[int]] | None, num_layers: int, field: str = "pp_layers"
) -> Split:
    """Validate a `pp_layers` value against the model's layer count, with MindSpeed-MM's semantics.

    None/[] means no split. Errors name the field and the fix so a wrong split never reaches the writer
    (mm-convert would write it and training would fail later with shape or missing-key errors).
    """
    if not pp_layers:
        return Split(((num_layers,),), vpp=False)
    nested = [isinstance(v, list) for v in pp_layers]
    if any(nested) and not all(nested):
        raise MMAgentError(
            f"mixes numbers and lists: {pp_layers}",
            field=field,
            fix="use a flat list for PP ([7,8,8,7]) or a list of equal-length lists for VPP ([[3,4],[4,4]])",
        )
    rows: list[list[int]] = [list(v) for v in pp_layers] if all(nested) else [list(pp_layers)]  # type: ignore[arg-type]
    if any(len(r) != len(rows[0]) or not r for r in rows):
        raise MMAgentError(
            f"VPP chunks have different lengths: {pp_layers}",
            field=field,
            fix="give every VPP chunk one entry per pipeline stage, e.g. [[3,4,4,4],[3,4,4,4]]",
        )
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for r in rows for n in r):
        raise MMAgentError(
            f"layer counts must be non-negative integers: {pp_layers}",
            field=field,
            fix="list how many layers each stage holds, e.g. [7,8,8,7]",
        )
    split = Split(tuple(tuple(r) for r in rows), vpp=all(nested))
    if split.num_layers != num_layers:
        raise MMAgentError(
            f"sums to {split.num_layers} layers but the model has {num_layers}",
            field=field,
            fix=f"make the counts add up to {num_layers}, e.g. {even_split(num_layers, split.pp)}",
        )
    return split


def even_split(num_layers: int, pp: int) -> list[int]:
    """A balanced flat split, used in error fixes (earlier stages get the remainder last)."""
    base, extra = divmod(num_layers, pp)
    return [base + (1 if i >= pp - extra else 0) for i in range(pp)]


class LayerKeys:
    """Find and rewrite the layer index in keys like `blocks.12.ffn.0.weight` (prefix `blocks.`)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._pattern = re.compile(re.escape(prefix) + r"(\d+)(\..*)?$")

    def index(self, key: str) -> int | None:
        match = self._pattern.match(key)
        return int(match.group(1)) if match else None

    def renumber(self, key: str, new_index: int) -> str:
        match = self._pattern.match(key)
        if match is None:
            raise ValueError(f"{key!r} is not a {self.prefix}N key")
        return f"{self.prefix}{new_index}{match.group(2) or ''}"


@dataclass(frozen=True)
class MMCheckpoint:
    """A Megatron checkpoint dir found on disk: its iteration dir and rank files by (tp, pp)."""

    root: Path
    iteration: str
    files: dict[tuple[int, int | None], Path]

    @property
    def tp(self) -> int:
        return max(t for t, _ in self.files) + 1

    @property
    def pp(self) -> int:
        return max((p or 0) for _, p in self.files) + 1

    def stage_files(self, tp_rank: int = 0) -> list[Path]:
        """Rank files of one TP rank in pipeline order."""
        return [self.files[(tp_rank, p if self.pp > 1 else None)] for p in range(self.pp)]


def _rank_key(path: str) -> tuple[int, int | None]:
    match = _RANK_DIR.match(Path(path).parent.name)
    if match is None:
        raise ValueError(f"{path} is not a rank file path")
    return int(match.group(1)), int(match.group(2)) if match.group(2) is not None else None


def find_checkpoint(root: Path, field: str = "source", expected: list[str] | None = None) -> MMCheckpoint:
    """Read the tracker and list the rank files, checking that the (tp, pp) grid is complete.

    `expected` (rank file paths from the checkpoint's manifest) also catches missing trailing stages,
    which the dir names alone cannot show.
    """
    tracker = root / TRACKER
    if not root.is_dir():
        raise MMAgentError(
            f"{root} is not a directory", field=field, fix="pass an existing MM checkpoint dir"
        )
    if not tracker.is_file():
        raise MMAgentError(
            f"{root} has no {TRACKER}, so it is not a (complete) Megatron checkpoint",
            field=field,
            fix="pass the dir that holds latest_checkpointed_iteration.txt (the training --save dir or the "
            "hf_to_mm target)",
        )
    content = tracker.read_text(encoding="utf-8", errors="replace").strip()
    if content == RELEASE:
        iteration = RELEASE
    elif content.isdigit():
        iteration = f"iter_{int(content):07d}"
    else:
        raise MMAgentError(
            f"{tracker} holds {content[:40]!r}, neither 'release' nor an iteration number",
            field=field,
            fix="write `release` or the saved iteration into the tracker",
        )
    iter_dir = root / iteration
    files: dict[tuple[int, int | None], Path] = {}
    if iter_dir.is_dir():
        for sub in sorted(iter_dir.iterdir()):
            match = _RANK_DIR.match(sub.name)
            if match and (sub / CKPT_NAME).is_file():
                pp_rank = int(match.group(2)) if match.group(2) is not None else None
                files[(int(match.group(1)), pp_rank)] = sub / CKPT_NAME
    if not files:
        raise MMAgentError(
            f"{iter_dir} holds no mp_rank_*/{CKPT_NAME}",
            field=field,
            fix="re-run the conversion or point at the right checkpoint dir",
        )
    found = MMCheckpoint(root, iteration, files)
    staged = any(p is not None for _, p in files)
    want = {(t, p if staged else None) for t in range(found.tp) for p in range(found.pp)}
    want |= {_rank_key(path) for path in expected or []}
    missing = sorted(rank_dir(t, p) for t, p in want - set(files))
    if staged and found.pp == 1 and not missing:
        missing = [f"the stages after {rank_dir(0, 0)}"]  # PP == 1 layouts have no _PPP suffix
    if staged and any(p is None for _, p in files):
        missing = missing or ["nothing, but PP=1 and PP>1 dirs are mixed"]
    if missing:
        raise MMAgentError(
            f"{iter_dir} is incomplete: missing {', '.join(missing)}",
            field=field,
            fix="re-run the conversion; a partial checkpoint cannot be resplit or exported",
        )
    return found


def planned_files(split: Split | None, tp: int, layer_ids: bool = True) -> list[RankFile]:
    """The rank files a layout will write, before anything is read (a plan's `layout`): every TP rank x PP
    stage, with the stage's layer ids when `layer_ids` and the split knows them (a VLM's split is its LLM's,
    not the whole model's)."""
    split = split or Split(((0,),), vpp=False)
    return [
        RankFile(
            path=rank_file(t, split.pp_rank(stage)),
            tp_rank=t,
            pp_rank=split.pp_rank(stage),
            keys=0,
            bytes=0,
            layers=split.layers(stage) if layer_ids and split.num_layers else [],
        )
        for t in range(tp)
        for stage in range(split.pp)
    ]
