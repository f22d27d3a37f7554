"""The READMEs' numbers, recomputed from the committed files they cite (issue 20 item 7; one
registry per document since issue 44).

    python -m analysis.claims                 # every disagreement between the documents and the files (exit 1 if any)
    python -m analysis.claims --write         # first rewrite each document's generated blocks, then check
    python -m analysis.claims --doc results/speed/README.md   # one document (repeatable)

`DOCS` maps each checked document (path from the repository root) to its registry,
`Document(checks, blocks)`:

  checks  one `Check` per phrase: the exact text as the document has it (compared with runs of
          white space collapsed, so re-wrapping a paragraph changes nothing) and a function that
          rebuilds that text from the committed file(s) it cites. A phrase the document no longer
          has, or whose numbers (or beats/ties wording) the files no longer give, is reported.
  blocks  generated blocks: text between `<!-- claims:NAME ... -->` and `<!-- /claims:NAME -->`
          written by a function (`--write`) instead of by hand; each must equal its rendering.

    README.md                  CHECKS, BLOCKS (the recommendation)
    results/README.md          RESULT_CHECKS, RESULT_BLOCKS (the pre-registered replication)
    results/quality/README.md  QUALITY_CHECKS, QUALITY_BLOCKS (each static grid's reading, written from
                               its `<grid>_paired.csv` by analysis/readings.py; calls across grids; the
                               front page's quality bullets until 2026-12-05 and how a difference is called)
    results/speed/README.md    SPEED_CHECKS (the kernel table; the front page's speed bullets until 2026-12-05)

The phrases of issue 27 live in analysis/claims_calls.py and analysis/claims_replication.py.
`check_document(path)` checks one document; `check_tables` asserts the committed comparison tables
carry up-to-date cross-grid columns (analysis/cross_grid.py).

Reads results/ and benchmarks/ only (no model, no torch); the older checks use the standard
library, issue 27's phrases and the generated readings pandas.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from analysis import claims_calls as calls_phrases
from analysis import claims_replication as replication_phrases

ROOT = Path(__file__).resolve().parents[1]
THROUGHPUT = "results/throughput/summary.csv"
GUARD = "results/refactor_guard/h200/comparison.csv"
KERNELS = "benchmarks/kernels/NVIDIA_H200.json"
STREAM = "results/stream/summary.csv"
ORDER = "results/stream/order.csv"
ROUTING = "results/routing/routing_stats.csv"
DASH = "–"  # en dash, as the README writes ranges


# ----------------------------------------------------------------------------------------- reading

def _rows(rel: str) -> list[dict[str, str]]:
    """A committed CSV's rows (lines starting with '#' are comments)."""
    with open(ROOT / rel, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _num(v: str) -> float | None:
    return float(v) if v not in ("", "nan", "NaN", None) else None


def _rng(values, fmt: str = ".2f", sep: str = DASH) -> str:
    """'min–max' (one value when both ends print the same)."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}{sep}{hi}"


def _short(x: float) -> str:
    """Two decimals without trailing zeros (3.10 -> 3.1), as the README writes some speed-ups."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _one(rows: list[dict], what: str, **keys) -> dict:
    """The single row matching keys (a committed file with two runs of one cell is an error here)."""
    hit = [r for r in rows if all(str(r[k]) == str(v) for k, v in keys.items())]
    if len(hit) != 1:
        raise ValueError(f"{what}: {len(hit)} rows for {keys}")
    return hit[0]


# ---------------------------------------------------------------------- end to end (results/throughput)

def _graph() -> list[dict]:
    return [r for r in _rows(THROUGHPUT) if r["mode"] == "graph"]


def _cell(model: str, routing: str, batch: int, variant: str, budget: int | None = None) -> dict:
    return _one(_graph(), THROUGHPUT, model=model, routing=routing, batch_size=batch, variant=variant,
                budget="" if budget is None else f"{float(budget)}")


def _speedup(model, routing, batch, variant, budget=None) -> float:
    return float(_cell(model, routing, batch, variant, budget)["speedup_vs_dense"])


def end_to_end() -> str:
    dense = _cell("qwen3_30b", "uniform", 16, "dense")
    base = _cell("qwen3_30b", "uniform", 16, "base", 16)
    s = lambda routing, m: f"{_speedup('qwen3_30b', routing, 16, 'base', m):.2f}"
    return (f"dense Qwen3-30B-A3B decodes {float(dense['tokens_per_s']):,.0f} tokens/s "
            f"({float(dense['ms_per_step']):.2f} ms/step) and BASE at M=16 {float(base['tokens_per_s']):,.0f} "
            f"tokens/s, {s('uniform', 16)}× dense ({s('uniform', 10)}× at M=10, {s('uniform', 8)}× at M=8; "
            f"{s('skewed', 16)}× at M=16 with skewed routing)")


def one_run_per_cell() -> str:
    g = _graph()
    steps = {int(r["steps"]) for r in g}
    cells = [(r["model"], r["routing"], r["batch_size"], r["variant"], r["budget"]) for r in g]
    if len(set(cells)) != len(cells):
        return "some cell has more than one run"
    return f"each figure one timed run of {'/'.join(map(str, sorted(steps)))} replays, not repeated"


def other_models() -> str:
    sp = lambda models, routings: [_speedup(m, r, 16, "base", b)
                                   for m in models for r in routings for b in (16, 10, 8)]
    top_k = {float(_cell("qwen15_moe", r, 1, "dense")["union_mean"]) for r in ("uniform", "skewed")}
    return (f"OLMoE and DeepSeek-V2-Lite with uniform routing reach "
            f"{_rng(sp(['olmoe', 'deepseek_v2_lite'], ['uniform']))}× at batch 16 (M=16 to M=8), Qwen1.5-MoE, "
            f"whose shared expert and {'/'.join(f'{k:.0f}' for k in sorted(top_k))} routed experts per token "
            f"leave a small union, {_rng(sp(['qwen15_moe'], ['uniform']))}× "
            f"({_rng(sp(['qwen15_moe'], ['skewed']))}× with skewed routing)")


def batch_one() -> str:
    b1 = [r for r in _graph() if r["batch_size"] == "1"]
    budgeted = [r for r in b1 if r["variant"] in ("base", "router_sum", "fixed")]
    binds = max(float(r["union_mean"]) for r in b1 if r["variant"] == "dense") > min(float(r["budget"]) for r in budgeted)
    return (f"at batch 1, where {'a budget can bind' if binds else 'no budget binds'}, budgeted decoding is "
            f"{_rng([float(r['speedup_vs_dense']) for r in budgeted])}× dense")


# ------------------------------------------------------------------------------ selection overhead

def _overhead(ms: float, fixed: float) -> float:
    """(ms - fixed ms) / fixed ms, in per cent: the definition of analysis/throughput.overhead_table."""
    return 100 * (ms - fixed) / fixed


def selection_overhead_grid() -> str:
    ov = {m: _overhead(float(_cell("qwen3_30b", "uniform", 16, "base", m)["ms_per_step"]),
                       float(_cell("qwen3_30b", "uniform", 16, "fixed", m)["ms_per_step"])) for m in (8, 10, 16, 24, 32)}
    fixed16 = float(_cell("qwen3_30b", "uniform", 16, "fixed", 16)["ms_per_step"])
    return (f"BASE against `fixed` (same budget, no scoring) costs {_rng([ov[24], ov[32]], '.1f')} % at M=24 and 32 "
            f"and {_rng([ov[8], ov[10]], '.1f')} % at M=8 and 10 in the committed grid; its {ov[16]:.1f} % at M=16 "
            f"rests on a `fixed` time ({fixed16:.2f} ms)")


def selection_overhead_rerun() -> str:
    rows = {(r["batch_size"], r["variant"], r["budget"]): r for r in _rows(GUARD)}
    base, fixed = rows[("16", "base", "16.0")], rows[("16", "fixed", "16.0")]
    runs = {lab: (list(map(float, base[f"{lab}_ms"].split())), list(map(float, fixed[f"{lab}_ms"].split())))
            for lab in ("new", "old")}
    n = {lab: len(b) for lab, (b, _) in runs.items()}
    words = {5: "five", 4: "four", 3: "three", 2: "two", 10: "ten", 8: "eight", 6: "six"}
    per_run = [_overhead(b, f) for bs, fs in runs.values() for b, f in zip(bs, fs)]  # same run, same position
    all_b = [b for bs, _ in runs.values() for b in bs]
    all_f = [f for _, fs in runs.values() for f in fs]
    each = (f"{words.get(n['new'], n['new'])} from each of two checkouts" if n["new"] == n["old"]
            else f"{n['new']} new and {n['old']} old")
    return (f"that {words.get(sum(n.values()), sum(n.values()))} later runs, {each}, did not reproduce "
            f"({_rng(all_f)} ms; base {_rng(all_b)} ms, so {_rng(per_run, '.1f')} % in each run)")


# ---------------------------------------------------------------------------------------- kernels

def _kernels() -> dict:
    return json.loads((ROOT / KERNELS).read_text())


def kernel_speed() -> str:
    ex = _kernels()["experts"]
    ratio = lambda rows: [r["grouped_mm_us"] / r["base_triton_us"] for r in rows]
    upto = ratio([r for r in ex if r["T"] <= 64])
    at128 = ratio([r for r in ex if r["T"] == 128])
    shapes, routings = len({r["model"] for r in ex}), len({r["routing"] for r in ex})
    every = "faster than" if min(upto) > 1 else "against"
    return (f"is {_short(min(upto))}{DASH}{_short(max(upto))}× {every} transformers' `grouped_mm` on every row up to "
            f"T=64 (all {({3: 'three'}).get(shapes, shapes)} shapes, {({2: 'both'}).get(routings, routings)} routings; "
            f"{_short(min(at128))}{DASH}{_short(max(at128))}× at T=128)")


def _t_runs(ts: list[int], grid: list[int]) -> str:
    """T values as runs of consecutive grid points: [8, 16, 32] -> 'T=8–32'."""
    idx = sorted(grid.index(t) for t in ts)
    groups: list[list[int]] = []
    for i in idx:
        if groups and i == groups[-1][-1] + 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    return ", ".join(f"T={grid[g[0]]}" if len(g) == 1 else f"T={grid[g[0]]}{DASH}{grid[g[-1]]}" for g in groups)


def _pct(cells: list[dict]) -> str:
    return _rng([100 * c["base_triton_frac"] for c in cells], ".1f") + " %"


def _m_name(m) -> str:
    return "the dense union" if m == "dense" else f"M={m}"


def kernel_bandwidth(model: str = "qwen3_30b_a3b", routing: str = "random", t_max: int = 64) -> str:
    """Which (T, M) cells of the README's kernel table reach 80 % of copy bandwidth, and which do not."""
    cells = [r for r in _kernels()["experts"] if r["model"] == model and r["routing"] == routing and r["T"] <= t_max]
    grid = sorted({c["T"] for c in cells})
    ms = list(dict.fromkeys(c["M"] for c in cells))
    hit = [c for c in cells if c["base_triton_frac"] >= 0.8]
    miss = [c for c in cells if c["base_triton_frac"] < 0.8]

    def by_m(group: list[dict], ms_=ms) -> list[str]:
        out = []
        for m in ms_:
            mine = [c for c in group if c["M"] == m]
            if mine:
                out.append(f"{_m_name(m)} at {_t_runs([c['T'] for c in mine], grid)} ({_pct(mine)})")
        return out

    parts_miss = []
    rest = miss
    t1 = [c for c in miss if c["T"] == grid[0]]
    if len(t1) == len(ms):  # the whole first row is below
        parts_miss.append(f"every M at T={grid[0]} ({_pct(t1)})")
        rest = [c for c in miss if c["T"] != grid[0]]
        whole = [m for m in ms if {c["T"] for c in rest if c["M"] == m} == set(grid[1:])]  # below at every other T
        if whole:
            wc = [c for c in rest if c["M"] in whole]
            parts_miss.append(f"{' and '.join(_m_name(m) for m in whole)} at {_t_runs(grid[1:], grid)} ({_pct(wc)})")
            rest = [c for c in rest if c["M"] not in whole]
    parts_miss += by_m(rest)
    hits = by_m(hit)
    hit_text = ", ".join(hits[:-1]) + (" and " if len(hits) > 1 else "") + hits[-1] if hits else "none"
    miss_text = ", ".join(parts_miss[:-1]) + (" and " if len(parts_miss) > 1 else "") + parts_miss[-1]
    return (f"reaches ≥80 % of copy bandwidth in {len(hit)} of its {len(cells)} cells up to T={t_max}: {hit_text}; "
            f"the other {len(miss)} stay below: {miss_text}")


# ------------------------------------------------------------------------------------ request streams

def _stream() -> list[dict]:
    return [r for r in _rows(STREAM) if r["admission"] == "fifo"]


def stream_setup() -> str:
    rows = _rows(STREAM)
    models = {r["model"] for r in rows}
    name = {"qwen3_30b": "Qwen3-30B-A3B"}
    slots = sorted({int(r["slots"]) for r in rows})
    prompts = {tuple(json.loads((p / "report.json").read_text())["stream_config"]["prompt_len"])
               for p in sorted((ROOT / "results/stream/runs").iterdir())}
    (lo, hi), = prompts
    return (f"({'/'.join(name.get(m, m) for m in sorted(models))} shape, {' and '.join(map(str, slots))} slots, "
            f"prompts {lo}{DASH}{hi} tokens)")


def _order_rows() -> list[dict]:
    return [r for r in _rows(ORDER) if r["admission"] == "fifo"]


def stream_order() -> str:
    """The measured speed-ups, the order artefact and what is left of the gain without it."""
    rows = _order_rows()
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["routing"], r["slots"]), []).append(r)
    first = {min(g, key=lambda r: int(r["position"]))["variant"] for g in groups.values()}
    most = {max(g, key=lambda r: float(r["prefill_s"]))["variant"] for g in groups.values()}
    if first != {"dense"} or most != {"dense"}:
        raise ValueError(f"{ORDER}: run first {sorted(first)}, most prefill {sorted(most)}; the bullet says dense both")
    ratio = [float(next(r for r in g if r["variant"] == "dense")["prefill_s"])
             / (sum(float(r["prefill_s"]) for r in g if r["variant"] != "dense") / (len(g) - 1)) for g in groups.values()]

    def sp(col: str, routing: str, budget: str | None = None) -> str:
        return _rng([float(r[col]) for r in rows if r["routing"] == routing and r["variant"] != "dense"
                     and (budget is None or (r["variant"] == "base" and _num(r["budget"]) == float(budget)))])

    return (f"budgets serve {sp('speedup_vs_dense', 'uniform')}× dense tokens/s with uniform routing and "
            f"{sp('speedup_vs_dense', 'skewed')}× with skewed as measured, but the variants ran in a fixed order and "
            f"dense, first in every group, paid the most prefill time ({_rng(ratio)}× the others' mean) although "
            f"every variant prefills the same prompts dense; with dense's prefill set to the others' mean, budgets "
            f"serve {sp('speedup_prefill_adjusted', 'uniform')}× (base at M=16: "
            f"{sp('speedup_prefill_adjusted', 'uniform', '16')}×) with uniform routing and "
            f"{sp('speedup_prefill_adjusted', 'skewed')}× (base at M=16: "
            f"{sp('speedup_prefill_adjusted', 'skewed', '16')}×) with skewed")


