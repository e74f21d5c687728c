"""VLM records (LLaVA, ShareGPT or OpenAI-style chats) rewritten into the shape a model's data config reads.

MindSpeed-MM's VLM datasets read a JSON list through `SharegptDatasetConverter`, whose column and tag names come
from the data config's `dataset_param.attr` (`DatasetAttr`). A record it cannot use is not an error there: a wrong
role order turns into an empty example with one warning, and a `<image>` count that differs from the image count
raises `ValueError` deep inside the first training step. `to_mllm` decides both up front, record by record, and
says how to fix each one. Checked against MindSpeed-MM's own converter in
`tests/fidelity/test_conversations_upstream.py`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from mm_agent.dataset.limits import Refusal
from mm_agent.errors import MMAgentError

IMAGE = "<image>"
VIDEO = "<video>"

# MindSpeed-MM's `DatasetAttr` defaults (data_utils/func_utils/convert.py): what an `attr` key left out means.
_DATASET_ATTR_DEFAULTS: dict[str, str | None] = {
    "messages": "conversations",
    "images": None,
    "videos": None,
    "audios": None,
    "system": None,
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "system_tag": "system",
    "formatting": "sharegpt",
}
_REQUIRED = ("messages", "role_tag", "content_tag", "user_tag", "assistant_tag")

_TURN_KEYS = ("conversations", "messages")
_ROLE_KEYS = ("role", "from")
_CONTENT_KEYS = ("content", "value")
_IMAGE_KEYS = ("images", "image")
_VIDEO_KEYS = ("videos", "video")
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class Attr(BaseModel):
    """The `attr` block of a VLM data config: which record keys and role names MindSpeed-MM reads.

    The field defaults are the stock Qwen2.5-VL example's block; `from_config` fills keys a config leaves out
    with MindSpeed-MM's own `DatasetAttr` defaults instead, as MindSpeed-MM does."""

    messages: str = "messages"
    images: str | None = "images"
    videos: str | None = None
    audios: str | None = None  # (mm-agent writes no audio; the key is written, empty, when attr names it)
    system: str | None = None
    role_tag: str = "role"
    content_tag: str = "content"
    user_tag: str = "user"
    assistant_tag: str = "assistant"
    system_tag: str | None = None
    formatting: str = "sharegpt"

    @classmethod
    def from_config(cls, data_cfg: dict[str, Any]) -> Attr:
        """The attr of a parsed data config (`{"dataset_param": {"attr": {...}}}`, or the dataset_param)."""
        ds = data_cfg.get("dataset_param", data_cfg) if isinstance(data_cfg, dict) else {}
        given = ds.get("attr") if isinstance(ds, dict) else None
        given = given if isinstance(given, dict) else {}
        values = {key: given.get(key, default) for key, default in _DATASET_ATTR_DEFAULTS.items()}
        for key, value in values.items():
            if (key in _REQUIRED and value is None) or not isinstance(value, (str, type(None))):
                raise MMAgentError(
                    f"{value!r} is not a key name",
                    field=f"dataset_param.attr.{key}",
                    fix=f"set it to a string (the stock Qwen2.5-VL config uses {getattr(cls(), key)!r})",
                )
        if values["formatting"] != "sharegpt":
            raise MMAgentError(
                f"formatting {values['formatting']!r}: mm-agent writes conversation records (sharegpt) only",
                field="dataset_param.attr.formatting",
                fix='set "formatting": "sharegpt" (or leave it out) in the data config',
            )
        return cls.model_validate(values)


def placeholders(text: str) -> tuple[int, int]:
    """How many `<image>` and `<video>` placeholders `text` holds (what MindSpeed-MM's plugin counts)."""
    return text.count(IMAGE), text.count(VIDEO)


