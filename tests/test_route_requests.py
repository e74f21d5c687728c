"""Requests read right (issue 14, item 3): node x NPU counts in English and Chinese, chip names as hardware,
one meaning of each count in the core request, the MCP arguments and the CLI flags, and plain statements for
unknown models and impossible tasks. Every case runs through route_model AND `mm-agent route ... --json`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from mm_agent.cli import build_parser, main
from mm_agent.errors import MMAgentError
from mm_agent.jobspec import bundled_refusal
from mm_agent.registry import get_registry
from mm_agent.registry.hardware import HARDWARE_FILE, load_hardware, load_hardware_file
from mm_agent.route import RouteRequest, RouteResult, load_vocabulary, route_model


def cli(capsys: pytest.CaptureFixture[str], text: str, *flags: str) -> dict[str, Any]:
    code = main(["route", text, *flags, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    data: dict[str, Any] = json.loads(out)
    return data


def both(capsys: pytest.CaptureFixture[str], text: str, *flags: str, **hints: Any) -> list[dict[str, Any]]:
    """The core result and the CLI's JSON for the same request, as plain dicts; they must be equal."""
    core = route_model(RouteRequest(request=text, **hints)).model_dump(mode="json")
    shown = cli(capsys, text, *flags)
    assert shown == core
    return [core]


# (request, parsed total NPUs, parsed NPUs per node, parsed nodes, launch NPUs per node, launch nodes)
COUNTS = [
    ("fine-tune Wan2.1 text-to-video on 2 nodes × 8", 16, 8, 2, 8, 2),
    ("fine-tune Wan2.1 text-to-video on 2 nodes with 8 NPUs each", 16, 8, 2, 8, 2),
    ("wan2.1 文生视频 2台机器每台8卡", 16, 8, 2, 8, 2),
    ("wan2.1 文生视频，两台机器，每台8张卡", 16, 8, 2, 8, 2),
    ("wan2.1 t2v 2机16卡", 16, 8, 2, 8, 2),
    ("wan2.1 t2v 2x8 NPUs", 16, 8, 2, 8, 2),
    ("wan2.1 t2v with 4 NPUs x 2 nodes", 8, 4, 2, 4, 2),
    ("wan2.1 t2v on 4 nodes, each with 8 NPUs", 32, 8, 4, 8, 4),
    ("wan2.1 t2v 单机8卡", 8, 8, 1, 8, 1),
    ("wan2.1 t2v 16卡", 16, None, None, 8, 2),
    ("wan2.1 t2v on 16 Ascend NPUs", 16, None, None, 8, 2),
    ("fine-tune Wan2.1 t2v on 8 Ascend 910B NPUs", 8, None, None, 8, 1),
    ("wan2.1 t2v on 4 NPUs", 4, None, None, 4, 1),
    ("wan2.1 t2v 8 NPUs per node", None, 8, None, 8, 1),
    ("wan2.1 t2v", None, None, None, 8, 1),
]


@pytest.mark.parametrize(("text", "total", "per", "nodes", "launch_per", "launch_nodes"), COUNTS)
def test_counts_in_english_and_chinese(
    capsys: pytest.CaptureFixture[str],
    text: str,
    total: int | None,
    per: int | None,
    nodes: int | None,
    launch_per: int,
    launch_nodes: int,
) -> None:
    (r,) = both(capsys, text)
    assert (r["parsed"]["npus"], r["parsed"]["npus_per_node"], r["parsed"]["nodes"]) == (total, per, nodes)
    top = r["candidates"][0]
    assert (top["model_id"], top["task"]) == ("wan2.1", "t2v")
    assert (top["npus_per_node"], top["nnodes"]) == (launch_per, launch_nodes)
    # the README's launch line (the stock script sets its own layout), with the layout asked for beside it
    training = next(s for s in top["pipeline"] if s["stage"] == "training")
    assert training["commands"][0].startswith("bash examples/wan2.1/")
    assert any(f"NPUS_PER_NODE={launch_per}, NNODES={launch_nodes}" in n for n in training["notes"])
    assert r["parsed"]["sizes"] == [] and "no size" not in top["explanation"]