def stream_tpot() -> str:
    rows = _order_rows()
    dense = _one(rows, ORDER, routing="uniform", slots="16", variant="dense")
    return (f"TPOT there is a request's time per token after its first, every admission prefill during its "
            f"decoding included: its p50 is {_rng([float(r['tpot_over_step']) for r in rows], '.1f')}× the median "
            f"decode step (dense, 16 slots, uniform: {float(dense['tpot_ms_p50']):.1f} against "
            f"{float(dense['step_ms_median']):.1f} ms)")


def stream_prefill() -> str:
    rows = _rows(STREAM)
    share = min(float(r["prefill_s"]) / float(r["seconds"]) for r in rows)
    cells = [(r["model"], r["routing"], r["slots"], r["variant"], r["budget"], r["admission"]) for r in rows]
    once = "one run per cell" if len(set(cells)) == len(cells) else "some cells run more than once"
    amount = "half or more" if share >= 0.5 else f"{100 * share:.0f} % or more"
    return f"the eager admission prefills take {amount} of a stream's time, {once}"


# ----------------------------------------------------------------------------------- routing realism

def _paired_md(rel: str, a: str, b: str) -> dict[str, str]:
    """One `python -m analysis.paired A B` block of a committed .md, as key -> value."""
    text = (ROOT / rel).read_text()
    for block in text.split("```"):
        lines = block.strip().splitlines()
        heads = [i for i, line in enumerate(lines) if line.startswith("$ python -m analysis.paired")]
        if heads and lines[heads[0]].split()[-2:] == [a, b]:
            return dict(line.strip().split(": ", 1) for line in lines[heads[0] + 1:] if ": " in line)
    raise ValueError(f"{rel}: no paired block for {a} {b}")


