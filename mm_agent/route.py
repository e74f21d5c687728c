"""Turn a free-text request ("fine-tune Wan2.1 text-to-video on 8 NPUs") into ranked registry candidates.

Nothing model-specific lives here: model names come from registry aliases and HF ids, and task/family words
from `registry/data/vocabulary.yaml`. Matching runs on a "compact" form of the text (NFKC, lower-case,
spaces/hyphens/underscores/dots dropped) so "Wan-2.1", "wan 2.1" and "WAN21" agree, while boundary rules
keep "wan2.1" from matching inside "wan2.12" and "sft" from matching inside "microsoft". Each match consumes
its text, longest first, so "image-to-video" is never also read as the family word "image".

Every pass is linear in the request (a 300 K-character request once stalled the server for 45 s): no regex
can restart a scan from every position of a long run, and no match looks back further than a word.
`benchmarks/route_scaling.py` measures it; the request model caps the text besides.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any, TypeVar, get_args

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.estimate.devices import load_devices
from mm_agent.estimate.plan import cp_rule, fit_layout
from mm_agent.estimate.schema import EstimateRequest
from mm_agent.fields import REQUEST_CHARS, Name
from mm_agent.jobspec import LAUNCHER_FILES, Launcher, Runtime, bundled_refusal, is_bundled_vlm
from mm_agent.pipeline import PipelineStage, build_pipeline
from mm_agent.registry import DATA_DIR, Registry, get_registry
from mm_agent.registry.hardware import load_hardware
from mm_agent.registry.schema import Family, ModelEntry, SizeSpec, TaskId, TaskSpec, version_key

MAX_CANDIDATES = 5
_SEPARATORS = frozenset(" \t\n\r-_.")
# An HF id ("qwen/qwen2.5-vl-7b-instruct") starts only where a run of id characters starts: anchored so, a
# run without a slash is scanned once instead of once per position in it (which was quadratic).
_HF_ID = re.compile(r"(?<![a-z0-9._-])[._-]*([a-z0-9][a-z0-9._-]*/[a-z0-9._-]*[a-z0-9])")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TaskWords(_Strict):
    task: TaskId
    words: list[str]
    family: Family | None = Field(default=None, description="the phrase also names this family")
    only_families: list[Family] | None = Field(default=None, description="counts only for these families")


class FamilyWords(_Strict):
    family: Family
    words: list[str]
    tasks: list[TaskId] | None = Field(default=None, description="narrows the family to these tasks")


class LauncherWords(_Strict):
    launcher: Launcher
    words: list[str]


class RehearsalDemo(_Strict):
    model: str = Field(description="registry model id the demo trains")
    task: TaskId
    command: str = Field(pattern=r"^mm-agent demo( --[a-z]+)*$")
    shows: str = Field(description="what it runs, the end of the explanation's sentence")


class Rehearsal(_Strict):
    words: list[str] = Field(description="phrases meaning: try it on this machine first, without NPUs")
    demos: list[RehearsalDemo]


class NewModelWords(_Strict):
    words: list[str] = Field(
        description="phrases meaning: add my own model (architecture), not a shipped one"
    )
    base: str = Field(description="the registered DiT the scaffold starts from when the request names none")
    demo: str = Field(
        pattern=r"^mm-agent demo( --[a-z][a-z-]*)*$", description="rehearses the scaffolded loop"
    )


class Vocabulary(_Strict):
    tasks: list[TaskWords]
    rehearsal: Rehearsal
    new_model: NewModelWords
    launchers: list[LauncherWords] = Field(description="in priority order: the first named wins")
    families: list[FamilyWords]
    numerals: dict[str, int]
    npu_units: list[str]
    node_units: list[str]
    times: list[str]
    per_node_after: list[str]
    per_node_before: list[str]
    single_node: list[str]
    not_model_words: list[str]
    version_prefixes: list[str]
    not_version_after: list[str]


@functools.lru_cache(maxsize=1)
def load_vocabulary() -> Vocabulary:
    path = DATA_DIR / "vocabulary.yaml"
    try:
        return Vocabulary.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (yaml.YAMLError, ValidationError) as exc:
        raise MMAgentError(
            str(exc), file=str(path), fix="fix vocabulary.yaml to match mm_agent/route.py"
        ) from exc


class RouteRequest(_Strict):
    request: str = Field(
        default="",
        max_length=REQUEST_CHARS,
        validation_alias=AliasChoices("request", "text"),
        description="the user's request, English or Chinese",
    )
    model: Name | None = Field(default=None, description="model id, alias or HF id; overrides the text")
    task: Name | None = Field(default=None, description="task id or task phrase; overrides the text")
    mm_version: Name | None = None
    npus: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="TOTAL over all nodes (16 = 2 x 8); overrides the text",
    )
    npus_per_node: int | None = Field(default=None, ge=1, le=16, description="NPUs on each node")
    nnodes: int | None = Field(
        default=None, ge=1, le=4096, validation_alias=AliasChoices("nnodes", "nodes"), description="nodes"
    )
    runtime: Runtime = Field(
        default="mindspeed-mm",
        description="mindspeed-mm, or bundled (Wan, Qwen2.5-VL)",
    )
    detail: bool = Field(default=False, description="every candidate's pipeline (default: the best one's)")


class ParsedRequest(_Strict):
    """What the router understood, so a caller can echo it back or correct it."""

    models: list[str] = Field(default_factory=list, description="model ids named (hint or text)")
    hf_ids: list[str] = Field(default_factory=list)
    tasks: list[str] = Field(default_factory=list)
    sizes: list[str] = Field(default_factory=list)
    version: str | None = None
    npus: int | None = Field(default=None, description="total NPUs asked for (all nodes)")
    npus_per_node: int | None = Field(default=None, description="NPUs per node asked for")
    nodes: int | None = Field(default=None, description="nodes asked for")
    hardware: list[str] = Field(
        default_factory=list, description="accelerators/servers named (hardware.yaml)"
    )
    families: list[str] = Field(default_factory=list)
    launcher: Launcher | None = Field(default=None, description="cluster or launcher named")
    rehearse: bool = Field(
        default=False, description="asks to try it on this machine first (no NPUs): see candidates' `demo`"
    )
    new_model: bool = Field(default=False, description="asks to add the user's own model: see `new_model`")


class RouteChoice(_Strict):
    """A valid alternative offered when the request names no MindSpeed-MM model or a task its model lacks."""

    model_id: str
    name: str
    tasks: list[str] = Field(description="the tasks of this model that fit (all of them when none was asked)")


class RouteCandidate(_Strict):
    model_id: str
    name: str
    family: str
    task: str
    adapts: str | None = Field(
        default=None, description="a LoRA: the task whose model it adapts (render_job adapts)"
    )
    backend: str
    size: str
    entry_script: str
    converter: str | None
    converter_method: str | None
    needs_feature_extraction: bool
    feature_script: str | None
    skill: str
    mm_version: str
    available_in_version: bool
    suggested_version: str | None
    explanation: str
    score: float
    npus_per_node: int = Field(description="NPUs per node of the launch (asked for, else the size's default)")
    nnodes: int = Field(description="nodes of the launch (asked for, else the size's default)")
    launcher: Launcher | None = Field(
        default=None, description="render_job launcher for several nodes (named, else pdsh)"
    )
    fit: str | None = Field(default=None, description="memory verdict for the NPU count asked for")
    runtime: Runtime = Field(description="which runtime `pipeline` is for")
    demo: str | None = Field(
        default=None,
        description="when the request asks to rehearse: the command that runs this model and task "
        "end to end on this machine (tiny weights, synthetic data)",
    )
    pipeline: list[PipelineStage] = Field(description="the 8 stages (the best candidate only, unless detail)")


class NewModelRoute(_Strict):
    """The answer to "add my own model": MindSpeed-MM's new-model flow scaffolded by mm-agent, not a shipped
    model. Once written, the model is a registry entry of the workspace, routed by its own name."""

    tool: str = Field(
        default="scaffold_model", description="the MCP tool (dry run first, confirm=true writes)"
    )
    base: str = Field(description="the registered DiT it starts from (scaffold_model base, CLI --from)")
    command: str = Field(description="the CLI dry run; NAME is the new model's id (--yes writes)")
    demo: str = Field(description="rehearses the scaffolded model's whole loop on this machine")
    doc: str = "docs/new_model.md"


class RouteResult(_Strict):
    candidates: list[RouteCandidate]
    question: str | None = Field(
        description="set when the request cannot pick one model: a question, or a plain statement (not a "
        "MindSpeed-MM model; the model has no such task) with the valid choices"
    )
    parsed: ParsedRequest
    choices: list[RouteChoice] = Field(
        default_factory=list, description="valid alternatives named in `question` when no candidate fits"
    )
    new_model: NewModelRoute | None = Field(
        default=None, description="set when the request asks to add its own model: the scaffold to call"
    )


# ---------------------------------------------------------------------------------------------- text matching


def normalize(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def _ascii_alnum(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


@functools.lru_cache(maxsize=4096)
def _compact(phrase: str) -> tuple[str, tuple[str, ...]]:
    """Phrase without separators, plus what separated each kept character from the one before: "" (none),
    "." (a run holding a dot) or " " (other separators). The matcher asks only those two questions, so a
    run of any length is summed up once here instead of being rescanned at every match beside it."""
    chars: list[str] = []
    gaps: list[str] = []
    gap = ""
    for ch in normalize(phrase):
        if ch in _SEPARATORS:
            gap = "." if ch == "." or gap == "." else " "
        else:
            chars.append(ch)
            gaps.append(gap)
            gap = ""
    return "".join(chars), tuple(gaps)


class _Text:
    """The request in compact form; tracks which characters earlier matches consumed."""

    def __init__(self, text: str):
        self.norm = normalize(text)
        spelled = " ".join(unicodedata.normalize("NFKC", text).split())
        self.spelled = spelled if len(spelled) == len(self.norm) else self.norm  # the user's case, for echoes
        self.compact, self.gaps = _compact(self.norm)
        self.pos: list[int] = [i for i, ch in enumerate(self.norm) if ch not in _SEPARATORS]
        self.used = [False] * len(self.norm)
        self._masked: str | None = None

    def find(self, phrase: str, *, strict_digits: bool = False) -> list[tuple[int, int]]:
        """Unconsumed compact spans where `phrase` occurs as a whole word.

        Glued ASCII letters/digits around the span reject it ("sft" in "microsoft", "i2v" in "ti2v"); a digit
        run may not continue past the span across nothing or a dot ("wan2.1" not in "wan2.12"). With
        `strict_digits` (sizes), dots between digits must match too, so size "13b" is not read from "1.3b",
        and any glued ASCII character rejects, so "14b" is not read from "a14b".
        """
        key, key_gaps = _compact(phrase)
        if not key:
            return []
        spans = []
        start = self.compact.find(key)
        while start >= 0:
            end = start + len(key)
            whole = self._whole(start, end, strict_digits)
            dots = not strict_digits or self._same_dots(start, key, key_gaps)
            if whole and dots and not any(self.used[self.pos[i]] for i in range(start, end)):
                spans.append((start, end))
            start = self.compact.find(key, start + 1)
        return spans

    def _whole(self, start: int, end: int, strict: bool) -> bool:
        for outer, inner in ((start - 1, start), (end, end - 1)):
            if outer < 0 or outer >= len(self.compact):
                continue
            a, b = self.compact[outer], self.compact[inner]
            gap = self.gaps[max(outer, inner)]
            if not (_ascii_alnum(a) and _ascii_alnum(b)):
                continue
            if a.isdigit() and b.isdigit():
                if gap == "" or "." in gap:
                    return False
            elif gap == "" and (strict or a.isalpha() == b.isalpha()):
                return False
        return True

    def _same_dots(self, start: int, key: str, key_gaps: tuple[str, ...]) -> bool:
        for i in range(1, len(key)):
            if (
                key[i].isdigit()
                and key[i - 1].isdigit()
                and ("." in key_gaps[i]) != ("." in self.gaps[start + i])
            ):
                return False
        return True

    def take(self, phrase: str) -> int:
        """Consume every free whole-word occurrence of `phrase`; return how many there were."""
        taken = 0
        for start, end in self.find(phrase):
            if not any(self.used[self.pos[i]] for i in range(start, end)):
                self.consume_norm(self.pos[start], self.pos[end - 1] + 1)
                taken += 1
        return taken

    def consume_norm(self, lo: int, hi: int) -> None:
        for i in range(lo, hi):
            self.used[i] = True
        self._masked = None

    def masked(self) -> str:
        """Normalised text with consumed characters blanked, for the regex passes (built again only after
        a match consumed something)."""
        if self._masked is None:
            self._masked = "".join(" " if u else ch for ch, u in zip(self.norm, self.used, strict=True))
        return self._masked


@dataclass
class _Parse:
    models: list[str] = field(default_factory=list)
    hf_ids: list[str] = field(default_factory=list)
    hf_size: dict[str, str] = field(default_factory=dict)  # model id -> size id implied by an HF id
    tasks: list[TaskWords] = field(default_factory=list)
    families: list[FamilyWords] = field(default_factory=list)
    sizes: list[str] = field(default_factory=list)
    version: str | None = None
    npus: int | None = None  # total
    npus_per_node: int | None = None
    nodes: int | None = None
    hardware: list[str] = field(default_factory=list)
    launcher: Launcher | None = None
    rehearse: bool = False  # "on this machine first", "without NPUs", "本机先试"
    new_model: bool = False  # "add my own model", "bring my own DiT", "自定义模型"
    unknown: list[str] = field(default_factory=list)  # model-like words that name no registry model
    notes: list[str] = field(default_factory=list)  # how the counts were read, when not as written
    phrases: list[str] = field(default_factory=list)  # vocabulary phrases found, for the question
    text: _Text = field(default_factory=lambda: _Text(""))


T = TypeVar("T")
_DERIVED: dict[tuple[str, int], tuple[object, Any]] = {}


def _derived(name: str, source: object, build: Callable[[], T]) -> T:
    """A table built once per loaded registry/vocabulary object (they are loaded once and never change):
    the sorted phrase lists and the HF index, which every route call reads."""
    key = (name, id(source))
    if key not in _DERIVED:
        _DERIVED[key] = (source, build())  # keeps `source` alive, so its id is never reused
    return _DERIVED[key][1]


def _tasks_by_key(phrases: list[tuple[str, TaskWords, str]]) -> dict[str, list[TaskWords]]:
    by_key: dict[str, list[TaskWords]] = {}
    for _, words, key in phrases:
        by_key.setdefault(key, []).append(words)
    return by_key


def _task_phrases(vocab: Vocabulary) -> list[tuple[str, TaskWords, str]]:
    """(phrase, its task words, its compact key), longest first."""
    return _derived(
        "tasks",
        vocab,
        lambda: sorted(
            ((w, t, _compact(w)[0]) for t in vocab.tasks for w in t.words), key=lambda p: -len(p[2])
        ),
    )


def _hf_index(reg: Registry) -> dict[str, list[tuple[str, str | None, bool]]]:
    """lower-case HF id -> [(model id, size id or None, owner)].

    Several entries may train from one HF checkpoint (verl_examples uses Qwen2.5-VL weights); the owners are
    the entries that list the id among their aliases, or every user when none does.
    """
    return _derived("hf", reg, lambda: _build_hf_index(reg))


def _build_hf_index(reg: Registry) -> dict[str, list[tuple[str, str | None, bool]]]:
    index: dict[str, list[tuple[str, str | None, bool]]] = {}
    for entry in reg.models.values():
        claimed = {a.lower() for a in entry.aliases if "/" in a}
        sized = {h.lower(): s.id for s in entry.sizes for h in s.hf_ids}
        for hf_id in claimed | set(sized):
            index.setdefault(hf_id, []).append((entry.id, sized.get(hf_id), hf_id in claimed))
    for users in index.values():
        if not any(owner for _, _, owner in users):
            users[:] = [(m, s, True) for m, s, _ in users]
    return index


def _related(reg: Registry, named: list[str]) -> list[str]:
    """Other entries that train from the same HF checkpoints as the named ones (GRPO/DPO recipes)."""
    ids = {h.lower() for m in named for s in reg.models[m].sizes for h in s.hf_ids}
    return [
        e.id
        for e in reg.models.values()
        if e.id not in named and ids & {h.lower() for s in e.sizes for h in s.hf_ids}
    ]


def _parse_version(t: _Text, reg: Registry, vocab: Vocabulary) -> str | None:
    """MindSpeed-MM version: "MM 26.1" / "mindspeed-mm v26.1.0" (must exist), bare "v26.1.0" / "master".

    A bare X.Y.Z counts only when it is a known MM version and doesn't follow a package name or a pin
    ("torch 2.1.0", "diffusers==0.33.1"), so dependency versions in a request are not misread.
    """
    prefixes = "|".join(
        re.escape(normalize(x)) for x in sorted(vocab.version_prefixes, key=len, reverse=True)
    )
    after = r"(?![a-z0-9]|\.\d)"
    m = re.search(rf"(?<![a-z0-9.])(?:{prefixes})\s*v?(\d+\.\d+(?:\.\d+)?|master){after}", t.masked())
    if m:
        version = m.group(1) if m.group(1) == "master" or m.group(1).count(".") == 2 else m.group(1) + ".0"
        if version not in reg.versions.ids:
            raise MMAgentError(
                f"unknown MindSpeed-MM version {version!r} in the request",
                field="text",
                fix=f"use one of {', '.join(reg.versions.ids)}",
            )
        t.consume_norm(m.start(), m.end())
        return version
    packages = {normalize(w) for w in vocab.not_version_after}
    longest = max(map(len, packages), default=0)
    for m in re.finditer(rf"(?<![a-z0-9.=<>~])v?(\d+\.\d+\.\d+|master){after}", t.masked()):
        before = _word_before(t.norm, m.start(), longest)
        if m.group(1) in reg.versions.ids and before not in packages:
            t.consume_norm(m.start(), m.end())
            return m.group(1)
    return None


def _word_before(norm: str, at: int, longest: int) -> str:
    """The whitespace-separated word that ends at (or one space before) `at` in normalised text, trailing
    ":" removed; "" when it is longer than `longest`. Only short words (package names) are looked for, so
    this never scans back further than the colons right before `at` and `longest` characters."""
    end = at - 1 if at > 0 and norm[at - 1] == " " else at
    while end > 0 and norm[end - 1] == ":":
        end -= 1
    start = norm.rfind(" ", max(0, end - longest - 1), end) + 1
    return norm[start:end] if end - start <= longest else ""


def _number(token: str, vocab: Vocabulary) -> int | None:
    return int(token) if token.isdigit() else vocab.numerals.get(token)


def _parse(text: str, reg: Registry, vocab: Vocabulary) -> _Parse:
    """Read models, HF ids, version, NPU/node counts, sizes, tasks and family words, in that order."""
    p = _Parse(text=_Text(text))
    t = p.text
    phrases = _task_phrases(vocab)
    by_word = _derived("by_word", vocab, lambda: _tasks_by_key(phrases))
    index = _hf_index(reg)
    for hf in _HF_ID.finditer(t.norm):
        hf_id = hf.group(1)
        users = index.get(hf_id)
        if not users:
            continue
        t.consume_norm(hf.start(1), hf.end(1))
        p.hf_ids.append(hf_id)
        for model_id, size_id, owner in users:
            if owner:
                _add(p.models, model_id)
            if size_id:
                p.hf_size.setdefault(model_id, size_id)
        for token in re.split(r"[/_-]", hf_id):
            p.tasks += by_word.get(_compact(token)[0], [])

    p.version = _parse_version(t, reg, vocab)
    p.rehearse = _parse_rehearsal(t, vocab)  # before the counts: "without NPUs" is no count
    p.new_model = _parse_new_model(t, vocab)  # before the families: "my own DiT" is no shipped DiT
    p.hardware = _parse_hardware(t)
    p.launcher = _parse_launcher(t, vocab)
    _parse_counts(p, vocab)

    aliases = _derived(
        "aliases",
        reg,
        lambda: sorted(
            ((a, e.id, _compact(a)[0]) for e in reg.models.values() for a in {e.id, e.name, *e.aliases}),
            key=lambda a: -len(a[2]),
        ),
    )
    for alias, model_id, key in aliases:
        if key in t.compact and t.take(alias):  # the substring test skips most at C speed
            _add(p.models, model_id)

    p.sizes = [
        m.group(1) + "b" for m in re.finditer(r"(?<![a-z0-9.])(a?\d+(?:\.\d+)?)b(?![a-z0-9])", t.masked())
    ]
    for phrase, words, key in phrases:
        hits = t.take(phrase) if key in t.compact else 0
        p.tasks += [words] * hits
        p.phrases += [phrase] * bool(hits)
    family_phrases = _derived(
        "families",
        vocab,
        lambda: sorted(
            ((w, f, _compact(w)[0]) for f in vocab.families for w in f.words), key=lambda x: -len(x[2])
        ),
    )
    for phrase, fw, key in family_phrases:
        hits = t.take(phrase) if key in t.compact else 0
        p.families += [fw] * hits
        p.phrases += [phrase] * bool(hits)
    if not p.models:
        p.unknown = _unknown_models(t, vocab)
    return p


def _parse_rehearsal(t: _Text, vocab: Vocabulary) -> bool:
    """Consume the phrases that ask to rehearse on this machine first; True when there was one."""
    words = _derived(
        "rehearsal", vocab, lambda: sorted(vocab.rehearsal.words, key=lambda w: -len(_compact(w)[0]))
    )
    return sum(t.take(w) for w in words if _compact(w)[0] in t.compact) > 0


def _parse_new_model(t: _Text, vocab: Vocabulary) -> bool:
    """Consume the phrases that ask to add the user's own model; True when there was one."""
    words = _derived(
        "new_model", vocab, lambda: sorted(vocab.new_model.words, key=lambda w: -len(_compact(w)[0]))
    )
    return sum(t.take(w) for w in words if _compact(w)[0] in t.compact) > 0


