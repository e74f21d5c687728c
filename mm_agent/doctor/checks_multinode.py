"""Checks that only matter when the job spans several nodes: pdsh (MM's multi-node launch hangs silently
without it; the bundled runtime's scripts run on every node themselves) and the socket NIC variables naming a NIC that exists on this host.
"""

from __future__ import annotations

import shutil

from mm_agent.doctor.context import Context
from mm_agent.doctor.registry import MM_ONLY, Outcome, check, fail, ok, skip, warn

IFNAME_VARS = ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def ifname_matches(value: str, nics: list[str]) -> list[str]:
    """NICs selected by an HCCL/Gloo IFNAME value: comma-separated prefixes, `=name` for an exact name,
    a leading `^` to exclude instead of include."""
    exclude = value.startswith("^")
    items = [i.strip() for i in value.lstrip("^").split(",") if i.strip()]

    def hit(nic: str) -> bool:
        return any(nic == i[1:] if i.startswith("=") else nic.startswith(i) for i in items)

    return [n for n in nics if hit(n) != exclude]


@check("pdsh", "pdsh installed (multi-node)", MM_ONLY)
def pdsh(ctx: Context) -> Outcome:
    if ctx.nnodes <= 1:
        return skip("single-node job")
    found = shutil.which("pdsh", path=ctx.env.get("PATH"))
    if found:
        return ok(found)
    return fail(
        f"pdsh not found: a {ctx.nnodes}-node MindSpeed-MM launch hangs with no error",
        "apt install pdsh (Debian/Ubuntu) or yum install pdsh (EulerOS/openEuler/CentOS) on every node",
    )


@check("socket_ifname", "HCCL_SOCKET_IFNAME names an existing NIC (multi-node)")
def socket_ifname(ctx: Context) -> Outcome:
    if ctx.nnodes <= 1:
        return skip("single-node job")
    addrs, stats = ctx.nics()
    nics = sorted(n for n in addrs if n != "lo")
    listing = [
        f"{n}: {', '.join(a.address for a in addrs[n] if a.family.name == 'AF_INET') or 'no IPv4'}"
        + ("" if stats.get(n) is None or stats[n].isup else " (down)")
        for n in nics
    ]
    if not ctx.env.get("HCCL_SOCKET_IFNAME"):
        return warn(
            "HCCL_SOCKET_IFNAME is not set: HCCL picks a NIC itself, often the wrong one on multi-NIC hosts",
            "export HCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the NIC on MASTER_ADDR's network, on every node",
            listing,
        )
    for var in IFNAME_VARS:
        value = ctx.env.get(var)
        if not value:
            continue
        chosen = ifname_matches(value, nics)
        if not chosen:
            return fail(
                f"{var}={value} matches no NIC on this host: comm init times out (EI0006)",
                f"set {var} to one of: {', '.join(nics)}",
                listing,
            )
        down = [n for n in chosen if stats.get(n) is not None and not stats[n].isup]
        if down and len(down) == len(chosen):
            return fail(
                f"{var}={value} selects only NICs that are down: {', '.join(down)}",
                f"bring the NIC up or set {var} to an up NIC",
                listing,
            )
    return ok(f"HCCL_SOCKET_IFNAME={ctx.env['HCCL_SOCKET_IFNAME']}", listing)
