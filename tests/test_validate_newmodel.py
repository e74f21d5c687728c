"""New-model development's failure modes as validator rules (`newmodel.*`), judged on MindSpeed-MM's own guide.

The inputs are the guide's code (docs/zh/pytorch/new_model_development.md at 26.1.0: CustomDiT, CustomModel,
model.json, fsdp2_config.yaml) written into a copy of the real checkout's predictor package
(`mindspeed_mm/models/predictor/`: predict_model.py with its PREDICTOR_MODEL_MAPPINGS, and dits/) under
MM_UPSTREAM, as a person following the guide lays them out. Each rule fires on the bad input and says nothing
on the good one; the stock examples of the real trees draw no new-model finding beyond the one real stale key
of v26.0.0 (CogVideoX's `norm_out_eps`, which SatDiT's **kwargs swallows).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mm_agent.diagnose import diagnose_text
from mm_agent.validate import Finding, ValidateRequest, validate_configs
from mm_agent.validate.pysource import Checkout
from tests.upstream_tree import mindspeed_mm_tree

GUIDE = "docs/zh/pytorch/new_model_development.md"
PREDICTOR = "mindspeed_mm/models/predictor"
# The other files of the checkout that building and sharding a predictor runs (tests/newmodel_child.py).
RUN_FILES = (
    "mindspeed_mm/configs/config.py",
    "mindspeed_mm/models/common/module.py",
    "mindspeed_mm/models/common/checkpoint.py",
    "mindspeed_mm/models/transformers/base_model.py",
    "mindspeed_mm/models/transformers/global_vars.py",
)
JOB = "examples/custom_model"


def _blocks(tree: Path) -> dict[str, str]:
    """The guide's code blocks, by what they define."""
    text = (tree / GUIDE).read_text(encoding="utf-8")
    found: dict[str, str] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", text, flags=re.DOTALL):
        if "class CustomDiT(" in body:
            found["dit"] = body
        elif "class CustomModel(" in body:
            found["model_py"] = body
        elif lang == "json" and '"predictor"' in body:
            found["model_json"] = body
        elif lang == "yaml" and "sub_modules_to_wrap" in body:
            found["fsdp2"] = body
    assert set(found) == {"dit", "model_py", "model_json", "fsdp2"}, (
        f"the guide changed: found {sorted(found)}"
    )
    return found


@pytest.fixture(scope="module")
def guide_tree() -> Path:
    return mindspeed_mm_tree("v26.1.0", "check the new-model rules against MindSpeed-MM's own guide")


class Checkout_:
    """A MindSpeed-MM checkout in tmp: the real predictor package plus the guide's files, registered or not."""

    def __init__(self, tmp: Path, tree: Path, *, register: bool = True, dit: str | None = None) -> None:
        self.root = tmp / "MindSpeed-MM"
        self.blocks = _blocks(tree)
        shutil.copytree(tree / PREDICTOR, self.root / PREDICTOR)
        for name in RUN_FILES:
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / name, self.root / name)
        (self.root / "mindspeed_mm/models/predictor/dits/custom_dit.py").write_text(
            dit if dit is not None else self.blocks["dit"], encoding="utf-8"
        )
        (self.root / "mindspeed_mm/models/custom_model.py").write_text(
            self.blocks["model_py"], encoding="utf-8"
        )
        if register:
            predict = self.root / PREDICTOR / "predict_model.py"
            text = predict.read_text(encoding="utf-8")
            assert "PREDICTOR_MODEL_MAPPINGS = {\n" in text
            text = "from .dits.custom_dit import CustomDiT\n" + text.replace(
                "PREDICTOR_MODEL_MAPPINGS = {\n",
                'PREDICTOR_MODEL_MAPPINGS = {\n    "custom_dit": CustomDiT,\n',
            )
            predict.write_text(text, encoding="utf-8")
        self.job = self.root / JOB
        self.job.mkdir(parents=True)
        self.model = json.loads(self.blocks["model_json"])
        self.fsdp2 = yaml.safe_load(self.blocks["fsdp2"])

    def validate(self, *, mm_root: bool = True) -> list[Finding]:
        (self.job / "model.json").write_text(json.dumps(self.model, indent=4), encoding="utf-8")
        (self.job / "fsdp2_config.yaml").write_text(
            yaml.safe_dump(self.fsdp2, sort_keys=False), encoding="utf-8"
        )
        req = ValidateRequest(paths=[str(self.job)], mm_root=str(self.root) if mm_root else None)
        report = validate_configs(req)
        return [f for f in report.findings if f.rule.startswith("newmodel.") or f.rule == "validator.crash"]


