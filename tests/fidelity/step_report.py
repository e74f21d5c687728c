"""Every step of every model, judged by MindSpeed-MM (issue 26): one row per registered model and release.

Each column is one judge's `rows(upstream)`, run here against the real upstream trees:
  steps     every step of the model's data cites its README, re-read at that release (step_citations)
  install   the install plan follows the README's install section in order (install_readme)
  convert   each converter command is accepted by MindSpeed-MM's own converter CLI (convert_cli)
  load      what the rendered conversion writes is what the job's model asks for, M of M (load_fidelity)
  dataset   what `mm-agent dataset` writes is read by the model's own dataset class (dataset_readers)

A cell is `ok` (passed), `FAIL`, or `-` (the step does not apply, or it is marked unsupported in data with
the fix a user can follow). A row is complete when no cell failed. Run from the project root:

    python -m tests.fidelity.step_report ../shared/upstream [--columns steps,convert] [--json]

Exit status 1 when any cell failed. It takes minutes (the load and dataset judges run upstream code on
tiny models and real clips); the tests in tests/fidelity/ run the same judges in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.fidelity import convert_cli, dataset_readers, install_readme, load_fidelity, step_citations
from tests.fidelity.report_cell import Cell

Rows = dict[tuple[str, str], Cell]
JUDGES: dict[str, Callable[[Path], Rows]] = {
    "steps": step_citations.rows,
    "install": install_readme.rows,
    "convert": convert_cli.rows,
    "load": load_fidelity.rows,
    "dataset": dataset_readers.rows,
}
VERSIONS = ("26.0.0", "26.1.0")


def mark(cell: Cell | None) -> str:
    if cell is None or cell.ok is None:
        return "-"
    return "ok" if cell.ok else "FAIL"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("upstream", type=Path, help="the folder holding MindSpeed-MM/v26.0.0 and v26.1.0")
    parser.add_argument("--columns", default=",".join(JUDGES), help=f"a comma list of {', '.join(JUDGES)}")
    parser.add_argument("--json", action="store_true", help="every cell's text as JSON")
    args = parser.parse_args(argv)
    columns = [c for c in args.columns.split(",") if c]
    unknown = sorted(set(columns) - set(JUDGES))
    if unknown:
        parser.error(f"unknown column(s) {', '.join(unknown)}; columns: {', '.join(JUDGES)}")
    table: dict[str, Rows] = {}
    for column in columns:
        start = time.monotonic()
        table[column] = JUDGES[column](args.upstream)
        print(f"# {column}: {time.monotonic() - start:.0f} s", file=sys.stderr)
    keys = sorted(
        {key for rows in table.values() for key in rows if key[1] in VERSIONS}, key=lambda k: (k[0], k[1])
    )
    failed = 0
    if args.json:
        print(
            json.dumps(
                [
                    {"model": m, "version": v}
                    | {
                        c: {
                            "ok": (cell := table[c].get((m, v))) and cell.ok,
                            "text": cell.text if cell else "",
                        }
                        for c in columns
                    }
                    for m, v in keys
                ],
                indent=1,
            )
        )
    else:
        print(f"{'model':20} {'version':8} " + " ".join(f"{c:8}" for c in columns))
    for model, version in keys:
        cells = [table[c].get((model, version)) for c in columns]
        failed += any(cell is not None and cell.ok is False for cell in cells)
        if not args.json:
            print(f"{model:20} {version:8} " + " ".join(f"{mark(cell):8}" for cell in cells))
            for column, cell in zip(columns, cells, strict=True):
                if cell is not None and (
                    cell.ok is False or (cell.ok and "unsupported in data" in cell.text)
                ):
                    print(
                        f"    {column}: {cell.text}"
                    )  # a failure, or a step marked unsupported beside passes
    print(file=sys.stderr)
    for column in columns:
        cells = [table[column].get(key) for key in keys]
        ok = sum(c is not None and c.ok is True for c in cells)
        bad = sum(c is not None and c.ok is False for c in cells)
        na = len(cells) - ok - bad
        print(
            f"{column:8} ok {ok:3}  failed {bad:3}  not applicable / unsupported in data {na:3}",
            file=sys.stderr,
        )
    print(f"rows {len(keys)}, complete {len(keys) - failed}, with a failed step {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
