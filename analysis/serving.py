"""The serving benchmark's table and figure, from the serve.csv of runs of `throughput.mode=serve`.

    python -m analysis.serving results/serve/runs results/serve/summary

Reads every serve.csv under the folder in a finished run folder (one with report.json; one row per
served stream: base/runtime/serving.py). A run stopped midway leaves the streams it finished in its
`.partial-*` folder: skipped, with a warning naming it, as is any folder without report.json. Runs
of two decode engines, or two runs serving the same cell and repeat, are refused (exit 2). Writes:

  <dest>.csv, <dest>.md   one row per (model, routing, slots, variant, budget, rate): the repeats
                          it has, the places it was served in (the order rotates), and over the
                          repeats the median and range of achieved output tokens/s and requests/s,
                          TTFT, TPOT, ITL and E2EL (p50 and p99 of each stream), goodput, and
                          tokens/s over dense's in the same repeat and rate (paired);
                          the .md adds, per (routing, slots, variant), the highest median goodput
                          over the rates and its ratio to dense's
  <dest>_tpot.png / .svg  TPOT p50 and p99 against achieved output tokens/s, one panel row per
                          (routing, slots), a line per variant through its rates (median over
                          repeats, bars: the range), the TPOT SLO dashed
  <dest>_probe.csv        where a run has step_probe.csv: per (run, variant) the decode step inside
                          its first rate's streams (median over repeats) beside the probes' replays
                          of the same engine with every slot decoding and, where recorded, of the
                          static engine at the same rows and context, and their ratios

Timings are medians over repeats with their range (no test: the runs are few). Every table ends in
the column `engine`, the decode engine of the runs (analysis/engines.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import style
from analysis.engines import engine_of, one_engine, with_engine
from analysis.load import (
    _config,
    command_line,
    fail,
    finished,
    one_run_per_cell,
    read_report,
)

ROUTING_ORDER = {"uniform": 0, "skewed": 1}  # tables and panels: uniform first
# a cell: one configuration served; runs with other scheduler thresholds are other cells
CELL = ["model", "routing", "slots", "min_prompt_tokens", "max_wait_steps", "variant", "method", "budget", "rate"]
# the scheduler's defaults, for runs made before serve.csv recorded its thresholds
THRESHOLD_DEFAULTS = {"min_prompt_tokens": 1, "max_wait_steps": 0}
MEASURES = {"output_throughput": "tok_s", "request_throughput": "req_s", "ttft_ms_p50": "ttft_p50",
            "ttft_ms_p99": "ttft_p99", "tpot_ms_p50": "tpot_p50", "tpot_ms_p99": "tpot_p99",
            "itl_ms_p50": "itl_p50", "itl_ms_p99": "itl_p99", "e2el_ms_p50": "e2el_p50", "e2el_ms_p99": "e2el_p99",
            "goodput": "goodput", "good_fraction": "good_fraction", "speedup_vs_dense": "speedup",
            "occupancy_mean": "occupancy", "step_ms_median": "step_ms", "gap_ms_median": "gap_ms",
            "launch_ms_median": "launch_ms", "rounds": "rounds", "prefill_s": "prefill_s"}
# the decode step inside the stream (runs before 2026-12-02's second session lack gap and launch
# times), and the stream's admission rounds and their prefill time
STEP_COLS = ["occupancy", "step_ms", "gap_ms", "launch_ms", "rounds", "prefill_s"]


def load(root: Path) -> pd.DataFrame:
    """Every stream row under root, with its tokens/s over dense's (same routing, slots, rate, repeat)."""
    frames = [pd.read_csv(p).assign(_run=str(p.parent), engine=engine_of(read_report(p.parent / "report.json"),
                                                                         _config(p.parent)))
              for p in finished(root, "serve.csv")]
    if not frames:
        fail(f"no serve.csv of a finished run under {root} (runs of throughput.mode=serve)")
    df = _with_thresholds(pd.concat(frames, ignore_index=True))
    one_engine(df, f"the serving table of {root}")
    _one_run_per_cell(df)
    df["rate"] = df["rate"].astype(float)  # NaN: the closed burst
    # the burst's NaN rate as a number for the join: pandas 2 (the GPU host's) fails to join on a
    # level that is all NaN ("cannot do a non-empty take from an empty axes") when only the burst ran
    df["_rate"] = df["rate"].fillna(-1.0)
    key = ["model", "routing", "slots", *THRESHOLD_DEFAULTS, "_rate", "repeat"]
    dense = df[df["variant"] == "dense"].set_index(key)["output_throughput"].rename("dense_tok_s")
    df = df.join(dense, on=key)
    df["speedup_vs_dense"] = df["output_throughput"] / df["dense_tok_s"]
    return df.drop(columns=["dense_tok_s", "_rate", "_run"])


