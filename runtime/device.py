"""Which accelerator a runtime process uses, and the guard that keeps a broken torch_npu from killing `import torch`.

Order: NPU (torch_npu importable and `torch.npu.is_available()`), then CUDA, then CPU. `--device` (or, below
it, `MM_AGENT_DEVICE`) overrides the choice; asking for a device that is not there is a `RuntimeFailure`
with the fix, never a silent fallback that would run a "GPU" job on the CPU.

Precision: with `--bf16` the NPU always autocasts to bf16, CUDA only when the GPU supports bf16. The CPU
never autocasts, even with `--bf16`: CPU runs are smoke runs of tiny models, bf16 matmuls are emulated (slower
than fp32) on most CPUs, and fp32 keeps CPU losses comparable with a plain PyTorch loop and exactly
reproducible across resumes.

The probes that look for hardware are parameters (`Probes`), so the selection rules are unit-tested on a
machine with neither an NPU nor a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from runtime.errors import RuntimeFailure

if TYPE_CHECKING:
    import torch

DeviceKind = Literal["npu", "cuda", "cpu"]
ENV_VAR = "MM_AGENT_DEVICE"
BACKENDS: dict[str, str] = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
CANN_FIX = (
    "source the CANN environment first (e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh`), "
    "or uninstall torch_npu on machines without an NPU"
)

# Why torch_npu could not be used, set by `guard_torch_npu` (None: absent or working).
_npu_import_error: str | None = None


def guard_torch_npu() -> str | None:
    """Make `import torch` survive a torch_npu that cannot load (no CANN); returns the import error, if any.

    torch >= 2.5 auto-loads torch_npu on `import torch` and dies with "Failed to load the backend extension"
    when CANN's libraries are missing; diffusers/transformers then also fail because they only check that
    the package exists. So: turn auto-loading off, try the import ourselves, and on failure poison
    `sys.modules["torch_npu"]` so every library sees "no NPU". Call it before anything imports torch.
    """
    global _npu_import_error
    if "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is None:
        return _npu_import_error
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except (ImportError, OSError, RuntimeError) as exc:
        _npu_import_error = f"{type(exc).__name__}: {exc}"
        for name in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")]:
            del sys.modules[name]
        sys.modules["torch_npu"] = None  # type: ignore[assignment]  # find_spec() now returns None
    return _npu_import_error


def _npu_probe() -> tuple[bool, str | None]:
    """(available, why not) for the NPU; the reason is torch_npu's import error when it failed."""
    if _npu_import_error is not None:
        return False, f"torch_npu is installed but cannot be imported ({_npu_import_error})"
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    import torch
    import torch_npu  # noqa: F401

    if not torch.npu.is_available():  # type: ignore[attr-defined]
        return False, "torch_npu imports but torch.npu.is_available() is False (no visible NPU)"
    return True, None


def _cuda_probe() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _cuda_bf16_probe() -> bool:
    import torch

    return bool(torch.cuda.is_bf16_supported())


def _count_probe(kind: str) -> int:
    """Visible accelerators of `kind` on this host."""
    import torch

    return int(torch.npu.device_count() if kind == "npu" else torch.cuda.device_count())  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Probes:
    """How hardware is detected; tests pass their own answers."""

    npu: Callable[[], tuple[bool, str | None]] = field(default=_npu_probe)
    cuda: Callable[[], bool] = field(default=_cuda_probe)
    cuda_bf16: Callable[[], bool] = field(default=_cuda_bf16_probe)
    count: Callable[[str], int] = field(default=_count_probe)


MIB = 1 << 20


@dataclass(frozen=True)
class Device:
    """The chosen device: kind, `name` ("npu:0", "cuda:1", "cpu"), process-group backend, autocast dtype name."""

    kind: DeviceKind
    name: str
    backend: str
    autocast: str | None  # "bfloat16" or None (fp32)

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device(self.name)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        import torch

        return None if self.autocast is None else getattr(torch, self.autocast)

    def peak_memory_mb(self) -> tuple[float, str]:
        """(MiB, what was measured): the accelerator's peak allocated memory of this process, or on CPU the
        process's peak resident set (what a fit/no-fit question is about there)."""
        import torch

        if self.kind == "cuda":
            return torch.cuda.max_memory_allocated(self.torch_device) / MIB, "device allocated"
        if self.kind == "npu":
            return torch.npu.max_memory_allocated(self.torch_device) / MIB, "device allocated"  # type: ignore[attr-defined]
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "host RSS"  # Linux: KiB

    def set_current(self) -> None:
        """Bind this process to its accelerator, as Megatron does before creating the process group."""
        import torch

        if self.kind == "cuda":
            torch.cuda.set_device(self.torch_device)
        elif self.kind == "npu":
            torch.npu.set_device(self.torch_device)  # type: ignore[attr-defined]


def requested_device(cli_value: str | None, env: dict[str, str] | None = None) -> str | None:
    """`--device` wins over `MM_AGENT_DEVICE`; "auto" or nothing means "pick"."""
    env = dict(os.environ) if env is None else env
    value = cli_value if cli_value not in (None, "", "auto") else env.get(ENV_VAR, "")
    value = (value or "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in BACKENDS:
        source = "--device" if cli_value not in (None, "", "auto") else ENV_VAR
        raise RuntimeFailure(
            f"unknown device {value!r}",
            field=source,
            fix="use one of auto, npu, cuda, cpu",
        )
    return value


def pick_device(
    requested: str | None,
    local_rank: int,
    *,
    bf16: bool = False,
    probes: Probes | None = None,
    env: dict[str, str] | None = None,
) -> Device:
    """Choose this rank's device. `requested` is the `--device` value (None/"auto": env override, then detect)."""
    probes = probes or Probes()
    want = requested_device(requested, env)
    npu_ok, npu_why = probes.npu() if want in (None, "npu") else (False, None)
    if want == "npu" and not npu_ok:
        raise RuntimeFailure(f"the NPU was requested but is not usable: {npu_why}", fix=CANN_FIX)
    cuda_ok = probes.cuda() if want in (None, "cuda") and not npu_ok else False
    if want == "cuda" and not cuda_ok:
        raise RuntimeFailure(
            "CUDA was requested but torch.cuda.is_available() is False",
            fix="install a CUDA build of torch and check `nvidia-smi`, or pass --device cpu",
        )
    kind: DeviceKind = "npu" if npu_ok else "cuda" if cuda_ok else "cpu"
    autocast = None
    if bf16 and (kind == "npu" or (kind == "cuda" and probes.cuda_bf16())):
        autocast = "bfloat16"
    if kind != "cpu" and local_rank >= (visible := probes.count(kind)):
        raise RuntimeFailure(
            f"local rank {local_rank} has no {kind.upper()}: {visible} visible on this host",
            field="nproc_per_node",
            fix=f"start at most {visible} process(es) per node (--nproc / NPUS_PER_NODE), or pass --device cpu",
        )
    name = "cpu" if kind == "cpu" else f"{kind}:{local_rank}"
    return Device(kind=kind, name=name, backend=BACKENDS[kind], autocast=autocast)
