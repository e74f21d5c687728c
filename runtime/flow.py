"""Flow matching as MindSpeed-MM's `wan_flow_match_scheduler` does it: the training target and an Euler sampler.

Sigmas run from 1 to `sigma_min` over `num_train_timesteps` steps (one extra step dropped with
`extra_one_step`), bent by `shift` (sigma' = shift*sigma / (1 + (shift-1)*sigma)); timestep = sigma x
`num_train_timesteps`. Training draws one timestep per micro batch, noises x_t = (1-sigma) x0 + sigma noise,
regresses the velocity noise - x0 with MSE, and weighs the loss by MindSpeed-MM's Gaussian-shaped timestep
weight (mean 1 over the table). Wan2.2's `min/max_timestep_boundary` restrict the drawn timesteps.
Randomness comes from a caller-supplied `torch.Generator` so every micro batch's draw is reproducible —
the basis of exact resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from runtime.errors import RuntimeFailure

SUPPORTED = {"wan_flow_match_scheduler"}


@dataclass(frozen=True)
class FlowConfig:
    num_train_timesteps: int = 1000
    shift: float = 5.0
    sigma_min: float = 0.0
    sigma_max: float = 1.0
    extra_one_step: bool = True
    min_timestep_boundary: float = 0.0
    max_timestep_boundary: float = 1.0

    @classmethod
    def from_diffusion(cls, diffusion: dict[str, Any], file: str, *, training: bool) -> FlowConfig:
        """Read the `diffusion` block; training requires MindSpeed-MM's flow-matching scheduler by name.

        Sampling accepts any scheduler block (inference_model.json names UniPC) and uses its `flow_shift`
        (or `shift`): the bundled runtime always samples with Euler steps on the same sigma schedule.
        """
        model_id = diffusion.get("model_id")
        if training and model_id not in SUPPORTED:
            raise RuntimeFailure(
                f"diffusion.model_id {model_id!r} is not supported for training by the bundled runtime",
                file=file,
                field="diffusion.model_id",
                fix="use wan_flow_match_scheduler (Wan2.1/2.2 training configs)",
            )
        try:
            cfg = cls(
                num_train_timesteps=int(diffusion.get("num_train_timesteps", 1000)),
                shift=float(diffusion.get("shift", diffusion.get("flow_shift", 5.0))),
                sigma_min=float(diffusion.get("sigma_min", 0.0)),
                extra_one_step=bool(diffusion.get("extra_one_step", True)),
                min_timestep_boundary=float(diffusion.get("min_timestep_boundary", 0.0)),
                max_timestep_boundary=float(diffusion.get("max_timestep_boundary", 1.0)),
            )
        except (TypeError, ValueError) as exc:
            raise RuntimeFailure(
                f"bad value in the diffusion block: {exc}", file=file, field="diffusion", fix="use numbers"
            ) from exc
        if cfg.num_train_timesteps < 1 or not 0 <= cfg.min_timestep_boundary < cfg.max_timestep_boundary <= 1:
            raise RuntimeFailure(
                "diffusion needs num_train_timesteps >= 1 and 0 <= min_timestep_boundary < "
                "max_timestep_boundary <= 1",
                file=file,
                field="diffusion",
                fix="use the values of the MindSpeed-MM example config",
            )
        return cfg


def sigma_schedule(cfg: FlowConfig, num_steps: int) -> torch.Tensor:
    """Shifted sigmas from high noise to low noise, `num_steps` entries (float32)."""
    start = cfg.sigma_min + (cfg.sigma_max - cfg.sigma_min)
    if cfg.extra_one_step:
        sigmas = torch.linspace(start, cfg.sigma_min, num_steps + 1)[:-1]
    else:
        sigmas = torch.linspace(start, cfg.sigma_min, num_steps)
    return cfg.shift * sigmas / (1 + (cfg.shift - 1) * sigmas)


class FlowMatching:
    """Training-side schedule: the sigma/timestep tables and the per-timestep loss weights."""

    def __init__(self, cfg: FlowConfig) -> None:
        self.cfg = cfg
        n = cfg.num_train_timesteps
        self.sigmas = sigma_schedule(cfg, n)
        self.timesteps = self.sigmas * n
        y = torch.exp(-2 * ((self.timesteps - n / 2) / n) ** 2)
        shifted = y - y.min()
        self.weights = shifted * (n / shifted.sum())
        self.low = int(cfg.min_timestep_boundary * n)
        self.high = max(int(cfg.max_timestep_boundary * n), self.low + 1)

    def draw(
        self, x0: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x_t, timestep [B], target, weight) for clean latents x0; the draw happens on the CPU generator."""
        index = int(torch.randint(self.low, self.high, (1,), generator=generator).item())
        noise = torch.randn(x0.shape, generator=generator, dtype=torch.float32).to(x0.device, x0.dtype)
        sigma = float(self.sigmas[index])
        x_t = (1 - sigma) * x0 + sigma * noise
        timestep = torch.full((x0.shape[0],), float(self.timesteps[index]), device=x0.device)
        return x_t, timestep, noise - x0, self.weights[index].to(x0.device)

    @staticmethod
    def loss(prediction: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(prediction.float(), target.float()) * weight


Predictor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def euler_sample(predict: Predictor, noise: torch.Tensor, cfg: FlowConfig, num_steps: int) -> torch.Tensor:
    """Integrate the predicted velocity from sigma=1 to 0: x <- x + v (sigma_next - sigma).

    `predict(x, timestep[B])` returns the velocity (with guidance already applied by the caller).
    """
    sigmas = sigma_schedule(cfg, num_steps)
    x = noise
    for i, sigma in enumerate(sigmas.tolist()):
        sigma_next = float(sigmas[i + 1]) if i + 1 < len(sigmas) else 0.0
        timestep = torch.full((x.shape[0],), sigma * cfg.num_train_timesteps, device=x.device)
        x = x + predict(x, timestep) * (sigma_next - sigma)
    return x
