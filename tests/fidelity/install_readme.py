"""A model README's install section, read as the list of install facts it asks for, and the same facts read
from an `install_deps` plan, so the two can be compared (tests/fidelity/test_install_readme.py).

Both sides go through one interpreter: the README's ```shell/```bash blocks under its install heading are split
into commands (comments, `&&`, `;`, pipes and line continuations handled, `cd` followed), and the plan's argv
lists are fed to the same `Reader` with their working directories. A command becomes a `Fact`: the MindSpeed-MM
checkout, Megatron at a tag, MindSpeed at a ref (pip-installed or copied into the checkout), the MindSpeed-MM
install, torch / torch_npu, a pip requirement, a requirements file, a source checkout at a ref, an editable
install, a copy, a script, a conda package. Locations are named by checkout (`mm`, or the cloned repository's
name) so a clone beside MindSpeed-MM and one inside it compare equal. `scripts/install.sh` lines are expanded
with the option table read from that version's own `scripts/install.sh`, so an option the script does not
know (it exits "Unknown parameter") shows up as a fact of its own.

Commands that are not install steps (conda activate, mkdir, running a Python script, a weights download, a
`pip list | grep` check) are dropped here with the reason in `SKIPPED`; everything else that is not
understood becomes an `unknown` fact, which no plan matches, so a README the reader cannot follow fails the
test instead of passing silently.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from tests.fidelity.report_cell import Cell

# Commands that are not install steps, and why they are not compared.
SKIPPED: dict[str, str] = {
    "conda activate": "activates the environment created before; the plan runs every command in it",
    "mkdir": "folders for logs, data and checkpoints; mm-agent's jobs create their own",
    "python": "runs a model script (inference), not an install step",
    "huggingface-cli": "a weights download: the model's download steps, not its install",
    "export": "a shell variable for later commands",
    "echo": "prints text",
    "pip list": "a check that the install worked",
    "vim": "an editor session; the versions it sets are read from its comment",
    "git fetch": "fetches a merge request; the checkout that follows is the step",
    "assignment": "a shell variable (e.g. code_path=...) naming where the code is",
    "pip config": "a pip mirror setting (commented out in the README)",
}

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_INSTALL_HEADING = re.compile(r"环境安装|环境搭建|Installation|Environment Setup", re.I)
_NOT_INSTALL_HEADING = re.compile(r"运行|变量|推理")
_FENCE = re.compile(r"^\s*```\s*([A-Za-z]*)")
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)==([0-9][0-9A-Za-z.+\-]*)")
_SHELL_LANGS = {"", "shell", "bash", "sh"}


@dataclass(frozen=True)
class Fact:
    """One thing an install does. `ref` is compared by prefix when both sides are commit ids."""

    kind: str
    key: str = ""
    ref: str | None = None
    where: str = field(default="", compare=False)
    command: str = field(default="", compare=False)

    def matches(self, other: Fact) -> bool:
        return self.kind == other.kind and self.key == other.key and refs_match(self.ref, other.ref)

    def __str__(self) -> str:
        text = f"{self.kind} {self.key}".strip()
        return f"{text} @{self.ref}" if self.ref else text


def refs_match(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is b
    if _HEX.match(a) and _HEX.match(b):
        return a.startswith(b) or b.startswith(a)
    return a == b


def repo_key(url: str) -> str:
    """`https://github.com/huggingface/diffusers.git` -> `github.com/huggingface/diffusers` (case-folded host)."""
    text = url.removeprefix("git+").split("://", 1)[-1].rstrip("/").removesuffix(".git")
    host, _, path = text.partition("/")
    return f"{host.lower()}/{path}"


def repo_name(url: str) -> str:
    return repo_key(url).rsplit("/", 1)[-1]


# ------------------------------------------------------------------------------------------ README side


@dataclass(frozen=True)
class Section:
    """The install section of one README: where it is and its shell blocks as (first line number, text)."""

    path: Path
    heading: str
    start: int
    end: int
    blocks: list[tuple[int, str]]


def headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index, level, text) of the markdown headings outside code fences (a `# comment` in a block is not one)."""
    out: list[tuple[int, int, str]] = []
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is not None:
            out.append((i, len(match.group(1)), match.group(2)))
    return out


