"""Rules for MLLM (VLM) jobs: the `attr` mapping against the dataset records, image/video tokens, the HF
model directory and the preprocessing cache location."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.validate.files import ConfigFile, jsonl_head
from mm_agent.validate.job import Job, exists, is_file, to_int
from mm_agent.validate.parse import join

SAMPLE = 200
MOUNTS = Path("/proc/mounts")
SHARED_FS = (
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "ceph",
    "glusterfs",
    "beegfs",
    "9p",
    "fuse",
    "afs",
    "pvfs2",
    "orangefs",
    "wekafs",
    "dfs",
)


def check(job: Job) -> None:
    for cfg in list(job.configs.values()):
        prefix = {"vlm_data": "", "transformers_yaml": "data", "fsdp2_trainer_yaml": "data"}.get(cfg.kind)
        if prefix is None:
            continue
        dp = cfg.get(join(prefix, "dataset_param"))
        if not isinstance(dp, dict):
            continue
        at = join(prefix, "dataset_param")
        _hf_dir(job, cfg, at)
        _datasets(job, cfg, at, dp)
        _cache_dir(job, cfg, at)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _quiet(job: Job, raw: Any, cfg: ConfigFile) -> Path | None:
    if not isinstance(raw, str) or not raw.strip():
        return None
    path = job.resolve(raw, base=cfg.run_base, search=cfg.search)
    return path if path is not None and job.inside(path) and exists(path) else None


def _hf_dir(job: Job, cfg: ConfigFile, at: str) -> None:
    field = f"{at}.preprocess_parameters.model_name_or_path"
    path = _quiet(job, cfg.get(field), cfg)
    if path is None or not path.is_dir():
        return
    lacking = [n for n in ("config.json", "preprocessor_config.json") if not (path / n).is_file()]
    if lacking:
        job.sink.info(
            "vlm.hf_dir_incomplete",
            str(cfg.path),
            f"model_name_or_path {path} has no {', '.join(lacking)}; it must be "
            "the original Hugging Face model directory (with the processor), not the converted one",
            "point model_name_or_path at the downloaded HF directory (e.g. "
            "./ckpt/hf_path/Qwen2.5-VL-3B-Instruct)",
            field=field,
            line=cfg.line(field),
        )


def _datasets(job: Job, cfg: ConfigFile, at: str, dp: dict[str, Any]) -> None:
    bp = _dict(dp.get("basic_parameters"))
    names = bp.get("dataset")
    field = f"{at}.basic_parameters.dataset"
    if not isinstance(names, str):
        return
    run, search = cfg.run_base, cfg.search  # where the training process reads them from
    base = (
        job.resolve(bp["dataset_dir"], base=run, search=search)
        if isinstance(bp.get("dataset_dir"), str)
        else None
    )
    for name in [n for n in names.split(",") if n.strip()]:
        candidates = [
            p
            for p in (
                job.resolve(name, base=base) if base else None,
                job.resolve(name, base=run, search=search),
            )
            if p
        ]
        found = next((p for p in candidates if job.inside(p) and is_file(p)), None)
        if found is None:
            _dataset_missing(job, cfg, field, name, candidates)
            continue
        records, source = _records(job, found)
        if records is not None:
            _check_records(job, cfg, at, _dict(dp.get("attr")), records, source)


def _dataset_missing(job: Job, cfg: ConfigFile, field: str, name: str, candidates: list[Path]) -> None:
    file, line = str(cfg.path), cfg.line(field)
    if not candidates:
        job.check_path(name, file=file, field=field, line=line, what="dataset")
        return
    if any(job.outside(p, file, field, line) for p in candidates):
        return
    tried = " and ".join(dict.fromkeys(str(p) for p in candidates))
    job.sink.warning(
        "path.missing",
        file,
        f"dataset {name.strip()!r} not found (tried {tried})",
        "fix basic_parameters.dataset (comma-separated, no spaces; absolute, or relative to dataset_dir or "
        "the MindSpeed-MM root); it may also only exist on the training cluster",
        field=field,
        line=line,
    )


def _records(job: Job, path: Path) -> tuple[list[Any] | None, ConfigFile | None]:
    if path.suffix == ".jsonl":
        try:
            out = jsonl_head(path, job.root, SAMPLE)
        except MMAgentError as exc:
            job.sink.error(
                "file.unreadable", str(path), f"cannot read: {exc.message}", exc.fix or "fix the dataset path"
            )
            return None, None
        except OSError:
            return None, None
        return out, None
    data = job.load(path)
    if data is None or not isinstance(data.data, list):
        return None, None
    return data.data[:SAMPLE], data


def _count(text: Any, token: str) -> int:
    return text.count(token) if isinstance(text, str) else 0


def _media(record: dict[str, Any], key: Any) -> int:
    value = record.get(key) if isinstance(key, str) else None
    return len(value) if isinstance(value, list) else (1 if isinstance(value, str) and value else 0)


def _check_records(
    job: Job, cfg: ConfigFile, at: str, attr: dict[str, Any], records: list[Any], source: ConfigFile | None
) -> None:
    file, shown = str(cfg.path), str(source.path) if source else "the dataset"
    problems: dict[str, tuple[int, str, str]] = {}  # attr key -> (count, first message, fix)
    token_bad: list[tuple[int, str]] = []
    msg_key, role_tag, content_tag = attr.get("messages"), attr.get("role_tag"), attr.get("content_tag")
    roles = {
        attr.get(k) for k in ("user_tag", "assistant_tag", "system_tag", "observation_tag", "function_tag")
    }
    roles.discard(None)

    def note(key: str, message: str, fix: str) -> None:
        count, first, first_fix = problems.get(key, (0, message, fix))
        problems[key] = (count + 1, first, first_fix)

    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            note("messages", f"record {i} of {shown} is not an object", "make every record a JSON object")
            continue
        messages = rec.get(msg_key) if isinstance(msg_key, str) else None
        if isinstance(msg_key, str) and not isinstance(messages, list):
            guess = next(
                (k for k, v in rec.items() if isinstance(v, list) and v and isinstance(v[0], dict)), None
            )
            note(
                "messages",
                f"record {i} of {shown} has no {msg_key!r} list (keys: {sorted(rec)})",
                f"set attr.messages to {guess!r}" if guess else f"put the conversation under {msg_key!r}",
            )
            continue
        for m in messages or []:
            if not isinstance(m, dict):
                continue
            for key, tag in (("role_tag", role_tag), ("content_tag", content_tag)):
                if isinstance(tag, str) and tag not in m:
                    note(
                        key,
                        f"a message in record {i} has no {tag!r} key (keys: {sorted(m)})",
                        f"set attr.{key} to the message key used in the data ({'/'.join(sorted(m))})",
                    )
            role = m.get(role_tag) if isinstance(role_tag, str) else None
            if roles and role is not None and role not in roles:
                note(
                    "user_tag",
                    f"record {i} uses role {role!r}; attr expects one of {sorted(map(str, roles))}",
                    "set attr.user_tag / attr.assistant_tag to the role names used in the data "
                    "(e.g. human/gpt), or rename the roles to user/assistant",
                )
        text = [
            m.get(content_tag) for m in messages or [] if isinstance(m, dict) and isinstance(content_tag, str)
        ]
        for token, key in (("<image>", "images"), ("<video>", "videos")):
            tokens = sum(_count(t, token) for t in text)
            media_key = attr.get(key)
            if media_key is None and _media(rec, key):
                note(
                    key,
                    f"record {i} has {key!r} but attr.{key} is null, so they are ignored",
                    f'set attr.{key}: "{key}"',
                )
            elif isinstance(media_key, str) and tokens and media_key not in rec:
                alt = next((k for k in rec if k.rstrip("s") == media_key.rstrip("s")), None)
                note(
                    key,
                    f"record {i} has {tokens} {token} token(s) but no {media_key!r} key",
                    f"set attr.{key} to {alt!r}" if alt else f"add the file list under {media_key!r}",
                )
            elif tokens != _media(rec, media_key) and (tokens or isinstance(media_key, str)):
                token_bad.append((i, f"{tokens} {token} token(s) but {_media(rec, media_key)} {key}"))
    dicts = [r for r in records if isinstance(r, dict)]
    for key in ("audios",):  # (Qwen2.5-Omni's attr names audios; a dataset without them fails at load)
        column = attr.get(key)
        if dicts and isinstance(column, str) and key not in problems and not any(column in r for r in dicts):
            # SharegptDatasetConverter reads example[attr.audios] of every record (convert.py:217 at 26.0.0); the
            # `datasets` JSON loader gives a record None for a key only other records hold, none for a key no
            # record holds
            note(
                key,
                f"attr.{key} names {column!r}, which none of the first {len(dicts)} records of {shown} holds: "
                f"MindSpeed-MM reads it from every record and stops with KeyError: {column!r}",
                f"add {column!r} to the records (an empty list for none), or set attr.{key} to null",
            )
    for key, (count, first, fix) in problems.items():
        field = f"{at}.attr.{key}"
        job.sink.error(
            "vlm.attr_mismatch",
            file,
            f"attr does not match the dataset records ({count} problem(s) in the first "
            f"{len(records)}): {first}",
            fix,
            field=field,
            line=cfg.line(field) or cfg.line(f"{at}.attr"),
        )
    if token_bad:
        i, what = token_bad[0]
        job.sink.error(
            "vlm.image_tokens",
            str(source.path) if source else file,
            f"{len(token_bad)} record(s) have a media "
            f"token count that differs from their file list (record {i}: {what})",
            "put exactly one <image> (<video>) in the messages per entry of images (videos)",
            field=f"[{i}]",
            line=source.line(f"[{i}]") if source else None,
        )


def _shared_fs(path: Path) -> str | None:
    """fstype of the mount holding `path` when it is a network/shared filesystem, per the mount table."""
    try:
        lines = MOUNTS.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    best, fstype = "", ""
    target = str(path)
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
            best, fstype = mount, parts[2]
    return fstype if fstype.split(".")[0] in SHARED_FS else None


def _cache_dir(job: Job, cfg: ConfigFile, at: str) -> None:
    field = f"{at}.basic_parameters.cache_dir"
    raw = cfg.get(field)
    nnodes = max(
        (
            to_int(ln.cmd.launcher_flags.get("--nnodes", [None])[0]) or to_int(ln.env("NNODES")) or 1
            for ln, _ in job.users(cfg)
        ),
        default=1,
    )
    if not isinstance(raw, str) or not raw.strip() or nnodes <= 1:
        return
    path = job.resolve(raw, base=cfg.run_base, search=cfg.search)
    if path is None:
        return
    # every node of a multi-node job reads the job directory at the same path (shared storage, or the
    # cluster's volume): a cache inside it is shared whatever this machine's mount table says
    folder = job.job_dir(cfg.path)
    if path.is_relative_to(folder):
        job.sink.warning(
            "vlm.cache_dir_shared",
            str(cfg.path),
            f"cache_dir {raw!r} is inside the job directory {folder}, which all {nnodes} nodes mount; "
            "MindSpeed-MM says cache_dir must not be shared across nodes (they would write the same cache files)",
            "set cache_dir to a node-local disk outside the job (e.g. /tmp/mm-agent-cache"
            + str(folder)
            + "), "
            "or re-render the job (mm-agent renders it node-local on multi-node jobs)",
            field=field,
            line=cfg.line(field),
        )
        return
    fstype = _shared_fs(path)
    if fstype:
        job.sink.warning(
            "vlm.cache_dir_shared",
            str(cfg.path),
            f"cache_dir {raw!r} is on a shared {fstype} mount and the job "
            f"runs on {nnodes} nodes; MindSpeed-MM says cache_dir must not be shared across nodes",
            "set cache_dir to a node-local disk (e.g. /tmp/mm_cache), or set "
            "basic_parameters.preprocess_on_fly: true",
            field=field,
            line=cfg.line(field),
        )