def _about(x: float) -> str:
    return f"about {x:.0f}"


def routing_first_choices() -> str:
    first = {r["model"]: float(r["distinct_first_16"]) for r in _rows(ROUTING) if r["layer"] == "mean"}
    kept = [float(_one(_rows(f"results/{g}.csv"), g, variant="oea(k0=1)")["kept_mean"])
            for g in ("quality_mini", "quality_mini_olmoe")]
    f = {_about(v) for v in first.values()}
    k = {_about(v) for v in kept}
    return (f"both embedded models have {' / '.join(sorted(f))} distinct first choices per decode step, so `oea` k0=1 "
            f"keeps {' / '.join(sorted(k))} experts")


def routing_oea_cost() -> str:
    mini = _paired_md("results/routing/paired_oea_mini.md", "outputs/routing_check_mini/budget=null,method=dense",
                      "outputs/routing_check_mini/budget=null,method.k0=1,method=oea")
    olmoe = _paired_md("results/quality_mini_olmoe_paired.md", "outputs/quality_mini_olmoe/budget=null,method=dense",
                       "outputs/quality_mini_olmoe/budget=null,method.k0=1,method=oea")
    fmt = lambda d: f"{float(d['diff']):+.3f} [{float(d['ci_low']):+.3f}, {float(d['ci_high']):+.3f}]"
    calls = {mini["call"], olmoe["call"]}
    both = "a difference on both" if calls == {"A higher"} else "not a difference on both"
    return f"costs dense − oea {fmt(mini)} on `mini` and {fmt(olmoe)} on `mini_olmoe`, {both}"