def _rules(findings: list[Finding]) -> list[tuple[str, str, str | None]]:
    return [(f.severity, f.rule, f.field) for f in findings]


def _good(checkout: Checkout_) -> None:
    """The guide's configs minus its one slip (`predictor.head`, which CustomDiT does not have)."""
    checkout.fsdp2["sub_modules_to_wrap"] = ["predictor.blocks.{*}"]


# --- 1. a model_id missing from PREDICTOR_MODEL_MAPPINGS -------------------------------------------------------


def test_unregistered_dit_is_an_error_naming_the_registered_ones_and_the_two_lines(
    tmp_path: Path, guide_tree: Path
) -> None:
    checkout = Checkout_(tmp_path, guide_tree, register=False)
    _good(checkout)
    findings = checkout.validate()
    assert _rules(findings) == [("error", "newmodel.predictor_unregistered", "predictor.model_id")]
    (finding,) = findings
    assert "'custom_dit'" in finding.message and "KeyError" in finding.message
    for stock in ("wandit", "hunyuanvideo15dit", "vace"):  # the keys of v26.1.0's mapping, read from the file
        assert stock in finding.message
    assert "from .dits.custom_dit import CustomDiT" in finding.fix
    assert '"custom_dit": CustomDiT,' in finding.fix
    assert "mm-agent new-model custom_dit --checkout" in finding.fix
    lines = (checkout.job / "model.json").read_text(encoding="utf-8").splitlines()
    assert '"model_id": "custom_dit"' in lines[(finding.line or 0) - 1]


def test_registered_guide_dit_passes_every_rule(tmp_path: Path, guide_tree: Path) -> None:
    checkout = Checkout_(tmp_path, guide_tree)
    _good(checkout)
    assert checkout.validate() == []


def test_the_checkout_a_scaffolded_job_lies_in_is_found_without_mm_root(
    tmp_path: Path, guide_tree: Path
) -> None:
    checkout = Checkout_(tmp_path, guide_tree, register=False)
    _good(checkout)
    assert _rules(checkout.validate(mm_root=False)) == [
        ("error", "newmodel.predictor_unregistered", "predictor.model_id")
    ]


def test_a_mapping_built_from_another_dict_is_not_judged(tmp_path: Path, guide_tree: Path) -> None:
    """`{**OTHER, ...}`: a name missing from the literal may be registered elsewhere, so nothing is said."""
    checkout = Checkout_(tmp_path, guide_tree, register=False)
    _good(checkout)
    predict = checkout.root / PREDICTOR / "predict_model.py"
    text = predict.read_text(encoding="utf-8")
    predict.write_text(
        "EXTRA = {}\n"
        + text.replace("PREDICTOR_MODEL_MAPPINGS = {\n", "PREDICTOR_MODEL_MAPPINGS = {\n    **EXTRA,\n"),
        encoding="utf-8",
    )
    assert checkout.validate() == []


# --- 2. a predictor key the DiT's __init__ does not take ---------------------------------------------------------