def sections(lines: list[str], wanted: re.Pattern[str]) -> list[tuple[int, int]]:
    """(start, end) line ranges of the headings whose text `wanted` finds, each up to the next of its level."""
    found = headings(lines)
    out: list[tuple[int, int]] = []
    for n, (start, level, text) in enumerate(found):
        if wanted.search(text) and not _NOT_INSTALL_HEADING.search(text):
            end = next((i for i, lv, _ in found[n + 1 :] if lv <= level), len(lines))
            out.append((start, end))
    return out


def install_section(readme: Path) -> Section | None:
    """The first install/environment heading (not "...及运行", not "环境变量") up to the next heading of its level."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    found = sections(lines, _INSTALL_HEADING)
    return _blocks(readme, lines, *found[0]) if found else None


def _blocks(readme: Path, lines: list[str], start: int, end: int) -> Section:
    blocks: list[tuple[int, str]] = []
    current: list[str] | None = None  # the open block's lines (None: outside a block)
    keep = False  # the open block is a shell block
    first = 0
    indent = ""
    for i in range(start, end):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence and current is None:
            current, keep = [], fence.group(1).lower() in _SHELL_LANGS
            first, indent = i + 2, line[: len(line) - len(line.lstrip())]
        elif fence and current is not None:
            if keep:
                blocks.append((first, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
    return Section(readme, lines[start].strip(), start + 1, end, blocks)


def shell_commands(text: str, first_line: int = 1) -> list[tuple[int, str, list[str]]]:
    """(line number, comment, argv) for every simple command: continuations joined, `&&`/`;`/`|` split."""
    out: list[tuple[int, str, list[str]]] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        number = first_line + i
        line = lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        code, comment = _split_comment(line)
        if not code.strip():
            continue
        for part in re.split(r"&&|;|\|\|", code):
            pipeline = part.split("|")
            try:
                argv = shlex.split(pipeline[0])
            except ValueError:
                argv = pipeline[0].split()
            if argv:
                out.append((number, comment, argv))
    return out


def _split_comment(line: str) -> tuple[str, str]:
    """Code and comment of a line (`#` at its start or after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1 :]
    return line, ""


# ------------------------------------------------------------------------------------------ the reader


MM_URL = "gitcode.com/ascend/mindspeed-mm"
MINDSPEED_URL = "gitcode.com/ascend/mindspeed"
MEGATRON_URL = "github.com/nvidia/megatron-lm"


