"""Log timestamps, so findings from different files and ranks can be put in time order.

Only the hit lines (and a bounded look-back before them) are ever parsed, never every line. The forms are
the ones MindSpeed-MM jobs write: Megatron `[YYYY-MM-DD HH:MM:SS]`, Python logging `YYYY-MM-DD
HH:MM:SS,mmm`, torchrun's `[YYYY-MM-DD HH:MM:SS,mmm]` and `time : YYYY-MM-DD_HH:MM:SS`, CANN plog
`YYYY-MM-DD-HH:MM:SS.mmm.uuu`, and glog/PyTorch C++ `E1122 05:00:00.123456` (which has no year).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

_FORMS = re.compile(
    rb"(?P<py>\d{4})-(?P<pm>\d\d)-(?P<pd>\d\d)-(?P<pH>\d\d):(?P<pM>\d\d):(?P<pS>\d\d)\.(?P<pms>\d{3})\.(?P<pus>\d{3})"
    rb"|(?P<y>\d{4})[-/](?P<m>\d\d)[-/](?P<d>\d\d)[ T_](?P<H>\d\d):(?P<M>\d\d):(?P<S>\d\d)(?:[.,](?P<f>\d{1,6}))?"
    rb"|(?<![A-Za-z0-9])[EWIF](?P<gm>\d\d)(?P<gd>\d\d) (?P<gH>\d\d):(?P<gM>\d\d):(?P<gS>\d\d)\.(?P<gf>\d{6})"
)

# Placeholder year for glog stamps until the caller supplies one (a leap year, so 29 February parses).
_NO_YEAR = 2000


@dataclass(frozen=True, order=True)
class Stamp:
    """A point in log time; `guessed_year` marks glog stamps whose year came from elsewhere."""

    at: datetime
    guessed_year: bool = False

    def iso(self) -> str:
        return self.at.isoformat(sep=" ")


def _build(m: re.Match[bytes], year: int) -> Stamp | None:
    g = m.groupdict()
    try:
        if g["py"] is not None:
            y, mo, d, h, mi, sec = (int(g[k]) for k in ("py", "pm", "pd", "pH", "pM", "pS"))
            return Stamp(datetime(y, mo, d, h, mi, sec, int(g["pms"]) * 1000 + int(g["pus"])))
        if g["y"] is not None:
            y, mo, d, h, mi, sec = (int(g[k]) for k in ("y", "m", "d", "H", "M", "S"))
            micro = int(g["f"].ljust(6, b"0")) if g["f"] else 0
            return Stamp(datetime(y, mo, d, h, mi, sec, micro))
        mo, d, h, mi, sec = (int(g[k]) for k in ("gm", "gd", "gH", "gM", "gS"))
        return Stamp(datetime(year, mo, d, h, mi, sec, int(g["gf"])), guessed_year=True)
    except ValueError:  # 2024-13-45 and friends: not a time after all
        return None


def find_stamp(data: bytes, year: int = _NO_YEAR, *, last: bool = False) -> Stamp | None:
    """The first (or, with `last`, the latest) timestamp in `data`; `year` is used for year-less forms."""
    found: Stamp | None = None
    for m in _FORMS.finditer(data):
        stamp = _build(m, year)
        if stamp is not None and not last:
            return stamp
        found = stamp or found
    return found


def full_year(stamp: Stamp | None) -> int | None:
    """The year a stamp states (None for glog stamps): the reference year for later year-less stamps."""
    return None if stamp is None or stamp.guessed_year else stamp.at.year
