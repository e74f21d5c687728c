"""Rank tables: `mm-agent ranktable` builds hccl.json from the nodes' hccn.conf, and `validate` checks it."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mm_agent.cli import main
from mm_agent.errors import MMAgentError
from mm_agent.ranktable import (
    HostEntry,
    RankTable,
    RankTableRequest,
    build_ranktable,
    check_ranktable,
    parse_hccn_conf,
)
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate import ValidateRequest, validate_configs


def hccn_conf(node: int, devices: int = 8) -> str:
    """What hccn_tool leaves in /etc/hccn.conf: address/netmask (and other settings) per device."""
    lines = ["# written by hccn_tool"]
    for d in range(devices):
        lines += [
            f"address_{d}=192.168.{d}.{node}",
            f"netmask_{d}=255.255.255.0",
            f"netdetect_{d}=192.168.{d}.254",
        ]
    return "\n".join(lines) + "\n"


def write_hosts(tmp: Path, confs: dict[str, str]) -> Path:
    """A hosts file naming each host's hccn.conf copy (the second left at its default name)."""
    lines = ["# node-rank order", ""]
    for i, (ip, text) in enumerate(confs.items()):
        (tmp / f"{ip}.hccn.conf").write_text(text)
        lines.append(f"{ip} {ip}.hccn.conf  # node {i}" if i == 0 else ip)
    hosts = tmp / "hosts.txt"
    hosts.write_text("\n".join(lines) + "\n")
    return hosts