def _new_model_route(p: _Parse, reg: Registry, vocab: Vocabulary) -> NewModelRoute | None:
    """The scaffold, when the request asks to add its own model and names no model of the workspace's own
    (a scaffolded model is a registry entry: "fine-tune my own model tinydit" routes to it). It starts from
    the named model where the scaffold takes that one as its base, else from the vocabulary's base."""
    if not p.new_model or any(reg.models[m].user is not None for m in p.models):
        return None
    from mm_agent.scaffold.spec import load_spec  # (registry data only; the scaffold itself is not imported)

    sizes = set(p.sizes)
    fits = [  # the named model's bases, the one of the size asked for (words or HF id) first
        b
        for m in p.models
        for b in load_spec().bases
        if b.model == m and (not (sizes or p.hf_size.get(m)) or b.size in sizes | {p.hf_size.get(m)})
    ]
    base = fits[0].id if fits else vocab.new_model.base
    return NewModelRoute(
        base=base, command=f"mm-agent new-model NAME --from {base}", demo=vocab.new_model.demo
    )


def rehearsal_demo(model_id: str, task_id: str) -> RehearsalDemo | None:
    """The demo that rehearses this model and task on this machine (vocabulary.yaml `rehearsal.demos`)."""
    return next(
        (d for d in load_vocabulary().rehearsal.demos if (d.model, d.task) == (model_id, task_id)), None
    )


