"""The failure catalog as data: every shipped signature loads, matches its own examples and nothing else.

Runs over every file in mm_agent/diagnose/signatures/ (semgrep-rules' `ruleid:` / `ok:` habit and
node-problem-detector's TestShippedConfigs), parametrized by rule id so a failure names the rule. Healthy
lines come from the MindSpeed-MM research notes §5.6 (Megatron core_v0.12.1 training_log and checkpointing)
plus typical torchrun / MindSpeed / CANN start-up lines.
"""

from __future__ import annotations

import functools
import itertools
import re
import string
from collections.abc import Callable
from pathlib import Path

import pytest
import re2

from mm_agent.diagnose.catalog import (
    SIGNATURES_DIR,
    CompiledSignature,
    load_catalog,
    load_signature,
    match_line,
)
from mm_agent.diagnose.schema import CATEGORIES
from mm_agent.errors import MMAgentError

# Ids come from the file names, so one broken file fails its own tests instead of the whole collection.
IDS = sorted(p.stem for p in SIGNATURES_DIR.glob("*.yaml"))

HEALTHY_LINES = [
    " [2026-01-01 12:00:00] iteration        1/    5000 | consumed samples:            8 | elapsed time per"
    " iteration (ms): 13707.5 | learning rate: 1.000000E-05 | global batch size:     8 | loss: 4.024374E-01 |"
    " loss scale: 1.0 | grad norm: 0.123 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    " [2026-01-01 12:05:00] iteration      100/    5000 | consumed samples:          800 | elapsed time per"
    " iteration (ms): 10712.3 | learning rate: 9.999000E-06 | global batch size:     8 | loss: 1.240000E+00 |"
    " loss scale: 1.0 | grad norm: 2.031 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    "building SoRA model ...",
    "building VLMModel ...",
    " loading release checkpoint from /data/ckpt/wan2.1_1.3b_mm/transformer",
    "  successfully loaded checkpoint from /data/ckpt/wan2.1_1.3b_mm/transformer [ t 1/1, p 1/1 ] at iteration 0",
    "saving checkpoint at iteration     500 to /data/save/wan in torch format",
    "  successfully saved checkpoint from iteration     500 to /data/save/wan",
    "[Rank 0] (after 10 iterations) memory (MB) | allocated: 20543.2 | max allocated: 21011.7 | reserved:"
    " 22000.0 | max reserved: 22000.0",
    "[INFO] 2026-01-01 11:59:00 HCCL_CONNECT_TIMEOUT=1200",
    "[INFO] 2026-01-01 11:59:00 HCCL_EXEC_TIMEOUT=1800 HCCL_IF_BASE_PORT=60000 MASTER_PORT=6000",
    "[INFO] ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 NPUS_PER_NODE=8 NNODES=1 NODE_RANK=0",
    "W0101 12:00:00.000000 140001 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable"
    " for each process to be 1 in default, to avoid your system being overloaded, please further tune the"
    " variable for optimal performance in your application as needed.",
    "INFO:torch.distributed.elastic.agent.server.api:[default] Starting worker group",
    "> initialized tensor model parallel with size 1",
    "> initialized pipeline model parallel with size 1",
    "> compiling dataset index builder ...",
    "time to initialize megatron (seconds): 42.117",
    "[after model, optimizer, and learning rate scheduler are built] datetime: 2026-01-01 12:00:00",
    "training ...",
    "[before the start of training step] datetime: 2026-01-01 12:00:05",
    "[INFO] HCCL(3079955,python):2025-11-20-11:59:56.716.583 [op_base.cc:1293] [3079955]Entry-HcclCommInitRootInfoInner:"
    "ranks[4], rank[3], rootinfo: host ip[127.10.0.1] port[60000] nicDeploy[1] identifier[127.10.0.1%enp_60000_0_1]",
    "/usr/local/lib/python3.10/site-packages/torch_npu/utils/collect_env.py:58: UserWarning: Warning: The"
    " /usr/local/Ascend/cann owner does not match the current owner.",
    '  warnings.warn(f"Warning: The {path} owner does not match the current owner.")',
    "[W compiler_depend.ts:133] Warning: Warning: Device do not support double dtype now, dtype cast repalce"
    " with float. (function operator())",
    "Missing keys in state_dict: []",
    "Unexpected key(s) in state_dict: []",
    "[INFO] rank 0: dataset length 20000, num_workers 8, pin_memory True",
]


