"""The VLM demo's synthetic inputs and its inference/evaluation step, with the real libraries.

The tiny Qwen2.5-VL folder must be what the rest of the pipeline takes: transformers loads it (model,
tokenizer, image processor, chat template), mm-agent's native converter accepts it, and its special-token ids
are the ones the config names. The shapes dataset must pass `prepare_dataset` untouched. `runtime.vlm_infer`
is run as users run it (a subprocess) on both question shapes, and its report must agree with its own rows
and with what the model answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("PIL")

from mm_agent.convert.engine import execute
from mm_agent.convert.schema import ConvertRequest
from mm_agent.dataset import prepare_dataset
from mm_agent.dataset.schema import DatasetRequest
from runtime import synth_vlm, vlm_infer
from runtime.errors import RuntimeFailure
from runtime.vlm_infer import VlmProcessor, chat_messages, read_questions

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_vlm.build_tiny_qwen25vl(tmp_path_factory.mktemp("vlm") / "hf", seed=0)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> synth_vlm.VlmDataset:
    return synth_vlm.make_vlm_dataset(tmp_path_factory.mktemp("vlmdata") / "shapes", 6, 3, seed=1)


def test_weights_load_with_matching_special_tokens(weights: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(weights, local_files_only=True)
    config = AutoConfig.from_pretrained(weights)
    tok = AutoTokenizer.from_pretrained(weights)
    ids = {t: tok.convert_tokens_to_ids(t) for t in synth_vlm.SPECIAL_TOKENS}
    assert len(set(ids.values())) == len(ids) and None not in ids.values()
    assert config.image_token_id == ids["<|image_pad|>"]
    assert config.video_token_id == ids["<|video_pad|>"]
    assert config.vision_start_token_id == ids["<|vision_start|>"]
    assert config.text_config.eos_token_id == ids["<|im_end|>"] == tok.eos_token_id
    assert tok.pad_token_id == ids["<|endoftext|>"]
    assert config.text_config.vocab_size >= len(tok)
    # the 3B's structure: tied embeddings, query heads in KV groups, a full-attention ViT block in range
    assert config.tie_word_embeddings and model.lm_head.weight is model.get_input_embeddings().weight
    assert config.text_config.num_attention_heads > config.text_config.num_key_value_heads > 0
    assert all(0 <= i < config.vision_config.depth for i in config.vision_config.fullatt_block_indexes)
    # answers and template words are single tokens, so a tiny model can learn them quickly
    for word in (*synth_vlm.COLOURS, *synth_vlm.SHAPES):
        assert len(tok(word, add_special_tokens=False)["input_ids"]) == 1, word


def test_processor_output_runs_through_the_model(weights: Path, dataset: synth_vlm.VlmDataset) -> None:
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    processor = VlmProcessor(weights)
    q = read_questions(dataset.heldout)[0]
    text = processor.render(chat_messages(q.text), generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert "<|vision_start|><|image_pad|><|vision_end|>\nWhat" in text
    assert text.endswith("<|im_start|>assistant\n")
    inputs = processor.encode(text, q.images)
    # 112x112 -> an 8x8 patch grid, merged 2x2 -> 16 image tokens
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert inputs["pixel_values"].shape == (64, 3 * 2 * 14 * 14)
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((inputs["input_ids"] == pad).sum()) == 16
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(weights, local_files_only=True)
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[:2] == inputs["input_ids"].shape and torch.isfinite(logits).all()


def test_native_converter_accepts_the_weights(weights: Path, tmp_path: Path) -> None:
    report = execute(
        ConvertRequest(
            converter="Qwen2_5_VLConverter",
            method="hf_to_mm",
            source=str(weights),
            target=str(tmp_path / "mm"),
            confirm=True,
        )
    )
    assert report.status == "converted" and not report.keys_dropped, report.message
    assert (tmp_path / "mm" / "release" / "mp_rank_00" / "model_optim_rng.pt").is_file()


def test_dataset_is_llava_with_disjoint_heldout_images(dataset: synth_vlm.VlmDataset) -> None:
    train = json.loads(dataset.train.read_text())
    held = json.loads(dataset.heldout.read_text())
    assert (len(train), len(held)) == (dataset.train_records, dataset.heldout_records) == (12, 6)
    for rec in train + held:
        human, gpt = rec["conversations"]
        assert human["from"] == "human" and human["value"].startswith("<image>\n")
        assert gpt["value"] in (*synth_vlm.COLOURS, *synth_vlm.SHAPES)
        assert (dataset.root / rec["image"]).is_file()
    train_bytes = {(dataset.root / r["image"]).read_bytes() for r in train}
    assert not train_bytes & {(dataset.root / r["image"]).read_bytes() for r in held}


def test_prepare_dataset_accepts_every_record(dataset: synth_vlm.VlmDataset) -> None:
    for index, count in ((dataset.train, 12), (dataset.heldout, 6)):
        result = prepare_dataset(
            DatasetRequest(
                dir=str(dataset.root),
                model="qwen2.5vl",
                task="sft",
                index=str(index),
                out=str(dataset.root / f"mllm_{index.stem}.json"),
                confirm=True,
            )
        )
        assert result.ok and result.accepted == count and not result.rejected, result


def _infer(weights: Path, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime.vlm_infer", "--model", str(weights), "--data", str(data), "--out", str(out),
         "--device", "cpu", *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _infer_here(weights: Path, data: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`runtime.vlm_infer.main` in this process (torch is imported once); returns its stdout."""
    capsys.readouterr()
    assert (
        vlm_infer.main(["--model", str(weights), "--data", str(data), "--out", str(out), "--device", "cpu"])
        == 0
    )
    return capsys.readouterr().out