def _one_run_per_cell(df: pd.DataFrame) -> None:
    """Refuse two run folders serving the same cell and repeat: their streams would be pooled as one
    repeat's (a rerun beside its first run, two grids under one folder)."""
    one_run_per_cell(df, [c for c in [*CELL, "arrivals", "search_step", "repeat"] if c in df], "served",
                     lambda r: f"{r['variant']} at rate {_rate(r['rate'])}, repeat {r['repeat']}",
                     "analyse one grid's runs at a time")


def _with_thresholds(df: pd.DataFrame) -> pd.DataFrame:
    """The scheduler thresholds of every row, the defaults where a run did not record them."""
    df = df.copy()
    for col, default in THRESHOLD_DEFAULTS.items():
        df[col] = (df[col] if col in df else pd.Series(default, index=df.index)).fillna(default).astype(int)
    return df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: repeats, places served, and median / min / max over repeats of MEASURES."""
    rows = []
    for cell, g in df.groupby(CELL, dropna=False, sort=True):
        row = dict(zip(CELL, cell)) | {"repeats": g["repeat"].nunique(),
                                        "positions": ",".join(map(str, sorted(g["position"].unique()))),
                                        "captures": g["captures"].max() if "captures" in g else np.nan}
        for col, name in MEASURES.items():
            v = g[col].dropna() if col in g else pd.Series(dtype=float)
            row[name] = v.median() if len(v) else np.nan
            row[f"{name}_min"], row[f"{name}_max"] = (v.min(), v.max()) if len(v) else (np.nan, np.nan)
        rows.append(row)
    out = pd.DataFrame(rows)
    out["arrivals"] = np.where(out["rate"].isna(), "burst", "poisson")
    # rows by rate (the burst last: the highest load), dense first, then each method by falling budget
    rank = out.assign(_routing=out["routing"].map(ROUTING_ORDER).fillna(len(ROUTING_ORDER)),
                      _rate=out["rate"].fillna(np.inf), _dense=out["variant"] != "dense", _budget=-out["budget"])
    keys = ["model", "_routing", "routing", "slots", *THRESHOLD_DEFAULTS, "_rate", "_dense", "variant", "_budget"]
    return out.loc[rank.sort_values(keys).index].reset_index(drop=True)


def best_goodput(t: pd.DataFrame) -> pd.DataFrame:
    """Per (routing, slots, variant): the highest median goodput over the rates, and over dense's."""
    rows = []
    run = ["model", "routing", "slots", *THRESHOLD_DEFAULTS]
    for key, g in t.groupby([*run, "variant", "budget"], dropna=False, sort=True):
        top = g.loc[g["goodput"].idxmax()]
        rows.append(dict(zip([*run, "variant", "budget"], key))
                    | {"goodput_req_s": top["goodput"], "at": _rate(top["rate"]), "rates": len(g)})
    out = pd.DataFrame(rows)
    dense = out[out["variant"] == "dense"].set_index(run)["goodput_req_s"]
    out["over_dense"] = out["goodput_req_s"] / out.join(dense.rename("d"), on=run)["d"]
    shown = [c for c in out.columns if c not in THRESHOLD_DEFAULTS or c in _thresholds(t)]
    return out[shown]


def _rate(r: float) -> str:
    return "burst" if pd.isna(r) else f"{r:g}/s"


def _budget(b: float) -> str:
    return "-" if pd.isna(b) else f"{b:g}"