def test_a_typo_swallowed_by_kwargs_is_a_warning_naming_the_parameter(
    tmp_path: Path, guide_tree: Path
) -> None:
    checkout = Checkout_(tmp_path, guide_tree)
    _good(checkout)
    checkout.model["predictor"]["num_layer"] = checkout.model["predictor"].pop("num_layers")
    findings = checkout.validate()
    assert _rules(findings) == [("warning", "newmodel.predictor_key_ignored", "predictor.num_layer")]
    assert (
        "CustomDiT.__init__" in findings[0].message and "num_layers keeps its default" in findings[0].message
    )
    assert "rename it to 'num_layers'" in findings[0].fix


def test_without_kwargs_every_foreign_key_is_an_error_model_id_included(
    tmp_path: Path, guide_tree: Path
) -> None:
    """PredictModel passes the whole block, model_id too: a DiT without **kwargs cannot be built at all."""
    dit = _blocks(guide_tree)["dit"]
    strict = dit.replace(
        "        rope_max_seq_len: int = 1024,\n        **kwargs\n", "        rope_max_seq_len: int = 1024,\n"
    )
    assert strict != dit
    checkout = Checkout_(tmp_path, guide_tree, dit=strict)
    _good(checkout)
    checkout.model["predictor"]["num_layer"] = 2
    findings = checkout.validate()
    assert _rules(findings) == [
        ("error", "newmodel.predictor_key_unknown", "predictor.model_id"),
        ("error", "newmodel.predictor_key_unknown", "predictor.num_layer"),
    ]
    assert (
        "TypeError: CustomDiT.__init__() got an unexpected keyword argument 'num_layer'"
        in findings[1].message
    )
    assert "**kwargs" in findings[0].fix


def test_a_parameter_without_default_must_be_set(tmp_path: Path, guide_tree: Path) -> None:
    dit = _blocks(guide_tree)["dit"]
    checkout = Checkout_(tmp_path, guide_tree, dit=dit.replace("num_layers: int = 40,", "num_layers: int,"))
    _good(checkout)
    assert checkout.validate() == []
    del checkout.model["predictor"]["num_layers"]
    assert _rules(checkout.validate()) == [("error", "newmodel.predictor_key_missing", "predictor")]


def test_a_key_read_elsewhere_in_the_checkout_is_not_called_ignored(tmp_path: Path, guide_tree: Path) -> None:
    """A key the DiT swallows may be read by other code (validate_args_patch reads predictor.use_fused_rmsnorm)."""
    checkout = Checkout_(tmp_path, guide_tree)
    _good(checkout)
    checkout.model["predictor"]["use_custom_thing"] = True
    assert _rules(checkout.validate()) == [
        ("warning", "newmodel.predictor_key_ignored", "predictor.use_custom_thing")
    ]
    (checkout.root / "mindspeed_mm/patch.py").write_text(
        "def patch(args):\n    return args.mm.model.predictor.use_custom_thing\n", encoding="utf-8"
    )
    assert checkout.validate() == []


# --- 3. an FSDP2 path naming a module the model lacks -----------------------------------------------------------


def test_the_guides_own_fsdp2_config_names_a_head_customdit_lacks(tmp_path: Path, guide_tree: Path) -> None:
    checkout = Checkout_(tmp_path, guide_tree)
    findings = checkout.validate()  # the guide's fsdp2_config.yaml as written
    assert _rules(findings) == [("warning", "newmodel.fsdp2_path_missing", "sub_modules_to_wrap[1]")]
    message = findings[0].message
    assert "'predictor.head'" in message and "Warning: Module not found at path 'predictor.head'" in message
    for module in ("blocks", "proj_out", "norm_out", "patch_embedding", "condition_embedder", "rope"):
        assert module in findings[0].fix


def test_a_wildcard_over_a_missing_list_is_an_error(tmp_path: Path, guide_tree: Path) -> None:
    checkout = Checkout_(tmp_path, guide_tree)
    _good(checkout)
    checkout.fsdp2["recompute_modules"] = ["predictor.block.{*}"]
    findings = checkout.validate()
    assert _rules(findings) == [("error", "newmodel.fsdp2_path_missing", "recompute_modules[0]")]
    assert "did you mean 'blocks'" in findings[0].message
    assert "Module at path 'predictor.block' is None or does not have length attribute" in findings[0].message