def test_infer_report_matches_its_rows_in_both_shapes(
    weights: Path, dataset: synth_vlm.VlmDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    mllm = dataset.root / "mllm_heldout.json"
    if not mllm.is_file():  # (when run alone)
        prepare_dataset(
            DatasetRequest(dir=str(dataset.root), model="qwen2.5vl", index=str(dataset.heldout),
                           out=str(mllm), confirm=True)
        )  # fmt: skip
    reports = []
    for data in (dataset.heldout, mllm):
        out = dataset.root / f"answers_{data.stem}.json"
        if data == mllm:
            stdout = _infer_here(weights, data, out, capsys)
        else:  # as users and the demo run it
            done = _infer(weights, data, out)
            assert done.returncode == 0, done.stderr
            stdout = done.stdout
        report = json.loads(out.read_text())
        rows = report["answers"]
        assert report["total"] == len(rows) == 6
        assert report["correct"] == sum(r["match"] for r in rows)
        assert report["accuracy"] == pytest.approx(report["correct"] / 6)
        for r in rows:
            assert r["match"] == (r["answer"].strip().lower() == r["expected"].strip().lower())
        progress = [line for line in stdout.splitlines() if line.startswith("answer ")]
        assert [p.split(":")[0] for p in progress] == [f"answer {i}/6" for i in range(1, 7)]
        assert stdout.splitlines()[-1] == f"accuracy: {report['correct']}/6 ({report['accuracy']:.3f})"
        reports.append(report)
    # the same questions in either shape get the same (greedy) answers
    assert [r["answer"] for r in reports[0]["answers"]] == [r["answer"] for r in reports[1]["answers"]]
    assert [r["expected"] for r in reports[0]["answers"]] == [r["expected"] for r in reports[1]["answers"]]


def test_infer_scores_a_right_answer(
    weights: Path, dataset: synth_vlm.VlmDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A question whose expected answer is whatever the untrained model says must score 1/1: exact match is
    really compared, not always false."""
    first = tmp_path / "first.json"
    _infer_here(weights, dataset.heldout, first, capsys)
    said = json.loads(first.read_text())["answers"][0]["answer"]
    record = json.loads(dataset.heldout.read_text())[0]
    record["conversations"][1]["value"] = f" {said.upper()} " if said else "."
    record["image"] = str(dataset.root / record["image"])
    data = tmp_path / "one.json"
    data.write_text(json.dumps([record]))
    assert _infer_here(weights, data, tmp_path / "one_answers.json", capsys).splitlines()[-1] == (
        "accuracy: 1/1 (1.000)"
    )


def test_bad_questions_are_user_errors(tmp_path: Path, weights: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps([{"conversations": [{"from": "human", "value": "<image>\nhi"}], "image": "x.png"}])
    )
    with pytest.raises(RuntimeFailure, match="no user question and assistant answer"):
        read_questions(bad)
    bad.write_text(json.dumps([{"messages": [{"role": "user", "content": "<image>q"},
                                             {"role": "assistant", "content": "a"}], "images": ["gone.png"]}]))  # fmt: skip
    with pytest.raises(RuntimeFailure, match="does not exist"):
        read_questions(bad)
    done = _infer(weights, bad, tmp_path / "never.json")
    assert done.returncode == 2
    assert "error: record 0: image" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "never.json").exists()


def test_synth_cli_writes_both(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runtime.synth", "vlm-dataset", str(tmp_path / "d"), "--count", "2", "--heldout", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / "d" / "train.json"), str(tmp_path / "d" / "heldout.json")]
    assert len(json.loads((tmp_path / "d" / "heldout.json").read_text())) == 2
