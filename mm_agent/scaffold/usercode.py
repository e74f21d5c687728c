"""A scaffolded model's code as the jobs that train it see it: the files under its code root (the checkout or the
overlay `mm-agent new-model` wrote) and its own model.json, read at render time so a job trains what the user's
files say now (edits included), not what the scaffold first wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.registry.schema import ModelEntry


def user_code(entry: ModelEntry) -> dict[str, Any]:
    """{root, dit_file, predictor_class, fsdp2_config, model_config (parsed), predictor}; errors name the file."""
    user = entry.user
    if user is None:
        raise MMAgentError(
            f"{entry.id} is not a scaffolded model", field="model", fix="this is an mm-agent bug"
        )
    root = Path(user.code_root)
    paths = {role: root / rel for role, rel in user.files.items()}
    for role in ("dit", "model_config", "fsdp2_config"):
        if not paths[role].is_file():
            raise MMAgentError(
                f"{entry.id}'s {role} file is missing",
                file=str(paths[role]),
                field=f"user.files.{role}",
                fix=f"write it again: mm-agent new-model {entry.id} --yes (same arguments), or fix code_root in "
                f".mm-agent/models/{entry.id}.yaml",
            )
    try:
        config = json.loads(paths["model_config"].read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MMAgentError(
            f"cannot read it as JSON: {exc}", file=str(paths["model_config"]), fix="fix the JSON"
        ) from None
    predictor = config.get("predictor") if isinstance(config, dict) else None
    if not isinstance(predictor, dict):
        raise MMAgentError(
            "no `predictor` object", file=str(paths["model_config"]), field="predictor", fix="restore it"
        )
    return {
        "root": str(root),
        "dit_file": str(paths["dit"]),
        "predictor_class": user.predictor_class,
        "fsdp2_config": str(paths["fsdp2_config"]),
        "entry_script": user.files.get("entry"),
        "model_config": config,
        "fsdp2_text": paths["fsdp2_config"].read_text(encoding="utf-8"),
        "predictor": predictor,
    }