def test_a_top_level_name_the_model_lacks_is_a_warning(tmp_path: Path, guide_tree: Path) -> None:
    checkout = Checkout_(tmp_path, guide_tree)
    _good(checkout)
    checkout.fsdp2["ignored_modules"] = ["vae", "text_encoder"]
    assert _rules(checkout.validate()) == [("warning", "newmodel.fsdp2_path_missing", "ignored_modules[0]")]


def test_fsdp2_paths_of_an_unregistered_dit_are_not_guessed(tmp_path: Path, guide_tree: Path) -> None:
    checkout = Checkout_(tmp_path, guide_tree, register=False)
    assert [f.rule for f in checkout.validate()] == ["newmodel.predictor_unregistered"]


# --- the real trees: stock examples and the static reader ---------------------------------------------------------


@pytest.mark.parametrize("version", ["v26.0.0", "v26.1.0", "master-57069cd"])
def test_stock_examples_draw_no_new_model_finding(version: str) -> None:
    tree = mindspeed_mm_tree(version, "check that stock examples draw no new-model finding")
    found: list[tuple[str, str | None]] = []
    for example in ("wan2.1", "wan2.2", "hunyuanvideo_1.5", "vace", "cogvideox", "opensoraplan1.3"):
        if (tree / "examples" / example).is_dir():
            # no mm_root (that would run the checkout's parser too): the examples lie in the checkout they use
            report = validate_configs(ValidateRequest(paths=[str(tree / "examples" / example)]))
            found += [
                (f.rule, f.field)
                for f in report.findings
                if f.rule.startswith("newmodel.") or f.rule == "validator.crash"
            ]
    # v26.0.0's CogVideoX configs set norm_out_eps, which SatDiT.__init__ does not take and nothing reads
    expected = [("newmodel.predictor_key_ignored", "predictor.norm_out_eps")] if version == "v26.0.0" else []
    assert sorted(set(found)) == expected


def test_the_stock_wan_fsdp2_config_fits_wandit(guide_tree: Path) -> None:
    """examples/wan2.1/fsdp2_config.yaml names predictor.head: WanDiT has it (CustomDiT does not)."""
    checkout = Checkout(guide_tree, None)
    mapping = checkout.mapping()
    assert mapping is not None and mapping.complete
    assert set(mapping.entries) == {"hunyuanvideo15dit", "wandit", "vace"}
    wan = checkout.predictor_class("wandit", mapping)
    assert wan is not None and wan.file.name == "wan_dit.py"  # through dits/__init__.py's re-export
    names = checkout.attributes(wan)
    assert names is not None and {"blocks", "head"} <= names
    sig = checkout.init_signature(wan)
    assert sig is not None and sig.var_kw == "kwargs" and "num_layers" in sig.params


# --- what the run prints: MindSpeed-MM's own code builds the guide's DiT on CPU, and diagnose names the cause ----

CHILD = Path(__file__).with_name("newmodel_child.py")
TINY = {"num_layers": 2, "num_heads": 2, "head_dim": 16, "text_dim": 32, "freq_dim": 32, "ffn_dim": 64}


def _run(checkout: Checkout_, mode: str, *args: str) -> tuple[int, str]:
    """tests/newmodel_child.py over the checkout's model.json: PredictModel (and get_submodules_by_path)."""
    checkout.validate()  # writes model.json and fsdp2_config.yaml
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(checkout.root), str(checkout.job / "model.json"), mode, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=checkout.root,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _tiny(tmp: Path, tree: Path, **kwargs: Any) -> Checkout_:
    checkout = Checkout_(tmp, tree, **kwargs)
    _good(checkout)
    checkout.model["predictor"].update(TINY)
    return checkout


