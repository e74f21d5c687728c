"""Static script reading (variables, expansion, launch flags) and line-number-keeping parsers."""

from __future__ import annotations

import pytest
from test_validate_support import FIXTURES

from mm_agent.validate.parse import ParseError, json_lines, line_of, parse_json, parse_yaml
from mm_agent.validate.shell import parse_script, split_statements
from mm_agent.validate.shell_expand import Expander, safe_int_eval


def env_of(text: str, path: str = "/jobs/x/run.sh") -> dict[str, str | None]:
    return parse_script(path, text).env


@pytest.mark.parametrize(
    ("text", "name", "value"),
    [
        ("A=1", "A", "1"),
        ('A="x y"', "A", "x y"),
        ("A='$B'", "A", "$B"),
        ("export A=2", "A", "2"),
        ("B=3\nA=${B:-9}", "A", "3"),
        ("A=${UNSET:-9}", "A", "9"),
        ("A=${UNSET}", "A", None),
        ("B=\nA=${B:-7}", "A", "7"),
        ("B=\nA=${B-7}", "A", ""),
        ("N=8\nM=2\nW=$(($N*$M))", "W", "16"),
        ("N=8\nM=2\nW=$((N * M / 3))", "W", "5"),
        ("N=8\nW=$((N % 3 + ${N} - 1))", "W", "9"),
        ("W=$((X * 2))", "W", None),
        ("A=$(date +%s)", "A", None),
        ("A=`hostname`", "A", None),
        ('J="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"', "J", "/jobs/x"),
        ('J="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"', "J", "/jobs"),
        ('J="$(cd "$(dirname "${BASH_SOURCE[0]}")"/.. && pwd)"', "J", "/jobs"),
        ("J=$(cd $(dirname $0); pwd)", "J", "/jobs/x"),
        ('J=$(cd -- "$(dirname -- "$0")" && pwd -P)', "J", "/jobs/x"),
        ('J=$(dirname "$0")', "J", "/jobs/x"),
        ('J="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\nD="$J/data.json"', "D", "/jobs/x/data.json"),
        ("A=1\nA+=2", "A", "12"),
        ("A=1  # comment", "A", "1"),
        ("A=1 B=$((A + 1))", "B", "2"),
        ('if [ -n "$X" ]; then\n  A=2\nfi', "A", None),
        ("A=1\nif true; then A=2; fi", "A", None),
    ],
)
def test_assignments(text: str, name: str, value: str | None) -> None:
    assert env_of(text).get(name, "<unset>") == value


def test_arithmetic() -> None:
    assert safe_int_eval("7 / 2") == 3
    assert safe_int_eval("-7 / 2") == -3
    assert safe_int_eval("2 ** 10") == 1024
    assert safe_int_eval("1 / 0") is None
    assert safe_int_eval("__import__('os')") is None
    assert safe_int_eval("2 ** 1000") is None
    assert safe_int_eval("2 ** 62") == 2**62
    assert safe_int_eval("((10 ** 18) ** 18) ** 18") is None


def test_word_splitting() -> None:
    ex = Expander({"A": "  --x 1   --y  ", "B": "z"}, "/s.sh")
    assert ex.word("$A") == ["--x", "1", "--y"]
    assert ex.word('"$A"') == ["  --x 1   --y  "]
    assert ex.word("pre$B") == ["prez"]
    assert ex.word("$NOPE") == [None]
    assert ex.word("''") == [""]


def test_stock_script_flags_and_lines() -> None:
    path = FIXTURES / "wan21_t2v" / "pretrain.sh"
    info = parse_script(str(path), path.read_text())
    (cmd,) = info.commands
    assert cmd.launcher == "torchrun" and cmd.entry == "pretrain_sora.py" and not cmd.has_unknown
    assert cmd.launcher_flags["--nproc_per_node"] == ["8"]
    assert cmd.flags["--global-batch-size"] == ["8"]
    assert cmd.flags["--mm-model"] == [str(path.parent / "pretrain_model.json")]
    assert cmd.flags["--no-load-optim"] == []
    assert cmd.flags["--load"] == ["./weights/Wan-AI/Wan2.1-T2V-1.3B-Diffusers/transformer/"]
    assert info.env["GBS"] == "8" and info.env["STEP_TIME"] is None
    lines = path.read_text().splitlines()
    assert lines[info.var_lines["GBS"] - 1].startswith("GBS=")
    assert "--global-batch-size" in lines[info.flag_line("--global-batch-size") - 1]
    assert lines[cmd.line - 1].startswith("torchrun")


def test_launch_forms() -> None:
    text = (
        "A=x.yaml\n"
        "python -m torch.distributed.run --nproc_per_node 2 train.py --k=v --multi a b --flag\n"
        "NON_MEGATRON=true torchrun trainer.py $A\n"
        "cat <<EOF > out.txt\ntorchrun fake.py\nEOF\n"
        "bash other.sh\n"
    )
    info = parse_script("/j/r.sh", text)
    assert [c.entry for c in info.commands] == ["train.py", "trainer.py"]
    first, second = info.commands
    assert first.flags == {"--k": ["v"], "--multi": ["a", "b"], "--flag": []}
    assert first.launcher_flags["--nproc_per_node"] == ["2"]
    assert second.positionals == ["x.yaml"]