# ------------------------------------------------------------------------------------------ registry

@dataclass(frozen=True)
class Check:
    name: str                    # the README bullet
    source: str                  # the committed file(s) the numbers are recomputed from
    phrase: str                  # the text as the document has it
    render: Callable[[], str]    # the same text rebuilt from `source`


KERNEL_BANDWIDTH = Check(
    "Kernels", KERNELS,
    "reaches ≥80 % of copy bandwidth in 8 of its 25 cells up to T=64: M=32 at T=8 (81.9 %), M=64 at T=8–32 "
    "(86.5–90.4 %) and the dense union at T=8–64 (81.3–92.5 %); the other 17 stay below: every M at T=1 "
    "(56.2–57.5 %), M=8 and M=16 at T=8–64 (44.5–71.6 %), M=32 at T=16–64 (70.0–79.5 %) and M=64 at T=64 "
    "(76.9 %)", kernel_bandwidth)

# README.md's phrases (the front page registers its own)
CHECKS: list[Check] = []
RESULT_CHECKS: list[Check] = [Check(*c) for c in replication_phrases.RESULTS_CHECKS]
# results/quality/README.md: issue 27's calls across the static quality grids and how a difference is
# called (analysis/claims_calls.py), and the front page's quality bullets until 2026-12-05
QUALITY_CHECKS: list[Check] = [Check(*c) for c in calls_phrases.QUALITY_CHECKS] + [
    Check("Routing realism", ROUTING + ", results/quality_mini{,_olmoe}.csv",
          "both embedded models have about 4 distinct first choices per decode step, so `oea` k0=1 keeps about 4 "
          "experts", routing_first_choices),
    Check("Routing realism", "results/routing/paired_oea_mini.md, results/quality_mini_olmoe_paired.md",
          "costs dense − oea +0.009 [+0.004, +0.014] on `mini` and +0.019 [+0.011, +0.028] on `mini_olmoe`, a "
          "difference on both", routing_oea_cost),
]
# results/speed/README.md: the kernel table's reading, and the front page's speed bullets until 2026-12-05
SPEED_CHECKS: list[Check] = [
    Check("End to end on an H200", THROUGHPUT,
          "dense Qwen3-30B-A3B decodes 1,205 tokens/s (13.27 ms/step) and BASE at M=16 2,738 tokens/s, 2.27× dense "
          "(2.54× at M=10, 2.67× at M=8; 1.61× at M=16 with skewed routing)", end_to_end),
    Check("End to end on an H200", THROUGHPUT, "each figure one timed run of 32 replays, not repeated", one_run_per_cell),
    Check("Other models", THROUGHPUT,
          "OLMoE and DeepSeek-V2-Lite with uniform routing reach 1.74–2.38× at batch 16 (M=16 to M=8), Qwen1.5-MoE, "
          "whose shared expert and 4 routed experts per token leave a small union, 1.37–1.63× "
          "(1.06–1.26× with skewed routing)", other_models),
    Check("Other models", THROUGHPUT,
          "at batch 1, where no budget binds, budgeted decoding is 0.94–1.15× dense", batch_one),
    Check("Selection overhead", THROUGHPUT,
          "BASE against `fixed` (same budget, no scoring) costs 2.5–2.6 % at M=24 and 32 and 3.4–3.8 % at M=8 and 10 "
          "in the committed grid; its 9.5 % at M=16 rests on a `fixed` time (5.34 ms)", selection_overhead_grid),
    Check("Selection overhead", GUARD,
          "that ten later runs, five from each of two checkouts, did not reproduce (5.63–5.64 ms; base 5.78–5.82 ms, "
          "so 2.5–3.3 % in each run)", selection_overhead_rerun),
    Check("Kernels", KERNELS,
          "is 1.47–3.55× faster than transformers' `grouped_mm` on every row up to T=64 (all three shapes, both "
          "routings; 1.07–3.1× at T=128)", kernel_speed),
    KERNEL_BANDWIDTH,  # the kernel table's reading and the Kernels bullet say it alike
    Check("Request streams on an H200", STREAM + ", results/stream/runs/*/report.json",
          "(Qwen3-30B-A3B shape, 16 and 64 slots, prompts 128–512 tokens)", stream_setup),
    Check("Request streams on an H200", ORDER,
          "budgets serve 1.41–1.81× dense tokens/s with uniform routing and 1.18–1.48× with skewed as measured, but "
          "the variants ran in a fixed order and dense, first in every group, paid the most prefill time "
          "(1.17–1.53× the others' mean) although every variant prefills the same prompts dense; with dense's "
          "prefill set to the others' mean, budgets serve 1.14–1.50× (base at M=16: 1.17–1.31×) with uniform "
          "routing and 1.07–1.21× (base at M=16: 1.07–1.20×) with skewed", stream_order),
    Check("Request streams on an H200", ORDER,
          "TPOT there is a request's time per token after its first, every admission prefill during its decoding "
          "included: its p50 is 2.6–5.5× the median decode step (dense, 16 slots, uniform: 39.0 against 15.1 ms)",
          stream_tpot),
    Check("Request streams on an H200", STREAM,
          "the eager admission prefills take half or more of a stream's time, one run per cell", stream_prefill),
]