def test_run_of_the_registered_guide_dit_builds_and_shards(tmp_path: Path, guide_tree: Path) -> None:
    checkout = _tiny(tmp_path, guide_tree)
    assert checkout.validate() == []
    rc, out = _run(checkout, "paths", str(checkout.job / "fsdp2_config.yaml"))
    assert rc == 0, out
    assert "built CustomDiT 2" in out and "Warning: Module not found" not in out
    assert diagnose_text(out).root_cause is None


def test_run_of_an_unregistered_dit_is_diagnosed_as_unregistered(tmp_path: Path, guide_tree: Path) -> None:
    checkout = _tiny(tmp_path, guide_tree, register=False)
    assert [f.rule for f in checkout.validate()] == ["newmodel.predictor_unregistered"]
    rc, out = _run(checkout, "build")
    assert rc == 1 and "KeyError: 'custom_dit'" in out, out
    report = diagnose_text(out)
    assert report.root_cause is not None and report.root_cause.rule_id == "predictor_model_unregistered"
    assert any("KeyError: 'custom_dit'" in e.text for e in report.root_cause.evidence)


def test_run_of_a_dit_without_kwargs_is_diagnosed_as_a_key_it_does_not_take(
    tmp_path: Path, guide_tree: Path
) -> None:
    dit = _blocks(guide_tree)["dit"]
    strict = dit.replace(
        "        rope_max_seq_len: int = 1024,\n        **kwargs\n", "        rope_max_seq_len: int = 1024,\n"
    )
    checkout = _tiny(tmp_path, guide_tree, dit=strict)
    assert _rules(checkout.validate()) == [("error", "newmodel.predictor_key_unknown", "predictor.model_id")]
    rc, out = _run(checkout, "build")
    assert rc == 1 and "got an unexpected keyword argument 'model_id'" in out, out
    report = diagnose_text(out)
    assert report.root_cause is not None and report.root_cause.rule_id == "model_init_unexpected_key"
    assert report.root_cause.title == "CustomDiT.__init__() does not take the config key model_id"
    assert "predictor_build_failed" in {f.rule_id for f in report.findings}


def test_run_with_a_key_typo_trains_the_default_depth(tmp_path: Path, guide_tree: Path) -> None:
    """What the warning says happens: CustomDiT's **kwargs swallows num_layer and builds its default 40 blocks."""
    checkout = _tiny(tmp_path, guide_tree)
    checkout.model["predictor"]["num_layer"] = checkout.model["predictor"].pop("num_layers")
    assert _rules(checkout.validate()) == [
        ("warning", "newmodel.predictor_key_ignored", "predictor.num_layer")
    ]
    rc, out = _run(checkout, "build")
    assert rc == 0 and "built CustomDiT 40" in out, out


def test_run_of_the_guides_fsdp2_config_prints_the_warning_the_validator_gave(
    tmp_path: Path, guide_tree: Path
) -> None:
    checkout = _tiny(tmp_path, guide_tree)
    checkout.fsdp2 = yaml.safe_load(_blocks(guide_tree)["fsdp2"])  # as the guide writes it: predictor.head
    assert [f.rule for f in checkout.validate()] == ["newmodel.fsdp2_path_missing"]
    rc, out = _run(checkout, "paths", str(checkout.job / "fsdp2_config.yaml"))
    assert rc == 0 and "Warning: Module not found at path 'predictor.head'" in out, out
    findings = {f.rule_id: f for f in diagnose_text(out).findings}
    assert set(findings) == {"fsdp2_module_path_missing"}
    assert findings["fsdp2_module_path_missing"].title.endswith("predictor.head")
    checkout.fsdp2["recompute_modules"] = ["predictor.blokcs.{*}"]
    assert _rules(checkout.validate())[-1] == ("error", "newmodel.fsdp2_path_missing", "recompute_modules[0]")
    rc, out = _run(checkout, "paths", str(checkout.job / "fsdp2_config.yaml"))
    assert rc == 1 and "Module at path 'predictor.blokcs' is None" in out, out
    report = diagnose_text(out)
    assert report.root_cause is not None and report.root_cause.rule_id == "fsdp2_module_not_found"