# (request, hardware name reported) -- never a model size, never a count
CHIPS = [
    ("qwen2.5vl sft on 8 Ascend 910B NPUs", "Ascend 910B"),
    ("qwen2.5vl sft on 8 910B3 cards", "Ascend 910B"),
    ("qwen2.5vl sft on 8 Ascend 910C NPUs", "Ascend 910C"),
    ("qwen2.5vl sft on 8 Ascend 910 NPUs", "Ascend 910"),
    ("qwen2.5vl sft on 8 NPUs of an Atlas 800T A2", "Atlas 800T A2"),
    ("qwen2.5vl sft on 8 A2 NPUs", "Atlas 800T A2"),
    ("qwen2.5vl sft on 8 A3 NPUs", "Atlas A3"),
    ("qwen2.5vl 多模态理解微调 昇腾910B 8卡", "Ascend 910B"),
]


@pytest.mark.parametrize(("text", "hardware"), CHIPS)
def test_chip_names_are_hardware_not_sizes(
    capsys: pytest.CaptureFixture[str], text: str, hardware: str
) -> None:
    (r,) = both(capsys, text)
    assert hardware in r["parsed"]["hardware"]
    assert r["parsed"]["sizes"] == [] and r["parsed"]["npus"] == 8
    top = r["candidates"][0]
    assert (top["model_id"], top["task"], top["npus_per_node"], top["nnodes"]) == ("qwen2.5vl", "sft", 8, 1)
    assert "no size" not in top["explanation"] and r["question"] is None


def test_a_real_size_still_reads_beside_a_chip() -> None:
    r = route_model(RouteRequest(request="Qwen2.5-VL 7B sft on 16 Ascend 910B NPUs"))
    top = r.candidates[0]
    assert r.parsed.sizes == ["7b"] and top.size == "7b" and r.parsed.hardware == ["Ascend 910B"]
    assert (top.npus_per_node, top.nnodes) == (8, 2)


def test_npus_is_the_total_in_core_schema_and_cli(capsys: pytest.CaptureFixture[str]) -> None:
    props = RouteRequest.model_json_schema()["properties"]
    assert "TOTAL" in props["npus"]["description"] and "request" in props and "text" not in props
    assert {"npus_per_node", "nnodes"} <= set(props)
    for flags, hints in [
        (("--npus", "16"), {"npus": 16}),
        (("--npus-per-node", "8", "--nnodes", "2"), {"npus_per_node": 8, "nnodes": 2}),
        (("--npus", "16", "--nnodes", "2"), {"npus": 16, "nnodes": 2}),
        (("--nodes", "2"), {"nnodes": 2}),
    ]:
        (r,) = both(capsys, "qwen2.5vl sft", *flags, **hints)
        top = r["candidates"][0]
        assert (top["npus_per_node"], top["nnodes"]) == (8, 2), flags
    # a hint wins over the text; the text fills what the hints leave open
    r2 = route_model(RouteRequest(request="qwen2.5vl sft on 8 NPUs", npus=16))
    assert (r2.parsed.npus, r2.candidates[0].npus_per_node, r2.candidates[0].nnodes) == (16, 8, 2)
    r3 = route_model(RouteRequest(request="qwen2.5vl sft with 4 NPUs each", nnodes=2))
    assert (r3.parsed.npus, r3.candidates[0].npus_per_node, r3.candidates[0].nnodes) == (8, 4, 2)
    # the old spellings of the request model still validate (callers that predate the flat arguments)
    assert RouteRequest.model_validate({"text": "wan2.1", "nodes": 2}) == RouteRequest(
        request="wan2.1", nnodes=2
    )


@pytest.mark.parametrize(
    ("hints", "flags"),
    [
        ({"npus": 12, "npus_per_node": 8}, ("--npus", "12", "--npus-per-node", "8")),
        (
            {"npus": 8, "npus_per_node": 8, "nnodes": 2},
            ("--npus", "8", "--npus-per-node", "8", "--nnodes", "2"),
        ),
        ({"npus": 9, "nnodes": 2}, ("--npus", "9", "--nnodes", "2")),
    ],
)
def test_contradicting_counts_are_an_error_with_the_fix(
    capsys: pytest.CaptureFixture[str], hints: dict[str, int], flags: tuple[str, ...]
) -> None:
    with pytest.raises(MMAgentError) as err:
        route_model(RouteRequest(request="qwen2.5vl sft", **hints))
    assert err.value.field == "npus" and "total" in str(err.value) and err.value.fix
    assert main(["route", "qwen2.5vl sft", *flags, "--json"]) == 2
    assert "fix:" in capsys.readouterr().err