def asks_rehearsal(text: str) -> bool:
    """Whether a request asks to try the pipeline on this machine first (the prompts add the demo then)."""
    return _parse_rehearsal(_Text(text), load_vocabulary())


def _parse_hardware(t: _Text) -> list[str]:
    """Consume accelerator/server names (hardware.yaml), longest first, so that neither a count nor a size
    is read from them. Whole words only, glued characters reject: "a2" is not read inside "a2v"."""
    hardware = load_hardware()
    words = _derived(
        "hardware",
        hardware,
        lambda: sorted(
            ((w, h.name) for h in hardware.hardware for w in h.words), key=lambda x: -len(_compact(x[0])[0])
        ),
    )
    found: list[str] = []
    for word, name in words:
        if _compact(word)[0] not in t.compact:
            continue
        for start, end in t.find(word, strict_digits=True):
            if not any(t.used[t.pos[i]] for i in range(start, end)):
                t.consume_norm(t.pos[start], t.pos[end - 1] + 1)
                _add(found, name)
    return found


def _parse_launcher(t: _Text, vocab: Vocabulary) -> Launcher | None:
    """The first launcher (in vocabulary order) the request names; every launcher word is consumed, so
    "k8s" or "sbatch" is never taken for an unknown model name."""
    found: Launcher | None = None
    for entry in vocab.launchers:
        for word in entry.words:
            if _compact(word)[0] in t.compact and t.take(word) and found is None:
                found = entry.launcher
    return found


