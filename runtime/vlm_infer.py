"""`python -m runtime.vlm_infer`: answer held-out image questions with a Hugging Face Qwen2.5-VL and score them.

The VLM pipeline ends, as MindSpeed-MM's `examples/qwen2.5vl` does, with inference and evaluation: the trained
model (converted back to the Hugging Face layout) is loaded with transformers, each question is put through
the model's own chat template with its image, answered greedily with `generate`, and compared with the
expected answer (exact match after trimming whitespace and case). The report (`--out`) holds every answer and
the accuracy, written atomically; stdout gets `answer i/N: ...` lines and a final `accuracy: X/N (p)` line.

Questions are read in either shape mm-agent deals in (the first user turn is the question, the first
assistant turn the expected answer; images are resolved against `--image-root`, by default the file's folder):
- LLaVA: `[{"id", "image": "a.png" | [...], "conversations": [{"from": "human", "value": "<image>\\n..."},
  {"from": "gpt", "value": "..."}]}]` (what `runtime.synth_vlm` writes as heldout.json);
- MindSpeed-MM's MLLM JSON as `mm-agent dataset` writes it: `[{"messages": [{"role": "user", "content":
  "<image>..."}, {"role": "assistant", "content": "..."}], "images": ["a.png"]}]`.

The text is built as Qwen2_5_VLProcessor builds it for images (chat template, then each `<|image_pad|>`
repeated once per merged patch), from the tokenizer and the image processor: transformers 5's processor class
cannot be constructed without torchvision (its video processor), which the runtime does not install.
"""

from __future__ import annotations

from runtime.device import guard_torch_npu

guard_torch_npu()  # before torch: a torch_npu without CANN must not crash `import torch`

import argparse  # noqa: E402
import json  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

from runtime.atomic import write_text_atomic  # noqa: E402
from runtime.device import pick_device  # noqa: E402
from runtime.errors import RuntimeFailure, run_main  # noqa: E402

if TYPE_CHECKING:
    import torch

IMAGE = "<image>"
IMAGE_PAD = "<|image_pad|>"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


