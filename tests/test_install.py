"""install_deps plans, checked for both architectures: steps, pins, conflicts, data validation, the script."""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import TypeAdapter, ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.install.checks import requirements_check
from mm_agent.install.conflicts import compatible, find_conflicts
from mm_agent.install.plan import InstallPlan, InstallRequest, build_plan, host_arch, host_os_family
from mm_agent.install.schema import load_install_knowledge
from mm_agent.install.steps import Layout, PlanStep, build_steps, plan_context
from mm_agent.registry import DATA_DIR, get_registry, load_models
from mm_agent.registry.schema import DepsOverlay
from mm_agent.registry.tokens import HttpsUrl, PipRequirement, RelPath

ARCHES = ["x86_64", "aarch64"]
REPO = Path(__file__).resolve().parent.parent
SHELLCHECK = REPO / ".venv" / "bin" / "shellcheck"
W22_MSID = "96bc0a3bf3398bf45ac26e0bded95ee174ac449b"


def plan(model: str, arch: str = "x86_64", version: str = "26.0.0", **kw: object) -> InstallPlan:
    return build_plan(InstallRequest(model=model, mm_version=version, arch=arch, **kw))  # type: ignore[arg-type]


def step(p: InstallPlan, step_id: str) -> PlanStep:
    found = [s for s in p.steps if s.id == step_id]
    assert found, f"no step {step_id} in {[s.id for s in p.steps]}"
    return found[0]


def argvs(p: InstallPlan) -> list[list[str]]:
    return [c.argv for s in p.steps for c in s.commands]


def words(p: InstallPlan) -> list[str]:
    return [w for argv in argvs(p) for w in argv]


# ------------------------------------------------------------------------------------------------ plans


@pytest.mark.parametrize("arch", ARCHES)
def test_wan21_diffusers_pin_only_where_the_readme_has_it(arch: str) -> None:
    old = plan("wan2.1", arch, "26.0.0")
    pkgs = step(old, "model-packages")
    assert pkgs.commands[-1].argv[-1] == "diffusers==0.33.1"
    assert any("diffusers==0.33.1" in c.argv for c in pkgs.verify)
    assert "93c45456c7044bacddebc5072316c01006c938f9" in step(old, "mindspeed").commands[1].argv

    new = plan("wan2.1", arch, "26.1.0")
    assert "model-packages" not in [s.id for s in new.steps]
    assert not any(w.startswith("diffusers") for w in words(new))
    assert step(new, "torch-npu").commands[0].argv[-1] == "torch-npu==2.7.1.post8"


@pytest.mark.parametrize("arch", ARCHES)
def test_wan22_translates_install_sh_into_pinned_steps(arch: str) -> None:
    p = plan("wan2.2", arch)
    assert p.upstream == [f"bash scripts/install.sh --megatron --msid {W22_MSID}"]
    ms = step(p, "mindspeed")
    assert ["git", "-C", f"{p.mm_root}/MindSpeed", "checkout", W22_MSID] in [c.argv for c in ms.commands]
    assert ms.verify[0].expect == W22_MSID
    meg = step(p, "megatron")  # --megatron
    assert "core_v0.12.1" in meg.commands[0].argv
    assert meg.commands[-1].argv == [
        "cp",
        "-rT",
        f"{p.src_dir}/Megatron-LM/megatron",
        f"{p.mm_root}/megatron",
    ]
    # the README installs requirements.txt; what it holds is checked, not installed a second time
    (reqs,) = step(p, "model-requirements").commands
    assert reqs.argv[-2:] == ["-r", "examples/wan2.2/requirements.txt"] and reqs.cwd == p.mm_root
    assert step(p, "model-requirements").verify[0].argv[-2:] == ["diffusers==0.35.1", "peft==0.17.1"]


@pytest.mark.parametrize("arch", ARCHES)
def test_qwen25vl_pins_its_mindspeed_commit(arch: str) -> None:
    p = plan("qwen2.5vl", arch)
    ms = step(p, "mindspeed")
    assert ms.commands[1].argv[-1] == "69f41000786438204b5f2ffdb788c055788f7378"
    assert ms.commands[-1].argv[-2:] == ["-e", f"{p.mm_root}/MindSpeed"]
    assert "model-packages" not in [s.id for s in p.steps]