def _alternation(words: list[str]) -> str:
    """Regex alternation of vocabulary words, longest first; a space inside a word matches any spacing."""
    parts = [r"\s*".join(map(re.escape, normalize(w).split())) for w in words]
    return "|".join(sorted(parts, key=len, reverse=True))


@functools.lru_cache(maxsize=1)
def _count_patterns() -> list[tuple[str, re.Pattern[str]]]:
    """(kind, pattern) in the order they are tried. Every pattern starts at the start of a number (never
    inside a digit run) or at a fixed marker word, so each pass is linear in the request."""
    vocab = load_vocabulary()
    num = "|".join([r"\d+", *sorted(map(re.escape, map(normalize, vocab.numerals)), key=len, reverse=True)])
    first, second = rf"(?<![a-z0-9.])({num})", rf"({num})"
    npu = rf"(?:张\s*)?(?:{_alternation(vocab.npu_units)})"
    node = rf"(?:{_alternation(vocab.node_units)})"
    times = rf"(?:{_alternation(vocab.times)})"
    gap, end = r"[\s-]*", r"(?![a-z])"
    return [
        ("nodes*per", re.compile(rf"{first}{gap}{node}\s*(?:{times}|of)\s*{second}(?:{gap}{npu})?{end}")),
        ("nodes*per", re.compile(rf"{first}\s*{times}\s*{second}{gap}{npu}{end}")),
        ("per*nodes", re.compile(rf"{first}{gap}{npu}\s*(?:each\s*)?{times}\s*{second}{gap}{node}{end}")),
        (
            "per",
            re.compile(rf"{first}{gap}(?:x\s*)?{npu}\s*,?\s*(?:{_alternation(vocab.per_node_after)}){end}"),
        ),
        (
            "per",
            re.compile(rf"(?:{_alternation(vocab.per_node_before)})\s*(?:有\s*)?{second}{gap}{npu}{end}"),
        ),
        ("nodes", re.compile(rf"{first}{gap}(?:x\s*)?{node}{end}")),
        ("npus", re.compile(rf"{first}{gap}(?:x\s*)?{npu}{end}")),
    ]


