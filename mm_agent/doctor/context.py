"""What the checks look at: the request resolved against the registry and an optional rendered job, plus
shared probes computed once per run (thread-safe, because checks run concurrently).
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from mm_agent import procs
from mm_agent.contained import Scope
from mm_agent.doctor.bundled import requirement_names
from mm_agent.doctor.interpreter import check_interpreter, interpreter_path
from mm_agent.doctor.models import DoctorRequest, Status
from mm_agent.doctor.probes import EnvProbe, ProbeError, run_env_probe
from mm_agent.doctor.trainenv import MM_DISTS, NoTrainingEnv, is_agent_env, search
from mm_agent.errors import MMAgentError
from mm_agent.jobspec import ResolvedJob, Runtime, resolve_job
from mm_agent.npu_smi import NpuSmiInfo, query
from mm_agent.paths import confine, inside, where
from mm_agent.registry import Registry, get_registry
from mm_agent.registry.schema import ModelEntry, SizeSpec, TaskSpec, VersionInfo

T = TypeVar("T")

DEFAULT_MASTER_PORT = 6000  # MindSpeed-MM example scripts
DEFAULT_NUM_WORKERS = 8  # `--num-workers 8` in MindSpeed-MM example scripts

# Packages whose versions the checks compare; model overlays add theirs.
BASE_DISTS = (
    "torch",
    "torch_npu",
    "mindspeed",
    "mindspeed_mm",
    "megatron_core",
    "diffusers",
    "transformers",
    "peft",
    "accelerate",
    "decord",
    "eva-decord",
)
PROBED_MODULES = (
    "megatron",
    "mindspeed",
    "mindspeed_mm",
    "decord",
    "torch_npu",
    "torch",
    "runtime",
    "mm_agent",
)
# mm-agent's own distribution: installed in the training interpreter, it carries the bundled runtime.
MM_AGENT_DIST = "mm-agent"
# Small files read beside a module by the probe (never imported): torch's build (CPU, CUDA, ROCm).
PROBED_FILES = {"torch": ["version.py"], "runtime": ["train.py", "extract.py", "sample.py"]}


def requirement(spec: str) -> Any:
    """packaging Requirement of a registry pip spec, None when it is not one."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(spec)
    except InvalidRequirement:
        return None