@pytest.mark.parametrize("arch", ARCHES)
def test_qwen3vl_installs_transformers_from_its_git_commit(arch: str) -> None:
    p = plan("qwen3vl", arch)
    pin = "transformers @ git+https://github.com/huggingface/transformers.git@c0dbe09"
    reqs = step(p, "model-requirements")  # requirements.txt is `-e git+…@c0dbe09#egg=transformers`
    assert [c.argv[-2:] for c in reqs.commands] == [["-r", "examples/qwen3vl/requirements.txt"]]
    assert pin in reqs.verify[0].argv  # the editable checkout's HEAD is compared with c0dbe09


@pytest.mark.parametrize("arch", ARCHES)
def test_deepseekocr_pins_and_versions(arch: str) -> None:
    p = plan("deepseekocr", arch)
    reqs = step(p, "model-requirements")
    assert reqs.commands[0].argv[-2:] == ["-r", "examples/deepseekocr/requirements.txt"]
    assert {"transformers==4.46.3", "tokenizers==0.20.3", "torchvision==0.22.1"} <= set(reqs.verify[0].argv)
    # finetune_ocr.py needs torch_npu and transformers only: no MindSpeed, Megatron or MindSpeed-MM package
    assert not {"megatron", "mindspeed", "mindspeed-mm"} & {s.id for s in p.steps}
    with pytest.raises(MMAgentError) as err:
        plan("deepseekocr", arch, "26.1.0")
    assert "2.3.0, 26.0.0" in err.value.message and err.value.field == "mm_version"


def test_aarch64_builds_decord_from_source_with_its_apt_packages() -> None:
    p = plan("wan2.1", "aarch64", os_family="debian")
    deps = step(p, "decord-deps")
    assert deps.requires_root and deps.stage == "system"
    install = deps.commands[-1].argv
    assert install[:3] == ["apt-get", "install", "-y"]
    assert {"libavfilter-dev", "libavcodec-dev", "libavformat-dev", "cmake", "build-essential"} <= set(
        install
    )
    assert deps.verify[0].argv[:2] == ["dpkg", "-s"]
    build = [c.argv for c in step(p, "decord").commands]
    assert build[0][:5] == ["git", "clone", "--recursive", "--branch", "v0.6.0"]
    assert build[1][:2] == ["cmake", "-S"] and "-DUSE_CUDA=0" in build[1]
    assert build[-1][-1] == f"{p.src_dir}/decord/python"
    assert "decord==0.6.0" not in words(p)
    assert step(p, "decord").verify[0].expect == "0.6.0"
    # the torch stack: PyPI's aarch64 wheels (no CPU index), torch_npu of the release
    torch = step(p, "torch").commands[0].argv
    assert "--index-url" not in torch and "torch==2.7.1" in torch
    assert step(p, "torch-npu").commands[0].argv[-1] == "torch-npu==2.7.1.post4"
    assert "manylinux_2_28 aarch64" in step(p, "torch-npu").why


def test_aarch64_rhel_uses_yum() -> None:
    p = plan("wan2.1", "aarch64", os_family="rhel")
    assert step(p, "decord-deps").commands[-1].argv[:3] == ["yum", "install", "-y"]
    assert "ffmpeg-devel" in step(p, "decord-deps").commands[-1].argv
    assert step(p, "system-packages").verify[0].argv[:2] == ["rpm", "-q"]


def test_x86_64_uses_the_cpu_index_and_the_decord_wheel() -> None:
    p = plan("wan2.1", "x86_64")
    torch = step(p, "torch").commands[0].argv
    assert torch[-2:] == ["--index-url", "https://download.pytorch.org/whl/cpu"]
    assert step(p, "decord").commands[0].argv[-1] == "decord==0.6.0"
    assert "decord-deps" not in [s.id for s in p.steps]
    assert not any("libavfilter-dev" in argv for argv in argvs(p))


