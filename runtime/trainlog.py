"""What a training run reports (rank 0): Megatron's iteration line, TensorBoard scalars, losses.jsonl, a loss PNG.

The iteration line is byte-for-byte Megatron's `training_log` format (reference §5.6) so mm-agent's
diagnoser, MindSpeed-MM's scripts (`awk -F ':' '{print$5}'` on the step time) and any Megatron tooling read
bundled runs like real ones. `losses.jsonl` holds every iteration's loss; on resume it is cut back to the
loaded iteration (a killed run may have logged past its last checkpoint), so the file always describes the
run that the checkpoints continue. The PNG is drawn with matplotlib's Agg backend into a temp file and
renamed, so a viewer never sees half a PNG.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.atomic import atomic_write_bytes, write_text_atomic


def iteration_line(
    iteration: int,
    total: int,
    consumed: int,
    elapsed_ms: float,
    lr: float,
    global_batch: int,
    loss: float,
    grad_norm: float,
    skipped: int,
    nan: int,
) -> str:
    """Megatron core_v0.12 `training_log` line, including its leading space and trailing bar."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return (
        f" [{stamp}] iteration {iteration:8d}/{total:8d} |"
        f" consumed samples: {consumed:12d} |"
        f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
        f" learning rate: {lr:.6E} |"
        f" global batch size: {global_batch:5d} |"
        f" loss: {loss:.6E} |"
        f" loss scale: 1.0 |"
        f" grad norm: {grad_norm:.3f} |"
        f" number of skipped iterations: {skipped:3d} |"
        f" number of nan iterations: {nan:3d} |"
    )


@dataclass
class _Window:
    """Sums over one log interval (Megatron averages loss and step time over the interval)."""

    iterations: int = 0
    loss: float = 0.0
    seconds: float = 0.0
    skipped: int = 0
    nan: int = 0
    losses: list[float] = field(default_factory=list)


class TrainLog:
    """Rank 0's reporter; other ranks construct it with `enabled=False` and every call is a no-op."""

    def __init__(
        self,
        save_dir: Path | None,
        tensorboard_dir: Path | None,
        total_iters: int,
        log_interval: int,
        start_iteration: int,
        *,
        enabled: bool,
    ) -> None:
        self.enabled = enabled
        self.total = total_iters
        self.interval = max(1, log_interval)
        self.window = _Window()
        self.history: list[dict[str, Any]] = []
        self.jsonl = save_dir / "losses.jsonl" if save_dir is not None else None
        self.png = save_dir / "loss_curve.png" if save_dir is not None else None
        self.writer: Any = None
        self.rows: Any = None  # losses.jsonl, open for appending
        if not enabled:
            return
        if self.jsonl is not None:
            self.history = _read_history(self.jsonl, start_iteration)
            self.jsonl.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.jsonl, "".join(json.dumps(r) + "\n" for r in self.history), durable=False)
            self.rows = open(self.jsonl, "a", encoding="utf-8")  # noqa: SIM115  (closed in close())
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            tensorboard_dir.mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(log_dir=str(tensorboard_dir), purge_step=start_iteration + 1)

    def record(
        self,
        iteration: int,
        consumed: int,
        seconds: float,
        lr: float,
        global_batch: int,
        loss: float,
        grad_norm: float,
        skipped: bool,
    ) -> None:
        """One finished iteration; prints the Megatron line at each log interval."""
        if not self.enabled:
            return
        finite = math.isfinite(loss)
        w = self.window
        w.iterations += 1
        w.seconds += seconds
        w.skipped += int(skipped)
        w.nan += int(not finite)
        if finite:
            w.losses.append(loss)
        row = {
            "iteration": iteration,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "consumed_samples": consumed,
        }
        self.history.append(row)
        if self.rows is not None:
            self.rows.write(json.dumps(row) + "\n")
            self.rows.flush()
        if self.writer is not None:
            self.writer.add_scalar("loss", loss, iteration)
            self.writer.add_scalar("learning-rate", lr, iteration)
            self.writer.add_scalar("grad-norm", grad_norm, iteration)
            self.writer.add_scalar("batch-size", global_batch, iteration)
            self.writer.add_scalar("iteration-time", seconds, iteration)
        if iteration % self.interval == 0 or iteration == self.total:
            mean = sum(w.losses) / len(w.losses) if w.losses else float("nan")
            line = iteration_line(
                iteration, self.total, consumed, 1000.0 * w.seconds / w.iterations, lr, global_batch,
                mean, grad_norm, w.skipped, w.nan,
            )  # fmt: skip
            print(line, flush=True)
            self.window = _Window()

    def flush(self) -> None:
        """Make everything so far durable and visible: TensorBoard events and the loss-curve PNG."""
        if not self.enabled:
            return
        if self.writer is not None:
            self.writer.flush()
        if self.png is not None and self.history:
            plot_losses(self.history, self.png)

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()
        if self.rows is not None:
            self.rows.close()


def _read_history(path: Path, upto: int) -> list[dict[str, Any]]:
    """Rows of an earlier run up to `upto` (a killed run may leave rows past its checkpoint, or half a row)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("iteration"), int) and row["iteration"] <= upto:
            rows.append(row)
    return rows


def plot_losses(history: list[dict[str, Any]], png: Path) -> None:
    """Loss per iteration (and a moving mean when there are enough points) as a PNG, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [r["iteration"] for r in history]
    losses = [r["loss"] for r in history]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(its, losses, lw=1, alpha=0.6, label="loss")
    window = max(1, len(losses) // 10)
    if window > 1:
        smooth = [
            sum(losses[max(0, i - window + 1) : i + 1]) / len(losses[max(0, i - window + 1) : i + 1])
            for i in range(len(losses))
        ]
        ax.plot(its, smooth, lw=2, label=f"mean of {window}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("flow-matching loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(png, lambda f: fig.savefig(f, format="png"), durable=False)
    plt.close(fig)
