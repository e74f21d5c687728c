"""Dataset preparation: a folder of clips or images (or an index) -> a checked MindSpeed-MM dataset index.

The names below load on first use: the scan's pool workers import `mm_agent.dataset.probe` (and with it this
package) once per process, and should not pay for the scan's own modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mm_agent.dataset.prepare import prepare_dataset
    from mm_agent.dataset.schema import DatasetRequest, DatasetResult, Rejected

__all__ = ["DatasetRequest", "DatasetResult", "Rejected", "prepare_dataset"]


def __getattr__(name: str) -> Any:
    if name == "prepare_dataset":
        from mm_agent.dataset.prepare import prepare_dataset

        return prepare_dataset
    if name in ("DatasetRequest", "DatasetResult", "Rejected"):
        from mm_agent.dataset import schema

        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