class Reader:
    """Turns commands (argv + working directory, relative to the folder holding MindSpeed-MM) into facts.

    `tree` is the MindSpeed-MM source tree of the version (to tell `cp -r x dir` into an existing folder from
    `cp -r x newname`); `install_sh` is that version's scripts/install.sh option table (flag -> takes a value).
    """

    def __init__(self, tree: Path | None, install_sh: dict[str, bool] | None = None) -> None:
        self.tree = tree
        self.install_sh = install_sh or {}
        self.cwd = "."
        self.roots: dict[str, str] = {}  # folder (relative to the workspace) -> checkout name
        self.refs: dict[str, str | None] = {}  # checkout name -> ref it is at
        self.urls: dict[str, str] = {}  # checkout name -> repo key
        self.facts: list[Fact] = []
        self.command = ""
        self.edited: dict[str, list[str]] = {}  # requirements file -> the versions a `vim` comment sets in it
        self.ref_commands: dict[str, str] = {}  # checkout name -> the command that chose its ref

    # -- paths

    def path(self, text: str, cwd: str | None = None) -> str:
        """`text` as a normalised path (relative to the README's starting folder, or absolute in a plan)."""
        for var in ("${MM_PATH}", "$MM_PATH"):
            if text.startswith(var):
                mm = next((folder for folder, name in self.roots.items() if name == "mm"), "MindSpeed-MM")
                return posixpath.normpath(mm + text[len(var) :])
        return posixpath.normpath(posixpath.join(cwd or self.cwd, text))

    def locate(self, path: str) -> tuple[str, str]:
        """(checkout name, path inside it); the workspace itself is `ws`."""
        best = ("ws", path)
        best_len = -1
        for folder, name in self.roots.items():
            if (path == folder or path.startswith(folder + "/")) and len(folder) > best_len:
                best, best_len = (name, posixpath.relpath(path, folder)), len(folder)
        name, rel = best
        return name, "" if rel == "." else rel

    def loc(self, path: str) -> str:
        name, rel = self.locate(path)
        return f"{name}:{rel}"

    def _exists_in_tree(self, loc: tuple[str, str]) -> bool:
        return loc[0] == "mm" and self.tree is not None and (self.tree / loc[1]).is_dir()

    # -- facts

    def add(
        self, kind: str, key: str = "", ref: str | None = None, where: str = "", command: str = ""
    ) -> None:
        self.facts.append(Fact(kind, key, ref, where, command or self.command))

    def run(self, argv: list[str], *, cwd: str | None = None, comment: str = "", where: str = "") -> None:
        if cwd is not None:
            self.cwd = posixpath.normpath(cwd)
        self.command = shlex.join(argv)
        head = argv[0]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", head):
            return
        if head == "cd":
            self.cwd = self.path(argv[1] if len(argv) > 1 else ".")
            return
        if head in {"pip", "pip3"} or (len(argv) > 2 and argv[1:3] == ["-m", "pip"]):
            self._pip(argv[1:] if head in {"pip", "pip3"} else argv[3:], where)
        elif head == "git":
            self._git(argv[1:], where)
        elif head == "cp":
            self._cp(argv[1:], where)
        elif head in {"bash", "sh"}:
            self._bash(argv[1:], where)
        elif head == "conda":
            self._conda(argv[1:], where)
        elif head == "source":
            self.add("cann", where=where)
        elif head == "vim":
            if len(argv) > 1:
                self.edited[self.path(argv[1])] = [f"{n}=={v}" for n, v in _PIN.findall(comment)]
        elif head.startswith("python") and argv[1:3] == ["-m", "venv"]:
            self.add("env", where=where)
        elif head in {"mkdir", "echo", "export", "huggingface-cli"} or head.startswith("python"):
            return
        else:
            self.add("unknown", " ".join(argv), where=where)

    def _pip(self, args: list[str], where: str) -> None:
        if not args or args[0] != "install":
            if args[:1] in (["list"], ["config"], ["show"]):
                return
            self.add("unknown", "pip " + " ".join(args), where=where)
            return
        args = args[1:]
        index = None
        reqs: list[str] = []
        while args:
            word = args.pop(0)
            if word in {"-e", "--editable"} and args:
                self._editable(self.path(args.pop(0)), where)
            elif word in {"-r", "--requirement"} and args:
                path = self.path(args.pop(0))
                if self.locate(path)[0] != "mindspeed":
                    self.add("requirements", self.loc(path), where=where)
                    for pin in self.edited.pop(path, []):  # the file as the README edited it
                        self._requirement(pin, None, where)
            elif word in {"-c", "--constraint"} and args:
                args.pop(0)
            elif word.startswith(("--extra-index-url", "--index-url", "-i")):
                value = word.split("=", 1)[1] if "=" in word else (args.pop(0) if args else "")
                index = None if "pytorch.org" in value else value
            elif word in {"--only-binary", "--no-binary"}:
                args.pop(0) if args else None
            elif word.startswith("-"):
                continue
            else:
                reqs.append(word)
        for text in reqs:
            self._requirement(text, index, where)

    def _requirement(self, text: str, index: str | None, where: str) -> None:
        base = text.rsplit("/", 1)[-1]
        if base.endswith(".whl"):
            name = canonicalize_name(base.split("-", 1)[0])
            self.add("torch-npu" if name == "torch-npu" else name, where=where)
            return
        try:
            req = Requirement(text)
        except InvalidRequirement:
            self.add("unknown", f"pip install {text}", where=where)
            return
        name = canonicalize_name(req.name)
        if name in {"torch", "torch-npu", "decord"}:
            self.add(name, where=where)
        elif req.url:
            repo, _, ref = req.url.removeprefix("git+").rpartition("@")
            self.add("src", repo_key(repo), ref, where=where)
            self.add("editable", repo_name(repo), where=where)
        else:
            key = f"{name}{req.specifier}" + (f" [{index}]" if index else "")
            self.add("pip", key, where=where)

    def _editable(self, path: str, where: str) -> None:
        name, rel = self.locate(path)
        if name == "mm" and rel == "":
            self.add("mm-install", where=where)
        elif name == "mindspeed" and rel == "":
            self.add(
                "mindspeed", "pip", self.refs.get("mindspeed"), where, self.ref_commands.get("mindspeed", "")
            )
        elif rel == "":
            self.add("editable", name, where=where)
        else:
            self.add("editable", f"{name}:{rel}", where=where)

    def _git(self, args: list[str], where: str) -> None:
        repo_dir = None
        if args[:1] == ["-C"] and len(args) > 1:
            repo_dir = self.path(args[1])
            args = args[2:]
        verb, rest = (args[0], args[1:]) if args else ("", [])
        if verb == "clone":
            self._clone(rest, where)
        elif verb == "checkout" and rest:
            name, _ = self.locate(repo_dir or self.cwd)
            self._checkout(name, rest[-1], where)
        elif verb == "fetch":
            return
        else:
            self.add("unknown", "git " + " ".join(args), where=where)

    def _clone(self, args: list[str], where: str) -> None:
        branch = None
        positional: list[str] = []
        while args:
            word = args.pop(0)
            if word in {"-b", "--branch"} and args:
                branch = args.pop(0)
            elif word == "--depth" and args:
                args.pop(0)
            elif not word.startswith("-"):
                positional.append(word)
        url = positional[0]
        key = repo_key(url)
        folder = self.path(positional[1] if len(positional) > 1 else repo_name(url))
        special = {MM_URL: "mm", MINDSPEED_URL: "mindspeed", MEGATRON_URL: "megatron"}
        name = special.get(key.lower(), repo_name(url))
        self.roots[folder] = name
        self.urls[name] = key
        self.refs[name] = branch
        self.ref_commands[name] = self.command
        if name == "mm":
            self.add("mm", where=where)
        elif name == "mindspeed" and branch is None:
            self.refs[name] = "master"  # its default branch: a clone without -b is at master
        elif name not in {"mindspeed", "megatron"}:
            self.add("src", key, branch, where=where)

    def _checkout(self, name: str, ref: str, where: str) -> None:
        self.refs[name] = ref
        self.ref_commands[name] = self.command
        if name in {"mm", "mindspeed", "megatron", "ws"}:
            return
        key = self.urls.get(name)
        for i in range(len(self.facts) - 1, -1, -1):
            fact = self.facts[i]
            if fact.kind == "src" and fact.key == key:
                self.facts[i] = replace(fact, ref=ref)
                return
        self.add("unknown", f"git checkout {ref} in {name}", where=where)

    def _cp(self, args: list[str], where: str) -> None:
        words = [w for w in args if not w.startswith("-")]
        contents_flag = any(w.startswith("-") and "T" in w for w in args)
        if len(words) != 2:
            self.add("unknown", "cp " + " ".join(args), where=where)
            return
        src_text, dst_text = words
        contents = src_text.endswith("/*") or contents_flag
        src = self.path(src_text.removesuffix("/*"))
        dst = self.path(dst_text)
        src_loc, dst_loc = self.locate(src), self.locate(dst)
        into = dst_text.endswith("/") or (
            posixpath.basename(src) != posixpath.basename(dst)
            and (self._exists_in_tree(dst_loc) or bool(posixpath.splitext(src)[1]))
        )
        if not contents and into:  # `cp -r x dir/` copies x into dir
            dst = posixpath.join(dst, posixpath.basename(src))
            dst_loc = self.locate(dst)
        if src_loc == ("megatron", "megatron") and dst_loc == ("mm", "megatron"):
            self.add("megatron", "", self.refs.get("megatron"), where, self.ref_commands.get("megatron", ""))
        elif src_loc == ("mindspeed", "mindspeed") and dst_loc == ("mm", "mindspeed"):
            self.add(
                "mindspeed", "copy", self.refs.get("mindspeed"), where, self.ref_commands.get("mindspeed", "")
            )
        else:
            self.add("copy", f"{src_loc[0]}:{src_loc[1]} -> {dst_loc[0]}:{dst_loc[1]}", where=where)

    def _bash(self, args: list[str], where: str) -> None:
        if not args:
            return
        script = self.path(args[0])
        name, rel = self.locate(script)
        if (rel == "scripts/install.sh" or rel.endswith("/scripts/install.sh")) and name in {"mm", "ws"}:
            if not any(f.kind == "mm" for f in self.facts):
                self.add("mm", where=where)  # the one-click installer runs in the checkout
            self._install_sh(args[1:], where)
            return
        here = self.locate(self.cwd)[0]
        self.add("script", f"{name}:{rel} in {here}", where=where)

    def _install_sh(self, args: list[str], where: str) -> None:
        """What scripts/install.sh does with these options (its own option table decides what is known)."""
        opts: dict[str, str | bool] = {}
        while args:
            flag = args.pop(0)
            if flag not in self.install_sh:
                self.add("install-sh-unknown-option", flag, where=where)
                if args and not args[0].startswith("-"):
                    args.pop(0)  # its value, if it has one
                continue
            opts[flag] = args.pop(0) if self.install_sh[flag] and args else True
        long = {"-m": "--msid", "-b": "--msbranch", "-mt": "--megatron"}
        opts = {long.get(k, k): v for k, v in opts.items()}
        self.add("torch", where=where)
        self.add("torch-npu", where=where)
        if opts.get("--megatron"):
            self.add("megatron", ref="core_v0.12.1", where=where)
        ref = opts.get("--msid") or opts.get("--msbranch") or "master"
        self.add("mindspeed", "pip", str(ref), where=where)
        self.add("mm-install", where=where)

    def _conda(self, args: list[str], where: str) -> None:
        if args[:1] == ["create"]:
            self.add("env", where=where)
        elif args[:1] == ["activate"]:
            return
        elif args[:1] == ["install"]:
            pkgs = [
                w
                for i, w in enumerate(args[1:])
                if not w.startswith("-") and args[i] not in {"-c", "--channel"}
            ]
            for pkg in pkgs:
                self.add("conda", pkg, where=where)
        else:
            self.add("unknown", "conda " + " ".join(args), where=where)