# Generated blocks: name -> function returning the block's text. A document holds it between
# `<!-- claims:NAME ... -->` and `<!-- /claims:NAME -->`; `--write` fills it, `check` compares it.
# The quality readings come from the static grids' paired tables (analysis/readings.py, pandas).
ABLATION_GRIDS = ("results/ablation_mini", "results/ablation_mini_olmoe")
RULES_GRIDS = ("results/rules_mini", "results/rules_mini_olmoe")
SEEDS_GRIDS = ("results/quality_seeds_mini", "results/quality_seeds_mini_olmoe")


def _reading(grid: str) -> Callable[[], str]:
    def render() -> str:
        from analysis.readings import grid_reading

        return grid_reading(ROOT / grid)
    return render


def _headline(grids: tuple[str, ...], intro: str, metrics: tuple[str, ...] = ("accuracy", "kl")) -> Callable[[], str]:
    """A README headline bullet over `grids`; `{n}` in `intro` becomes the prompts behind each call,
    `{cross}` the cross-grid correction's families (results/cross_grid.csv)."""
    def render() -> str:
        from analysis.readings import cross_text, headline, prompts_per_run

        paths = [ROOT / g for g in grids]
        return headline(paths, intro.format(n=prompts_per_run(paths), cross=cross_text(ROOT / "results")), metrics)
    return render


