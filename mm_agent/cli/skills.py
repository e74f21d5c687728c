"""`mm-agent skills build|install`: generate the Agent Skills from the registry, copy them to a host.

`build --check` writes nothing and exits 1 when the committed skills differ from what the registry
generates (the CI and the tests run it); `install` is a dry run unless `--yes`.
"""

from __future__ import annotations

import argparse
from typing import Any

from mm_agent.skills.build import BuildRequest, build_skills
from mm_agent.skills.install import BACKUPS, DEFAULT_TARGET, InstallSkillsRequest, install_skills

from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "skills",
        help="build the Agent Skills from the registry, or install them for an assistant",
        epilog="examples:\n  mm-agent skills build                       # regenerate skills/ from templates/skills/\n"
        "  mm-agent skills build --check               # exit 1 when skills/ is out of date\n"
        "  mm-agent skills install                     # dry run: what would be copied to ~/.claude/skills\n"
        "  mm-agent skills install --yes               # copy\n"
        "  mm-agent skills install --target .claude/skills --yes   # this project only (Claude Code)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = p.add_subparsers(dest="skills_command", metavar="SUBCOMMAND", required=True)

    b = commands.add_parser("build", help="render templates/skills/<name>/ into skills/<name>/")
    b.add_argument("--check", action="store_true", help="compare only; exit 1 when anything differs")
    b.add_argument("--out", help="output folder (default: skills/ of the checkout)")
    b.add_argument("--templates", help="skill templates root (default: templates/skills/ of the checkout)")
    add_json_flag(b)
    b.set_defaults(func=run_build)

    i = commands.add_parser(
        "install", help="copy the skills where an assistant loads them (dry run by default)"
    )
    i.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"host skills folder (default: {DEFAULT_TARGET}; project-level: .claude/skills; shared: ~/.agents/skills)",
    )
    i.add_argument("--source", help="built skills folder (default: skills/ of the checkout)")
    i.add_argument(
        "--force", action="store_true", help="replace a different skill of the same name (backed up)"
    )
    i.add_argument("--yes", action="store_true", help="copy (without it: dry run)")
    add_json_flag(i)
    i.set_defaults(func=run_install)


def run_build(args: argparse.Namespace) -> int:
    result = build_skills(BuildRequest(out_dir=args.out, templates_dir=args.templates, check=args.check))
    if args.json:
        print_json(result)
        return 1 if args.check and not result.up_to_date else 0
    out = console()
    changed = [f for f in result.files if f.status != "unchanged"]
    if args.check:
        if result.up_to_date:
            out.print(f"{len(result.skills)} skills in {result.out_dir} match the registry", markup=False)
            return 0
        out.print(
            f"{len(changed)} file(s) in {result.out_dir} differ from what the registry generates:",
            markup=False,
        )
        for f in changed:
            out.print(f"  {f.status:9s} {f.path}", markup=False)
        for f in changed:
            if f.diff:
                out.print(f.diff, markup=False, end="")
        out.print("run `mm-agent skills build` and commit the result", markup=False)
        return 1
    for f in changed:
        out.print(f"  {f.status:9s} {f.path}", markup=False)
    out.print(
        f"{len(result.skills)} skills in {result.out_dir}: "
        + ("already up to date" if result.up_to_date else f"{len(changed)} file(s) written or removed"),
        markup=False,
    )
    return 0


def run_install(args: argparse.Namespace) -> int:
    result = install_skills(
        InstallSkillsRequest(target=args.target, source=args.source, force=args.force, confirm=args.yes)
    )
    if args.json:
        print_json(result)
        return 0
    out = console()
    out.print(f"{result.source} -> {result.target}", markup=False)
    for skill in result.skills:
        backup = f"  (old copy: {skill.backup_dir})" if skill.backup_dir else ""
        out.print(f"  {skill.status:13s} {skill.name}{backup}", markup=False)
    if not result.dry_run:
        out.print("new sessions of the assistant load them", markup=False)
        return 0
    conflicts = [s.name for s in result.skills if s.status == "conflict"]
    out.print("dry run: nothing was copied; run again with --yes to copy", markup=False)
    if conflicts:
        out.print(
            f"{', '.join(conflicts)}: the installed copy differs (edited, or an older mm-agent); compare, then "
            f"--yes --force replaces it and keeps the old one in {result.target}/{BACKUPS}/",
            markup=False,
        )
    return 0
