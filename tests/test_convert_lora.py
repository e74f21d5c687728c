"""Native WanConverter merge_lora_to_base and lora_hf_to_mm: plans, merged values, refusals, atomicity.

A tiny Wan (4 blocks, dim 16, ffn 32) converted with hf_to_mm is the base; LoRA checkpoints are built here with
MindSpeed-MM's key names (`blocks.N.self_attn.proj_q.lora_A.default.weight`, ...) in the layout a LoRA
training run saves (`iter_XXXXXXX/mp_rank_..`, with its `args`), and as an HF/DiffSynth safetensors file in
the original Wan naming (`blocks.N.self_attn.q.lora_A.default.weight`). tests/fidelity/test_converters.py
compares both methods bitwise with MindSpeed-MM's own.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from safetensors.torch import save_file  # noqa: E402
from test_convert_wan import build  # noqa: E402

from mm_agent.cli import main  # noqa: E402
from mm_agent.convert.atomic import SLOW_ENV, TEMP_TAG  # noqa: E402
from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.layout import TRACKER  # noqa: E402
from mm_agent.convert.manifest import MANIFEST, read_manifest  # noqa: E402
from mm_agent.convert.plan import plan_conversion  # noqa: E402
from mm_agent.convert.schema import ConvertReport, ConvertRequest  # noqa: E402
from mm_agent.errors import MMAgentError  # noqa: E402

LAYERS, DIM, FFN = 4, 16, 32
# MM module -> (out, in) of its weight, per block; the HF (original Wan) name in the DiffSynth file
MODULES = {
    **{f"{a}.proj_{p}": (DIM, DIM) for a in ("self_attn", "cross_attn") for p in ("q", "k", "v", "out")},
    "ffn.0": (FFN, DIM),
    "ffn.2": (DIM, FFN),
}
HF_NAMES = {"proj_q": "q", "proj_k": "k", "proj_v": "v", "proj_out": "o"}


def lora_state(rank: int = 4, seed: int = 1, layers: int = LAYERS, hf: bool = False) -> dict[str, Any]:
    """An adapter pair for every target module of every block (B non-zero, so merging changes the base)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(layers):
        for module, (rows, cols) in MODULES.items():
            name = module
            if hf and "." in module and module.split(".")[1] in HF_NAMES:
                attn, proj = module.split(".")
                name = f"{attn}.{HF_NAMES[proj]}"
            out[f"blocks.{i}.{name}.lora_A.default.weight"] = torch.randn(rank, cols, generator=gen)
            out[f"blocks.{i}.{name}.lora_B.default.weight"] = torch.randn(rows, rank, generator=gen)
    return out


def save_training_lora(
    root: Path, state: dict[str, Any], pp_layers: list[int] | None = None, iteration: int = 5, **args: Any
) -> Path:
    """A LoRA-only checkpoint as Megatron saves it: tracker = iteration, `{"model", "args", ...}` per rank."""
    stages = pp_layers or [LAYERS]
    first = 0
    for stage, count in enumerate(stages):
        part = {}
        for name, tensor in state.items():
            layer = int(name.split(".")[1])
            if first <= layer < first + count:
                part[f"blocks.{layer - first}." + name.split(".", 2)[2]] = tensor
        first += count
        rank_dir = "mp_rank_00" if len(stages) == 1 else f"mp_rank_00_{stage:03d}"
        path = root / f"iter_{iteration:07d}" / rank_dir / "model_optim_rng.pt"
        path.parent.mkdir(parents=True)
        obj = {
            "model": part,
            "iteration": iteration,
            "checkpoint_version": 3.0,
            "args": argparse.Namespace(**args),
        }
        torch.save(obj, path)
    (root / TRACKER).write_text(str(iteration))
    return root


def save_hf_lora(root: Path, state: dict[str, Any]) -> Path:
    root.mkdir(parents=True)
    save_file(state, str(root / "wan_lora.safetensors"))
    return root


def convert(method: str, source: Path, target: Path, **kw: Any) -> ConvertReport:
    req = ConvertRequest(
        converter="WanConverter", method=method, source=str(source), target=str(target), confirm=True, **kw
    )
    return execute(req)