def _replication(name: str) -> Callable[[], str]:
    """The pre-registered replication's recommendation (README) or reading (results/README.md)."""
    def render() -> str:
        from analysis import replication

        return (replication.recommendation_text() if name == "recommendation" else replication.reading()) + "\n"
    return render


def _front_page(name: str) -> Callable[[], str]:
    """README.md's generated headline table (analysis/headline.py) and its scope line (the share of
    tokens the dense prefill makes, analysis/replication.py)."""
    def render() -> str:
        if name == "headline":
            from analysis.headline import table

            return table()
        from analysis.replication import first_token_text

        return first_token_text()
    return render


BLOCKS: dict[str, Callable[[], str]] = {"recommendation": _replication("recommendation"),
                                        "headline": _front_page("headline"), "first_token": _front_page("first_token")}
RESULT_BLOCKS: dict[str, Callable[[], str]] = {"replication": _replication("reading")}
# results/quality/README.md: one reading per static grid, and the front page's quality bullet (until 2026-12-05)
QUALITY_BLOCKS: dict[str, Callable[[], str]] = {
    "quality": _headline(ABLATION_GRIDS, "- **Quality on the embedded models** (issue 20's ablation grids: both models on "
                         "the ablation's own pool of {n} held-out prompts, one batching seed, batch 16, static batches; "
                         "every rule minus `base` at the same budget, accuracy by the exact McNemar test, KL by a "
                         "cluster bootstrap over prompts; Holm over each grid; {cross}; `make ablation`, `make ablation "
                         "ABLATION_EXP=ablation_mini_olmoe`):"),
    **{Path(g).name: _reading(g) for g in (*ABLATION_GRIDS, *RULES_GRIDS, *SEEDS_GRIDS)},
}


