"""What the training will load (issue 26, item 3), judged by MindSpeed-MM's own converters and model classes.

Each case of `load_fidelity.py` renders a job over a tiny Hugging Face checkpoint, runs the conversion render
lists with MindSpeed-MM's converter CLI and builds the job's model on the meta device with MindSpeed-MM's code,
at 26.0.0 and 26.1.0 (one child process per case and version, two at a time: about 1.5 minutes on 2 cores).
Every rendered conversion must fill every parameter its model requests; the Qwen3-VL fsdp2-native job's
former conversion (Qwen3VLConverter) fills none and the Qwen3-ASR job's former one (no --tie_weight_mapping) all but
the output head, which mm-agent's static checks (`mm_agent/loadcheck.py`, used by validate_configs and render_job)
must say; the VACE config's former predictor.from_pretrained (a folder) stops MindSpeed-MM's model build, which
validate_configs must say; their key lists (`registry/data/load_keys.yaml`) must be the
models' own; and `mm_agent.ckptkeys`, which reads checkpoints without torch, must read what torch reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from fidelity import load_fidelity as lf
from mm_agent import loadcheck
from mm_agent.ckptkeys import dcp_tensors, rank_file_tensors
from mm_agent.registry import get_registry
from mm_agent.render import render_job
from mm_agent.validate import ValidateRequest, validate_configs

KEYS = [(c.id, v) for c in lf.CASES for v in lf.versions_of(c)]
STATIC = [(c.id, v) for c in lf.CASES if c.static for v in lf.versions_of(c)]
WRONG = [(lf.WRONG_QWEN3VL.id, v) for v in lf.versions_of(lf.WRONG_QWEN3VL)]
UNTIED = [(lf.WRONG_QWEN3_ASR.id, v) for v in lf.versions_of(lf.WRONG_QWEN3_ASR)]
VACE = next(c for c in lf.CASES if c.model == "vace")


@pytest.fixture(scope="module")
def outcomes(upstream: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], lf.Outcome]:
    base = tmp_path_factory.mktemp("load")
    found = lf.run_all(upstream, base, (*lf.CASES, lf.WRONG_QWEN3VL, lf.WRONG_QWEN3_ASR))
    return {(o.case.id, o.version): o for o in found}


@pytest.mark.parametrize(("case", "version"), KEYS)
def test_rendered_conversion_fills_the_model(
    outcomes: dict[tuple[str, str], lf.Outcome], case: str, version: str
) -> None:
    outcome = outcomes[(case, version)]
    assert outcome.error is None, outcome.error
    assert outcome.total > 0
    assert outcome.loaded == outcome.total, (
        f"{outcome.cell().text}\nconversion: {' '.join(outcome.prep.argv)}\n"
        f"not converted: {outcome.missing()[:20]}"
    )


@pytest.mark.parametrize(("case", "version"), WRONG)
def test_qwen3vl_native_from_the_megatron_converter_loads_nothing(
    outcomes: dict[tuple[str, str], lf.Outcome], case: str, version: str
) -> None:
    """What the fsdp2-native job rendered before: Qwen3VLConverter's `model.` prefix and 2-D experts meet none of
    the native model's names, and mm-agent's checks say so where render and validate can read both sides."""
    outcome = outcomes[(case, version)]
    assert outcome.error is None, outcome.error
    assert outcome.total > 0 and outcome.loaded == 0, outcome.cell().text
    issue = loadcheck.native_check(
        _yaml(outcome.prep.job_dir / "config.yaml"), outcome.prep.load_dir, outcome.prep.weights_dir, version
    )
    assert issue is not None and issue.severity == "error" and issue.rule == "load.partial"
    assert (issue.loaded, issue.total) == (0, outcome.total), issue.message
    report = validate_configs(ValidateRequest(paths=[str(outcome.prep.job_dir)]))
    found = [f for f in report.findings if f.rule == "load.partial"]
    assert [f.severity for f in found] == ["error"], [(f.rule, f.message) for f in report.findings]
    assert f"0 of {outcome.total} parameters would load; the rest start random" in found[0].message
    rendered = render_job(outcome.prep.request.model_copy(update={"confirm": False}))
    assert any(
        line.startswith(f"error: {outcome.prep.load_dir}: 0 of {outcome.total}")
        for line in rendered.load_check
    )


@pytest.mark.parametrize(("case", "version"), UNTIED)
def test_qwen3_asr_without_the_tie_mapping_leaves_the_head_random(
    outcomes: dict[tuple[str, str], lf.Outcome], case: str, version: str
) -> None:
    """What the Qwen3-ASR job rendered before: GenericDCPConverter without the README's --tie_weight_mapping. The
    checkpoint stores the tied embedding once, the trained model asks for its head too, and the non-strict DCP load
    leaves it random; mm-agent's checks say so."""
    outcome = outcomes[(case, version)]
    assert outcome.error is None, outcome.error
    assert outcome.missing() == ["model.thinker.lm_head.weight"], outcome.cell().text
    issue = loadcheck.native_check(
        _yaml(outcome.prep.job_dir / "config.yaml"), outcome.prep.load_dir, outcome.prep.weights_dir, version
    )
    assert issue is not None and issue.rule == "load.partial", issue
    assert (issue.loaded, issue.total) == (outcome.total - 1, outcome.total), issue.message
    assert "thinker.lm_head.weight" in issue.message


