"""Declarative key-mapping tables, one YAML file per converter under `convert/mappings/<Converter>.yaml`.

Knowledge as data: a table holds exact renames, ordered substring replacements (MindSpeed-MM's
`hf_to_mm_convert_mapping` / `hf_to_mm_str_replace_mapping` semantics), drop patterns with the reason, the
layer-key prefix used for PP splits, the pre-/post-process names that live on the first/last stage, the
TP rule and named transforms (ops.py) for tensors that are merged or split. The table is validated when
loaded so a bad entry fails before any tensor is touched; names are checked to round-trip (`mm_to_hf` of
`hf_to_mm` is the identity) on the real key set before converting. No torch here: the planner uses it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from mm_agent.convert.shapes import ShapeTable
from mm_agent.errors import MMAgentError
from mm_agent.registry import read_yaml, validation_error

MAPPINGS_DIR = Path(__file__).with_name("mappings")
DEVIATIONS_STEM = "upstream_deviations"  # mappings/upstream_deviations.yaml is not a table (deviations.py)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Drop(_Strict):
    contains: str = Field(description="keys containing this substring are not converted")
    reason: str = Field(description="why, reported per dropped key")


class TPRule(_Strict):
    max: int | None = Field(default=None, ge=1, description="largest tp the converter supports; None = any")
    reason: str | None = Field(default=None, description="why tp is limited (shown in the error)")


class Transform(_Strict):
    """Tensors that are not a plain rename: `op` (a function name in ops.py) builds the MM tensor `mm`
    from the HF tensors `hf` (in the op's argument order) and its inverse splits it back. `*` stands for
    a layer index."""

    op: str
    mm: str
    hf: list[str] = Field(min_length=1)
    args: dict[str, int | str | list[int]] = Field(default_factory=dict)
    tp_dim: int | None = Field(
        default=None,
        ge=0,
        le=1,
        description="dim of the MM tensor split across TP ranks (0: column-parallel, 1: row-parallel); "
        "None: every rank holds it whole",
    )

    upstream_step: int | None = Field(
        default=None,
        ge=0,
        description="index in the table's `upstream_ops` of the MindSpeed-MM operator that puts this tensor's "
        "key in its state dict (which fixes where the key sits in the rank files)",
    )

    @model_validator(mode="after")
    def _wildcards(self) -> Transform:
        count = self.mm.count("*")
        bad = [h for h in self.hf if h.count("*") != count]
        if bad:
            raise ValueError(f"wildcard count mismatch: mm {self.mm!r} has {count}, hf {bad} differ")
        return self


class Modality(_Strict):
    """A part of a multi-modal model split across pipeline stages on its own (VLM: the ViT, the LLM), as
    MindSpeed-MM's `PPStageSchema`: its layers by its own counts, its first/last names on the first/last
    stage that holds any of its layers."""

    name: str
    layer_prefix: str = Field(description="MM keys `<prefix>N.` carry layer N")
    num_layers: str = Field(description="config field with its layer count, e.g. vision.depth")
    pp_field: Literal["pp_layers", "vit_pp_layers"] = Field(description="request field with its split")
    first: list[str] = Field(description="MM name prefixes kept on its first stage")
    last: list[str] = Field(description="MM name prefixes kept on its last stage")


class UpstreamOp(_Strict):
    """One operator of MindSpeed-MM's converter, in the order it runs. `merge` (a MergeOp: UpGateMergeOp,
    QKVMergeOp) pops its inputs and appends the merged key layer by layer; `rename` (a RenameOp) pops every
    key it renames and appends the new name, in the state dict's current order. Operators that change values
    in place (RelocateOp) move no key and need no entry."""

    kind: Literal["merge", "rename"]
    op: str = Field(description="the upstream operator, for the reader")


class LoraRules(_Strict):
    """LoRA adapters of the model (MindSpeed-MM's `lora_hf_to_mm_str_replace_mapping` and
    `lora_target_modules`): the renames of an HF LoRA file's keys, and the modules merge_lora_to_base merges."""

    target_modules: list[str] = Field(min_length=1, description="substrings naming the adapted modules")
    replace: list[tuple[str, str]] = Field(
        default_factory=list, description="(HF substring, MM substring), applied in order to every key"
    )

    def hf_to_mm(self, name: str) -> str:
        """MindSpeed-MM's `replace_name`: every rule in order, each replacing all occurrences."""
        for hf, mm in self.replace:
            name = name.replace(hf, mm)
        return name


