"""mm-agent's native converters against MindSpeed-MM's own: the same tiny models, bitwise-equal outputs.

Each case converts a tiny HF model or HF LoRA file (or resplits an earlier case's output, or merges a LoRA
checkpoint into it) with mm-agent
(`convert.engine.execute`) and with MindSpeed-MM's `checkpoint/` converter code of v26.0.0 and v26.1.0,
run in place, one version after the other, in one child process (`upstream_convert.py`, fed the
`mm-convert` argv of mm-agent's own plan). The output trees are compared file by file: the directory
layout, the tracker file, every rank file's top-level entries, per state dict (VPP chunk) the tensor
names, their order, dtypes, shapes, strides and bytes, and where all of those agree, the rank file itself
byte for byte (torch.save's zip, serialization id included). A difference (a MindSpeed-MM failure too)
fails unless `mm_agent/convert/mappings/upstream_deviations.yaml` declares it with its reason, and every
declared deviation must show up in some case, so the table holds exactly the differences there are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from test_convert_lora import lora_state, save_hf_lora, save_training_lora  # noqa: E402
from test_convert_qwen import build_model as build_qwen  # noqa: E402
from test_convert_wan import build as build_wan  # noqa: E402

from mm_agent.convert.deviations import Difference, load_deviations  # noqa: E402
from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.schema import ConvertRequest  # noqa: E402

VERSIONS = ("26.0.0", "26.1.0")
CHILD = Path(__file__).with_name("upstream_convert.py")
CKPT = "model_optim_rng.pt"
WAN, QWEN = "WanConverter", "Qwen2_5_VLConverter"


@dataclass(frozen=True)
class Case:
    id: str
    converter: str
    model: str  # key of the tiny model built for it
    tp: int = 1
    pp_layers: list[Any] | None = None
    vit_pp_layers: list[Any] | None = None
    method: str = "hf_to_mm"
    source: str | None = None  # resplit, merge: the case whose (mm-agent) output both converters read
    lora: str | None = None  # merge: a built LoRA checkpoint, or the case whose output is one
    lora_rank: int | None = None
    lora_alpha: int | None = None


def resplit_of(case: str) -> dict[str, str]:
    """A resplit of an earlier case's (mm-agent) output, which both converters read."""
    return {"method": "resplit", "source": case}


def merge_of(base: str, lora: str) -> dict[str, Any]:
    """merge_lora_to_base of an earlier case's output and a LoRA (rank 4, alpha 8: scaling 2)."""
    return {"method": "merge_lora_to_base", "source": base, "lora": lora, "lora_rank": 4, "lora_alpha": 8}


LORA_HF = {"method": "lora_hf_to_mm"}
# LoRA checkpoints with MindSpeed-MM's key names: an HF (DiffSynth) file, and LoRA training saves
LORA_MODELS = {
    "wan-t2v-lora-hf": lambda path: save_hf_lora(path, lora_state(hf=True)),
    "wan-t2v-lora-train": lambda path: save_training_lora(path, lora_state(), lora_r=4, lora_alpha=8),
    "wan-t2v-lora-train-pp2": lambda path: save_training_lora(path, lora_state(), pp_layers=[1, 3]),
}


