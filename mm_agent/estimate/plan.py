"""A layout for the device count the user has: the stock layout when it fits, else the smallest context
parallelism that makes it fit, else the verdict with the best change. `render_job` applies the CP it picks
(only when the user gave a device count and no TP/CP); `route_model` shows the verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from mm_agent.errors import MMAgentError
from mm_agent.estimate.core import estimate_once
from mm_agent.estimate.jobdir import JobFacts
from mm_agent.estimate.levers import rank_levers
from mm_agent.estimate.profiles import Runtime
from mm_agent.estimate.schema import EstimateRequest

CP_STEPS = (2, 4, 8)  # Ulysses CP sizes MindSpeed-MM's DiT examples use
GENERATIVE_MEGATRON = ("megatron_generative", "megatron_fsdp2_generative")  # the templates that render CP


def cp_rule(template: str, runtime: str, heads: Any, tp: int) -> Callable[[int], bool]:
    """Which CP a job can be given: MindSpeed-MM's Megatron DiT jobs only (the bundled runtime is data
    parallel), and the attention heads must divide over TP x CP."""
    free = runtime == "mindspeed-mm" and template in GENERATIVE_MEGATRON and isinstance(heads, int)
    return lambda cp: free and not heads % (tp * cp)


class LayoutFit(BaseModel):
    fits: bool
    cp: int = Field(description="the CP the verdict is for (the stock one unless a larger one was needed)")
    per_device_gb: float
    device_gb: float
    note: str = Field(description="one line for the user: the verdict and what was chosen or would help")


def fit_layout(
    req: EstimateRequest,
    *,
    runtime: Runtime | None = None,
    cp_ok: Callable[[int], bool] = lambda cp: False,
    arch: dict[str, int] | None = None,
) -> LayoutFit | None:
    """The layout for `req.npus`; None when the model is not one the estimator covers. `cp_ok(cp)` says
    whether this job can take that CP (the runtime has CP, the heads divide)."""
    job = JobFacts(runtime=runtime, arch=arch) if runtime else None
    try:
        cur = estimate_once(req, job)
    except MMAgentError:
        return None
    where = f"{cur.npus} x {cur.device}"
    if cur.fits:
        return LayoutFit(
            fits=True, cp=cur.cp, per_device_gb=cur.per_device_gb, device_gb=cur.device_gb,
            note=f"fits {where}: {cur.per_device_gb:g} of {cur.device_gb:g} GB per device",
        )  # fmt: skip
    for cp in CP_STEPS:
        if cp <= cur.cp or cur.npus % (cur.tp * cur.pp * cp) or not cp_ok(cp):
            continue
        new = estimate_once(req.model_copy(update={"cp": cp}), job)
        if new.fits:
            return LayoutFit(
                fits=True, cp=cp, per_device_gb=new.per_device_gb, device_gb=new.device_gb,
                note=f"CP {cp} so it fits {where}: {new.per_device_gb:g} of {new.device_gb:g} GB per device "
                f"({cur.per_device_gb:g} GB with CP {cur.cp})",
            )  # fmt: skip
    levers = rank_levers(req, cur, lambda changed: estimate_once(changed, job))
    best = next((lever for lever in levers if lever.fits), None)
    hint = f"; best change: {best.change} ({best.per_device_gb:g} GB)" if best else "; see estimate_resources"
    return LayoutFit(
        fits=False, cp=cur.cp, per_device_gb=cur.per_device_gb, device_gb=cur.device_gb,
        note=f"does not fit {where}: {cur.per_device_gb:g} of {cur.device_gb:g} GB per device{hint}",
    )  # fmt: skip