def _placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


@functools.cache
def _catalog() -> tuple[CompiledSignature, ...]:
    return load_catalog()


def _entry(rule_id: str) -> CompiledSignature:
    return next(entry for entry in _catalog() if entry.sig.id == rule_id)


def test_catalog_is_not_empty_and_loads_in_id_order() -> None:
    assert IDS, "no signature files shipped"
    assert [entry.sig.id for entry in _catalog()] == IDS


@pytest.mark.parametrize("rule_id", IDS)
def test_file_loads_and_id_is_the_stem(rule_id: str) -> None:
    assert load_signature(SIGNATURES_DIR / f"{rule_id}.yaml").sig.id == rule_id


def _before(lines: list[str]) -> Callable[[], list[str]] | None:
    """What match_line asks for the lines logged before a line (none given: rules with a context never apply)."""
    return (lambda: lines) if lines else None


@pytest.mark.parametrize("rule_id", IDS)
def test_examples_match_only_their_own_signature(rule_id: str) -> None:
    """Each example line resolves to its own rule alone (after the lines of its context, for a rule that
    has one): noise takes its line from every rule, a rule in its context from the rest."""
    examples = _entry(rule_id).sig.examples
    for line in examples.match:
        hits = {entry.sig.id for entry, _ in match_line(line, _catalog(), _before(examples.context))}
        assert hits == {rule_id}, f"{line!r} resolves to {sorted(hits)}"


@pytest.mark.parametrize("rule_id", IDS)
def test_rules_with_a_context_hold_only_in_it(rule_id: str) -> None:
    """A rule with a context never applies without the lines before, nor after lines that end its phase."""
    entry = _entry(rule_id)
    if entry.sig.context is None:
        return
    out = entry.sig.examples.out_of_context
    assert out, "give examples.out_of_context: lines after which the rule must not apply"
    for line in entry.sig.examples.match:
        for before in (None, _before(out)):
            hits = {e.sig.id for e, _ in match_line(line, _catalog(), before)}
            assert rule_id not in hits and hits, f"{line!r} resolves to {sorted(hits)} out of context"


@pytest.mark.parametrize("rule_id", IDS)
def test_every_example_hits_a_trigger_and_every_pattern_is_exercised(rule_id: str) -> None:
    entry = _entry(rule_id)
    used: set[int] = set()
    for line in entry.sig.examples.match:
        assert any(t.search(line) for t in entry.triggers), f"no trigger fires on {line!r}"
        used |= {i for i, p in enumerate(entry.patterns) if p.search(line)}
    unused = [entry.sig.patterns[i] for i in range(len(entry.patterns)) if i not in used]
    assert not unused, f"patterns no example exercises: {unused}"


@pytest.mark.parametrize("rule_id", IDS)
def test_no_match_examples_do_not_match(rule_id: str) -> None:
    entry = _entry(rule_id)
    assert entry.sig.examples.no_match, "give look-alike lines that must not match"
    for line in entry.sig.examples.no_match:
        assert entry.match(line) is None, f"matches a no_match line: {line!r}"


