"""Every converter command mm-agent tells a user to run, parsed by MindSpeed-MM's own converter CLI (issue 26).

For every registry (model, task, backend, size) at 26.0.0, 26.1.0 and master, the converter commands of
`build_pipeline`'s stages and of `render_job`'s next steps (`convert_cli.offered`) are parsed by that
version's `checkpoint/convert_cli.py` (jsonargparse over the real `Commandable.subclasses`, in a child
process per version, nothing run: `upstream_convert_cli.py`). Every one must be accepted, and each must be
the class and method it names. A method whose body upstream is a stub (read with `ast`) must never be
offered, and the registry's `converter.stubs` must say exactly where upstream's methods are stubs, so a
release that implements one (or stubs one out) is noticed.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from mm_agent.pipeline import converter_program
from mm_agent.registry import get_registry
from mm_agent.registry.schema import version_key

from . import convert_cli
from .conftest import MMTrees

pytest.importorskip(
    "jsonargparse",
    reason="jsonargparse (the dev extra) builds MindSpeed-MM's converter CLI: pip install -e .[dev]",
)

VERSIONS = convert_cli.VERSIONS
HAND = "hand-made"
# (argv, verdict wanted: None = accepted, else a piece of the parser's message); judged in the 26.0.0 run
STEPVIDEO = "checkpoint.sora_model.stepvideo_converter"
SV_ARGS = ["StepVideoConverter", "hf_to_mm", "--cfg.source_path", "sv", "--cfg.target_path", "sv"]
HAND_CASES: list[tuple[list[str], str | None]] = [
    (["mm-convert", *SV_ARGS], "invalid choice: 'StepVideoConverter'"),  # the README's own command
    (
        ["python", "-c", f"import {STEPVIDEO}; from checkpoint.convert_cli import main; main()", *SV_ARGS],
        None,
    ),
    # after the -c case, plain mm-convert still cannot find the class: nothing of that case was left behind
    (
        ["mm-convert", *SV_ARGS, "--cfg.target_parallel_config.tp_size", "1"],
        "invalid choice: 'StepVideoConverter'",
    ),
    (
        ["mm-convert", "WanConverter", "hf_to_mm", "--cfg.source_path", "w", "--cfg.no_such_field", "1"],
        "no_such_field",
    ),
    (
        ["mm-convert", "Qwen35Converter", "hf_to_dcp", "--hf_dir", "q", "--save_dir", "q2"],
        "unrecognized arguments",
    ),
    (
        ["mm-convert", "InternVLConverter", "hf_to_mm", "--cfg.mm_dir", "i", "--cfg.hf_config.hf_dir", "i"],
        "are required: InternVLConverter.hf_to_mm.cfg.parallel_config.llm_pp_layers",
    ),
    (
        [
            "mm-convert",
            "InternVLConverter",
            "hf_to_mm",
            "--cfg.mm_dir",
            "i",
            "--cfg.hf_config.hf_dir",
            "/nonexistent/mm-agent-hf-dir",
            "--cfg.parallel_config.llm_pp_layers",
            "[[36]]",
            "--cfg.parallel_config.vit_pp_layers",
            "[[24]]",
        ],
        "does not point to a directory",
    ),
    (["mm-convert", "WanConverter", "no_such_method", "--cfg.source_path", "w"], "invalid choice"),
]
MIN_COMMANDS = {"26.0.0": 100, "26.1.0": 60, "master": 60}  # distinct commands judged per version


@pytest.fixture(scope="module")
def judged(
    mm_tree: MMTrees, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[convert_cli.Offered, dict[str, convert_cli.Verdict], Path]]:
    out = {}
    for version in VERSIONS:
        tree = mm_tree.version_dir(version)
        assert tree is not None, f"no MindSpeed-MM {version} tree under {mm_tree.root}"
        scratch = tmp_path_factory.mktemp(f"convert-cli-{version}")
        found = convert_cli.offered(version, scratch)
        argvs = [c.argv for c in found.commands.values()]
        if version == "26.0.0":
            argvs += [argv for argv, _ in HAND_CASES]
        out[version] = (found, convert_cli.judge(tree, argvs, scratch), tree)
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_every_offered_converter_command_is_accepted_by_mindspeed_mm_s_cli(
    judged: dict[str, tuple[convert_cli.Offered, dict[str, convert_cli.Verdict], Path]], version: str
) -> None:
    found, verdicts, tree = judged[version]
    assert not found.unreadable, f"converter mentions that are no command the judge reads: {found.unreadable}"
    assert not found.refused, f"render_job refused registry jobs: {found.refused}"
    problems = []
    for text, command in sorted(found.commands.items()):
        verdict = verdicts[text]
        where = sorted({f"{u.model}/{u.task}/{u.backend}/{u.size} {u.where}" for u in command.uses})
        if not verdict.ok:
            problems.append(f"{text}\n    offered by {where}\n    rejected: {verdict.error}")
            continue
        words = command.argv[3:] if command.argv[1:2] == ["-c"] else command.argv[1:]
        method = next(
            w
            for i, w in enumerate(words[1:], 1)
            if not w.startswith("-") and not words[i - 1].startswith("-")
        )
        assert verdict.parsed == [words[0], method], (text, verdict.parsed)
        assert verdict.checkpoint and Path(verdict.checkpoint).is_relative_to(tree), verdict.checkpoint
    assert not problems, f"MindSpeed-MM {version}'s converter CLI rejects:\n" + "\n".join(problems)
    assert len(found.commands) >= MIN_COMMANDS[version], (version, len(found.commands))


@pytest.mark.parametrize("version", VERSIONS)
def test_no_stub_is_offered(
    judged: dict[str, tuple[convert_cli.Offered, dict[str, convert_cli.Verdict], Path]], version: str
) -> None:
    """The method each accepted command runs has a body at that version (not `pass`, not NotImplementedError)."""
    found, verdicts, tree = judged[version]
    stubs = {}
    for text, command in found.commands.items():
        parsed = verdicts[text].parsed
        assert parsed is not None and len(parsed) == 2, (text, parsed)
        kind = convert_cli.stub_kind(tree, parsed[0], parsed[1])
        if kind is not None:
            stubs[text] = (kind, sorted({(u.model, u.where) for u in command.uses}))
    assert not stubs, f"commands that run a stub at {version}: {stubs}"


def test_the_judge_rejects_what_the_cli_rejects(
    judged: dict[str, tuple[convert_cli.Offered, dict[str, convert_cli.Verdict], Path]],
) -> None:
    """Hand-made commands judged in the 26.0.0 run: the README's `mm-convert StepVideoConverter` (not found),
    the imported form (found, and gone again for the next case), an unknown field, a renamed flag, missing
    required lists, a source folder that does not exist, an unknown method."""
    verdicts = judged["26.0.0"][1]
    for argv, wanted in HAND_CASES:
        verdict = verdicts[shlex.join(argv)]
        if wanted is None:
            assert verdict.ok and verdict.parsed == argv[3:5], (argv, verdict)
        else:
            assert not verdict.ok and wanted in (verdict.error or ""), (argv, verdict)


def test_registry_stubs_are_upstream_s_stubs(mm_tree: MMTrees) -> None:
    """`converter.stubs` holds exactly the (method, version) pairs whose body upstream is a stub, over every
    version with a tree where the registry offers the method."""
    problems = []
    versions = sorted(get_registry().versions.ids, key=version_key)
    for entry in get_registry().models.values():
        conv = entry.converter
        if conv is None:
            continue
        for version in versions:
            tree = mm_tree.version_dir(version)
            if tree is None or not entry.versions.contains(version):
                continue
            for method in conv.methods:
                if not conv.has_method(method, version):
                    continue
                kind = convert_cli.stub_kind(tree, conv.class_name, method)
                recorded = conv.stub_at(method, version) is not None
                if kind == "absent":
                    problems.append(f"{entry.id}: {conv.class_name}.{method} is not defined at {version}")
                elif (kind is not None) != recorded:
                    at = (convert_cli.find_method(tree, conv.class_name, method) or ("?",))[0]
                    problems.append(
                        f"{entry.id}: {conv.class_name}.{method} at {version} ({at}) is "
                        + (
                            f"a stub ({kind}) that converter.stubs lacks"
                            if kind
                            else "implemented, but in stubs"
                        )
                    )
    assert not problems, "\n".join(problems)


def test_a_converter_mm_convert_cannot_find_is_run_through_its_module() -> None:
    """OpenSoraConverter / StepVideoConverter (cli_registered: false) are rendered as `python -c 'import
    <module>; ... main()'`; every other converter as mm-convert (the parse tests judge both forms)."""
    for entry in get_registry().models.values():
        conv = entry.converter
        if conv is None:
            continue
        program = converter_program(conv)
        if conv.cli_registered:
            assert program == ["mm-convert"], entry.id
        else:
            assert program[:2] == ["python", "-c"] and f"import {conv.module};" in program[2], entry.id


def test_cells_give_the_report_column(
    judged: dict[str, tuple[convert_cli.Offered, dict[str, convert_cli.Verdict], Path]],
) -> None:
    """The report's column (`convert_cli.rows` = these cells over every version with a tree): every registry
    model at each version, "k/n accepted" where commands are offered, a reason where none is."""
    reg = get_registry()
    for version, (found, verdicts, _) in judged.items():
        cells = convert_cli.cells(version, found, verdicts)
        assert {m for m, _ in cells} == {m for m, e in reg.models.items() if e.versions.contains(version)}
        assert all(cell.ok is not False for cell in cells.values()), {
            k: c for k, c in cells.items() if not c.ok
        }
        if version == "26.0.0":
            assert cells[("wan2.1", version)].ok and cells[("wan2.1", version)].text.endswith(" accepted")
            assert (
                cells[("flux", version)].ok is None and "no conversion step" in cells[("flux", version)].text
            )
            assert cells[("qwen3tts", version)].text.startswith("unsupported: MindSpeed-MM 26.0.0 has no")
