"""The scaffolded model as a registry entry in the workspace (`.mm-agent/models/<name>.yaml`), validated by the
same schema as the shipped models, so route/render/validate/estimate/diagnose treat it like one of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mm_agent.registry.schema import ModelEntry
from mm_agent.scaffold.plan import Plan

USER_MODELS = Path(".mm-agent") / "models"


def entry_data(plan: Plan, code_root: Path, mode: str) -> dict[str, Any]:
    req, arch, base = plan.req, plan.arch, plan.base
    hidden = arch.num_heads * arch.head_dim
    data: dict[str, Any] = {
        "id": req.name,
        "name": f"{plan.cls} (your model)",
        "family": "generative",
        "description": f"Your text-to-video DiT {plan.cls}, scaffolded from MindSpeed-MM's new-model guide on "
        f"{base.id}'s VAE and text encoder; MindSpeed-MM FSDP2 training (pretrain_{req.name}.py).",
        "example_dir": f"examples/{req.name}",
        "skill": "mindspeed-mm-generative",
        "status": "preview",
        "versions": {"since": req.mm_version} if req.mm_version != "master" else {"since": "master"},
        "aliases": [plan.cls.lower()] if plan.cls.lower() != req.name else [],
        "sizes": [
            {
                "id": "custom",
                "hf_ids": [base.hf_id],
                "parallel": {"npus_per_node": req.npus_per_node, "pipeline_num_layers": [arch.num_layers]},
                "arch": {
                    "hidden_size": hidden,
                    "num_heads": arch.num_heads,
                    "head_dim": arch.head_dim,
                    "num_layers": arch.num_layers,
                    "ffn_dim": arch.ffn_dim,
                    "freq_dim": arch.freq_dim,
                    "text_dim": arch.text_dim,
                    "in_dim": arch.in_channels,
                    "out_dim": arch.out_channels,
                    "patch_size": list(arch.patch_size),
                    "fsdp2_sharding_size": req.npus_per_node,
                },
            }
        ],
        "tasks": [
            {
                "id": "t2v",
                "backend": "megatron+fsdp2",
                "template": "user_dit",
                "entry_script": {"path": plan.path_of("entry")},
                "example_script": plan.path_of("launch"),
            }
        ],
        "notes": [
            f"Scaffolded by mm-agent new-model from base {base.id} for MindSpeed-MM {req.mm_version}; the DiT is "
            f"{plan.dit_file} ({plan.cls}), registered as PREDICTOR_MODEL_MAPPINGS[{req.name!r}].",
        ],
        "user": {
            "code_root": str(code_root),
            "mode": mode,
            "base": base.id,
            "mm_version": req.mm_version,
            "model_id": req.name,
            "predictor_class": plan.cls,
            "model_class": f"{plan.camel}Model",
            "dataset_class": f"{plan.camel}T2VDataset",
            "files": {role: path for path, role in plan.roles.items()},
        },
    }
    ModelEntry.model_validate(data)  # the same schema as the shipped models
    return data


def entry_text(data: dict[str, Any]) -> str:
    head = "# Your model's registry entry, written by `mm-agent new-model` (schema: mm_agent/registry/schema.py).\n"
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