class Context:
    """Resolved inputs of one doctor run. Build with `Context.build`."""

    def __init__(self, req: DoctorRequest, registry: Registry, base: Path, root: Path | None) -> None:
        self.req = req
        self.registry = registry
        self.base = base
        self.root = root
        self.env: dict[str, str] = dict(os.environ)
        self.timeout_s = req.timeout_s
        self.deadline = time.monotonic() + req.timeout_s
        self.job_dir: Path | None = None
        self.job: ResolvedJob | None = None
        self.model: ModelEntry | None = None
        self.task: TaskSpec | None = None
        self.size: SizeSpec | None = None
        self.version: VersionInfo
        self.mm_root: Path | None = None
        self.mm_root_source = ""
        self.mm_root_from_env = False  # the operator's $MM_ROOT: trusted like the rest of the server's env
        self.python = sys.executable  # the interpreter the checks judge (see `trainenv.py` for which)
        self.python_source = "the interpreter running mm-agent"
        # mm-agent's own interpreter is the only candidate left (`trainenv.py`, 5.): judged only when
        # MindSpeed-MM is installed in it, otherwise `pyenv` raises NoTrainingEnv.
        self.agent_fallback = False
        # Why nothing is judged, decided before any probe (the training env lies outside the workspace).
        self.no_env: NoTrainingEnv | None = None
        self.passed_over: list[str] = []  # training-env candidates not taken, and why (`trainenv.search`)
        self._probed = threading.local()  # per check thread: whether the check read the judged interpreter
        # A bundled job's own interpreter that could not be probed: (status, summary, fix) for runtime_install.
        self.python_problem: tuple[Status, str, str] | None = None
        self.master_port = DEFAULT_MASTER_PORT
        self.master_port_source = "MindSpeed-MM script default"
        self.num_workers = DEFAULT_NUM_WORKERS
        self.num_workers_source = "MindSpeed-MM example default (--num-workers 8)"
        self.npus_per_node: int | None = None
        self.nnodes = 1
        self.tp = 1
        # What runs the job (job.yaml `runtime`): decides which checks apply (`registry.check(runtimes=)`).
        self.runtime: Runtime = "mindspeed-mm"
        self.device: str | None = None  # job.yaml `device` of a bundled job (None/auto: the runtime picks)
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._cache: dict[str, Any] = {}
        self.scope = Scope()  # every probe subprocess of this run; closed when the run answers

    # ------------------------------------------------------------------------------------------------
    # building

    def _path(self, value: str, field: str) -> Path:
        if self.root is not None:
            return confine(value, self.root, field)
        path = Path(value).expanduser()
        return (path if path.is_absolute() else self.base / path).resolve()

    @classmethod
    def build(cls, req: DoctorRequest, root: Path | None = None) -> Context:
        from mm_agent.jobfile import JOB_FILE, load_job_spec

        reg = get_registry()
        base = (root or Path.cwd()).resolve()
        ctx = cls(req, reg, base, root.resolve() if root else None)
        spec = None
        if req.job:
            ctx.job_dir = ctx._path(req.job, "job")
            job_file = ctx.job_dir / JOB_FILE
            if not job_file.is_file():
                raise MMAgentError(
                    f"{ctx.job_dir} is not a rendered job (no {JOB_FILE})",
                    field="job",
                    fix="pass the directory `mm-agent render --out` wrote",
                )
            spec = load_job_spec(job_file, ctx.root)
            if req.model and req.model != spec.model:
                spec = spec.model_copy(update={"model": req.model})
            if req.mm_version:
                spec = spec.model_copy(update={"mm_version": req.mm_version})
            # With a workspace, every path of the job (mm_root, save_path, ...) must lie inside it: a job
            # rendered earlier with an outside mm_root is refused here, never probed.
            ctx.job = resolve_job(spec, ctx.job_dir, base=base, registry=reg, root=ctx.root)
            ctx.model, ctx.task, ctx.version = ctx.job.entry, ctx.job.task, ctx.job.version
            ctx.size = ctx.job.size
            ctx.npus_per_node, ctx.nnodes, ctx.tp = ctx.job.npus_per_node, ctx.job.nnodes, ctx.job.tp
            ctx.num_workers = ctx.job.num_workers
            ctx.runtime, ctx.device = ctx.job.runtime, ctx.job.device
            ctx.num_workers_source = (
                f"{JOB_FILE} num_workers"
                if spec.num_workers is not None
                else "the stock example's (registry)"
            )
        else:
            version = reg.versions.get(reg.check_version(req.mm_version or reg.versions.default))
            assert version is not None  # check_version raised otherwise
            ctx.version = version
            if req.model:
                ctx._resolve_model(req.model, req.task, req.size)
        ctx._resolve_mm_root()
        ctx._resolve_master_port(spec.master_port if spec else None)
        if req.python:
            python = interpreter_path(req.python, ctx.root, base)
            check_interpreter(python)  # a script, shell or other program is refused, never run
            ctx.python, ctx.python_source = str(python), "--python"
            if ctx.judges_agent_env:
                ctx.python_source += ", mm-agent's own interpreter"
        elif ctx.job is not None and ctx.runtime == "bundled":
            ctx._use_job_interpreter()
        else:
            ctx._find_training_env()
        return ctx

    @property
    def judges_agent_env(self) -> bool:
        """The judged interpreter is mm-agent's own, for a MindSpeed-MM run: its fixes must not change it."""
        return self.runtime == "mindspeed-mm" and self.no_env is None and is_agent_env(self.python)

    def _find_training_env(self) -> None:
        """A MindSpeed-MM run's training environment when the request names none (`trainenv.py`): the first
        candidate that is not mm-agent's own; with a workspace one outside it is named, not probed."""
        try:
            checkout = self.checkout()
        except MMAgentError:
            checkout = None  # mm_checkout reports it
        found = search(self.env, checkout)
        self.passed_over = found.passed_over
        for cand in found.found:
            try:
                python = interpreter_path(cand.python, self.root, self.base)
                check_interpreter(python)
            except MMAgentError as exc:
                if self.root is not None and not inside(Path(cand.python).parent, self.root):
                    self.python, self.python_source = cand.python, cand.source
                    self.no_env = NoTrainingEnv(
                        f"the training environment {cand.python} ({cand.source}) lies outside the workspace: "
                        "not probed",
                        "pass python=<venv>/bin/python of a training env inside the workspace, or have the "
                        "operator allow its folder (`mm-agent serve --allow-path DIR`); on the machine itself "
                        f"`mm-agent doctor --python {shlex.quote(cand.python)}` judges it",
                        [*self.passed_over, f"{cand.source}: {cand.python}"],
                    )
                    return
                self.passed_over.append(f"{cand.source}: {cand.python} not taken ({exc.message})")
                continue
            self.python, self.python_source = str(python), cand.source
            return
        self.agent_fallback = True
        self.python_source = "mm-agent's own interpreter (no training environment named or found)"

    def _use_job_interpreter(self) -> None:
        """A bundled job runs `"$PYTHON" -m runtime.*`, PYTHON defaulting to the interpreter that rendered
        it (PYTHON_DEFAULT in its scripts): check that one. One that cannot run is the job's problem
        (`runtime_install` fails); one the doctor may not run here (outside the workspace) is a warning."""
        from mm_agent.jobs.jobdir import load_stage

        assert self.job_dir is not None
        value = self.env.get("PYTHON")
        source = "$PYTHON (overrides the scripts' PYTHON_DEFAULT)"
        if not value:
            try:
                stage = load_stage(self.job_dir, "train", self.root)
            except MMAgentError as exc:
                self.python_problem = (
                    "warn",
                    f"cannot read the job's interpreter: {exc.message}",
                    exc.fix or "",
                )
                return
            value = stage.var("PYTHON")
            source = f"PYTHON_DEFAULT in the job's {stage.script.name}"
        if not value:
            return
        if os.path.abspath(value) == os.path.abspath(sys.executable):
            self.python_source = f"{source}, mm-agent's own interpreter"
            return
        fix = "re-render the job from the environment that has mm-agent[runtime], or set PYTHON"
        if not os.access(value, os.X_OK):
            self.python_problem = (
                "fail",
                f"the job's scripts run {value} ({source}): not an executable",
                fix,
            )
            return
        try:
            python = interpreter_path(value, self.root, self.base)
            check_interpreter(python)
        except MMAgentError as exc:
            self.python_problem = (
                "warn",
                f"the job's scripts run {value} ({source}), not probed here: {exc.message}; checked "
                f"{self.python} instead",
                f"{fix}; or run `mm-agent doctor --job ... --python {shlex.quote(value)}` where that interpreter may run",
            )
            return
        self.python, self.python_source = str(python), source

    def _resolve_model(self, model: str, task: str | None, size: str | None) -> None:
        entry = self.registry.get(model)
        if not entry.versions.contains(self.version.id):
            raise MMAgentError(
                f"{entry.id} is not in MindSpeed-MM {self.version.id} (it exists in {entry.versions.describe()})",
                field="mm_version",
                fix=f"pass --mm-version with a version that has {entry.id}",
            )
        self.model = entry
        if task:
            self.task = entry.task(task)
            if self.task is None:
                have = sorted({t.id for t in entry.tasks})
                raise MMAgentError(
                    f"{entry.id} has no task {task!r}", field="task", fix=f"use one of: {', '.join(have)}"
                )
        else:
            self.task = entry.tasks[0]
        if size:
            self.size = entry.size(size)
            if self.size is None:
                raise MMAgentError(
                    f"{entry.id} has no size {size!r}",
                    field="size",
                    fix=f"use one of: {', '.join(s.id for s in entry.sizes)}",
                )
        else:
            allowed = [s for s in entry.sizes if self.task.sizes is None or s.id in self.task.sizes]
            self.size = (allowed or entry.sizes)[0]
        par = self.size.parallel_at(self.version.id, self.task.id, self.task.backend)  # this version's layout
        self.npus_per_node, self.nnodes, self.tp = par.npus_per_node, par.nnodes, par.tp

    def _resolve_mm_root(self) -> None:
        env_root = self.env.get("MM_ROOT")
        if self.req.mm_root:
            self.mm_root, self.mm_root_source = self._path(self.req.mm_root, "mm_root"), "--mm-root"
        elif self.job is not None:
            # The rendered scripts run `cd "${MM_ROOT:-<job mm_root>}"`: mirror that.
            if env_root:
                self.mm_root, self.mm_root_source = (
                    Path(env_root).expanduser(),
                    "$MM_ROOT (overrides the job's)",
                )
                self.mm_root_from_env = True
            else:
                self.mm_root, self.mm_root_source = Path(self.job.mm_root), "job.yaml mm_root"
        elif env_root:
            self.mm_root, self.mm_root_source = Path(env_root).expanduser(), "$MM_ROOT"
            self.mm_root_from_env = True
        elif (self.base / "MindSpeed-MM").is_dir():
            self.mm_root, self.mm_root_source = self.base / "MindSpeed-MM", "./MindSpeed-MM"
        elif (self.base / "mindspeed_mm").is_dir():
            self.mm_root, self.mm_root_source = self.base, "current directory"

    def _resolve_master_port(self, job_port: int | None) -> None:
        env_port = self.env.get("MASTER_PORT", "")
        if self.req.master_port is not None:
            self.master_port, self.master_port_source = self.req.master_port, "--master-port"
        elif job_port is not None:
            self.master_port, self.master_port_source = job_port, "job.yaml master_port"
        elif env_port.isdigit() and 0 < int(env_port) < 65536:
            self.master_port, self.master_port_source = int(env_port), "$MASTER_PORT"

    def device_choice(self) -> tuple[str, str]:
        """The bundled runtime's device (npu | cuda | cpu | auto) and where that comes from: job.yaml `device`
        (the scripts pass it as --device) wins over $MM_AGENT_DEVICE, as in `runtime.device.requested_device`."""
        if self.device not in (None, "auto"):
            return str(self.device), "job.yaml device (the scripts pass --device)"
        env = self.env.get("MM_AGENT_DEVICE", "").strip().lower()
        if env and env != "auto":
            return env, "$MM_AGENT_DEVICE"
        return "auto", "job.yaml device unset or auto: the runtime picks NPU, then CUDA, then CPU"

    # ------------------------------------------------------------------------------------------------
    # paths at use

    def at_use(self, path: Path, field: str) -> Path:
        """A path taken from the request or the job, checked again where a check uses it: with a workspace
        it must still lie inside it (a folder swapped for a symlink since the job was resolved is caught
        here). The refusal becomes that check's `fail`, with the fix."""
        if self.root is not None and not inside(path, self.root):
            raise MMAgentError(
                f"{field} {path} lies outside {where(self.root)}; the doctor does not look there",
                field=field,
                fix="put it inside the workspace and re-render the job (the server operator can allow "
                "another root with `mm-agent serve --allow-path DIR`)",
            )
        return path

    def checkout(self) -> Path | None:
        """The MindSpeed-MM checkout to inspect, confined at use; only the operator's own $MM_ROOT is taken
        as it is (a ./MindSpeed-MM in the workspace may be a symlink leading anywhere)."""
        if self.mm_root is None or self.mm_root_from_env:
            return self.mm_root
        return self.at_use(self.mm_root, "mm_root")

    def job_path(self, attr: str) -> Path:
        """A path of the rendered job (save_path, feature_dir, ...), confined at use."""
        assert self.job is not None
        return self.at_use(Path(getattr(self.job, attr)), attr)

    # ------------------------------------------------------------------------------------------------
    # shared probes

    def remaining(self) -> float:
        """Seconds left of this run's probe budget (at least a sliver, so a late probe still answers)."""
        return max(0.2, self.deadline - time.monotonic())

    def _once(self, key: str, fn: Callable[[], T]) -> T:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._cache:
                try:
                    self._cache[key] = fn()
                except Exception as exc:  # remembered, so every check reports the same failure
                    self._cache[key] = exc
            value = self._cache[key]
        if isinstance(value, Exception):
            raise value
        return value

    def _overlay_names(self) -> tuple[list[str], list[str]]:
        """(every package the model overlay names, those installed from git whose commit matters)."""
        overlay = self.overlay()
        if overlay is None:
            return [], []
        from packaging.utils import canonicalize_name

        names: list[str] = []
        from_git: list[str] = [canonicalize_name(s.name) for s in overlay.git_sources]
        for spec in overlay.pins():
            req = requirement(spec)
            if req is not None:
                names.append(req.name)
                if req.url:
                    from_git.append(req.name)
        return names + from_git, from_git

    def dist_names(self) -> list[str]:
        return sorted(
            {
                *BASE_DISTS,
                MM_AGENT_DIST,
                *requirement_names(),
                *self.version.base_pins,
                *self._overlay_names()[0],
            }
        )

    def pyenv(self) -> EnvProbe:
        """Packages of the judged interpreter. Raises ProbeError when it cannot be probed, NoTrainingEnv (one)
        when no training environment is judged (`trainenv.py`)."""
        env = self._once("training_env", self._training_env)
        self._probed.used = True
        return env

    def judged(self) -> str | None:
        """'judged: <interpreter> (<why that one>)' when the calling check read the judged interpreter's probe."""
        if not getattr(self._probed, "used", False):
            return None
        return f"judged: {self.python} ({self.python_source})"

    def _training_env(self) -> EnvProbe:
        if self.no_env is not None:
            raise self.no_env
        env = self._probe()
        if self.agent_fallback and not any(d in env.dists for d in MM_DISTS):
            self.python_source = "no training environment named or found; mm-agent's own has no MindSpeed-MM"
            raise NoTrainingEnv(
                "no MindSpeed-MM training environment named or found; mm-agent's own environment is not "
                "judged as one",
                "pass the training environment's interpreter: `mm-agent doctor --python <env>/bin/python` "
                "(MCP: python=...), or activate that env so its `torchrun` is on PATH",
                [
                    f"mm-agent runs in {self.python} (Python {env.python}; torch {env.dists.get('torch', '-')}), "
                    f"which has no {' or '.join(MM_DISTS)} installed",
                    *self.passed_over,
                ],
            )
        if self.agent_fallback:
            self.python_source = "mm-agent's own interpreter, which has MindSpeed-MM installed"
        return env

    def _probe(self) -> EnvProbe:
        request = {
            "dists": self.dist_names(),
            "requires": ["torch_npu", MM_AGENT_DIST],
            "direct_url": ["mindspeed", "mindspeed_mm", *self._overlay_names()[1]],
            "modules": list(PROBED_MODULES),
            "files": PROBED_FILES,
        }
        return self._once(
            "probe",
            lambda: run_env_probe(
                self.python, request, env=self.env, timeout_s=self.remaining(), scope=self.scope
            ),
        )

    def npu(self) -> NpuSmiInfo | None:
        """`npu-smi info` parsed; None when npu-smi is not installed."""
        return self._once("npu", lambda: query(timeout_s=self.remaining(), scope=self.scope))

    def listeners(self) -> dict[int, set[int | None]]:
        return self._once("listeners", procs.listening_ports)

    def records(self) -> dict[int, procs.ProcRecord]:
        return self._once("records", procs.live_records)

    def nics(self) -> tuple[dict[str, list[Any]], dict[str, Any]]:
        """psutil's (net_if_addrs, net_if_stats): read once, so the IFNAME check and the node fingerprint
        (`fingerprint.py`) describe the same NICs."""
        import psutil

        return self._once("nics", lambda: (psutil.net_if_addrs(), psutil.net_if_stats()))

    def overlay(self) -> Any:
        return self.model.deps_for(self.version.id) if self.model else None


__all__ = ["Context", "NoTrainingEnv", "ProbeError", "requirement"]
