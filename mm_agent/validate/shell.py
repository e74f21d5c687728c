"""Static reading of a launch script: top-level variable values and the torchrun/python command.

The stock MindSpeed-MM scripts set variables (`TP=1`, `GBS=$(($MBS*$GRAD_ACC_STEP*$DP))`), build flag
strings (`GPT_ARGS="--tensor-model-parallel-size ${TP} \\ ..."`) and run
`torchrun $DISTRIBUTED_ARGS pretrain_sora.py $GPT_ARGS $MM_ARGS ...`. We replay the assignments in order
and expand the command's words, so every flag value the job will see is known (or marked unknown).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mm_agent.validate.shell_expand import Env, Expander, matching

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?=)(.*)$", re.S)
_DECLARE = ("export", "readonly", "local", "declare", "typeset")
_REDIRECT = re.compile(r"^\d*(?:[<>]{1,2}|&>|>&|<&)")
_OPENERS = {"if", "for", "while", "until", "case", "select"}
_CLOSERS = {"fi", "done", "esac"}
_LAUNCHERS = {"torchrun", "python", "python3", "deepspeed", "accelerate", "msrun"}
_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")
# Commands that run the command after them (`stdbuf -oL torchrun ...`): wrapper -> (its options that take a
# separate value, positional words it reads before the command).
_WRAPPERS: dict[str, tuple[frozenset[str], int]] = {
    "nohup": (frozenset(), 0),
    "exec": (frozenset({"-a"}), 0),
    "env": (frozenset({"-u", "--unset", "-C", "--chdir"}), 0),
    "stdbuf": (frozenset({"-i", "-o", "-e", "--input", "--output", "--error"}), 0),
    "timeout": (frozenset({"-s", "--signal", "-k", "--kill-after"}), 1),
    "nice": (frozenset({"-n", "--adjustment"}), 0),
    "ionice": (frozenset({"-c", "-n", "--class", "--classdata"}), 0),
    "taskset": (frozenset(), 1),
    "numactl": (frozenset({"-N", "-m", "-C", "-p", "-i"}), 0),
    "setsid": (frozenset(), 0),
}
_CD_VAR = re.compile(r'"?\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?"?')  # `cd "$VAR"`, `cd ${VAR}`
_FLAG_EQ = re.compile(r"""^["']?(--[A-Za-z0-9][\w-]*)=""")


@dataclass
class Statement:
    text: str
    line: int


@dataclass
class LaunchCommand:
    line: int
    launcher: str
    entry: str | None
    launcher_flags: dict[str, list[str | None]]
    flags: dict[str, list[str | None]]
    positionals: list[str | None]
    has_unknown: bool
    # the working directory it starts in: `cd` ran before it (cd_line), to `cwd` (None: not known statically);
    # `cd "$MM_ROOT"` with MM_ROOT from the environment: cwd None, cd_var "MM_ROOT" (the validator may know it)
    cd_line: int | None = None
    cwd: str | None = None
    cd_var: str | None = None

    def value(self, flag: str) -> str | None:
        values = self.flags.get(flag)
        return values[0] if values else None


@dataclass
class ScriptInfo:
    path: str
    text: str
    env: Env = field(default_factory=dict)
    var_lines: dict[str, int] = field(default_factory=dict)
    commands: list[LaunchCommand] = field(default_factory=list)
    delegates: list[tuple[str | None, int]] = field(default_factory=list)  # `bash other.sh`: (path, line)

    def flag_line(self, flag: str) -> int | None:
        pattern = re.compile(rf"(?:^|[\s\"']){re.escape(flag)}(?:[\s=\"'\\]|$)")
        for number, text in enumerate(self.text.splitlines(), 1):
            if pattern.search(text.split("#", 1)[0] if not text.lstrip().startswith("#") else ""):
                return number
        return None


def split_statements(text: str) -> list[Statement]:
    """Split script text into simple commands (at newlines, ; && || | &), dropping comments."""
    out: list[Statement] = []
    buf: list[str] = []
    start_line = line = 1
    heredocs: list[str] = []
    i = 0

    def emit() -> None:
        stmt = "".join(buf).strip()
        if stmt:
            out.append(Statement(stmt, start_line))
            heredocs.extend(_HEREDOC.findall(stmt))
        buf.clear()

    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            buf.append(text[i : i + 2])
            line += text[i + 1] == "\n"
            i += 2
            continue
        if c in "'\"`" or text.startswith("$(", i) or text.startswith("${", i):
            end = _quoted_end(text, i)
            chunk = text[i:end]
            buf.append(chunk)
            line += chunk.count("\n")
            i = end
            continue
        if c == "#" and (not buf or buf[-1][-1:].isspace() or buf[-1][-1:] in ";|&("):
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl
            continue
        if c == "\n" or c == ";" or (c in "|&" and not _is_redirect_amp(text, i)):
            emit()
            if c == "\n":
                line += 1
                if heredocs:
                    i, line = _skip_heredocs(text, i + 1, line, heredocs)
                    start_line = line
                    continue
            i += 2 if text[i : i + 2] in ("&&", "||", ";;") else 1
            start_line = line
            continue
        if not buf or not "".join(buf).strip():
            start_line = line
        buf.append(c)
        i += 1
    emit()
    return out


