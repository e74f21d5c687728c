"""The tool workflows the skills prescribe, loaded from `workflows.yaml` (knowledge as data).

One file feeds three consumers, so they cannot disagree: the skill templates render the steps, the MCP
prompts are built from them, and `tests/test_skill_workflows.py` walks each scenario's steps in order
against a real MCP client session (and checks every `tool` is registered and every `cli` parses).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mm_agent.errors import MMAgentError
from mm_agent.registry import load_data

WORKFLOWS_FILE = Path(__file__).with_name("workflows.yaml")
SLUG = r"^[a-z0-9]+(-[a-z0-9]+)*$"
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkflowStep(_Strict):
    """One tool call; a `confirm` step is called as a dry run first and confirmed with the user."""

    id: str = Field(pattern=SLUG)
    tool: str = Field(pattern=r"^[a-z_]+$", description="MCP tool name")
    cli: str = Field(
        description="the equivalent mm-agent command ({placeholders}); the dry run for confirm steps"
    )
    cli_confirm: str | None = Field(
        default=None, description="the command that performs a confirm step once the user agreed"
    )
    why: str
    confirm: bool = Field(default=False, description="mutating: dry run first, confirm with the user")
    when: str | None = Field(default=None, description="decision point: when to run it and what to pick")
    on_error: str | None = None

    @model_validator(mode="after")
    def _commands(self) -> WorkflowStep:
        for cmd in (self.cli, self.cli_confirm):
            if cmd is not None and not cmd.startswith("mm-agent "):
                raise ValueError(f"step {self.id}: commands start with 'mm-agent ', got {cmd!r}")
        if self.confirm != (self.cli_confirm is not None):
            raise ValueError(
                f"step {self.id}: a confirm step needs cli_confirm, and only a confirm step has it"
            )
        return self

    @property
    def placeholders(self) -> list[str]:
        """The `{names}` the assistant fills in, in order of first use."""
        text = f"{self.cli} {self.cli_confirm or ''}"
        return list(dict.fromkeys(_PLACEHOLDER.findall(text)))


class Workflow(_Strict):
    id: str = Field(pattern=SLUG)
    title: str
    skill: str = Field(pattern=SLUG, description="the skill that prescribes this workflow")
    example: str = Field(description="a user request this workflow answers")
    description: str
    steps: list[WorkflowStep] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_steps(self) -> Workflow:
        ids = [s.id for s in self.steps]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"workflow {self.id}: duplicate step ids {dupes}")
        return self

    @property
    def tools(self) -> list[str]:
        """Tool names in the order the steps first use them."""
        return list(dict.fromkeys(s.tool for s in self.steps))


class Workflows(_Strict):
    scenarios: list[Workflow] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_scenarios(self) -> Workflows:
        ids = [w.id for w in self.scenarios]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate scenario ids in {ids}")
        return self

    def get(self, scenario_id: str) -> Workflow:
        for workflow in self.scenarios:
            if workflow.id == scenario_id:
                return workflow
        raise MMAgentError(
            f"no workflow {scenario_id!r}",
            file=str(WORKFLOWS_FILE),
            fix=f"use one of: {', '.join(w.id for w in self.scenarios)}",
        )

    def for_skill(self, skill: str) -> list[Workflow]:
        return [w for w in self.scenarios if w.skill == skill]

    def cli_for_tools(self) -> dict[str, str]:
        """Tool name -> the first CLI command any workflow gives for it (the skills' tool/CLI table)."""
        table: dict[str, str] = {}
        for workflow in self.scenarios:
            for step in workflow.steps:
                table.setdefault(step.tool, step.cli)
        return dict(sorted(table.items()))


def parse_workflows(path: Path) -> Workflows:
    """Validate one workflows file; a malformed file fails with its file and field path."""
    return load_data(Workflows, path, schema="mm_agent/skills/workflows.py")


@functools.cache
def load_workflows() -> Workflows:
    """The packaged workflows, loaded and validated once."""
    return parse_workflows(WORKFLOWS_FILE)