def install_sh_options(tree: Path) -> dict[str, bool]:
    """scripts/install.sh's `case $1 in` table: flag -> whether it takes a value (`shift 2`)."""
    script = tree / "scripts" / "install.sh"
    if not script.is_file():
        return {}
    table: dict[str, bool] = {}
    for match in re.finditer(r"^\s*((?:-{1,2}[a-z-]+\|?)+)\)\s*(.*?);;", script.read_text(), re.M):
        for flag in match.group(1).split("|"):
            table[flag] = "shift 2" in match.group(2)
    return table


def readme_facts(section: Section, tree: Path) -> list[Fact]:
    reader = Reader(tree, install_sh_options(tree))
    rel = section.path.relative_to(tree).as_posix()
    for first, text in section.blocks:
        for number, comment, argv in shell_commands(text, first):
            reader.run(argv, comment=comment, where=f"{rel}:{number}")
    return reader.facts


def dedupe(facts: Iterable[Fact]) -> list[Fact]:
    """The facts without repeats (a README that clones twice asks for one checkout)."""
    out: list[Fact] = []
    for fact in facts:
        if not any(fact.matches(seen) for seen in out):
            out.append(fact)
    return out


# ------------------------------------------------------------------------------------------ plan side

# Plan steps that stand for one README fact whatever their commands are (a source build of decord on aarch64
# is the README's `pip install decord==0.6.0`; the CANN step is its `source set_env.sh`).
STEP_FACTS = {
    "torch": "torch",
    "torch-npu": "torch-npu",
    "decord": "decord",
    "cann": "cann",
    "create-env": "env",
}