def test_step_order_and_flags() -> None:
    p = plan("funasr", "aarch64")
    ids = [s.id for s in p.steps]
    assert (
        ids
        == [  # README order: sudachipy (by hand), FunASR at 42b6d3b, then requirements.txt; no Megatron
            "system-packages",
            "decord-deps",
            "cann",
            "create-env",
            "torch",
            "torch-npu",
            "mm-source",
            "mindspeed",
            "mindspeed-mm",
            "model-sudachipy",
            "model-source-funasr",
            "model-editable-funasr",
            "model-requirements",
            "decord",
        ]
    )
    cann = step(p, "cann")
    assert cann.manual and not cann.commands
    assert "source /usr/local/Ascend/cann/set_env.sh" in cann.instructions
    assert [c.argv for c in cann.verify] == [
        ["test", "-f", "/usr/local/Ascend/cann/set_env.sh"],
        ["test", "-f", "/usr/local/Ascend/nnal/atb/set_env.sh"],
    ]
    assert [s.id for s in p.steps if s.requires_root] == ["system-packages", "decord-deps"]
    src = step(p, "model-source-funasr")
    assert src.commands[0].argv[:3] == ["git", "clone", "https://github.com/modelscope/FunASR.git"]
    assert src.verify[0].expect == "42b6d3b"


def test_fsdp2_native_model_follows_its_install_sh_without_megatron() -> None:
    p = plan("qwen3_5", "aarch64")
    assert "megatron" not in [s.id for s in p.steps]
    assert p.upstream == ["bash scripts/install.sh --msid eb10b92"]
    assert step(p, "mindspeed").commands[1].argv[-1] == "eb10b92"
    scripts = step(p, "model-script").commands
    assert [(c.argv, c.cwd) for c in scripts] == [
        (["bash", f"{p.mm_root}/examples/qwen3_5/install_extensions.sh"], p.mm_root)
    ]
    # what the script installs at 26.0.0 (transformers from source, triton-ascend 3.2.0, accelerate 1.2.0) is checked
    assert {"triton-ascend==3.2.0", "accelerate==1.2.0"} <= set(step(p, "model-script").verify[0].argv)


def test_mm_checkout_and_install() -> None:
    p = plan("wan2.1", "x86_64", "26.1.0")
    src = step(p, "mm-source")
    assert src.commands[0].argv == ["git", "clone", "https://gitcode.com/Ascend/MindSpeed-MM.git", p.mm_root]
    assert src.commands[0].unless_exists == f"{p.mm_root}/.git"
    assert (src.commands[1].argv, src.commands[1].cwd) == (["git", "checkout", "v26.1.0"], p.mm_root)
    mm = step(p, "mindspeed-mm")
    assert mm.commands[0].argv[-3:] == ["install", "-e", "."] and mm.commands[0].cwd == p.mm_root
    assert ["test", "-x", f"{p.env_path}/bin/mm-convert"] in [c.argv for c in mm.verify]
    # without an overlay (every 26.x README pins its own ref) MindSpeed is the release's branch (install guide)
    reg = get_registry()
    info = reg.versions.get("26.1.0")
    assert info is not None
    ctx = plan_context(
        reg.get("bagel"), info, Layout.for_env("/w/MM", "/w", "/w/env"), arch="x86_64", registry=reg
    )
    (ms,) = [s for s in build_steps(dataclasses.replace(ctx, overlay=None)) if s.id == "mindspeed"]
    assert ms.commands[1].argv[-1] == "26.1.0_core_r0.12.1"
    assert ms.verify[0].argv[-2:] == ["--abbrev-ref", "HEAD"]


def test_versions_without_a_torch_npu_wheel_make_it_manual() -> None:
    p = plan("qwen2.5vl", "x86_64", "2.1.0")
    npu = step(p, "torch-npu")
    assert npu.manual and "torch 2.1.0" in npu.instructions[0]
    assert step(p, "torch").commands[0].argv[4:7] == [
        "torch==2.1.0",
        "torchvision==0.16.0",
        "torchaudio==2.1.0",
    ]


