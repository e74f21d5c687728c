"""The diagnose catalog against the frameworks' own source: each cited message is really written upstream.

A signature that declares `upstream: [{repo, file, text}]` says "MindSpeed-MM / MindSpeed / Megatron-LM writes
this message here". These tests hold it to that:

- the cited file exists in every tree of that project under MM_UPSTREAM (MindSpeed-MM v26.0.0 and v26.1.0,
  MindSpeed 26.0.0 and 26.1.0, Megatron-LM core_v0.12.1) and contains the fragment verbatim;
- the fragment, with its `{}` / `%s` placeholders filled by anything, is found in one of the signature's
  `examples.match` lines: the test lines are the upstream message as it renders at run time;
- every example line resolves to this signature alone, and in a log where torchrun's ChildFailedError wrapper
  follows it, the signature is the root cause (a specific upstream message beats the generic wrappers).

Only the first check reads the upstream trees (skipped without MM_UPSTREAM); the others run everywhere.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from mm_agent.diagnose import diagnose_text
from mm_agent.diagnose.catalog import SIGNATURES_DIR, CompiledSignature, load_catalog, match_line
from mm_agent.diagnose.schema import UpstreamSource

from .conftest import MMTrees

# The releases the fidelity suite judges; a cited fragment must hold in each (Megatron has one tree).
VERSIONS = ("26.0.0", "26.1.0")

# torchrun's report after a worker died: what every failed multi-process log ends with.
TORCHRUN_TAIL = [
    "E1120 12:00:01.000000 140000 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1)"
    " local_rank: 0 (pid: 3079955) of binary: /usr/bin/python3",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "  exitcode  : 1 (pid: 3079955)",
]

_PLACEHOLDER = re.compile(r"\{[^{}]*\}|%[-+ #0]*\d*(?:\.\d+)?[sdrfi]")


@functools.cache
def _catalog() -> tuple[CompiledSignature, ...]:
    return load_catalog()


def _cited() -> list[CompiledSignature]:
    return [entry for entry in _catalog() if entry.sig.upstream]


CITED_IDS = [entry.sig.id for entry in _cited()]
CITATIONS = [(entry.sig.id, i) for entry in _cited() for i in range(len(entry.sig.upstream))]


def _entry(rule_id: str) -> CompiledSignature:
    return next(entry for entry in _catalog() if entry.sig.id == rule_id)


def fragment_regex(text: str) -> re.Pattern[str]:
    """The fragment as a regex: literal text, each format placeholder standing for any run of characters."""
    literals = _PLACEHOLDER.split(text)
    return re.compile(".*?".join(re.escape(part) for part in literals))


def trees_of(source: UpstreamSource, trees: MMTrees) -> list[Path]:
    """The roots of the project's trees this suite judges, in which the cited file must exist."""
    if source.repo == "Megatron-LM":
        return [trees.megatron_dir()]
    roots: list[Path] = []
    for version in VERSIONS:
        root = trees.version_dir(version) if source.repo == "MindSpeed-MM" else trees.mindspeed_dir(version)
        assert root is not None, f"no {source.repo} tree for {version} under {trees.root}"
        roots.append(root)
    return roots


def test_some_signatures_cite_the_upstream_source() -> None:
    """The catalog grounds its framework messages in the source: at least one per project."""
    repos = {source.repo for entry in _cited() for source in entry.sig.upstream}
    assert repos == {"MindSpeed-MM", "MindSpeed", "Megatron-LM"}, f"projects cited: {sorted(repos)}"
    assert len(CITED_IDS) >= 20, f"only {len(CITED_IDS)} signatures cite upstream"


@pytest.mark.parametrize(("rule_id", "index"), CITATIONS, ids=[f"{r}-{i}" for r, i in CITATIONS])
def test_cited_file_holds_the_fragment(rule_id: str, index: int, mm_tree: MMTrees) -> None:
    source = _entry(rule_id).sig.upstream[index]
    for root in trees_of(source, mm_tree):
        path = root / source.file
        where = f"{SIGNATURES_DIR / rule_id}.yaml upstream.{index}"
        assert path.is_file(), f"{where}: {source.file} does not exist in {root}"
        body = path.read_text(encoding="utf-8", errors="replace")
        assert source.text in body, f"{where}: {path} does not contain {source.text!r}"