# Where plan_facts expects the plan's checkouts: MindSpeed-MM and the sources side by side in WORKSPACE.
WORKSPACE = "/ws"


def plan_facts(steps: Iterable[object], tree: Path | None) -> list[Fact]:
    """The facts of a plan's steps, planned with `Layout(WORKSPACE + "/MindSpeed-MM", WORKSPACE, ...)`.

    The plan's argv words are absolute paths, so each command is read in its own working directory; a manual
    step's README commands are read from the workspace, as the README's own are.
    """
    reader = Reader(tree)
    for step in steps:
        step_id: str = step.id  # type: ignore[attr-defined]
        if step_id in STEP_FACTS:
            reader.add(STEP_FACTS[step_id], where=step_id)
            if step_id == "cann":
                continue
        for cmd in step.commands:  # type: ignore[attr-defined]
            reader.run(list(cmd.argv), cwd=cmd.cwd or WORKSPACE, where=step_id)
        reader.cwd = WORKSPACE
        for line in step.manual_commands:  # type: ignore[attr-defined]
            for _, comment, argv in shell_commands(line):
                reader.run(argv, comment=comment, where=step_id)
    return reader.facts


# ------------------------------------------------------------------------------------------ comparison

# Facts whose order in the README says nothing about dependencies (checkouts, the environment, CANN, torch
# and decord are independent of the order they are listed in); everything else must come in README order.
UNORDERED = {"mm", "megatron", "env", "cann", "torch", "torch-npu", "decord", "install-sh-unknown-option"}