def merged_weights(target: Path) -> dict[str, Any]:
    """All rank files of a PP/no-VPP target merged back to global names."""
    out: dict[str, Any] = {}
    files = sorted((target / "release").glob("*/model_optim_rng.pt"))
    first = 0
    for path in files:
        sd = torch.load(path, map_location="cpu", weights_only=True)["model"]
        layers = {int(n.split(".")[1]) for n in sd if n.startswith("blocks.")}
        for name, tensor in sd.items():
            if name.startswith("blocks."):
                _, i, rest = name.split(".", 2)
                name = f"blocks.{int(i) + first}.{rest}"
            out[name] = tensor
        first += len(layers)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny t2v Wan in MM layout (PP=1), via hf_to_mm."""
    root = tmp_path_factory.mktemp("base")
    build("t2v").save_pretrained(root / "hf")
    assert convert("hf_to_mm", root / "hf", root / "mm").status == "converted"
    return root / "mm"


def refused(req: dict[str, Any], tmp_path: Path, *, dry: bool = False) -> MMAgentError:
    request = ConvertRequest(
        converter="WanConverter", method="merge_lora_to_base", target=str(tmp_path / "out"), **req
    )
    with pytest.raises(MMAgentError) as err:
        plan_conversion(request) if dry else execute(request.model_copy(update={"confirm": True}))
    assert err.value.field and err.value.fix, err.value.render()
    assert not (tmp_path / "out" / TRACKER).exists()
    return err.value


# ---------------------------------------------------------------------------------------------------------
# plans


def test_dry_run_plans_the_merge(base: Path, tmp_path: Path) -> None:
    lora = save_training_lora(tmp_path / "lora", lora_state(rank=4), lora_r=4, lora_alpha=8)
    req = ConvertRequest(
        converter="WanConverter",
        method="merge_lora_to_base",
        source=str(base),
        lora_path=str(lora),
        target=str(tmp_path / "out"),
        lora_rank=4,
        lora_alpha=8,
        pp_layers=[1, 3],
    )
    plan = plan_conversion(req)
    assert plan.native and [f.path for f in plan.layout] == [
        "release/mp_rank_00_000/model_optim_rng.pt",
        "release/mp_rank_00_001/model_optim_rng.pt",
    ]
    argv = plan.mm_convert_argv
    assert argv[:3] == ["mm-convert", "WanConverter", "merge_lora_to_base"]
    assert argv[argv.index("--cfg.lora_path") + 1] == str(lora)
    assert argv[argv.index("--lora_rank") + 1] == "4" and argv[argv.index("--lora_alpha") + 1] == "8"
    assert argv[argv.index("--cfg.target_parallel_config.pp_layers") + 1] == "[1,3]"
    assert any("8 / 4" in n for n in plan.notes)
    assert not (tmp_path / "out").exists()
    defaults = plan_conversion(req.model_copy(update={"lora_rank": None, "lora_alpha": None}))
    argv = defaults.mm_convert_argv
    assert argv[argv.index("--lora_rank") + 1] == "8" and argv[argv.index("--lora_alpha") + 1] == "16"


def test_dry_run_plans_lora_hf_to_mm(tmp_path: Path) -> None:
    src = save_hf_lora(tmp_path / "hf", lora_state(hf=True))
    req = ConvertRequest(
        converter="WanConverter",
        method="lora_hf_to_mm",
        source=str(src),
        target=str(tmp_path / "out"),
        pp_layers=[2, 2],
    )
    plan = plan_conversion(req)
    assert [f.keys for f in plan.layout] == [2 * 2 * len(MODULES)] * 2
    assert plan.mm_convert_argv[2] == "lora_hf_to_mm" and "--cfg.lora_path" not in plan.mm_convert_argv
    assert not (tmp_path / "out").exists()


def test_lora_fields_belong_to_merge_only(base: Path, tmp_path: Path) -> None:
    req = ConvertRequest(
        converter="WanConverter", method="resplit", source=str(base), target=str(tmp_path / "o"), lora_rank=4
    )
    with pytest.raises(MMAgentError) as err:
        plan_conversion(req)
    assert err.value.field == "lora_rank"


# ---------------------------------------------------------------------------------------------------------
# conversions


@pytest.mark.parametrize("pp_layers", [None, [1, 3]], ids=["pp1", "pp2"])
def test_merge_adds_scaled_b_at_a(base: Path, tmp_path: Path, pp_layers: list[int] | None) -> None:
    state = lora_state(rank=4)
    lora = save_training_lora(tmp_path / "lora", state, lora_r=4, lora_alpha=8)
    report = convert("merge_lora_to_base", base, tmp_path / "out", lora_path=str(lora), lora_rank=4, lora_alpha=8,
                     pp_layers=pp_layers)  # fmt: skip
    assert report.status == "converted", report.message
    before, after = merged_weights(base), merged_weights(tmp_path / "out")
    assert set(after) == set(before)  # the order is MindSpeed-MM's (tests/fidelity/test_converters.py)
    changed = 0
    for name, weight in before.items():
        module = name.removesuffix(".weight")
        a = state.get(module + ".lora_A.default.weight")
        if a is None:
            assert torch.equal(after[name], weight), name
            continue
        expected = weight.clone().addmm_(state[module + ".lora_B.default.weight"], a, alpha=2.0)
        assert torch.equal(after[name], expected), name
        changed += 1
    assert changed == LAYERS * len(MODULES)
    manifest = read_manifest(tmp_path / "out")
    assert manifest is not None and (manifest.lora_rank, manifest.lora_alpha) == (4, 8)
    assert manifest.direction == "merge_lora_to_base"
    assert any("lora/iter_0000005/" in k for k in manifest.source_files)


def test_lora_hf_to_mm_then_merge_equals_the_training_form(base: Path, tmp_path: Path) -> None:
    """The DiffSynth file converted to MM names merges exactly like the same adapters saved by training."""
    save_hf_lora(tmp_path / "hf", lora_state(hf=True))
    report = convert("lora_hf_to_mm", tmp_path / "hf", tmp_path / "lora-mm")
    assert report.status == "converted" and report.keys_converted == 2 * LAYERS * len(MODULES)
    saved = torch.load(tmp_path / "lora-mm/release/mp_rank_00/model_optim_rng.pt", weights_only=True)["model"]
    assert set(saved) == set(lora_state())
    train = save_training_lora(tmp_path / "lora-train", lora_state())
    kw = {"lora_rank": 4, "lora_alpha": 4}
    convert("merge_lora_to_base", base, tmp_path / "a", lora_path=str(tmp_path / "lora-mm"), **kw)
    convert("merge_lora_to_base", base, tmp_path / "b", lora_path=str(train), **kw)
    a, b = merged_weights(tmp_path / "a"), merged_weights(tmp_path / "b")
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_rerun_is_a_no_op_and_other_settings_are_refused(base: Path, tmp_path: Path) -> None:
    lora = save_training_lora(tmp_path / "lora", lora_state(rank=4))
    kw: dict[str, Any] = {"lora_path": str(lora), "lora_rank": 4, "lora_alpha": 4}
    assert convert("merge_lora_to_base", base, tmp_path / "out", **kw).status == "converted"
    stamp = (tmp_path / "out" / MANIFEST).stat().st_mtime_ns
    assert convert("merge_lora_to_base", base, tmp_path / "out", **kw).status == "unchanged"
    assert (tmp_path / "out" / MANIFEST).stat().st_mtime_ns == stamp
    with pytest.raises(MMAgentError) as err:
        convert("merge_lora_to_base", base, tmp_path / "out", **{**kw, "lora_alpha": 8})
    assert err.value.field == "target" and "lora_alpha" in err.value.message


# ---------------------------------------------------------------------------------------------------------
# refusals: file, field and fix, nothing written


def test_rank_mismatch_is_refused(base: Path, tmp_path: Path) -> None:
    lora = save_training_lora(tmp_path / "lora", lora_state(rank=4))
    err = refused({"source": str(base), "lora_path": str(lora), "lora_rank": 8}, tmp_path)
    assert err.field == "lora_rank" and "--lora-rank 4" in (err.fix or "") and str(lora) in (err.file or "")


def test_rank_other_than_the_saved_args_is_refused(base: Path, tmp_path: Path) -> None:
    lora = save_training_lora(tmp_path / "lora", lora_state(rank=4), lora_r=4, lora_alpha=32)
    err = refused({"source": str(base), "lora_path": str(lora), "lora_rank": 4, "lora_alpha": 16}, tmp_path)
    assert err.field == "lora_alpha" and err.fix == "pass --lora-alpha 32" and err.file


def test_zero_rank_is_refused_in_the_plan(base: Path, tmp_path: Path) -> None:
    lora = save_training_lora(tmp_path / "lora", lora_state(rank=4))
    err = refused({"source": str(base), "lora_path": str(lora), "lora_rank": 0}, tmp_path, dry=True)
    assert err.field == "lora_rank" and err.file == str(lora)


def test_missing_target_key_is_refused(base: Path, tmp_path: Path) -> None:
    lora = save_training_lora(
        tmp_path / "lora", lora_state(rank=4, layers=LAYERS + 1), pp_layers=[LAYERS + 1]
    )
    err = refused({"source": str(base), "lora_path": str(lora), "lora_rank": 4}, tmp_path)
    assert err.field == "lora_path" and "blocks.4." in err.message and err.file


def test_half_adapter_is_refused(base: Path, tmp_path: Path) -> None:
    state = lora_state(rank=4)
    del state["blocks.2.ffn.0.lora_B.default.weight"]
    lora = save_training_lora(tmp_path / "lora", state)
    err = refused({"source": str(base), "lora_path": str(lora), "lora_rank": 4}, tmp_path)
    assert err.field == "lora_path" and "blocks.2.ffn.0.lora_B" in err.message


def test_base_and_lora_of_different_layouts_are_refused(base: Path, tmp_path: Path) -> None:
    lora = save_training_lora(tmp_path / "lora", lora_state(rank=4), pp_layers=[2, 2])
    err = refused({"source": str(base), "lora_path": str(lora), "lora_rank": 4}, tmp_path, dry=True)
    assert err.field == "lora_path" and "PP=2" in err.message and "PP=1" in err.message and err.file


def test_cli_refusal_names_field_and_fix_without_traceback(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lora = save_training_lora(tmp_path / "lora", lora_state(rank=4))
    argv = ["convert", "WanConverter", "merge_lora_to_base", "--source", str(base), "--lora", str(lora)]
    code = main([*argv, "--target", str(tmp_path / "out"), "--lora-rank", "0"])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code != 0 and "lora_rank" in text and "fix" in text.lower() and "Traceback" not in text
    assert main([*argv, "--target", str(tmp_path / "out"), "--lora-rank", "4"]) == 0
    assert "merge_lora_to_base" in capsys.readouterr().out and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------
# atomicity

KILL_SCRIPT = """
import sys
from mm_agent.convert.engine import execute
from mm_agent.convert.schema import ConvertRequest
execute(ConvertRequest(converter="WanConverter", method="merge_lora_to_base", source=sys.argv[1],
                       lora_path=sys.argv[2], target=sys.argv[3], lora_rank=4, pp_layers=[1, 1, 1, 1]))
"""


@pytest.mark.slow
def test_killed_merge_leaves_nothing_valid(base: Path, tmp_path: Path, started: Any) -> None:
    lora = save_training_lora(tmp_path / "lora", lora_state(rank=4))
    target = tmp_path / "out"
    env = {**os.environ, SLOW_ENV: "30"}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(base), str(lora), str(target)], env=env)
    started.append(proc)
    staged: list[Path] = []
    while not staged and proc.poll() is None:
        time.sleep(0.05)
        staged = list(tmp_path.glob(f"*{TEMP_TAG}*/release/*/model_optim_rng.pt"))
    assert proc.poll() is None, "the merge ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not target.exists()  # staged beside it; nothing renamed into place
    report = convert(
        "merge_lora_to_base", base, target, lora_path=str(lora), lora_rank=4, pp_layers=[1, 1, 1, 1]
    )
    assert report.status == "converted" and (target / TRACKER).is_file()
    assert not [p for p in tmp_path.iterdir() if TEMP_TAG in p.name]
