"""The patch size the estimator divides latents by is the one MindSpeed-MM's stock model config builds.

shapes.yaml `patch` / `patch_by_size` cite the stock model config (`patch_from` / `from`, under MindSpeed-MM/<version>/)
whose `predictor` section gives it. At test time, for every registry version whose tree is under `$MM_UPSTREAM` and
that has the model: each cited config is read and its predictor patch compared with the entry, and every predictor
patch in the model's example folder must be one the entry cites, so a size trained with another patch (CogVideoX
1.5's [2, 2, 2]) cannot hide behind the model-wide value. Models whose example folder has no predictor patch (the
diffusers/DiffSynth examples, which read the Hugging Face config; LTX-2; Lumina-mGPT; the VAE) keep the value
their `source` names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mm_agent.estimate import EstimateRequest, estimate_resources
from mm_agent.estimate.model import ShapeData, load_shapes, model_shape
from mm_agent.registry import get_registry

PATCH_KEYS = ("patch_size_thw", "patch_size", "patch_size_t")
# shapes.yaml kinds whose tokens go through a patch (a VLM's ViT patch is tokens.py's)
PATCHED = {m: d for m, d in load_shapes().models.items() if d.kind in ("video", "image")}


def predictor_patch(section: dict[str, Any]) -> tuple[int, int, int] | None:
    """The [t, h, w] patch a predictor section builds: `patch_size_thw`; a 3-list `patch_size`; an int
    `patch_size` (spatial) with `patch_size_t` (temporal, absent or null = 1)."""
    thw = section.get("patch_size_thw")
    if isinstance(thw, list) and len(thw) == 3:
        return (int(thw[0]), int(thw[1]), int(thw[2]))
    size = section.get("patch_size")
    if isinstance(size, list) and len(size) == 3:
        return (int(size[0]), int(size[1]), int(size[2]))
    if isinstance(size, int) and not isinstance(size, bool):
        return (int(section.get("patch_size_t") or 1), size, size)
    return None


def _predictors(node: Any) -> Iterator[dict[str, Any]]:
    """Every `predictor` section of a parsed config (the DiT MindSpeed-MM builds), at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "predictor" and isinstance(value, dict):
                yield value
            yield from _predictors(value)
    elif isinstance(node, list):
        for item in node:
            yield from _predictors(item)


def _load(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def config_patch(path: Path) -> set[tuple[int, int, int]]:
    """The predictor patches one stock config gives."""
    return {p for section in _predictors(_load(path)) if (p := predictor_patch(section)) is not None}


def folder_patches(folder: Path) -> dict[tuple[int, int, int], list[str]]:
    """Every predictor patch in a model's example folder -> the configs that build it (a file that does not
    parse, such as a json with comments MindSpeed-MM never loads, is skipped)."""
    found: dict[tuple[int, int, int], list[str]] = {}
    for path in sorted(folder.rglob("*")):
        if path.suffix not in (".json", ".yaml", ".yml") or not path.is_file():
            continue
        try:
            patches = config_patch(path)
        except (ValueError, yaml.YAMLError):
            continue
        for patch in patches:
            found.setdefault(patch, []).append(path.relative_to(folder).as_posix())
    return found


def cited(data: ShapeData) -> dict[str | None, tuple[tuple[int, int, int], str | None]]:
    """size (None = model-wide) -> (patch, cited config) of one shapes.yaml entry."""
    out: dict[str | None, tuple[tuple[int, int, int], str | None]] = {
        None: ((data.patch[0], data.patch[1], data.patch[2]), data.patch_from)
    }
    for size, item in data.patch_by_size.items():
        out[size] = ((item.patch[0], item.patch[1], item.patch[2]), item.origin)
    return out


def _trees() -> list[tuple[str, Path]]:
    """(registry version, MindSpeed-MM tree) for every release version under $MM_UPSTREAM."""
    root = os.environ.get("MM_UPSTREAM")
    if not root:
        pytest.skip(
            "MM_UPSTREAM is not set: point it at a folder holding MindSpeed-MM/v<version>/ to read patches"
        )
    base = Path(root).expanduser() / "MindSpeed-MM"
    found = [(v, base / f"v{v}") for v in get_registry().versions.ids if (base / f"v{v}").is_dir()]
    if not found:
        pytest.skip(f"no MindSpeed-MM release tree under {base}")
    return found


@pytest.fixture(scope="module")
def trees() -> list[tuple[str, Path]]:
    return _trees()


@pytest.mark.parametrize("model", sorted(PATCHED))
def test_patch_matches_the_stock_model_config(model: str, trees: list[tuple[str, Path]]) -> None:
    data = PATCHED[model]
    entry = get_registry().get(model)
    want = cited(data)
    checked = 0
    for version, tree in trees:
        if not entry.versions.contains(version):
            continue
        folder = tree / entry.example_dir
        in_folder = folder_patches(folder) if folder.is_dir() else {}
        uncited = {p: files for p, files in in_folder.items() if p not in {w for w, _ in want.values()}}
        assert not uncited, (
            f"shapes.yaml {model}: MindSpeed-MM {version}'s {entry.example_dir} builds predictor patches "
            f"{uncited} that no patch / patch_by_size entry cites (estimated with {data.patch})"
        )
        if in_folder:
            assert data.patch_from, (
                f"shapes.yaml {model}: {entry.example_dir} at {version} has a predictor patch; cite the config "
                "as patch_from"
            )
        for size, (patch, origin) in want.items():
            if origin is None:
                continue
            path = tree / origin
            assert path.is_file(), (
                f"shapes.yaml {model} {size or ''}: {origin} is not in MindSpeed-MM {version}"
            )
            assert config_patch(path) == {patch}, (
                f"shapes.yaml {model} {size or ''}: patch {list(patch)}, {origin} at {version} builds "
                f"{sorted(config_patch(path))}"
            )
            checked += 1
    # without patch_from the check above is the claim: no release's example folder builds a predictor patch
    assert checked or data.patch_from is None, f"{model}: no release tree with the model under $MM_UPSTREAM"


@pytest.mark.parametrize("model", sorted(PATCHED))
def test_estimator_uses_each_sizes_patch(model: str) -> None:
    """model_shape gives every registry size the patch shapes.yaml cites for it (its own, else the model's)."""
    entry = get_registry().get(model)
    data = PATCHED[model]
    for size in entry.sizes:
        item = data.patch_by_size.get(size.id)
        want = tuple(item.patch if item is not None else data.patch)
        assert model_shape(entry, size).patch == want, f"{model} {size.id}"


def test_cogvideox_15_tokens_use_its_temporal_patch() -> None:
    """CogVideoX 1.5 at its stock 37x480x720: latents 10 x 60 x 90, patch 2x2x2 -> 5 x 30 x 45 = 6,750 tokens
    (1.0's 1x2x2 patch at its 17x480x720: 5 x 30 x 45 = 6,750 as well)."""
    assert estimate_resources(EstimateRequest(model="cogvideox", size="1.5")).seq_tokens == 5 * 30 * 45
    assert estimate_resources(EstimateRequest(model="cogvideox", size="1.0")).seq_tokens == 5 * 30 * 45