@dataclass
class Comparison:
    missing: list[Fact]  # README facts no plan fact matches
    out_of_order: list[tuple[Fact, Fact]]  # (README fact, the README fact before it that the plan puts later)
    extra: list[Fact]  # plan facts no README fact matches

    @property
    def ok(self) -> bool:
        return not self.missing and not self.out_of_order


def compare(readme: list[Fact], plan: list[Fact]) -> Comparison:
    missing: list[Fact] = []
    out_of_order: list[tuple[Fact, Fact]] = []
    last_index, last_fact = -1, None
    used: set[int] = set()
    for fact in readme:
        found = [i for i, p in enumerate(plan) if fact.matches(p)]
        if not found:
            missing.append(fact)
            continue
        used.update(found)
        if fact.kind in UNORDERED:
            continue
        after = [i for i in found if i >= last_index]
        if not after:
            out_of_order.append((fact, last_fact))  # type: ignore[arg-type]
            continue
        last_index, last_fact = after[0], fact
    extra = [p for i, p in enumerate(plan) if i not in used]
    return Comparison(missing, out_of_order, extra)


# ------------------------------------------------------------------------------------------ per model

# The install guide's sections a plan without a model overlay follows: CANN, torch/torch_npu and the manual
# install (docs/zh/pytorch/install_guide.md; 26.0.0 keeps CANN and torch in sections of their own).
GUIDE_HEADING = re.compile(r"^(手动安装|安装CANN|安装PyTorch以及torch_npu)$")
GUIDE = "docs/zh/pytorch/install_guide.md"


def guide_facts(tree: Path) -> list[Fact]:
    """The facts of the version's install guide (its manual install, CANN and torch sections, in order)."""
    path = tree / GUIDE
    lines = path.read_text(encoding="utf-8").splitlines()
    reader = Reader(tree, install_sh_options(tree))
    for start, end in sections(lines, GUIDE_HEADING):
        for first, text in _blocks(path, lines, start, end).blocks:
            for lineno, comment, argv in shell_commands(text, first):
                reader.run(argv, comment=comment, where=f"{GUIDE}:{lineno}")
    return reader.facts


def find_readme(tree: Path, example_dir: str) -> Path | None:
    """examples/<model>/README.md, or the one README of its only sub-folder (examples/lumina/mgpt2)."""
    readme = tree / example_dir / "README.md"
    if readme.is_file():
        return readme
    subs = sorted((tree / example_dir).glob("*/README.md"))
    return subs[0] if len(subs) == 1 else None