def _parse_counts(p: _Parse, vocab: Vocabulary) -> None:
    """Nodes, NPUs per node and total NPUs. A bare NPU count is the total ("16卡", "16 NPUs"); "8 NPUs each",
    "每台8卡" and "2 nodes × 8" give NPUs per node; "单机" / "single node" one node. Hardware was consumed
    before, so "8 Ascend 910B NPUs" reads as "8 NPUs"."""
    t = p.text
    nodes = 1 if any([t.take(w) for w in vocab.single_node]) else None
    per = total = None
    for kind, pattern in _count_patterns():
        m = pattern.search(t.masked())
        if m is None:
            continue
        a = _number(m.group(1), vocab)
        b = _number(m.group(2), vocab) if pattern.groups > 1 else None
        if kind == "nodes*per" and nodes is None and per is None:
            nodes, per = a, b
        elif kind == "per*nodes" and nodes is None and per is None:
            per, nodes = a, b
        elif kind == "per" and per is None:
            per = a
        elif kind == "nodes" and nodes is None:
            nodes = a
        elif kind == "npus" and total is None:
            total = a
        else:
            continue
        t.consume_norm(m.start(), m.end())
    try:
        p.npus, p.npus_per_node, p.nodes = _resolve_counts(total, per, nodes, source="text")
    except MMAgentError:  # a count that does not split over the nodes: keep the total, drop the rest
        p.npus, p.npus_per_node, p.nodes = total, None, None
        layout = (
            f"{nodes} nodes" if per is None else f"nodes of {per}" if nodes is None else f"{nodes} x {per}"
        )
        p.notes.append(f"{total} NPUs in all do not fit {layout}; reading only the total of {total}")


def _resolve_counts(
    total: int | None, per: int | None, nodes: int | None, *, source: str
) -> tuple[int | None, int | None, int | None]:
    """(total NPUs, NPUs per node, nodes) with what follows from two of them; an inconsistent set raises."""
    if per is not None and nodes is not None:
        if total is not None and total != per * nodes:
            raise MMAgentError(
                f"npus={total} is the total over all nodes, but npus_per_node={per} x nnodes={nodes} "
                f"is {per * nodes} ({source})",
                field="npus",
                fix=f"pass npus={per * nodes} (the total), or leave npus out",
            )
        return per * nodes, per, nodes
    if total is not None and per is not None:
        if total % per:
            raise MMAgentError(
                f"npus={total} (the total) is not a whole number of nodes of npus_per_node={per} ({source})",
                field="npus",
                fix=f"pass npus as a multiple of {per}, e.g. {per * max(1, total // per)}",
            )
        return total, per, total // per
    if total is not None and nodes is not None:
        if total % nodes:
            raise MMAgentError(
                f"npus={total} (the total) does not split evenly over nnodes={nodes} ({source})",
                field="npus",
                fix=f"pass npus as a multiple of {nodes}, or npus_per_node instead of npus",
            )
        return total, total // nodes, nodes
    return total, per, nodes


def _unknown_models(t: _Text, vocab: Vocabulary) -> list[str]:
    """Words left over that look like a model name (letters and digits, starting with a letter: "sora-ultra-9000",
    "wan2.5", "meta-llama/llama-3-8b") but matched no registry alias, HF id, hardware name or vocabulary word."""
    skip = {normalize(w) for w in vocab.not_model_words}
    found: list[str] = []
    for m in _MODEL_LIKE.finditer(t.masked()):
        word = m.group(1)
        if not any(c.isdigit() for c in word) or _NOT_A_MODEL.fullmatch(word):
            continue
        if word in skip or word.rstrip("0123456789.") in skip:
            continue
        _add(found, t.spelled[m.start(1) : m.end(1)])
    return found


_MODEL_LIKE = re.compile(r"(?<![a-z0-9._/-])([a-z][a-z0-9._/-]*[a-z0-9])")
_NOT_A_MODEL = re.compile(r"a\d+(?:\.\d+)?b|v\d+(?:\.\d+)*|[a-z]{1,3}\d+(?:\.\d+)?e-?\d+")


