"""Each model's MindSpeed-MM reader judges the dataset mm-agent writes for it (issue 26, item 4), at 26.0.0 and 26.1.0.

(a) every registered job whose reader mm-agent writes for: rendered, given a dataset by `prepare_dataset`, and
    that file fed under the job's rendered data config to the model's own dataset class (`dataset_readers.py`,
    `upstream_readers.py`): every written record kept, item 0 the first record as written;
(b) readers mm-agent does not write for: the record keys the data names are read by their code (`ast`), and the
    readers it writes for exist where the data says; each stock data config has the layout its format names;
(c) CogVideoX's clip decisions (`limits.plan_clip`) are its processor's, on real clips;
(d) MindSpeed-MM's feature-extraction samplers on several ranks: `limits.extraction_split` says "duplicate
    writes" exactly when two ranks take one sample in the same step, and "samples dropped" exactly when a sample
    is taken by no rank.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mm_agent.dataset.formats import load_formats
from mm_agent.dataset.limits import ClipLimits, ClipPlan, extraction_split, limits_from_config, plan_clip
from mm_agent.registry import get_registry
from tests.fidelity import dataset_readers
from tests.fidelity.dataset_readers import VERSIONS, outcomes, reader_keys, run_child

pytest.importorskip("torch")
pytest.importorskip("decord")
pytest.importorskip("av")


def _tree(upstream: Path, version: str) -> Path:
    tree = upstream / "MindSpeed-MM" / f"v{version}"
    if not tree.is_dir() or not (upstream / "MindSpeed" / f"{version}_core_r0.12.1").is_dir():
        pytest.skip(f"no MindSpeed-MM/MindSpeed {version} tree under {upstream}")
    return tree


@pytest.mark.parametrize("version", VERSIONS)
def test_every_written_index_is_read_by_the_jobs_own_reader(upstream: Path, version: str) -> None:
    _tree(upstream, version)
    found = {k: v for k, v in outcomes(upstream).items() if k[3] == version}
    written = {k: v for k, v in found.items() if v[0] is not None}
    assert written, "no job of this release has a reader mm-agent writes for"
    failed = {k: v[1] for k, v in written.items() if v[0] is not True}
    assert not failed, "\n".join(f"{k}: {t}" for k, t in failed.items())
    # the two models read their data.jsonl at the release that has them
    if version == "26.0.0":
        assert found[("cogvideox", "t2v", "megatron", version)][0] is True
        assert found[("stepvideo", "i2v", "megatron", version)][0] is True
    unsupported = {k for k, v in found.items() if v[0] is None}
    assert all(found[k][1].startswith("unsupported: ") for k in unsupported)


def _covered(upstream: Path) -> list[tuple[str, Any, str, Path]]:
    """(model, entry, version, tree) for every table entry at every reported release it applies to."""
    reg = get_registry()
    out = []
    for model, entries in load_formats().models.items():
        for entry, version in itertools.product(entries, VERSIONS):
            tree = upstream / "MindSpeed-MM" / f"v{version}"
            if (
                reg.models[model].versions.contains(version)
                and entry.versions.contains(version)
                and tree.is_dir()
            ):
                out.append((model, entry, version, tree))
    return out


def test_reader_keys_in_the_data_are_read_by_the_readers_code(upstream: Path) -> None:
    checked, problems = 0, []
    for model, entry, version, tree in _covered(upstream):
        if entry.reader is None:  # (the reader is no MindSpeed-MM code: marked, with its fix)
            assert entry.format is None and entry.unsupported is not None, model
            continue
        keys = reader_keys(tree, entry.reader.file, entry.reader.symbol)
        if keys is None:
            problems.append(f"{model}@{version}: {entry.reader.file}:{entry.reader.symbol} not found")
            continue
        missing = set(entry.keys) - keys
        if missing:
            problems.append(f"{model}@{version}: {entry.reader.symbol} reads no {sorted(missing)}")
        checked += 1
    assert not problems, "\n".join(problems)
    assert checked >= 40


def test_stock_data_configs_have_the_layout_of_their_format(upstream: Path) -> None:
    import yaml

    checked = 0
    for model, entry, version, tree in _covered(upstream):
        if entry.stock_config is None or not (tree / entry.stock_config).is_file():
            assert entry.stock_config is None or entry.format == "mllm", (model, version, entry.stock_config)
            continue  # (a VLM's YAML of another release)
        text = (tree / entry.stock_config).read_text()
        cfg = json.loads(text) if entry.stock_config.endswith(".json") else yaml.safe_load(text)
        param = (cfg.get("data") or cfg)["dataset_param"]
        basic = param["basic_parameters"]
        if entry.format == "mllm":
            assert param["dataset_type"] == "huggingface" and isinstance(param.get("attr"), dict), model
        else:
            fmt = load_formats().formats[str(entry.format)]
            assert basic.get("data_storage_mode") == fmt.storage_mode, (model, version)
            suffix = ".txt" if fmt.list_file else Path(fmt.index).suffix
            assert basic["data_path"].endswith(suffix), (model, version, basic["data_path"])
        checked += 1
    assert checked >= 25
    # build_mm_dataset builds T2VDataset for dataset_type t2v and I2VDataset for i2v (the child's dispatch)
    for version in VERSIONS:
        source = (
            upstream / "MindSpeed-MM" / f"v{version}" / "mindspeed_mm" / "data" / "__init__.py"
        ).read_text()
        assert 'if dataset_type == "t2v":\n        return T2VDataset(' in source
        assert 'elif dataset_type == "i2v":\n        return I2VDataset(' in source


def test_cited_lines_exist(upstream: Path) -> None:
    table = load_formats()
    cites = [c for f in table.formats.values() for c in f.cite]
    cites += [c for entries in table.models.values() for e in entries for c in e.cite]
    tree = upstream / "MindSpeed-MM" / "v26.0.0"
    for cite in cites:
        path, _, span = cite.rpartition(":")
        last = int(span.split("-")[-1])
        assert (tree / path).is_file(), cite
        assert last <= len((tree / path).read_text(encoding="utf-8").splitlines()), cite


# (frames, fps) around each CogVideoXProcessor branch at 17 frames, train_fps 8, skip_frame_num 3
COG_CLIPS = (
    (6, 16),
    (7, 16),
    (9, 16),
    (17, 8),
    (18, 8),
    (19, 8),
    (20, 8),
    (40, 8),
    (51, 24),
    (52, 24),
    (100, 5),
    (21, 7),
)


def test_cogvideox_clip_decisions_are_its_processors(upstream: Path, tmp_path: Path) -> None:
    from runtime.synth import write_mp4

    tree = _tree(upstream, "26.0.0")
    config = tree / "examples" / "cogvideox" / "t2v_1.0" / "data.json"
    lim = limits_from_config(json.loads(config.read_text()), source=str(config))
    assert (lim.processor, lim.num_frames, lim.train_fps, lim.skip_frame_num) == (
        "CogVideoXProcessor",
        17,
        8,
        3,
    )
    clips = {}
    for frames, fps in COG_CLIPS:
        path = tmp_path / f"c{frames}_{fps}.mp4"
        write_mp4(path, np.full((frames, 48, 64, 3), 90, np.uint8), fps)  # (decord pads narrower widths)
        clips[str(path)] = (frames, fps)
    case = {"name": "cog", "kind": "cogvideox_clips", "data_config": str(config), "clips": list(clips)}
    result = run_child(upstream, "26.0.0", [case], tmp_path / "child")["cases"]["cog"]
    assert result.get("processor") == "CogVideoXProcessor", result
    for path, (frames, fps) in clips.items():
        upstream_passes = result["outcomes"][path] == "passed"
        plan = plan_clip(frames, fps, 48, 64, ClipLimits.model_validate(lim.model_dump()))
        assert upstream_passes == isinstance(plan, ClipPlan), (frames, fps, result["outcomes"][path], plan)


# the extraction loaders of the rendered jobs (wan2.1, hunyuanvideo, stepvideo) and the other branches
LOADERS = {
    "grouped": {
        "sampler_type": "LengthGroupedSampler",
        "shuffle": True,
        "drop_last": True,
        "group_data": True,
    },
    "sequential_drop": {"sampler_type": "SequentialSampler", "shuffle": False, "drop_last": True},
    "sequential_keep": {"sampler_type": "SequentialSampler", "shuffle": False, "drop_last": False},
    "stateful": {"sampler_type": "stateful_distributed_sampler", "shuffle": False, "drop_last": False},
}
SPLITS = [(n, world, mbs) for n in (4, 5, 7, 9, 12) for world in (2, 4) for mbs in (1, 2) if n >= world]


@pytest.mark.parametrize("version", VERSIONS)
def test_extraction_split_is_what_mindspeed_mms_samplers_do(
    upstream: Path, version: str, tmp_path: Path
) -> None:
    _tree(upstream, version)
    cases = [
        {
            "name": f"{name}-{n}-{w}-{m}",
            "kind": "sampler",
            "samples": n,
            "world": w,
            "mbs": m,
            "loader": loader,
        }
        for name, loader in LOADERS.items()
        for n, w, m in SPLITS
    ]
    result = run_child(upstream, version, cases, tmp_path / "child")["cases"]
    for case in cases:
        ranks = result[case["name"]].get("ranks")
        assert ranks is not None, result[case["name"]]
        taken = [i for steps in ranks for step in steps for i in step]
        repeated = {i for i in taken if taken.count(i) > 1}
        missing = set(range(case["samples"])) - set(taken)
        said = extraction_split(case["samples"], case["world"], case["mbs"], case["loader"])
        where = (case["name"], ranks, said)
        if said is None:
            assert not repeated and not missing, where
        elif said.code == "samples_dropped":
            assert missing and not repeated, where
            assert f"drops the last {len(missing)}" in said.reason, where
        elif said.code == "uneven_split":
            assert repeated or missing, where
        else:
            assert said.code == "duplicate_writes" and repeated and not missing, where
            # "in the same step": two ranks take a repeated sample in one step, so their writes of its file overlap
            same_step = {
                i
                for s in range(max(len(r) for r in ranks))
                for a, b in itertools.combinations([r[s] for r in ranks if s < len(r)], 2)
                for i in set(a) & set(b)
            }
            assert same_step or "in the same step" not in said.reason, where


def test_report_rows_cover_every_registered_model(upstream: Path) -> None:
    cells = dataset_readers.rows(upstream)
    reg = get_registry()
    wanted = {(m, v) for m, e in reg.models.items() for v in VERSIONS if e.versions.contains(v)}
    assert set(cells) == wanted
    assert all(c.ok is not False for c in cells.values()), {k: c for k, c in cells.items() if c.ok is False}
    assert cells[("cogvideox", "26.0.0")].text == "3/3 jobs read"
