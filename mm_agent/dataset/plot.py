"""The dataset summary as a PNG: histograms of duration, frames, caption length and the commonest frame sizes.

Called in the scan's worker pool (matplotlib is imported there, never in the MCP server); returns the PNG
bytes, which the caller writes atomically beside the index.
"""

from __future__ import annotations

import io


def plot_png(values: dict[str, list[float]], resolutions: dict[str, int], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, data) for name, data in values.items() if data]
    count = len(panels) + (1 if resolutions else 0)
    fig, axes = plt.subplots(1, max(count, 1), figsize=(4 * max(count, 1), 3.2), squeeze=False)
    for ax, (name, data) in zip(axes[0], panels, strict=False):
        ax.hist(data, bins=min(30, max(5, len(set(data)))), color="#4472c4")
        ax.set_title(name)
        ax.set_ylabel("items")
    if resolutions:
        ax = axes[0][len(panels)]
        names = list(resolutions)[:12]
        ax.barh(names[::-1], [resolutions[n] for n in names][::-1], color="#ed7d31")
        ax.set_title("frame size (WxH)")
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()