def _spread(t: pd.DataFrame, name: str, fmt: str) -> list[str]:
    return [f"{m:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]" if pd.notna(m) else "" for m, lo, hi in
            zip(t[name], t[f"{name}_min"], t[f"{name}_max"])]


def markdown(t: pd.DataFrame, src: str, dest: str, slo: str) -> str:
    show = t.assign(rate=t["rate"].map(_rate), budget=t["budget"].map(_budget),
                    tok_s=_spread(t, "tok_s", ".0f"), speedup=_spread(t, "speedup", ".2f"),
                    tpot_p50=_spread(t, "tpot_p50", ".1f"), tpot_p99=_spread(t, "tpot_p99", ".1f"),
                    ttft_p50=_spread(t, "ttft_p50", ".0f"), ttft_p99=_spread(t, "ttft_p99", ".0f"),
                    goodput=_spread(t, "goodput", ".2f"))
    cols = ["routing", "slots", *_thresholds(t), "rate", "variant", "budget", "repeats", "positions", "tok_s",
            "speedup", "req_s",
            "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "e2el_p50", "e2el_p99", "goodput",
            "captures"]
    best = best_goodput(t).assign(budget=lambda d: d["budget"].map(_budget))
    engine = f" Decode engine: `{t['engine'].iloc[0]}` (analysis/engines.py)." if "engine" in t else ""
    return (f"Made by `python -m analysis.serving {src} {dest}` from the serve.csv of each run "
            f"(`throughput.mode=serve`, base/runtime/serving.py).{engine}\n\n"
            "Per (routing, slots, request rate, variant): the median over repeats and, in brackets, the range. "
            "`tok_s`: achieved output tokens/s; `speedup`: tokens/s over dense's in the same repeat and rate; "
            "`req_s`: achieved requests/s; TTFT, TPOT, ITL, E2EL in ms (p50 and p99 of each stream's requests; "
            "ITL pools every gap between tokens); `goodput`: requests/s meeting both SLOs of the runs' "
            f"serve.slo_ttft_ms / slo_tpot_ms ({slo}); `positions`: the places in its repeats' order the variant was "
            "served in (the order rotates); `captures`: the most CUDA graphs any of its streams captured (0: the "
            "warm-up covered every shape); burst: every request at once.\n\n"
            + show[cols].to_markdown(index=False, floatfmt=".1f")
            + _step_table(t)
            + "\n\nHighest median goodput over the rates run, per variant (`at`: the rate where it was reached; "
              "a coarse grid of rates bounds what it can show):\n\n"
            + best.to_markdown(index=False, floatfmt=".2f") + "\n")


def _thresholds(t: pd.DataFrame) -> list[str]:
    """The scheduler's threshold columns, shown where the runs differ from the defaults."""
    return [c for c, d in THRESHOLD_DEFAULTS.items() if (t[c] != d).any()]


def _step_table(t: pd.DataFrame) -> str:
    have = [c for c in STEP_COLS if c in t and t[c].notna().any()]
    if not have:
        return ""
    show = t.assign(rate=t["rate"].map(_rate), budget=t["budget"].map(_budget),
                    **{c: _spread(t, c, ".0f" if c == "rounds" else ".2f") for c in have})
    return ("\n\nThe decode-only steps inside the streams (medians per stream, then the median and range over "
            "repeats): `occupancy`: requests decoding per step (decode and mixed steps); `step_ms`: device time "
            "between CUDA events around a replayed step; `gap_ms`: device time from the end of the forward before "
            "it to its start (the GPU waiting for the host); `launch_ms`: host time to launch it; `rounds`: "
            "admission rounds of the stream; `prefill_s`: device time of its prefill forwards.\n\n"
            + show[["routing", "slots", *_thresholds(t), "rate", "variant", "budget"] + have].to_markdown(index=False))


MARKERS = {None: "o", 16: "o", 10: "s"}


