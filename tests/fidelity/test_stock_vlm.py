"""Stock diff for the VLM / omni / FSDP2 / diffusers template sets: every job rendered with defaults equals
MindSpeed-MM's stock example of the same version, flag by flag, env var by env var, key by key, except
for user choices and declared deviations (`mm_agent/registry/data/deviations/<model>.yaml`).

Cases: every registry model x task x backend x size whose template is megatron_vlm, transformers_fsdp2,
fsdp2_native, accelerate_deepspeed or custom, at 26.0.0 and 26.1.0. The stock launcher of a size is the
task's `example_script` with the size in its name replaced by this size (`finetune_qwen2_5_vl_3b.sh` ->
`..._7b.sh`). Rendered configs are paired with stock configs the way the scripts name them: a rendered
file passed by flag, variable or position is compared with the file the stock script passes at the same
place, and a file named inside a config (the FSDP2 config of a train.yaml, the DeepSpeed config of an
accelerate config) with the file the stock config names at the same key. The `custom` template wraps the
stock launcher (`bash <example_script>`), so only what it adds is compared: the variables it exports that
the stock launcher does not set itself.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import runpy
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from mm_agent.registry import get_registry
from mm_agent.registry.deviations import deviations_for
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate.shell import parse_flags, parse_script
from tests.fidelity.conftest import MMTrees
from tests.fidelity.stockdiff import (
    ABSENT,
    Difference,
    _diff_flags,
    _norm,
    declared,
    diff_config,
    exported_env,
    registry_cases,
    undeclared,
)

SETS = ("megatron_vlm", "transformers_fsdp2", "fsdp2_native", "accelerate_deepspeed", "custom")
VERSIONS = ("26.0.0", "26.1.0")
JOBS = Path("/nonexistent-h4-stock-jobs")  # dry runs: nothing is written; only the paths inside the files
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
# The wrapper's own plumbing: launch.sh exports the layout and the job's paths for the stock launcher,
# which assigns its own values for what it uses; a name the stock launcher ignores changes nothing.
# accelerate launch settings that its config file holds and its command line overrides: compared as launcher flags
ACCELERATE_LAYOUT = (
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "mixed_precision",
)
CUSTOM_PLUMBING = {
    "NPUS_PER_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NNODES",
    "NODE_RANK",
    "WORLD_SIZE",
    "DISTRIBUTED_ARGS",
    "JOB_DIR",
    "LOAD_PATH",
    "SAVE_PATH",
    "DATASET_DIR",
    "DATASET_FILE",
}


CASES = registry_cases(SETS, VERSIONS)


@dataclass
class CaseResult:
    stock_script: str | None = None
    compared: list[tuple[str, str]] = field(default_factory=list)  # (rendered file, stock file)
    unpaired: list[str] = field(default_factory=list)  # rendered configs/scripts with no stock counterpart
    # stock configs that MindSpeed-MM's own reader (yaml.safe_load) rejects
    unreadable: list[str] = field(default_factory=list)
    diffs: list[Difference] = field(default_factory=list)


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: same documents, faster


def _loads(name: str, text: str) -> Any:
    return json.loads(text) if name.endswith(".json") else yaml.load(text, Loader=_YAML_LOADER)


@functools.lru_cache(maxsize=512)
def _load_cached(path: str) -> Any:
    return _loads(path, Path(path).read_text(encoding="utf-8"))


def _load(path: Path) -> Any:
    """A stock config, cached (every size and version of a model reads the same few files); never mutated."""
    return _load_cached(str(path))


def stock_script_for(tree: Path, example: str | None, size: str, sizes: list[str]) -> Path | None:
    """The stock launcher of `size`: the example script with the size in its name replaced by this one."""
    if not example:
        return None
    path = tree / example
    name = path.name
    for other in sorted(sizes, key=len, reverse=True):
        match = re.search(rf"(?<![0-9.]){re.escape(other)}(?![0-9a-z])", name, re.IGNORECASE)
        if match is None:
            continue
        if other == size:
            break
        pattern = name[: match.start()] + size + name[match.end() :]
        found = (
            [p for p in path.parent.glob("*") if p.name.lower() == pattern.lower()]
            if path.parent.is_dir()
            else []
        )
        return found[0] if found else None
    return path if path.is_file() else None


_HOSTFILE_LAYOUT = re.compile(r"^(MASTER_ADDR|NODE_ADDR|NODE_RANK|NNODES)=(?=.*(?:\$\(|`)).*$", re.MULTILINE)


_CONTINUED_PIPE = re.compile(r"\\\n\s*(?=\|)")
# `for para in $*; do ... done`: the diffusers launchers' argument overrides; with no arguments the body never runs
_ARG_LOOP = re.compile(r"^for \w+ in \$[*@]; do\n.*?^done\n", re.MULTILINE | re.DOTALL)
# `stdbuf -oL -eL torchrun ...` (the LTX-2 launchers): line buffering only; the static reader sees no launch behind it
_STDBUF = re.compile(r"^stdbuf(?: -[ioe]\S+)+ (?=torchrun )", re.MULTILINE)


def pin_hostfile_layout(text: str, nnodes: int) -> str:
    """Multi-node stock launchers read the layout from a hostfile at run time (`NNODES=$(cat $HOSTFILE |
    wc -l)`), which a static reader cannot know; every flag built from it (GBS via DP) would be unknown. The
    layout is the user's choice, so it is pinned to the registry's node count, rank 0, localhost. A line
    continuation before a pipe (`... nccl \\<newline> | tee`) is joined, as bash joins it (the static reader
    would keep the backslash as a word). A `stdbuf` wrapper before torchrun is dropped (it only sets buffering;
    mm_agent.validate.shell reads no launch behind it)."""
    values = {"MASTER_ADDR": "localhost", "NODE_ADDR": "localhost", "NODE_RANK": "0", "NNODES": str(nnodes)}
    text = _STDBUF.sub("", _ARG_LOOP.sub("", _CONTINUED_PIPE.sub(" ", text)))
    return _HOSTFILE_LAYOUT.sub(lambda m: f"{m.group(1)}={values[m.group(1)]}", text)


# the diffusers launchers write to `output_path=${cur_path}/logs` with `cur_path=$(pwd)`
_PWD = re.compile(r"\$\(pwd\)")
# `if [ x"${cur_path_last_dirname}" == x"test" ]; then cd ..; cur_path=$(pwd) ...`: run from a `test` folder only
_TEST_DIR_BRANCH = re.compile(
    r'^if \[ x"\$\{cur_path_last_dirname\}" == x"test" \]; then\n.*?^fi\n', re.M | re.S
)


def pin_stock_cwd(text: str) -> str:
    """The diffusers launchers build their output folder from `$(pwd)`, which a static reader cannot know: the
    `--output_dir=${output_path}` word would read as an unknown value of the switch before it. The folder it
    runs in is the user's, so it is pinned to a placeholder not named `test` (the branch for a `test` folder is
    dropped; the path itself is a user choice)."""
    return _PWD.sub("/stock-cwd", _TEST_DIR_BRANCH.sub("", text))


def _stock_path(tree: Path, value: Any, script: Path | None = None) -> Path | None:
    """A path as the stock example names it: relative to the MindSpeed-MM root its scripts run from (the
    diffusers launchers run from their examples/diffusers folder: the script's folder or its parent)."""
    if not isinstance(value, str) or not value or value.startswith("<"):
        return None
    if value.startswith("/"):
        return Path(value) if Path(value).is_file() else None
    bases = [tree, *((script.parent, script.parent.parent) if script is not None else ())]
    return next((b / value for b in bases if (b / value).is_file()), None)


def _rendered_name(job: Path, value: Any, files: dict[str, str]) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        rel = Path(value).resolve().relative_to(job).as_posix()
    except ValueError:
        return None
    return rel if rel in files else None


def _walk(doc: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _walk(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _walk(value, f"{prefix}.{i}" if prefix else str(i))
    else:
        yield prefix, doc


def _get(doc: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return ABSENT
    return doc


@dataclass
class Launch:
    """A launch command as the entry script sees it: for `pretrain_transformers.py <x>.yaml` the argv that
    MindSpeed-MM's own reader (mindspeed_mm/configs/read_yaml_config.py, run in place) builds from the yaml."""

    launcher: str
    entry: str
    launcher_flags: dict[str, list[str | None]]
    flags: dict[str, list[str | None]]
    positionals: list[str | None]


def _yaml_argv(tree: Path, yaml_path: Path) -> list[str]:
    reader = tree / "mindspeed_mm" / "configs" / "read_yaml_config.py"
    saved = sys.argv
    sys.argv = ["pretrain_transformers.py", str(yaml_path)]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(reader))
        return sys.argv[1:]
    finally:
        sys.argv = saved


def launches(tree: Path, path: str, text: str, yaml_text: dict[str, str] | None = None) -> list[Launch]:
    """The script's launch commands; a yaml-driven pretrain_transformers.py gets its flags from the yaml
    (`yaml_text`: the rendered job's files, which are not on disk in a dry run)."""
    out = []
    for cmd in parse_script(path, text).commands:
        flags, positionals = cmd.flags, cmd.positionals
        first = positionals[0] if positionals else None
        if (cmd.entry or "").endswith("pretrain_transformers.py") and first and first.endswith(".yaml"):
            yaml_file = Path(first) if first.startswith("/") else tree / first
            with tempfile.TemporaryDirectory() as tmp:
                if yaml_text is not None and Path(first).name in yaml_text:
                    staged = Path(tmp) / Path(first).name
                    staged.write_text(yaml_text[Path(first).name], encoding="utf-8")
                    argv = [first if a == str(staged) else a for a in _yaml_argv(tree, staged)]
                else:
                    argv = _yaml_argv(tree, yaml_file)
            parsed, _ = parse_flags(list(argv))
            flags = {**parsed, **{k: v for k, v in flags.items() if k not in parsed}}
            positionals = []
        # a flag given twice with one value (`--ckpt-format torch_dcp` in GPT_ARGS and OUTPUT_ARGS) is that value
        flags = {k: v[:1] if len(v) > 1 and len(set(v)) == 1 else v for k, v in flags.items()}
        # the same for the launcher (26.0.0's finetune_qwen3_5_27B.sh passes `--node_rank $NODE_RANK` twice)
        launcher_flags = {
            k: v[:1] if len(v) > 1 and len(set(v)) == 1 else v for k, v in cmd.launcher_flags.items()
        }
        config = (launcher_flags.get("--config_file") or [None])[0] if cmd.launcher == "accelerate" else None
        if config:
            # accelerate reads the layout from its config file unless the command line overrides it
            if yaml_text is not None:
                doc = yaml.safe_load(yaml_text.get(Path(config).name, "")) or {}
            else:
                found = _stock_path(tree, config, Path(path))
                doc = _load(found) if found is not None else {}
            for key in ACCELERATE_LAYOUT:
                if f"--{key}" not in launcher_flags and isinstance(doc, dict) and key in doc:
                    launcher_flags[f"--{key}"] = [str(doc[key])]
        out.append(Launch(cmd.launcher, cmd.entry or "", launcher_flags, flags, positionals))
    return out


@functools.lru_cache(maxsize=256)
def _stock_env(path: str, text: str) -> dict[str, str | None]:
    return exported_env(path, text)


@functools.lru_cache(maxsize=256)
def _stock_launches(tree: Path, path: str, text: str) -> list[Launch]:
    return launches(tree, path, text)


def _diff_env(rendered: dict[str, str | None], stock: dict[str, str | None], file: str) -> list[Difference]:
    """Exported variables, as stockdiff.diff_script compares them (values normalised by `_norm`)."""
    out = []
    for name in list(stock) + [n for n in rendered if n not in stock]:
        r = _norm(rendered[name]) if name in rendered else ABSENT
        st = _norm(stock[name]) if name in stock else ABSENT
        if r is ABSENT or st is ABSENT or r != st:
            out.append(Difference(file, name, r, st))
    return out


def _diff_launches(rendered: list[Launch], stock: list[Launch], file: str) -> list[Difference]:
    out: list[Difference] = []
    if len(rendered) != len(stock):
        out.append(Difference(file, "<launch>", [c.entry for c in rendered], [c.entry for c in stock]))
    for r, st in zip(rendered, stock, strict=False):
        if Path(r.entry).name != Path(st.entry).name:
            out.append(Difference(file, "<entry>", r.entry, st.entry))
        out += _diff_flags(r.launcher_flags, st.launcher_flags, file, f"{r.launcher} ")
        out += _diff_flags(r.flags, st.flags, file, "")
    return out


_REF = tuple[str, int, str, int]  # (kind: launcher|flag|pos, command index, flag, value index)


def _refs(cmds: list[Launch], job: Path, files: dict[str, str]) -> list[tuple[str, _REF]]:
    """(rendered file, where) for each rendered file a launch command names: by flag or position."""
    refs: list[tuple[str, _REF]] = []
    for n, cmd in enumerate(cmds):
        for kind, table in (("launcher", cmd.launcher_flags), ("flag", cmd.flags)):
            for flag, values in table.items():
                for i, value in enumerate(values):
                    target = _rendered_name(job, value, files)
                    if target:
                        refs.append((target, (kind, n, flag, i)))
        for i, value in enumerate(cmd.positionals):
            target = _rendered_name(job, value, files)
            if target:
                refs.append((target, ("pos", n, "", i)))
    return refs


def _at(cmds: list[Launch], where: _REF) -> str | None:
    kind, n, flag, i = where
    if n >= len(cmds):
        return None
    values = {"launcher": cmds[n].launcher_flags, "flag": cmds[n].flags}.get(kind, {}).get(flag)
    if kind == "pos":
        values = cmds[n].positionals
    return values[i] if values is not None and i < len(values) else None


# A size whose release has no inference/evaluation script of its own adapts this size's (README 推理 / 评测 of
# examples/qwen2.5vl: "根据实际情况修改examples/qwen2.5vl/inference_qwen2_5_vl_7b.json和...sh中的路径配置"): its
# rendered scripts are compared with that one, the size's own numbers declared as deviations.
ADAPTED_FROM = {"qwen2.5vl": "7b"}


def _companion_scripts(
    stock: Path, files: dict[str, str], *, size: str = "", model: str = ""
) -> dict[str, Path]:
    """Rendered scripts besides the launcher and their stock files (inference.sh -> inference_<...>.sh,
    evaluate.sh -> evaluate_<...>.sh; a size without its own takes the ADAPTED_FROM size's)."""
    out: dict[str, Path] = {}
    for rendered, prefix in (("inference.sh", "inference"), ("evaluate.sh", "evaluate")):
        if rendered not in files:
            continue
        name = re.sub(r"^(finetune|pretrain|train)", prefix, stock.name)
        candidate = stock.with_name(name)
        adapted = ADAPTED_FROM.get(model)
        if not candidate.is_file() and adapted and size:
            candidate = stock.with_name(re.sub(rf"(?<![0-9.]){re.escape(size)}(?![0-9a-z])", adapted, name))
        if candidate != stock and candidate.is_file():
            out[rendered] = candidate
    return out


def compare_case(trees: MMTrees, model: str, task: str, backend: str, size: str, version: str) -> CaseResult:
    reg = get_registry()
    entry = reg.get(model)
    spec = entry.task(task, backend)
    assert spec is not None
    tree = trees.version_dir(version)
    assert tree is not None, f"no MindSpeed-MM {version} tree"
    job = JOBS / "-".join((model, task, backend.replace("+", "_"), size, version))
    result_files = render_job(
        RenderRequest(
            model=model,
            task=task,  # type: ignore[arg-type]
            backend=backend,  # type: ignore[arg-type]
            size=size,
            mm_version=version,
            out_dir=str(job),
            mm_root=str(JOBS / "MindSpeed-MM"),
        )
    ).files
    files = {f.path: f.content or "" for f in result_files}
    res = CaseResult()
    stock = stock_script_for(tree, spec.example_script, size, [s.id for s in entry.sizes])
    launcher = next((n for n in ("finetune.sh", "train.sh", "launch.sh") if n in files), None)
    if stock is None or launcher is None:
        res.unpaired = sorted(p for p in files if p.endswith((".sh", *CONFIG_SUFFIXES)))
        return res
    res.stock_script = stock.relative_to(tree).as_posix()
    size_spec = entry.size(size)
    assert size_spec is not None
    nnodes = size_spec.parallel_at(version, task, backend).nnodes  # this version's stock layout
    stock_text = pin_hostfile_layout(stock.read_text(encoding="utf-8"), nnodes)
    if spec.template == "custom":
        # launch.sh runs the stock launcher: only the variables it exports and the stock one leaves alone count.
        res.compared.append((launcher, res.stock_script))
        stock_vars = set(parse_script(str(stock), stock_text).env) | set(exported_env(str(stock), stock_text))
        for name, value in exported_env(str(job / launcher), files[launcher]).items():
            if name not in stock_vars and name not in CUSTOM_PLUMBING:
                res.diffs.append(Difference(launcher, name, value, ABSENT))
        return res
    scripts = {launcher: stock, **_companion_scripts(stock, files, size=size, model=model)}
    # (rendered file, section) -> stock file; a yaml passed as --mm-data / --mm-model is read by MindSpeed-MM for
    # its `data` / `model` section only (read_yaml_config.py passes the yaml for both)
    pairs: dict[tuple[str, str], Path] = {}
    accelerate_configs: set[str] = set()
    yaml_files = {n: t for n, t in files.items() if n.endswith(".yaml")}
    for name, stock_file in scripts.items():
        res.compared.append((name, stock_file.relative_to(tree).as_posix()))
        s_text = pin_hostfile_layout(stock_file.read_text(encoding="utf-8"), nnodes)
        if spec.template == "accelerate_deepspeed":
            s_text = pin_stock_cwd(s_text)
        res.diffs += _diff_env(
            exported_env(str(job / name), files[name]), _stock_env(str(stock_file), s_text), name
        )
        r_cmds = launches(tree, str(job / name), files[name], yaml_files)
        s_cmds = _stock_launches(tree, str(stock_file), s_text)
        res.diffs += _diff_launches(r_cmds, s_cmds, name)
        for target, where in _refs(r_cmds, job, files):
            found = _stock_path(tree, _at(s_cmds, where), stock_file)
            if found is None or not target.endswith(CONFIG_SUFFIXES):
                continue
            section = (
                {"--mm-data": "data", "--mm-model": "model"}.get(where[2], "")
                if target.endswith(".yaml")
                else ""
            )
            if where[0] == "launcher" and where[2] == "--config_file":
                accelerate_configs.add(target)
            pairs.setdefault((target, section), found)
    stock_docs: dict[Path, Any] = {}
    for pair, stock_file in list(pairs.items()):
        try:
            stock_docs[stock_file] = _load(stock_file)
        except yaml.YAMLError:  # e.g. a duplicate anchor: the stock example itself does not load
            res.unreadable.append(stock_file.relative_to(tree).as_posix())
            del pairs[pair]
    queue = list(pairs)
    while queue:  # configs named inside configs (fsdp2_config_path, deepspeed_config_file, ...)
        name, section = queue.pop(0)
        rendered = _loads(name, files[name])
        stock_doc = stock_docs[pairs[(name, section)]]
        for key, value in _walk(rendered):
            inner = _rendered_name(job, value, files)
            if inner and inner.endswith(CONFIG_SUFFIXES) and not any(t == inner for t, _ in pairs):
                found = _stock_path(tree, _get(stock_doc, key), pairs[(name, section)])
                if found is not None and found.suffix in CONFIG_SUFFIXES:
                    pairs[(inner, "")] = found
                    stock_docs[found] = _load(found)
                    queue.append((inner, ""))
    for (name, section), stock_file in pairs.items():
        res.compared.append(
            (name + (f"#{section}" if section else ""), stock_file.relative_to(tree).as_posix())
        )
        rendered = _loads(name, files[name])
        stock_doc = stock_docs[stock_file]
        if section:
            rendered = rendered.get(section, ABSENT) if isinstance(rendered, dict) else ABSENT
            if isinstance(stock_doc, dict) and section in stock_doc and "gpt_args" in stock_doc:
                stock_doc = stock_doc[section]
        diffs = diff_config(rendered, stock_doc, name, section)
        if name in accelerate_configs:  # its launch settings were compared as the launcher's flags
            diffs = [d for d in diffs if d.key not in ACCELERATE_LAYOUT]
        res.diffs += diffs
    done = {n.split("#")[0] for n, _ in res.compared}
    res.unpaired = sorted(p for p in files if p.endswith((".sh", *CONFIG_SUFFIXES)) and p not in done)
    return res


@pytest.fixture(scope="module")
def results(mm_tree: MMTrees) -> dict[tuple[str, str, str, str, str], CaseResult]:
    return {case: compare_case(mm_tree, *case) for case in CASES}


def test_cases_cover_the_template_sets() -> None:
    reg = get_registry()
    templates = {reg.get(c[0]).task(c[1], c[2]).template for c in CASES}  # type: ignore[union-attr]
    assert templates == set(SETS)
    assert ("qwen2.5vl", "sft", "megatron", "7b", "26.0.0") in CASES


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_rendered_defaults_equal_stock(
    results: dict[tuple[str, str, str, str, str], CaseResult], case: tuple[str, str, str, str, str]
) -> None:
    model, task, backend, size, version = case
    res = results[case]
    left = undeclared(res.diffs, model=model, task=task, size=size, version=version, backend=backend)
    assert not left, (
        f"{model} {task} ({backend}) {size} at MindSpeed-MM {version} differs from the stock "
        f"{res.stock_script} without a declared reason (add the value to the template/registry, or a "
        f"deviation with its reason and upstream evidence to mm_agent/registry/data/deviations/{model}.yaml):\n"
        + "\n".join(f"  {d}" for d in left)
    )


def test_every_declared_deviation_is_used(results: dict[tuple[str, str, str, str, str], CaseResult]) -> None:
    """A deviation entry that matches no difference any more is stale: delete it. Checked for the models whose
    every task renders with these template sets (the others' files are judged by test_stock_generative.py)."""
    reg = get_registry()
    models = {c[0] for c in CASES if all(t.template in SETS for t in reg.get(c[0]).tasks)}
    used: set[tuple[str, int]] = set()
    for (model, task, backend, size, version), res in results.items():
        devs = deviations_for(model)
        for diff in res.diffs:
            hit = declared(diff, devs, model=model, task=task, size=size, version=version, backend=backend)
            if hit is not None:
                used.add((model, devs.index(hit)))
    stale = [
        f"{model}: {dev.file} {dev.key}"
        for model in sorted(models)
        for i, dev in enumerate(deviations_for(model))
        if (model, i) not in used and dev.task in (None, *{c[1] for c in CASES if c[0] == model})
    ]
    assert not stale, "declared deviations that match no difference (remove them):\n" + "\n".join(stale)


def test_qwen25vl_inference_image_exists_in_its_version(mm_tree: MMTrees) -> None:
    """The demo image inference_model.json names is the one the stock inference config of that version
    names (26.0.0 ships examples/qwen2vl/demo.jpeg; sources/images/demo/demo.jpeg came with 26.1.0)."""
    for version in VERSIONS:
        tree = mm_tree.version_dir(version)
        assert tree is not None
        stock = _load(tree / "examples/qwen2.5vl/inference_qwen2_5_vl_7b.json")
        out = render_job(
            RenderRequest(
                model="qwen2.5vl",
                task="sft",
                size="7b",
                mm_version=version,
                out_dir=str(JOBS / f"img-{version}"),
                mm_root=str(JOBS / "MindSpeed-MM"),
            )
        )
        rendered = json.loads(next(f.content for f in out.files if f.path == "inference_model.json") or "")
        assert rendered["image_path"] == str(JOBS / "MindSpeed-MM" / stock["image_path"]), version


# Keys where a Qwen2.5-VL inference/evaluation config rightly differs from the training job's model.json, and why
# (each as MindSpeed-MM's own stock inference and evaluation configs have it).
QWEN25VL_RUN_ONLY = {
    "model_id": "evaluate_model.json's top-level model_id names the pipeline (Qwen2VlPipeline), not the model",
    "text_decoder.parallel_output": "generation gathers the whole vocabulary's logits on every TP rank (stock: false)",
    "image_encoder.vision_encoder.llm_hidden_size": "not read by Qwen2VLViT (only InternVL's projector reads it)",
    "image_encoder.vision_encoder.model_id": "qwen2vit and qwen2_5_vit are the same class, Qwen2VLViT",
}


def _leaves(doc: Any) -> dict[str, Any]:
    return {k: v for k, v in _walk(doc) if k}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("size", ["3b", "7b", "32b", "72b"])
def test_qwen25vl_inference_and_evaluation_load_the_training_model(
    mm_tree: MMTrees, size: str, version: str
) -> None:
    """Every Qwen2.5-VL size renders inference.sh and evaluate.sh (3B and 32B, which MindSpeed-MM ships none for,
    adapted from the 7B's), and their model configs build the model the job trains: every key they share with the
    job's model.json is equal but for QWEN25VL_RUN_ONLY, the pipeline split included, so SAVE_PATH loads as saved;
    the scripts load SAVE_PATH and the configs name the original tokenizer and the benchmark."""
    tree = mm_tree.version_dir(version)
    assert tree is not None
    vision = (tree / "mindspeed_mm/models/vision/vision_model.py").read_text(encoding="utf-8")
    assert '"qwen2vit": Qwen2VLViT' in vision and '"qwen2_5_vit": Qwen2VLViT' in vision
    job = JOBS / f"load-{size}-{version}"
    out = render_job(
        RenderRequest(model="qwen2.5vl", task="sft", size=size, mm_version=version, out_dir=str(job))
    )
    files = {f.path: f.content or "" for f in out.files}
    assert {"inference.sh", "inference_model.json", "evaluate.sh", "evaluate_model.json"} <= set(files)
    train = _leaves(json.loads(files["model.json"]))
    for name in ("inference_model.json", "evaluate_model.json"):
        run = _leaves(json.loads(files[name]))
        shared = set(train) & set(run)
        assert {
            "text_decoder.num_layers",
            "text_decoder.pipeline_num_layers.0",
            "text_decoder.hidden_size",
        } <= shared
        differ = {k: (train[k], run[k]) for k in sorted(shared) if train[k] != run[k]}
        assert set(differ) <= set(QWEN25VL_RUN_ONLY), (name, differ)
        # the original Hugging Face folder (README 推理: tokenizer/from_pretrained), the processor training reads
        processor = json.loads(files["data.json"])["dataset_param"]["preprocess_parameters"][
            "model_name_or_path"
        ]
        assert run["tokenizer.from_pretrained"] == processor, name
    evaluate = json.loads(files["evaluate_model.json"])
    assert evaluate["evaluation_dataset"] == "ai2d_test" and evaluate["dataset_path"].endswith(
        "/AI2D_TEST.tsv"
    )
    assert (
        evaluate["evaluation_model"]
        in (tree / "mindspeed_mm/tasks/evaluation/eval_impl/__init__.py").read_text()
    )
    for script in ("inference.sh", "evaluate.sh"):
        (launch,) = launches(tree, str(job / script), files[script])
        assert launch.flags["--load"] == [str(job / "checkpoints")], script  # the job's SAVE_PATH
        assert launch.flags["--mm-model"] == [str(job / script.replace(".sh", "_model.json"))]


OLDER = ("2.1.0", "2.2.0", "2.3.0")  # releases before the ones the whole job is judged at
# What the deviations data cannot hold (its evidence is judged at 26.0.0/26.1.0 only): 2.1.0's evaluation config
# names the decoder's TP and PP (1 and 1, its script's); evaluate.sh reuses the training split, so the rendered
# config names that one (as the declared `*-parallel-size` deviation of the scripts).
OLDER_DECLARED = {
    ("2.1.0", "evaluate_model.json", "text_decoder.tensor_model_parallel_size"),
    ("2.1.0", "evaluate_model.json", "text_decoder.pipeline_model_parallel_size"),
}


@pytest.mark.parametrize("version", OLDER)
@pytest.mark.parametrize("size", ["3b", "7b", "32b", "72b"])
def test_qwen25vl_inference_and_evaluation_equal_stock_at_older_releases(
    mm_tree: MMTrees, size: str, version: str
) -> None:
    """The releases before 26.0.0 ship the same 7B/72B inference and evaluation scripts with small changes (2.1.0:
    no infer_fa, --variable-seq-lengths at PP 1, the decoder's layout in the evaluation config): the rendered ones
    equal them there too, but for declared deviations (the training side is judged at 26.0.0 and 26.1.0 only)."""
    if mm_tree.version_dir(version) is None:
        pytest.skip(f"no MindSpeed-MM {version} tree under {mm_tree.root}")
    res = compare_case(mm_tree, "qwen2.5vl", "sft", "megatron", size, version)
    stock = "72b" if size == "72b" else "7b"
    companions = {r: s for r, s in res.compared if r.startswith(("inference", "evaluate"))}
    assert companions == {
        "inference.sh": f"examples/qwen2.5vl/inference_qwen2_5_vl_{stock}.sh",
        "evaluate.sh": f"examples/qwen2.5vl/evaluate_qwen2_5_vl_{stock}.sh",
        "inference_model.json": f"examples/qwen2.5vl/inference_qwen2_5_vl_{stock}.json",
        "evaluate_model.json": f"examples/qwen2.5vl/evaluate_qwen2_5_vl_{stock}.json",
    }
    left = undeclared(
        res.diffs, model="qwen2.5vl", task="sft", size=size, version=version, backend="megatron"
    )
    left = [d for d in left if d.file in companions and (version, d.file, d.key) not in OLDER_DECLARED]
    assert not left, "\n".join(f"  {d}" for d in left)
    if version == "2.1.0":
        stock_eval = _load(mm_tree.version_dir(version) / companions["evaluate_model.json"])  # type: ignore[operator]
        assert stock_eval["text_decoder"]["pipeline_model_parallel_size"] == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_evaluation_benchmarks_are_mindspeed_mm_s(mm_tree: MMTrees, version: str) -> None:
    """Every task's `evaluation` (registry) names what that release's evaluate_vlm.py takes: the benchmark ids are
    keys of its eval_dataset_dict and eval_impl_dict, the model a key of eval_pipeline_dict, and each TSV's name and
    download link are the model README's (评测, 数据集准备)."""
    tree = mm_tree.version_dir(version)
    assert tree is not None
    evaluation = tree / "mindspeed_mm/tasks/evaluation"
    datasets = (evaluation / "eval_datasets/__init__.py").read_text(encoding="utf-8")
    impls = (evaluation / "eval_impl/__init__.py").read_text(encoding="utf-8")
    seen = 0
    for entry in get_registry().models.values():
        for task in entry.tasks:
            if task.evaluation is None or not task.versions.contains(version):
                continue
            seen += 1
            readme = (tree / entry.example_dir / "README.md").read_text(encoding="utf-8")
            assert f'"{task.evaluation.model}":' in impls.split("eval_pipeline_dict")[1], entry.id
            for bench in task.evaluation.benchmarks:
                assert (
                    f'"{bench.id}":' in datasets and f'"{bench.id}":' in impls.split("eval_pipeline_dict")[0]
                )
                assert f"[{bench.file.removesuffix('.tsv')}]({bench.url})" in readme, (entry.id, bench)
                assert f"`{bench.id}`" in readme, (entry.id, bench.id)
    assert seen, "no registry task has an evaluation"