def test_vace_from_a_folder_stops_the_model_build(
    upstream: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The stock VACE config (and mm-agent's before issue 26) names the converted folder as predictor.from_pretrained;
    MindSpeed-MM's PredictModel refuses it while it builds the model, and validate_configs says so. The rendered
    job names the rank file instead (test_rendered_conversion_fills_the_model)."""
    version = lf.versions_of(VACE)[0]
    prep = lf.prepare(VACE, version, upstream, tmp_path_factory.mktemp("vace"))
    folder = str(prep.load_dir)
    rendered = validate_configs(ValidateRequest(paths=[str(prep.job_dir)]))
    assert not [f for f in rendered.findings if f.rule == "load.pretrained_not_a_file"]
    for model_json in (prep.work / "model_tiny.json", prep.job_dir / "pretrain_model.json"):
        data = json.loads(model_json.read_text(encoding="utf-8"))
        assert data["predictor"]["from_pretrained"] == folder + "/release/mp_rank_00/model_optim_rng.pt"
        data["predictor"]["from_pretrained"] = folder
        model_json.write_text(json.dumps(data), encoding="utf-8")
    outcome = lf.execute(prep)
    assert outcome.error is not None and f"Could not find checkpoint at {folder}" in outcome.error, (
        outcome.error
    )
    report = validate_configs(ValidateRequest(paths=[str(prep.job_dir)]))
    found = [f for f in report.findings if f.rule == "load.pretrained_not_a_file"]
    assert [f.severity for f in found] == ["error"], [(f.rule, f.message) for f in report.findings]


@pytest.mark.parametrize(("case", "version"), STATIC)
def test_static_checks_agree(outcomes: dict[tuple[str, str], lf.Outcome], case: str, version: str) -> None:
    """Where mm-agent counts statically (a Megatron predictor listed in load_keys.yaml, an FSDP2-native model),
    it counts what MindSpeed-MM's own code counts: every parameter, and validate and render say nothing."""
    outcome = outcomes[(case, version)]
    prep = outcome.prep
    if outcome.case.kind == "megatron":
        model = json.loads((prep.job_dir / "pretrain_model.json").read_text(encoding="utf-8"))
        issue = loadcheck.predictor_check(model, prep.load_dir)
    else:
        issue = loadcheck.native_check(
            _yaml(prep.job_dir / "config.yaml"), prep.load_dir, prep.weights_dir, version
        )
    assert issue is not None and issue.rule == "load.complete", issue
    counted = outcome.total - len(outcome.shared)  # a tied copy filled through its partner is not counted
    assert (issue.loaded, issue.total) == (counted, counted)
    report = validate_configs(ValidateRequest(paths=[str(prep.job_dir)]))
    assert [f for f in report.findings if f.rule.startswith("load.")] == []
    assert render_job(prep.request.model_copy(update={"confirm": False})).load_check == []


@pytest.mark.parametrize(("case", "version"), STATIC)
def test_key_lists_are_the_models_own(
    outcomes: dict[tuple[str, str], lf.Outcome], case: str, version: str
) -> None:
    """load_keys.yaml's predictor lists expand, for the rendered model config, to exactly the names MindSpeed-MM's
    predictor has; a native model's names are its Hugging Face checkpoint's, under the DCP prefix."""
    outcome = outcomes[(case, version)]
    assert outcome.model, outcome.error
    table = loadcheck.load_keys()
    if outcome.case.kind == "fsdp":
        model_id = _yaml(outcome.prep.job_dir / "config.yaml")["model"]["model_id"]
        expected = table.native[model_id].expected(outcome.prep.weights_dir, version)
        # a parameter that is another one's tensor at load time is filled through it (26.1.0 re-ties lm_head)
        requested = {k: v for k, v in outcome.model.items() if k not in outcome.shared}
        assert {k: list(v) for k, v in expected.items()} == requested
        return
    model = json.loads((outcome.prep.job_dir / "pretrain_model.json").read_text(encoding="utf-8"))
    names = table.predictors[model["predictor"]["model_id"]].names(model)
    assert sorted(names or []) == sorted(outcome.model)


@pytest.mark.parametrize(("case", "version"), [*KEYS, *WRONG, *UNTIED])
def test_checkpoints_read_without_torch(
    outcomes: dict[tuple[str, str], lf.Outcome], case: str, version: str
) -> None:
    """mm_agent.ckptkeys (no torch, no pickle code run) reads the names and shapes torch reads."""
    outcome = outcomes[(case, version)]
    assert outcome.converted, outcome.error
    folder = loadcheck.iteration_dir(outcome.prep.load_dir)
    assert folder is not None
    if outcome.case.layout == "dcp":
        mine = dcp_tensors(folder)
    else:
        mine = rank_file_tensors(folder / "mp_rank_00" / "model_optim_rng.pt")["model"]
    assert {k: list(v) for k, v in mine.items()} == outcome.converted


def test_every_registered_model_has_a_cell(outcomes: dict[tuple[str, str], lf.Outcome]) -> None:
    """The report column: every model at every version is checked, or says why not (load_keys.yaml not_run)."""
    reg = get_registry()
    cells = lf.cells([o for o in outcomes.values() if o.case in lf.CASES])
    expected = {(m.id, v) for m in reg.models.values() for v in lf.VERSIONS if m.versions.contains(v)}
    assert set(cells) == expected
    unexplained = {k: c.text for k, c in cells.items() if c.text.startswith("unexplained")}
    assert not unexplained, unexplained
    covered = {c.model for c in lf.CASES}
    reasons = loadcheck.load_keys().not_run
    assert not covered & set(reasons), "a model with a case needs no not_run reason"
    assert set(reasons) <= set(reg.models), sorted(set(reasons) - set(reg.models))
    assert all(cells[k].ok for k in cells if k[0] in covered), {
        k: c.text for k, c in cells.items() if k[0] in covered
    }


def _yaml(path: Path) -> dict:  # type: ignore[type-arg]
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_depth_notes_match_the_stock_configs(mm_tree: object) -> None:
    """load_keys.yaml `depth`: at every version that has the model, the stock training configs it names build
    fewer layers than the released checkpoint, and the stock configs it names for the released model build it."""
    reg = get_registry()
    checked = 0
    for model_id, depth in loadcheck.load_keys().depth.items():
        entry = reg.get(depth.model)
        for version in lf.VERSIONS:
            if not entry.versions.contains(version):
                continue
            tree = mm_tree.version_dir(version)  # type: ignore[attr-defined]
            assert tree is not None
            for rel in depth.stock_configs:
                predictor = json.loads((tree / rel).read_text(encoding="utf-8"))["predictor"]
                assert predictor["model_id"] == model_id and predictor["num_layers"] < depth.released, (
                    version,
                    rel,
                )
                checked += 1
            for rel in depth.released_configs:
                predictor = json.loads((tree / rel).read_text(encoding="utf-8"))["predictor"]
                assert predictor["num_layers"] == depth.released, (version, rel)
                checked += 1
    assert checked >= 4
