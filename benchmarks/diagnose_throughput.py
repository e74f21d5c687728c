"""Throughput and memory of `mm-agent diagnose` against `grep -c -E` on the same log, same run.

Generates an 8-rank torchrun log (`[defaultN]:` prefixes) of --size-mb: Megatron iteration lines, INFO
noise, a few warnings, and near the end a real cascade: rank 5 runs out of NPU memory, 25 s later the
other ranks report HCCL link timeouts (EI0006), then torchrun's ChildFailedError. Then it times
  * `mm-agent diagnose FILE --json` in a subprocess (peak RSS from getrusage of the child),
  * `grep -c -E '<union of every catalog trigger, as ERE>' FILE` under LC_ALL=C and the default locale,
checks that the reported root cause is the injected NPU OOM on rank 5, and prints MB/s, the ratio
diagnose/grep (goal: <= 2x) and the peak RSS (goal: < 200 MB). With --follow-runs N it also measures how
long `--follow` takes to report a fatal line after it is written (goal: < 2 s).

    python benchmarks/diagnose_throughput.py [--size-mb 1024] [--out FILE] [--runs 2] [--follow-runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mm_agent.diagnose.catalog import get_catalog  # noqa: E402

ITER = (
    "[default7]: [2026-03-01 {t}] iteration {i:8d}/ 2000000 | consumed samples: {c:12d} | elapsed time per "
    "iteration (ms): {ms:.1f} | learning rate: 1.000000E-05 | global batch size:     8 | loss: {loss:.6E} | "
    "loss scale: 1.0 | grad norm: {g:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |"
)
NOISE = (
    "[default{r}]: [2026-03-01 {t},{ms:03d}] INFO mindspeed_mm.data.datasets: loaded sample {i} from "
    "/data/videos/clip_{i:08d}.mp4 (81 frames, 480x832)",
    "[default{r}]: [2026-03-01 {t},{ms:03d}] INFO megatron.core.timers: forward-backward: ({a:.2f}, {b:.2f}) "
    "optimizer: (2.10, 2.31) batch-generator: (0.01, 0.02)",
    "[default{r}]: /usr/local/python3.10/lib/python3.10/site-packages/torch/utils/checkpoint.py:91: UserWarning: "
    "None of the inputs have requires_grad=True. Gradients will be None",
    "[default{r}]: [rank{r}]:[W301 {t}.{us:06d} compiler_depend.ts:133] Warning: Device do not support double "
    "dtype now, dtype cast repalce with float.",
)
WARNING = (
    "[default{r}]: [W compiler_depend.ts:51] Warning: CAUTION: The operator 'aten::_upsample_bicubic2d_aa.out' is "
    "not currently supported on the NPU backend and will fall back to run on the CPU. This may have performance "
    "implications."
)
FAILURE = """[default5]: [2026-03-02 08:00:05,120] Traceback (most recent call last):
[default5]:   File "/home/mm/MindSpeed-MM/pretrain_sora.py", line 255, in <module>
[default5]:     pretrain(
[default5]: RuntimeError: NPU out of memory. Tried to allocate 2.50 GiB (NPU 5; 60.96 GiB total capacity; 55.12 GiB already allocated; 55.12 GiB current active; 1.02 GiB free; 57.80 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.
{timeouts}[2026-03-02 08:00:40,002] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) local_rank: 5 (pid: 4105) of binary: /usr/bin/python3
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
pretrain_sora.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-03-02_08:00:40
  host      : node0
  rank      : 5 (local_rank: 5)
  exitcode  : 1 (pid: 4105)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
TIMEOUT = (
    "[default{r}]: [2026-03-02 08:00:30,{ms:03d}] RuntimeError: EI0006: Getting socket times out. Reason: Remote "
    "Rank did not send the data in time. Please check the reason for the rank being stuck\n"
)


def generate(path: Path, size_mb: int) -> None:
    rng = random.Random(0)
    target = size_mb * 1024 * 1024
    written = 0
    i = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            lines = []
            for _ in range(20000):
                i += 1
                t = f"{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}"
                if i % 6 == 0:
                    loss = 0.9 * (0.9999 ** (i / 6)) + 0.3 + rng.random() * 0.02
                    lines.append(
                        ITER.format(
                            t=t, i=i // 6, c=i * 8, ms=13000 + rng.random() * 900, loss=loss, g=rng.random()
                        )
                    )
                elif i % 50007 == 0:
                    lines.append(WARNING.format(r=i % 8))
                else:
                    fields = {
                        "r": i % 8,
                        "t": t,
                        "ms": i % 1000,
                        "us": i % 999999,
                        "i": i,
                        "a": i % 97 / 3,
                        "b": i % 89 / 3,
                    }
                    lines.append(NOISE[i % len(NOISE)].format(**fields))
            chunk = "\n".join(lines) + "\n"
            out.write(chunk)
            written += len(chunk)
        timeouts = "".join(TIMEOUT.format(r=r, ms=r) for r in (0, 1, 2, 3, 4, 6, 7))
        out.write(FAILURE.format(timeouts=timeouts))


def ere(trigger: str) -> str:
    """A catalog trigger (Python/RE2 syntax) as a POSIX ERE for grep -E."""
    out = trigger.replace("(?:", "(")
    out = re.sub(r"^\(\?i\)", "", out)
    out = re.sub(r"\(\?i:", "(", out)
    return (
        out.replace(r"\d", "[0-9]")
        .replace(r"\s", "[[:space:]]")
        .replace(r"\S", "[^[:space:]]")
        .replace(r"\w", "[[:alnum:]_]")
    )


def timed(
    cmd: list[str], env: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, proc


def follow_latency(workdir: Path, runs: int) -> list[float]:
    """Seconds from a fatal line being flushed to `diagnose --follow` having reported and exited."""
    out: list[float] = []
    for n in range(runs):
        log = workdir / f"follow_{n}.log"
        log.write_text(ITER.format(t="00:00:01", i=1, c=8, ms=13000.0, loss=0.4, g=0.1) + "\n")
        cmd = [sys.executable, "-m", "mm_agent", "diagnose", str(log), "--follow", "--timeout", "60"]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        proc.stderr.readline()  # "following 1 input(s) ..." once the existing content was read
        time.sleep(0.5 + random.random() * 0.3)  # land anywhere in the poll interval
        with open(log, "a", encoding="utf-8") as f:
            f.write(
                "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.96 GiB total capacity)\n"
            )
            f.flush()
            written = time.perf_counter()
        proc.wait(timeout=60)
        out.append(time.perf_counter() - written)
        if proc.returncode != 1:
            raise SystemExit(f"follow run {n}: exit {proc.returncode}, expected 1")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--out", type=Path, help="write the log here (kept) instead of a temporary directory")
    ap.add_argument("--runs", type=int, default=2, help="timed runs of each tool (best is reported)")
    ap.add_argument("--follow-runs", type=int, default=5, help="follow-latency samples (0 to skip)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="mm-diag-bench-") as tmp:
        log = args.out or Path(tmp) / "train_8ranks.log"
        t0 = time.perf_counter()
        generate(log, args.size_mb)
        size = log.stat().st_size
        print(f"generated {log} ({size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")

        triggers = [t for entry in get_catalog() for t in entry.sig.triggers]
        union = "|".join(f"({ere(t)})" for t in triggers)
        print(f"catalog: {len(get_catalog())} signatures, {len(triggers)} triggers")

        diag_times, report = [], None
        for _ in range(args.runs):
            seconds, proc = timed([sys.executable, "-m", "mm_agent", "diagnose", str(log), "--json"])
            if proc.returncode not in (0, 1):
                raise SystemExit(f"diagnose failed ({proc.returncode}): {proc.stderr}")
            diag_times.append(seconds)
            report = json.loads(proc.stdout)
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux

        greps: dict[str, float] = {}
        count = ""
        for label, env in (("LC_ALL=C", {**os.environ, "LC_ALL": "C"}), ("default locale", None)):
            best = []
            for _ in range(args.runs):
                seconds, proc = timed(["grep", "-c", "-E", union, str(log)], env)
                if proc.returncode not in (0, 1):
                    raise SystemExit(f"grep failed: {proc.stderr}")
                best.append(seconds)
                count = proc.stdout.strip()
            greps[label] = min(best)

        assert report is not None
        root = report["root_cause"] or {}
        ok = root.get("rule_id") == "npu_oom" and root.get("ranks") == [5]
        diag = min(diag_times)
        print(f"diagnose: {diag:.2f} s  {size / diag / 1e6:.0f} MB/s  peak RSS {peak_mb:.0f} MB")
        for label, seconds in greps.items():
            print(
                f"grep -c -E ({label}): {seconds:.2f} s  {size / seconds / 1e6:.0f} MB/s  ratio diagnose/grep {diag / seconds:.2f}x"
            )
        print(f"grep matched {count} lines; diagnose found {len(report['findings'])} finding(s)")
        print(
            f"root cause: {root.get('rule_id')} ({report['category']}) ranks {root.get('ranks')}"
            f" -> {'OK' if ok else 'WRONG (expected npu_oom on rank 5)'}"
        )
        progress = report["progress"]
        print(
            f"progress: iteration {progress['iteration']}/{progress['total_iterations']}, loss {progress['last_loss']} ({progress['loss_trend']})"
        )
        if args.follow_runs:
            lat = follow_latency(Path(tmp), args.follow_runs)
            print(
                f"follow latency (line flushed -> report printed, process exited): median {statistics.median(lat):.2f} s,"
                f" max {max(lat):.2f} s over {len(lat)} runs ({', '.join(f'{x:.2f}' for x in lat)})"
            )
        if not ok:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