def figure(t: pd.DataFrame, slo_tpot_ms: float | None, caption: str):
    """TPOT p50 / p99 against achieved tokens/s, a panel row per (routing, slots)."""
    groups = sorted(t.groupby(["routing", "slots"]), key=lambda kv: (ROUTING_ORDER.get(kv[0][0], 2), kv[0]))
    with style.context():
        fig, axes = style.new_figure(len(groups), 2, height=3.2)
        for r, ((routing, slots), g) in enumerate(groups):
            for c, q in enumerate(("p50", "p99")):
                ax = axes[2 * r + c]
                for (variant, budget), line in g.groupby(["variant", "budget"], dropna=False, sort=True):
                    line = line.assign(order=line["rate"].fillna(np.inf)).sort_values("order")
                    x, y = line["tok_s"], line[f"tpot_{q}"]
                    label = variant if pd.isna(budget) else f"{variant} M={budget:g}"
                    b = None if pd.isna(budget) else int(budget)
                    ax.errorbar(x, y, xerr=[x - line["tok_s_min"], line["tok_s_max"] - x],
                                yerr=[y - line[f"tpot_{q}_min"], line[f"tpot_{q}_max"] - y], color=style.color(variant),
                                marker=MARKERS.get(b, "^"), linestyle="-" if b in (None, 16) else "--",
                                capsize=2, label=label)
                    for xi, yi, rate in zip(x, y, line["rate"]):
                        ax.annotate(_rate(rate), (xi, yi), textcoords="offset points", xytext=(3, 3), fontsize=6)
                if slo_tpot_ms:
                    ax.axhline(slo_tpot_ms, color="#888888", linestyle=":", linewidth=1)
                ax.set_title(f"{routing} routing, {slots} slots: TPOT {q}")
                ax.set_ylabel("TPOT (ms)")
                ax.set_xlabel("achieved output tokens/s")
        axes[0].legend(loc="upper left")
        style.caption(fig, caption)
    return fig


def sustained(df: pd.DataFrame) -> pd.DataFrame:
    """From the rate search's streams (`arrivals` "search"): per (routing, slots, variant) and
    repeat, the highest rate whose share of requests meeting both SLOs reached the run's
    serve.search_attainment (NaN: no rate did); the median and range over repeats, and over
    dense's in the same repeat."""
    df = _with_thresholds(df)
    s = df[df["arrivals"] == "search"] if "arrivals" in df else df.iloc[:0]
    if s.empty:
        return pd.DataFrame()
    s = s.assign(ok=s["good_fraction"] >= s["search_attainment"])
    key = ["model", "routing", "slots", *THRESHOLD_DEFAULTS, "variant"]  # a variant's label names its method and budget
    per = (s[s["ok"]].groupby(key + ["repeat"])["rate"].max()
           .reindex(s.groupby(key + ["repeat"]).size().index).rename("sustained").reset_index())
    run = ["model", "routing", "slots", *THRESHOLD_DEFAULTS, "repeat"]
    dense = per[per["variant"] == "dense"].set_index(run)["sustained"]
    per["over_dense"] = per["sustained"] / per.join(dense.rename("d"), on=run)["d"]
    meta = s.groupby(key).agg(method=("method", "first"), budget=("budget", "first"),
                              steps=("search_step", "nunique"), attainment=("search_attainment", "first"))
    rows = []
    for cell, g in per.groupby(key, sort=True):
        row = dict(zip(key, cell)) | meta.loc[cell].to_dict() | {"repeats": len(g)}
        for col in ("sustained", "over_dense"):
            v = g[col]
            row[col] = v.median() if v.notna().all() else np.nan  # a repeat with no sustained rate: no median
            row[f"{col}_min"], row[f"{col}_max"] = v.min(), v.max()
        rows.append(row)
    return pd.DataFrame(rows)