@pytest.mark.parametrize("rule_id", IDS)
def test_title_and_fix_placeholders_come_from_the_match(rule_id: str) -> None:
    """Every {name} in the title and fixes is a group that took part in each example's match, or one the
    rule requires from its detail lines (a hit without it never counts)."""
    entry = _entry(rule_id)
    texts = [entry.sig.title] + [t for f in entry.sig.fixes for t in (f.text, f.command or "")]
    names = set().union(*(_placeholders(t) for t in texts))
    for line in entry.sig.examples.match:
        m = entry.match(line)
        assert m is not None
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        groups |= {name: "x" for name in entry.sig.requires}
        assert names <= groups.keys(), f"{sorted(names - groups.keys())} not captured from {line!r}"
        for text in texts:
            text.format(**groups)


def _perl_only(source: str) -> str | None:
    """The first Perl-only construct in a regex (`(?...)`, `\\d`-style classes, lazy quantifiers), if any."""
    tokens = re.findall(r"\\.|.", source, flags=re.DOTALL)
    for prev, tok in itertools.pairwise(["", *tokens]):
        if tok in {"\\d", "\\D", "\\w", "\\W", "\\s", "\\S", "\\b", "\\B"}:
            return tok
        if tok == "?" and prev in {"(", "*", "+", "?", "}"}:
            return prev + tok
    return None


@pytest.mark.parametrize("rule_id", IDS)
def test_triggers_stay_in_the_re2_and_posix_ere_subset(rule_id: str) -> None:
    """The benchmark greps with the triggers (`grep -E`), so no Perl-only syntax in them."""
    for source in _entry(rule_id).sig.triggers:
        found = _perl_only(source)
        assert found is None, f"trigger {source!r} uses {found!r}, which grep -E does not know"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("No \\*?\\.safetensors", None),
        ("exitcode *: -7", None),
        ("a(?:b)", "(?"),
        ("x\\d+", "\\d"),
        ("a.*?b", "*?"),
    ],
)
def test_perl_only_detector(source: str, found: str | None) -> None:
    assert _perl_only(source) == found


def test_every_category_is_covered() -> None:
    covered = {entry.sig.category for entry in _catalog()}
    missing = [c for c in CATEGORIES if c not in covered and c != "none"]
    assert not missing, f"categories without a signature: {missing}"


@pytest.mark.parametrize("line", HEALTHY_LINES)
def test_healthy_lines_pass_the_prefilter(line: str) -> None:
    """The union of all triggers, compiled by RE2 as the scanner does, stays silent on healthy output."""
    union = re2.compile("|".join(f"(?:{t})" for entry in _catalog() for t in entry.sig.triggers))
    fired = [(e.sig.id, t.pattern) for e in _catalog() for t in e.triggers if t.search(line)]
    assert union.search(line) is None, f"healthy line trips triggers {fired}"
    assert match_line(line, _catalog()) == []


def test_category_unknown_is_only_for_wrappers() -> None:
    for entry in _catalog():
        if entry.sig.category == "unknown":
            assert entry.sig.role == "secondary", f"{entry.sig.id}: 'unknown' is for generic wrappers"


# --- loader errors: a bad file names the file and the field, never a traceback -------------------------

GOOD = """\
id: {id}
category: {category}
title: t
stage: any
role: primary
effect: fatal
triggers: ["{trigger}"]
patterns: ["{pattern}"]
cause: c
fixes:
{fixes}
examples:
  match: ["boom"]
"""
LIGHT_TO_HEAVY = "  - {action: inspect, text: look}\n  - {action: hardware, text: swap}\n"


def _write(folder: Path, stem: str, **fields: str) -> Path:
    values = {
        "id": stem,
        "category": "device_fault",
        "trigger": "boom",
        "pattern": "boom",
        "fixes": LIGHT_TO_HEAVY,
    }
    values.update(fields)
    path = folder / f"{stem}.yaml"
    path.write_text(GOOD.format(**values), encoding="utf-8")
    return path


