"""Rules for any job: script syntax, required/unknown keys, weight paths, FSDP2 launch settings."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.validate.files import ConfigFile
from mm_agent.validate.job import Job, Launch
from mm_agent.validate.keys import check_keys
from mm_agent.validate.parse import join

_WEIGHT_KEYS = ("from_pretrained", "model_name_or_path", "init_from_hf_path")
ROLE_KINDS = {
    "mm-data": ("feature_data", "fe_data", "sora_data", "vlm_data"),
    "mm-model": ("sora_model", "fe_model", "vlm_model", "inference_model"),
    "mm-tool": ("tools",),
    "yaml": ("transformers_yaml", "fsdp2_trainer_yaml"),
    "fsdp2-config": ("fsdp2_config",),
}
_BASH_LINE = re.compile(r"line (\d+): (.*)")


def check(job: Job) -> None:
    for script in job.scripts.values():
        _script_syntax(job, str(script.path), script.text)
        if not script.info.commands:
            _no_launch(job, script.path, script.info.delegates)
    own_data = _user_model_data(job)
    for cfg in job.configs.values():
        if cfg.path not in own_data:
            check_keys(job.sink, cfg)
        if cfg.kind not in ("job_yaml", "unknown", "raw_dataset", "vlm_dataset", "data_txt"):
            _weight_paths(job, cfg, cfg.data, "")
    for launch in job.launches:
        _fsdp2(job, launch)
        _roles(job, launch)


def _followed(job: Job, raw: str | None) -> bool:
    path = job.resolve(raw) if raw else None
    try:
        return path is not None and path.resolve() in job.scripts
    except (OSError, ValueError, RuntimeError):
        return False


def _no_launch(job: Job, path: Path, delegates: list[tuple[str | None, int]]) -> None:
    if any(_followed(job, raw) for raw, _ in delegates):
        return
    if delegates:
        raw, line = delegates[0]
        job.sink.info(
            "script.no_launch",
            str(path),
            f"runs another script ({raw or 'unknown path'}) that is not available "
            "here; its flags and config references were not checked",
            "validate the delegated script too (pass it, or set mm_root to the MindSpeed-MM checkout)",
            line=line,
        )
        return
    job.sink.info(
        "script.no_launch",
        str(path),
        "no torchrun/python command running a .py entry was found; flags, "
        "parallel sizes and config references were not checked",
        "launch the entry script directly in the file (e.g. `torchrun $DISTRIBUTED_ARGS pretrain_sora.py "
        "$GPT_ARGS ...`) so it can be checked",
    )


@functools.lru_cache(maxsize=256)
def _bash_syntax(text: str) -> tuple[int, str] | None:
    """`bash -n` verdict for a script text; cached by content because the server re-validates the
    same unchanged scripts many times and spawning bash dominates a validate call."""
    try:
        proc = subprocess.run(
            ["bash", "-n", "/dev/stdin"], input=text, capture_output=True, text=True, timeout=15, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.returncode, proc.stderr


_STRIP_CR = "s/\\r$//"  # sed's program that drops a CR before each newline


def _script_syntax(job: Job, file: str, text: str) -> None:
    if "\r\n" in text:
        job.sink.error(
            "script.crlf",
            file,
            "Windows (CRLF) line endings; bash fails with "
            "'syntax error near unexpected token' or '$'\\r': command not found'",
            f"convert the file to LF line endings: `{shlex.join(['dos2unix', file])}` "
            f"(or `{shlex.join(['sed', '-i', _STRIP_CR, file])}`)",
            line=text[: text.index("\r\n")].count("\n") + 1,
        )
    result = _bash_syntax(text.replace("\r\n", "\n"))
    if result is None or result[0] == 0:
        return
    stderr = result[1]
    errors = [m for m in (_BASH_LINE.search(ln) for ln in stderr.splitlines()) if m]
    line = int(errors[0].group(1)) if errors else None
    detail = errors[0].group(2) if errors else (stderr.strip().splitlines() or ["syntax error"])[0]
    job.sink.error(
        "script.syntax",
        file,
        f"bash syntax error: {detail}",
        f"fix the shell syntax{f' at line {line}' if line else ''} (check quotes, `fi`/`done`, and that "
        "every continued line ends with a bare backslash)",
        line=line,
    )


def _weight_paths(job: Job, cfg: ConfigFile, node: Any, path: str) -> None:
    """`from_pretrained` / `model_name_or_path` / `init_from_hf_path` that don't exist → path.missing
    (relative ones from where the reading process runs)."""
    if isinstance(node, dict):
        for key, value in node.items():
            is_weight = key in _WEIGHT_KEYS or (key == "image_encoder" and path.endswith("i2v_processor"))
            if is_weight and isinstance(value, str):
                here = join(path, str(key))
                job.check_path(
                    value,
                    file=str(cfg.path),
                    field=here,
                    line=cfg.line(here),
                    base=cfg.run_base,
                    search=cfg.search,
                    what=key,
                    fix=f"set {here} to the downloaded Hugging Face directory (absolute, or relative to the "
                    "MindSpeed-MM root); it may also only exist on the training cluster",
                )
            elif isinstance(value, dict | list):  # (a scalar holds no path to check)
                _weight_paths(job, cfg, value, join(path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            if isinstance(value, dict | list):
                _weight_paths(job, cfg, value, join(path, index))


def _roles(job: Job, launch: Launch) -> None:
    """A config passed in the wrong role (e.g. MM_DATA and MM_MODEL swapped)."""
    for role, cfg in launch.configs.items():
        if cfg.kind == "unknown" or cfg.kind in ROLE_KINDS[role]:
            continue
        file, field, line = launch.where(
            f"--{role}" if role.startswith("mm-") else None,
            f"MM_{role[3:].upper()}" if role.startswith("mm-") else None,
        )
        job.sink.error(
            "config.role_mismatch",
            file,
            f"{cfg.path.name} is passed as the {role} config but its content is a "
            f"{cfg.kind} file (expected {' or '.join(ROLE_KINDS[role])})",
            f"pass the right file for {role} (check that MM_DATA / MM_MODEL / MM_TOOL are not swapped)",
            field=field,
            line=line,
        )


def _uses_fsdp2(launch: Launch) -> bool:
    return launch.has("--use-torch-fsdp2")


def _fsdp2(job: Job, launch: Launch) -> None:
    """MindSpeed-MM's FSDP2 launch settings; the bundled runtime's FSDP2 needs neither."""
    if not _uses_fsdp2(launch) or launch.is_bundled:
        return
    info = launch.script.info
    file, field, line = launch.where("--use-torch-fsdp2")
    value = info.env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    var_line = info.var_lines.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if "CUDA_DEVICE_MAX_CONNECTIONS" not in info.env:
        job.sink.warning(
            "fsdp2.max_connections",
            str(launch.script.path),
            "FSDP2 is on but the script does not set CUDA_DEVICE_MAX_CONNECTIONS (it must be 2, not 1)",
            "add `export CUDA_DEVICE_MAX_CONNECTIONS=2` before the torchrun line (stock: "
            "'开启FSDP2时，不能置为1')",
            field="CUDA_DEVICE_MAX_CONNECTIONS",
            line=launch.cmd.line,
        )
    elif value is not None and value.strip() != "2":
        job.sink.error(
            "fsdp2.max_connections",
            str(launch.script.path),
            f"CUDA_DEVICE_MAX_CONNECTIONS={value} with FSDP2 (--use-torch-fsdp2); it must be 2 "
            "(stock scripts: '开启FSDP2时，不能置为1', must not be 1 when FSDP2 is on)",
            "set `export CUDA_DEVICE_MAX_CONNECTIONS=2`",
            field="CUDA_DEVICE_MAX_CONNECTIONS",
            line=var_line,
        )
    if not launch.has("--untie-embeddings-and-output-weights"):
        job.sink.warning(
            "fsdp2.untie",
            file,
            "--use-torch-fsdp2 without --untie-embeddings-and-output-weights; "
            "MindSpeed-MM's FSDP2 examples always pass both",
            "add --untie-embeddings-and-output-weights next to --use-torch-fsdp2"
            + (" (gpt_args: untie_embeddings_and_output_weights: true)" if launch.yaml_flags else ""),
            field=field,
            line=line,
        )


def _user_model_data(job: Job) -> set[Path]:
    """data.json of a scaffolded model (mm-agent new-model: its examples/<name>/ file, or a MindSpeed-MM job of
    it): its keys are the user's dataset class's arguments, not MindSpeed-MM's stock dataset_param, so the stock
    key rules do not judge it."""
    from mm_agent.jobfile import JOB_FILE, load_job_spec
    from mm_agent.registry import get_registry

    registry = get_registry()
    # the scaffold's own examples/<name>/data.json (validated before any job is rendered)
    scaffolded = {
        (Path(u.code_root) / u.files["data_config"]).resolve()
        for m in registry.models.values()
        if (u := m.user) is not None and "data_config" in u.files
    }
    out = {path for path in job.configs if job.resolved(path) in scaffolded} if scaffolded else set()
    for path in job.configs:
        job_file = path.parent / JOB_FILE
        if path.name != "data.json" or not job_file.is_file():
            continue
        try:
            spec = load_job_spec(job_file)
        except (MMAgentError, OSError, ValueError):
            continue  # an unreadable job.yaml: the rules that read it report it
        entry = registry.models.get(spec.model)
        if entry is not None and entry.user is not None and spec.runtime != "bundled":
            out.add(path)
    return out
