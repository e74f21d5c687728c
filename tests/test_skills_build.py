"""Skill build and install: generated files, check mode, frontmatter errors, install safety, CLI forms, and
the sync test that fails when a committed skill differs from what the registry generates."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mm_agent.cli import main
from mm_agent.errors import MMAgentError
from mm_agent.registry import get_registry
from mm_agent.skills.build import (
    MARK,
    BuildRequest,
    build_skills,
    read_tree,
    render_all,
    skill_names,
    skills_dir,
)
from mm_agent.skills.context import md_table, skill_context
from mm_agent.skills.install import BACKUPS, InstallSkillsRequest, install_skills

FIXTURE = Path(__file__).parent / "fixtures" / "skills_templates"
AGENTSKILLS = Path(sys.executable).with_name("agentskills")


@pytest.fixture
def templates(tmp_path: Path) -> Path:
    """A private copy of the fixture templates, so a test can edit them."""
    root = tmp_path / "templates"
    shutil.copytree(FIXTURE, root)
    return root


def build(templates: Path, out: Path, check: bool = False) -> dict[str, str]:
    result = build_skills(BuildRequest(templates_dir=str(templates), out_dir=str(out), check=check))
    return {f.path: f.status for f in result.files}


def agentskills_validate(skill_dir: Path) -> subprocess.CompletedProcess[str]:
    assert AGENTSKILLS.exists(), "install the dev extra: skills-ref provides `agentskills`"
    return subprocess.run([str(AGENTSKILLS), "validate", str(skill_dir)], capture_output=True, text=True)


def test_build_renders_registry_tables_with_header_deterministically(templates: Path, tmp_path: Path) -> None:
    out = tmp_path / "skills"
    assert build(templates, out) == {
        "demo-skill/SKILL.md": "written",
        "demo-skill/references/models.md": "written",
    }
    skill = (out / "demo-skill" / "SKILL.md").read_text()
    frontmatter, body = skill.split("---\n", 2)[1:]
    assert frontmatter.startswith("name: demo-skill\n")
    assert body.startswith(f"<!-- {MARK} from templates/demo-skill/SKILL.md.j2")  # after the frontmatter
    ctx = skill_context()
    for tool in ctx["tools"]:  # every tool of the real server, its annotation and its workflow command
        row = md_table([[tool.name, tool.mutating, ctx["cli"].get(tool.name)]], ["", "", ""]).splitlines()[2]
        assert f"\n{row}\n" in skill, row
    assert "| render_job | yes | mm-agent render " in skill and "| validate_configs | no | mm-agent " in skill
    models = (out / "demo-skill" / "references" / "models.md").read_text()
    assert models.startswith(f"<!-- {MARK} from templates/demo-skill/references/models.md.j2")
    vlm = [m.id for m in get_registry().models.values() if m.family == "vlm"]
    assert vlm and all(f"\n| {model_id} | " in models for model_id in vlm)
    assert agentskills_validate(out / "demo-skill").returncode == 0

    # determinism: a second build changes nothing, a build elsewhere is byte-identical
    assert set(build(templates, out).values()) == {"unchanged"}
    build(templates, tmp_path / "again")
    assert read_tree(tmp_path / "again") == read_tree(out)


def test_check_reports_changed_template_missing_and_stale_files_without_writing(
    templates: Path, tmp_path: Path
) -> None:
    out = tmp_path / "skills"
    assert set(build(templates, out, check=True).values()) == {"missing"}
    assert not out.exists()
    build(templates, out)
    assert set(build(templates, out, check=True).values()) == {"unchanged"}

    with (templates / "demo-skill" / "SKILL.md.j2").open("a") as f:
        f.write("A line the committed skill does not have.\n")
    (out / "demo-skill" / "references" / "old.md").write_text("no template makes this\n")
    before = read_tree(out)
    result = build_skills(BuildRequest(templates_dir=str(templates), out_dir=str(out), check=True))
    assert not result.up_to_date
    status = {f.path: f for f in result.files}
    assert status["demo-skill/SKILL.md"].status == "different"
    assert "+A line the committed skill does not have." in (status["demo-skill/SKILL.md"].diff or "")
    assert status["demo-skill/references/old.md"].status == "stale"
    assert status["demo-skill/references/models.md"].status == "unchanged"
    assert read_tree(out) == before  # check wrote nothing

    assert build(templates, out)["demo-skill/references/old.md"] == "removed"
    assert not (out / "demo-skill" / "references" / "old.md").exists()
    assert build_skills(BuildRequest(templates_dir=str(templates), out_dir=str(out), check=True)).up_to_date


def test_build_owns_only_generated_skill_dirs(templates: Path, tmp_path: Path) -> None:
    out = tmp_path / "skills"
    build(templates, out)
    shutil.copytree(out / "demo-skill", out / "renamed-skill")  # generated earlier, template gone since
    (out / "mine").mkdir()
    (out / "mine" / "SKILL.md").write_text("---\nname: mine\ndescription: the user's own skill\n---\n")
    statuses = build(templates, out, check=True)
    assert statuses["renamed-skill/SKILL.md"] == "stale" and not any(p.startswith("mine/") for p in statuses)
    build(templates, out)
    assert not (out / "renamed-skill").exists()
    assert (out / "mine" / "SKILL.md").read_text().startswith("---\nname: mine")

    # an output dir a person wrote, with a template's name, is refused and left as it was
    shutil.rmtree(out / "demo-skill")
    (out / "demo-skill").mkdir()
    (out / "demo-skill" / "SKILL.md").write_text("hand-written\n")
    with pytest.raises(MMAgentError, match="not generated by"):
        build(templates, out)
    assert (out / "demo-skill" / "SKILL.md").read_text() == "hand-written\n"
    assert not any(p.name.startswith(".") for p in out.iterdir())  # no temp dirs left behind


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("name: demo-skill", "name: demo-skill-2", "name"),
        ("name: demo-skill\n", "name: demo-skill\nkeywords: x\n", "keywords"),
        ("description: Test fixture", "description: " + "x" * 1100, "description"),
        ("description: Test fixture", "description: Uses <tool> tags.", "description"),
        ("name: demo-skill\n", "name: demo-skill\nmetadata:\n  version: 1.0\n", "metadata"),
        ("description: Test fixture for", "description: 'Test --- fixture for", "frontmatter"),
        ("[references/models.md](references/models.md)", "[x](references/nope.md)", "link"),
        ("# Demo skill\n", "# Demo skill\n" + "line\n" * 500, "body"),
    ],
)
def test_invalid_skill_names_template_and_field(
    templates: Path, tmp_path: Path, old: str, new: str, field: str
) -> None:
    path = templates / "demo-skill" / "SKILL.md.j2"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(MMAgentError) as err:
        build(templates, tmp_path / "skills")
    assert err.value.file == "templates/demo-skill/SKILL.md.j2"
    assert err.value.field == field
    assert not (tmp_path / "skills").exists()


def test_template_folder_without_skill_md_or_with_a_plain_file_is_an_error(
    templates: Path, tmp_path: Path
) -> None:
    (templates / "half-skill" / "references").mkdir(parents=True)
    with pytest.raises(MMAgentError, match=r"has no SKILL\.md\.j2"):
        skill_names(templates)
    shutil.rmtree(templates / "half-skill")
    (templates / "demo-skill" / "references" / "notes.md").write_text("plain\n")
    with pytest.raises(MMAgentError, match="not a template") as err:
        build(templates, tmp_path / "skills")
    assert err.value.file == "templates/demo-skill/references/notes.md"


def test_md_table_escapes_and_checks_width() -> None:
    table = md_table([["a|b", "two\nlines", None], [["x", "y"], True, 3]], ["h1", "h2", "h3"])
    assert table.splitlines() == [
        "| h1 | h2 | h3 |",
        "|---|---|---|",
        "| a\\|b | two lines |  |",
        "| x, y | yes | 3 |",
    ]
    with pytest.raises(ValueError, match="row has 1 cells"):
        md_table([["only"]], ["a", "b"])


def test_context_lists_the_real_tools_and_workflow_commands() -> None:
    from mm_agent.server import build_server

    ctx = skill_context()
    tools = {t.name: t for t in ctx["tools"]}
    import anyio

    real = {t.name: t for t in anyio.run(build_server(Path.cwd()).list_tools)}
    assert set(tools) == set(real)
    for name, tool in tools.items():
        annotations = real[name].annotations
        assert tool.mutating == (annotations is None or not annotations.read_only_hint), name
    assert tools["render_job"].mutating and not tools["validate_configs"].mutating
    assert set(ctx["cli"]) <= set(tools) and ctx["cli"]["validate_configs"].startswith("mm-agent validate")
    assert ctx["default_version"] == get_registry().versions.default
    assert [s.id for s in ctx["signatures"]] == sorted(s.id for s in ctx["signatures"])


def test_context_imports_no_torch() -> None:
    code = (
        "import sys; from mm_agent.skills.context import skill_context; skill_context(); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers', 'megatron')]; "
        "assert not bad, bad"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_install_dry_run_confirm_unchanged_refuse_and_force(templates: Path, tmp_path: Path) -> None:
    source, target = tmp_path / "skills", tmp_path / "host" / "skills"
    build(templates, source)

    plan = install_skills(InstallSkillsRequest(source=str(source), target=str(target)))
    assert plan.dry_run and [(s.name, s.status) for s in plan.skills] == [("demo-skill", "would_install")]
    assert not target.exists()

    done = install_skills(InstallSkillsRequest(source=str(source), target=str(target), confirm=True))
    assert [s.status for s in done.skills] == ["installed"]
    assert read_tree(target / "demo-skill") == read_tree(source / "demo-skill")
    again = install_skills(InstallSkillsRequest(source=str(source), target=str(target), confirm=True))
    assert [s.status for s in again.skills] == ["unchanged"]

    edited = target / "demo-skill" / "SKILL.md"
    edited.write_text(edited.read_text() + "my own note\n")
    plan = install_skills(InstallSkillsRequest(source=str(source), target=str(target)))
    assert [s.status for s in plan.skills] == ["conflict"]
    with pytest.raises(MMAgentError, match="differ from the new ones") as err:
        install_skills(InstallSkillsRequest(source=str(source), target=str(target), confirm=True))
    assert "--force" in (err.value.fix or "")
    assert edited.read_text().endswith("my own note\n")

    forced = install_skills(
        InstallSkillsRequest(source=str(source), target=str(target), confirm=True, force=True)
    )
    skill = forced.skills[0]
    assert skill.status == "replaced" and skill.backup_dir is not None
    backup = Path(skill.backup_dir)
    assert backup.parent == target / BACKUPS and backup.name.startswith("demo-skill.bak-")
    assert (backup / "SKILL.md").read_text().endswith("my own note\n")
    assert read_tree(target / "demo-skill") == read_tree(source / "demo-skill")
    assert sorted(p.name for p in target.iterdir()) == [BACKUPS, "demo-skill"]  # no temp dirs left


def test_install_defaults_to_claude_code_personal_skills(
    templates: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "skills"
    build(templates, source)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    plan = install_skills(InstallSkillsRequest(source=str(source)))
    assert plan.target == str(tmp_path / "home" / ".claude" / "skills")
    assert not (tmp_path / "home").exists()


def test_install_without_built_skills_says_how_to_build(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(MMAgentError, match="no skills") as err:
        install_skills(InstallSkillsRequest(source=str(tmp_path / "empty"), target=str(tmp_path / "t")))
    assert "mm-agent skills build" in (err.value.fix or "")


def test_cli_json_forms_and_exit_codes(
    templates: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, target = tmp_path / "skills", tmp_path / "host"
    base = ["skills", "build", "--templates", str(templates), "--out", str(out), "--json"]
    assert main(base) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["check"] is False and built["skills"] == ["demo-skill"]
    assert {f["status"] for f in built["files"]} == {"written"}
    assert main([*base, "--check"]) == 0
    assert json.loads(capsys.readouterr().out)["up_to_date"] is True

    skill_md = out / "demo-skill" / "SKILL.md"
    skill_md.write_text(skill_md.read_text() + "edited by hand\n")
    assert main([*base, "--check"]) == 1
    checked = json.loads(capsys.readouterr().out)
    assert checked["up_to_date"] is False
    assert [f["path"] for f in checked["files"] if f["status"] == "different"] == ["demo-skill/SKILL.md"]
    assert main([*base[:-1], "--check"]) == 1  # the human form exits 1 too, with the diff
    assert "-edited by hand" in capsys.readouterr().out
    assert main(base) == 0
    capsys.readouterr()

    inst = ["skills", "install", "--source", str(out), "--target", str(target), "--json"]
    assert main(inst) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dry_run"] is True and plan["skills"][0]["status"] == "would_install"
    assert not target.exists()
    assert main([*inst, "--yes"]) == 0
    assert json.loads(capsys.readouterr().out)["skills"][0]["status"] == "installed"
    (target / "demo-skill" / "SKILL.md").write_text("edited\n")
    assert main([*inst, "--yes"]) == 2
    err = capsys.readouterr().err
    assert "fix:" in err and "--force" in err and "Traceback" not in err
    assert main([*inst, "--yes", "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["skills"][0]["status"] == "replaced"


def test_committed_skills_match_the_registry() -> None:
    """Fails when skills/ differs from what templates/skills + the registry generate: run
    `mm-agent skills build` and commit the result."""
    result = build_skills(BuildRequest(check=True))
    differences = [f for f in result.files if f.status != "unchanged"]
    report = "\n".join(f"{f.status}: {f.path}\n{f.diff or ''}" for f in differences)
    assert result.skills and not differences, f"run `mm-agent skills build`:\n{report}"


def test_committed_skills_pass_the_reference_validator() -> None:
    names = [p.name for p in sorted(skills_dir().iterdir()) if (p / "SKILL.md").is_file()]
    assert names == build_skills(BuildRequest(check=True)).skills
    for name in names:
        out = agentskills_validate(skills_dir() / name)
        assert out.returncode == 0, out.stderr


def test_weight_prep_skill_names_what_convert_runs_natively() -> None:
    """The native converter list comes from `mm_agent.convert.plan.NATIVE`: a new native method shows up
    in the skill, and the skill never claims one the code lacks."""
    from mm_agent.convert.plan import NATIVE
    from mm_agent.skills.context import words

    assert words(["a"]) == "a" and words(["a", "b"]) == "a and b" and words(["a", "b", "c"]) == "a, b and c"
    templates = Path(__file__).resolve().parents[1] / "templates" / "skills"
    ctx = skill_context()
    text = render_all(templates, ctx)["mindspeed-mm-weight-prep"]["SKILL.md"]
    for conv, methods in NATIVE.items():
        assert f"{conv} {words(sorted(methods))}" in text
    ctx["native"] = {"WanConverter": ["hf_to_mm"]}
    changed = render_all(templates, ctx)["mindspeed-mm-weight-prep"]["SKILL.md"]
    assert (
        "WanConverter hf_to_mm." in changed
        and "Qwen2_5_VLConverter" not in changed.split("Everything else")[0]
    )