class Mapping(_Strict):
    converter: str
    description: str
    layer_prefix: str = Field(description="MM keys `<prefix>N.` carry layer N (split across PP stages)")
    num_layers_field: str = Field(description="config.json field holding the number of layers")
    exact: dict[str, str] = Field(default_factory=dict, description="HF name -> MM name, applied first")
    replace: list[tuple[str, str]] = Field(
        default_factory=list, description="(HF substring, MM substring), applied in order to other keys"
    )
    drop: list[Drop] = Field(default_factory=list)
    pre_process: list[str] = Field(default_factory=list, description="MM names kept on the first stage")
    post_process: list[str] = Field(default_factory=list, description="MM names kept on the last stage")
    tp: TPRule = TPRule()
    transforms: list[Transform] = Field(default_factory=list)
    modalities: list[Modality] = Field(
        default_factory=list, description="VLMs: parts split separately, in pipeline order (ViT first)"
    )
    hf_prefixes: list[tuple[str, str]] = Field(
        default_factory=list,
        description="(prefix in newer transformers names, prefix the table uses): both namings convert",
    )
    tie: tuple[str, str] | None = Field(
        default=None,
        description="(output layer, word embedding) MM names: with tie_word_embeddings they are one tensor",
    )
    upstream_ops: list[UpstreamOp] = Field(
        default_factory=list,
        description="VLMs: MindSpeed-MM's operator list in run order; each transform names its step, so rank "
        "files list tensors in MindSpeed-MM's order (vlm.upstream_order)",
    )
    lora: LoraRules | None = Field(
        default=None, description="LoRA adapters (lora_hf_to_mm, merge_lora_to_base)"
    )
    shapes: ShapeTable | None = Field(
        default=None,
        description="expected HF tensor shapes from config.json (convert/shapes.py): a transposed or "
        "reshaped tensor is refused before converting",
    )
    _inverse: dict[str, str] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: object, /) -> None:
        self._inverse.update({mm: hf for hf, mm in self.exact.items()})

    @field_validator("exact")
    @classmethod
    def _one_to_one(cls, value: dict[str, str]) -> dict[str, str]:
        targets = list(value.values())
        if len(set(targets)) != len(targets):
            dup = sorted({t for t in targets if targets.count(t) > 1})
            raise ValueError(f"exact renames map several HF names to {dup}")
        return value

    @field_validator("replace")
    @classmethod
    def _non_empty(cls, value: list[tuple[str, str]]) -> list[tuple[str, str]]:
        for hf, mm in value:
            if not hf or not mm:
                raise ValueError(f"replace entry ({hf!r}, {mm!r}) has an empty side")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Mapping:
        both = set(self.pre_process) & set(self.post_process)
        if both:
            raise ValueError(f"names in both pre_process and post_process: {sorted(both)}")
        if self.upstream_ops:
            self._check_steps()
        if self.shapes is not None and self.transforms:  # every HF tensor a transform reads has a shape
            missing = sorted({h for t in self.transforms for h in t.hf} - set(self.shapes.tensors))
            if missing:
                raise ValueError(f"shapes.tensors lacks {missing[:5]}")
        return self

    def _check_steps(self) -> None:
        """Every transform names an operator; a merge step is one MergeOp (one transform, several inputs), a
        rename step renames single tensors."""
        steps: dict[int, list[Transform]] = {}
        for t in self.transforms:
            if t.upstream_step is None or t.upstream_step >= len(self.upstream_ops):
                raise ValueError(
                    f"transform {t.mm!r}: upstream_step must index upstream_ops (got {t.upstream_step})"
                )
            steps.setdefault(t.upstream_step, []).append(t)
        for i, op in enumerate(self.upstream_ops):
            members = steps.get(i, [])
            if op.kind == "merge" and (len(members) != 1 or len(members[0].hf) < 2):
                raise ValueError(
                    f"upstream_ops[{i}] ({op.op}): a merge step is one transform with several hf inputs"
                )
            if op.kind == "rename" and any(len(t.hf) != 1 for t in members):
                raise ValueError(f"upstream_ops[{i}] ({op.op}): a rename step takes single-input transforms")

    def _dropped(self, name: str) -> Drop | None:
        return next((d for d in self.drop if d.contains in name), None)

    def hf_to_mm(self, name: str) -> str | Drop:
        """MM name of an HF key, or the Drop rule that removes it (exact renames win over drops)."""
        if name in self.exact:
            return self.exact[name]
        rule = self._dropped(name)
        if rule is not None:
            return rule
        for hf, mm in self.replace:
            name = name.replace(hf, mm)
        return name

    def mm_to_hf(self, name: str) -> str | Drop:
        """Inverse of `hf_to_mm`: exact renames reversed, replacements undone in reverse order."""
        if name in self._inverse:
            return self._inverse[name]
        rule = self._dropped(name)
        if rule is not None:
            return rule
        for hf, mm in reversed(self.replace):
            name = name.replace(mm, hf)
        return name

    def stage_role(self, mm_name: str) -> str:
        """'pre', 'post', 'layer' or 'other' (other keys cannot be placed when PP > 1)."""
        if mm_name in self.pre_process:
            return "pre"
        if mm_name in self.post_process:
            return "post"
        if (
            mm_name.startswith(self.layer_prefix)
            and mm_name[len(self.layer_prefix) :].split(".")[0].isdigit()
        ):
            return "layer"
        return "other"

    def check_tp(self, tp: int) -> None:
        if self.tp.max is not None and tp > self.tp.max:
            raise MMAgentError(
                f"tp={tp}: {self.tp.reason or f'{self.converter} supports tp <= {self.tp.max}'}",
                field="tp",
                fix=f"use tp {self.tp.max} (drop --tp); split the model across devices with pp_layers instead",
            )