@dataclass(frozen=True)
class Question:
    """One held-out question: its id, the user's text (with `<image>` placeholders), image files, the answer."""

    id: str
    text: str
    images: list[Path]
    expected: str


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise RuntimeFailure(message, fix="see `python -m runtime.vlm_infer --help` for the accepted flags")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(
        prog="python -m runtime.vlm_infer", allow_abbrev=False, description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--model", required=True, type=Path, help="Hugging Face Qwen2.5-VL directory")
    p.add_argument("--data", required=True, type=Path, help="questions: LLaVA or MindSpeed-MM MLLM JSON")
    p.add_argument("--out", required=True, type=Path, help="report JSON (answers + accuracy), atomic")
    p.add_argument(
        "--image-root", type=Path, default=None, help="image paths' base (default: --data's folder)"
    )
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--limit", type=int, default=None, help="answer only the first N questions")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "npu"])
    p.add_argument(
        "--load",
        default=None,
        help="a checkpoint in MindSpeed-MM's layout (training's --save, or a conversion) built on --model's "
        "config, tokenizer and processor; default: --model's own weights",
    )
    p.add_argument("--load-base-model", default=None, help="with a LoRA --load: the base it was trained on")
    return p.parse_args(argv)


def _turns(record: dict[str, Any]) -> list[tuple[str, str]] | None:
    turns = record.get("conversations", record.get("messages"))
    if not isinstance(turns, list):
        return None
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            return None
        role = _ROLES.get(str(turn.get("from", turn.get("role"))))
        text = turn.get("value", turn.get("content"))
        if role is None or not isinstance(text, str):
            return None
        out.append((role, text))
    return out


def read_questions(path: Path, image_root: Path | None = None) -> list[Question]:
    """The questions of a LLaVA or MLLM JSON file (see the module doc); a malformed file or record is a
    `RuntimeFailure` naming it, never a half-scored report."""
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RuntimeFailure(
            f"cannot read the questions: {exc}",
            file=str(path),
            fix="pass a JSON list of LLaVA (`conversations`) or MLLM (`messages`/`images`) records",
        ) from exc
    if not isinstance(records, list) or not records:
        raise RuntimeFailure(
            "the questions file is not a non-empty JSON list",
            file=str(path),
            fix="pass a JSON list of LLaVA (`conversations`) or MLLM (`messages`/`images`) records",
        )
    root = image_root or path.parent
    out = []
    for i, record in enumerate(records):
        turns = _turns(record) if isinstance(record, dict) else None
        user = next((t for r, t in turns or [] if r == "user"), None)
        answer = next((t for r, t in turns or [] if r == "assistant"), None)
        if user is None or answer is None:
            raise RuntimeFailure(
                f"record {i} has no user question and assistant answer",
                file=str(path),
                field=f"[{i}]",
                fix='give each record a user turn and an assistant turn ("conversations" with "from"/"value", '
                'or "messages" with "role"/"content")',
            )
        images = record.get("images", record.get("image")) or []
        images = [images] if isinstance(images, str) else images
        if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
            raise RuntimeFailure(
                f"record {i}: images must be a path or a list of paths",
                file=str(path),
                field=f"[{i}].images",
                fix='write "images": ["a.png", ...] (relative to the questions file or --image-root)',
            )
        if user.count(IMAGE) not in (0, len(images)):
            raise RuntimeFailure(
                f"record {i}: {user.count(IMAGE)} <image> placeholder(s) for {len(images)} image(s)",
                file=str(path),
                field=f"[{i}]",
                fix="put one <image> per image in the question (or none: the images then come first)",
            )
        text = user if IMAGE in user else IMAGE * len(images) + user
        paths = [Path(p) if Path(p).is_absolute() else root / p for p in images]
        for p in paths:
            if not p.is_file():
                raise RuntimeFailure(
                    f"record {i}: image {p} does not exist",
                    file=str(path),
                    field=f"[{i}].images",
                    fix="pass --image-root <the folder the image paths are relative to>",
                )
        out.append(Question(str(record.get("id", i)), text, paths, answer))
    return out


def chat_messages(text: str, answer: str | None = None) -> list[dict[str, Any]]:
    """The chat-template messages for a user text with `<image>` placeholders (image parts at their places,
    text kept exactly, so the prompt equals MindSpeed-MM's `qwen2vl` rendering) and an optional answer."""
    parts: list[dict[str, str]] = []
    for n, piece in enumerate(text.split(IMAGE)):
        if n:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    messages: list[dict[str, Any]] = [{"role": "user", "content": parts}]
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


class VlmProcessor:
    """Qwen2_5_VLProcessor's image path: tokenizer + chat template + `Qwen2VLImageProcessor`, each
    `<|image_pad|>` expanded to the image's merged patch count (grid t*h*w / merge_size^2)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.images = AutoImageProcessor.from_pretrained(model_dir, local_files_only=True)
        template = model_dir / "chat_template.json"
        self.template: str | None = None
        if template.is_file():
            self.template = json.loads(template.read_text(encoding="utf-8"))["chat_template"]
        elif (model_dir / "chat_template.jinja").is_file():
            self.template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
        self.merge = int(getattr(self.images, "merge_size", 2))

    def render(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt, chat_template=self.template
            )
        )

    def encode(self, text: str, images: list[Path]) -> dict[str, torch.Tensor]:
        """input_ids/attention_mask (batch 1), pixel_values and image_grid_thw for a rendered text."""
        from PIL import Image

        out: dict[str, torch.Tensor] = {}
        if images:
            pics = [Image.open(p).convert("RGB") for p in images]
            vision = self.images(images=pics, return_tensors="pt")
            out["pixel_values"] = vision["pixel_values"]
            out["image_grid_thw"] = vision["image_grid_thw"]
            pieces = text.split(IMAGE_PAD)
            if len(pieces) - 1 != len(images):
                raise RuntimeFailure(
                    f"the prompt holds {len(pieces) - 1} image slots for {len(images)} image(s)",
                    fix="check the model's chat template (it must write <|image_pad|> per image part)",
                )
            counts = [int(g.prod()) // self.merge**2 for g in out["image_grid_thw"]]
            text = pieces[0] + "".join(
                IMAGE_PAD * c + rest for c, rest in zip(counts, pieces[1:], strict=True)
            )
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        out["input_ids"] = ids["input_ids"]
        out["attention_mask"] = ids["attention_mask"]
        return out


def normalise(answer: str) -> str:
    """What exact match compares: trimmed, lower case, without a trailing full stop."""
    return answer.strip().rstrip(".").strip().lower()


def answer_questions(
    model: Any, processor: VlmProcessor, questions: list[Question], *, max_new_tokens: int, device: Any
) -> list[dict[str, Any]]:
    """Greedy answers, one question at a time, printing `answer i/N: ...` as each lands."""
    import torch

    rows = []
    for n, q in enumerate(questions, 1):
        text = processor.render(chat_messages(q.text), generation_prompt=True)
        inputs = {k: v.to(device) for k, v in processor.encode(text, q.images).items()}
        with torch.no_grad():
            ids = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        new = ids[0, inputs["input_ids"].shape[1] :]
        got = str(processor.tokenizer.decode(new, skip_special_tokens=True)).strip()
        match = normalise(got) == normalise(q.expected)
        rows.append({"id": q.id, "question": q.text, "answer": got, "expected": q.expected, "match": match})
        print(
            f"answer {n}/{len(questions)}: {got!r} (expected {q.expected!r}{', ok' if match else ''})",
            flush=True,
        )
    return rows


def report(rows: list[dict[str, Any]], model_dir: Path, data: Path) -> dict[str, Any]:
    correct = sum(1 for r in rows if r["match"])
    return {
        "model": str(model_dir),
        "data": str(data),
        "total": len(rows),
        "correct": correct,
        "accuracy": correct / len(rows) if rows else 0.0,
        "metric": "exact match (trimmed, lower case, trailing '.' dropped)",
        "answers": rows,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.max_new_tokens < 1:
        raise RuntimeFailure("--max-new-tokens must be >= 1", field="--max-new-tokens", fix="pass e.g. 8")
    if not (args.model / "config.json").is_file():
        raise RuntimeFailure(
            f"{args.model} is not a Hugging Face model directory (no config.json)",
            field="--model",
            fix="pass the directory written by `mm-agent convert ... mm_to_hf` (or runtime.synth_vlm)",
        )
    questions = read_questions(args.data, args.image_root)
    if args.limit is not None:
        questions = questions[: max(1, args.limit)]
    device = pick_device(args.device, 0)
    from transformers import Qwen2_5_VLForConditionalGeneration

    try:
        processor = VlmProcessor(args.model)
        if args.load is not None:  # MindSpeed-MM's layout, read as inference_vlm.py reads it (no export)
            from runtime.vlm_load import build, merged_state

            state, loaded = merged_state(args.model, args.load, args.load_base_model)
            model = build(args.model, state, str(loaded.root))
            print(f"loaded {loaded.root} (iteration {loaded.iteration}) on {args.model}", flush=True)
        else:
            model = Qwen2_5_VLForConditionalGeneration.from_pretrained(args.model, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise RuntimeFailure(
            f"cannot load the model: {exc}",
            file=str(args.model),
            fix="the folder needs config.json, *.safetensors, the tokenizer files and preprocessor_config.json",
        ) from exc
    model.to(device.torch_device).eval()
    rows = answer_questions(
        model, processor, questions, max_new_tokens=args.max_new_tokens, device=device.torch_device
    )
    result = report(rows, args.model, args.data)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"accuracy: {result['correct']}/{result['total']} ({result['accuracy']:.3f})", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
