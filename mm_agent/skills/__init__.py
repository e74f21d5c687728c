"""Agent skills: the tool workflows as data (`workflows.yaml`) and the build of `skills/` from templates."""

from mm_agent.skills.build import BuildRequest, BuildResult, build_skills
from mm_agent.skills.context import skill_context
from mm_agent.skills.install import InstallSkillsRequest, InstallSkillsResult, install_skills
from mm_agent.skills.workflows import Workflow, Workflows, WorkflowStep, load_workflows

__all__ = [
    "BuildRequest",
    "BuildResult",
    "InstallSkillsRequest",
    "InstallSkillsResult",
    "Workflow",
    "WorkflowStep",
    "Workflows",
    "build_skills",
    "install_skills",
    "load_workflows",
    "skill_context",
]