@pytest.fixture
def hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    return write_hosts(tmp_path, {"10.0.0.1": hccn_conf(1), "10.0.0.2": hccn_conf(2)})


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rendered 2-node x 8-NPU Wan2.1 job; tests copy it."""
    root = tmp_path_factory.mktemp("render")
    render_job(
        RenderRequest(
            model="wan2.1",
            task="t2v",
            nnodes=2,
            npus_per_node=8,
            master_addr="10.0.0.1",
            out_dir=str(root / "job"),
            confirm=True,
        ),
        root=root,
    )
    return root / "job"


def good_table(hosts: Path) -> dict[str, Any]:
    result = build_ranktable(RankTableRequest(hosts_file=str(hosts)))
    return result.table.model_dump(exclude_none=True)


def job_with(rendered: Path, tmp: Path, table: object, name: str = "hccl.json") -> Path:
    job = tmp / "job"
    shutil.copytree(rendered, job)
    (job / name).write_text(json.dumps(table, indent=2) if not isinstance(table, str) else table)
    return job


def ranktable_findings(job: Path) -> list[tuple[str, str, str | None]]:
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    return [(f.rule, f.severity, f.field) for f in report.findings if f.rule.startswith("ranktable.")]


# ---- build and round trip ---------------------------------------------------------------------------------
def test_round_trip_through_a_rendered_two_node_job(hosts: Path, rendered: Path, tmp_path: Path) -> None:
    out = tmp_path / "hccl.json"
    result = build_ranktable(RankTableRequest(hosts_file=str(hosts), out=str(out), confirm=True))
    assert (result.state, result.nnodes, result.npus_per_node, result.world_size) == ("written", 2, 8, 16)
    table = json.loads(out.read_text())
    parsed = RankTable.model_validate(table)
    assert parsed == result.table
    assert (table["version"], table["status"], table["server_count"]) == ("1.0", "completed", "2")
    assert [s["server_id"] for s in table["server_list"]] == ["10.0.0.1", "10.0.0.2"]
    second = table["server_list"][1]["device"]
    assert second[0] == {"device_id": "0", "device_ip": "192.168.0.2", "rank_id": "8"}
    assert [d["rank_id"] for s in table["server_list"] for d in s["device"]] == [str(r) for r in range(16)]
    assert check_ranktable(table, nnodes=2, npus_per_node=8) == []
    job = job_with(rendered, tmp_path, table)
    assert ranktable_findings(job) == []
    # the same table is wrong for a one-node or 16-NPU-per-node job
    assert {p.rule for p in check_ranktable(table, nnodes=1, npus_per_node=8)} == {"ranktable.server_count"}
    assert {p.rule for p in check_ranktable(table, nnodes=2, npus_per_node=16)} == {"ranktable.devices"}


def test_explicit_hosts_and_device_subset(hosts: Path, tmp_path: Path) -> None:
    entries = [
        HostEntry(server_ip="10.0.0.1", hccn_conf=str(tmp_path / "10.0.0.1.hccn.conf")),
        HostEntry(server_ip="10.0.0.2", hccn_conf=str(tmp_path / "10.0.0.2.hccn.conf")),
    ]
    result = build_ranktable(RankTableRequest(hosts=entries, devices=4, out=str(tmp_path / "t.json")))
    assert result.state == "dry run" and not (tmp_path / "t.json").exists()
    assert [d.device_id for d in result.table.server_list[1].device] == ["0", "1", "2", "3"]
    assert [d.rank_id for d in result.table.server_list[1].device] == ["4", "5", "6", "7"]


def test_parse_hccn_conf() -> None:
    assert parse_hccn_conf(hccn_conf(3, devices=2)) == {0: "192.168.0.3", 1: "192.168.1.3"}
    with pytest.raises(MMAgentError) as err:
        parse_hccn_conf(
            "address_0=192.168.0.1\nnetmask_0=255.255.255.0\naddress 1 192.168.1.1\n", file="h.conf"
        )
    assert (err.value.file, err.value.field) == (
        "h.conf",
        "line 3",
    ) and "'address 1 192.168.1.1'" in err.value.message
    with pytest.raises(MMAgentError, match="not an IP address"):
        parse_hccn_conf("address_0=192.168.0.300\n")
    with pytest.raises(MMAgentError, match="set twice"):
        parse_hccn_conf("address_0=192.168.0.1\naddress_0=192.168.0.2\n")


@pytest.mark.parametrize(
    ("confs", "devices", "error", "field"),
    [
        ({"10.0.0.1": hccn_conf(1), "10.0.0.2": hccn_conf(1)}, None, "also 10.0.0.1 device 0's", "address_0"),
        (
            {"10.0.0.1": hccn_conf(1), "10.0.0.2": hccn_conf(2, devices=7)},
            None,
            "different device counts",
            "devices",
        ),
        (
            {"10.0.0.1": hccn_conf(1), "10.0.0.2": hccn_conf(2, devices=7)},
            8,
            "device 7 of 10.0.0.2",
            "address_7",
        ),
        ({"node-a": hccn_conf(1), "10.0.0.2": hccn_conf(2)}, None, "not an IP address", "server_ip"),
        (
            {"10.0.0.1": hccn_conf(1), "10.0.0.2": "address_0=192.168.0.2\nthis is not hccn\n"},
            None,
            "'this is not hccn'",
            "line 2",
        ),
    ],
    ids=["duplicate-device-ip", "device-counts-differ", "device-missing", "server-not-ip", "malformed-line"],
)
def test_build_refuses(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    confs: dict[str, str],
    devices: int | None,
    error: str,
    field: str,
) -> None:
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    hosts = write_hosts(tmp_path, confs)
    with pytest.raises(MMAgentError) as err:
        build_ranktable(
            RankTableRequest(hosts_file=str(hosts), devices=devices, out=str(tmp_path / "o.json"))
        )
    assert error in err.value.message and err.value.field == field and err.value.fix
    assert not (tmp_path / "o.json").exists()


# ---- validation -------------------------------------------------------------------------------------------
def _server_count(t: dict[str, Any]) -> None:
    t["server_count"] = "3"


def _seven_devices(t: dict[str, Any]) -> None:
    t["server_list"][1]["device"].pop()


def _duplicate_rank(t: dict[str, Any]) -> None:
    t["server_list"][1]["device"][0]["rank_id"] = "0"


def _duplicate_ip(t: dict[str, Any]) -> None:
    t["server_list"][1]["device"][3]["device_ip"] = t["server_list"][0]["device"][3]["device_ip"]


def _initializing(t: dict[str, Any]) -> None:
    t["status"] = "initializing"


@pytest.mark.parametrize(
    ("defect", "expected"),
    [
        (_server_count, [("ranktable.server_count", "error", "server_count")]),
        (_seven_devices, [("ranktable.devices", "error", "server_list[1].device")]),
        (
            _duplicate_rank,
            [
                ("ranktable.rank_id", "error", "server_list"),
                ("ranktable.rank_id", "error", "server_list[1].device[0].rank_id"),
            ],
        ),
        (_duplicate_ip, [("ranktable.device_ip", "error", "server_list[1].device[3].device_ip")]),
        (_initializing, [("ranktable.status", "error", "status")]),
    ],
    ids=["server-count", "seven-devices", "duplicate-rank", "duplicate-device-ip", "not-completed"],
)
def test_each_defect_is_named(
    hosts: Path, rendered: Path, tmp_path: Path, defect: Any, expected: list[tuple[str, str, str]]
) -> None:
    table = copy.deepcopy(good_table(hosts))
    defect(table)
    assert (
        sorted((p.rule, "error", p.field) for p in check_ranktable(table, nnodes=2, npus_per_node=8))
        == expected
    )
    job = job_with(rendered, tmp_path, table, name="rank_table_2x8.json")
    assert sorted(ranktable_findings(job)) == expected


def test_unparsable_table(rendered: Path, tmp_path: Path) -> None:
    job = job_with(rendered, tmp_path, '{"status": "completed",}')
    assert ranktable_findings(job) == [("ranktable.json", "error", None)]


def test_rank_table_file_of_a_script(hosts: Path, rendered: Path, tmp_path: Path) -> None:
    """A table outside the job, named by RANK_TABLE_FILE, is checked against that script's launch."""
    job = tmp_path / "job"
    shutil.copytree(rendered, job)
    table = good_table(hosts)
    _seven_devices(table)
    elsewhere = tmp_path / "cluster" / "table.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text(json.dumps(table))
    script = job / "pretrain.sh"
    lines = script.read_text().splitlines()
    script.write_text("\n".join([lines[0], f"export RANK_TABLE_FILE='{elsewhere}'", *lines[1:]]) + "\n")
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    found = [f for f in report.findings if f.rule.startswith("ranktable.")]
    assert [(f.rule, f.file, f.field) for f in found] == [
        ("ranktable.devices", str(elsewhere), "server_list[1].device")
    ]
    elsewhere.unlink()
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    found = [f for f in report.findings if f.rule.startswith("ranktable.")]
    assert [(f.rule, f.severity, f.file, f.field, f.line) for f in found] == [
        ("ranktable.missing", "warning", str(script), "RANK_TABLE_FILE", 2)
    ]