def test_bundled_runtime_launch_form() -> None:
    """`"$PYTHON" -m torch.distributed.run $ARGS -m runtime.train ...`: torchrun by module, the launcher a
    variable with an env-overridable default, the entry a module; `-m` belongs to neither flag list."""
    text = (
        "PYTHON=${PYTHON:-'/opt/my env/bin/python3.11'}\n"
        "NPUS_PER_NODE=${NPUS_PER_NODE:-2}\n"
        'DISTRIBUTED_ARGS="--nproc_per_node $NPUS_PER_NODE --master_port ${MASTER_PORT:-6000}"\n'
        '"$PYTHON" -m torch.distributed.run $DISTRIBUTED_ARGS -m runtime.train --lr 1e-5 --use-torch-fsdp2\n'
        '"$PYTHON" -m runtime.sample --seed 3\n'
    )
    info = parse_script("/j/pretrain.sh", text)
    assert info.env["PYTHON"] == "/opt/my env/bin/python3.11"
    train, sample = info.commands
    assert (train.launcher, train.entry) == ("torchrun", "runtime.train")
    assert train.launcher_flags == {"--nproc_per_node": ["2"], "--master_port": ["6000"]}
    assert train.flags == {"--lr": ["1e-5"], "--use-torch-fsdp2": []}
    assert (sample.launcher, sample.entry, sample.flags) == ("python", "runtime.sample", {"--seed": ["3"]})
    assert not train.has_unknown and not sample.has_unknown


def test_a_default_inside_double_quotes_is_read_as_bash_reads_it() -> None:
    """Inside `"${X:-word}"` single quotes are plain characters and `$(...)` runs: the old rendered
    `MM_ROOT="${MM_ROOT:-'<path>'}"` ran a `$(...)` in the path while this reader saw a clean path. It now
    sees the quotes (and an unknown value where a command would run); unquoted defaults keep their quotes."""
    assert env_of("X=\"${X:-'/a b/c'}\"")["X"] == "'/a b/c'"
    assert env_of("X=\"${X:-'/a/$(id)'}\"")["X"] is None
    assert env_of('X="${X:-"/a b"}"')["X"] == "/a b"
    assert env_of("Y=1\nX=\"${Y:+'k'}\"")["X"] == "'k'"
    assert env_of("X=${X:-'/a b/$(id)'}")["X"] == "/a b/$(id)"
    # the rendered form: a single-quoted assignment, then a default that names it
    assert env_of('D=\'/a $(id) "b\'\nX="${X:-$D}"')["X"] == '/a $(id) "b'


def test_statements_keep_start_lines() -> None:
    stmts = split_statements('A=1\nB="x\ny"\n\n# c\nrun a \\\n  b | tee log\n')
    assert [(s.line, s.text.split()[0]) for s in stmts] == [(1, "A=1"), (2, 'B="x'), (6, "run"), (7, "tee")]


# ---- parsers ---------------------------------------------------------------------------------------------
def test_json_lines_and_duplicates() -> None:
    text = '{\n  "a": {\n    "b": [1,\n      {"c": 2}]\n  },\n  "s": "x\\"y",\n  "a": 3\n}'
    lines, dups = json_lines(text)
    assert lines["a"] == 2 and lines["a.b"] == 3 and lines["a.b[1]"] == 4 and lines["a.b[1].c"] == 4
    assert lines["s"] == 6
    assert dups == [("a", 7)]
    assert line_of(lines, "a.b[1].missing") == 4
    assert line_of(lines, "zzz") is None


def test_parse_errors_are_values() -> None:
    err = parse_json('{"a": 1,\n}')
    assert isinstance(err, ParseError) and err.line == 2
    err = parse_yaml("a: [1,\n")
    assert isinstance(err, ParseError) and err.line is not None
    ok = parse_yaml("x: &X 1\ny:\n  - 3\n  - {z: *X}\n")
    assert not isinstance(ok, ParseError)
    assert ok.data == {"x": 1, "y": [3, {"z": 1}]}
    assert ok.lines == {"x": 1, "y": 2, "y[0]": 3, "y[1]": 4, "y[1].z": 4}


@pytest.mark.parametrize(
    "prefix",
    [
        "stdbuf -oL ",
        "stdbuf -o L -e L ",
        "nohup ",
        "timeout --signal=KILL 3600 ",
        "timeout -s KILL 10h ",
        "env A=1 B=2 ",
        "A=1 exec ",
        "taskset -c 0-7 ",
        "numactl --cpunodebind=0 -m 0 ",
        "nice -n 5 ionice -c 2 ",
        "/usr/bin/stdbuf -oL nohup ",
    ],
)
def test_a_launch_behind_a_wrapper_is_still_the_launch(prefix: str) -> None:
    text = f"{prefix}torchrun --nproc_per_node 8 pretrain_sora.py --mm-data a.json 2>&1 | tee log.txt\n"
    (cmd,) = parse_script("/j/r.sh", text).commands
    assert (cmd.launcher, cmd.entry) == ("torchrun", "pretrain_sora.py")
    assert cmd.launcher_flags == {"--nproc_per_node": ["8"]} and cmd.flags == {"--mm-data": ["a.json"]}


def test_a_flag_with_an_unknown_value_after_equals_is_kept() -> None:
    """`--mm-data=$X` with X unknown statically: the flag is there (value unknown), not silently dropped."""
    (cmd,) = parse_script("/j/r.sh", 'torchrun pretrain_sora.py --mm-data="$X" --lr=1e-5\n').commands
    assert cmd.flags == {"--mm-data": [None], "--lr": ["1e-5"]} and cmd.has_unknown


def test_a_continuation_before_a_pipe_on_the_next_line_adds_no_value() -> None:
    text = "torchrun pretrain_sora.py --save ./ckpt \\\n    | tee log.txt\n"
    (cmd,) = parse_script("/j/r.sh", text).commands
    assert cmd.flags == {"--save": ["./ckpt"]} and not cmd.has_unknown


def test_a_delegate_behind_a_wrapper_is_followed() -> None:
    info = parse_script("/j/r.sh", "nohup bash other.sh > out.log 2>&1 &\n")
    assert info.delegates == [("other.sh", 1)]
