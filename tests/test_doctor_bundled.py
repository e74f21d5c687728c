"""`check_environment` on jobs of the bundled runtime: checked for what `python -m runtime.*` uses (Python, the
runtime and mm-agent in the interpreter, torch at a supported version, the runtime extra's packages, the job's
device, decord, disk, /dev/shm, ports), never for CANN, the driver, MindSpeed-MM, Megatron, MindSpeed, the
model's overlay or MindSpeed-MM's torch pin. Real jobs rendered into tmp, this machine's interpreter (.venv:
torch CPU build + decord), a bare venv for the failures, and the MCP tool through an in-process client."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mm_agent.cli import main
from mm_agent.doctor import CHECKS, DoctorReport, DoctorRequest, check_environment
from mm_agent.doctor.bundled import _from_pyproject, runtime_needs
from mm_agent.doctor.checks_bundled import torch_build
from mm_agent.doctor.probes import EnvProbe
from mm_agent.doctor.registry import BOTH, BUNDLED_ONLY, MM_ONLY, check
from mm_agent.render import RenderRequest, render_job
from mm_agent.server import build_server

# What the bundled runtime never uses: the Ascend stack, MindSpeed-MM's checkout and pins, pdsh.
MM_ONLY_IDS = {
    "python_version",
    "torch_version",
    "torch_npu_import",
    "base_deps",
    "model_deps",
    "cann_version",
    "driver_version",
    "npu_devices",
    "cann_env",
    "nnal_env",
    "mm_checkout",
    "megatron_tree",
    "mindspeed",
    "megatron_path",
    "mm_convert",
    "pdsh",
}
BUNDLED_IDS = {"runtime_install", "runtime_torch", "runtime_deps", "runtime_device"}
# What a bundled job is checked for, each actually run (never skipped) for a single-node job.
RUN_FOR_BUNDLED = BUNDLED_IDS | {"decord", "shm", "disk_space", "master_port", "crlf_scripts"}
NOT_USED = "not used by the bundled runtime"
# Checks of this host's current state (a small /dev/shm in a container, a full disk, a port someone holds):
# they may fail on a CI box for reasons that are real there; every other check must pass for the job.
HOST_STATE = {"shm", "disk_space", "host_ram", "master_port", "hccl_ports", "stale_processes"}


def failures(checks: list[Any]) -> list[str]:
    """Ids of the failed checks (models or the server's dicts), host-state checks left out."""
    rows = [c if isinstance(c, dict) else c.model_dump() for c in checks]
    return [c["id"] for c in rows if c["status"] == "fail" and c["id"] not in HOST_STATE]


def _torch_is_cpu_build() -> bool:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    return "cuda: Optional[str] = None" in text


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("MM_ROOT", "MASTER_PORT", "MM_AGENT_DEVICE", "PYTHONPATH", "HCCL_IF_BASE_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workspace with three real rendered jobs: bundled (device unset), bundled on cuda, MindSpeed-MM."""
    ws = tmp_path_factory.mktemp("doctor-bundled") / "ws"
    ws.mkdir()
    for out, extra in (
        ("bundled", {"runtime": "bundled", "master_port": 29731}),
        ("bundled-cuda", {"runtime": "bundled", "device": "cuda", "master_port": 29732}),
        ("mm", {"master_port": 29733}),
    ):
        render_job(
            RenderRequest(model="wan2.1", task="t2v", out_dir=out, confirm=True, **extra),
            root=ws,
        )
    return ws


def doctor(job: Path, **fields: Any) -> tuple[DoctorReport, dict[str, Any]]:
    report = check_environment(DoctorRequest(job=str(job), timeout_s=20, **fields))
    return report, {c.id: c for c in report.checks}


def test_runtime_sets_are_declared_on_every_check() -> None:
    assert {c for c, chk in CHECKS.items() if chk.runtimes == MM_ONLY} == MM_ONLY_IDS
    assert {c for c, chk in CHECKS.items() if chk.runtimes == BUNDLED_ONLY} == BUNDLED_IDS
    assert all(chk.runtimes in (MM_ONLY, BUNDLED_ONLY, BOTH) for chk in CHECKS.values())
    with pytest.raises(ValueError, match="runtimes must be some of"):
        check("new_check", "title", ("docker",))  # type: ignore[arg-type]
    assert "new_check" not in CHECKS


def test_bundled_job_is_ready_on_this_machine(jobs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The job this machine trains (torch CPU + decord in .venv) is ready; nothing MindSpeed-MM-only runs."""
    report, by_id = doctor(jobs / "bundled")
    failed = {c.id: c.summary for c in report.checks if c.status == "fail"}
    assert failures(report.checks) == [], failed
    assert report.ok is (not failed)  # true on a host with room (this one: torch CPU + decord in .venv)
    for cid in MM_ONLY_IDS:
        assert by_id[cid].status == "skip" and by_id[cid].summary == NOT_USED, by_id[cid]
    for cid in RUN_FOR_BUNDLED:  # each one runs (the host-state ones may find this host short)
        assert by_id[cid].status != "skip", by_id[cid]
    assert by_id["runtime_torch"].status == "ok" and "torch 2." in by_id["runtime_torch"].summary
    assert any("needs torch>=" in e for e in by_id["runtime_torch"].evidence)
    install = by_id["runtime_install"]
    assert install.status == "ok" and install.evidence[0].startswith(f"interpreter: {sys.executable} ")
    assert "PYTHON_DEFAULT in the job's pretrain.sh, mm-agent's own interpreter" in install.evidence[0]
    deps = by_id["runtime_deps"]
    assert deps.status == "ok" and any(e.startswith("diffusers>=") for e in deps.evidence)
    device = by_id["runtime_device"]
    assert device.status == "ok" and "device auto" in device.evidence[0]
    assert "job.yaml master_port" in by_id["master_port"].evidence[0]
    # wan2.1 1.3b: 1.3e9 parameters x (fp32 weights + two fp32 AdamW moments) per save
    assert (
        "each save of the bundled runtime (fp32 weights + AdamW state, 12 bytes per parameter) is ~14.5 GiB"
        in (by_id["disk_space"].evidence[0])
    )

    # The CLI reads the same job the same way and exits 0 (READY).
    assert main(["doctor", "--job", str(jobs / "bundled"), "--timeout", "20", "--json"]) == 0
    cli = DoctorReport.model_validate(json.loads(capsys.readouterr().out))
    assert {c.id: c.status for c in cli.checks if c.id not in HOST_STATE} == {
        c.id: c.status for c in report.checks if c.id not in HOST_STATE
    }


def test_mindspeed_mm_job_is_checked_as_before(jobs: Path) -> None:
    """The same model rendered for MindSpeed-MM still needs CANN, the driver, the checkout and torch 2.7.1. Judged
    in mm-agent's own interpreter (named: otherwise it is not judged), the fix is a training env of its own."""
    report, by_id = doctor(jobs / "mm", python=sys.executable)
    assert report.ok is False
    for cid in ("cann_version", "driver_version", "npu_devices", "mm_checkout", "torch_version", "mindspeed"):
        assert by_id[cid].status == "fail" and by_id[cid].fix, by_id[cid]
    assert "2.7.1" in by_id["torch_version"].summary
    assert "mm-agent itself runs in that environment" in (by_id["torch_version"].fix or "")
    assert "(weights only, --no-save-optim)" in by_id["disk_space"].evidence[0]
    for cid in BUNDLED_IDS:
        assert by_id[cid].status == "skip" and "bundled runtime only" in by_id[cid].summary
    assert by_id["python_version"].status in {"ok", "warn"}


def test_bundled_job_on_cuda_fails_the_device_check_here(jobs: Path) -> None:
    if not _torch_is_cpu_build():
        pytest.skip("this interpreter's torch is not a CPU-only build")
    report, by_id = doctor(jobs / "bundled-cuda")
    assert failures(report.checks) == ["runtime_device"] and report.ok is False
    device = by_id["runtime_device"]
    assert "CPU-only build" in device.summary and "cuda" in device.summary.lower()
    assert device.fix and "--device cpu" in device.fix and "CUDA build of torch" in device.fix
    assert device.evidence[0].startswith("device cuda (job.yaml device")
    assert by_id["hccl_ports"].status == "skip" and "nccl" in by_id["hccl_ports"].summary


def test_the_device_fix_command_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-render command in the fix, run as it is written, gives a job this machine passes."""
    if not _torch_is_cpu_build():
        pytest.skip("this interpreter's torch is not a CPU-only build")
    monkeypatch.chdir(tmp_path)
    req = RenderRequest(
        model="wan2.1", task="t2v", runtime="bundled", device="cuda", out_dir="job", confirm=True
    )
    render_job(req)
    _, by_id = doctor(tmp_path / "job", checks=["runtime_device"])
    fix = by_id["runtime_device"].fix or ""
    command = fix.split("`")[-2]  # the last `...` of the fix
    assert command.startswith("mm-agent render --from ") and command.endswith("--device cpu")
    assert main(shlex.split(command)[1:]) == 0
    _, by_id = doctor(tmp_path / "job", checks=["runtime_device"])
    assert by_id["runtime_device"].status == "ok" and by_id["runtime_device"].summary.startswith("CPU:")


def test_device_from_the_environment_and_a_bare_interpreter(
    jobs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$MM_AGENT_DEVICE=npu without torch_npu fails with the fix; the interpreter the scripts run ($PYTHON
    over their PYTHON_DEFAULT) is the one checked: without the runtime it fails every bundled check with a
    fix, and still none of the MindSpeed-MM-only ones; one that does not exist fails runtime_install."""
    monkeypatch.setenv("MM_AGENT_DEVICE", "npu")
    _, by_id = doctor(jobs / "bundled", checks=["runtime_device"])
    npu = by_id["runtime_device"]
    assert npu.status == "fail" and "torch_npu is not installed" in npu.summary
    assert npu.fix and "export MM_AGENT_DEVICE=cpu" in npu.fix  # the device came from there, not job.yaml
    assert npu.evidence[0].startswith("device npu ($MM_AGENT_DEVICE)")
    monkeypatch.delenv("MM_AGENT_DEVICE")

    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    monkeypatch.setenv("PYTHON", str(venv / "bin" / "python"))
    _, by_id = doctor(jobs / "bundled")
    assert by_id["runtime_install"].evidence[0].startswith(f"interpreter: {venv / 'bin' / 'python'} ")
    assert "$PYTHON (overrides the scripts' PYTHON_DEFAULT)" in by_id["runtime_install"].evidence[0]
    for cid in ("runtime_install", "runtime_torch", "runtime_deps", "runtime_device", "decord"):
        assert by_id[cid].status == "fail" and by_id[cid].fix, by_id[cid]
    assert "No module named runtime" in by_id["runtime_install"].summary
    assert "pip install -c constraints.txt" in (by_id["runtime_install"].fix or "")
    assert by_id["runtime_torch"].summary == "torch is not installed"
    assert "diffusers>=" in by_id["runtime_deps"].summary
    decord = by_id["decord"]  # the runtime has no other video reader: no video_reader_type way out
    assert "bundled runtime decodes clips with decord" in decord.evidence[0]
    assert decord.fix and "video_reader_type" not in decord.fix
    assert all(by_id[cid].status == "skip" for cid in MM_ONLY_IDS)
    # A `runtime` package that is not mm-agent's, with a FIFO where train.py belongs: named, never waited on.
    planted = next((venv / "lib").glob("python3*/site-packages")) / "runtime"
    planted.mkdir()
    for name in ("__init__.py", "extract.py", "sample.py"):
        (planted / name).write_text("")
    os.mkfifo(planted / "train.py")
    start = time.monotonic()
    _, by_id = doctor(jobs / "bundled", checks=["runtime_install"])
    assert time.monotonic() - start < 10
    assert f"runtime at {planted} is not mm-agent's (no train.py)" in by_id["runtime_install"].summary

    # --python names the interpreter explicitly and wins over $PYTHON.
    _, by_id = doctor(jobs / "bundled", python=sys.executable, checks=["runtime_install"])
    assert by_id["runtime_install"].status == "ok" and "; --python)" in by_id["runtime_install"].evidence[0]

    monkeypatch.setenv("PYTHON", str(tmp_path / "gone" / "python"))
    _, by_id = doctor(jobs / "bundled", checks=["runtime_install"])
    gone = by_id["runtime_install"]
    assert gone.status == "fail" and "not an executable" in gone.summary and gone.fix and "PYTHON" in gone.fix


def test_cuda_build_without_a_driver_and_auto_falling_back(
    jobs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA build of torch (a real dist-info and torch/version.py on PYTHONPATH, found before the .venv's)
    on a machine without the NVIDIA driver fails `cuda` before anything imports torch; with `auto` and a
    torch_npu that cannot load (that torch is empty), the runtime falls back to the CPU and doctor says so."""
    if any(Path(f).exists() for f in ("/proc/driver/nvidia/version", "/dev/nvidiactl")):
        pytest.skip("this machine has an NVIDIA driver")
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text("__version__ = '2.7.1+cu128'\ncuda: Optional[str] = '12.8'\n")
    for name, version in (("torch", "2.7.1+cu128"), ("torch_npu", "2.7.1")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    monkeypatch.setenv("PYTHONPATH", str(site))

    _, by_id = doctor(jobs / "bundled-cuda", checks=["runtime_device", "runtime_torch"])
    device = by_id["runtime_device"]
    assert device.status == "fail" and "no NVIDIA driver" in device.summary, device
    assert "CUDA 12.8 build" in device.evidence[1] and device.fix and "--device cpu" in device.fix
    assert by_id["runtime_torch"].status == "ok" and "2.7.1+cu128" in by_id["runtime_torch"].summary

    _, by_id = doctor(jobs / "bundled", checks=["runtime_device"])
    auto = by_id["runtime_device"]
    assert auto.status == "ok" and auto.summary.startswith("auto picks the CPU"), auto
    assert any(e.startswith("NPU not usable (import torch_npu fails)") for e in auto.evidence), auto.evidence


def test_runtime_needs_come_from_pyproject() -> None:
    """The installed metadata and the checkout's pyproject.toml (the fallback without an install) agree."""
    if sys.version_info < (3, 11):
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11+)")
    installed, source = runtime_needs(), _from_pyproject()
    assert source is not None and "metadata" in installed.source
    assert {str(r) for r in installed.requirements} == {str(r) for r in source.requirements}
    assert installed.requires_python == source.requires_python
    torch = installed.get("torch")
    assert torch is not None and not torch.specifier.contains("2.5.1") and torch.specifier.contains("2.13.0")


def test_torch_build_read_from_version_py() -> None:
    def probe(text: str | None) -> EnvProbe:
        files = {} if text is None else {"torch/version.py": text}
        return EnvProbe(python="3.11.7", executable="python", prefix="/", machine="x86_64", files=files)

    cuda = "__version__ = '2.7.1+cu128'\ncuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n"
    assert torch_build(probe(cuda)) == {"cuda": "12.8", "hip": None}
    assert torch_build(probe("cuda = None\nrocm = '6.3'\n")) == {"cuda": None, "rocm": "6.3"}
    assert torch_build(probe(None)) == {}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _arguments(schema: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """The tool's arguments: flat (with detail=true: the whole report), or wrapped in `req` where the server
    takes one request object."""
    props = schema.get("properties", {})
    if "req" in props:
        return {"req": fields}
    return {**fields, "detail": True} if "detail" in props else fields


@pytest.mark.anyio
async def test_mcp_gives_the_same_report(jobs: Path) -> None:
    direct, _ = doctor(jobs / "bundled")
    async with Client(build_server(jobs)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        schema = tools["check_environment"].input_schema
        r = await client.call_tool(
            "check_environment", _arguments(schema, {"job": "bundled", "timeout_s": 20})
        )
        assert not r.is_error, r.content
        cuda = await client.call_tool(
            "check_environment", _arguments(schema, {"job": "bundled-cuda", "timeout_s": 20})
        )
        assert not cuda.is_error, cuda.content
    # Compared by id, status and summary: the answer the server sends may leave other fields out.
    report = r.structured_content
    assert report is not None and failures(report["checks"]) == []
    assert report["ok"] is (not any(c["status"] == "fail" for c in report["checks"]))
    # (host-state checks may change between the two calls: another process takes a port, a run starts)
    assert {c["id"]: c["status"] for c in report["checks"] if c["id"] not in HOST_STATE} == {
        c.id: c.status for c in direct.checks if c.id not in HOST_STATE
    }
    skipped = {c["id"]: c["summary"] for c in report["checks"] if c["status"] == "skip"}
    assert skipped == {c.id: c.summary for c in direct.checks if c.status == "skip"}
    assert {cid for cid, why in skipped.items() if why == NOT_USED} == MM_ONLY_IDS
    if _torch_is_cpu_build():
        assert cuda.structured_content is not None and cuda.structured_content["ok"] is False
        assert failures(cuda.structured_content["checks"]) == ["runtime_device"]
