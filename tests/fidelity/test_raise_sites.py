"""The catalog covers MindSpeed-MM's own error messages: every raise site is matched by a signature or listed.

The sites are read from the real source with `ast` (tests/fidelity/raise_sites.py says what counts: `raise`,
`assert`, `ensure_valid(cond, msg)`, `logger.error/critical/exception`, and prints starting with an error
mark; `warnings.warn`, warnings and progress prints do not count, the run goes on after them). For
MindSpeed-MM v26.0.0 and v26.1.0 each site must be

- matched by a signature of mm_agent/diagnose/signatures/ (a category other than `unknown`): its message as a
  log shows it (`ValueError: <text>`, f-string holes filled with plausible values), the source line a
  traceback prints above it, or an `upstream:` citation of that file whose text is in the statement; or
- selected by a rule of mm_agent/diagnose/upstream_messages.yaml, which lists what users do not meet
  (no message, another error's text passed on, internal invariants, the MindSpore backend), each with why.

A site that is neither fails with its file, line and message. A rule that selects nothing fails too, so the
list cannot keep stale entries. The messages the issue names (feature extraction's "Received empty batch",
Qwen3-VL's context-parallel algorithm check) and the other priority groups must resolve to a specific
signature, not to one of the catch-alls (mm_check_failed, mm_option_unsupported, mm_runtime_check_failed).

`python -m tests.fidelity.raise_sites $MM_UPSTREAM [--catalog DIR] [--uncovered]` prints the coverage table.
Parsing both trees takes a few seconds; the verdicts are computed once per session.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from mm_agent.diagnose.catalog import CompiledSignature, load_catalog
from mm_agent.diagnose.upstream import UpstreamMessages, load_upstream_messages
from mm_agent.errors import MMAgentError

from .conftest import MMTrees
from .raise_sites import (
    Site,
    Verdict,
    judge_trees,
    renderings,
    sites_in_source,
    sites_in_tree,
    traceback_line,
)

VERSIONS = ("26.0.0", "26.1.0")


@functools.cache
def _catalog() -> tuple[CompiledSignature, ...]:
    return load_catalog()


@functools.cache
def _listed() -> UpstreamMessages:
    return load_upstream_messages()


@pytest.fixture(scope="module")
def verdicts(mm_tree: MMTrees) -> dict[str, list[Verdict]]:
    trees: dict[str, list[Site]] = {}
    for version in VERSIONS:
        root = mm_tree.version_dir(version)
        assert root is not None, f"no MindSpeed-MM v{version} tree under {mm_tree.root}"
        trees[version] = sites_in_tree(root)
    return judge_trees(trees, _catalog(), _listed())


# --- the walker, on source written here (runs everywhere) --------------------------------------------------

SOURCE = """
import logging
logger = logging.getLogger(__name__)

def check(args, path, e):
    if args.cp > 1:
        raise NotImplementedError(f"Only support `ulysses_cp_algo`, but got {args.context_parallel_algo}")
    raise ValueError("Template {} does not exist.".format(args.template))
    raise KeyError("Missing %s in %d files" % (path, 3))
    msg = "Insufficient frames: "
    msg += f"{args.n} < {args.m}"
    raise ValueError(msg)
    raise RuntimeError(e)
    raise NotImplementedError
    raise
    raise e
    raise ValueError("first part, "
                     f"second {path}")
    ensure_valid(args.mbs is not None, "micro batch size is required")
    ensure_valid(args.gbs > 0)
    assert args.heads % args.cp == 0, "heads must divide"
    logger.error(f"LoRA parameter {path} contains NaN values")
    logger.warning("only a warning")
    print(f"Error: Invalid YAML format in {path} - {e}")
    print(f"Warning: Config file not found: {path}")
    print("training ...")