def _paths(value: Any) -> list[str] | None:
    """A media value as a list of paths; None when it is neither a string nor a list of strings."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [v for v in value if v]
    return None


def _first(record: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((record[k] for k in keys if record.get(k) is not None), None)


def _part_media(record: dict[str, Any], kind: str) -> list[str]:
    """Paths held inside OpenAI-style content parts (`{"type": "image", "image": "a.jpg"}`)."""
    found: list[str] = []
    turns = _first(record, _TURN_KEYS)
    for turn in turns if isinstance(turns, list) else []:
        parts = _first(turn, _CONTENT_KEYS) if isinstance(turn, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and part.get("type") in (kind, f"{kind}_url"):
                value = part.get(kind) or part.get(f"{kind}_url")
                value = value.get("url") if isinstance(value, dict) else value
                if isinstance(value, str) and value:
                    found.append(value)
    return found


def media_of(record: dict[str, Any]) -> list[str]:
    """Every image and then video path a record names, in any accepted shape, so the prober can check them."""
    found: list[str] = []
    for keys, kind in ((_IMAGE_KEYS, "image"), (_VIDEO_KEYS, "video")):
        listed = _paths(_first(record, keys)) or []
        found += listed or _part_media(record, kind)
    return found


def _text(content: Any) -> str | None:
    """A turn's content as text: a string, or OpenAI-style parts with each image/video part as its placeholder."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    pieces = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("image", "image_url"):
            pieces.append(IMAGE)
        elif kind in ("video", "video_url"):
            pieces.append(VIDEO)
        elif kind == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        else:
            return None
    return "".join(pieces)


def _turns(record: dict[str, Any], attr: Attr) -> list[tuple[str, str]] | Refusal:
    """(role, text) per turn, roles as user/assistant/system; or why the turns cannot be read."""
    turns = record.get(attr.messages)
    turns = turns if isinstance(turns, list) else _first(record, _TURN_KEYS)
    if not isinstance(turns, list) or not turns:
        return Refusal(
            code="no_conversation",
            reason="the record has no conversation (a non-empty `conversations` or `messages` list)",
            fix='give each record "messages": [{"role": "user", ...}, {"role": "assistant", ...}]',
        )
    out: list[tuple[str, str]] = []
    for number, turn in enumerate(turns, 1):
        raw_role = _first(turn, _ROLE_KEYS) if isinstance(turn, dict) else None
        role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
        if role is None:
            return Refusal(
                code="bad_role",
                reason=f"turn {number} has role {raw_role!r}",
                fix='mark every turn "role": "user"|"assistant"|"system" (or "from": "human"|"gpt"|"system")',
            )
        text = _text(_first(turn, _CONTENT_KEYS))
        if text is None or not text.strip():
            return Refusal(
                code="empty_turn",
                reason=f"turn {number} ({role}) has no text",
                fix="give every turn non-empty text (`content` or `value`), or drop the turn",
            )
        out.append((role, text))
    return out