def test_every_candidate_states_the_contract_fields(capsys: pytest.CaptureFixture[str]) -> None:
    keys = {"model_id", "task", "backend", "npus_per_node", "nnodes", "entry_script"}
    for text in ["train a video model on 2 nodes × 8", "把Qwen2.5-VL做多模态理解微调", "Wan2.1 14B DPO 16卡"]:
        (r,) = both(capsys, text)
        assert r["candidates"] and {"candidates", "question"} <= set(r)
        assert r["question"] is None or isinstance(r["question"], str)
        for c in r["candidates"]:
            assert keys <= set(c) and isinstance(c["npus_per_node"], int) and isinstance(c["nnodes"], int)


@pytest.mark.parametrize(
    ("text", "word", "expect"),
    [
        ("fine-tune Sora-Ultra-9000 on my videos", "Sora-Ultra-9000", None),
        ("train wan2.5 text-to-video", "wan2.5", {"wan2.1", "wan2.2"}),
        ("fine-tune meta-llama/Llama-3-8B on my images", "meta-llama/Llama-3-8B", None),
        ("用Sora9000做文生视频", "Sora9000", None),
    ],
)
def test_unknown_model_is_a_plain_statement_with_close_choices(
    capsys: pytest.CaptureFixture[str], text: str, word: str, expect: set[str] | None
) -> None:
    (r,) = both(capsys, text)
    assert r["candidates"] == []
    assert r["question"].startswith(f"{word!r} is not a MindSpeed-MM model")
    ids = [c["model_id"] for c in r["choices"]]
    reg = get_registry()
    assert 1 <= len(ids) <= 3 and all(i in reg.models for i in ids)
    assert all(i in r["question"] for i in ids) and len(r["question"]) < 400
    if expect:
        assert expect <= set(ids)
    tasks = set(r["parsed"]["tasks"])
    for c in r["choices"]:  # a choice fits what was asked: a task word, else a family word ("videos")
        have = {t.id for t in reg.models[c["model_id"]].tasks}
        assert set(c["tasks"]) <= have and (not tasks or tasks & have)


@pytest.mark.parametrize(
    "text",
    [
        "text-to-video with fp16 and lr 1e-5 on x86_64, 720p, 2 nodes × 8",
        "训练文生视频模型，bf16，单机8卡，aarch64",
        "train a t2v model on 8 A100 GPUs with zero2",
    ],
)
def test_no_false_unknown_model(text: str) -> None:
    r = route_model(RouteRequest(request=text))
    assert r.question is None or "not a MindSpeed-MM model" not in r.question
    assert r.candidates and r.choices == []


@pytest.mark.parametrize(
    ("text", "hints", "flags", "model", "task"),
    [
        ("text-to-video with Qwen2.5-VL-7B", {}, (), "qwen2.5vl", "t2v"),
        ("Wan2.1 speech recognition", {}, (), "wan2.1", "asr"),
        ("wan2.1", {"task": "grpo"}, ("--task", "grpo"), "wan2.1", "grpo"),
    ],
)
def test_impossible_task_is_a_plain_statement_never_a_silent_route(
    capsys: pytest.CaptureFixture[str],
    text: str,
    hints: dict[str, str],
    flags: tuple[str, ...],
    model: str,
    task: str,
) -> None:
    (r,) = both(capsys, text, *flags, **hints)
    reg = get_registry()
    entry = reg.models[model]
    own = [t.id for t in entry.tasks]
    assert task not in own  # the premise: the registry model really lacks the task
    assert r["candidates"] == []
    assert f"{entry.name} has no {task} task" in r["question"]
    assert all(t in r["question"] for t in own)
    first, *others = r["choices"]
    assert first["model_id"] == model and first["tasks"] == list(dict.fromkeys(own))
    having = {e.id for e in reg.models.values() if any(t.id == task for t in e.tasks)}
    assert {c["model_id"] for c in others} <= having and len(others) == min(5, len(having))
    assert all(c["tasks"] == [task] for c in others)
    assert (f"Models with {task}:" in r["question"]) == bool(having)


