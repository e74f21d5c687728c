"""StepVideo sampling loads the job's own trained checkpoint: Megatron's checkpoint-argument check must pass.

A rendered StepVideo job's `inference.sh` loads `--load` = the save path of its `pretrain.sh`. Megatron's
`check_checkpoint_args` (core_v0.12.1 `megatron/training/checkpointing.py`, run here in place) asserts that the
saved run's `num_layers` (MindSpeed-MM takes it from `predictor.num_layers`) and `tensor_model_parallel_size`
equal the loading run's. The job's deviations from the stock inference example (training TP, 24 layers) exist
for this check; the stock inference values (TP=4, 48 layers) fail it against the job's checkpoint.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mm_agent.render import RenderRequest, render_job
from mm_agent.validate.shell import parse_script

CheckArgs = Callable[[Any, Any], None]


def _check_checkpoint_args(megatron: Path) -> CheckArgs:
    """Megatron's own `check_checkpoint_args`, executed from its source with `get_args` and
    `get_checkpoint_version` bound to the values given (the module itself imports the whole training stack)."""
    source = (megatron / "megatron/training/checkpointing.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check_checkpoint_args")

    def run(checkpoint_args: Any, args: Any) -> None:
        namespace: dict[str, Any] = {"get_args": lambda: args, "get_checkpoint_version": lambda: 3.0}
        exec(compile(ast.Module(body=[func], type_ignores=[]), "checkpointing.py", "exec"), namespace)
        namespace["check_checkpoint_args"](checkpoint_args)

    return run


def _run_args(script_path: Path, text: str, model: dict[str, Any]) -> SimpleNamespace:
    """The Megatron args of one launch that check_checkpoint_args compares (MindSpeed-MM's validate_args sets
    num_layers / num_attention_heads / hidden_size from the predictor config)."""
    cmd = parse_script(str(script_path), text).commands[0]
    pred = model["predictor"]
    return SimpleNamespace(
        num_layers=pred["num_layers"],
        hidden_size=pred["num_heads"] * pred["head_dim"],
        num_attention_heads=pred["num_heads"],
        add_position_embedding=True,
        vocab_file=None,
        data_parallel_random_init=False,
        use_dist_ckpt=cmd.value("--ckpt-format") not in (None, "torch"),
        tensor_model_parallel_size=int(cmd.value("--tensor-model-parallel-size") or 1),
        pipeline_model_parallel_size=int(cmd.value("--pipeline-model-parallel-size") or 1),
    )


@pytest.mark.parametrize("task", ["t2v", "i2v"])
def test_sampling_loads_the_trained_checkpoint(task: str, mm_tree: Any, tmp_path: Path) -> None:
    tree = mm_tree.version_dir("26.0.0")
    assert tree is not None
    patch = (tree / "mindspeed_mm/patchs/validate_args_patch.py").read_text(encoding="utf-8")
    assert "args.num_layers = safe_getattr(args.mm.model.predictor, 'num_layers'" in patch, (
        "MindSpeed-MM no longer takes num_layers from predictor.num_layers: revisit the StepVideo deviation "
        "inference_model.json predictor.num_layers"
    )
    check = _check_checkpoint_args(mm_tree.megatron_dir())
    result = render_job(
        RenderRequest(model="stepvideo", task=task, mm_version="26.0.0", out_dir=str(tmp_path / "job"))
    )
    job = Path(result.job_dir)
    files = {f.path: f.content or "" for f in result.files}
    train = _run_args(job / "pretrain.sh", files["pretrain.sh"], json.loads(files["pretrain_model.json"]))
    sample = _run_args(job / "inference.sh", files["inference.sh"], json.loads(files["inference_model.json"]))
    load = parse_script(str(job / "inference.sh"), files["inference.sh"]).commands[0].value("--load")
    save = parse_script(str(job / "pretrain.sh"), files["pretrain.sh"]).commands[0].value("--save")
    assert load == save, "inference.sh must load the checkpoint pretrain.sh saves"
    check(train, sample)  # the rendered sampling run accepts the job's checkpoint

    stock_dir = tree / "examples/stepvideo" / task
    stock_sh = stock_dir / f"inference_{task}.sh"
    stock = _run_args(
        stock_sh,
        stock_sh.read_text(encoding="utf-8"),
        json.loads((stock_dir / f"inference_{task}_model.json").read_text(encoding="utf-8")),
    )
    for name in ("num_layers", "tensor_model_parallel_size"):
        with pytest.raises(AssertionError, match=name):
            check(train, SimpleNamespace(**{**vars(sample), name: getattr(stock, name)}))