@functools.cache
def load_mapping(converter: str, mappings_dir: Path = MAPPINGS_DIR) -> Mapping:
    """The validated table of a converter; a malformed file names the file and the field."""
    path = mappings_dir / f"{converter}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in mappings_dir.glob("*.yaml") if p.stem != DEVIATIONS_STEM))
        raise MMAgentError(
            f"no mapping table for {converter}",
            field="converter",
            fix=f"use one of {known}, or add mm_agent/convert/mappings/{converter}.yaml",
        )
    try:
        mapping = Mapping.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise validation_error(path, exc, schema="mm_agent/convert/mapping.py") from exc
    if mapping.converter != converter:
        raise MMAgentError(
            f"file declares converter {mapping.converter!r}",
            file=str(path),
            field="converter",
            fix=f"set converter: {converter} or rename the file",
        )
    return mapping


def map_names(mapping: Mapping, names: list[str], direction: str) -> tuple[dict[str, str], dict[str, Drop]]:
    """Map a whole key set (`direction` 'hf_to_mm' or 'mm_to_hf'): kept {source: target}, dropped.

    Refuses a key set the table cannot convert losslessly: two sources mapping to one target, or a name
    that does not map back to itself (a table error that would silently rename or overwrite weights).
    """
    forward, backward = (
        (mapping.hf_to_mm, mapping.mm_to_hf)
        if direction == "hf_to_mm"
        else (mapping.mm_to_hf, mapping.hf_to_mm)
    )
    kept: dict[str, str] = {}
    dropped: dict[str, Drop] = {}
    seen: dict[str, str] = {}
    for name in names:
        target = forward(name)
        if isinstance(target, Drop):
            dropped[name] = target
            continue
        if target in seen:
            raise MMAgentError(
                f"{seen[target]!r} and {name!r} both map to {target!r}",
                file=f"mm_agent/convert/mappings/{mapping.converter}.yaml",
                fix="the source holds keys the table does not expect; check the source is a "
                f"{mapping.description} checkpoint",
            )
        if backward(target) != name:
            raise MMAgentError(
                f"{name!r} -> {target!r} does not map back (gives {backward(target)!r})",
                file=f"mm_agent/convert/mappings/{mapping.converter}.yaml",
                fix="make the exact/replace rules of the table invertible for this key",
            )
        seen[target] = name
        kept[name] = target
    return _upstream_order(mapping, kept, direction), dropped


def _upstream_order(mapping: Mapping, kept: dict[str, str], direction: str) -> dict[str, str]:
    """MindSpeed-MM's key order: its `_replace_state_dict` pops every exactly renamed key and appends it in
    the order of its mapping (reversed for mm_to_hf, which flips the mapping), after the other keys in
    source order. Rank files then list tensors in MindSpeed-MM's order, so they pickle identically."""
    table = list(mapping.exact) if direction == "hf_to_mm" else list(reversed(mapping.exact.values()))
    renamed = set(table)
    order = [k for k in kept if k not in renamed] + [k for k in table if k in kept]
    return {k: kept[k] for k in order}