"""


def _sites() -> list[Site]:
    return sites_in_source(SOURCE, "mindspeed_mm/x.py")


def test_walker_finds_each_kind_of_site_and_skips_re_raises() -> None:
    found = [(s.kind, s.exception, s.template or s.dynamic) for s in _sites()]
    assert found == [
        ("raise", "NotImplementedError", "Only support `ulysses_cp_algo`, but got {}"),
        ("raise", "ValueError", "Template {} does not exist."),
        ("raise", "KeyError", "Missing {} in {} files"),
        ("raise", "ValueError", "Insufficient frames: {} < {}"),
        ("raise", "RuntimeError", "e"),
        ("raise", "NotImplementedError", ""),
        ("raise", "ValueError", "first part, second {}"),
        ("ensure_valid", "IsNotValidError", "micro batch size is required"),
        ("assert", "AssertionError", "heads must divide"),
        ("log", "logger.error", "LoRA parameter {} contains NaN values"),
        ("print", "print", "Error: Invalid YAML format in {} - {}"),
    ]


def test_holes_remember_their_expressions_and_render_as_a_log_line() -> None:
    site = _sites()[0]
    assert site.holes == ("args.context_parallel_algo",)
    lines = [line for rendering in renderings(site) for line in rendering]
    assert "NotImplementedError: Only support `ulysses_cp_algo`, but got value" in lines
    assert traceback_line(site).startswith('    raise NotImplementedError(f"Only support')
    ensure = next(s for s in _sites() if s.kind == "ensure_valid")
    assert renderings(ensure)[0] == ["mindspeed_mm.utils.utils.IsNotValidError: micro batch size is required"]


def test_a_message_without_literal_text_keeps_its_expression() -> None:
    bare = [s for s in _sites() if not s.template]
    assert [(s.exception, s.dynamic) for s in bare] == [("RuntimeError", "e"), ("NotImplementedError", "")]
    assert all(renderings(s) == [] for s in bare)


# --- the not-user-facing list as data (runs everywhere) ----------------------------------------------------


def test_the_shipped_list_loads_and_each_rule_says_why() -> None:
    listed = _listed()
    assert set(listed.releases) == set(VERSIONS)
    assert listed.not_user_facing, "the list is empty"
    for rule in listed.not_user_facing:
        assert len(rule.reason) >= 20, rule.id


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ("{id: a_rule, kind: no_message, reason: 'twenty characters or more here'}", "not_user_facing.0"),
        ("{id: a_rule, kind: gremlins, reason: 'twenty characters or more here', files: [x]}", "kind"),
        ("{id: a_rule, kind: no_message, reason: short, files: [x]}", "reason"),
        (
            "{id: a_rule, kind: no_message, reason: 'twenty characters or more here', messages: ['(']}",
            "messages",
        ),
        ("{id: A-Rule, kind: no_message, reason: 'twenty characters or more here', files: [x]}", "id"),
        (
            "{id: a_rule, kind: no_message, reason: 'twenty characters or more here', messages: [x], "
            "expressions: [y]}",
            "not_user_facing.0",
        ),
    ],
    ids=["no-criteria", "unknown-kind", "no-reason", "bad-regex", "bad-id", "messages-and-expressions"],
)
def test_a_bad_rule_names_the_file_and_the_field(tmp_path: Path, rule: str, field: str) -> None:
    path = tmp_path / "upstream_messages.yaml"
    path.write_text(f'releases: ["26.0.0"]\nnot_user_facing:\n  - {rule}\n', encoding="utf-8")
    with pytest.raises(MMAgentError) as info:
        load_upstream_messages(path)
    assert info.value.file == str(path)
    assert field in f"{info.value.field}", info.value.field
    assert info.value.fix


def test_rule_ids_are_unique(tmp_path: Path) -> None:
    path = tmp_path / "upstream_messages.yaml"
    rule = "{id: same, kind: no_message, reason: 'twenty characters or more here', expressions: ['']}"
    path.write_text(f"releases: [26.0.0]\nnot_user_facing:\n  - {rule}\n  - {rule}\n", encoding="utf-8")
    with pytest.raises(MMAgentError) as info:
        load_upstream_messages(path)
    assert "same" in info.value.message


def test_a_rule_selects_by_every_criterion_it_sets() -> None:
    rule = next(r for r in _listed().not_user_facing if r.id == "mindspore_backend")
    assert rule.selects("mindspeed_mm/mindspore/models/x.py", "ValueError", "anything {}", "")
    assert not rule.selects("mindspeed_mm/models/x.py", "ValueError", "anything {}", "")
    no_message = next(r for r in _listed().not_user_facing if r.id == "no_message")
    assert no_message.selects("mindspeed_mm/a.py", "NotImplementedError", "", "")
    assert not no_message.selects("mindspeed_mm/a.py", "NotImplementedError", "", "dataset_type")
    assert not no_message.selects("mindspeed_mm/a.py", "ValueError", "text", "")


# --- the real source (needs MM_UPSTREAM) --------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_every_site_is_matched_or_listed(version: str, verdicts: dict[str, list[Verdict]]) -> None:
    found = verdicts[version]
    assert len(found) > 1000, f"only {len(found)} sites found in v{version}: is the walker broken?"
    uncovered = [v.site for v in found if not v.how]
    report = "\n".join(
        f"  {s.file}:{s.line} {s.exception}: {(s.template or s.dynamic)[:160]}" for s in uncovered
    )
    assert not uncovered, (
        f"{len(uncovered)} MindSpeed-MM v{version} messages match no signature and are not listed as not user-facing "
        f"(add a signature to mm_agent/diagnose/signatures/ or a rule with a reason to "
        f"mm_agent/diagnose/upstream_messages.yaml):\n{report}"
    )


def test_every_rule_selects_a_site(verdicts: dict[str, list[Verdict]]) -> None:
    sites = [v.site for found in verdicts.values() for v in found]
    unused = [
        rule.id
        for rule in _listed().not_user_facing
        if not any(rule.selects(s.file, s.exception, s.template, s.dynamic) for s in sites)
    ]
    assert not unused, f"rules in upstream_messages.yaml that select no site of {VERSIONS}: {unused}"


# signature id -> (version, file under mindspeed_mm/, fragment of its message or statement)
PRIORITY = [
    (
        "feature_extraction_empty_batch",
        "26.0.0",
        "tools/feature_extraction/get_sora_feature.py",
        "empty batch",
    ),
    (
        "feature_extraction_empty_batch",
        "26.1.0",
        "tools/feature_extraction/get_hunyuan_feature.py",
        "empty batch",
    ),
    (
        "cp_algo_unsupported",
        "26.1.0",
        "models/transformers/qwen3vl/modeling_qwen3_vl.py",
        "`ulysses_cp_algo`",
    ),
    ("cp_algo_unsupported", "26.0.0", "models/predictor/dits/wan_dit.py", "Context_parallel_algo"),
    (
        "ulysses_heads_not_divisible",
        "26.1.0",
        "fsdp/ops/flash_attn/flash_attn.py",
        "divisible by ulysses_size",
    ),
    ("parallel_size_not_divisible", "26.1.0", "models/common/fused_moe.py", "Number of experts"),
    ("vlm_pp_layers_count", "26.1.0", "models/vlm_model.py", "length of pipeline_num_layers"),
    ("data_config_invalid", "26.1.0", "data/__init__.py", "NotImplementedError(dataset_type)"),
    ("data_config_invalid", "26.0.0", "data/data_utils/func_utils/template.py", "does not exist"),
    ("video_too_few_frames", "26.1.0", "data/data_utils/video_processor.py", "Insufficient frames"),
    ("mm_ckpt_path_missing", "26.1.0", "models/common/checkpoint.py", "Could not find checkpoint"),
    ("mm_ckpt_model_mismatch", "26.1.0", "models/predictor/dits/hunyuan_video_15_dit.py", "Missing key:"),
    ("mm_model_unknown", "26.1.0", "fsdp/utils/register.py", "is not registered"),
    ("mm_yaml_config_invalid", "26.1.0", "config/config_manager.py", "is not defined in the configuration"),
]


@pytest.mark.parametrize(
    ("rule_id", "version", "file", "fragment"),
    PRIORITY,
    ids=[f"{r}-{Path(f).stem}" for r, _, f, _ in PRIORITY],
)
def test_priority_messages_get_a_specific_signature(
    rule_id: str, version: str, file: str, fragment: str, verdicts: dict[str, list[Verdict]]
) -> None:
    path = f"mindspeed_mm/{file}"
    hits = [v for v in verdicts[version] if v.site.file == path and fragment in v.site.source]
    assert hits, f"no site in {path} of v{version} contains {fragment!r}"
    for verdict in hits:
        assert (verdict.by, verdict.generic) == (rule_id, False), (
            f"{path}:{verdict.site.line} resolves to {verdict.by!r} ({verdict.how}), expected {rule_id}"
        )