def probe_table(root: Path) -> pd.DataFrame:
    """Per run folder holding step_probe.csv and serve.csv, per variant: the in-stream decode step
    of its first rate (median over repeats of each stream's median step) against the probes."""
    rows = []
    for path in finished(root, "step_probe.csv"):
        probe, serve = pd.read_csv(path), _with_thresholds(pd.read_csv(path.parent / "serve.csv"))
        engine = engine_of(read_report(path.parent / "report.json"), _config(path.parent))
        serve = serve[serve["arrivals"] != "search"] if "arrivals" in serve else serve
        for _, p in probe.iterrows():
            # a variant at each budget is its own: base M=16's probe against base M=16's streams only
            same_budget = serve["budget"].isna() if pd.isna(p["budget"]) else serve["budget"] == p["budget"]
            mine = serve[(serve["variant"] == p["variant"]) & same_budget]
            if mine.empty:
                continue
            first = mine.sort_values(["repeat", "position"]).iloc[0]
            at = mine[mine["rate"].isna()] if pd.isna(first["rate"]) else mine[mine["rate"] == first["rate"]]
            stream = at["step_ms_median"].median()
            static = p.get("static_step_ms", np.nan)
            rows.append({"run": path.parent.name, **{c: first[c] for c in ("routing", "slots", *THRESHOLD_DEFAULTS)},
                         "rate": first["rate"], "variant": p["variant"], "budget": p["budget"],
                         "context": p.get("stream_context_median", np.nan), "probe_from": p["prompt_tokens"],
                         "occupancy": at["occupancy_mean"].median(), "in_stream_ms": stream,
                         "probe_ms": p["full_step_ms"], "static_ms": static,
                         "stream_over_probe": stream / p["full_step_ms"] - 1, "stream_over_static": stream / static - 1,
                         "probe_over_static": p["full_step_ms"] / static - 1, "engine": engine})
    out = pd.DataFrame(rows)
    if len(out):
        one_engine(out, f"the probe table of {root}")
    return out


def _probe_markdown(probes: pd.DataFrame) -> str:
    show = probes.assign(rate=probes["rate"].map(_rate), budget=probes["budget"].map(_budget))
    return ("\nThe decode step inside the streams against the probes (base/runtime/step_probe.py, "
            "one probe per variant, a reading): `in_stream_ms`: the first rate's streams, median over repeats; "
            "`probe_ms`: the same engine with every slot decoding from `probe_from` tokens of context "
            "(32 replays); `static_ms`: the static engine at the same rows and context (the grid's timing, "
            "32 replays); `context`: the median context the variant's first stream's decode steps read "
            "(blank: a run before it was recorded, probed at the requests' median prompt); the ratios "
            "less 1.\n\n" + show.to_markdown(index=False, floatfmt=".3f") + "\n")


def main(src: str, dest: str) -> None:
    df = load(Path(src))
    engine = one_engine(df, f"the serving table of {src}")
    search = sustained(df)
    search = with_engine(search, engine) if not search.empty else search
    df = df[df["arrivals"] != "search"] if "arrivals" in df else df
    t = with_engine(summary(df), engine)
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    t.to_csv(out.with_suffix(".csv"), index=False)
    slos = sorted(set(zip(df["slo_ttft_ms"], df["slo_tpot_ms"])))
    text = markdown(t, src, dest, "; ".join(f"TTFT <= {a:g} ms and TPOT <= {b:g} ms" for a, b in slos))
    if not search.empty:
        search.to_csv(out.parent / f"{out.name}_sustained.csv", index=False)
        text += ("\nThe rate search (`serve.search_steps` streams per variant and repeat, a geometric "
                 "bisection): `sustained` is the highest request rate at which at least `attainment` of a "
                 "stream's requests met both SLOs (median [range] over repeats; NaN where a repeat found "
                 "none); `over_dense` that rate over dense's in the same repeat. Its resolution is the "
                 "bisection's last step.\n\n" + search.to_markdown(index=False, floatfmt=".2f") + "\n")
    probes = probe_table(Path(src))
    if not probes.empty:
        probes.to_csv(out.parent / f"{out.name}_probe.csv", index=False)
        text += _probe_markdown(probes)
    out.with_suffix(".md").write_text(text)
    slo = df["slo_tpot_ms"].dropna().unique()
    models = ", ".join(sorted(df["model"].unique()))
    cap = (f"{models}; median over {df['repeat'].nunique()} repeats (bars: range); each point one request rate "
           f"(burst: all at once); dotted: the TPOT SLO. Made by `python -m analysis.serving {src} {dest}`.")
    style.save(figure(t, float(slo[0]) if len(slo) == 1 else None, cap), out.parent, f"{out.name}_tpot")
    print(text)


if __name__ == "__main__":
    main(*command_line(__doc__, 2))
