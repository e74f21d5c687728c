"""The default input shape of each model is the one MindSpeed-MM's stock example trains on.

shapes.yaml `stock_shape` (and `stock_shape_by_size`) cite the stock data config under MindSpeed-MM/v26.0.0/;
the file is read at test time from `$MM_UPSTREAM` and its frame count and resolution compared with the entry, so
a wrong transcription or a path that moved fails here. The rest needs no upstream tree: the estimator takes each
stock shape (frames 4n+1, sizes a multiple of stride x patch) and reports it when the request leaves it out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from upstream_tree import mindspeed_mm_tree

from mm_agent.errors import MMAgentError
from mm_agent.estimate import EstimateRequest, estimate_resources
from mm_agent.estimate.model import ShapeData, StockShape, load_shapes
from mm_agent.estimate.tokens import DEFAULT_SHAPE
from mm_agent.registry import get_registry

# data-config keys per dimension: MindSpeed-MM's preprocess_parameters (num_frames, max_height/max_width), the
# VAE dataset (resolution), Lumina's item processor (target_size: a square side)
KEYS = {
    "frames": {"num_frames"},
    "height": {"max_height", "height", "resolution", "target_size"},
    "width": {"max_width", "width", "resolution", "target_size"},
}
SCRIPT_RESOLUTION = re.compile(r"^resolution=(\d+)\s*$", re.MULTILINE)  # diffusers launch scripts' default


def _stock_entries() -> list[tuple[str, str | None, StockShape]]:
    """(model, size or None for the model-wide shape, shape) for every stock shape in shapes.yaml."""
    found: list[tuple[str, str | None, StockShape]] = []
    for model, data in load_shapes().models.items():
        if data.stock_shape is not None:
            found.append((model, None, data.stock_shape))
        found += [(model, size, shape) for size, shape in data.stock_shape_by_size.items()]
    return found


ENTRIES = _stock_entries()
IDS = [f"{model}[{size}]" if size else model for model, size, _ in ENTRIES]


def _values(node: object, keys: set[str]) -> set[int]:
    """Every integer under one of `keys`, anywhere in a parsed JSON/YAML document."""
    found: set[int] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key in keys and isinstance(value, int) and not isinstance(value, bool):
                found.add(value)
            found |= _values(value, keys)
    elif isinstance(node, list):
        for item in node:
            found |= _values(item, keys)
    return found


def upstream_shape(path: Path, kind: str) -> dict[str, set[int]]:
    """What the stock file says for frames, height and width (each the set of values found; an image model
    without a frame key is one frame)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".sh":
        side = {int(v) for v in SCRIPT_RESOLUTION.findall(text)}
        return {"frames": {1}, "height": side, "width": side}
    doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    said = {dim: _values(doc, keys) for dim, keys in KEYS.items()}
    if kind == "image" and not said["frames"]:
        said["frames"] = {1}
    return said


@pytest.fixture(scope="module")
def upstream() -> Path:
    return mindspeed_mm_tree("v26.0.0", "check stock shapes against upstream")


def test_every_video_family_has_stock_shapes() -> None:
    assert len(ENTRIES) >= 10, f"stock shapes in shapes.yaml: {IDS}"


@pytest.mark.parametrize(("model", "size", "stock"), ENTRIES, ids=IDS)
def test_stock_shape_matches_upstream(
    model: str, size: str | None, stock: StockShape, upstream: Path
) -> None:
    path = upstream / stock.origin
    assert path.is_file(), f"shapes.yaml {model}: stock shape cites {stock.origin}, not in {upstream}"
    said = upstream_shape(path, load_shapes().models[model].kind)
    for dim in ("frames", "height", "width"):
        want = getattr(stock, dim)
        assert said[dim] == {want}, (
            f"shapes.yaml {model} {size or ''} {dim}: {want}, {path} says {sorted(said[dim])}"
        )


@pytest.mark.parametrize(("model", "size", "stock"), ENTRIES, ids=IDS)
def test_estimate_defaults_to_the_stock_shape(model: str, size: str | None, stock: StockShape) -> None:
    """Each stock shape is one the estimator takes, and a request without a shape is estimated at it."""
    entry = get_registry().get(model)
    assert size is None or entry.size(size) is not None, f"shapes.yaml {model}: no registry size {size}"
    if size is None and load_shapes().models[model].stock_for(entry.sizes[0].id) != stock:
        pytest.skip(f"{model}'s first size {entry.sizes[0].id} has its own stock shape")
    result = estimate_resources(EstimateRequest(model=model, size=size))
    assert (result.frames, result.height, result.width) == (stock.frames, stock.height, stock.width)


def test_explicit_shape_wins_over_the_stock_one() -> None:
    result = estimate_resources(EstimateRequest(model="cogvideox", size="1.5", frames=81))
    assert (result.frames, result.height, result.width) == (81, 480, 720)
    result = estimate_resources(
        EstimateRequest(model="cogvideox", size="1.5", frames=49, height=768, width=1360)
    )
    assert (result.frames, result.height, result.width) == (49, 768, 1360)


def test_a_model_without_stock_shape_keeps_the_default() -> None:
    assert load_shapes().models["opensora2.0"].stock_shape is None
    result = estimate_resources(EstimateRequest(model="opensora2.0"))
    assert (result.frames, result.height, result.width) == DEFAULT_SHAPE["video"]


def test_a_chunked_vae_counts_its_latents() -> None:
    """Step-Video's VAE (MindSpeed-MM stepvideo_vae.py: frame_len 17, latent_len 3) turns the stock 136 frames
    into 8 chunks of 3 latents; 544x992 through 16x16 -> 34 x 62 patches."""
    result = estimate_resources(EstimateRequest(model="stepvideo"))
    assert (result.frames, result.seq_tokens) == (136, 24 * 34 * 62)
    with pytest.raises(MMAgentError) as err:
        estimate_resources(EstimateRequest(model="stepvideo", frames=129))
    assert err.value.field == "frames" and err.value.fix == "use 119 or 136"


def test_sizes_with_their_own_stock_shape() -> None:
    data = load_shapes().models["cogvideox"]
    assert data.stock_for("1.0") == data.stock_shape
    assert data.stock_for("1.5") == data.stock_shape_by_size["1.5"] != data.stock_shape


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (
            {
                "kind": "vlm",
                "stock_shape": {"frames": 1, "height": 448, "width": 448, "from": "examples/x.json"},
            },
            "vlm",
        ),
        (
            {
                "kind": "image",
                "stock_shape": {"frames": 5, "height": 512, "width": 512, "from": "examples/x.json"},
            },
            "1",
        ),
        ({"kind": "video", "stock_shape": {"frames": 17, "height": 480, "width": 832}}, "from"),
    ],
)
def test_shape_schema_rejects_bad_stock_shapes(entry: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ShapeData.model_validate({**entry, "source": "a test entry"})
