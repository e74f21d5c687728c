"""Parallel-size rules: world size, batch sizes, head divisibility and pipeline layer splits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mm_agent.jobspec import split_layers
from mm_agent.validate.files import ConfigFile
from mm_agent.validate.job import Job, Launch, to_int
from mm_agent.validate.parse import join


@dataclass
class Sizes:
    tp: int | None
    pp: int | None
    vpp: int | None
    cp: int | None
    world: int | None
    mbs: int | None
    gbs: int | None


def sizes(launch: Launch) -> Sizes:
    lf = launch.cmd.launcher_flags
    nproc = next((to_int(lf[f][0]) for f in ("--nproc_per_node", "--nproc-per-node") if lf.get(f)), None)
    nnodes = to_int(lf["--nnodes"][0]) if lf.get("--nnodes") else None
    if nproc is None:
        nproc = to_int(launch.env("NPUS_PER_NODE"))
    if nnodes is None:
        nnodes = to_int(launch.env("NNODES"))
    world = nproc * nnodes if nproc and nnodes else to_int(launch.env("WORLD_SIZE"))
    return Sizes(
        tp=launch.int_flag("--tensor-model-parallel-size"),
        pp=launch.int_flag("--pipeline-model-parallel-size"),
        vpp=launch.int_flag("--virtual-pipeline-model-parallel-size"),
        cp=launch.int_flag("--context-parallel-size"),
        world=world,
        mbs=launch.int_flag("--micro-batch-size"),
        gbs=launch.int_flag("--global-batch-size", default=None),
    )


def balanced(total: int, stages: int) -> list[int]:
    """The split `render_job` writes (stock [7,8,8,7] shape), so suggestions match rendered jobs;
    empty for absurd stage counts."""
    if not 0 < stages <= 1024:
        return []
    return split_layers(total, stages)


def divisors(n: int) -> list[int]:
    if not 0 < n <= 10**12:
        return []
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def check(job: Job) -> None:
    for cfg in job.of_kind("sora_model", "vlm_model", "transformers_yaml"):
        for prefix, section, _ in _layer_lists(cfg):
            _sum(job, cfg, prefix, section)
    for launch in job.launches:
        if launch.entry == "trainer.py":
            continue
        s = sizes(launch)
        _world(job, launch, s)
        model = launch.configs.get("mm-model") or launch.configs.get("yaml")
        if model is not None and s.tp is not None and s.cp is not None:
            _heads(job, model, s)
        if model is not None and s.pp is not None and s.pp > 1:
            _pp_lists(job, model, s)


def _model_root(cfg: ConfigFile) -> tuple[str, Any]:
    if cfg.kind == "transformers_yaml":
        return "model", cfg.get("model")
    return "", cfg.data


def _layer_lists(cfg: ConfigFile) -> list[tuple[str, dict[str, Any], str]]:
    """(key path, section dict, role) for every section with pipeline_num_layers semantics."""
    prefix, root = _model_root(cfg)
    out: list[tuple[str, dict[str, Any], str]] = []
    if not isinstance(root, dict):
        return out
    for path, role in (
        ("predictor", "dit"),
        ("text_decoder", "llm"),
        ("image_encoder.vision_encoder", "vit"),
    ):
        node: Any = root
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            out.append((join(prefix, path), node, role))
    return out


def _ints(job: Job, cfg: ConfigFile, field: str, value: Any) -> list[Any] | None:
    """The list (flat or 2-D) if every entry is a non-negative int, else report keys.type."""
    flat = (
        [x for v in value for x in (v if isinstance(v, list) else [v])] if isinstance(value, list) else None
    )
    if flat is None or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in flat):
        job.sink.error(
            "keys.type",
            str(cfg.path),
            f"{field} must be a list of layer counts (ints >= 0), got {value!r}",
            f"write {field} as e.g. [7, 8, 8, 7] (one entry per pipeline stage)",
            field=field,
            line=cfg.line(field),
        )
        return None
    return list(value)


def _flat(value: list[Any]) -> list[int]:
    return [x for v in value for x in (v if isinstance(v, list) else [v])]


def _sum(job: Job, cfg: ConfigFile, prefix: str, section: dict[str, Any]) -> None:
    field = join(prefix, "pipeline_num_layers")
    if section.get("pipeline_num_layers") is None:  # null: no split, as the stock configs write at PP=1
        return
    layers = _ints(job, cfg, field, section["pipeline_num_layers"])
    total = to_int(section.get("num_layers"))
    if layers is None or total is None or sum(_flat(layers)) == total:
        return
    stages = len(layers)
    job.sink.error(
        "pp.layers_sum",
        str(cfg.path),
        f"{field} {layers} sums to {sum(_flat(layers))} but num_layers is "
        f"{total} ('ValueError: The sum of `pipeline_num_layers` must be equal to the `num_layers`')",
        f"make the entries sum to {total}, e.g. "
        f"{balanced(total, stages) if layers and not isinstance(layers[0], list) else '...'}"
        " (and convert the weights with the same pp_layers)",
        field=field,
        line=cfg.line(field),
    )


def _world(job: Job, launch: Launch, s: Sizes) -> None:
    if None in (s.world, s.tp, s.pp, s.cp) or not s.world:
        return
    assert s.world is not None and s.tp is not None and s.pp is not None and s.cp is not None
    model_size = s.tp * s.pp * s.cp
    if model_size <= 0:
        return
    if s.world % model_size:
        sized = [
            ("--tensor-model-parallel-size", "TP", s.tp),
            ("--pipeline-model-parallel-size", "PP", s.pp),
            ("--context-parallel-size", "CP", s.cp),
        ]
        flag, var, _ = next((x for x in sized if x[2] > 1), sized[0])
        file, field, line = launch.where(flag, var)
        job.sink.error(
            "parallel.world_size",
            file,
            f"world_size ({s.world}) is not divisible by {model_size} "
            f"(TP={s.tp} × PP={s.pp} × CP={s.cp}); Megatron raises 'RuntimeError: world_size ({s.world}) "
            "is not "
            f"divisible by {model_size}'",
            f"choose TP×PP×CP among the divisors of {s.world}: "
            f"{divisors(s.world)}, or change NPUS_PER_NODE×NNODES",
            field=field,
            line=line,
        )
        return
    dp = s.world // model_size
    if s.gbs is not None and s.mbs and s.gbs % (s.mbs * dp):
        file, field, line = launch.where("--global-batch-size", "GBS")
        step = s.mbs * dp
        job.sink.error(
            "parallel.gbs",
            file,
            f"global batch size ({s.gbs}) is not divisible by micro batch size ({s.mbs}) "
            f"times data parallel size ({dp})",
            f"set GBS to a multiple of {step} (GBS = MBS × GRAD_ACC_STEP × DP), "
            f"e.g. {max(1, s.gbs // step) * step}",
            field=field,
            line=line,
        )


def _heads(job: Job, cfg: ConfigFile, s: Sizes) -> None:
    assert s.tp is not None and s.cp is not None
    for prefix, section, role in _layer_lists(cfg):
        key = "num_heads" if role == "dit" else "num_attention_heads"
        heads = to_int(section.get(key))
        if heads is None:
            continue
        wan = role == "dit" and section.get("model_id") == "wandit"
        split, label = (s.cp, f"CP={s.cp}") if wan else (s.tp * s.cp, f"TP×CP={s.tp}×{s.cp}")
        if split and heads % split:
            field = join(prefix, key)
            ok = [d for d in divisors(heads) if d <= 16]
            job.sink.error(
                "parallel.heads_divisible",
                str(cfg.path),
                f"{field}={heads} is not divisible by {label}"
                + (" (Wan README: 'head 数量需要能够被CP整除')" if wan else ""),
                f"use {'CP' if wan else 'TP×CP'} in {ok} (divisors of {heads})",
                field=field,
                line=cfg.line(field),
            )
        groups = to_int(section.get("num_query_groups"))
        if role == "llm" and groups and s.tp and groups % s.tp:
            field = join(prefix, "num_query_groups")
            job.sink.error(
                "parallel.query_groups",
                str(cfg.path),
                f"TP={s.tp} does not divide num_query_groups={groups} "
                "(each tensor-parallel rank needs whole KV heads)",
                f"use TP in {divisors(groups)}",
                field=field,
                line=cfg.line(field),
            )


def _pp_lists(job: Job, cfg: ConfigFile, s: Sizes) -> None:
    assert s.pp is not None
    lists = {role: (prefix, sec) for prefix, sec, role in _layer_lists(cfg)}
    for role, (prefix, sec) in lists.items():
        field = join(prefix, "pipeline_num_layers")
        if sec.get("pipeline_num_layers") is None:
            job.sink.error(
                "pp.layers_missing",
                str(cfg.path),
                f"PP={s.pp} but {prefix} has no pipeline_num_layers "
                "('ValueError: The `pipeline_num_layers` must be specified in the config for pipeline "
                "parallel')",
                f"add {field} with {s.pp} entries summing to num_layers"
                + (f", e.g. {balanced(n, s.pp)}" if (n := to_int(sec.get("num_layers"))) else ""),
                field=prefix,
                line=cfg.line(prefix),
            )
            continue
        value = sec["pipeline_num_layers"]
        if not isinstance(value, list) or _ints(job, cfg, field, value) is None:
            continue
        nested = any(isinstance(v, list) for v in value)
        total = to_int(sec.get("num_layers")) or sum(_flat(value))
        if role == "dit" and (s.vpp or 1) > 1:
            vpp = s.vpp or 1
            if (
                not nested
                or len(value) != vpp
                or any(not isinstance(v, list) or len(v) != s.pp for v in value)
            ):
                job.sink.error(
                    "pp.vpp_shape",
                    str(cfg.path),
                    f"VPP={vpp}, PP={s.pp} needs {field} as {vpp} lists of {s.pp} entries, got {value}",
                    f"write e.g. {[balanced(total // vpp, s.pp)] * min(vpp, 8)} (total = num_layers)",
                    field=field,
                    line=cfg.line(field),
                )
            continue
        if nested:
            job.sink.warning(
                "pp.vpp_shape",
                str(cfg.path),
                f"{field} is a nested (VPP) list but VPP is off",
                f"use a flat list of {s.pp} entries, e.g. {balanced(total, s.pp)}",
                field=field,
                line=cfg.line(field),
            )
        elif len(value) != s.pp:
            job.sink.error(
                "pp.layers_count",
                str(cfg.path),
                f"PP={s.pp} but {field} has {len(value)} entries {value}",
                f"give one entry per stage, e.g. {balanced(total, s.pp)}, and convert the weights with "
                "the same "
                "pp_layers",
                field=field,
                line=cfg.line(field),
            )
    if "llm" in lists:
        _vlm_stages(job, cfg, s.pp, lists)


def _vlm_stages(job: Job, cfg: ConfigFile, pp: int, lists: dict[str, tuple[str, dict[str, Any]]]) -> None:
    llm = lists["llm"][1].get("pipeline_num_layers")
    vit = lists["vit"][1].get("pipeline_num_layers") if "vit" in lists else None
    if not isinstance(llm, list) or len(llm) != pp or not all(isinstance(x, int) for x in llm):
        return
    field = join(lists["llm"][0], "pipeline_num_layers")
    zero = [i for i, n in enumerate(llm) if n == 0]
    if zero:
        job.sink.error(
            "pp.zero_llm_stage",
            str(cfg.path),
            f"{field} {llm} gives stage(s) {zero} no LLM layers "
            "('AssertionError: learning_rate is None', MindSpeed-MM FAQ)",
            "give every stage at least one LLM layer, e.g. move one layer from a neighbour ([0,8,10,10] → "
            "[1,7,10,10])",
            field=field,
            line=cfg.line(field),
        )
    if isinstance(vit, list) and len(vit) == pp and all(isinstance(x, int) for x in vit):
        first_llm = next((i for i, n in enumerate(llm) if n > 0), pp)
        late = [i for i, n in enumerate(vit) if n > 0 and i > first_llm]
        if late:
            vfield = join(lists["vit"][0], "pipeline_num_layers")
            job.sink.error(
                "pp.vit_after_llm",
                str(cfg.path),
                f"{vfield} {vit} puts ViT layers in stage(s) {late}, after "
                f"stage {first_llm} already has LLM layers ({llm}); ViT layers must come first",
                f"move all ViT layers to the stages before the first LLM layers, e.g. "
                f"{[sum(vit)] + [0] * (pp - 1)}",
                field=vfield,
                line=cfg.line(vfield),
            )