@pytest.mark.parametrize(("rule_id", "index"), CITATIONS, ids=[f"{r}-{i}" for r, i in CITATIONS])
def test_a_test_line_is_the_rendered_fragment(rule_id: str, index: int) -> None:
    entry = _entry(rule_id)
    pattern = fragment_regex(entry.sig.upstream[index].text)
    lines = entry.sig.examples.match
    assert any(pattern.search(line) for line in lines), (
        f"upstream.{index} {entry.sig.upstream[index].text!r}: no examples.match line renders it ({pattern.pattern})"
    )


@pytest.mark.parametrize("rule_id", CITED_IDS)
def test_test_lines_match_this_signature_alone(rule_id: str) -> None:
    for line in _entry(rule_id).sig.examples.match:
        hits = sorted(entry.sig.id for entry, _ in match_line(line, _catalog()))
        assert hits == [rule_id], f"{line!r} resolves to {hits}"


@pytest.mark.parametrize("rule_id", CITED_IDS)
def test_root_cause_beats_the_torchrun_wrapper(rule_id: str) -> None:
    entry = _entry(rule_id)
    if entry.sig.effect == "warning":
        pytest.skip("warnings are never a root cause")
    for line in entry.sig.examples.match:
        report = diagnose_text("\n".join([line, *TORCHRUN_TAIL]) + "\n")
        assert report.root_cause is not None, f"no root cause for {line!r}"
        assert report.root_cause.rule_id == rule_id, f"{line!r}: root cause {report.root_cause.rule_id}"
        assert "torchrun_child_failed" in {f.rule_id for f in report.findings}


# Whole tracebacks as MindSpeed-MM prints them: the source line names the cause, the exception line only
# says a check failed; the cause must win.
TRACEBACKS = {
    "mbs_missing": [
        "Traceback (most recent call last):",
        '  File "/home/MindSpeed-MM/inference_sora.py", line 120, in <module>',
        "    main()",
        '  File "/home/MindSpeed-MM/mindspeed_mm/patchs/validate_args_patch.py", line 234, in validate_args',
        "    ensure_valid(args.micro_batch_size is not None)",
        '  File "/home/MindSpeed-MM/mindspeed_mm/utils/utils.py", line 291, in ensure_valid',
        "    raise IsNotValidError(error_message)",
        "mindspeed_mm.utils.utils.IsNotValidError: Expression is not valid",
    ],
    "mm_config_not_found": [
        "Warning: Config file not found: ./examples/wan2.1/1.3b/t2v/data.json - [Errno 2] No such file or"
        " directory: '/home/MindSpeed-MM/examples/wan2.1/1.3b/t2v/data.json'",
        "Traceback (most recent call last):",
        '  File "/home/MindSpeed-MM/mindspeed_mm/configs/config.py", line 101, in __init__',
        '    raise RuntimeError("One or more config files failed to load. See above errors.")',
        "RuntimeError: One or more config files failed to load. See above errors.",
    ],
    "mm_validate_args_failed": [
        '  File "/home/MindSpeed-MM/mindspeed_mm/patchs/validate_args_patch.py", line 241, in validate_args',
        "    ensure_valid(args.global_batch_size > 0)",
        "mindspeed_mm.utils.utils.IsNotValidError: Expression is not valid",
    ],
}


@pytest.mark.parametrize("rule_id", sorted(TRACEBACKS))
def test_traceback_root_cause(rule_id: str) -> None:
    report = diagnose_text("\n".join([*TRACEBACKS[rule_id], *TORCHRUN_TAIL]) + "\n")
    assert report.root_cause is not None and report.root_cause.rule_id == rule_id, [
        f.rule_id for f in report.findings
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("error parsing metadata file {}", "error parsing metadata file /a/b.txt"),
        ("number of nan iterations: {:3d} |", "number of nan iterations:   2 |"),
        ("Missing %s in %d files", "Missing key in 3 files"),
    ],
)
def test_fragment_regex_fills_placeholders(text: str, expected: str) -> None:
    assert fragment_regex(text).search(expected)
    assert not fragment_regex(text).search(expected.replace(text[:6], "XXXXXX"))
