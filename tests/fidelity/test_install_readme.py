"""Each model's install plan, judged by its own README's install section (and the version's install guide).

For every registered model at MindSpeed-MM 26.0.0 and 26.1.0 the README's install commands are read into facts
(tests/fidelity/install_readme.py) and compared with the facts of `install_deps`' plan on both architectures:
every README pin, commit, clone, copy, script and requirements file must be in the plan, in the README's order,
or named in the overlay's `readme_deviations` with the reason; every plan step the README does not show must
have its reason in data (install.yaml `readme.plan_only`, or the overlay step's `beyond_readme`).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from mm_agent.install.schema import load_install_knowledge
from mm_agent.install.steps import Layout, build_steps, plan_context
from mm_agent.pipeline import build_pipeline
from mm_agent.registry import get_registry
from tests.fidelity.install_readme import (
    VERSIONS,
    WORKSPACE,
    Fact,
    Reader,
    check_model,
    compare,
    dedupe,
    find_readme,
    guide_facts,
    install_section,
    install_sh_options,
    plan_facts,
    readme_facts,
    shell_commands,
)

CASES = [
    (entry.id, version)
    for entry in sorted(get_registry().models.values(), key=lambda e: e.id)
    for version in VERSIONS
    if entry.versions.contains(version)
]
LAYOUT = Layout(
    f"{WORKSPACE}/MindSpeed-MM", WORKSPACE, f"{WORKSPACE}/env", f"{WORKSPACE}/env/bin/python", ("pip",)
)
# What a README does beyond the base install when it has facts of these kinds.
MODEL_KINDS = {"pip", "requirements", "src", "editable", "copy", "script", "conda"}


def _tree(upstream: Path, version: str) -> Path:
    return upstream / "MindSpeed-MM" / f"v{version}"


@pytest.mark.parametrize(("model", "version"), CASES, ids=[f"{m}-{v}" for m, v in CASES])
def test_install_plan_follows_the_readme(upstream: Path, model: str, version: str) -> None:
    check = check_model(get_registry().get(model), version, upstream)
    if check.readme is None:
        # no README to read (verl_examples: one per sub-model, each its own stack): the plan must say so
        assert check.unsupported, f"{model} {version}: no README and no manual step saying what to follow"
        return
    assert check.readme_facts, f"{check.readme}: no install commands read from its install section"
    assert not check.missing, f"{model} {version}: README steps not in the plan: " + "; ".join(
        f"{f} ({f.where}: {f.command})" for f in check.missing
    )
    assert not check.out_of_order, f"{model} {version}: plan order differs from the README: " + "; ".join(
        f"{a} ({a.where}) comes before {b} ({b.where}) in the plan" for a, b in check.out_of_order
    )
    assert not check.undeclared, (
        f"{model} {version}: plan steps the README does not show, without a reason: "
        + ("; ".join(f"{f} [{f.where}]" for f in check.undeclared))
    )


def test_readme_deviations_name_commands_the_readme_has(upstream: Path) -> None:
    """A declared deviation that no longer matches a README command is stale: the README changed."""
    for entry in get_registry().models.values():
        for overlay in entry.deps:
            for version in VERSIONS:
                if not overlay.readme_deviations or not overlay.versions.contains(version):
                    continue
                if not entry.versions.contains(version):
                    continue
                tree = _tree(upstream, version)
                readme = find_readme(tree, entry.example_dir)
                section = install_section(readme) if readme else None
                assert section is not None, (entry.id, version)
                commands = {f.command for f in readme_facts(section, tree)}
                for deviation in overlay.readme_deviations:
                    assert deviation.readme in commands, (
                        f"{entry.id} {version}: {deviation.readme!r} not in {readme}"
                    )


@pytest.mark.parametrize("version", VERSIONS)
def test_base_plan_follows_the_install_guide(upstream: Path, version: str) -> None:
    """A model without an overlay gets the guide's manual install: CANN, torch/torch_npu, MindSpeed-MM, Megatron,
    MindSpeed at the release branch, `pip install -e .` (and Triton-Ascend where the guide has it)."""
    reg = get_registry()
    info = reg.versions.get(version)
    assert info is not None
    tree = _tree(upstream, version)
    guide = dedupe(guide_facts(tree))
    assert {f.kind for f in guide} >= {
        "cann",
        "torch",
        "torch-npu",
        "mm",
        "megatron",
        "mindspeed",
        "mm-install",
    }
    deviations = {d.readme for d in load_install_knowledge(reg).readme.guide_deviations.get(version, [])}
    for arch in ("aarch64", "x86_64"):
        ctx = plan_context(reg.get("wan2.1"), info, LAYOUT, arch=arch, registry=reg)
        steps = build_steps(dataclasses.replace(ctx, overlay=None))
        result = compare(guide, plan_facts(steps, tree))
        missing = [f for f in result.missing if f.command not in deviations]
        assert not missing, f"{version} {arch}: " + "; ".join(
            f"{f} ({f.where}: {f.command})" for f in missing
        )
        assert not result.out_of_order, result.out_of_order
    for deviation in deviations:  # each declared deviation is a command the guide has
        assert any(f.command == deviation for f in guide_facts(tree)), deviation


@pytest.mark.parametrize("version", VERSIONS)
def test_torch_on_aarch64_is_pypi_torch_as_the_guide_installs_it(upstream: Path, version: str) -> None:
    """The guide's aarch64 torch wheel is PyPI's own file (no `+cpu` local tag; the Ascend link beside it is for
    torch_npu) and scripts/install.sh installs `torch==<version>` from PyPI on arm: the plan does the same."""
    tree = _tree(upstream, version)
    guide = (tree / "docs/zh/pytorch/install_guide.md").read_text(encoding="utf-8")
    wheels = re.findall(r"pip3? install (torch-[^\s]+\.whl)", guide)
    assert wheels and all(w.endswith("manylinux_2_28_aarch64.whl") and "+" not in w for w in wheels), wheels
    info = get_registry().versions.get(version)
    assert info is not None
    assert {w.split("-")[1] for w in wheels} == {info.torch}
    script = (tree / "scripts/install.sh").read_text(encoding="utf-8")
    arm = re.findall(r'"\$ARCH" = "arm".*?\n\s*(?:echo [^\n]*\n\s*)*(pip3 install [^\n]*)', script)
    assert arm and all("--index-url" not in line and '"torch==$' in line for line in arm[:1]), arm
    reg = get_registry()
    steps = build_steps(plan_context(reg.get("wan2.1"), info, LAYOUT, arch="aarch64", registry=reg))
    (torch,) = [s for s in steps if s.id == "torch"]
    argv = torch.commands[0].argv
    assert f"torch=={info.torch}" in argv and "--index-url" not in argv


def test_no_plan_says_base_install_only_where_the_readme_does_more(upstream: Path) -> None:
    """install_deps' notes and route_model's model_deps stage never call a README with its own steps 'base only'."""
    reg = get_registry()
    for model, version in CASES:
        entry = reg.get(model)
        check = check_model(entry, version, upstream)
        info = reg.versions.get(version)
        assert info is not None
        does_more = any(f.kind in MODEL_KINDS for f in check.readme_facts) or any(
            f.kind == "mindspeed" and f.ref != info.mindspeed_branch for f in check.readme_facts
        )
        if not does_more:
            continue
        overlay = entry.deps_for(version)
        notes = " ".join(overlay.notes if overlay else []).lower()
        assert "install only" not in notes, f"{model} {version}: {notes}"
        model_deps = build_pipeline(entry, entry.tasks[0], entry.sizes[0], version)[1]
        assert "base install only" not in model_deps.summary, f"{model} {version}: {model_deps.summary}"


# ------------------------------------------------------------------------------------------ the reader itself


def _facts(text: str, install_sh: dict[str, bool] | None = None) -> list[str]:
    reader = Reader(None, install_sh)
    for number, comment, argv in shell_commands(text):
        reader.run(argv, comment=comment, where=str(number))
    return [str(f) for f in reader.facts]


def test_reader_follows_cd_chains_continuations_and_edits() -> None:
    text = """\
