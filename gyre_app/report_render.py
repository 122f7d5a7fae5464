"""Draw a `Report` as one self-contained HTML file, pictures embedded as PNG (shell: matplotlib, file).

The file is written beside its destination under a temporary name and renamed into place, so a
report is either complete or absent, never half-written.
"""

from __future__ import annotations

import base64
import html
import io
import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; set before pyplot is imported
from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from gyre_app.report_model import Report, headline

ROLE_COLOURS = {"main": "tab:blue", "sub": "tab:orange", "summary": "tab:green"}
CELL_COLOURS = {"rollout": "tab:blue", "training": "tab:red", "switching": "tab:gray"}


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _reward(report: Report) -> str:
    fig, ax = plt.subplots(figsize=(7, 3))
    pts = [(s.version, s.reward_mean) for s in report.steps if s.reward_mean is not None]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
    ax.set(xlabel="step (policy version produced)", ylabel="mean reward", ylim=(-0.05, 1.05))
    ax.set_title("Training reward per step (assessable executions)")
    return _png(fig)


def _heldout(report: Report) -> str:
    fig, ax = plt.subplots(figsize=(7, 3))
    versions = list(report.heldout)
    ax.bar([str(v) for v in versions], [report.heldout[v] for v in versions], color="tab:purple")
    ax.set(xlabel="policy version scored", ylabel="mean held-out score", ylim=(0, 1.05))
    ax.set_title("Held-out score")
    return _png(fig)


def _staleness(report: Report) -> str:
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar([str(k) for k in report.staleness], list(report.staleness.values()), color="tab:olive")
    ax.set(xlabel="staleness at consumption (policy versions)", ylabel="samples")
    ax.set_title("Staleness of the trained samples")
    return _png(fig)


def _checks(report: Report) -> str:
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.45 * max(1, len(report.checks))))
    names = [c.name for c in report.checks]
    ax.barh(names, [c.weight for c in report.checks], color="lightgray", label="weight")
    ax.barh(names, [c.mean_score * c.weight for c in report.checks], color="tab:green", label="earned")
    ax.set(xlabel="share of the reward (weight; mean score x weight)", xlim=(0, 1))
    ax.legend(loc="lower right")
    ax.set_title(f"Partial credit by check ({report.num_grades - report.num_unassessable} assessable grades)")
    return _png(fig)


def _tree(report: Report) -> str:
    lanes = report.tree_lanes
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.5 * max(1, len(lanes))))
    y_of = {lane.trajectory_id: i for i, lane in enumerate(lanes)}
    for i, lane in enumerate(lanes):
        colour = ROLE_COLOURS.get(lane.role, "tab:gray")
        ax.plot(lane.seqs, [i] * len(lane.seqs), color=colour, alpha=0.5)
        ax.scatter(lane.seqs, [i] * len(lane.seqs), s=[10 + t / 2 for t in lane.output_tokens], color=colour)
        if lane.shared_prefix_with in y_of and lane.seqs:
            ax.annotate(
                "",
                xy=(lane.seqs[0], i),
                xytext=(lane.seqs[0], y_of[lane.shared_prefix_with]),
                arrowprops={"arrowstyle": "->", "linestyle": "--", "color": "gray"},
            )
    labels = [f"{lane.trajectory_id.rsplit('/', 1)[-1]} {lane.role}" for lane in lanes]
    ax.set_yticks(range(len(lanes)), labels)
    ax.set_ylim(-0.5, len(lanes) - 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="call sequence number (marker size: output tokens; dashed: shared prefix)")
    ax.set_title(f"Execution …{report.tree_execution[-12:]}: its trajectories, one per line", fontsize=10)
    return _png(fig)


def _cells(report: Report) -> str:
    cells = sorted({s.cell_id for s in report.cells})
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.4 * len(cells)))
    for s in report.cells:
        ax.barh(
            cells.index(s.cell_id), s.end_s - s.start_s, left=s.start_s, color=CELL_COLOURS.get(s.role, "k")
        )
    ax.set_yticks(range(len(cells)), cells)
    ax.set(xlabel="seconds since the first cell event")
    ax.set_title("Cell roles (blue rollout, red training, gray switching)")
    return _png(fig)


def render(report: Report) -> str:
    """The whole page; a part without data says why instead of drawing an empty axis."""
    parts: list[tuple[str, str | None, str]] = [
        ("Reward per step", _reward(report) if report.steps else None, ""),
        ("Held-out score", _heldout(report) if report.heldout else None, report.notes.get("heldout", "")),
        ("Staleness", _staleness(report) if report.staleness else None, "no sample fetched"),
        ("Partial credit", _checks(report) if report.checks else None, "no assessable grade"),
        ("Execution tree", _tree(report) if report.tree_lanes else None, report.notes.get("tree", "")),
        ("Cell roles", _cells(report) if report.cells else None, report.notes.get("cells", "")),
    ]
    rows = "".join(
        f"<tr><td>{s.version}</td><td>{'' if s.reward_mean is None else f'{s.reward_mean:.3f}'}</td>"
        f"<td>{s.num_rewards}</td><td>{s.num_unassessable}</td><td>{s.loss:+.4f}</td>"
        f"<td>{s.staleness_mean:.2f}</td><td>{s.staleness_max}</td></tr>"
        for s in report.steps
    )
    body = [
        f"<h1>Gyre run report{': ' + html.escape(report.run) if report.run else ''}</h1>",
        "<dl class='summary'>",
        *(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in headline(report)),
        "</dl>",
    ]
    for title, png, why in parts:
        body.append(f"<h2>{html.escape(title)}</h2>")
        if png is None:
            body.append(f"<p class='missing'>Not drawn: {html.escape(why)}.</p>")
        else:
            body.append(f"<img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>")
    body.append(
        "<h2>Steps</h2><table><tr><th>step</th><th>reward</th><th>rewards</th><th>unassessable</th>"
        f"<th>loss</th><th>staleness mean</th><th>max</th></tr>{rows}</table>"
    )
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:auto} td,th{padding:0 .6em} .missing{color:#a00}"
        " .summary{display:grid;grid-template-columns:max-content auto;gap:.3em 1em;font-size:1.1em}"
        " .summary dt{font-weight:bold} .summary dd{margin:0}"
    )
    head = f"<meta charset='utf-8'><title>Gyre report</title><style>{style}</style>"
    return f"<!doctype html><html><head>{head}</head><body>{''.join(body)}</body></html>\n"


def write_report(report: Report, out: Path) -> Path:
    """Render, then write to a temporary file beside `out` and rename it over `out`."""
    page = render(report)  # everything that can fail before the file system is touched
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the report from others on the machine
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