CASES = [
    Case("wan-t2v-pp1", WAN, "wan-t2v"),
    Case("wan-t2v-pp2", WAN, "wan-t2v", pp_layers=[1, 3]),
    Case("wan-t2v-vpp2x2", WAN, "wan-t2v", pp_layers=[[1, 1], [1, 1]]),
    Case("wan-i2v-pp1", WAN, "wan-i2v"),
    Case("wan-i2v-pp2", WAN, "wan-i2v", pp_layers=[2, 2]),
    Case("wan-i2v-vpp2x2", WAN, "wan-i2v", pp_layers=[[1, 2], [0, 1]]),
    Case("wan-t2v-resplit-pp2-vpp", WAN, "wan-t2v", pp_layers=[[1, 1], [1, 1]], **resplit_of("wan-t2v-pp2")),
    Case("wan-t2v-resplit-vpp-pp2", WAN, "wan-t2v", pp_layers=[3, 1], **resplit_of("wan-t2v-vpp2x2")),
    Case("wan-t2v-resplit-vpp-pp1", WAN, "wan-t2v", **resplit_of("wan-t2v-vpp2x2")),
    Case("wan-i2v-resplit-pp1-pp2", WAN, "wan-i2v", pp_layers=[1, 3], **resplit_of("wan-i2v-pp1")),
    Case("wan-i2v-resplit-pp1-vpp", WAN, "wan-i2v", pp_layers=[[1, 1], [1, 1]], **resplit_of("wan-i2v-pp1")),
    Case("wan-t2v-lora-hf-to-mm-pp1", WAN, "wan-t2v-lora-hf", **LORA_HF),
    Case("wan-t2v-lora-hf-to-mm-pp2", WAN, "wan-t2v-lora-hf", pp_layers=[1, 3], **LORA_HF),
    Case("wan-t2v-lora-hf-to-mm-vpp2x2", WAN, "wan-t2v-lora-hf", pp_layers=[[1, 1], [1, 1]], **LORA_HF),
    Case("wan-t2v-merge-pp1", WAN, "wan-t2v", **merge_of("wan-t2v-pp1", "wan-t2v-lora-train")),
    Case(
        "wan-t2v-merge-pp1-to-pp2",
        WAN,
        "wan-t2v",
        pp_layers=[2, 2],
        **merge_of("wan-t2v-pp1", "wan-t2v-lora-train"),
    ),
    Case("wan-t2v-merge-hf-lora-pp1", WAN, "wan-t2v", **merge_of("wan-t2v-pp1", "wan-t2v-lora-hf-to-mm-pp1")),
    Case(
        "wan-t2v-merge-vpp2x2",
        WAN,
        "wan-t2v",
        pp_layers=[[1, 1], [1, 1]],
        **merge_of("wan-t2v-vpp2x2", "wan-t2v-lora-hf-to-mm-vpp2x2"),
    ),
    Case(
        "wan-t2v-merge-pp2",
        WAN,
        "wan-t2v",
        pp_layers=[1, 3],
        **merge_of("wan-t2v-pp2", "wan-t2v-lora-train-pp2"),
    ),
    Case("qwen-untied-tp1", QWEN, "qwen-untied", pp_layers=[4], vit_pp_layers=[2]),
    Case("qwen-untied-tp2", QWEN, "qwen-untied", tp=2, pp_layers=[4], vit_pp_layers=[2]),
    Case("qwen-untied-pp2", QWEN, "qwen-untied", pp_layers=[1, 3], vit_pp_layers=[2, 0]),
    Case("qwen-untied-tp2pp2", QWEN, "qwen-untied", tp=2, pp_layers=[1, 3], vit_pp_layers=[2, 0]),
    Case(
        "qwen-untied-vpp2x2", QWEN, "qwen-untied", pp_layers=[[1, 1], [1, 1]], vit_pp_layers=[[2, 0], [0, 0]]
    ),
    Case("qwen-tied-tp1", QWEN, "qwen-tied", pp_layers=[4], vit_pp_layers=[2]),
    Case("qwen-tied-tp2", QWEN, "qwen-tied", tp=2, pp_layers=[4], vit_pp_layers=[2]),
    Case("qwen-tied-pp2", QWEN, "qwen-tied", pp_layers=[2, 2], vit_pp_layers=[2, 0]),
    Case("qwen-tied-tp2pp2", QWEN, "qwen-tied", tp=2, pp_layers=[1, 3], vit_pp_layers=[1, 1]),
]


def _build(name: str, path: Path) -> Path:
    if name in LORA_MODELS:
        return LORA_MODELS[name](path)
    if name.startswith("wan-"):
        build_wan(name.removeprefix("wan-")).save_pretrained(path)
        return path
    return build_qwen(path, tie=name == "qwen-tied")