# ---- CLI --------------------------------------------------------------------------------------------------
def test_cli_json_dry_run_then_write(hosts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out" / "hccl.json"
    assert main(["ranktable", str(hosts), "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["state"], result["world_size"]) == ("dry run", 16) and not out.exists()
    assert main(["ranktable", str(hosts), "--out", str(out), "--devices", "4", "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "written"
    assert json.loads(out.read_text())["server_list"][1]["device"][0]["rank_id"] == "4"
    # mm-agent's own file: rewritten when different, left alone when the same
    assert main(["ranktable", str(hosts), "--out", str(out), "--yes"]) == 0
    assert (
        "wrote" in capsys.readouterr().out
        and len(json.loads(out.read_text())["server_list"][0]["device"]) == 8
    )
    assert main(["ranktable", str(hosts), "--out", str(out), "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "unchanged"


def test_cli_never_overwrites_a_users_file(
    hosts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hccl.json"
    out.write_text('{"mine": true}\n')
    for extra in ([], ["--yes"]):
        assert main(["ranktable", str(hosts), "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert "was not written by mm-agent" in err and "fix:" in err and "Traceback" not in err
    assert out.read_text() == '{"mine": true}\n'


def test_cli_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hosts = write_hosts(tmp_path, {"10.0.0.1": "address_0=192.168.0.1\nbroken\n"})
    assert main(["ranktable", str(hosts), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "10.0.0.1.hccn.conf" in err and "Traceback" not in err
    assert main(["ranktable", str(tmp_path / "nope.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "two.txt").write_text("10.0.0.9\n")
    assert main(["ranktable", str(tmp_path / "two.txt")]) == 2
    err = capsys.readouterr().err
    assert "10.0.0.9.hccn.conf: hccn_conf: no such file" in err and "scp <node>:/etc/hccn.conf" in err
    assert main(["ranktable", str(hosts), "--devices", "0"]) == 2
    assert "--devices" in capsys.readouterr().err