def _add(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


# ---------------------------------------------------------------------------------------------- ranking


def _resolve_model(hint: str, reg: Registry) -> tuple[str, str | None]:
    """Model id (and HF-implied size) for a `model` hint; unknown hints get a did-you-mean."""
    if hint in reg.models:
        return hint, None
    probe = _parse(hint, reg, load_vocabulary())
    if probe.models:
        return probe.models[0], probe.hf_size.get(probe.models[0])
    names = {a.lower(): e.id for e in reg.models.values() for a in [e.id, *e.aliases]}
    close = get_close_matches(hint.lower(), list(names), n=3, cutoff=0.5)
    ids = list(dict.fromkeys(names[c] for c in close))
    raise MMAgentError(
        f"unknown model {hint!r}",
        field="model",
        fix=f"did you mean {', '.join(ids)}?" if ids else "run `mm-agent models` for the list",
    )


def _resolve_task(hint: str, vocab: Vocabulary) -> TaskWords:
    """A `task` hint: a task id ("t2v") or any vocabulary phrase ("图生视频"); it applies to every family."""
    if hint.lower() in get_args(TaskId):
        return TaskWords(task=hint.lower(), words=[hint])  # type: ignore[arg-type]
    probe = _Text(hint)
    for phrase, words, _ in _task_phrases(vocab):
        if probe.find(phrase):
            return TaskWords(task=words.task, words=[hint])
    tasks = sorted({t.task for t in vocab.tasks})
    raise MMAgentError(f"unknown task {hint!r}", field="task", fix=f"use one of {', '.join(tasks)}")


def _available(entry: ModelEntry, task: TaskSpec, version: str) -> bool:
    return entry.versions.contains(version) and task.versions.contains(version)


def _version_note(entry: ModelEntry, task: TaskSpec, version: str, reg: Registry) -> tuple[str, str | None]:
    """Why `version` lacks the model/task, and the newest version that has it."""
    ordered = sorted(reg.versions.ids, key=version_key)
    having = [v for v in ordered if _available(entry, task, v)]
    suggested = having[-1] if having else None
    later = [v for v in having if version_key(v) > version_key(version)]
    what = entry.name if not entry.versions.contains(version) else f"{entry.name} {task.id}"
    if later:
        note = f"{what} is not in MindSpeed-MM {version}: it was added in {later[0]}."
    else:
        removed = (
            next((v for v in ordered if version_key(v) > version_key(having[-1])), None) if having else None
        )
        note = f"{what} is not in MindSpeed-MM {version}" + (
            f": it was removed in {removed}." if removed else "."
        )
    if suggested:
        note += f" Use {suggested}."
    return note, suggested


def _pick_size(entry: ModelEntry, task: TaskSpec, p: _Parse) -> tuple[SizeSpec, str | None]:
    """Size implied by an HF id, else one named in the text, else the task's first size."""
    allowed = [s for s in entry.sizes if task.sizes is None or s.id in task.sizes]
    wanted = p.hf_size.get(entry.id)
    if wanted is None:
        wanted = next((s.id for s in allowed if p.text.find(s.id, strict_digits=True)), None)
        if wanted is None:
            wanted = next((s.id for s in entry.sizes if p.text.find(s.id, strict_digits=True)), None)
    if wanted is None:  # "14b" for an "a14b" (MoE active-parameter) size id
        loose = [s.id for s in allowed for x in p.sizes if re.fullmatch(rf"[a-z]+{re.escape(x)}", s.id)]
        wanted = loose[0] if len(loose) == 1 else None
    if wanted is None:  # "5b" for sizes named by version (CogVideoX 1.0, 1.5: both 5B): the registry's params
        counted = [s for s in allowed if s.params is not None and s.params in p.sizes]
        if len(counted) == 1:
            return counted[0], None
        if counted:  # several sizes of that count: the first, and how to pick another
            others = ", ".join(s.id for s in counted[1:])
            return counted[0], (
                f"size {counted[0].params} is {entry.name} {counted[0].id} (also {others}: name it to choose)."
            )
    size = next((s for s in allowed if s.id == wanted), None)
    if size is not None:
        return size, None
    if wanted:
        return allowed[0], f"size {wanted} is not available for {task.id}; using {allowed[0].id}."
    if p.sizes:
        return allowed[0], f"no size {', '.join(p.sizes)} for {entry.name}; using {allowed[0].id}."
    return allowed[0], None


_STATUS_BONUS = {"verified": 0.04, "supported": 0.03, "preview": 0.01, "inference-only": 0.0}


def _task_asked(entry: ModelEntry, task_id: str, p: _Parse) -> bool:
    return any(
        tw.task == task_id and (tw.only_families is None or entry.family in tw.only_families)
        for tw in p.tasks
    )


def _family_asked(entry: ModelEntry, task_id: str, p: _Parse) -> bool:
    return any(
        f.family == entry.family and (f.tasks is None or task_id in f.tasks) for f in p.families
    ) or any(tw.family == entry.family for tw in p.tasks)


@dataclass
class _Scored:
    entry: ModelEntry
    task: TaskSpec
    size: SizeSpec
    score: float
    why: list[str]


def _score(entry: ModelEntry, task: TaskSpec, named: str | None, p: _Parse, version: str) -> _Scored:
    """model match (100) >> task match (10) >> family match (1); the small bonuses only break ties.

    A request to rehearse on this machine adds 2 where a demo rehearses the (model, task) and it is what the
    request asked for (its task or family, or anything when it names neither): "rehearse VLM fine-tuning
    without NPUs" is the Qwen2.5-VL demo's model rather than a question among every VLM.

    A LoRA task gets 1 more when the request also names the task it adapts (its `weights_of` or one of its
    `also_adapts`, else another task of the model), so "Wan2.1 text-to-video with LoRA" is the LoRA job, and
    "LoRA of Wan2.1 14B image-to-video" the LoRA of the i2v model (scored as that job: its weights and sizes). Tie-breakers, largest first: the requested size exists
    (0.5), the version has it (0.25), how many distinct requested tasks the model covers ("text-to-image lora"
    prefers a model with both), status.
    """
    score, why = 0.0, []
    if named == entry.id:
        score += 100
        why.append(f"{entry.name} named in the request")
    elif named:
        score += 100
        why.append(f"{entry.name} trains {named}'s checkpoints and has the requested task")
    if _task_asked(entry, task.id, p):
        score += 10
        why.append(f"task {task.id} requested")
        targets = task.adapted() or [t.id for t in entry.tasks if t.id != task.id]
        adapted = next((t for t in targets if _task_asked(entry, t, p)), None)
        if task.id == "lora" and adapted:
            # "text-to-video with LoRA": the LoRA of the text-to-video model, not its full fine-tune
            score += 1
            variant = task.adapting(adapted)
            if variant is not None and variant is not task:  # another stock example: that job
                task = variant
                why.append(
                    f"a LoRA of the {adapted} model ({task.example_script}, render_job adapts={adapted})"
                )
            else:
                why.append(f"a LoRA of the {adapted} model")
    if _family_asked(entry, task.id, p):
        score += 1
        why.append(f"{entry.family} family matches")
    if (
        p.rehearse
        and rehearsal_demo(entry.id, task.id)
        and (
            not (p.tasks or p.families) or _task_asked(entry, task.id, p) or _family_asked(entry, task.id, p)
        )
    ):
        score += 2
    size, size_note = _pick_size(entry, task, p)
    if size_note:
        why.append(size_note)
    elif p.hf_size.get(entry.id) or p.sizes:
        score += 0.5
    if _available(entry, task, version):
        score += 0.25
    fitting = {t.id for t in entry.tasks if _task_asked(entry, t.id, p) or _family_asked(entry, t.id, p)}
    score += _STATUS_BONUS.get(entry.status, 0.0) + 0.05 * min(len(fitting), 4)
    return _Scored(entry, task, size, round(score, 3), why)


def _layout(p: _Parse, size: SizeSpec) -> tuple[int, int]:
    """(NPUs per node, nodes) of the launch: what the request asked for, the size's default for the rest. A
    bare total fills full nodes of the size's default width first (16 on an 8-wide size: 2 x 8)."""
    width, default_nodes = size.parallel.npus_per_node, size.parallel.nnodes
    if p.npus_per_node:
        return p.npus_per_node, p.nodes or default_nodes
    if p.npus:
        nodes = p.nodes or (p.npus // width if p.npus > width and p.npus % width == 0 else 1)
        return max(1, p.npus // nodes), nodes
    return width, p.nodes or default_nodes


def _candidate(
    s: _Scored, p: _Parse, version: str, reg: Registry, runtime: Runtime, *, pipeline: bool = True
) -> RouteCandidate:
    entry, task, why = s.entry, s.task, list(s.why)
    wanted = {tw.task for tw in p.tasks if tw.only_families is None or entry.family in tw.only_families}
    have = list(dict.fromkeys(t.id for t in entry.tasks))
    if wanted and not wanted & set(have):
        why.append(f"{entry.name} has no {'/'.join(sorted(wanted))} task (it has {', '.join(have)})")
    available = _available(entry, task, version)
    suggested = None
    if not available:
        note, suggested = _version_note(entry, task, version, reg)
        why.append(note)
    if runtime == "bundled" and (refusal := bundled_refusal(entry, task, s.size)) is not None:
        why.append(f"{refusal}: showing the MindSpeed-MM pipeline")
        runtime = "mindspeed-mm"
    fe = task.feature_extraction
    needs_fe = fe is not None and (runtime == "bundled" or fe.versions.contains(version))
    if runtime == "bundled" and is_bundled_vlm(entry):
        why.append(
            f"{task.id} trains on mm-agent's bundled runtime (python -m runtime.vlm_train under torchrun, "
            "transformers' model class; NPU, GPU or CPU)"
        )
    elif runtime == "bundled":
        why.append(
            f"{task.id} trains on mm-agent's bundled runtime (python -m runtime.train under torchrun; NPU, GPU or CPU)"
        )
        why.append(
            "features are extracted first (python -m runtime.extract)" if needs_fe else "encodes online"
        )
    else:
        why.append(f"{task.id} trains with {task.backend} via {task.entry_script.path} ({task.launcher})")
        if needs_fe and fe:
            why.append(f"needs offline feature extraction ({fe.script})")
    demo = rehearsal_demo(entry.id, task.id) if p.rehearse else None
    if p.rehearse:
        why.append(_rehearsal_note(entry, task, s.size, runtime, demo))
    per_node, nodes = _layout(p, s.size)
    launcher = p.launcher or ("pdsh" if nodes > 1 else None)
    if launcher is not None:
        why.append(f"started on every node by render_job launcher={launcher} ({LAUNCHER_FILES[launcher]})")
    why += p.notes
    fit = _fit(entry, task, s.size, p, per_node * nodes, runtime) if pipeline else None
    conv = entry.converter
    return RouteCandidate(
        model_id=entry.id,
        name=entry.name,
        family=entry.family,
        task=task.id,
        adapts=task.weights_of if task.id == "lora" else None,
        backend=task.backend,
        size=s.size.id,
        entry_script=task.entry_script.path,
        converter=conv.class_name if conv else None,
        converter_method=conv.to_training if conv else None,
        needs_feature_extraction=needs_fe,
        feature_script=fe.script if fe else None,
        skill=entry.skill,
        mm_version=version,
        available_in_version=available,
        suggested_version=suggested,
        explanation="; ".join(w.rstrip(".") for w in why) + ".",
        score=s.score,
        npus_per_node=per_node,
        nnodes=nodes,
        launcher=launcher,
        fit=fit,
        runtime=runtime,
        demo=demo.command if demo else None,
        pipeline=list(
            _pipeline(
                entry.id, task.id, task.backend, s.size.id, version, per_node, nodes, runtime, task.weights_of
            )
        )
        if pipeline
        else [],
    )


def _rehearsal_note(
    entry: ModelEntry, task: TaskSpec, size: SizeSpec, runtime: Runtime, demo: RehearsalDemo | None
) -> str:
    """What rehearses this model and task on this machine: its demo, and runtime=bundled where that trains
    it; a model without a demo gets the demos there are, never a silent switch to another model."""
    if demo is not None:
        note = f"to rehearse it on this machine first: `{demo.command}` ({demo.shows})"
    else:
        others = ", ".join(f"`{d.command}` ({d.model} {d.task})" for d in load_vocabulary().rehearsal.demos)
        note = f"no demo rehearses {entry.id} {task.id} (demos: {others})"
    if runtime != "bundled" and bundled_refusal(entry, task, size) is None:
        note += "; runtime=bundled trains it here on CPU/GPU"
    return note


def _fit(
    entry: ModelEntry, task: TaskSpec, size: SizeSpec, p: _Parse, npus: int, runtime: Runtime
) -> str | None:
    """The memory verdict (and the CP render_job will pick) when the request named a device count, on the
    accelerator it named if devices.yaml knows it."""
    if not (p.npus or p.npus_per_node or p.nodes):
        return None
    device = None
    for name in p.hardware:
        try:
            device = load_devices().find(name).id
            break
        except MMAgentError:
            continue  # hardware.yaml names servers devices.yaml has no figures for
    req = EstimateRequest(model=entry.id, size=size.id, task=task.id, npus=npus, device=device)
    stock = npus == size.parallel.npus_per_node * size.parallel.nnodes  # render_job keeps the stock layout
    cp_ok = cp_rule(task.template, runtime, size.arch.get("num_heads"), size.parallel.tp)
    fit = fit_layout(req, runtime=runtime, cp_ok=(lambda cp: False) if stock else cp_ok)
    return fit.note if fit else None


@functools.lru_cache(maxsize=512)
def _pipeline(
    model_id: str,
    task_id: str,
    backend: str,
    size_id: str,
    version: str,
    per_node: int,
    nodes: int,
    runtime: Runtime,
    adapts: str | None = None,
) -> tuple[PipelineStage, ...]:
    """The 8 stages of one (model, task, size, version, layout, runtime; a LoRA: the task it adapts):
    registry data only, so built once."""
    entry = get_registry().models[model_id]
    task = entry.task(task_id, backend)
    assert task is not None
    task = (task.adapting(adapts) if adapts else None) or task
    size = next(s for s in entry.sizes if s.id == size_id)
    return tuple(
        build_pipeline(entry, task, size, version, npus_per_node=per_node, nnodes=nodes, runtime=runtime)
    )


# Answers by request, with the registry and vocabulary objects they were computed from. Routing reads nothing
# else (no file, clock or environment; its other tables load once per process), so the same request against the
# same objects has the same answer; a changed registry (a workspace model added or edited) is a new object and
# misses. RouteResult and every model in it are frozen: one answer can be handed to every caller.
_ROUTED: dict[str, tuple[Registry, Vocabulary, RouteResult]] = {}
_ROUTED_MAX = 64
_ROUTED_LOCK = threading.Lock()


def route_model(req: RouteRequest) -> RouteResult:
    """Rank (model, task) pairs for the request; set `question` when the request can't pick one model."""
    reg, vocab = get_registry(), load_vocabulary()
    key = req.model_dump_json()
    with _ROUTED_LOCK:
        hit = _ROUTED.get(key)
    if hit is not None and hit[0] is reg and hit[1] is vocab:
        return hit[2]
    result = _route(req, reg, vocab)
    with _ROUTED_LOCK:
        if len(_ROUTED) >= _ROUTED_MAX:
            del _ROUTED[next(iter(_ROUTED))]
        _ROUTED[key] = (reg, vocab, result)
    return result


def _route(req: RouteRequest, reg: Registry, vocab: Vocabulary) -> RouteResult:
    p = _parse(req.request, reg, vocab)
    if req.model:
        model_id, hf_size = _resolve_model(req.model, reg)
        p.models = [model_id]
        if hf_size:
            p.hf_size[model_id] = hf_size
    if req.task:
        p.tasks = [_resolve_task(req.task, vocab)]
    else:  # family-restricted words ("fine-tune" means sft only for VLMs) need that family in play
        context = {reg.models[m].family for m in p.models} or {f.family for f in p.families} | {
            tw.family for tw in p.tasks if tw.family
        }
        p.tasks = [tw for tw in p.tasks if tw.only_families is None or context & set(tw.only_families)]
    # a named model decides the family: "InternVL3 on my images" is about data, not image generation
    if p.models:
        named_families = {reg.models[m].family for m in p.models}
        p.families = [f for f in p.families if f.family in named_families]
    # a request naming only the user's scaffolded models defaults to the release their files were written for
    own = {u.mm_version for m in p.models if (u := reg.models[m].user) is not None}
    default = own.pop() if len(own) == 1 and len(p.models) == 1 else reg.versions.default
    version = reg.check_version(req.mm_version) if req.mm_version else (p.version or default)
    p.npus, p.npus_per_node, p.nodes = _request_counts(req, p)

    named = set(p.models)
    # a recipe entry sharing a named model's checkpoint competes only for tasks the user asked for
    via: dict[str, str] = {}
    for model_id in p.models:
        for other in _related(reg, [model_id]):
            if other not in named:
                via.setdefault(other, model_id)
    pool = [reg.models[m] for m in [*p.models, *via]] if named else list(reg.models.values())
    order = {m: i for i, m in enumerate(reg.models)}
    scored = [
        (
            _score(entry, task, via.get(entry.id, entry.id) if named else None, p, version),
            order[entry.id],
            t_idx,
        )
        for entry in pool
        for t_idx, task in enumerate(entry.tasks)
        if entry.id not in via or _task_asked(entry, task.id, p)
    ]
    scored.sort(key=lambda x: (-x[0].score, x[1], x[2]))
    ranked = [x[0] for x in scored]
    if len(named) != 1:  # several models in play: one row per model, its best task
        best: dict[str, _Scored] = {}
        for item in ranked:
            best.setdefault(item.entry.id, item)
        ranked = list(best.values())
    floor = 10 if p.tasks else 1 if p.families else 0
    if not named:
        ranked = [x for x in ranked if x.score >= floor] or ranked
    top = ranked[:MAX_CANDIDATES]

    question: str | None = None
    choices: list[RouteChoice] = []
    if not named and p.unknown:
        question, choices = _not_a_model(p.unknown[0], ranked, p, reg)
        top = []
    elif named and p.tasks and not any(_task_asked(e, t.id, p) for e in pool for t in e.tasks):
        question, choices = _no_such_task([reg.models[m] for m in p.models], p, reg)
        top = []
    tied = {x.entry.id for x in top if x.score // 1 == top[0].score // 1}
    if question is not None:
        pass
    elif not named and p.tasks and not any(x.score >= 10 for x in top):
        asked = ", ".join(dict.fromkeys(tw.task for tw in p.tasks))
        known = ", ".join(sorted({t.id for e in reg.models.values() for t in e.tasks}))
        question = f"No registered model trains {asked}. Name a model, or pick a task from: {known}."
        top = []
    elif not named and (not p.tasks or len(tied) > 1):
        what = ", ".join(dict.fromkeys(p.phrases)) or "your training job"
        options = ", ".join(f"{x.entry.id} ({x.entry.name})" for x in top)
        question = f"Which model should I use for {what}? Options: {options}. Name one, or pass model=<id>."
        if p.rehearse:
            demos = "; ".join(f"{d.model} {d.task}: `{d.command}`" for d in vocab.rehearsal.demos)
            question += f" Demos that rehearse on this machine: {demos}."
    elif len(named) > 1 and len(tied) > 1:
        question = f"You named several models ({', '.join(p.models)}); which one should I set up?"

    new_model = _new_model_route(p, reg, vocab)
    if new_model is not None:  # not a shipped model: no candidate among them, no question about them
        top, question, choices = [], None, []
    parsed = ParsedRequest(
        models=p.models,
        hf_ids=p.hf_ids,
        tasks=list(dict.fromkeys(tw.task for tw in p.tasks)),
        sizes=p.sizes,
        version=version,
        npus=p.npus,
        npus_per_node=p.npus_per_node,
        nodes=p.nodes,
        hardware=p.hardware,
        launcher=p.launcher,
        rehearse=p.rehearse,
        new_model=p.new_model,
        families=list(
            dict.fromkeys([f.family for f in p.families] + [tw.family for tw in p.tasks if tw.family])
        ),
    )
    return RouteResult(
        candidates=[
            _candidate(x, p, version, reg, req.runtime, pipeline=req.detail or i == 0)
            for i, x in enumerate(top)
        ],
        question=question,
        parsed=parsed,
        choices=choices,
        new_model=new_model,
    )


def _request_counts(req: RouteRequest, p: _Parse) -> tuple[int | None, int | None, int | None]:
    """The counts of the hints (`npus` is the total), completed from the text where that stays consistent;
    hints that contradict each other raise with the fix."""
    hints = (req.npus, req.npus_per_node, req.nnodes)
    if not any(hints):
        return p.npus, p.npus_per_node, p.nodes
    merged = tuple(
        h if h is not None else t for h, t in zip(hints, (p.npus, p.npus_per_node, p.nodes), strict=True)
    )
    try:
        return _resolve_counts(*merged, source="hints and request text")
    except MMAgentError:
        return _resolve_counts(*hints, source="hints")


def _offer(entry: ModelEntry, tasks: list[str]) -> str:
    return f"{entry.id} ({', '.join(tasks)})"


def _not_a_model(word: str, ranked: list[_Scored], p: _Parse, reg: Registry) -> tuple[str, list[RouteChoice]]:
    """A plain statement for a model name the registry does not know, with the closest valid choices: ids,
    names and aliases close in spelling, else the models that fit the task/family words of the request."""
    names = {_compact(a)[0]: e.id for e in reg.models.values() for a in [e.id, e.name, *e.aliases]}
    close = get_close_matches(_compact(word)[0], list(names), n=8, cutoff=0.6)

    def fitting(entry: ModelEntry) -> bool:  # what else the request asked for: a task, else a family
        ask = _task_asked if p.tasks else _family_asked if p.families else None
        return ask is None or any(ask(entry, t.id, p) for t in entry.tasks)

    ids = [m for m in dict.fromkeys(names[c] for c in close) if fitting(reg.models[m])][:3]
    if not ids:
        ids = list(dict.fromkeys(x.entry.id for x in ranked if x.score >= 1))[:3]
    choices = []
    for model_id in ids:
        entry = reg.models[model_id]
        fits = [t.id for t in entry.tasks if _task_asked(entry, t.id, p) or _family_asked(entry, t.id, p)]
        choices.append(
            RouteChoice(
                model_id=entry.id,
                name=entry.name,
                tasks=list(dict.fromkeys(fits or [t.id for t in entry.tasks])),
            )
        )
    statement = f"{word!r} is not a MindSpeed-MM model."
    if choices:
        offered = "; ".join(_offer(reg.models[c.model_id], c.tasks) for c in choices)
        statement += f" Closest valid choices: {offered}. Name one (model=<id>)"
    else:
        statement += " Name a registered model (model=<id>)"
    return statement + f", or see list_models for all {len(reg.models)}.", choices


def _no_such_task(entries: list[ModelEntry], p: _Parse, reg: Registry) -> tuple[str, list[RouteChoice]]:
    """A plain statement that the named model has none of the asked tasks: its own tasks, and the models
    that have the asked one (never a silent route to another task)."""
    asked = list(dict.fromkeys(tw.task for tw in p.tasks))
    wanted = "/".join(asked)
    choices = [
        RouteChoice(model_id=e.id, name=e.name, tasks=list(dict.fromkeys(t.id for t in e.tasks)))
        for e in entries
    ]
    own = "; ".join(
        f"{e.name} has no {wanted} task (its tasks: {', '.join(c.tasks)})"
        for e, c in zip(entries, choices, strict=True)
    )
    having = sorted(
        (e for e in reg.models.values() if e not in entries and any(t.id in asked for t in e.tasks)),
        key=lambda e: -_STATUS_BONUS.get(e.status, 0.0),
    )
    choices += [
        RouteChoice(model_id=e.id, name=e.name, tasks=[t for t in asked if any(x.id == t for x in e.tasks)])
        for e in having[:MAX_CANDIDATES]
    ]
    if having:
        more = f" (+{len(having) - MAX_CANDIDATES} more)" if len(having) > MAX_CANDIDATES else ""
        others = f"Models with {wanted}: {', '.join(e.id for e in having[:MAX_CANDIDATES])}{more}."
    else:
        others = f"No MindSpeed-MM model trains {wanted}."
    return f"{own}. {others} Pick one of these tasks or models.", choices
