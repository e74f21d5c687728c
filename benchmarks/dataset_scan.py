"""Files per second and peak memory of `prepare_dataset` (dry run) against a plain decord loop, same run.

Generates --clips tiny clips valid for the stock Wan2.1 t2v limits (--frames x 240 x 416 at 16 fps, H.264 via
`runtime.synth.write_mp4`, seeded gradients with a moving square so every clip's bytes differ) with a
`.txt` caption each, in a multiprocessing pool; the generation time is printed apart. With --dir the clips
are kept under DIR/pool and reused by later runs (only missing ones are made); each measured dataset is a
folder of hard links to the first N of them. Then, each in its own child process, on the same files:
  * baseline: one process, no pool, no hashing, no cache: for each clip, what `probe.probe_file` does with
    decord (open with num_threads=1, len, fps, decode the first and the last frame);
  * prepare_dataset cold: a fresh MM_AGENT_STATE_DIR (empty probe cache), --workers pool processes (default:
    prepare_dataset's own, the CPU count up to 8); it also hashes every file, reads its codec from the MP4 header,
    reads its caption, checks it against the job's limits and writes the probe cache;
  * prepare_dataset warm: the same again on the cache the cold run left (no file decoded).
Seconds are timed inside the child around the work (interpreter start-up and imports of the child itself
excluded; prepare_dataset's pool start-up, target resolution and the baseline's `import decord` included).
CPU seconds (user + system of the child and its pool, start-up included) are printed too: on a shared box
the wall-clock speed-up of the pool is capped by what the neighbours leave free, CPU per file is not, and
cores / (cold CPU / baseline CPU) bounds the speed-up on an idle machine.
Peak RSS is sampled every 50 ms with psutil: the sum over the child and all its descendants (pool workers,
resource tracker) and the child's own. The cold run is repeated on a --small subset (default 200) to show
that memory does not grow with the number of files. Cases take turns --runs times; medians are printed.
Goals: cold >= 1.8x the baseline on 2 cores, warm >= 20x cold, peak tree RSS < 300 MB and flat in N.

    python benchmarks/dataset_scan.py [--clips 2000] [--small 200] [--dir DIR] [--workers N] [--runs 1]
        [--gen-procs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
HEIGHT, WIDTH, FPS = 240, 416, 16
MB = 1 << 20
WORDS = ("red", "green", "blue", "yellow", "white", "purple", "square", "bar", "left", "right", "up", "down")


# ----------------------------------------------------------------------------------------------------------
# clips


def clip_frames(seed: int, frames: int) -> np.ndarray:
    """(frames, H, W, 3) uint8: a drifting colour gradient and a moving square, all drawn from `seed`."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    grad = x * int(rng.integers(1, 4)) + y * int(rng.integers(1, 4))
    t = np.arange(frames) * int(rng.integers(2, 12))
    base = rng.integers(0, 256, 3)
    scale = rng.integers(1, 4, 3)
    out = ((base + ((grad[None, :, :, None] + t[:, None, None, None]) // 4) * scale) % 256).astype(np.uint8)
    side = int(rng.integers(16, 64))
    top, left = int(rng.integers(0, HEIGHT - side)), int(rng.integers(0, WIDTH - side))
    dx, colour = int(rng.integers(-8, 9)), rng.integers(0, 256, 3).astype(np.uint8)
    for i in range(frames):
        col = min(max(left + dx * i, 0), WIDTH - side)
        out[i, top : top + side, col : col + side] = colour
    return out


def make_clip(job: tuple[str, int, int]) -> bool:
    """Write clip `index` (mp4 + caption) unless both exist; True when it was written."""
    from runtime.synth import write_mp4

    folder, index, frames = job
    mp4 = Path(folder) / f"clip{index:06d}.mp4"
    txt = mp4.with_suffix(".txt")
    if mp4.exists() and txt.exists():
        return False
    write_mp4(mp4, clip_frames(index, frames), FPS)
    rng = np.random.default_rng(index)
    txt.write_text("a " + " ".join(rng.choice(WORDS, 6)) + f" number {index}\n", encoding="utf-8")
    return True


def generate(pool_dir: Path, clips: int, frames: int, procs: int) -> tuple[float, int]:
    """(seconds, clips written) for the first `clips` clips of `pool_dir`."""
    pool_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        made = sum(pool.imap_unordered(make_clip, [(str(pool_dir), i, frames) for i in range(clips)], 16))
    return time.perf_counter() - t0, made


def link_set(pool_dir: Path, dest: Path, clips: int) -> int:
    """`dest` holds hard links to the first `clips` clips and captions of `pool_dir`; returns its mp4 bytes."""
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(clips):
        for ext in (".mp4", ".txt"):
            src, dst = pool_dir / f"clip{i:06d}{ext}", dest / f"clip{i:06d}{ext}"
            if not dst.exists():
                os.link(src, dst)
        total += (dest / f"clip{i:06d}.mp4").stat().st_size
    return total


# ----------------------------------------------------------------------------------------------------------
# child processes


def child_baseline(folder: Path) -> dict[str, Any]:
    """The per-video decord work of `probe.probe_file`, one file after another in this process."""
    t0 = time.perf_counter()
    import decord

    found: list[tuple[int, float, int, int]] = []
    for path in sorted(folder.glob("*.mp4")):
        reader = decord.VideoReader(str(path), num_threads=1)
        frames = len(reader)
        first = reader[0].shape
        reader[frames - 1]
        found.append((frames, float(reader.get_avg_fps()), int(first[0]), int(first[1])))
    files = len(found)
    return {"seconds": time.perf_counter() - t0, "files": files, "probed": files, "cached": 0}


def child_prepare(folder: Path, workers: int | None) -> dict[str, Any]:
    """One dry-run `prepare_dataset` over `folder` with the environment's MM_AGENT_STATE_DIR."""
    from mm_agent.dataset.prepare import prepare_dataset
    from mm_agent.dataset.schema import DatasetRequest

    t0 = time.perf_counter()
    result = prepare_dataset(DatasetRequest(dir=str(folder), model="wan2.1", task="t2v"), workers=workers)
    seconds = time.perf_counter() - t0
    s = result.stats
    return {
        "seconds": seconds,
        "files": s.found,
        "accepted": s.accepted,
        "probed": s.probed,
        "cached": s.cached,
    }


# ----------------------------------------------------------------------------------------------------------
# measurement


@dataclass
class Sample:
    seconds: float  # the work, timed inside the child
    wall: float  # the child process, start to exit
    cpu: float  # user + system seconds of the child and its pool: what a busy box cannot inflate much
    files: int
    probed: int
    cached: int
    peak_tree: int  # bytes: highest sum of RSS over the child and its descendants
    peak_self: int  # bytes: the child's own highest RSS

    @property
    def rate(self) -> float:
        return self.files / self.seconds if self.seconds else 0.0


def _rss(proc: psutil.Process) -> int:
    try:
        return int(proc.memory_info().rss)
    except psutil.Error:
        return 0


def measure(args: list[str], env: dict[str, str]) -> Sample:
    """Run this file as a child with `args` and sample the RSS of its process tree every 50 ms."""
    peak_tree = peak_self = 0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = psutil.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_tree, peak_self
        while not done.is_set():
            own = _rss(proc)
            try:
                kids = proc.children(recursive=True)
            except psutil.Error:
                kids = []
            peak_self = max(peak_self, own)
            peak_tree = max(peak_tree, own + sum(_rss(k) for k in kids))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"child {args} failed ({proc.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    fig = json.loads(out.decode().strip().splitlines()[-1])
    return Sample(fig["seconds"], wall, cpu, fig["files"], fig["probed"], fig["cached"], peak_tree, peak_self)


def check(name: str, sample: Sample, files: int, probed: int) -> None:
    """The run did the work it is credited with (every file seen; probed, or served from the cache)."""
    if sample.files != files or sample.probed != probed or sample.probed + sample.cached != files:
        raise SystemExit(f"{name}: expected {files} files, {probed} probed; got {asdict(sample)}")


def median_sample(samples: list[Sample]) -> Sample:
    """The run with the median time (its own peaks), and the highest peaks of all runs."""
    mid = sorted(samples, key=lambda s: s.seconds)[(len(samples) - 1) // 2]
    return Sample(
        mid.seconds,
        mid.wall,
        mid.cpu,
        mid.files,
        mid.probed,
        mid.cached,
        max(s.peak_tree for s in samples),
        max(s.peak_self for s in samples),
    )


def run_cases(
    big: Path, small: Path | None, n: int, n_small: int, args: argparse.Namespace
) -> dict[str, Sample]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [] if args.workers is None else ["--workers", str(args.workers)]
    runs: dict[str, list[Sample]] = {}
    with tempfile.TemporaryDirectory(prefix="mm-scan-state-") as states:
        for r in range(args.runs):  # cases take turns so background load hits them alike
            state = {**env, "MM_AGENT_STATE_DIR": str(Path(states) / f"big{r}")}
            base = measure(["--child", "baseline", str(big)], env)
            check("baseline", base, n, n)
            cold = measure(["--child", "prepare", str(big), *workers], state)
            check("cold", cold, n, n)
            warm = measure(["--child", "prepare", str(big), *workers], state)
            check("warm", warm, n, 0)
            runs.setdefault("baseline", []).append(base)
            runs.setdefault("cold", []).append(cold)
            runs.setdefault("warm", []).append(warm)
            if small is not None:
                small_state = {**env, "MM_AGENT_STATE_DIR": str(Path(states) / f"small{r}")}
                cold_small = measure(["--child", "prepare", str(small), *workers], small_state)
                check("cold small", cold_small, n_small, n_small)
                runs.setdefault("cold_small", []).append(cold_small)
    return {name: median_sample(samples) for name, samples in runs.items()}


# ----------------------------------------------------------------------------------------------------------
# report


def report(figures: dict[str, Any], res: dict[str, Sample]) -> None:
    setup = figures["setup"]
    gen = figures["generation"]
    print(
        f"{setup['clips']} clips {setup['frames']}x{HEIGHT}x{WIDTH} @ {FPS} fps, {setup['mb']:.1f} MB of mp4; "
        f"{setup['cpus']} CPUs, prepare_dataset workers {setup['workers'] or 'default'}; median of {setup['runs']}"
    )
    print(
        f"generation: {gen['written']} clips written in {gen['seconds']:.1f} s with {gen['procs']} processes "
        f"({gen['reused']} reused)"
    )
    labels = {
        "baseline": "baseline decord loop (1 proc)",
        "cold": "prepare_dataset cold",
        "warm": "prepare_dataset warm (cache)",
        "cold_small": f"prepare_dataset cold, {setup['small']} clips",
    }
    print(
        f"{'case':<34}{'files':>7}{'seconds':>9}{'files/s':>10}{'child wall s':>14}{'CPU s':>8}{'peak tree MB':>14}{'own MB':>8}"
    )
    for key, label in labels.items():
        if key in res:
            s = res[key]
            print(
                f"{label:<34}{s.files:>7}{s.seconds:>9.2f}{s.rate:>10.1f}{s.wall:>14.2f}{s.cpu:>8.2f}"
                f"{s.peak_tree / MB:>14.1f}{s.peak_self / MB:>8.1f}"
            )
    ratios = figures["ratios"]
    print(f"cold / baseline files/s: {ratios['cold_vs_baseline']:.2f}x (goal >= 1.8x)")
    print(
        f"machine ceiling: {setup['ceiling']:.2f}x for a busy loop in {setup['cpus']} processes vs one after the "
        f"other, so the scan reaches {ratios['cold_vs_baseline'] / setup['ceiling']:.0%} of what these CPUs give"
    )
    print(
        f"CPU seconds cold / baseline: {ratios['cpu_cold_vs_baseline']:.2f} (so at most "
        f"{setup['cpus'] / ratios['cpu_cold_vs_baseline']:.2f}x the baseline on {setup['cpus']} idle cores)"
    )
    print(f"warm / cold files/s:     {ratios['warm_vs_cold']:.1f}x (goal >= 20x)")
    print(f"peak tree RSS cold: {res['cold'].peak_tree / MB:.1f} MB (goal < 300 MB)", end="")
    if "cold_small" in res:
        print(
            f"; {setup['small']} clips {res['cold_small'].peak_tree / MB:.1f} MB vs {setup['clips']} clips "
            f"{res['cold'].peak_tree / MB:.1f} MB: {ratios['peak_big_vs_small']:.2f}x for "
            f"{setup['clips'] / setup['small']:.0f}x the files"
        )
    else:
        print()


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def machine_ceiling(n: int = 15_000_000) -> float:
    """What a pool of CPU-count processes gains on this machine at best: the same busy loop CPU-count times,
    one after the other vs in that many processes. Virtual CPUs that share a core (or a throttled host) give
    far less than the CPU count; no scan can beat this."""
    cpus = os.cpu_count() or 1
    t0 = time.perf_counter()
    for _ in range(cpus):
        _spin(n)
    serial = time.perf_counter() - t0
    with multiprocessing.get_context("spawn").Pool(cpus) as pool:
        pool.map(_spin, [1] * cpus)  # started before the clock
        t0 = time.perf_counter()
        pool.map(_spin, [n] * cpus)
        parallel = time.perf_counter() - t0
    return serial / parallel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clips", type=int, default=2000)
    ap.add_argument(
        "--small", type=int, default=200, help="clips of the memory-flatness run (skipped if >= clips)"
    )
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--dir", type=Path, default=None, help="keep the generated clips here for later runs")
    ap.add_argument("--workers", type=int, default=None, help="prepare_dataset workers (default: its own)")
    ap.add_argument("--gen-procs", type=int, default=os.cpu_count() or 1, help="processes generating clips")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--child", nargs=2, metavar=("CASE", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        case, folder = args.child
        fig = (
            child_baseline(Path(folder)) if case == "baseline" else child_prepare(Path(folder), args.workers)
        )
        print(json.dumps(fig))
        return
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="mm-scan-") as tmp:
        work = args.dir.resolve() if args.dir else Path(tmp)
        n_small = args.small if 0 < args.small < args.clips else 0
        gen_seconds, written = generate(work / "pool", args.clips, args.frames, args.gen_procs)
        big = work / f"set-{args.clips}-{args.frames}"
        mb = link_set(work / "pool", big, args.clips) / MB
        small = work / f"set-{n_small}-{args.frames}" if n_small else None
        if small is not None:
            link_set(work / "pool", small, n_small)
        res = run_cases(big, small, args.clips, n_small, args)
    ceiling = machine_ceiling()
    figures: dict[str, Any] = {
        "setup": {
            "clips": args.clips,
            "small": n_small or None,
            "frames": args.frames,
            "mb": round(mb, 1),
            "cpus": os.cpu_count(),
            "ceiling": round(ceiling, 2),
            "workers": args.workers,
            "runs": args.runs,
        },
        "generation": {
            "seconds": round(gen_seconds, 2),
            "written": written,
            "reused": args.clips - written,
            "procs": args.gen_procs,
        },
        "cases": {
            k: {**asdict(s), "files_per_s": round(s.rate, 1), "peak_tree_mb": round(s.peak_tree / MB, 1)}
            for k, s in res.items()
        },
        "ratios": {
            "cold_vs_baseline": res["cold"].rate / res["baseline"].rate,
            "cpu_cold_vs_baseline": res["cold"].cpu / res["baseline"].cpu,
            "warm_vs_cold": res["warm"].rate / res["cold"].rate,
            "peak_big_vs_small": res["cold"].peak_tree / res["cold_small"].peak_tree
            if "cold_small" in res
            else None,
        },
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        report(figures, res)


if __name__ == "__main__":
    main()
