"""The README and the documentation pages say what the code does: their numbers, tool list, prompt and resource
tables and doctor checks are read back from the code, so a change in one without the other fails here instead of
drifting (issue 29 found "under 16,000 characters" for a 16,207-character tools/list, a tool missing from the
list and "26 checks" for 30). The README stays short enough for a newcomer, keeps the test command `.ci/run`
reads, and its commands parse with the real CLI; `mkdocs build --strict` in `.ci/run` checks the site's links."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import anyio
import pytest
import yaml
from mcp.server import MCPServer

from mm_agent.cli import build_parser
from mm_agent.server import build_server

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 250  # what a newcomer can hold: the first screens, then links (issue 29)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Listed:
    tools: frozenset[str]
    tools_list_size: int  # characters of compact JSON, as tests/test_mcp.py measures it
    prompts: frozenset[str]
    templates: frozenset[str]  # resource templates
    resources: frozenset[str]


@cache
def _server_lists() -> Listed:
    """What a client of a fresh server sees: the tools (with tools/list's size as test_mcp measures it), the
    prompts and the resources (the workspace is an empty folder, so no job files are listed)."""

    async def read(server: MCPServer) -> Listed:
        tools = await server.list_tools()
        size = len(
            json.dumps(
                [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools],
                separators=(",", ":"),
            )
        )
        return Listed(
            tools=frozenset(t.name for t in tools),
            tools_list_size=size,
            prompts=frozenset(p.name for p in await server.list_prompts()),
            templates=frozenset(t.uri_template for t in await server.list_resource_templates()),
            resources=frozenset(str(r.uri) for r in await server.list_resources()),
        )

    with tempfile.TemporaryDirectory() as workspace:
        return anyio.run(read, build_server(Path(workspace)))


def _tools() -> set[str]:
    return set(_server_lists().tools)


def _checks() -> list[str]:
    import mm_agent.doctor  # noqa: F401  (registers every check)
    from mm_agent.doctor.registry import CHECKS

    return list(CHECKS)


def _versions() -> tuple[str, str, str]:
    """(the oldest release, the newest release, the default) of the version table; master comes last."""
    from mm_agent.registry import load_versions

    table = load_versions()
    ids = [v.id for v in table.versions if v.id != "master"]
    return ids[0], ids[-1], str(table.default)


def _tools_list_budget() -> int:
    from tests.test_mcp import TOOLS_LIST_BUDGET

    return TOOLS_LIST_BUDGET


def _answer_budget() -> int:
    from tests.test_mcp_answers import ANSWER_BUDGET

    return ANSWER_BUDGET


def _models() -> int:
    from mm_agent.registry import shipped_registry

    return len(shipped_registry().models)


def _signatures() -> int:
    from mm_agent.diagnose.catalog import get_catalog

    return len(get_catalog())


def _skills() -> int:
    return sum(1 for p in (REPO / "skills").iterdir() if (p / "SKILL.md").is_file())


def _python() -> str:
    spec = re.search(r'requires-python = ">=([\d.]+)"', _text(REPO / "pyproject.toml"))
    assert spec, "pyproject.toml has no requires-python"
    return spec.group(1)


def _torch_pin() -> str:
    pin = re.search(r"^torch==(\S+)", _text(REPO / "constraints.txt"), re.M)
    assert pin, "constraints.txt pins no torch"
    return pin.group(1)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass(frozen=True)
class Claim:
    """A number the pages state, how to find it (one group; whitespace may wrap), and what the code says."""

    name: str
    pattern: str
    truth: Callable[[], object]
    in_readme: bool = False  # the README must state it (so a rewording cannot switch the check off)
    read: Callable[[str], object] = _number


CLAIMS = [
    Claim("MCP tools", r"\b(\d+)\s+tools\b", lambda: len(_tools()), in_readme=True),
    Claim("registry models", r"\b(\d+)\s+models\b", _models, in_readme=True),
    Claim("doctor checks", r"\b(\d+)\s+checks\b", lambda: len(_checks()), in_readme=True),
    Claim(
        "tools/list budget",
        r"`tools/list`[^.|`]{0,40}?\b(\d{1,3}(?:,\d{3})+)\s+characters",
        _tools_list_budget,
        in_readme=True,
    ),
    Claim(
        "default answer budget",
        r"default\s+answer\s+stays\s+under\s+(\d{1,3}(?:,\d{3})+)\s+characters",
        _answer_budget,
        in_readme=True,
    ),
    Claim("failure signatures", r"\b(\d+)\s+failure\s+signatures\b", _signatures),
    Claim("generated skills", r"\b(\d+)\s+generated\s+\[Agent\s+Skills\]", _skills),
    Claim("Python", r"Python\s+≥\s+(3\.\d+)", _python, in_readme=True, read=str),
    Claim("torch pin", r"pins\s+`torch==([^`]+)`", _torch_pin, in_readme=True, read=str),
    Claim(
        "releases covered",
        r"MindSpeed-MM\s+(\d[\d.]*)\s+to\s+(\d[\d.]*)\s+and\s+master|MM\s+(\d[\d.]*)\s+…\s+(\d[\d.]*)/master",
        lambda: _versions()[:2],
        in_readme=True,
        read=lambda text: text,
    ),
    Claim(
        "default release",
        r"default\s+MindSpeed-MM\s+version\s+\((\d[\d.]*)\)|registry\s+default,\s+(\d[\d.]*)\)",
        lambda: _versions()[2],
        read=str,
    ),
]


def _found(claim: Claim, text: str) -> list[object]:
    values: list[object] = []
    for m in re.finditer(claim.pattern, text):
        groups = [g for g in m.groups() if g is not None]
        values.append(tuple(groups) if len(groups) > 1 else claim.read(groups[0]))
    return values


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.name)
def test_numbers_on_the_pages_are_the_codes(claim: Claim) -> None:
    truth = claim.truth()
    found = {page.relative_to(REPO).as_posix(): _found(claim, _text(page)) for page in _pages()}
    stated = {page: values for page, values in found.items() if values}
    assert stated, (
        f"no page states the {claim.name} any more ({claim.pattern!r}); state it, or drop the claim"
    )
    if claim.in_readme:
        assert "README.md" in stated, f"README.md no longer states the {claim.name} ({claim.pattern!r})"
    wrong = {page: values for page, values in stated.items() if any(v != truth for v in values)}
    assert not wrong, f"the {claim.name} is {truth} in the code, but the pages say {wrong}: update them"


def test_tools_list_fits_the_size_the_pages_state() -> None:
    size = _server_lists().tools_list_size
    assert size <= _tools_list_budget(), (
        f"tools/list is {size} characters, over the {_tools_list_budget():,} the README states"
    )


def test_doctor_example_adds_up_to_every_check() -> None:
    """The sample report's closing line counts every registered check once (the bundled runtime's own checks
    are skipped on a MindSpeed-MM run)."""
    text = _text(DOCS / "doctor.md")
    m = re.search(r"NOT READY: (\d+) failed, (\d+) warning\(s\), (\d+) ok, (\d+) skipped", text)
    assert m, "docs/doctor.md has no sample summary line"
    assert sum(map(int, m.groups())) == len(_checks()), f"{m.group(0)!r} does not add up to {len(_checks())}"


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells) of the markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert start is not None, f"no table headed {header!r}"
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))])
    return rows


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def test_readme_tool_table_is_the_servers() -> None:
    """Every tool the server registers is in the README's table, once, with the CLI command that is its
    equivalent (a real subcommand of `mm-agent`)."""
    text = _text(README)
    assert "<!-- readme:tools -->" in text
    rows = _table(text.split("<!-- readme:tools -->", 1)[1].lstrip(), "| tool | CLI |")
    listed = [name for row in rows for name in _names(row[0])]
    assert sorted(listed) == sorted(_tools()), (
        f"README.md tool table: missing {sorted(_tools() - set(listed))}, "
        f"not registered {sorted(set(listed) - _tools())}"
    )
    subcommands = {
        name
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    }
    bad = {row[0]: row[1] for row in rows if not _names(row[1]) <= subcommands}
    assert not bad, f"README.md tool table names CLI commands mm-agent does not have: {bad}"


def test_mcp_page_lists_every_tool_prompt_and_resource() -> None:
    text = _text(DOCS / "mcp.md")
    tools = {n for row in _table(text, "| tool | does |") for n in _names(row[0])}
    assert tools == _tools(), f"docs/mcp.md tools: missing {_tools() - tools}, extra {tools - _tools()}"
    prompts = {n for row in _table(text, "| prompt | arguments |") for n in _names(row[0])}
    registered = _server_lists().prompts
    assert prompts == registered, f"docs/mcp.md prompts {sorted(prompts)} vs registered {registered}"
    templates = _server_lists().templates
    # a listed resource that one of the templates names (each skill's page) is documented by its template
    shapes = [re.compile(re.sub(r"\\\{[^}]+\\\}", ".+", re.escape(t)) + "$") for t in templates]
    listed = {r for r in _server_lists().resources if not any(s.match(r) for s in shapes)}
    missing = sorted(u for u in templates | listed if f"`{u}`" not in text)
    assert not missing, f"docs/mcp.md's resource table does not name {missing}"


def test_doctor_page_lists_every_check() -> None:
    rows = _table(_text(DOCS / "doctor.md"), "| check | what it looks at |")
    listed = [n for row in rows for n in _names(row[0])]
    checks = _checks()
    assert sorted(listed) == sorted(checks), (
        f"docs/doctor.md check table: missing {sorted(set(checks) - set(listed))}, "
        f"not registered {sorted(set(listed) - set(checks))}"
    )


def test_diagnose_page_lists_every_category() -> None:
    """The category list is what users grep for; it must name every stable id."""
    from mm_agent.diagnose.schema import CATEGORIES

    text = _text(DOCS / "diagnose.md")
    missing = [c for c in CATEGORIES if f"`{c}`" not in text]
    assert not missing, f"docs/diagnose.md does not list categories {missing}"


def test_readme_is_short_and_keeps_the_ci_test_command() -> None:
    text = _text(README)
    assert text.count("\n") < README_MAX_LINES, (
        f"README.md is {text.count(chr(10))} lines (at most {README_MAX_LINES})"
    )
    # the regex .ci/run reads the test command with
    m = re.search(r"<!-- ci:test-command -->\s*```bash\n(.+?)\n```", text, re.S)
    assert m, "README.md lost the ci:test-command block that .ci/run runs"
    command = m.group(1).strip()
    assert "\n" not in command and '-e ".[dev,runtime]"' in command and "-m pytest" in command, command
    assert f"```bash\n{command}\n```" in _text(DOCS / "setup.md"), "docs/setup.md shows another test command"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_reach_a_file_or_heading() -> None:
    text = _text(README)
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if not ((REPO / path).exists() if path else anchor in anchors):
            broken.append(target)
    assert not broken, f"README.md links to what is not there: {broken}"


def _readme_commands() -> list[str]:
    """Each `mm-agent ...` command of the README's bash blocks (chains split at `&&`, comments dropped)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", _text(README), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv and Path(argv[0]).name == "mm-agent":
                    commands.append(shlex.join(argv[1:]))
    return commands


def test_readme_commands_parse_with_the_cli() -> None:
    commands = _readme_commands()
    assert len(commands) >= 8, commands  # the set-up lines and the five commands
    parser = build_parser()
    refused = []
    for command in commands:
        try:
            parser.parse_args(shlex.split(command))
        except SystemExit:
            refused.append(command)
    assert not refused, f"README.md shows commands mm-agent refuses: {refused}"


def test_site_nav_lists_every_page() -> None:
    """Every page under docs/ is in mkdocs.yml's nav, and every nav entry is a page (`mkdocs build --strict`
    in .ci/run checks the links between them)."""
    config = yaml.safe_load(_text(REPO / "mkdocs.yml"))
    assert config["docs_dir"] == "docs"

    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [p for item in nav for p in pages(item)]
        if isinstance(nav, dict):
            return [p for value in nav.values() for p in pages(value)]
        raise AssertionError(f"unexpected nav entry {nav!r}")

    listed = pages(config["nav"])
    assert len(listed) == len(set(listed)), f"a page is in the nav twice: {listed}"
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(listed) == on_disk, f"nav {sorted(listed)} vs docs/ {on_disk}"
