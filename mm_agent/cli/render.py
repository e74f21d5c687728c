"""`mm-agent render MODEL --task T --out DIR`: write a complete job directory.

The options are generated from `JobSpec`'s fields, so the CLI and the MCP tool cannot drift apart.
`--from job.yaml` re-renders a job; options given on the command line override its values.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.jobfile import load_job_spec, spec_error
from mm_agent.jobspec import JobSpec
from mm_agent.render import RenderRequest, render_job

from .output import add_json_flag, arg_type, console, flag_name, print_json

_POSITIONAL = {"model"}
# CLI help for JobSpec fields whose schema description is absent or too short to use (kept short there: the
# MCP tool list is read by an assistant on every session, the CLI help only by whoever asks for it).
_HELP = {
    "npus_per_node": "NPUs on each node; the job uses npus-per-node x nnodes (default: the size's stock value)",
    "nnodes": "number of nodes (default: the size's stock value, usually 1)",
    "node_rank": "this node's rank, 0 .. nnodes-1 (default 0)",
    "master_addr": "address of the rank-0 node (default localhost; a multi-node job needs a real address)",
    "master_port": "port of the rank-0 node's rendezvous (default 6000)",
    "tp": "tensor-parallel size (default: the size's stock value)",
    "pp": "pipeline-parallel size (default: the size's stock value)",
    "vpp": "virtual pipeline stages per PP rank (default: the size's stock value)",
    "cp": "context-parallel size (default: the size's stock value)",
    "mbs": "micro batch size per rank (default: the size's stock value)",
    "gbs": "global batch size, a multiple of mbs x data-parallel size (default: mbs x DP x grad-acc)",
    "grad_acc": "gradient-accumulation steps, used when --gbs is not given (default: the stock value)",
    "recompute": "activation recomputation (default on; --no-recompute trades memory for speed)",
    "runtime": "mindspeed-mm (its checkout's scripts, the default) or bundled (mm-agent's runtime: Wan t2v and "
    "its LoRA, on NPU, CUDA or CPU)",
    "text_len": "tokens per caption (the tokenizer's model_max_length and the predictor's text_len)",
    "save_path": "where training saves checkpoints (default: <job dir>/checkpoints)",
    "device": "bundled runtime device (auto: NPU, else CUDA, else CPU)",
    "eval_dataset": "the benchmark TSV evaluate.sh scores, named as MindSpeed-MM's README downloads it: AI2D_TEST.tsv, "
    "MMMU_DEV_VAL.tsv, DocVQA_VAL.tsv or ChartQA_TEST.tsv (default: <dataset-dir>/AI2D_TEST.tsv; Qwen2.5-VL SFT)",
    "launcher": "also write a launcher that starts training on every node: pdsh (launch_all.sh HOSTFILE), "
    "ascendjob (ascendjob.yaml, Ascend Operator), volcano (volcano_job.yaml) or slurm (slurm.sbatch); "
    "see docs/launchers.md",
}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "render",
        help="render a ready-to-run MindSpeed-MM job directory",
        epilog="examples:\n  mm-agent render wan2.1 --task t2v --out jobs/wan21 --weights-dir weights/Wan2.1-T2V-1.3B-Diffusers\n"
        "  mm-agent render --from jobs/wan21/job.yaml --out jobs/wan21 --npus-per-node 16 --force\n"
        "  mm-agent render wan2.1 --task t2v --runtime bundled --weights-dir tiny-wan --num-frames 17 "
        "--max-height 64 --max-width 64 --out jobs/tiny",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", nargs="?", help="registry model id (see `mm-agent models`)")
    p.add_argument("--out", required=True, help="job directory to create")
    p.add_argument("--from", dest="from_spec", help="re-render from a job.yaml")
    p.add_argument("--dry-run", action="store_true", help="show the files without writing them")
    p.add_argument("--force", action="store_true", help="replace a different existing job (kept as a backup)")
    for name, field in JobSpec.model_fields.items():
        if name in _POSITIONAL:
            continue
        help_text = _HELP.get(name) or field.description or ""
        if field.annotation is bool:
            p.add_argument(
                flag_name(name), action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
            continue
        kwargs: dict[str, Any] = {"default": None, "help": help_text, "dest": name}
        kind = arg_type(field.annotation)
        if kind is not None:
            kwargs["type"] = kind
        p.add_argument(flag_name(name), **kwargs)
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    given = {
        name: getattr(args, name) for name in JobSpec.model_fields if getattr(args, name, None) is not None
    }
    if args.from_spec:
        base = load_job_spec(Path(args.from_spec)).model_dump(exclude_none=True)
        base.update(given)
        given = base
    if "model" not in given:
        raise MMAgentError(
            "no model given", field="MODEL", fix="pass a model id (mm-agent models) or --from job.yaml"
        )
    if "task" not in given:
        raise MMAgentError(
            "no task given", field="--task", fix="pass --task (e.g. t2v, i2v, sft); see mm-agent models"
        )
    try:
        req = RenderRequest(**given, out_dir=args.out, confirm=not args.dry_run, force=args.force)
    except ValidationError as exc:
        raise spec_error(exc) from exc
    result = render_job(req)
    if args.json:
        print_json(result)
        return 0
    out = console()
    where = "the bundled runtime" if result.runtime == "bundled" else result.backend
    task = f"{result.task} of the {result.adapts} model" if result.adapts else result.task
    out.print(
        f"[bold]{result.model}[/bold] {result.size} {task} on {where}, MindSpeed-MM {result.mm_version}"
    )
    verb = {"dry_run": "would write", "written": "wrote", "unchanged": "unchanged", "replaced": "replaced"}[
        result.status
    ]
    out.print(f"{verb} {len(result.files)} files in {result.job_dir}")
    if result.fit:
        out.print(f"memory: {result.fit}", markup=False)
    if result.backup_dir:
        out.print(f"previous job kept at {result.backup_dir}")
    if result.kept_outputs:
        out.print(f"kept from the previous job: {', '.join(result.kept_outputs)}", markup=False)
    for f in result.files:
        out.print(f"  {f.path}", markup=False)
    out.print("next:")
    for step in result.next_steps:
        out.print(f"  $ {step}", markup=False)
    return 0