def test_every_model_and_version_plans_on_both_arches() -> None:
    reg = get_registry()
    for entry in reg.models.values():
        for version in reg.versions.ids:
            if not entry.versions.contains(version):
                continue
            for arch in ARCHES:
                p = plan(entry.id, arch, version)
                ids = [s.id for s in p.steps]
                assert len(ids) == len(set(ids)), (entry.id, version, ids)
                for s in p.steps:
                    assert s.why and (s.commands or s.manual), (entry.id, version, s.id)
                    # a README's own script, editable folder or requirements file may leave nothing to check
                    assert s.verify or s.manual or s.id.startswith("model-"), (entry.id, version, s.id)
                for argv in argvs(p):
                    assert not argv[0].startswith("-"), argv


def test_version_without_the_model_is_refused_with_the_versions_that_have_it() -> None:
    with pytest.raises(MMAgentError) as err:
        plan("wan2.2", "x86_64", "2.1.0")
    assert "2.2.0, 2.3.0, 26.0.0, 26.1.0, master" in err.value.message
    with pytest.raises(MMAgentError, match=r"hunyuanvideo_1\.5 is not in MindSpeed-MM 2\.3\.0"):
        plan("wan2.1", "x86_64", "2.3.0", also_models=["hunyuanvideo_1.5"])


