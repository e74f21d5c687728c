"""The addresses mm-agent serves resources under, the size a served file may have, and the error for an
address that names nothing.

Apart from `resources` (which reads what they name) so the server registers its resources at start-up without
loading the registry, routing and skills behind them.
"""

from __future__ import annotations

from mm_agent.errors import MMAgentError

SCHEME = "mm-agent://"
# a host may attach a resource to the model's context unasked: a served file is never larger than this
MAX_FILE_BYTES = 256 * 1024

# The MCP Skills extension (SEP-2640): skills are ordinary resources under `skill://<name>/SKILL.md` (files
# relative to it, e.g. `skill://<name>/references/models.md`), and `skill://index.json` names them all in the
# Agent Skills discovery-index shape, so a skill-aware host finds every skill in one read without fetching
# each SKILL.md. Served beside `mm-agent://skills/...` (the same files), which older clients already use.
SKILL_SCHEME = "skill://"
SKILL_INDEX_URI = f"{SKILL_SCHEME}index.json"


class UnknownResource(MMAgentError):
    """The URI names nothing mm-agent serves (unknown model, missing or refused path); the server answers
    with the protocol's resource-not-found error rather than a server failure."""