class Document(NamedTuple):
    checks: list[Check]                    # phrases the document must hold, each rebuilt from its files
    blocks: dict[str, Callable[[], str]]   # its generated blocks


# Every checked document (path relative to the repository root) with its own registry.
DOCS: dict[str, Document] = {
    "README.md": Document(CHECKS, BLOCKS),
    "results/README.md": Document(RESULT_CHECKS, RESULT_BLOCKS),
    "results/quality/README.md": Document(QUALITY_CHECKS, QUALITY_BLOCKS),
    "results/speed/README.md": Document(SPEED_CHECKS, {}),
}


def generated_blocks(blocks: dict[str, Callable[[], str]]) -> dict[str, str]:
    """Every block of `blocks`, rendered (text ending in one newline, or empty)."""
    out = {}
    for name, fn in blocks.items():
        text = fn().strip("\n")
        out[name] = text + "\n" if text else ""
    return out


def _block_re(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- claims:{re.escape(name)}\b[^\n]*-->\n)(.*?)(<!-- /claims:{re.escape(name)} -->)", re.DOTALL)


def write_blocks(text: str, blocks: dict[str, Callable[[], str]]) -> str:
    """`text` with each of `blocks`' content replaced by its rendering."""
    for name, rendered in generated_blocks(blocks).items():
        pat = _block_re(name)
        if not pat.search(text):
            raise ValueError(f"no <!-- claims:{name} --> ... <!-- /claims:{name} --> markers")
        text = pat.sub(lambda m, t=rendered: m.group(1) + t + m.group(3), text, count=1)
    return text


