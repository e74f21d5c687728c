"""`mm-agent doctor` / `check_environment` on this machine (no NPU, no CANN, no torch) and against real
fakes of what cannot exist here: an `npu-smi` script first on PATH, CANN/driver trees in tmp, a MindSpeed-MM
checkout, package metadata on PYTHONPATH, busy ports held by real processes, a rendered job."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from mcp import Client

from mm_agent import procs
from mm_agent.cli import main
from mm_agent.doctor import CHECKS, DoctorReport, DoctorRequest, check_environment
from mm_agent.doctor.checks_multinode import ifname_matches
from mm_agent.doctor.checks_resources import model_params
from mm_agent.doctor.models import CheckResult
from mm_agent.doctor.registry import Check
from mm_agent.errors import MMAgentError
from mm_agent.npu_smi import parse
from mm_agent.registry import get_registry
from mm_agent.render import RenderRequest, render_job
from mm_agent.server import build_server

LISTENER = (
    "import socket, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(120)\n"
)

# `npu-smi info` of an A2/A3 box (two chips per NPU, Phy-ID column) with one NPU process, as in public
# vllm-ascend issue reports; the Warning health on NPU 1 is ours.
NPU_SMI_A3 = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 25.3.rc1                 Version: 25.3.rc1                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     Ascend910           | OK            | 163.6       30                0    / 0             |
| 0     0                   | 0000:9D:00.0  | 0           0    / 0          3180 / 65536         |
+------------------------------------------------------------------------------------------------+
| 0     Ascend910           | OK            | -           30                0    / 0             |
| 1     1                   | 0000:9F:00.0  | 0           0    / 0          2896 / 65536         |
+===========================+===============+====================================================+
| 1     Ascend910           | {health}       | 164.5       29                0    / 0             |
| 0     2                   | 0000:99:00.0  | 0           0    / 0          3141 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name       | Process memory(MB)    | Process id in container |
+===========================+===============+====================================================+
| 0       0                 | {pid}        | python3.1          | 197                   | NA                      |
+===========================+===============+====================================================+
| No running processes found in NPU 1                                                            |
+===========================+===============+====================================================+
"""

# The 910B layout: one chip per NPU, no Phy-ID column, no process table.
NPU_SMI_910B = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.1                   Version: 24.1.1                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B4               | OK            | 88.2        30                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          26838/ 32768         |
+===========================+===============+====================================================+
| 1     910B4               | OK            | 87.0        30                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          29356/ 32768         |
+===========================+===============+====================================================+
"""


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ambient MM/CANN/HCCL settings, state in tmp, cwd in tmp (so ./MindSpeed-MM is not picked up)."""
    for var in (
        "MM_ROOT",
        "MASTER_PORT",
        "ASCEND_HOME_PATH",
        "ASCEND_TOOLKIT_HOME",
        "ASCEND_RT_VISIBLE_DEVICES",
        "ATB_HOME_PATH",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "HCCL_IF_BASE_PORT",
        "HCCL_HOST_SOCKET_PORT_RANGE",
        "HCCL_NPU_SOCKET_PORT_RANGE",
        "HCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "MM_AGENT_ASCEND_BASE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)


def listen(started: list[subprocess.Popen[bytes]], *, own: bool) -> tuple[int, int]:
    argv = [sys.executable, "-c", LISTENER]
    proc = (
        procs.spawn(argv, purpose="test", stdout=subprocess.PIPE)
        if own
        else subprocess.Popen(argv, stdout=subprocess.PIPE)
    )
    started.append(proc)
    assert proc.stdout is not None
    return proc.pid, int(proc.stdout.readline())


def run(*checks: str, **fields: object) -> dict[str, CheckResult]:
    report = check_environment(DoctorRequest(checks=list(checks) or None, **fields))  # type: ignore[arg-type]
    return {c.id: c for c in report.checks}