def test_hardware_file_loads_and_bad_files_name_file_and_field(tmp_path: Path) -> None:
    table = load_hardware()
    assert {"Ascend 910B", "Ascend 910C", "Atlas 800T A2", "Atlas A3"} <= {h.name for h in table.hardware}
    assert load_hardware_file(HARDWARE_FILE) == table
    dup = tmp_path / "dup.yaml"
    dup.write_text(
        "hardware:\n  - {name: X, kind: npu, words: [910b]}\n  - {name: Y, kind: npu, words: [910-B]}\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("hardware:\n  - {name: X, kind: tpu, words: [x1]}\n")
    for path, field, text in [(dup, "hardware", "910-B"), (bad, "hardware.0.kind", "")]:
        with pytest.raises(MMAgentError) as err:
            load_hardware_file(path)
        assert err.value.file == str(path) and err.value.field == field and text in str(err.value)
        assert err.value.fix and "hardware.py" in err.value.fix


def test_route_result_round_trips_through_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    data = cli(capsys, "fine-tune Sora-Ultra-9000 on my videos")
    assert RouteResult.model_validate(data).choices


def test_counts_that_do_not_split_keep_the_total_and_say_so() -> None:
    top = route_model(RouteRequest(request="wan2.1 t2v 3 nodes 16 NPUs")).candidates[0]
    assert (top.npus_per_node, top.nnodes) == (8, 2)
    assert "16 NPUs in all do not fit 3 nodes" in top.explanation


@pytest.mark.parametrize(
    "unit",
    [
        "2 nodes x ",
        "每台",
        "每台1",
        "8 npus x ",
        "1 npus each ",
        "a2",
        "910b ",
        "sora-9",
        "a-1/",
        "each with 1",
    ],
)
def test_count_hardware_and_unknown_passes_stay_linear(unit: str) -> None:
    """Each new pass on 100,000 characters (50x the request cap) of its own worst case: well under a second
    when linear, minutes if any pattern rescanned a run from every position."""
    import time

    from mm_agent.route import _parse, load_vocabulary

    text = unit * (100_000 // len(unit))
    start = time.perf_counter()
    _parse(text, get_registry(), load_vocabulary())
    assert time.perf_counter() - start < 5.0


# (request, launcher the text names, launcher of the best candidate, its nodes)
LAUNCHERS = [
    ("fine-tune wan2.1 t2v on 4 nodes", None, "pdsh", 4),
    ("train qwen2.5-vl 7b on our Volcano cluster, 2 nodes x 8", "volcano", "volcano", 2),
    ("wan2.1 t2v with Slurm on 2 nodes", "slurm", "slurm", 2),
    ("wan2.1 t2v via sbatch, 2 nodes", "slurm", "slurm", 2),
    ("wan2.1 t2v on MindCluster (Ascend Operator), 2 nodes x 8", "ascendjob", "ascendjob", 2),
    ("在k8s集群上用2台机器训练wan2.1 文生视频", "ascendjob", "ascendjob", 2),
    ("wan2.1 t2v on our Volcano cluster on Kubernetes, 2 nodes", "volcano", "volcano", 2),
    ("wan2.1 t2v over ssh on 2 bare-metal hosts", "pdsh", "pdsh", 2),
    ("wan2.1 t2v on one node", None, None, 1),
]


@pytest.mark.parametrize(("text", "named", "launcher", "nodes"), LAUNCHERS)
def test_the_cluster_named_picks_the_launcher(
    capsys: pytest.CaptureFixture[str], text: str, named: str | None, launcher: str | None, nodes: int
) -> None:
    (result,) = both(capsys, text)
    assert result["parsed"]["launcher"] == named
    best = result["candidates"][0]
    assert (best["launcher"], best["nnodes"]) == (launcher, nodes)
    assert not result["question"]  # "k8s", "sbatch" are not taken for unknown model names
    if launcher:
        assert f"launcher={launcher}" in best["explanation"]


# (request, size the text names) — issue 17: LoRA words in English and Chinese reach Wan2.1's LoRA task
LORA_REQUESTS = [
    ("LoRA fine-tune Wan2.1 1.3B", "1.3b"),
    ("train a low-rank adapter for wan2.1 14b", "14b"),
    ("wan2.1 1.3b 低秩适配微调", "1.3b"),
    ("用低秩方法微调万相2.1 14B", "14b"),
    ("给wan2.1 1.3b训练一个适配器", "1.3b"),
]


@pytest.mark.parametrize(("text", "size"), LORA_REQUESTS)
def test_lora_words_route_to_the_wan21_lora_task(
    capsys: pytest.CaptureFixture[str], text: str, size: str
) -> None:
    (result,) = both(capsys, text)
    assert "lora" in result["parsed"]["tasks"]
    top = result["candidates"][0]
    assert (top["model_id"], top["task"], top["size"]) == ("wan2.1", "lora", size)


@pytest.mark.parametrize(
    ("text", "model"),
    [
        ("fine-tune Wan2.1 text-to-video with LoRA", "wan2.1"),
        ("wan2.1 文生视频 LoRA 微调", "wan2.1"),
        ("text-to-image lora", None),
    ],
)
def test_a_lora_of_a_named_task_is_the_lora_job(
    capsys: pytest.CaptureFixture[str], text: str, model: str | None
) -> None:
    (result,) = both(capsys, text)
    top = result["candidates"][0]
    assert top["task"] == "lora" and (model is None or top["model_id"] == model), top


# "Try it on this machine first" (issue 27, item 5): (request, model, task, demo command). The VLM ones name
# the Qwen2.5-VL demo, the Wan ones keep naming `mm-agent demo`.
REHEARSALS = [
    (
        "try the Qwen2.5-VL fine-tuning pipeline on this machine first",
        "qwen2.5vl",
        "sft",
        "mm-agent demo --vlm",
    ),
    ("rehearse VLM fine-tuning without NPUs", "qwen2.5vl", "sft", "mm-agent demo --vlm"),
    ("rehearse Qwen2.5-VL LoRA without an NPU", "qwen2.5vl", "lora", "mm-agent demo --vlm --lora"),
    ("没有NPU，先在本机演练一下Qwen2.5-VL微调", "qwen2.5vl", "sft", "mm-agent demo --vlm"),
    ("先在这台机器上试跑多模态理解微调", "qwen2.5vl", "sft", "mm-agent demo --vlm"),
    ("没有昇腾卡，想先预演一下视觉语言模型的LoRA微调", "qwen2.5vl", "lora", "mm-agent demo --vlm --lora"),
    ("try Wan2.1 text-to-video on this machine first", "wan2.1", "t2v", "mm-agent demo"),
    ("rehearse text-to-video fine-tuning without NPUs", "wan2.1", "t2v", "mm-agent demo"),
    ("在本机预演文生视频 LoRA", "wan2.1", "lora", "mm-agent demo --lora"),
]


@pytest.mark.parametrize(("text", "model", "task", "demo"), REHEARSALS)
def test_a_rehearsal_request_names_the_demo_of_its_model(
    capsys: pytest.CaptureFixture[str], text: str, model: str, task: str, demo: str
) -> None:
    (r,) = both(capsys, text)
    assert r["parsed"]["rehearse"] and r["question"] is None, r["question"]
    top = r["candidates"][0]
    assert (top["model_id"], top["task"], top["demo"]) == (model, task, demo)
    assert f"`{demo}`" in top["explanation"]
    # runtime=bundled is offered exactly where render_job's runtime check accepts the model
    entry = get_registry().models[model]
    spec = next(t for t in entry.tasks if t.id == task and t.backend == top["backend"])
    size = next(s for s in entry.sizes if s.id == top["size"])
    assert ("runtime=bundled trains it here" in top["explanation"]) == (
        bundled_refusal(entry, spec, size) is None
    )
    assert r["parsed"]["npus"] is None and r["parsed"]["nodes"] is None  # "without NPUs" is no count


@pytest.mark.parametrize(
    "text",
    [
        "fine-tune Qwen2.5-VL-7B on 2 nodes with 8 NPUs each",
        "wan2.1 t2v on 2 machines with 8 NPUs each",
        "fine-tune Wan2.1 text-to-video on my videos",  # the demo's own request
        "把Qwen2.5-VL做多模态理解微调",
    ],
)
def test_a_request_for_npus_gets_no_demo(capsys: pytest.CaptureFixture[str], text: str) -> None:
    (r,) = both(capsys, text)
    assert not r["parsed"]["rehearse"]
    assert all(c["demo"] is None and "rehearse" not in c["explanation"] for c in r["candidates"])


def test_a_rehearsal_of_a_model_without_a_demo_keeps_the_model_and_lists_the_demos(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (r,) = both(capsys, "try Qwen3-VL on this machine first")
    top = r["candidates"][0]
    assert top["model_id"] == "qwen3vl" and top["demo"] is None
    assert "no demo rehearses qwen3vl" in top["explanation"] and "`mm-agent demo --vlm`" in top["explanation"]
    (omni,) = both(
        capsys, "rehearse an omni model without NPUs"
    )  # a demo never outranks the family asked for
    assert all(c["model_id"] not in {"wan2.1", "qwen2.5vl"} for c in omni["candidates"])


def test_an_open_rehearsal_asks_which_model_and_names_every_demo(capsys: pytest.CaptureFixture[str]) -> None:
    (r,) = both(capsys, "try the pipeline on this machine first")
    assert r["question"] and r["parsed"]["rehearse"]
    for demo in (
        "`mm-agent demo`",
        "`mm-agent demo --lora`",
        "`mm-agent demo --vlm`",
        "`mm-agent demo --vlm --lora`",
    ):
        assert demo in r["question"]
    assert {c["model_id"] for c in r["candidates"][:2]} == {"wan2.1", "qwen2.5vl"}


def test_every_demo_is_a_registered_task_and_a_real_demo_command() -> None:
    """vocabulary.yaml's demos: the model and task exist, and the command parses with `mm-agent demo`'s own
    parser into the flags that run that model (--vlm for a VLM) and task (--lora for lora)."""
    reg, parser = get_registry(), build_parser()
    demos = load_vocabulary().rehearsal.demos
    assert {(d.model, d.task) for d in demos} >= {("wan2.1", "t2v"), ("qwen2.5vl", "sft")}
    for d in demos:
        entry = reg.models[d.model]
        assert any(t.id == d.task for t in entry.tasks), d
        args = parser.parse_args(shlex.split(d.command)[1:])
        assert args.lora == (d.task == "lora"), d
        assert args.vlm == (entry.skill == "mindspeed-mm-vlm"), d


@pytest.mark.parametrize("task", ["sft", "lora"])
def test_the_bundled_pipeline_of_qwen25vl_is_the_vlm_s(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, task: str
) -> None:
    """Where a rehearsal points (runtime=bundled for Qwen2.5-VL), the eight stages are the VLM's: the HF
    folder itself is converted and exported (no Wan `transformer/`, VAE, mp4 or WanConverter), every mm-agent
    line parses with the CLI's parser, and the scripts named are the ones render_job writes for that job."""
    (r,) = both(capsys, f"qwen2.5vl 3b {task}", "--runtime", "bundled", runtime="bundled")
    top = r["candidates"][0]
    assert (top["model_id"], top["task"], top["runtime"]) == ("qwen2.5vl", task, "bundled")
    assert "runtime.vlm_train" in top["explanation"] and "encodes online" not in top["explanation"]
    stages = {s["stage"]: s for s in top["pipeline"]}
    said = json.dumps([s for s in top["pipeline"] if s["stage"] != "env_setup"])  # (env: the runtime extra)
    for wan in (
        "/transformer",
        "VAE",
        "mp4",
        "WanConverter",
        "diffusers",
        "runtime.sample",
        "runtime.extract",
    ):
        assert wan not in said, wan
    hf = "weights/Qwen/Qwen2.5-VL-3B-Instruct"
    convert = f"mm-agent convert Qwen2_5_VLConverter hf_to_mm --source {hf} --target {hf}-mm --yes"
    assert convert in stages["weights"]["commands"]
    assert not stages["feature_extraction"]["applies"]
    export = stages["export"]["commands"][0]
    assert export.startswith("mm-agent convert Qwen2_5_VLConverter mm_to_hf") and f"--hf-dir {hf} " in export
    parser = build_parser()
    lines = [c for s in top["pipeline"] for c in s["commands"] if c.startswith("mm-agent ")]
    assert len(lines) >= 5
    for line in lines:
        parser.parse_args(shlex.split(line)[1:])  # exits (fails the test) on a flag the CLI lacks
    from mm_agent.render import RenderRequest, render_job

    rendered = render_job(
        RenderRequest(model="qwen2.5vl", task=task, size="3b", runtime="bundled", out_dir="jobs/q"),
        root=tmp_path,
    )
    written = {f.path for f in rendered.files}
    for stage in top["pipeline"]:
        assert set(stage["scripts"]) <= written, (stage["stage"], stage["scripts"], written)
