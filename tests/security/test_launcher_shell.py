"""Shell text from a hostfile or a job directory never becomes a command (issue 25: launchers).

The holes: launch_all.sh's ssh branch prefixed each output line with `sed "s/^/$host: /"`, so a hostfile
line `touch${IFS}canary;:/e;#` became a sed program whose `e` flag ran `touch` on the machine that started
the job; `ssh ... "$host"` had no `--`, so a host `-oProxyCommand=...` was an ssh option. And slurm.sbatch
wrote `#SBATCH --chdir=<job dir>` as it was: sbatch splits a directive line at whitespace (and reads quotes,
backslashes and `#` itself), so a job dir with a space broke the submit and one holding
` --export=ALL,LD_PRELOAD=...` added a directive.

Guarded here with the real rendered scripts, the real bash and GNU sed, and stand-in ssh/pdsh that record
their argv: the exploit line creates no canary and is refused naming its hostfile line; every host form a
cluster uses (names, IPv4, IPv6, user@host) is accepted and reaches ssh after `--`; output is prefixed
without a program that reads the host as code; `validate` reports bad hostfile lines and an #SBATCH --chdir
line sbatch would split, and render refuses a slurm job dir it cannot write safely.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from mm_agent.errors import MMAgentError
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate import ValidateRequest, validate_configs

EXPLOIT = "touch${IFS}canary;:/e;#"
# ssh HOST CMD as a cluster node would answer it: one line of output that sed would have rewritten
SSH = (
    'printf "%s\\0" "$@" > "$(dirname "$0")/ssh.$$"\n'
    'while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done\n'
    "echo 'remote says & \\1 / done'\n"
)
PDSH = 'printf "%s\\0" "$@" > "$(dirname "$0")/pdsh.$$"\n'


def _render(tmp_path: Path, launcher: str, name: str = "job") -> Path:
    out = tmp_path / name
    render_job(
        RenderRequest(
            model="wan2.1",
            task="t2v",
            nnodes=2,
            master_addr="10.0.0.1",
            launcher=launcher,  # type: ignore[arg-type]
            out_dir=str(out),
            confirm=True,
        ),
        root=None,
    )
    return out


def _exe(path: Path, text: str) -> None:
    path.write_text("#!/bin/bash\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _bin(tmp_path: Path, *tools: tuple[str, str]) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, text in tools:
        _exe(folder / name, text)
    return folder


def _calls(folder: Path, tool: str) -> list[list[str]]:
    """The argv of each call of a stand-in (one NUL-separated file per call)."""
    return [p.read_text().split("\0")[:-1] for p in sorted(folder.glob(f"{tool}.*"))]


def _launch(job: Path, hosts: str, folder: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    hostfile = job / "hosts"
    hostfile.write_text(hosts)
    env = {"PATH": f"{folder}:/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(
        ["bash", str(job / "launch_all.sh"), str(hostfile)], env=env, cwd=cwd, capture_output=True, text=True
    )


@pytest.mark.skipif(shutil.which("sed") is None, reason="needs sed (GNU sed has the `e` flag)")
def test_sed_e_flag_host_line_runs_nothing_and_is_refused_by_its_line(tmp_path: Path) -> None:
    job = _render(tmp_path, "pdsh")
    folder = _bin(tmp_path, ("ssh", SSH))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run = _launch(job, f"# cluster\nnode-a\n{EXPLOIT}\n", folder, cwd)
    assert not (cwd / "canary").exists(), "a hostfile line ran as a command"
    assert list(tmp_path.rglob("canary")) == []
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert f"{job / 'hosts'} line 3" in run.stderr and "fix:" in run.stderr, run.stderr
    assert _calls(folder, "ssh") == [], "no node may start while the hostfile has a bad line"


@pytest.mark.parametrize(
    "bad",
    [
        "-oProxyCommand=touch${IFS}canary",  # an ssh option, not a host
        "$(touch canary)",
        "node-a;touch canary",
        "node[01-02]",  # pdsh would expand it into more hosts than the hostfile lists
        "^/etc/passwd",  # pdsh -w ^FILE reads hosts from a file
        "a,b",
        "node-a\r",  # a CRLF hostfile: the name would be `node-a\r`
        "user@",
        "@node-a",
    ],
)
def test_hostfile_lines_that_are_not_hosts_are_refused(tmp_path: Path, bad: str) -> None:
    job = _render(tmp_path, "pdsh")
    folder = _bin(tmp_path, ("ssh", SSH), ("pdsh", PDSH))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run = _launch(job, f"node-a\n{bad} slots=8\n", folder, cwd)
    assert run.returncode == 2 and "line 2" in run.stderr and "fix:" in run.stderr, (bad, run.stderr)
    assert _calls(folder, "ssh") == [] and _calls(folder, "pdsh") == []
    assert list(tmp_path.rglob("canary")) == []


def test_every_host_form_reaches_ssh_after_double_dash_and_output_is_prefixed_verbatim(
    tmp_path: Path,
) -> None:
    job = _render(tmp_path, "pdsh")  # two nodes: the forms are tried two at a time
    folder = _bin(tmp_path, ("ssh", SSH))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for first, second in [
        ("node-a", "10.0.0.2"),
        ("fe80::1", "2001:db8::7%eth0"),
        ("alice@gpu07.cluster.local", "bob_1@node_b"),
    ]:
        for old in folder.glob("ssh.*"):
            old.unlink()
        run = _launch(job, f"{first}\n{second} slots=8\n", folder, cwd)
        assert run.returncode == 0, run.stderr
        calls = _calls(folder, "ssh")
        assert len(calls) == 2
        # ssh OPTIONS -- HOST COMMAND: the host is never read as an option
        assert all(argv[:4] == ["-o", "BatchMode=yes", "--", argv[3]] and len(argv) == 5 for argv in calls)
        assert {argv[3] for argv in calls} == {first, second}, calls
        # each node's output line, prefixed with its host, exactly as the node printed it
        for host in (first, second):
            assert f"{host}: remote says & \\1 / done" in run.stdout.splitlines(), run.stdout
        # MASTER_ADDR is node 0's address, without a user@ prefix
        assert f"master {first.split('@')[-1]}:" in run.stdout, run.stdout


def test_pdsh_gets_the_host_as_w_and_the_command_after_double_dash(tmp_path: Path) -> None:
    job = _render(tmp_path, "pdsh")
    folder = _bin(tmp_path, ("pdsh", PDSH))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run = _launch(job, "node-a\nnode-b\n", folder, cwd)
    assert run.returncode == 0, run.stderr
    calls = _calls(folder, "pdsh")
    assert sorted(argv[1] for argv in calls) == ["node-a", "node-b"]
    for argv in calls:
        assert argv[0] == "-w" and argv[2] == "--" and argv[3].startswith("cd "), argv


def test_validate_reports_bad_hostfile_lines_in_the_job_and_in_a_named_hostfile(tmp_path: Path) -> None:
    job = _render(tmp_path, "pdsh")
    assert validate_configs(ValidateRequest(paths=[str(job)])).error_count == 0
    (job / "hosts").write_text(f"# nodes\nnode-a slots=8\n{EXPLOIT}\n")
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    bad = [f for f in report.findings if f.rule == "launcher.hostfile"]
    assert len(bad) == 1 and bad[0].severity == "error", report.findings
    assert (bad[0].file, bad[0].line) == (str(job / "hosts"), 3) and "host" in bad[0].fix, bad[0]
    # a hostfile named on its own (anywhere the validator may read) is checked the same way
    named = tmp_path / "cluster.hostfile"
    named.write_text("node-a\n-oProxyCommand=x\nfe80::1\n")
    report = validate_configs(ValidateRequest(paths=[str(named)]))
    found = [(f.rule, f.file, f.line) for f in report.findings if f.severity == "error"]
    assert found == [("launcher.hostfile", str(named), 2)], report.findings
    named.write_text("node-a\nuser@10.0.0.2 slots=8\n")
    assert validate_configs(ValidateRequest(paths=[str(named)])).findings == []


@pytest.mark.parametrize(
    "name",
    [
        "my job",  # a space: sbatch splits the directive there and the submit fails
        "x --export=ALL,LD_PRELOAD=evil.so",  # a directive of its own
        "nbsp\u00a0job",  # (control characters never reach here: request paths are one line)
        'quo"te',
        "back\\slash",
        "hash#job",
    ],
)
def test_slurm_job_dir_sbatch_would_split_is_refused_at_render(tmp_path: Path, name: str) -> None:
    with pytest.raises(MMAgentError) as refused:
        _render(tmp_path, "slurm", name)
    assert refused.value.field == "out_dir" and refused.value.fix, refused.value
    assert "#SBATCH" in refused.value.message
    assert not (tmp_path / name).exists()
    # the other launchers quote the job dir wherever they write it: nothing to refuse
    _render(tmp_path, "pdsh", name)


def test_validate_flags_an_sbatch_chdir_line_sbatch_would_split(tmp_path: Path) -> None:
    job = _render(tmp_path, "slurm")
    assert validate_configs(ValidateRequest(paths=[str(job)])).error_count == 0
    sbatch = job / "slurm.sbatch"
    text = sbatch.read_text()
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("#SBATCH --chdir="))
    sbatch.write_text(text.replace(f"--chdir={job}", f"--chdir={job} --export=ALL,LD_PRELOAD=/tmp/x.so"))
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    bad = [f for f in report.findings if f.rule == "launcher.chdir"]
    assert len(bad) == 1 and bad[0].severity == "error" and bad[0].line == line, report.findings
    assert bad[0].file == str(sbatch) and "out_dir" in bad[0].fix