def _is_redirect_amp(text: str, i: int) -> bool:
    return text[i] == "&" and ((text[i - 1 : i] in "<>" and i > 0) or text[i + 1 : i + 2] == ">")


def _quoted_end(text: str, i: int) -> int:
    c = text[i]
    if c == "'":
        j = text.find("'", i + 1)
        return len(text) if j < 0 else j + 1
    if c == "`":
        j = i + 1
        while j < len(text) and text[j] != "`":
            j += 2 if text[j] == "\\" else 1
        return j + 1
    if c == '"':
        j = i + 1
        while j < len(text) and text[j] != '"':
            if text[j] == "\\":
                j += 2
            elif text.startswith("$(", j) or text.startswith("${", j):
                j = _quoted_end(text, j)
            else:
                j += 1
        return j + 1
    bracket = text[i + 1]
    return matching(text, i + 1, bracket, ")" if bracket == "(" else "}") + 1


def _skip_heredocs(text: str, i: int, line: int, heredocs: list[str]) -> tuple[int, int]:
    while heredocs and i < len(text):
        nl = text.find("\n", i)
        end = len(text) if nl < 0 else nl
        if text[i:end].strip() == heredocs[0]:
            heredocs.pop(0)
        i, line = end + 1, line + 1
    heredocs.clear()
    return i, line


def split_words(stmt: str) -> list[str]:
    """Split a statement into raw (unexpanded) words, keeping quotes and $(...) intact."""
    words: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(stmt):
        c = stmt[i]
        if c == "\\" and i + 1 == len(stmt):
            i += 1  # `\` + newline before a `| tee` on the next line: the statement ends here
        elif c == "\\" and i + 1 < len(stmt):
            if stmt[i + 1] == "\n":
                if cur:
                    words.append("".join(cur))
                    cur = []
            else:
                cur.append(stmt[i : i + 2])
            i += 2
        elif c in "'\"`" or stmt.startswith("$(", i) or stmt.startswith("${", i):
            end = _quoted_end(stmt, i)
            cur.append(stmt[i:end])
            i = end
        elif c.isspace():
            if cur:
                words.append("".join(cur))
                cur = []
            i += 1
        else:
            cur.append(c)
            i += 1
    if cur:
        words.append("".join(cur))
    return words


def parse_flags(tokens: list[str | None]) -> tuple[dict[str, list[str | None]], list[str | None]]:
    """`--flag v1 v2 --bool --k=v pos` → ({flag: [v1, v2], bool: [], k: [v]}, [pos-before-flags])."""
    flags: dict[str, list[str | None]] = {}
    positionals: list[str | None] = []
    current: str | None = None
    for token in tokens:
        if token is not None and token.startswith("--") and len(token) > 2:
            name, eq, value = token.partition("=")
            flags.setdefault(name, [])
            if eq:
                flags[name].append(value)
                current = None
            else:
                current = name
        elif current is not None:
            flags[current].append(token)
        else:
            positionals.append(token)
    return flags, positionals


def parse_script(path: str, text: str) -> ScriptInfo:
    info = ScriptInfo(path=path, text=text)
    expander = Expander(info.env, path)
    depth = 0
    cd_line: int | None = None
    cwd: str | None = None
    cd_var: str | None = None
    pushed: list[tuple[int | None, str | None, str | None]] = []
    for stmt in split_statements(text):
        words = split_words(stmt.text)
        while words and words[0] in ("then", "do", "else", "{", "!", "time"):
            words = words[1:]
        if not words:
            continue
        head = words[0]
        if head in _OPENERS or re.match(r"^(function\s|[A-Za-z_][\w-]*\(\))", stmt.text):
            depth += 1
            continue
        if head in _CLOSERS or head == "}":
            depth = max(0, depth - 1)
            continue
        if head in _DECLARE or all(_ASSIGN.match(w) for w in words):
            _assign(info, expander, words, stmt.line, conditional=depth > 0)
            continue
        if head in ("cd", "pushd"):
            if head == "pushd":
                pushed.append((cd_line, cwd, cd_var))
            target = expander.word(words[1]) if len(words) > 1 else [None]
            cd_line = stmt.line
            cwd = target[0] if len(target) == 1 and depth == 0 else None
            var = _CD_VAR.fullmatch(words[1]) if len(words) > 1 and depth == 0 else None
            cd_var = var.group(1) if var else None
            continue
        if head == "popd":
            cd_line, cwd, cd_var = pushed.pop() if pushed and depth == 0 else (stmt.line, None, None)
            continue
        run = _unwrap(expander, words)
        if run and run[0] in ("bash", "sh") and len(run) > 1 and not run[1].startswith("-"):
            target = expander.word(run[1])
            if len(target) == 1 and (target[0] is None or target[0].endswith(".sh")):
                info.delegates.append((target[0], stmt.line))
            continue
        command = _launch(expander, words, stmt.line)
        if command is not None:
            command.cd_line, command.cwd, command.cd_var = cd_line, cwd, cd_var
            info.commands.append(command)
    return info