def test_aliases_defaults_and_unknown_steps() -> None:
    p = plan("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    assert p.model == "wan2.1" and p.python == "3.10"
    assert p.env_path == str(Path.cwd() / "envs" / "wan2.1-26.0.0")
    assert p.src_dir == str(Path(p.mm_root).parent)
    with pytest.raises(MMAgentError) as err:
        plan("wan2.1", steps=["torch", "nvidia-drivers"])
    assert err.value.field == "steps" and "create-env" in (err.value.fix or "")
    with pytest.raises(MMAgentError, match="unknown model"):
        plan("wan9.9")


def test_python_override_is_noted() -> None:
    p = plan("wan2.1", python="3.11")
    assert step(p, "create-env").commands[0].argv[0] == "python3.11"
    assert step(p, "create-env").verify[0].expect == "3.11"
    assert "python3.11-venv" in step(p, "system-packages").commands[-1].argv
    assert any("tested with Python 3.10" in n for n in p.notes)


@pytest.mark.parametrize("version", ["26.0.0", "26.1.0"])
def test_flux_installs_the_readme_diffusers_stack(version: str) -> None:
    """examples/diffusers/flux/README.md: diffusers at a98a839 with MindSpeed-MM's flux files copied in, installed
    editable, its requirements_flux.txt, then the versions the README edits into that file; no MindSpeed-MM."""
    p = plan("flux", "aarch64", version)
    ids = [s.id for s in p.steps]
    assert ids[ids.index("mm-source") :] == [
        "mm-source",
        "model-source-diffusers",
        "model-copy",
        "model-editable-diffusers",
        "model-requirements",
        "model-packages",
        "model-code-edits",
        "decord",
    ]
    src = step(p, "model-source-diffusers")
    checkout = f"{p.src_dir}/diffusers"
    assert src.commands[1].argv == [
        "git",
        "-C",
        checkout,
        "checkout",
        "a98a839de75f1ad82d8d200c3bc2e4ff89929081",
    ]
    assert step(p, "model-copy").commands[0].argv == [
        "cp",
        "-rT",
        f"{p.mm_root}/examples/diffusers/flux",
        f"{checkout}/examples/dreambooth",
    ]
    reqs = step(p, "model-requirements").commands[0]
    assert (reqs.argv[-2:], reqs.cwd) == (["-r", "examples/dreambooth/requirements_flux.txt"], checkout)
    pins = ["accelerate==1.7.0", "transformers==4.47.1", "deepspeed==0.17.2", "peft==0.7.1"]
    assert step(p, "model-packages").commands[0].argv[-4:] == pins
    assert step(p, "model-code-edits").manual and "patch_flux" in " ".join(
        step(p, "model-code-edits").instructions
    )
    # conflicts.py sees the edited pins: transformers 4.47.1 over the base 4.57.0
    assert ("transformers", "overrides_base") in {(c.package, c.kind) for c in p.conflicts}


def test_readme_base_changes_mindspeed_copy_branch_and_megatron() -> None:
    cosy = plan("cosyvoice3", "x86_64", "26.1.0")
    ms = step(cosy, "mindspeed")  # `git clone MindSpeed` (master) + `cp -r mindspeed ../MindSpeed-MM/`
    assert [c.argv for c in ms.commands][1:] == [
        ["git", "-C", f"{cosy.mm_root}/MindSpeed", "checkout", "master"],
        ["cp", "-rT", f"{cosy.mm_root}/MindSpeed/mindspeed", f"{cosy.mm_root}/mindspeed"],
    ]
    assert ["test", "-f", f"{cosy.mm_root}/mindspeed/__init__.py"] in [c.argv for c in ms.verify]
    assert "megatron" not in [s.id for s in cosy.steps]
    qihoo = step(plan("qihoo_t2x", "x86_64"), "megatron")  # core_r0.8.0 is a branch, not a tag
    assert "core_r0.8.0" in qihoo.commands[0].argv
    assert qihoo.verify[0].argv[-2:] == ["--abbrev-ref", "HEAD"] and qihoo.verify[0].expect == "core_r0.8.0"
    assert (
        step(plan("hunyuanvideo"), "mindspeed").commands[1].argv[-1]
        == "6aff65eba929b4f39848a5153ac455467d0b0f9e"
    )
    whisper = [s.id for s in plan("whisper").steps]  # the README installs its packages before MindSpeed-MM
    assert whisper.index("model-packages") < whisper.index("model-libsndfile") < whisper.index("mindspeed-mm")


def test_triton_ascend_where_the_install_guide_has_it() -> None:
    assert "triton-ascend" not in [s.id for s in plan("wan2.1", version="26.0.0").steps]
    p = plan("wan2.1", version="26.1.0")
    ids = [s.id for s in p.steps]
    assert ids.index("mindspeed-mm") < ids.index("triton-ascend") < ids.index("decord")
    assert step(p, "triton-ascend").commands[0].argv[-3:] == [
        "triton-ascend==3.2.1",
        "--extra-index-url",
        "https://triton-ascend.osinfra.cn/pypi/simple",
    ]
    # qwen3_6's README places Triton-Ascend itself (3.2.0 in its pins, then 3.2.1 before fla-npu)
    q = plan("qwen3_6", version="26.1.0")
    assert "triton-ascend" not in [s.id for s in q.steps]
    assert [s.id for s in q.steps if s.stage == "model_deps"] == [
        "model-packages",
        "model-packages-2",
        "model-source-flash-linear-attention-npu",
        "model-fla-npu",
    ]
    assert step(q, "model-packages-2").commands[0].argv[-3:-2] == ["triton-ascend==3.2.1"]
    assert step(q, "mindspeed").commands[1].argv[-1] == "master"  # `install.sh --msbranch master`
    # no Triton-Ascend where MindSpeed-MM itself is not installed (diffusers-based FLUX)
    assert "triton-ascend" not in [s.id for s in plan("flux", version="26.1.0").steps]


def test_overlay_steps_are_typed_and_refer_to_known_checkouts() -> None:
    ok = DepsOverlay.model_validate(
        {
            "steps": [
                {"clone": {"name": "x", "url": "https://h.example/x.git", "ref": "abc1234"}},
                {"copy": {"from": "mm:examples/a", "to": "x:b"}},
                {"editable": "x:", "holds": ["x"]},
            ]
        }
    )
    assert ok.steps[1].copy_ is not None and ok.steps[1].copy_.source == "mm:examples/a"
    bad: list[dict[str, object]] = [
        {"steps": [{"editable": "y:"}]},  # y is not mm nor an earlier clone
        {"steps": [{"requirements": "mm:../etc/passwd"}]},
        {"steps": [{"requirements": "mm:a.txt", "pip": ["x==1"]}]},  # two kinds in one step
        {"steps": [{"pip": ["x==1"]}], "pip": ["y==1"]},  # steps and the slots together
        {"steps": [{"pip": ["--index-url=https://evil.example"]}]},
        {"steps": [{"clone": {"name": "x", "url": "http://h.example/x.git"}}]},
        {"mindspeed_branch": "master", "mindspeed_commit": "abc1234"},
        {"omit": ["torch"]},
    ]
    for data in bad:
        with pytest.raises(ValidationError):
            DepsOverlay.model_validate(data)


def test_requirements_check_reads_the_commit_of_an_editable_checkout(tmp_path: Path) -> None:
    """`git clone; git checkout <sha>; pip install -e .` leaves a file:// direct_url without vcs_info: the check
    reads the checkout's HEAD instead (run for real: a git repository and an installed-metadata folder)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("a")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    site = tmp_path / "site"
    info = site / "demo_pkg-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
    (info / "direct_url.json").write_text(json.dumps({"url": repo.as_uri(), "dir_info": {"editable": True}}))

    def check(ref: str) -> int:
        argv = requirements_check(sys.executable, [f"demo-pkg @ git+https://h.example/demo.git@{ref}"]).argv
        env = {**os.environ, "PYTHONPATH": str(site)}
        return subprocess.run(argv, env=env, capture_output=True).returncode

    assert check(head[:7]) == 0
    assert check("0000000") != 0


# ------------------------------------------------------------------------------------------ conflicts


def _conflicts(models: list[str], version: str = "26.0.0") -> list[tuple[str, str, tuple[str, ...]]]:
    reg = get_registry()
    info = reg.versions.get(version)
    assert info is not None
    found = find_conflicts([reg.get(m) for m in models], info, load_install_knowledge(reg))
    return [(c.kind, c.package, tuple(r.requirement for r in c.requirements)) for c in found]


def test_qwen3vl_and_deepseekocr_cannot_share_transformers() -> None:
    found = _conflicts(["qwen3vl", "deepseekocr"])
    git = "transformers @ git+https://github.com/huggingface/transformers.git@c0dbe09"
    assert ("cross_model", "transformers", (git, "transformers==4.46.3")) in found
    p = plan("qwen3vl", also_models=["deepseekocr"])
    cross = [c for c in p.conflicts if c.kind == "cross_model"]
    assert cross and cross[0].models == ["qwen3vl", "deepseekocr"]
    assert "separate environments" in cross[0].advice
    assert any("separate environments" in n for n in p.notes)


def test_wan21_and_wan22_conflict_on_diffusers_until_the_base_moves() -> None:
    found = _conflicts(["wan2.1", "wan2.2"])
    assert ("cross_model", "diffusers", ("diffusers==0.33.1", "diffusers==0.35.1")) in found
    assert ("overrides_base", "diffusers", ("diffusers==0.33.1", "diffusers==0.30.3")) in found
    assert ("overrides_base", "peft", ("peft==0.17.1", "peft==0.7.1")) in found
    assert _conflicts(["wan2.1", "wan2.2"], "26.1.0") == []
    assert [c[:2] for c in _conflicts(["wan2.1", "hunyuanvideo_1.5"]) if c[0] == "cross_model"] == [
        ("cross_model", "diffusers")
    ]


def test_models_on_the_base_stack_do_not_conflict() -> None:
    assert _conflicts(["qwen2.5vl", "wan2.1"], "26.1.0") == []
    # deepseekocr's torchvision==0.22.1 is exactly the torch stack's companion
    assert not [c for c in _conflicts(["deepseekocr"]) if c[1] == "torchvision"]


@pytest.mark.parametrize(
    ("a", "b", "ok"),
    [
        ("diffusers==0.33.1", "diffusers==0.35.1", False),
        ("diffusers==0.33.1", "diffusers>=0.38.0", False),
        ("peft>=0.17.0", "peft==0.17.1", True),
        ("peft>=0.17.0", "peft<0.17", False),
        ("omegaconf>=2.3.0", "omegaconf", True),
        ("numpy>=1.24,<2", "numpy>1.26", True),
        ("torch==2.7.1", "torch==2.7.1", True),
        ("x @ git+https://h.example/x.git@abc1234", "x==1.0", False),
        ("x @ git+https://h.example/x.git@abc1234", "x", True),
        ("x @ git+https://h.example/x.git@abc1234", "x @ git+https://h.example/x.git@abc1234", True),
    ],
)
def test_specifier_compatibility(a: str, b: str, ok: bool) -> None:
    from packaging.requirements import Requirement

    assert compatible(Requirement(a), Requirement(b)) is ok
    assert compatible(Requirement(b), Requirement(a)) is ok


# --------------------------------------------------------------------------------------- data safety


@pytest.mark.parametrize(
    "bad",
    [
        "--index-url=https://evil.example/simple",
        "-e git+https://github.com/x/y.git",
        "diffusers==0.33.1; os_name == 'posix'",
        "diffusers==0.33.1 $(id)",
        "x @ https://evil.example/x.whl",
        "x @ git+https://github.com/x/y.git@main?x=1",
        "x @ git+ssh://git@github.com/x/y.git@main",
    ],
)
def test_requirement_tokens_reject_flags_markers_and_foreign_urls(bad: str) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(PipRequirement).validate_python(bad)


def test_other_tokens() -> None:
    TypeAdapter(PipRequirement).validate_python(
        "transformers @ git+https://github.com/huggingface/transformers.git@c0dbe09"
    )
    for bad in [
        "http://x.example/a",
        "https://x.example/a?b=1",
        "https://u:p@x.example/",
        "https://x.example/a b",
    ]:
        with pytest.raises(ValidationError):
            TypeAdapter(HttpsUrl).validate_python(bad)
    for bad in ["../../etc/passwd", "/etc/passwd", "-rf", "a/../../b"]:
        with pytest.raises(ValidationError):
            TypeAdapter(RelPath).validate_python(bad)


def test_overlay_rejects_unknown_install_sh_options_and_mismatched_msid() -> None:
    with pytest.raises(ValidationError, match=r"unknown scripts/install\.sh option"):
        DepsOverlay(install_sh=["--msid", "abc1234", "--index-url", "x"])
    with pytest.raises(ValidationError, match="differs from mindspeed_commit"):
        DepsOverlay(install_sh=["--msid", "abc1234"], mindspeed_commit="def5678")
    with pytest.raises(ValidationError):
        DepsOverlay(install_sh=["--msid", "$(id)"])
    with pytest.raises(ValidationError):
        DepsOverlay(scripts=["../outside.sh"])


def _data_copy(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    return data


def test_install_yaml_is_cross_checked_against_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _data_copy(tmp_path)
    install = yaml.safe_load((data / "install.yaml").read_text())
    install["torch_npu"]["26.1.0"]["version"] = "2.6.0.post3"  # not built for torch 2.7.1
    (data / "install.yaml").write_text(yaml.safe_dump(install))
    monkeypatch.setenv("MM_AGENT_REGISTRY_DIR", str(data))
    with pytest.raises(MMAgentError, match=r"not built for torch 2\.7\.1"):
        plan("wan2.1", version="26.1.0")


def test_overlays_may_not_pin_packages_that_have_their_own_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _data_copy(tmp_path)
    model = data / "models" / "vace.yaml"
    model.write_text(
        model.read_text().replace("pip: [diffusers==0.33.1]", "pip: [diffusers==0.33.1, decord==0.6.0]")
    )
    assert load_models(data)["vace"].deps[0].pip[-1] == "decord==0.6.0"
    monkeypatch.setenv("MM_AGENT_REGISTRY_DIR", str(data))
    with pytest.raises(MMAgentError, match="installed by its own step"):
        plan("vace")


def test_request_rejects_extra_fields_and_shell_metacharacters() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        InstallRequest(model="wan2.1", index_url="https://evil.example/simple")  # type: ignore[call-arg]
    for bad in ["wan2.1; rm -rf ~", "wan2.1$(id)", "`id`", "wan2.1 && curl x", "-e"]:
        with pytest.raises(ValidationError):
            InstallRequest(model=bad)
    with pytest.raises(ValidationError):
        InstallRequest(model="wan2.1", also_models=["qwen3vl|sh"])
    with pytest.raises(ValidationError):
        InstallRequest(model="wan2.1", steps=["torch --index-url x"])
    with pytest.raises(ValidationError):
        InstallRequest(model="wan2.1", python="3.10; id")


# -------------------------------------------------------------------------------------------- script

SCRIPT_CASES = [
    (m, a, f)
    for m in ("wan2.1", "wan2.2", "qwen2.5vl", "qwen3vl", "deepseekocr", "qwen3_5", "funasr", "flux", "ltx2")
    for a in ARCHES
    for f in ("debian", "rhel")
]


@pytest.mark.parametrize(("model", "arch", "family"), SCRIPT_CASES)
def test_script_passes_bash_n_and_shellcheck(model: str, arch: str, family: str, tmp_path: Path) -> None:
    p = plan(model, arch, os_family=family, env="conda" if family == "rhel" else "venv")
    script = tmp_path / "install.sh"
    script.write_text(p.script)
    assert p.script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in p.script
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    check = subprocess.run([str(SHELLCHECK), str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    for s in p.steps:
        assert f"begin {shlex.quote(s.id)} " in p.script and shlex.quote(s.why) in p.script


def test_script_quotes_every_word(tmp_path: Path) -> None:
    weird = tmp_path / "dir with 'quote' and $HOME"
    p = plan("wan2.1", mm_root=str(weird / "MindSpeed-MM"), env_path=str(weird / "env"))
    script = tmp_path / "install.sh"
    script.write_text(p.script)
    assert subprocess.run([str(SHELLCHECK), str(script)], capture_output=True).returncode == 0
    # the dry-run listing of one step shows the path literally, not expanded
    out = subprocess.run(
        ["bash", str(script), "cann"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nowhere"},
    )
    assert out.returncode == 0, out.stderr
    assert "manual step" in out.stdout and "source /usr/local/Ascend/cann/set_env.sh" in out.stdout
    assert not (tmp_path / "dir with 'quote' and /nowhere").exists()


# ------------------------------------------------------------------------------------ host and reuse


@pytest.mark.parametrize(
    ("text", "family"),
    [
        ('NAME="openEuler"\nID="openEuler"\nVERSION_ID="24.03"\n', "rhel"),
        ('ID=kylin\nID_LIKE="rhel fedora"\n', "rhel"),
        ("ID=ubuntu\nID_LIKE=debian\n", "debian"),
        ("ID=debian\n", "debian"),
    ],
)
def test_host_os_family_from_os_release(tmp_path: Path, text: str, family: str) -> None:
    os_release = tmp_path / "os-release"
    os_release.write_text(text)
    assert host_os_family(os_release) == family


def test_pipeline_shows_the_planned_steps() -> None:
    """route_model's env_setup/model_deps stages are rendered from the same steps the installer runs."""
    from mm_agent.pipeline import build_pipeline

    entry = get_registry().get("wan2.2")
    env_setup, model_deps = build_pipeline(entry, entry.tasks[0], entry.sizes[0], "26.0.0")[:2]
    p = plan("wan2.2", host_arch())
    npu = shlex.join(["pip", "install", step(p, "torch-npu").commands[0].argv[-1]])
    assert npu in env_setup.commands
    assert f"git -C MindSpeed-MM/MindSpeed checkout {W22_MSID}" in env_setup.commands
    here = "."  # env_setup leaves the shell in the checkout: model_deps paths are relative to it
    for line in env_setup.commands:
        here = posixpath.normpath(posixpath.join(here, line[3:])) if line.startswith("cd ") else here
    assert here == "MindSpeed-MM"
    assert model_deps.commands == ["pip install -r examples/wan2.2/requirements.txt"]
    assert any("scripts/install.sh --megatron --msid" in n for n in model_deps.notes)


def test_cli_path_with_control_characters_is_refused() -> None:
    with pytest.raises(ValidationError):
        InstallRequest(model="wan2.1", mm_root="a\x00b")