@dataclass
class ModelCheck:
    """One model at one version: its README's install facts against its plan's, on each architecture."""

    model: str
    version: str
    readme: Path | None
    readme_facts: list[Fact]
    missing: list[Fact]  # README facts no plan step does (and no readme_deviations entry explains)
    out_of_order: list[tuple[Fact, Fact]]
    undeclared: list[Fact]  # plan facts the README does not show, with no reason in data
    unsupported: list[str]  # manual steps, when the README cannot be read (no single README)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.out_of_order and not self.undeclared


def check_model(entry: object, version: str, upstream: Path) -> ModelCheck:
    """Compare `entry`'s install plans (aarch64 and x86_64) at `version` with its README's install section."""
    from mm_agent.install.schema import load_install_knowledge
    from mm_agent.install.steps import BEYOND_README, Layout, build_steps, plan_context
    from mm_agent.registry import get_registry

    reg = get_registry()
    info = reg.versions.get(version)
    assert info is not None
    tree = upstream / "MindSpeed-MM" / f"v{version}"
    model_id: str = entry.id  # type: ignore[attr-defined]
    overlay = entry.deps_for(version)  # type: ignore[attr-defined]
    deviations = {d.readme: d.reason for d in (overlay.readme_deviations if overlay else [])}
    plan_only = load_install_knowledge(reg).readme.plan_only
    layout = Layout(
        f"{WORKSPACE}/MindSpeed-MM", WORKSPACE, f"{WORKSPACE}/env", f"{WORKSPACE}/env/bin/python", ("pip",)
    )
    readme = find_readme(tree, entry.example_dir)  # type: ignore[attr-defined]
    section = install_section(readme) if readme else None
    facts = dedupe(readme_facts(section, tree)) if section else []
    result = ModelCheck(model_id, version, readme, facts, [], [], [], [])
    for arch in ("aarch64", "x86_64"):
        steps = build_steps(plan_context(entry, info, layout, arch=arch, registry=reg))  # type: ignore[arg-type]
        if section is None:
            result.unsupported = [
                f"{s.title}: {'; '.join(s.instructions)}"
                for s in steps
                if s.manual and s.stage == "model_deps"
            ]
            continue
        declared = {
            s.id for s in steps if s.id in plan_only or any(n.startswith(BEYOND_README) for n in s.notes)
        }
        comparison = compare(facts, plan_facts(steps, tree))
        for fact in comparison.missing:
            if fact.command not in deviations and fact not in result.missing:
                result.missing.append(fact)
        for pair in comparison.out_of_order:
            if pair not in result.out_of_order:
                result.out_of_order.append(pair)
        for fact in comparison.extra:
            if fact.where not in declared and not any(fact.matches(f) for f in result.undeclared):
                result.undeclared.append(fact)
    return result


VERSIONS = ("26.0.0", "26.1.0")


def rows(upstream: Path) -> dict[tuple[str, str], Cell]:
    """(model, version) -> "install: N of N README steps planned" for every registered model at 26.0.0/26.1.0."""
    from mm_agent.registry import get_registry

    out: dict[tuple[str, str], Cell] = {}
    for entry in sorted(get_registry().models.values(), key=lambda e: e.id):
        for version in VERSIONS:
            if not entry.versions.contains(version):
                continue
            check = check_model(entry, version, upstream)
            if check.readme is None:
                text = "unsupported: " + ("; ".join(check.unsupported) or "no README and no manual step")
                out[(entry.id, version)] = Cell(None if check.unsupported else False, text)
                continue
            total = len(check.readme_facts)
            done = total - len(check.missing)
            text = f"{done} of {total} README install steps planned"
            if check.out_of_order:
                text += f", {len(check.out_of_order)} out of order"
            if check.undeclared:
                text += f", {len(check.undeclared)} plan steps without a reason"
            out[(entry.id, version)] = Cell(check.ok, text)
    return out