def _assign(info: ScriptInfo, expander: Expander, words: list[str], line: int, *, conditional: bool) -> None:
    if words[0] in _DECLARE:
        words = [w for w in words[1:] if not w.startswith("-")]
    for word in words:
        m = _ASSIGN.match(word)
        if not m:
            continue
        name, op, raw = m.groups()
        value = expander.text(raw) if raw else ""
        if op == "+=" and value is not None:
            old = info.env.get(name, "")
            value = None if old is None else old + value
        info.env[name] = None if conditional else value
        info.var_lines[name] = line


_PYTHON = re.compile(r"^python(?:\d+(?:\.\d+)*)?$")
_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _unwrap(expander: Expander, words: list[str]) -> list[str]:
    """The command words after leading assignments and wrappers (`A=1 nohup stdbuf -oL torchrun ...`)."""
    while words:
        while words and _ASSIGN.match(words[0]):
            words = words[1:]
        head = expander.word(words[0]) if words else []
        name = (head[0] if len(head) == 1 and head[0] else words[0] if words else "").rsplit("/", 1)[-1]
        if name not in _WRAPPERS:
            return words
        takes_value, positionals = _WRAPPERS[name]
        rest = words[1:]
        while rest and rest[0].startswith("-") and rest[0] != "--":
            rest = rest[2:] if rest[0] in takes_value else rest[1:]
        if rest and rest[0] == "--":
            rest = rest[1:]
        while rest and name == "env" and _ASSIGN.match(rest[0]):
            rest = rest[1:]
        words = rest[positionals:]
    return words


def _launch(expander: Expander, words: list[str], line: int) -> LaunchCommand | None:
    """The launch command of a statement: `torchrun ... x.py`, `python x.py`, `python -m pkg.mod`, or
    `"$PYTHON" -m torch.distributed.run ... -m pkg.mod` (torchrun by module, as the bundled runtime's
    scripts launch); the launcher word itself may be a variable."""
    words = _unwrap(expander, words)
    if not words:
        return None
    head = expander.word(words[0])
    name = (head[0] if len(head) == 1 and head[0] else words[0]).rsplit("/", 1)[-1]
    launcher = "python" if _PYTHON.match(name) else name
    if launcher not in _LAUNCHERS:
        return None
    tokens: list[str | None] = []
    skip_next = False
    for word in words[1:]:
        if skip_next:
            skip_next = False
            continue
        if _REDIRECT.match(word):
            skip_next = bool(re.fullmatch(r"\d*(?:[<>]{1,2}|&>)", word))
            continue
        expanded = expander.word(word)
        flag_eq = _FLAG_EQ.match(word)
        if flag_eq and expanded == [None]:
            expanded = [flag_eq.group(1), None]  # `--flag=$UNKNOWN`: the flag is there, its value unknown
        tokens.extend(expanded)
    if launcher == "python" and len(tokens) >= 2 and tokens[0] == "-m" and tokens[1] in _TORCHRUN_MODULES:
        launcher, tokens = "torchrun", tokens[2:]
    # the entry is the first script or `-m module`, whichever comes first (a module's own arguments may name
    # .py files, e.g. runtime.user_train --predictor-file DIT.py)
    script_at = next((k for k, t in enumerate(tokens) if t is not None and t.endswith(".py")), None)
    module_at = tokens.index("-m") + 1 if "-m" in tokens else None
    starts = [k for k in (script_at, module_at) if k is not None]
    entry_at = min(starts) if starts else None
    if entry_at is None or entry_at >= len(tokens):
        return None
    before, entry, after = tokens[:entry_at], tokens[entry_at], tokens[entry_at + 1 :]
    if before and before[-1] == "-m":
        before = before[:-1]
    flags, positionals = parse_flags(after)
    launcher_flags, _ = parse_flags(before)
    return LaunchCommand(
        line=line,
        launcher=launcher,
        entry=entry,
        launcher_flags=launcher_flags,
        flags=flags,
        positionals=positionals,
        has_unknown=any(t is None for t in tokens),
    )
