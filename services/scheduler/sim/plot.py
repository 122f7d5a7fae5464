"""Draw each mode's cell roles over time, one panel per mode (shell: writes a PNG)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from services.scheduler.sim.result import ROLLOUT, SWITCHING, TRAINING, Result

COLOURS = {ROLLOUT: "#4c9be8", TRAINING: "#f28e2b", SWITCHING: "#d62728"}


def plot_timelines(
    results: Mapping[str, Result], path: str | Path, *, title: str = "", dpi: int = 80
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = list(results)
    longest_h = max(r.wall_s for r in results.values()) / 3600
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 1.2 + 1.1 * len(names)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        result = results[name]
        for cell, segments in enumerate(result.timeline):
            for role in (ROLLOUT, TRAINING, SWITCHING):
                bars = [(s.start_s / 3600, (s.end_s - s.start_s) / 3600) for s in segments if s.role == role]
                if bars:
                    ax.broken_barh(bars, (cell, 0.9), facecolors=COLOURS[role], linewidth=0)
        for end in result.step_end_s:
            ax.axvline(end / 3600, color="black", linewidth=0.3, alpha=0.4)
        ax.set_ylim(0, result.num_cells)
        ax.set_xlim(0, longest_h)
        ax.set_yticks([])
        ax.set_ylabel(
            f"{name}\n{result.wall_s / 3600:.1f} h", rotation=0, ha="right", va="center", fontsize=8
        )
    axes[-1, 0].set_xlabel("hours (thin lines: optimizer steps published)")
    handles = [Patch(color=c, label=role) for role, c in COLOURS.items()]
    fig.legend(handles=handles, loc="upper right", ncol=3, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, x=0.02, ha="left", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