def _order(turns: list[tuple[str, str]]) -> Refusal | None:
    """Why the turns are not user/assistant pairs after an optional leading system turn (None when they are)."""
    body = turns[1:] if turns[0][0] == "system" else turns
    roles = [role for role, _ in body]
    expected = ["user", "assistant"] * (len(roles) // 2 + 1)
    if roles and roles == expected[: len(roles)] and len(roles) % 2 == 0:
        return None
    shown = " > ".join(role for role, _ in turns)
    return Refusal(
        code="turn_order",
        reason=f"turns go {shown}; MindSpeed-MM needs user > assistant pairs after an optional first system turn",
        fix="start with a user turn, alternate user/assistant, end with the assistant's answer; put a system "
        "prompt only first",
    )


def _media(record: dict[str, Any], attr: Attr, hint: str | None) -> tuple[list[str], list[str]] | Refusal:
    keys = {
        "image": _IMAGE_KEYS + ((attr.images,) if attr.images else ()),
        "video": _VIDEO_KEYS + ((attr.videos,) if attr.videos else ()),
    }
    if hint:
        kind = "video" if hint in keys["video"] else "image"
        keys[kind] = (hint,)
    found: dict[str, list[str]] = {}
    for kind, names in keys.items():
        value = _first(record, names)
        paths = _paths(value)
        if paths is None:
            return Refusal(
                code="bad_media",
                reason=f"the {kind} value {value!r} is not a path or a list of paths",
                fix=f'write the {kind}s as "{kind}s": ["a.jpg", ...] (paths relative to the dataset folder)',
            )
        found[kind] = paths or _part_media(record, kind)
    return found["image"], found["video"]


def _match(turns: list[tuple[str, str]], paths: list[str], tag: str, column: str | None) -> int | Refusal:
    """How many `tag` placeholders to insert for `paths` (0 when the turns already hold one per path), or why
    they do not pair up."""
    kind = tag.strip("<>")
    if paths and column is None:
        return Refusal(
            code=f"no_{kind}s_in_model",
            reason=f"the record has {len(paths)} {kind}(s) but the model's data config reads no {kind}s "
            f"(attr.{kind}s is null)",
            fix=f"drop the {kind}s from the record, or choose a model (or data config) that takes {kind}s",
        )
    if any(tag in text for role, text in turns if role == "system"):
        return Refusal(
            code="placeholder_in_system",
            reason=f"the system turn holds {tag}; MindSpeed-MM counts placeholders in user/assistant turns only",
            fix=f"move {tag} into the first user turn",
        )
    count = sum(text.count(tag) for role, text in turns if role != "system")
    if count in (0, len(paths)):
        return len(paths) - count
    return Refusal(
        code=f"{kind}_placeholders",
        reason=f"the turns hold {count} {tag} placeholder(s) for {len(paths)} {kind}(s)",
        fix=f"put exactly one {tag} per {kind} in the turns (or none: mm-agent then puts them all at the start "
        f"of the first user turn), or list one {kind} per placeholder",
    )


def to_mllm(
    record: dict[str, Any], attr: Attr, *, media_key_hint: str | None = None
) -> dict[str, Any] | Refusal:
    """One record, in LLaVA, ShareGPT or OpenAI-style shape, as the record `attr` makes MindSpeed-MM read; or why
    MindSpeed-MM would skip it or fail on it.

    A record with images (or videos) but no `<image>` (`<video>`) placeholder at all gets one per file inserted at
    the start of its first user turn, images before videos: people list the images and expect the model to see
    them. Any other count that differs from the number of files is refused. `media_key_hint` names the record key
    that holds its media when it is not one of image/images/video/videos (an index's path column).
    """
    turns = _turns(record, attr)
    if isinstance(turns, Refusal):
        return turns
    wrong = _order(turns)
    if wrong:
        return wrong
    media = _media(record, attr, media_key_hint)
    if isinstance(media, Refusal):
        return media
    images, videos = media
    prefix = ""
    for paths, tag, column in ((images, IMAGE, attr.images), (videos, VIDEO, attr.videos)):
        matched = _match(turns, paths, tag, column)
        if isinstance(matched, Refusal):
            return matched
        prefix += tag * matched
    system = next((text for role, text in turns if role == "system"), None)
    if system is None and isinstance(record.get("system"), str) and record["system"].strip():
        system = record["system"]
    if system is not None and not attr.system_tag and not attr.system:
        return Refusal(
            code="system_unsupported",
            reason="the record has a system prompt but the model's data config reads none "
            "(attr.system_tag and attr.system are null)",
            fix='drop the system turn, or set "system_tag": "system" in the data config\'s attr',
        )
    out: dict[str, Any] = {}
    messages: list[dict[str, str]] = []
    if attr.system_tag and system is not None:  # MindSpeed-MM reads a first turn with this tag as the system
        messages.append({attr.role_tag: attr.system_tag, attr.content_tag: system})
        system = None
    if attr.system:  # always written: the `datasets` JSON loader wants one set of keys over all records
        out[attr.system] = system
    tags = {"user": attr.user_tag, "assistant": attr.assistant_tag}
    first_user = True
    for role, text in turns:
        if role == "system":
            continue
        if role == "user" and first_user:
            text, first_user = prefix + text, False
        messages.append({attr.role_tag: tags[role], attr.content_tag: text})
    out[attr.messages] = messages
    if attr.images:
        out[attr.images] = images
    if attr.videos:
        out[attr.videos] = videos
    # SharegptDatasetConverter reads example[attr.audios] of every record, a KeyError without it (convert.py:217
    # at 26.0.0); mm-agent writes no audio, and an empty list reads as none
    if attr.audios:
        out[attr.audios] = []
    return out
