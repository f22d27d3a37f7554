"""The one look of every figure: rc settings, a fixed colour per selector, the caption under the
axes, and byte-stable PNG + SVG files (no dates, fixed SVG ids), so a refreshed figure whose data
did not change leaves git clean.

Figures are built with matplotlib's object API (`new_figure`), not pyplot: nothing global is
touched, no backend is needed (the Agg canvas renders the files), and a notebook shows them too.
"""
from __future__ import annotations

import textwrap
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

RC = {
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 7.5, "xtick.labelsize": 8,
    "ytick.labelsize": 8, "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.6, "axes.spines.top": False,
    "axes.spines.right": False, "lines.linewidth": 1.6, "lines.markersize": 4.5, "legend.frameon": False,
    "svg.fonttype": "none", "svg.hashsalt": "base-moe", "figure.dpi": 100,
}
DPI = 120  # PNG resolution: sharp on a README page, ~100-250 kB a figure
CAPTION_CHARS = 130  # wrap width of the caption at the figures' width of 10 in
# Selectors keep their colour in every figure; an unknown variant gets a stable one from its name.
COLORS = {
    "base": "#1f77b4", "oracle": "#7f7f7f", "router_sum": "#d62728", "router_sq": "#ff7f0e", "calib_energy": "#2ca02c",
    "calib_freq": "#8c564b", "count": "#e377c2", "top1_union": "#9467bd", "dense": "#000000", "fixed": "#bcbd22",
    "base+drop": "#17becf", "base+similar": "#aec7e8", "base+split": "#393b79", "base_anchor(k0=1)": "#6b6ecf",
    "xshare(k0=1)": "#e7969c", "lynx(k0=1)": "#bd9e39", "oea(k0=1)": "#007360", "oea(k0=2)": "#990066",
    "oea(k0=3)": "#736000",
}
FALLBACK = ("#637939", "#8ca252", "#b5cf6b", "#8c6d31", "#e7ba52", "#7b4173", "#a55194", "#ce6dbd", "#de9ed6",
            "#3182bd", "#6baed6", "#e6550d", "#fd8d3c", "#31a354", "#74c476")
ROUTING_STYLE = {"uniform": "-", "skewed": "--", "trained": ":"}


MODEL_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                "#7f7f7f")


def color(variant: str) -> str:
    return COLORS.get(variant) or FALLBACK[zlib.crc32(variant.encode()) % len(FALLBACK)]


def palette(models) -> dict[str, str]:
    """Distinct colours for the models of one figure (sorted, so the same set always gets the same)."""
    names = sorted(set(models))
    return {m: MODEL_COLORS[i % len(MODEL_COLORS)] for i, m in enumerate(names)}


@contextmanager
def context() -> Iterator[None]:
    """Every figure is drawn inside this (rc settings apply when artists are made)."""
    with matplotlib.rc_context(RC):
        yield


def new_figure(nrows: int = 1, ncols: int = 1, height: float = 3.2, width: float = 10.0, **kw) -> tuple[Figure, list]:
    """A figure of nrows x ncols axes (flat list), constrained layout; call inside context()."""
    fig = Figure(figsize=(width, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, [ax for row in axes for ax in row]


def legend_below(fig: Figure, handles: list, labels: list[str], ncols: int):
    """A figure legend under the axes, in `ncols` columns: `caption` places it between the axes and
    the caption and keeps the axes above it (constrained layout would pin an "outside lower" legend
    to the figure's bottom edge, onto the caption)."""
    leg = fig.legend(handles, labels, loc="lower center", ncols=ncols, fontsize=7.5)
    leg.rows = -(-len(labels) // ncols)  # the legend's rows: its height, for caption's layout
    return leg


def caption(fig: Figure, text: str, xlabel: str | None = None) -> None:
    """The caption under the axes (model, batch size, hardware, runs), above it a legend_below,
    and `xlabel`, one x label for every panel, between the axes and the caption: the layout leaves
    room for all three.

    (Not fig.supxlabel: constrained layout pins that to the figure's bottom edge, onto the caption.)"""
    lines = textwrap.wrap(text, CAPTION_CHARS)
    below = [leg for leg in fig.legends if hasattr(leg, "rows")]
    legend_in = sum(0.16 * leg.rows + 0.1 for leg in below)
    fig.set_figheight(fig.get_figheight() + legend_in)  # the legend below takes no height from the axes
    height = fig.get_figheight()
    room = (0.16 * len(lines) + 0.12) / height
    legend = legend_in / height
    label = 0.3 / height if xlabel else 0.0
    bottom = room + legend + label
    fig.get_layout_engine().set(rect=(0, bottom, 1, 1 - bottom))
    fig.text(0.01, 0.02 / height, "\n".join(lines), fontsize=7.5, va="bottom", ha="left", color="#333333")
    for leg in below:
        leg.set_bbox_to_anchor((0.5, room), transform=fig.transFigure)
    if xlabel:
        fig.text(0.5, room + legend + 0.04 / height, xlabel, fontsize=9, va="bottom", ha="center")


def empty_axes(ax, reason: str) -> None:
    """An axis that says which data it lacks, instead of failing or drawing nothing."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, "\n".join(textwrap.wrap(f"no data: {reason}", 50)), ha="center", va="center",
            transform=ax.transAxes, fontsize=9, color="#555555")


def save(fig: Figure, directory: Path, name: str) -> list[Path]:
    """<name>.png and <name>.svg under directory, without timestamps or version stamps."""
    directory.mkdir(parents=True, exist_ok=True)
    png, svg = directory / f"{name}.png", directory / f"{name}.svg"
    with context():
        fig.savefig(png, dpi=DPI, metadata={"Software": None})
        fig.savefig(svg, metadata={"Date": None, "Creator": None})
    return [png, svg]