def put_on_path(monkeypatch: pytest.MonkeyPatch, folder: Path, name: str, script: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    exe.write_text(script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}:{__import__('os').environ['PATH']}")


def fake_dist(site: Path, name: str, version: str, direct_url: dict | None = None) -> None:
    """A real installed-distribution record (dist-info) that importlib.metadata finds on PYTHONPATH."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def fake_git(repo: Path, commit: str, branch: str = "main", tag: str | None = None) -> None:
    git = repo / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(f"ref: refs/heads/{branch}\n")
    (git / "refs" / "heads" / branch).write_text(commit + "\n")
    if tag:
        (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{commit} refs/tags/{tag}\n")


def fake_mm_checkout(root: Path, megatron: tuple[int, int, int] = (0, 12, 1)) -> Path:
    (root / "mindspeed_mm").mkdir(parents=True)
    for entry in get_registry().versions.get("26.0.0").root_entry_points:  # type: ignore[union-attr]
        (root / entry).write_text("import mindspeed.megatron_adaptor\n")
    core = root / "megatron" / "core"
    core.mkdir(parents=True)
    (root / "megatron" / "__init__.py").write_text("")
    (core / "package_info.py").write_text(
        f"MAJOR = {megatron[0]}\nMINOR = {megatron[1]}\nPATCH = {megatron[2]}\nPRE_RELEASE = ''\n"
    )
    return root


# ---------------------------------------------------------------------------------------------------------


def test_every_check_reports_on_this_machine() -> None:
    report = check_environment(DoctorRequest())
    assert [c.id for c in report.checks] == list(CHECKS)
    assert len(CHECKS) >= 25
    for c in report.checks:
        assert c.status in {"ok", "warn", "fail", "skip"}
        assert "crashed" not in c.summary, c
        assert c.fix or c.status in {"ok", "skip"}, f"{c.id} {c.status} without a fix"
    assert sum(report.counts.values()) == len(CHECKS)
    assert report.ok is (report.counts["fail"] == 0)
    # mm-agent's own venv is judged only when MindSpeed-MM is in it; else python_source says none was
    assert report.machine.agent_python == sys.executable
    assert report.machine.python in {platform.python_version(), "-"} and report.machine.python_source
    assert report.machine.mm_version == get_registry().versions.default


def test_a_crashing_check_becomes_a_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(ctx: object) -> object:
        raise ZeroDivisionError("probe math went wrong")

    monkeypatch.setitem(CHECKS, "explodes", Check("explodes", "always raises", explode))  # type: ignore[arg-type]
    results = run("explodes", "master_port")
    boom = results["explodes"]
    assert boom.status == "fail"
    assert "'explodes' crashed" in boom.summary and "ZeroDivisionError: probe math went wrong" in boom.summary
    assert boom.fix and "bug in mm-agent" in boom.fix
    assert results["master_port"].status == "ok"


def test_busy_master_port_names_the_holder(started: list[subprocess.Popen[bytes]]) -> None:
    pid, port = listen(started, own=False)
    check = run("master_port", master_port=port)["master_port"]
    assert check.status == "fail" and f"PID {pid}" in check.summary
    assert any(f"PID {pid}" in e and "socket" in e for e in check.evidence)
    assert check.fix and f"kill {pid}" in check.fix and "mm-agent stop" not in check.fix
    assert "--master-port" in check.fix

    own_pid, own_port = listen(started, own=True)
    check = run("master_port", master_port=own_port)["master_port"]
    assert check.status == "fail" and check.fix and f"mm-agent stop {own_pid}" in check.fix


def test_busy_hccl_port_range(
    started: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, port = listen(started, own=False)
    monkeypatch.setenv("HCCL_IF_BASE_PORT", str(port))
    check = run("hccl_ports")["hccl_ports"]
    assert check.status == "fail" and any(f"PID {pid}" in e for e in check.evidence)
    assert check.fix and "export HCCL_IF_BASE_PORT=" in check.fix
    monkeypatch.setenv("HCCL_HOST_SOCKET_PORT_RANGE", "auto")
    assert run("hccl_ports")["hccl_ports"].status == "ok"


def test_npu_smi_parser_both_layouts() -> None:
    a3 = parse(NPU_SMI_A3.format(health="Warning", pid="632268"))
    assert a3.version == "25.3.rc1"
    assert [(c.npu, c.chip, c.phy_id) for c in a3.chips] == [(0, 0, 0), (0, 1, 1), (1, 0, 2)]
    assert [c.hbm_used_mb for c in a3.chips] == [3180, 2896, 3141] and a3.chips[0].hbm_total_mb == 65536
    assert [c.health for c in a3.unhealthy] == ["Warning"]
    [proc] = a3.processes
    assert (proc.npu, proc.chip, proc.pid, proc.name, proc.memory_mb) == (0, 0, 632268, "python3.1", 197)

    b = parse(NPU_SMI_910B)
    assert [(c.npu, c.chip, c.phy_id, c.name) for c in b.chips] == [
        (0, 0, None, "910B4"),
        (1, 0, None, "910B4"),
    ]
    assert b.chips[1].hbm_used_mb == 29356 and b.processes == []


def test_fake_npu_smi_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = NPU_SMI_A3.format(health="Warning", pid="632268")
    put_on_path(monkeypatch, tmp_path / "bin", "npu-smi", f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\n")
    report = check_environment(DoctorRequest(checks=["npu_devices", "npu_nic_port", "driver_version"]))
    results = {c.id: c for c in report.checks}
    assert report.machine.npus == 3
    npus = results["npu_devices"]
    assert npus.status == "warn" and "3 NPU(s)" in npus.summary
    assert "NPU 0 chip 1 (phy 1): Ascend910 OK, HBM 2896/65536 MB" in npus.evidence
    assert any("PID 632268" in e for e in npus.evidence)
    nic = results["npu_nic_port"]  # PID 632268 is on device 0, which a job on this node uses
    assert nic.status == "fail" and any("632268" in e for e in nic.evidence)
    assert nic.fix and "HCCL_NPU_SOCKET_PORT_RANGE" in nic.fix

    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,7")
    check = run("npu_devices")["npu_devices"]
    assert check.status == "fail" and "[7]" in check.summary

    critical = NPU_SMI_A3.format(health="Critical", pid="632268")
    put_on_path(monkeypatch, tmp_path / "bin2", "npu-smi", f"#!/bin/sh\ncat <<'EOF'\n{critical}EOF\n")
    assert run("npu_devices")["npu_devices"].status == "fail"

    put_on_path(
        monkeypatch,
        tmp_path / "bin3",
        "npu-smi",
        "#!/bin/sh\necho 'dcmi module initialize failed. ret is -8005' >&2\nexit 9\n",
    )
    check = run("npu_devices")["npu_devices"]
    assert check.status == "fail" and "exited 9" in check.summary and "dcmi" in check.summary


def test_fake_npu_smi_process_table_names_our_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[subprocess.Popen[bytes]]
) -> None:
    pid, _ = listen(started, own=True)
    text = NPU_SMI_A3.format(health="OK     ", pid=str(pid).ljust(6))
    put_on_path(monkeypatch, tmp_path / "bin", "npu-smi", f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\n")
    [holder] = procs.device_holders()
    assert holder.device == "NPU 0 chip 0" and holder.memory_mb == 197
    assert holder.process.pid == pid and holder.process.started_by_mm_agent
    assert f"mm-agent stop {pid}" in holder.process.stop_hint


def make_cann(base: Path, version: str) -> tuple[Path, Path, Path]:
    cann = base / "cann"
    (cann / "x86_64-linux").mkdir(parents=True)
    (cann / "x86_64-linux" / "ascend_toolkit_install.info").write_text(
        f"package_name=Ascend-cann-toolkit\nversion={version}\narch=x86_64\n"
    )
    (cann / "set_env.sh").write_text("export ASCEND_HOME_PATH=...\n")
    (cann / "python" / "site-packages").mkdir(parents=True)
    hccl = cann / "lib64"
    hccl.mkdir()
    (hccl / "libhccl.so").write_bytes(b"")
    atb = base / "nnal" / "atb" / "latest" / "atb" / "cxx_abi_1" / "lib"
    atb.mkdir(parents=True)
    (atb / "libatb.so").write_bytes(b"")
    (base / "nnal" / "atb" / "set_env.sh").write_text("export ATB_HOME_PATH=...\n")
    (base / "driver").mkdir()
    (base / "driver" / "version.info").write_text("Version=24.1.rc2\nascendhal_version=7.35.19\n")
    return cann, hccl, atb


def test_fake_cann_tree_seen_via_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "Ascend"
    cann, hccl, atb = make_cann(base, "9.0.0")
    monkeypatch.setenv("MM_AGENT_ASCEND_BASE", str(base))
    ids = ("cann_version", "driver_version", "cann_env", "nnal_env")

    installed_not_sourced = run(*ids)
    assert (
        installed_not_sourced["cann_version"].status == "ok"
        and "9.0.0" in installed_not_sourced["cann_version"].summary
    )
    assert (
        installed_not_sourced["driver_version"].status == "ok"
        and "24.1.rc2" in installed_not_sourced["driver_version"].summary
    )
    env_check = installed_not_sourced["cann_env"]
    assert env_check.status == "fail" and "not sourced" in env_check.summary
    assert env_check.fix and str(cann / "set_env.sh") in env_check.fix  # the script next to the install
    nnal = installed_not_sourced["nnal_env"]
    assert nnal.status == "fail" and nnal.fix and str(base / "nnal" / "atb" / "set_env.sh") in nnal.fix

    monkeypatch.setenv("ASCEND_HOME_PATH", str(cann))
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{hccl}:{atb}")
    overwritten = run("cann_env")["cann_env"]
    assert overwritten.status == "fail" and "overwritten" in overwritten.summary
    monkeypatch.setenv("PYTHONPATH", str(cann / "python" / "site-packages"))
    sourced = run(*ids)
    assert sourced["cann_env"].status == "ok" and sourced["nnal_env"].status == "ok"

    (cann / "x86_64-linux" / "ascend_toolkit_install.info").write_text("version=8.0.RC2\n")
    old = run("cann_version")["cann_version"]
    assert old.status == "warn" and "8.0.RC2" in old.summary and "9.0.0" in old.summary

    (cann / "x86_64-linux" / "ascend_toolkit_install.info").unlink()
    (cann / "version.cfg").write_text("# version: 1.0\ntoolkit_running_version=[7.6.0.1.220:9.0.0]\n")
    cfg = run("cann_version")["cann_version"]
    assert cfg.status == "ok" and cfg.evidence[0] == f"{cann / 'version.cfg'}: version=9.0.0"


def test_mm_checkout_and_megatron_version(tmp_path: Path) -> None:
    root = fake_mm_checkout(tmp_path / "MindSpeed-MM")
    fake_git(root, "a" * 40, tag="v26.0.0")
    good = run("mm_checkout", "megatron_tree", mm_root=str(root))
    assert good["mm_checkout"].status == "ok", good["mm_checkout"]
    assert any("tags v26.0.0" in e for e in good["mm_checkout"].evidence)
    assert good["megatron_tree"].status == "ok" and "0.12.1" in good["megatron_tree"].summary

    other = fake_mm_checkout(tmp_path / "old" / "MindSpeed-MM", megatron=(0, 12, 0))
    fake_git(other, "b" * 40, tag="v2.3.0")
    bad = run("mm_checkout", "megatron_tree", mm_root=str(other))
    assert bad["megatron_tree"].status == "fail" and "0.12.0" in bad["megatron_tree"].summary
    assert bad["megatron_tree"].fix and "git checkout core_v0.12.1" in bad["megatron_tree"].fix
    assert bad["mm_checkout"].status == "warn" and "v2.3.0" in bad["mm_checkout"].summary

    missing = run("mm_checkout", "megatron_tree", mm_root=str(tmp_path / "nowhere"))
    assert missing["mm_checkout"].status == "fail" and missing["megatron_tree"].status == "skip"


def test_another_megatron_on_pythonpath_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = fake_mm_checkout(tmp_path / "MindSpeed-MM")
    # With the runtime extra installed, megatron-core's own `megatron` sits in site-packages: that is the
    # milder "tools outside the checkout import another megatron" warning, not a shadowing failure.
    expected = "warn" if importlib.util.find_spec("megatron") else "ok"
    own = sys.executable  # this interpreter, named: the one whose `megatron` the expectation above found
    assert run("megatron_path", mm_root=str(root), python=own)["megatron_path"].status == expected
    elsewhere = tmp_path / "Megatron-LM"
    (elsewhere / "megatron").mkdir(parents=True)
    (elsewhere / "megatron" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(elsewhere))
    check = run("megatron_path", mm_root=str(root), python=own)["megatron_path"]
    assert check.status == "fail" and str(elsewhere / "megatron") in check.summary


def test_model_overlay_unsatisfied_then_satisfied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Judged in a training venv of its own (a real one, bare): the fix installs into it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True)
    python = str(tmp_path / "env" / "bin" / "python")
    check = run("model_deps", model="wan2.1", mm_version="26.0.0", python=python)["model_deps"]
    assert check.status == "fail" and "diffusers==0.33.1" in check.summary
    assert check.fix and check.fix.startswith("pip install diffusers==0.33.1")
    assert any(e.startswith("known conflict:") and "wan2.2" in e for e in check.evidence)

    site = tmp_path / "site"
    fake_dist(site, "diffusers", "0.33.1")
    monkeypatch.setenv("PYTHONPATH", str(site))
    assert run("model_deps", model="wan2.1", mm_version="26.0.0", python=python)["model_deps"].status == "ok"
    assert run("model_deps", python=python)["model_deps"].status == "skip"


def test_git_pinned_overlay_and_mindspeed_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    ms_src = tmp_path / "MindSpeed"
    (site / "mindspeed").mkdir(parents=True)
    (site / "mindspeed" / "__init__.py").write_text("")
    fake_git(ms_src, "96bc0a3bf3398bf45ac26e0bded95ee174ac449b")
    fake_dist(site, "mindspeed", "0.12.1", {"url": f"file://{ms_src}", "dir_info": {"editable": True}})
    fake_dist(
        site,
        "transformers",
        "4.57.0.dev0",
        {
            "url": "https://github.com/huggingface/transformers.git",
            "vcs_info": {"vcs": "git", "commit_id": "c0dbe09" + "0" * 33},
        },
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    results = run("model_deps", "mindspeed", model="qwen3vl", mm_version="26.0.0")
    assert results["model_deps"].status == "ok", results["model_deps"]
    assert results["mindspeed"].status == "ok" and "96bc0a3bf339" in results["mindspeed"].summary

    fake_git(tmp_path / "wrong", "1234567" + "0" * 33)
    (ms_src / ".git" / "refs" / "heads" / "main").write_text("1234567" + "0" * 33 + "\n")
    wrong = run("mindspeed", model="qwen3vl", mm_version="26.0.0")["mindspeed"]
    assert (
        wrong.status == "fail"
        and wrong.fix == f"`cd {ms_src} && git checkout 96bc0a3bf3398bf45ac26e0bded95ee174ac449b`"
    )


def test_unusable_interpreter_is_a_fail_not_a_crash(tmp_path: Path) -> None:
    """A real interpreter whose installation is broken (its standard library's `encodings` exits at start:
    the probes run with -I -S, so a sitecustomize would no longer run) fails the interpreter checks with the
    fix; a path that is no interpreter at all is refused up front, naming the field."""
    broken = tmp_path / "broken"
    stdlib = broken / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (stdlib / "encodings").mkdir(parents=True)
    (stdlib / "os.py").write_text("")  # the landmark that makes this folder the interpreter's stdlib
    (stdlib / "encodings" / "__init__.py").write_text("raise SystemExit('this environment is broken')\n")
    (broken / "bin").mkdir()
    shutil.copy2(os.path.realpath(sys.executable), broken / "bin" / "python")
    results = run("python_version", "torch_version", "decord", python=str(broken / "bin" / "python"))
    for c in results.values():
        assert c.status == "fail" and "cannot inspect the training interpreter" in c.summary
        assert "this environment is broken" in c.summary
        assert c.fix and "--python" in c.fix

    with pytest.raises(MMAgentError, match="no such file or directory") as missing:
        run("python_version", python=str(tmp_path / "no" / "python"))
    assert missing.value.field == "python" and missing.value.fix and "bin/python" in missing.value.fix


def test_rendered_job_master_port_workers_and_crlf(
    tmp_path: Path, started: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, port = listen(started, own=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    render_job(
        RenderRequest(
            model="wan2.1", task="t2v", out_dir="job", confirm=True, master_port=port, num_workers=0
        ),
        root=ws,
    )
    monkeypatch.chdir(ws)
    results = run("master_port", "crlf_scripts", "shm", "disk_space", "host_ram", job="job")
    assert results["master_port"].status == "fail" and f"PID {pid}" in results["master_port"].summary
    assert "job.yaml master_port" in results["master_port"].evidence[0]
    assert results["crlf_scripts"].status == "ok"
    assert results["shm"].status == "ok" and "num_workers is 0" in results["shm"].summary
    assert any("checkpoints (SAVE_PATH)" in e for e in results["disk_space"].evidence)
    assert any("1.3B params x 2 bytes" in e for e in results["host_ram"].evidence)

    script = ws / "job" / "pretrain.sh"
    script.write_bytes(script.read_bytes().replace(b"\n", b"\r\n"))
    crlf = run("crlf_scripts", job="job")["crlf_scripts"]
    assert crlf.status == "fail" and crlf.evidence == ["pretrain.sh (first CRLF on line 1)"]
    assert crlf.fix and "dos2unix ./pretrain.sh" in crlf.fix

    with pytest.raises(MMAgentError, match="not a rendered job"):
        run(job=str(tmp_path))


def test_ram_estimate_scales_with_size_and_tp() -> None:
    check = run("host_ram", model="wan2.1", size="14b")["host_ram"]
    assert "wan2.1 14b: 14B params x 2 bytes (bf16) = 26.1 GiB" in check.evidence
    assert any("(1 + TP=1) x model = 52.2 GiB" in e for e in check.evidence)
    assert model_params("1.3b") == (1.3e9, "")
    assert model_params("A14B") is not None and "MoE" in model_params("A14B")[1]  # type: ignore[index]
    assert model_params("default") is None
    assert run("host_ram")["host_ram"].status == "skip"


def test_multinode_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run("pdsh", "socket_ifname")["pdsh"].status == "skip"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    multi = {"model": "qwen2.5vl", "size": "32b"}  # registry layout: 2 nodes
    assert run("pdsh", **multi)["pdsh"].status == "fail"
    put_on_path(monkeypatch, tmp_path / "bin", "pdsh", "#!/bin/sh\nexit 0\n")
    assert run("pdsh", **multi)["pdsh"].status == "ok"

    assert run("socket_ifname", **multi)["socket_ifname"].status == "warn"
    monkeypatch.setenv("HCCL_SOCKET_IFNAME", "=no-such-nic0")
    missing = run("socket_ifname", **multi)["socket_ifname"]
    assert missing.status == "fail" and "matches no NIC" in missing.summary
    stats = psutil.net_if_stats()
    up = sorted(n for n in psutil.net_if_addrs() if n != "lo" and n in stats and stats[n].isup)
    if up:
        monkeypatch.setenv("HCCL_SOCKET_IFNAME", f"={up[0]}")
        assert run("socket_ifname", **multi)["socket_ifname"].status == "ok"
    assert ifname_matches("eth,=ib0", ["eth0", "eth1", "ib0", "ib1"]) == ["eth0", "eth1", "ib0"]
    assert ifname_matches("^=eth0", ["eth0", "eth1"]) == ["eth1"]


def test_cli_json_equals_mcp_structured_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--check", "shm", "master_port", "--check", "crlf_scripts", "--json"]) in {0, 1}
    cli = json.loads(capsys.readouterr().out)
    DoctorReport.model_validate(cli)
    assert [c["id"] for c in cli["checks"]] == ["shm", "master_port", "crlf_scripts"]
    mcp = DoctorReport.model_validate(
        check_environment(DoctorRequest(checks=["shm", "master_port", "crlf_scripts"]))
    )
    assert set(cli) == set(mcp.model_dump(mode="json"))
    assert [set(c) for c in cli["checks"]] == [set(c.model_dump()) for c in mcp.checks]


def test_cli_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--check", "crlf_scripts"]) == 0  # skipped without a job: nothing failed
    out = capsys.readouterr().out
    assert "READY" in out and "crlf_scripts" in out
    assert main(["doctor", "--check", "mm_checkout"]) == 1
    out = capsys.readouterr().out
    assert "NOT READY" in out and "To fix:" in out
    assert main(["doctor", "--check", "no_such_check"]) == 2
    assert "unknown check id(s): no_such_check" in capsys.readouterr().err
    assert main(["doctor", "--model", "wan2.3"]) == 2
    assert "unknown model 'wan2.3'" in capsys.readouterr().err
    assert main(["doctor", "--model", "wan2.2", "--mm-version", "2.1.0"]) == 2
    assert "wan2.2 is not in MindSpeed-MM 2.1.0" in capsys.readouterr().err


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_check_environment_and_stop_by_pid(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    own_pid, _ = listen(started, own=True)
    other_pid, _ = listen(started, own=False)
    async with Client(build_server(ws)) as client:
        schemas = {t.name: t.input_schema for t in (await client.list_tools()).tools}

        def args(tool: str, **fields: object) -> dict[str, object]:
            """Flat arguments (with detail=true where the tool has it: the whole model), or wrapped in `req`
            where the tool takes one request object."""
            props = schemas[tool].get("properties", {})
            if "req" in props:
                return {"req": fields}
            return {**fields, "detail": True} if "detail" in props else fields

        r = await client.call_tool(
            "check_environment", args("check_environment", checks=["master_port", "mm_checkout"])
        )
        assert not r.is_error and r.structured_content is not None
        report = r.structured_content  # by id/status: the server's answer may leave other fields out
        assert [c["id"] for c in report["checks"]] == ["mm_checkout", "master_port"] and report["ok"] is False

        r = await client.call_tool("check_environment", args("check_environment", job="/etc"))
        assert r.is_error and "outside the workspace" in r.content[0].text  # type: ignore[union-attr]
        r = await client.call_tool("check_environment", args("check_environment", python="/usr/bin/python3"))
        assert r.is_error and "outside the workspace" in r.content[0].text  # type: ignore[union-attr]

        r = await client.call_tool("stop_job", args("stop_job", pid=own_pid))
        assert not r.is_error and r.structured_content["status"] == "dry_run"
        r = await client.call_tool("stop_job", args("stop_job", pid=other_pid, confirm=True))
        assert r.is_error and "not started by mm-agent" in r.content[0].text  # type: ignore[union-attr]
    assert all(p.poll() is None for p in started), "neither a dry run nor a refusal signals anything"