def test_a_good_temp_catalog_loads(tmp_path: Path) -> None:
    _write(tmp_path, "boom_rule")
    assert [e.sig.id for e in load_catalog(tmp_path)] == ["boom_rule"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"pattern": "boom(["}, "patterns.0"),
        ({"trigger": "(?=boom)"}, "triggers.0"),
        ({"id": "other_rule"}, "id"),
        ({"fixes": "  - {action: hardware, text: swap}\n  - {action: inspect, text: look}\n"}, "fixes"),
        ({"category": "gremlins"}, "category"),
        ({"fixes": "  - {action: pray, text: hope}\n"}, "fixes.0.action"),
    ],
    ids=[
        "bad-regex",
        "lookaround-trigger",
        "id-not-stem",
        "fixes-heavy-first",
        "unknown-category",
        "bad-action",
    ],
)
def test_bad_files_name_the_file_and_field(tmp_path: Path, fields: dict[str, str], field: str) -> None:
    path = _write(tmp_path, "boom_rule", **fields)
    with pytest.raises(MMAgentError) as info:
        load_catalog(tmp_path)
    assert info.value.file == str(path)
    # model-level checks (fix order) report at the root, so the field may be named in the message instead
    assert field in f"{info.value.field} {info.value.message}"
    assert info.value.fix
    assert "Traceback" not in str(info.value)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("id: [unclosed\n", encoding="utf-8")
    with pytest.raises(MMAgentError) as info:
        load_catalog(tmp_path)
    assert info.value.file == str(path)


def test_empty_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(MMAgentError):
        load_catalog(tmp_path)


# The category list users grep for is docs/diagnose.md: tests/test_docs.py::test_diagnose_page_lists_every_category


def test_yields_to_must_name_a_rule_of_the_catalog(tmp_path: Path) -> None:
    path = _write(tmp_path, "boom_rule")
    path.write_text(path.read_text(encoding="utf-8") + "yields_to: [no_such_rule]\n", encoding="utf-8")
    with pytest.raises(MMAgentError) as info:
        load_catalog(tmp_path)
    assert (info.value.file, info.value.field) == (str(path), "yields_to.0")
    assert "no_such_rule" in info.value.message and info.value.fix


# --- upstream citations: where the framework writes the message (checked against the source in tests/fidelity) ---


def test_an_upstream_citation_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, "boom_rule")
    citation = '  - {repo: Megatron-LM, file: megatron/training/arguments.py, text: "assert args.micro_batch_size"}\n'
    path.write_text(path.read_text(encoding="utf-8") + "upstream:\n" + citation, encoding="utf-8")
    (entry,) = load_catalog(tmp_path)
    assert [(u.repo, u.file) for u in entry.sig.upstream] == [
        ("Megatron-LM", "megatron/training/arguments.py")
    ]


@pytest.mark.parametrize(
    ("citation", "field"),
    [
        (
            '{repo: Megatron-LM, file: /megatron/training/arguments.py, text: "assert args.x is None"}',
            "upstream.0.file",
        ),
        ('{repo: Megatron-LM, file: megatron/../setup.py, text: "assert args.x is None"}', "upstream.0.file"),
        ('{repo: NeMo, file: nemo/arguments.py, text: "assert args.x is None"}', "upstream.0.repo"),
        (
            '{repo: MindSpeed, file: mindspeed/arguments.py, text: " assert args.x is None"}',
            "upstream.0.text",
        ),
        ('{repo: MindSpeed, file: mindspeed/arguments.py, text: "assert"}', "upstream.0.text"),
        ("{repo: MindSpeed, file: mindspeed/arguments.py}", "upstream.0.text"),
    ],
    ids=["absolute-file", "dotdot-file", "unknown-repo", "padded-text", "short-text", "no-text"],
)
def test_bad_upstream_citation_names_the_field(tmp_path: Path, citation: str, field: str) -> None:
    path = _write(tmp_path, "boom_rule")
    path.write_text(path.read_text(encoding="utf-8") + f"upstream:\n  - {citation}\n", encoding="utf-8")
    with pytest.raises(MMAgentError) as info:
        load_catalog(tmp_path)
    assert info.value.file == str(path)
    assert field in f"{info.value.field} {info.value.message}"
    assert info.value.fix
