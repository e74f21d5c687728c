"""Which rank a log line belongs to: from the line's own prefix, else from the file's path.

The order matters: a launcher prefix (`[rank3]:`, torchrun `--tee` `[default3]:`) and torch_npu's own
`RankID:3` name the process that wrote the line; torchrun's failure summary (`rank : 3 (local_rank: 3)`,
`failed (exitcode: 1) local_rank: 3 (pid: N)`) names the rank that failed; then the file (rank_3.log,
node0_rank3, torchrun `--log-dir` layout `attempt_0/3/stderr.log`, CANN `device-3/`); only then loose
mentions (`rank[3]`, `Rank 3`), which in HCCL messages often name a peer.
"""

from __future__ import annotations

import re
from pathlib import PurePath

_OWN = re.compile(
    r"\[(?:rank|default)(?P<a>\d+)\]:"
    r"|\bRankID:\s*(?P<b>\d+)"
    r"|^\s*rank\s*:\s*(?P<c>\d+)\s*\(local_rank"
    r"|\(exitcode: -?\d+\) local_rank: (?P<d>\d+) \(pid"
)
_LOOSE = re.compile(r"\brank\[(?P<a>\d+)\]|\b[Rr]ank[ _]?(?P<b>\d+)\b")
_FILE = re.compile(r"(?:^|[^a-z])rank[_-]?(\d+)(?![0-9])", re.IGNORECASE)  # rank_3.log, node0_rank3.txt
_DIR = re.compile(
    r"(?:[\w.-]*[_-])?rank[_-]?(\d+)|device-(\d+)", re.IGNORECASE
)  # whole name: rank3/, device-3/
DIR_LEVELS = 2  # directories above the file that may name its rank (attempt_0/3/, device-3/)


def _first_group(m: re.Match[str] | None) -> int | None:
    if m is None:
        return None
    return int(next(v for v in m.groups() if v is not None))


def rank_from_path(path: str) -> int | None:
    """A rank stated by the file name or by one of its two nearest directories."""
    parts = PurePath(path).parts
    if not parts:
        return None
    found = _FILE.search(parts[-1])
    if found:
        return int(found.group(1))
    for i in range(len(parts) - 2, max(-1, len(parts) - 2 - DIR_LEVELS), -1):
        whole = _DIR.fullmatch(parts[i])
        if whole:
            return _first_group(whole)
        if parts[i].isdigit() and i == len(parts) - 2 and i > 0 and parts[i - 1].startswith("attempt_"):
            return int(parts[i])  # torchrun --log-dir: <run>/attempt_<n>/<local_rank>/stderr.log
    return None


def rank_of_line(line: str, path_rank: int | None) -> int | None:
    """The rank a (decoded, ANSI-free) hit line came from, or None when nothing says."""
    head = line[:4096]
    own = _first_group(_OWN.search(head))
    if own is not None:
        return own
    if path_rank is not None:
        return path_rank
    return _first_group(_LOOSE.search(head))
