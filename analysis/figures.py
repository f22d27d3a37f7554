"""The report's figures, each from a table of analysis/tables.py, drawn in analysis/style.py.

Every function returns a Plot: the figure, its title and caption (model, batch size, hardware,
number of runs), the table it shows, and `empty`, the reason when there was nothing to draw (the
figure then says so instead of failing). Numbering follows issue 11:
  1 accuracy and speed-up vs kept share (two)   2 accuracy vs kept experts, bands over seeds
  3 union before selection vs batch size         4 the selection-rule ablation at equal budget
  5 backfill vs drop / re-routing                6 predictor R² per layer; kept-experts heat map
  7 the pre-registered replication's calls        8 decode speed-up over dense per batch size (H200 grid)
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import stats as S
from analysis import style
from analysis.tables import REASSIGN

ACC = "accuracy (exact match, mean over tasks)"
KEPT = "experts kept per MoE layer per decode step (mean)"
SPEED = "decode speed-up over dense (×)"
ORDER = ("top1_union", "router_sum", "router_sq", "count", "calib_freq", "calib_energy", "base", "oracle")


@dataclass
class Plot:
    name: str  # file stem under the report folder
    title: str
    caption: str
    fig: Figure
    table: pd.DataFrame
    empty: str | None = None  # why nothing was drawn

    def _repr_png_(self) -> bytes:  # a notebook shows a Plot as its PNG
        buf = io.BytesIO()
        with style.context():
            self.fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()


def _hw(values) -> str:
    hw = sorted({str(v) for v in values if isinstance(v, str) and v})
    return ", ".join(hw) if hw else "not recorded"


def _runs(n) -> str:
    return f"{int(np.nansum(np.asarray(n, dtype=float)))} runs"


def _empty(name: str, title: str, reason: str) -> Plot:
    with style.context():
        fig, (ax,) = style.new_figure(height=2.0)
        ax.set_title(title)
        style.empty_axes(ax, reason)
    return Plot(name, title, reason, fig, pd.DataFrame(), empty=reason)


def _finish(fig: Figure, name: str, title: str, caption: str, table: pd.DataFrame, xlabel: str | None = None) -> Plot:
    fig.suptitle(title, fontsize=11)
    style.caption(fig, caption, xlabel)
    return Plot(name, title, caption, fig, table)


def _variants(df: pd.DataFrame) -> list[str]:
    rank = {v: i for i, v in enumerate(ORDER)}
    return sorted(df["variant"].unique(), key=lambda v: (rank.get(v, len(ORDER)), v))


def _grid(n: int, ncols: int = 3, height: float = 3.0):
    ncols = min(ncols, n)
    fig, axes = style.new_figure(math.ceil(n / ncols), ncols, height=height)
    for ax in axes[n:]:
        ax.set_axis_off()
    return fig, axes


def _legend(fig: Figure, axes: list, below: int = 0, handles: list | None = None) -> None:
    """One legend for the figure, from every axis's labelled artists (or `handles`): right of the
    axes, or `below` > 0: under them in that many columns (for a long legend, which on the right
    would run past the figure's top and bottom). Either way outside the axes, over no data."""
    seen: dict[str, object] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    for h in handles or []:
        seen.setdefault(h.get_label(), h)
    if not seen:
        return
    if below:
        style.legend_below(fig, list(seen.values()), list(seen.keys()), min(below, len(seen)))
    else:
        fig.legend(list(seen.values()), list(seen.keys()), loc="outside right upper", fontsize=7.5)


# ---- 1: the trade-off, two measurements against one x ------------------------------------------
FRACTION = "experts kept per layer (fraction of the pool)"
MARKERS = ("o", "^", "s", "D", "v", "P", "X", "<", ">", "h")


def tradeoff_figure(tr: pd.DataFrame, batch_size: int = 16) -> Plot:
    """Two panels sharing x = experts kept per layer / experts in the layer: accuracy of the
    embedded (trained) models, and decode speed-up over dense of the random-weight real-model
    shapes. Two measurements on different models: no model has both (tables.tradeoff). Colour:
    the rule, as in every figure; marker: the model; line style: the router (speed-up)."""
    name = "fig1_tradeoff"
    title = f"Accuracy and decode speed-up against the share of experts kept, batch {batch_size}"
    qual = tr[tr["has_quality"] & tr["kept_frac"].notna()] if len(tr) else tr
    speed = tr[tr["has_speed"] & tr["kept_frac_timed"].notna()] if len(tr) else tr
    if qual.empty and speed.empty:
        return _empty(name, title, f"no quality or throughput results at batch {batch_size} "
                                   "(with the models' expert counts)")
    # the rules on both sides where the speed side has any (fixed is left out by tables.tradeoff)
    timed = set(speed["variant"]) - {"dense"}
    rules = [v for v in _variants(qual) if v != "dense" and (not timed or v in timed)]
    markers = dict(zip([*sorted(qual["model"].unique()), *sorted(set(speed["model"]) - set(qual["model"]))], MARKERS))
    notes: list[str] = []
    with style.context():
        fig, (top, bottom) = style.new_figure(2, 1, height=3.4, sharex=True)
        _accuracy_panel(top, qual, rules, markers, notes)
        _speed_panel(bottom, speed, markers, notes)
        bottom.set_xlabel(FRACTION)
    no_pool = sorted(set(tr.loc[tr["kept_frac"].isna() & tr["has_quality"], "model"])
                     | set(tr.loc[tr["kept_frac_timed"].isna() & tr["has_speed"], "model"])) if len(tr) else []
    caption = (f"Two measurements on different models, batch {batch_size}, sharing only the x axis (experts kept per "
               "MoE layer per decode step / experts in the layer): (a) accuracy of the embedded trained models on "
               "their tasks, on the CPU; (b) end-to-end decode speed-up over dense of random-weight models of real "
               "architectures' shapes (tokens/s in the same process, CUDA-graph replay, one timed run each). No model "
               "has both, so neither panel alone is the trade-off: read (a) and (b) at the same x. Unconnected "
               "points: rules without a budget (their own kept count). " + "; ".join(notes) + "."
               + (f" Left out (expert count unknown): {', '.join(no_pool)}." if no_pool else ""))
    return _finish(fig, name, title, caption, tr)


def _key(color: str = "#555555", marker: str | None = None, ls: str = "none", label: str = "", **kw) -> Line2D:
    """A legend entry not tied to one drawn line (a colour, a marker or a line style alone)."""
    return Line2D([], [], color=color, marker=marker, ls=ls, label=label, **kw)


def _accuracy_panel(ax, qual: pd.DataFrame, rules: list[str], markers: dict[str, str], notes: list[str]) -> None:
    ax.set_title("(a) accuracy: embedded trained models (CPU)", fontsize=9)
    if qual.empty:
        style.empty_axes(ax, "no quality results with the model's expert count")
        return
    models = sorted(qual["model"].unique())
    for model in models:
        m = qual[qual["model"] == model]
        dense = m[m["variant"] == "dense"]
        if len(dense):
            ax.axhline(dense["accuracy"].iloc[0], color="black", lw=0.8, ls=":")
            ax.annotate(f"{model}: dense", (1.0, dense["accuracy"].iloc[0]), xycoords=("axes fraction", "data"),
                        ha="right", va="bottom", fontsize=7, color="#333333")
        for v in rules:
            g = m[m["variant"] == v].sort_values("kept_frac")
            if len(g):
                ax.errorbar(g["kept_frac"], g["accuracy"], yerr=_yerr(g, "accuracy"), color=style.color(v),
                            marker=markers[model], ls="-" if g["budget"].notna().any() else "none", capsize=2)
        notes.append(f"(a) {model}: {m['exp'].iloc[0]}, {int(m['experts'].iloc[0])} experts per layer, "
                     f"{_runs(m['n'])}, hardware {_hw(m['quality_hardware'])}")
    keys = [_key(style.color(v), ls="-", label=v) for v in rules]
    keys += [_key(marker=markers[m], label=m) for m in models] + [_key("black", ls=":", lw=0.8, label="dense")]
    ax.legend(handles=keys, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7.5)
    ax.set_ylabel("accuracy (exact match)")
    ax.tick_params(labelbottom=True)


def _speed_panel(ax, speed: pd.DataFrame, markers: dict[str, str], notes: list[str]) -> None:
    ax.set_title("(b) decode speed-up over dense: random-weight real-model shapes"
                 + (f" ({_hw(speed['speed_hardware'])})" if len(speed) else ""), fontsize=9)
    if speed.empty:
        style.empty_axes(ax, "no throughput results with the model's expert count")
        return
    ax.axhline(1.0, color="black", lw=1)
    models = sorted(speed["model"].unique())
    for (model, routing), g in speed.groupby(["model", "routing"], dropna=False):
        ls = style.ROUTING_STYLE.get(routing, "-") if isinstance(routing, str) else "-"
        fill = {} if routing != "skewed" else {"mfc": "white"}
        base = g[g["variant"] == "base"].sort_values("kept_frac_timed")
        ax.plot(base["kept_frac_timed"], base["speedup"], color=style.color("base"), ls=ls, marker=markers[model],
                **fill)
        for v, o in g[g["budget"].isna() & (g["variant"] != "dense")].groupby("variant"):
            ax.plot(o["kept_frac_timed"], o["speedup"], color=style.color(v), marker=markers[model], ls="none", ms=6,
                    **fill)
    drawn = ["base", *sorted(set(speed.loc[speed["budget"].isna(), "variant"]) - {"dense"})]
    keys = [_key(style.color(v), ls="-" if v == "base" else "none", marker=None if v == "base" else "o", label=v)
            for v in drawn]
    keys += [_key(marker=markers[m], label=m) for m in models]
    routings = sorted(speed["routing"].dropna().unique())
    keys += [_key(ls=style.ROUTING_STYLE.get(r, "-"), marker="o", label=f"{r} router",
                  **({"mfc": "white"} if r == "skewed" else {})) for r in routings]
    keys.append(_key("black", ls="-", label="dense"))
    ax.legend(handles=keys, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7.5, ncols=2)
    pools = speed.groupby("model")["experts"].first()
    notes.append(f"(b) {', '.join(f'{m} ({int(n)} experts)' for m, n in pools.items())}"
                 f" on {_hw(speed['speed_hardware'])}, one curve per model and router" + _other_rules(speed))
    ax.set_ylabel(SPEED)


def _other_rules(speed: pd.DataFrame) -> str:
    """The budgeted rules timed besides base (not drawn): how far their speed-up is from base's."""
    key = ["model", "routing", "budget"]
    base = speed[speed["variant"] == "base"].set_index(key)["speedup"]
    others = speed[speed["budget"].notna() & ~speed["variant"].isin(["base", "dense"])]
    if others.empty or base.empty:
        return ""
    rel = (others.set_index(key)["speedup"] / base.reindex(others.set_index(key).index) - 1).abs().dropna()
    return (f"; also timed, not drawn: {', '.join(sorted(others['variant'].unique()))}, within "
            f"{100 * rel.max():.0f} % of base's speed-up at every timed point" if len(rel) else "")


def _yerr(g: pd.DataFrame, col: str):
    low, high = g.get(f"{col}_low"), g.get(f"{col}_high")
    if low is None or low.isna().all():
        return None
    # clipped at 0: a mean of equal values can round a hair past their min or max
    return np.vstack([(g[col] - low).fillna(0).to_numpy(float), (high - g[col]).fillna(0).to_numpy(float)]).clip(0)


# ---- 2: accuracy vs kept experts, bands over seeds or prompts -----------------------------------
def kept_figure(w: pd.DataFrame, exp: str) -> Plot:
    """Accuracy against the mean experts kept, one curve per selector across its budgets; the
    caption names only what was drawn (a dense line, squares, bands where the data has them)."""
    name, title = f"fig2_accuracy_kept_{exp}", f"Accuracy vs experts kept: {exp}"
    if w.empty or "accuracy" not in w or "kept_mean" not in w:
        return _empty(name, title, f"no evaluate runs with accuracy and kept experts in {exp}")
    drawn = {"curves": 0, "squares": [], "dense": False, "dense_band": False, "bands": False}
    with style.context():
        fig, (ax,) = style.new_figure(height=4.0, width=8.0)
        for v in _variants(w):
            g = w[w["variant"] == v].sort_values("kept_mean")
            c = style.color(v)
            if v == "dense":
                ax.axhline(g["accuracy"].iloc[0], color="black", lw=1, label="dense")
                drawn["dense"] = True
                if g["accuracy_low"].notna().any():
                    ax.axhspan(g["accuracy_low"].iloc[0], g["accuracy_high"].iloc[0], color="black", alpha=0.08)
                    drawn["dense_band"] = True
            elif g["budget"].isna().all():  # no budget: one point at its own kept count
                ax.errorbar(g["kept_mean"], g["accuracy"], yerr=_yerr(g, "accuracy"), color=c, marker="s", ls="none",
                            capsize=2, label=v)
                drawn["squares"].append(v)
            else:
                ax.plot(g["kept_mean"], g["accuracy"], color=c, marker="o", label=v)
                drawn["curves"] += 1
                if g["accuracy_low"].notna().any():
                    ax.fill_between(g["kept_mean"], g["accuracy_low"], g["accuracy_high"], color=c, alpha=0.15, lw=0)
                    drawn["bands"] = True
        ax.set_xlabel(KEPT)
        ax.set_ylabel(ACC)
        _legend(fig, [ax])
    seeds = int(w["n"].max())
    spread = ("the range (min to max) over batching seeds" if seeds > 1 else
              "the committed 95 % interval over prompts (Wilson)")
    parts = []
    if drawn["curves"]:
        parts.append(f"{drawn['curves']} selector(s), one curve each across budgets M (dots)"
                     + (f", shaded band: {spread}" if drawn["bands"] else ", no interval (one batching seed; "
                        "make quality SEEDS=0,1,2 adds them)"))
    if drawn["squares"]:
        parts.append(f"squares: rules without a budget ({', '.join(drawn['squares'])}), each at its own mean kept "
                     "count" + (f", whiskers: {spread}" if any(w.loc[w["variant"].isin(drawn["squares"]),
                                                                     "accuracy_low"].notna()) else ""))
    if drawn["dense"]:
        parts.append("black line: dense (every routed expert)" + (", grey band: its interval" if drawn["dense_band"]
                                                                  else ""))
    else:
        parts.append("no dense run in this grid")
    caption = (f"Model {w['model'].iloc[0]}; batch {_batch(w)}; hardware {_hw(w['hardware'])}; {_runs(w['n'])} "
               f"({_seeds(seeds)} per point). " + "; ".join(parts) + ".")
    cols = ["variant", "budget", "kept_mean", "accuracy", "accuracy_low", "accuracy_high", "n"]
    return _finish(fig, name, title, caption, w.reindex(columns=cols))


def _seeds(n: int) -> str:
    return "one batching seed" if n == 1 else f"up to {n} batching seeds"


def _batch(w: pd.DataFrame) -> str:
    b = sorted({int(x) for x in w["batch_size"].dropna()})
    return ",".join(map(str, b)) if b else "not recorded"


# ---- 3: union before selection vs batch size ---------------------------------------------------
# Control models whose routing statistics are committed beside the shipped models' (results/routing/<folder>/):
# what each controls for, for the caption.
CONTROLS = {"mini_olmoe_control": "mini_olmoe's size, data and steps trained with mini's routing settings (top-4, "
                                  "balance 0.005): like mini, top-4 of 32 experts"}


def _control(source) -> bool:
    """A routing-statistics row of a control model (results/routing/<control>/), not a shipped one."""
    return isinstance(source, str) and source not in ("throughput", "routing")


def union_figure(u: pd.DataFrame) -> Plot:
    """Distinct experts per layer per step before selection, and that count over the layer's experts,
    against batch size: colour the model, line style the router. A control model's routing statistics
    (a folder under results/routing/) are labelled so and drawn hollow, beneath the shipped models'."""
    name, title = "fig3_union_batch", "Union before selection vs batch size"
    if u.empty:
        return _empty(name, title, "no throughput runs and no routing statistics")
    controls = sorted({(m, s) for m, s in zip(u["model"], u["source"]) if _control(s)})
    with style.context():
        fig, axes = style.new_figure(1, 2, height=3.6)
        colors = style.palette(u["model"])
        for (model, routing, source), g in u.groupby(["model", "routing", "source"]):
            g = g.sort_values("batch_size")
            control = _control(source)
            label = f"{model} ({routing})" if not control else f"{model} (trained; a control)"
            kw = {"color": colors[model], "ls": "-." if control else style.ROUTING_STYLE.get(routing, "-"),
                  "marker": "o", "label": label, "zorder": 2 if control else 3}
            if control:
                kw.update(mfc="white", ms=6, lw=1.2)
            axes[0].plot(g["batch_size"], g["union"], **kw)
            axes[1].plot(g["batch_size"], g["pool_share"], **kw)
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("decode batch size (sequences)")
        axes[0].set_ylabel("distinct experts\nper MoE layer per decode step")
        axes[1].set_ylabel("union / experts in the layer\n(fraction of the layer's experts)")
        _legend(fig, axes, below=4)
    tp = u[u["source"] == "throughput"]
    trained = u[u["routing"] == "trained"]
    caption = ("Mean over MoE layers and decode steps of the distinct experts the batch routes to, before any "
               f"selection. Solid (uniform router) and dashed (skewed bias): dense rows of the throughput runs, random "
               f"weights of {tp['model'].nunique()} real architectures' shapes"
               + (f"; dotted ('trained'): routing statistics of the embedded models on their task prompts "
                  f"({', '.join(sorted(trained.loc[~trained['source'].map(_control), 'model'].unique()))}; "
                  "results/routing)" if len(trained) else "")
               + "".join(f"; dash-dot, hollow markers: {m}, a control model, not shipped (results/{src}): "
                         f"{CONTROLS.get(m, 'trained for a comparison')}; drawn beneath the shipped models' curves"
                         for m, src in controls)
               + ".")
    return _finish(fig, name, title, caption, u)


# ---- 4: the selection-rule ablation at equal budget --------------------------------------------
FIDELITY = (("energy_retained", "retained energy Σw²‖E‖² (kept / routed)"),
            ("out_error", "MoE-output error ‖Δy‖² / ‖y‖²"), ("kl", "KL(dense ‖ budget) per token (nats)"),
            ("accuracy", "accuracy"))


def rules_figure(w: pd.DataFrame, exp: str) -> Plot:
    name, title = f"fig4_rules_{exp}", f"Selection rules at equal budget: {exp}"
    metrics = [(m, lab) for m, lab in FIDELITY if m in w and w[m].notna().any()]
    budgeted = w[w["budget"].notna()] if len(w) else w
    if budgeted.empty or len(metrics) < 2:
        return _empty(name, title, f"{exp} has no budgeted runs with fidelity metrics (energy_retained, out_error, "
                                   "kl: eval.fidelity=true; runs recorded before them lack them)")
    budgets = sorted(int(b) for b in budgeted["budget"].unique())
    variants = _variants(budgeted)
    width = 0.8 / len(variants)
    with style.context():
        fig, axes = style.new_figure(1, len(metrics), height=3.6)
        for ax, (m, lab) in zip(axes, metrics):
            for i, v in enumerate(variants):
                g = budgeted[budgeted["variant"] == v].set_index("budget").reindex(budgets)
                x = np.arange(len(budgets)) - 0.4 + width * (i + 0.5)
                ax.errorbar(x, g[m], yerr=_yerr(g, m), color=style.color(v), marker="o", ls="none", capsize=2, label=v)
            dense = w[w["variant"] == "dense"]
            if m == "accuracy" and len(dense):
                ax.axhline(dense["accuracy"].iloc[0], color="black", lw=1, label="dense")
            ax.set_xticks(range(len(budgets)), [f"M={b}" for b in budgets])
            ax.set_title(lab, fontsize=8.5)
        _legend(fig, axes)
    caption = (f"Model {w['model'].iloc[0]}; batch {_batch(w)}; hardware {_hw(w['hardware'])}; {_runs(w['n'])} "
               f"({_seeds(int(w['n'].max()))} per point). Each selector keeps the same number of experts "
               "at a budget; whiskers: range over batching seeds (or, for one seed, the committed 95 % interval over prompts). Paired differences against base are "
               "in the table.")
    cols = ["variant", "budget", "kept_mean", *[c for m, _ in metrics for c in (m, f"{m}_low", f"{m}_high")], "n"]
    return _finish(fig, name, title, caption, budgeted.reindex(columns=cols),
                   xlabel="budget M: distinct experts kept per MoE layer per decode step")


# ---- 5: backfill vs drop and re-routing --------------------------------------------------------
def reassign_figure(w: pd.DataFrame, exp: str, paired: pd.DataFrame) -> Plot:
    name = "fig5_reassign" + (f"_{exp}" if exp else "")
    title = "Backfill vs drop and re-routing at equal budget" + (f": {exp}" if exp else "")
    modes = w[w["variant"].isin(REASSIGN) & w["budget"].notna()] if len(w) else w
    if modes.empty or modes["variant"].nunique() < 2:
        return _empty(name, title, f"{exp or 'no sweep'} has no base run with another reassign mode at the same budget")
    metrics = [(m, lab) for m, lab in (("accuracy", "accuracy"), *FIDELITY[:3]) if m in modes and modes[m].notna().any()]
    with style.context():
        fig, axes = style.new_figure(1, len(metrics), height=3.4)
        for ax, (m, lab) in zip(axes, metrics):
            for v, g in modes.groupby("variant"):
                g = g.sort_values("budget")
                label = {"base": "base (backfill)"}.get(v, v)
                ax.errorbar(g["budget"].astype(float), g[m], yerr=_yerr(g, m), color=style.color(v), marker="o",
                            capsize=2, label=label)
            ax.set_xticks(sorted(modes["budget"].astype(int).unique()))
            ax.set_xlabel("budget M")
            ax.set_title(lab, fontsize=8.5)
        _legend(fig, axes, below=3)
    seeds = int(modes["n"].max())
    caption = (f"Model {w['model'].iloc[0]}; batch {_batch(w)}; hardware {_hw(w['hardware'])}; {_runs(modes['n'])}. "
               "backfill: a token that lost experts takes its next-preferred kept ones; drop: the slots stay empty; "
               "similar: the pair moves to the kept expert with the most similar outputs. "
               + ("Whiskers: range over batching seeds (one seed: the 95 % interval over prompts); " if seeds > 1 else "One run per point; ")
               + ("the table gives each mode minus backfill, paired, with its call (higher, lower, tie, inconclusive; "
                  "how each grid's calls were made is stated above the table)." if len(paired)
                  else "no paired comparison available (no per-request records)."))
    table = modes.reindex(columns=["variant", "budget", *[c for m, _ in metrics for c in (m, f"{m}_low", f"{m}_high")],
                                   "n"])
    return _finish(fig, name, title, caption, table)


# ---- 6: predictor R² per layer; kept experts per layer and step --------------------------------
def r2_figure(r2: pd.DataFrame) -> Plot:
    name, title = "fig6a_predictor_r2", "Norm predictor: held-out R² per layer"
    if r2.empty:
        return _empty(name, title, "no fitted predictor (stage=fit) and no committed *_predictor_r2.csv")
    with style.context():
        fig, (ax,) = style.new_figure(height=3.6, width=8.0)
        colors = style.palette(r2["model"])
        for model, g in r2.groupby("model"):
            g = g.sort_values("layer")
            depth = g["layer"] / max(1, g["layer"].max())
            random = g["source"].iloc[0] == "throughput"  # the throughput grid's models: random weights
            ax.plot(depth, g["r2"], color=colors[model], marker="o",
                    label=f"{model} ({len(g)} layers{', random weights' if random else ', trained'})")
            if "r2_within" in g and g["r2_within"].notna().any():
                ax.plot(depth, g["r2_within"], color=colors[model], ls="--", marker=".")
        ax.set_xlabel("layer / (layers − 1)")
        ax.set_ylabel("held-out R² of log‖E_u(z)‖")
        _legend(fig, [ax], below=2)
    caption = ("Per MoE layer, R² of the linear predictor of log expert-output norm on held-out calibration tokens "
               "(solid; dashed: within experts, the token-dependent part). Sources: " +
               "; ".join(f"{m}: {s}" for m, s in r2.groupby("model")["source"].first().items()) +
               ". The throughput models have random weights.")
    return _finish(fig, name, title, caption, r2)


def heatmap_figure(h: pd.DataFrame, exp: str) -> Plot:
    name = "fig6b_kept_heatmap" + (f"_{exp}" if exp else "")
    title = "Kept experts per layer and decode step, adaptive budgets" + (f": {exp}" if exp else "")
    if h.empty:
        return _empty(name, title, "no adaptive-budget run (method.coverage, budget_split) with selection_steps.csv "
                                   f"in {exp or 'outputs/'}")
    panels = list(h.groupby(["variant", "budget"], dropna=False))
    vmax = float(h["kept"].max())
    with style.context():
        fig, axes = _grid(len(panels), ncols=2, height=2.4)
        for ax, ((v, budget), g) in zip(axes, panels):
            grid = g.pivot_table(index="layer", columns="step", values="kept")
            im = ax.imshow(grid.to_numpy(), aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=vmax,
                           interpolation="nearest", extent=(grid.columns.min() - 0.5, grid.columns.max() + 0.5,
                                                            -0.5, len(grid) - 0.5))
            seed = g["seed"].iloc[0]
            ax.set_title(f"{v}" + ("" if pd.isna(budget) else f", M={int(budget)}") +
                         ("" if pd.isna(seed) else f" (batching seed {int(seed)})"), fontsize=8.5)
            ax.set_xlabel("decode step")
            ax.set_ylabel("MoE layer")
        fig.colorbar(im, ax=axes[:len(panels)], label="experts kept", shrink=0.9)
    caption = (f"Model {h['model'].iloc[0]}; batch {_batch(h)}; {len(panels)} runs (outputs/), one per rule: the "
               "lowest batching seed. Experts kept at each MoE layer and decode step, steps in run order over all "
               "decode batches (a batch's last steps hold few unfinished sequences, hence the dark columns).")
    return _finish(fig, name, title, caption, h)


# ---- 7: the pre-registered replication: each rule minus base, with its corrected call ------------
CALL_COLORS = {"higher": "#2ca02c", "lower": "#d62728", "tie": "#1f77b4", "inconclusive": "#8c8c8c"}
LEVEL_MARKERS = {"tight": "o", "middle": "s", "loose": "^"}


def replication_figure(calls: pd.DataFrame) -> Plot:
    """One panel per model: each rule's accuracy minus base's at the same budget, in percentage
    points, with its 95 % interval, coloured by its Holm-corrected call (tables.replication_calls)."""
    name, title = "fig7_replication", "Pre-registered replication: accuracy of each rule minus base, same budget"
    if calls.empty:
        return _empty(name, title, "no results/replication*_paired.csv (make replication, docs/preregistration.md)")
    models = list(dict.fromkeys(calls["model"]))
    rules = list(dict.fromkeys(calls["method"]))
    levels = [lv for lv in LEVEL_MARKERS if lv in set(calls["level"])]
    step = 0.8 / max(len(levels), 1)
    with style.context():
        fig, axes = style.new_figure(1, len(models), height=3.6, sharey=True)
        for ax, model in zip(axes, models):
            g = calls[calls["model"] == model]
            for i, lv in enumerate(levels):
                for _, r in g[g["level"] == lv].iterrows():
                    y = rules.index(r["method"]) - 0.4 + step * (i + 0.5)
                    d, lo, hi = 100 * r["diff"], 100 * r["low"], 100 * r["high"]
                    ax.errorbar([d], [y], xerr=[[d - lo], [hi - d]], color=CALL_COLORS.get(r["call"], "#000000"),
                                marker=LEVEL_MARKERS[lv], ls="none", capsize=2, ms=5)
            ax.axvline(0, color="black", lw=0.8)
            budgets = g.drop_duplicates("level").set_index("level").reindex(levels)["budget"].dropna().astype(int)
            ax.set_title(f"{model}: M = {', '.join(map(str, budgets))}", fontsize=9)
            ax.set_xlabel("rule − base (accuracy, percentage points)")
        axes[0].set_yticks(range(len(rules)), rules)
        axes[0].invert_yaxis()
        keys = [_key(CALL_COLORS[c], marker="o", label=c) for c in CALL_COLORS if c in set(calls["call"])]
        keys += [_key(marker=LEVEL_MARKERS[lv], label=f"{lv} budget") for lv in levels]
        _legend(fig, [], below=len(keys), handles=keys)
    fams = calls.groupby("source").agg(models=("model", lambda m: ", ".join(dict.fromkeys(m))),
                                       m=("family_size", "first"), n=("n", "first"))
    caption = ("Each rule's accuracy minus base's at the same budget M (distinct experts kept per MoE layer per "
               "decode step), paired over the same fresh prompts, continuous batching; marker: the difference, bar: "
               "its own 95 % interval (Tango score; not Holm-adjusted). Colour: the call of the exact McNemar test "
               f"after Holm's correction over its family at {S.ALPHA:g}: "
               + "; ".join(f"{r['models']}: {int(r['n']):,} prompts, {int(r['m'])} comparisons ({src})"
                           for src, r in fams.iterrows())
               + ". Higher/lower where the corrected test rejects, else inconclusive; no accuracy tie is called "
               "(analysis/stats.py: accuracy is not among its TIE_METRICS). oracle is an upper bound, not a rule to "
               "deploy. Pre-registered in docs/preregistration.md.")
    return _finish(fig, name, title, caption, calls)


# ---- 8: decode speed-up over dense per batch size, the committed H200 grid ----------------------
def speedup_figure(speed: pd.DataFrame, variant: str = "base") -> Plot:
    """One panel per decode batch size: `variant`'s end-to-end decode speed-up over dense against
    the share of experts kept, one curve per model (colour) and router (line style); CUDA-graph rows."""
    name, title = "fig8_speedup_batch", f"Decode speed-up of {variant} over dense, per batch size"
    s = speed[(speed["mode"] == "graph") & (speed["variant"] == variant)] if len(speed) and "mode" in speed else speed
    if s.empty or "num_experts" not in s or s["num_experts"].isna().all():
        return _empty(name, title, f"no CUDA-graph throughput rows of {variant} with the model's expert count")
    s = s.assign(kept_frac=pd.to_numeric(s["kept_mean"], errors="coerce") / pd.to_numeric(s["num_experts"]))
    sizes = sorted(int(b) for b in s["batch_size"].dropna().unique())
    colors = style.palette(s["model"])
    with style.context():
        fig, axes = style.new_figure(1, len(sizes), height=3.4, sharey=True)
        for ax, bs in zip(axes, sizes):
            for (model, routing), g in s[s["batch_size"] == bs].groupby(["model", "routing"], dropna=False):
                g = g.sort_values("kept_frac")
                ax.plot(g["kept_frac"], g["speedup_vs_dense"], color=colors[model], marker="o",
                        ls=style.ROUTING_STYLE.get(routing, "-"), label=f"{model} ({routing} router)")
            ax.axhline(1.0, color="black", lw=1, label="dense (1×)")
            ax.set_title(f"batch {bs}", fontsize=9)
        axes[0].set_ylabel(SPEED)
        _legend(fig, axes, below=5)
    pools = s.groupby("model")["num_experts"].first()
    budgets = sorted(int(b) for b in s["budget"].dropna().unique())
    caption = (f"{variant} at budgets M = {', '.join(map(str, budgets))} against dense: tokens/s ratio in the same "
               "process, CUDA-graph replay, one timed run per point; x: mean experts kept per MoE layer per decode step "
               "over the layer's experts. Random bf16 weights of real architectures' shapes ("
               + ", ".join(f"{m}: {int(n)} experts" for m, n in pools.items())
               + f"); solid: uniform router, dashed: skewed router bias; hardware {_hw(s['hardware'])}. "
               f"Only {variant} is drawn; the other rules timed in the same runs are not.")
    cols = ["model", "routing", "batch_size", "budget", "kept_mean", "kept_frac", "tokens_per_s", "speedup_vs_dense",
            "hardware"]
    return _finish(fig, name, title, caption, s.reindex(columns=cols),
                   xlabel="experts kept per MoE layer per decode step (fraction of the layer's experts)")