@dataclass
class Run:
    ours: dict[str, Path] = field(default_factory=dict)
    theirs: dict[tuple[str, str], Path] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def runs(mm_tree: Any, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Every case converted by mm-agent, then by each MindSpeed-MM version (all in one child process)."""
    base = tmp_path_factory.mktemp("converters")
    built = {c.model for c in CASES} | {c.lora for c in CASES if c.lora in LORA_MODELS}
    models = {name: _build(name, base / "hf" / name) for name in sorted(built)}
    run = Run()
    argvs: dict[str, list[str]] = {}
    for case in CASES:
        target = base / "ours" / case.id
        req = ConvertRequest(
            converter=case.converter,
            method=case.method,
            source=str(run.ours[case.source] if case.source else models[case.model]),
            target=str(target),
            tp=case.tp,
            pp_layers=case.pp_layers,
            vit_pp_layers=case.vit_pp_layers,
            lora_path=None if case.lora is None else str(run.ours.get(case.lora) or models[case.lora]),
            lora_rank=case.lora_rank,
            lora_alpha=case.lora_alpha,
            confirm=True,
        )
        report = execute(req)
        assert report.status == "converted", report.message
        run.ours[case.id] = target
        argvs[case.id] = report.plan.mm_convert_argv
    plan = []
    for version in VERSIONS:
        root = mm_tree.version_dir(version)
        assert root is not None and (root / "checkpoint").is_dir(), f"no MindSpeed-MM {version} tree"
        jobs = []
        for case in CASES:
            out = base / f"mm-{version}" / case.id
            ours = str(run.ours[case.id])
            jobs.append([str(out) if a == ours else a for a in argvs[case.id]])
            run.theirs[(version, case.id)] = out
        plan.append({"root": str(root), "cases": jobs})
    runs_file = base / "runs.json"
    runs_file.write_text(json.dumps(plan), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(runs_file)], capture_output=True, text=True, timeout=600, check=False
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    keys = [(v, c.id) for v in VERSIONS for c in CASES]
    assert proc.returncode == 0 and len(lines) == len(keys), proc.stderr[-4000:]
    for key, line in zip(keys, lines, strict=True):
        root = mm_tree.version_dir(key[0])
        assert line["checkpoint"] == str(root / "checkpoint" / "__init__.py"), (key, line["checkpoint"])
        if not line["ok"]:
            run.errors[key] = line["error"]
    return run


# ---------------------------------------------------------------------------------------------------------
# comparison


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _records(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _tensor_diffs(where: str, x: dict[str, Any], y: dict[str, Any]) -> tuple[list[Difference], int]:
    diffs = [Difference(kind="tensor_missing", file=where, name=n) for n in x if n not in y]
    diffs += [Difference(kind="tensor_extra", file=where, name=n) for n in y if n not in x]
    if [n for n in x if n in y] != [n for n in y if n in x]:
        diffs.append(Difference(kind="tensor_order", file=where, name=where.rsplit(":", 1)[1]))
    common = [n for n in x if n in y]
    for n in common:
        s, t = x[n], y[n]
        for kind, left, right in (
            ("tensor_dtype", s.dtype, t.dtype),
            ("tensor_shape", tuple(s.shape), tuple(t.shape)),
            ("tensor_stride", s.stride(), t.stride()),
        ):
            if left != right:
                diffs.append(Difference(kind=kind, file=where, name=n, detail=f"{left} vs {right}"))
        if (s.dtype, s.shape) == (t.dtype, t.shape):
            same = torch.equal(s.contiguous().view(torch.uint8), t.contiguous().view(torch.uint8))
            if not same:
                diffs.append(Difference(kind="tensor_bytes", file=where, name=n))
    return diffs, len(common)


def compare(theirs: Path, ours: Path) -> tuple[list[Difference], int]:
    """Every difference between MindSpeed-MM's and mm-agent's output trees; how many tensors were compared."""
    diffs: list[Difference] = []
    a, b = _files(theirs), _files(ours)
    diffs += [Difference(kind="file_missing", file=f, name=f) for f in sorted(a - b)]
    diffs += [Difference(kind="file_extra", file=f, name=f) for f in sorted(b - a)]
    tensors = 0
    for rel in sorted(a & b):
        if not rel.endswith(CKPT):
            if (theirs / rel).read_bytes() != (ours / rel).read_bytes():
                diffs.append(Difference(kind="file_bytes", file=rel, name=rel))
            continue
        up = torch.load(theirs / rel, map_location="cpu", weights_only=True)
        mine = torch.load(ours / rel, map_location="cpu", weights_only=True)
        found = [Difference(kind="entry_missing", file=rel, name=k) for k in up if k not in mine]
        found += [Difference(kind="entry_extra", file=rel, name=k) for k in mine if k not in up]
        if [k for k in up if k in mine] != [k for k in mine if k in up]:
            found.append(Difference(kind="entry_order", file=rel, name=rel))
        for key in (k for k in up if k in mine):
            x, y = up[key], mine[key]
            if isinstance(x, dict) and isinstance(y, dict):
                more, count = _tensor_diffs(f"{rel}:{key}", x, y)
                found += more
                tensors += count
            elif type(x) is not type(y) or x != y:
                found.append(Difference(kind="entry_value", file=rel, name=key, detail=f"{x!r} vs {y!r}"))
        if not found and (theirs / rel).read_bytes() != (ours / rel).read_bytes():
            # same tensors in the same order, so torch.save's zip must come out byte for byte: name the records
            ra, rb = _records(theirs / rel), _records(ours / rel)
            names = [n for n in ra if n not in rb or ra[n] != rb[n]] + [n for n in rb if n not in ra]
            found += [Difference(kind="pt_record", file=rel, name=n) for n in names or ["<zip layout>"]]
        diffs += found
    return diffs, tensors


@dataclass
class Compared:
    diffs: dict[tuple[str, str], list[Difference]]
    tensors: dict[tuple[str, str], int]


@pytest.fixture(scope="module")
def compared(runs: Run) -> Compared:
    out = Compared({}, {})
    for version in VERSIONS:
        for case in CASES:
            key = (version, case.id)
            error = runs.errors.get(key)
            if error is None:
                out.diffs[key], out.tensors[key] = compare(runs.theirs[key], runs.ours[case.id])
            else:  # MindSpeed-MM failed where mm-agent converted: a difference too, named by the exception
                last = error.strip().splitlines()[-1]
                name = last.split(":", 1)[0].rsplit(".", 1)[-1]
                out.diffs[key] = [Difference(kind="upstream_error", file="<run>", name=name, detail=error)]
                out.tensors[key] = 0
    return out


# ---------------------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bitwise_equal_to_mindspeed_mm(runs: Run, compared: Compared, case: Case, version: str) -> None:
    assert compared.tensors[(version, case.id)] > 0 or (version, case.id) in runs.errors
    table = load_deviations()
    undeclared = [d for d in compared.diffs[(version, case.id)] if table.allowing(case.converter, d) is None]
    assert not undeclared, (
        f"{len(undeclared)} difference(s) from MindSpeed-MM {version} that "
        "mm_agent/convert/mappings/upstream_deviations.yaml does not declare:\n"
        + "\n".join(str(d) for d in undeclared)
    )


def test_every_declared_deviation_occurs(compared: Compared) -> None:
    """The table holds exactly the differences there are: an entry no case shows is stale."""
    converter = {c.id: c.converter for c in CASES}
    used: set[tuple[str, str]] = set()
    table = load_deviations()
    for (_, case_id), diffs in compared.diffs.items():
        for diff in diffs:
            found = table.allowing(converter[case_id], diff)
            if found is not None:
                used.add((found.id, converter[case_id]))
    declared = {(d.id, c) for d in table.deviations for c in d.converters}
    assert declared <= used, f"declared but never seen (remove or fix them): {sorted(declared - used)}"
    assert len(compared.diffs) == len(VERSIONS) * len(CASES)