git clone --branch 26.0.0 https://gitcode.com/Ascend/MindSpeed-MM.git   # the checkout
git clone https://github.com/huggingface/diffusers.git && cd diffusers
git checkout a98a839de75f1ad82d8d200c3bc2e4ff89929081
cp -r ../MindSpeed-MM/examples/diffusers/flux/* ./examples/dreambooth
pip install \\
    -e .
vim examples/dreambooth/requirements_flux.txt #修改版本： torch==2.7.1, accelerate==1.7.0, 添加deepspeed==0.17.2
pip install -r examples/dreambooth/requirements_flux.txt
cd ..
cd MindSpeed-MM
git clone https://gitcode.com/Ascend/MindSpeed.git
cd MindSpeed
git checkout 5176c6f5
cp -r mindspeed ../
cd ..
pip3 install -e . ; mkdir logs data
pip install transformers==4.57.1 'peft>=0.17' --extra-index-url=https://example.org/simple
conda install -c conda-forge libsndfile
huggingface-cli download x/y --local-dir z
"""
    assert _facts(text) == [
        "mm",
        "src github.com/huggingface/diffusers @a98a839de75f1ad82d8d200c3bc2e4ff89929081",
        "copy mm:examples/diffusers/flux -> diffusers:examples/dreambooth",
        "editable diffusers",
        "requirements diffusers:examples/dreambooth/requirements_flux.txt",
        "torch",  # the versions the vim comment sets come right after the file they edit
        "pip accelerate==1.7.0",
        "pip deepspeed==0.17.2",
        "mindspeed copy @5176c6f5",
        "mm-install",
        "pip transformers==4.57.1 [https://example.org/simple]",
        "pip peft>=0.17 [https://example.org/simple]",
        "conda libsndfile",
    ]


def test_reader_expands_install_sh_with_its_own_option_table() -> None:
    table = {"-m": True, "--msid": True, "-mt": False, "--megatron": False}  # 26.0.0 has no --msbranch
    facts = _facts("cd MindSpeed-MM\nbash scripts/install.sh --arch arm --megatron --msid abc1234", table)
    assert facts == [
        "mm",
        "install-sh-unknown-option --arch",
        "torch",
        "torch-npu",
        "megatron @core_v0.12.1",
        "mindspeed pip @abc1234",
        "mm-install",
    ]
    assert "install-sh-unknown-option --msbranch" in _facts(
        "bash scripts/install.sh --msbranch master", table
    )


def test_reader_reads_the_options_of_the_real_install_sh(upstream: Path) -> None:
    assert "--msbranch" not in install_sh_options(_tree(upstream, "26.0.0"))
    assert install_sh_options(_tree(upstream, "26.1.0"))["--msbranch"] is True
    assert install_sh_options(_tree(upstream, "26.1.0"))["--megatron"] is False


def test_comparison_reports_missing_and_reordered_steps() -> None:
    readme = [Fact("pip", "a==1"), Fact("requirements", "mm:r.txt"), Fact("src", "h/x", "abcdef1")]
    plan = [Fact("requirements", "mm:r.txt"), Fact("pip", "a==1"), Fact("src", "h/x", "abcdef1234567")]
    result = compare(readme, plan)
    assert not result.missing and result.out_of_order == [(readme[1], readme[0])]
    assert compare(readme, plan[:2]).missing == [readme[2]]
    assert compare([Fact("src", "h/x", "abcdef9")], plan).missing  # another commit is not the README's


def test_files_the_steps_read_from_the_checkout_exist_at_their_versions(upstream: Path) -> None:
    """A step's requirements file, script or copy source inside MindSpeed-MM (`mm:`) is in that version's tree."""
    from mm_agent.registry.deps import split_loc

    checked = 0
    for entry in get_registry().models.values():
        for version in VERSIONS:
            overlay = entry.deps_for(version)
            if overlay is None or not entry.versions.contains(version):
                continue
            tree = _tree(upstream, version)
            for action in overlay.steps:
                sources = [action.requirements, action.script.path if action.script else None]
                sources.append(action.copy_.source if action.copy_ else None)
                for loc in sources:
                    if (
                        loc is None or split_loc(loc)[0] != "mm" or loc.endswith(".png")
                    ):  # images are not in the tree
                        continue
                    assert (tree / split_loc(loc)[1]).exists(), (
                        f"{entry.id} {version}: {loc} is not in {tree}"
                    )
                    checked += 1
                copy = action.copy_
                if copy is None:
                    continue
                if copy.creates is not None:  # the file its check looks for comes with the copy
                    inside = Path(split_loc(copy.creates)[1]).relative_to(split_loc(copy.to)[1] or ".")
                    if split_loc(copy.source)[0] == "mm":
                        assert (tree / split_loc(copy.source)[1] / inside).exists(), (entry.id, version, copy)
                elif (
                    split_loc(copy.to)[0] == "mm"
                ):  # a check on a folder the tree already has would pass at once
                    assert not (tree / split_loc(copy.to)[1]).exists(), (entry.id, version, copy)
    assert checked > 20
