"""Memory and time estimates before launch (`estimate_resources`, `mm-agent estimate`): see core.py."""

from mm_agent.estimate.core import estimate_resources
from mm_agent.estimate.schema import EstimateRequest, EstimateResult, Lever

__all__ = ["EstimateRequest", "EstimateResult", "Lever", "estimate_resources"]