def test_run_loading_a_checkpoint_of_other_dimensions_is_a_shape_mismatch(
    tmp_path: Path, guide_tree: Path
) -> None:
    """PredictModel's from_pretrained goes through checkpoint.py load_checkpoint (strict=False): shapes still stop it."""
    checkout = _tiny(tmp_path, guide_tree)
    saved = tmp_path / "custom_dit.pt"
    rc, out = _run(checkout, "save", str(saved))
    assert rc == 0 and saved.is_file(), out
    checkout.model["predictor"].update(head_dim=8, from_pretrained=str(saved))
    assert checkout.validate() == []  # from_pretrained is PredictModel's own key, not the DiT's
    rc, out = _run(checkout, "build")
    assert rc == 1 and "size mismatch for" in out, out
    report = diagnose_text(out)
    assert report.root_cause is not None and report.root_cause.rule_id == "ckpt_shape_mismatch"


# --- the static reader on source written here (runs everywhere) ----------------------------------------------------

READER_SOURCE = """
from torch import nn
from diffusers import WanTransformer3DModel
from .base import Base as Renamed

class Plain(nn.Module):
    def __init__(self, depth: int, width=8, *, eps=1e-6, **kwargs):
        super().__init__()
        self.blocks = nn.ModuleList()
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, width)
        self.add_module("extra", nn.Identity())
        self.scale = kwargs.get("scale", 1.0)
        if "shift" in kwargs:
            self.shift = kwargs["shift"]

class HandsOn(nn.Module):
    def __init__(self, **kw):
        super().__init__(**kw)

class Computed(nn.Module):
    def __init__(self, names):
        super().__init__()
        for name in names:
            setattr(self, name, nn.Identity())

class FromDiffusers(WanTransformer3DModel):
    pass

class Child(Renamed):
    def __init__(self):
        super().__init__(depth=2)
        self.own = nn.Identity()
"""


def test_the_reader_follows_what_it_can_and_gives_up_on_what_it_cannot(tmp_path: Path) -> None:
    pkg = tmp_path / "mindspeed_mm/models/predictor/dits"
    pkg.mkdir(parents=True)
    (pkg / "mods.py").write_text(READER_SOURCE, encoding="utf-8")
    (pkg / "base.py").write_text(
        READER_SOURCE.replace("from .base import Base as Renamed\n", "").replace("class Plain", "class Base"),
        encoding="utf-8",
    )
    checkout = Checkout(tmp_path, None)
    mods = pkg / "mods.py"

    def cls(name: str) -> Any:
        found = checkout.find_class(name, mods)
        assert found is not None, name
        return found

    plain = checkout.init_signature(cls("Plain"))
    assert plain is not None
    assert (plain.params, plain.required, plain.var_kw) == (["depth", "width", "eps"], ["depth"], "kwargs")
    assert plain.kwargs_read == {"scale", "shift"} and not plain.kwargs_opaque
    assert checkout.attributes(cls("Plain")) >= {"blocks", "norm", "head", "extra", "scale", "shift"}
    hands_on = checkout.init_signature(cls("HandsOn"))
    assert hands_on is not None and hands_on.kwargs_opaque  # where its keys go is not known
    assert checkout.attributes(cls("Computed")) is None  # setattr(self, name, ...)
    assert checkout.attributes(cls("FromDiffusers")) is None  # a base from outside that has modules
    child = cls("Child")  # a base imported under another name, from another file of the checkout
    inherited = checkout.attributes(child)
    assert inherited is not None and {"own", "blocks", "head"} <= inherited
    own = checkout.init_signature(child)
    assert own is not None and own.params == [] and own.cls.name == "Child"