def write_document(path: str) -> list[str]:
    """Rewrite the generated blocks of DOCS[path] in place; the names of the blocks that changed."""
    blocks = DOCS[path].blocks
    file = ROOT / path
    text = file.read_text()
    new = write_blocks(text, blocks)
    if new == text:
        return []
    file.write_text(new)
    return [name for name in blocks if _block_re(name).search(text).group(2) != _block_re(name).search(new).group(2)]


# ------------------------------------------------------------------------------------------- checking

def _flat(text: str) -> str:
    return " ".join(text.split())


def check_document(path: str, text: str | None = None) -> list[str]:
    """Every disagreement of one registered document (DOCS; `text` instead of the file's, if given): a
    checked phrase it lacks, a phrase the committed files no longer give (numbers or wording), a
    generated block out of date."""
    doc = DOCS[path]
    text = (ROOT / path).read_text() if text is None else text
    return check_phrases(text, doc.checks, path) + check_blocks(text, doc.blocks, path)


def check_tables() -> list[str]:
    """The committed comparison tables whose calls or cross-grid columns are stale (analysis/cross_grid.py)."""
    from analysis.cross_grid import check as cross_grid_check

    return [f"[cross-grid] {f}" for f in cross_grid_check()]


def check_phrases(text: str, checks: list[Check], where: str) -> list[str]:
    flat = _flat(text)
    failures = []
    for c in checks:
        if _flat(c.phrase) not in flat:
            failures.append(f"[{c.name}] {where} lacks: {c.phrase!r}")
        try:
            expected = c.render()
        except Exception as e:  # noqa: BLE001 - a missing or reshaped file is a failure to report
            failures.append(f"[{c.name}] cannot recompute from {c.source}: {type(e).__name__}: {e}")
            continue
        if _flat(expected) != _flat(c.phrase):
            failures.append(f"[{c.name}] {c.source} gives: {expected!r}\n    {where} says: {c.phrase!r}")
    return failures


def check_blocks(text: str, blocks: dict[str, Callable[[], str]], where: str) -> list[str]:
    """Each registered block of `where` present and equal to its rendering."""
    failures = []
    for name, rendered in generated_blocks(blocks).items():
        m = _block_re(name).search(text)
        if not m:
            failures.append(f"[block {name}] {where} has no <!-- claims:{name} --> markers")
        elif m.group(2) != rendered:
            failures.append(f"[block {name}] {where} out of date: run `python -m analysis.claims --write`")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite each document's generated blocks first")
    ap.add_argument("--doc", action="append", choices=list(DOCS), metavar="PATH",
                    help=f"only this document (repeatable; default: all of {', '.join(DOCS)})")
    args = ap.parse_args(argv)
    paths = args.doc or list(DOCS)
    failures = []
    for path in paths:
        if args.write and DOCS[path].blocks:
            changed = write_document(path)
            if changed:
                print(f"rewrote {', '.join(changed)} in {path}")
        failures += check_document(path)
    failures += check_tables()
    for f in failures:
        print(f)
    docs = [DOCS[p] for p in paths]
    print(f"{len(paths)} documents: {sum(len(d.checks) for d in docs)} phrases, "
          f"{sum(len(d.blocks) for d in docs)} generated blocks; the comparison tables' cross-grid columns: "
          f"{len(failures)} disagreement{'s' if len(failures) != 1 else ''}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
