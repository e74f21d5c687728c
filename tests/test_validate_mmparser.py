"""The pieces of `validate --mm-root` that need no MindSpeed-MM tree: torchrun's argv split, which flag an
error names, which entries are judged, and what a broken checkout turns into (a warning, not a crash).
The real parser itself is judged in tests/fidelity/test_parser.py against the upstream trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_validate_support import copy_job, run

from mm_agent.errors import MMAgentError
from mm_agent.validate.mmparser import entry_kind, flag_of, locate, split_torchrun


def test_torchrun_argv_is_split_into_world_size_entry_and_args() -> None:
    argv = [
        "--nproc_per_node",
        "8",
        "--nnodes",
        "2",
        "--node_rank",
        "0",
        "--master_addr",
        "h",
        "--master_port",
        "6000",
    ]
    assert split_torchrun([*argv, "pretrain_sora.py", "--mm-model", "m.json"]) == (
        16,
        "pretrain_sora.py",
        ["--mm-model", "m.json"],
    )
    assert split_torchrun(["--nproc-per-node=4", "--standalone", "--nnodes=1:2", "x.py"]) == (8, "x.py", [])
    with pytest.raises(MMAgentError):
        split_torchrun(["--nproc_per_node", "8"])


def test_the_flag_an_error_names() -> None:
    assert flag_of("unrecognized arguments: --no-such-flag", []) == "--no-such-flag"
    message = "IsNotValidError: Expression is not valid (at validate_args_patch.py:234 `ensure_valid(args.micro_batch_size is not None)`)"
    assert flag_of(message, ["--global-batch-size", "8"]) == "--micro-batch-size"
    assert flag_of("RuntimeError: One or more config files failed to load", []) is None


def test_only_entries_of_the_checkout_that_read_mindspeed_mm_arguments_are_judged(tmp_path: Path) -> None:
    (tmp_path / "pretrain_x.py").write_text(
        "from mindspeed_mm.configs.config import mm_extra_args_provider\n"
    )
    (tmp_path / "pretrain_y.py").write_text("import read_yaml_config\nmm_extra_args_provider\n")
    (tmp_path / "trainer.py").write_text(
        "from mindspeed_mm.fsdp.params.argument import Arguments\nConfigManager(config_class=Arguments)\n"
    )
    (tmp_path / "own_cli.py").write_text("import argparse\n")
    assert entry_kind(tmp_path, "pretrain_x.py") == ("megatron", None)
    assert entry_kind(tmp_path, "pretrain_y.py") == ("megatron", "read_yaml_config")
    assert entry_kind(tmp_path, "trainer.py") == ("fsdp", "config_manager")
    assert entry_kind(tmp_path, "own_cli.py") == (None, None)
    assert entry_kind(tmp_path, "missing.py") == (None, None)
    # never read outside the checkout
    assert entry_kind(tmp_path / "sub", "../pretrain_x.py") == (None, None)
    assert entry_kind(tmp_path, str(tmp_path / "pretrain_x.py")) == (None, None)


def test_locate_needs_a_mindspeed_mm_checkout(tmp_path: Path) -> None:
    with pytest.raises(MMAgentError) as err:
        locate(tmp_path)
    assert err.value.field == "mm_root" and "mindspeed_mm/arguments.py" in err.value.message
    mm = tmp_path / "MindSpeed-MM" / "v26.0.0"
    (mm / "mindspeed_mm").mkdir(parents=True)
    (mm / "mindspeed_mm" / "arguments.py").write_text("")
    megatron = tmp_path / "Megatron-LM" / "core_v0.12.1" / "megatron" / "training"
    megatron.mkdir(parents=True)
    (megatron / "arguments.py").write_text("")
    mindspeed = tmp_path / "MindSpeed" / "26.0.0_core_r0.12.1" / "mindspeed"
    mindspeed.mkdir(parents=True)
    (mindspeed / "arguments.py").write_text("")
    trees = locate(mm)
    assert trees.megatron == tmp_path / "Megatron-LM" / "core_v0.12.1"
    assert trees.mindspeed == tmp_path / "MindSpeed" / "26.0.0_core_r0.12.1"


def test_a_checkout_whose_parser_cannot_be_built_is_a_warning(tmp_path: Path) -> None:
    """A MindSpeed-MM-looking folder with no Megatron or MindSpeed: the child reports it, validation goes on."""
    mm = tmp_path / "mm"
    (mm / "mindspeed_mm").mkdir(parents=True)
    (mm / "mindspeed_mm" / "arguments.py").write_text("raise ImportError('broken checkout')\n")
    (mm / "pretrain_sora.py").write_text("from mindspeed_mm.configs.config import mm_extra_args_provider\n")
    job = copy_job(tmp_path, "wan21_t2v")
    report = run(job, mm_root=mm)
    ran, warning = sorted(
        (f for f in report.findings if f.rule.startswith("mmparser.")), key=lambda f: f.rule
    )
    assert ran.rule == "mmparser.code_ran" and report.ran_code_from == str(mm)  # its arguments.py did run
    assert (warning.rule, warning.severity, warning.field) == ("mmparser.unavailable", "warning", "mm_root")
    assert "could not build MindSpeed-MM's parser" in warning.message
