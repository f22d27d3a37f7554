"""The hand-written phrases about issue 27's pre-registered replication, each rebuilt from the
committed files it cites, for analysis/claims.py: `RESULTS_CHECKS` for results/README.md, (name,
source, phrase, render) as claims.Check takes them (the old front page's two, the runs' hours and the
interaction's tau range, went with it in issue 44). The generated parts (the recommendation, the
calls) are claims blocks; these are the sentences around them. Reads results/ only (pandas).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.replication_files import INTERACTION, PAIRED, RUNS, TABLE

ROOT = Path(__file__).resolve().parents[1]
DASH = "–"
R2 = ("results/quality_mini_predictor_r2.csv", "results/quality_mini_olmoe_predictor_r2.csv")
WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def _csv(rel: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / rel)


def _primary() -> pd.DataFrame:
    p = _csv(PAIRED)
    return p[p["family"] == "primary"]


def _rng(values, fmt: str) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}{DASH}{hi}"


def _minus(x: float, fmt: str = ".3f") -> str:
    return format(x, fmt).replace("-", "−")


def tau_short() -> str:
    om = _csv(INTERACTION)
    om = om[om["test"] == "omnibus"]
    return f"(Kendall's tau {_rng(om['kendall_tau'], '.2f')})"


def run_times() -> str:
    r = _csv(RUNS)
    return (f"The {len(r)} runs took {r['wall_s'].min():.0f}–{r['wall_s'].max():.0f} s each (median "
            f"{r['wall_s'].median():.0f} s), {r['wall_s'].sum() / 3600:.2f} h in all")


def planned_mdd() -> str:
    from analysis import power

    t = power.plan_table()
    med = t[t["discordance"].str.startswith("50")]["mdd_exact"].item()
    return f"the minimal detectable difference planned from the committed grids' discordance was {med:.3f} at the median"


def _points(rule: str, call: str) -> int:
    p = _primary()
    return int(((p["method"] == rule) & (p["call"] == call)).sum())


def rule_counts() -> str:
    n = len(_primary()) // _primary()["method"].nunique()
    t1h, t1l, rsl = _points("top1_union", "higher"), _points("top1_union", "lower"), _points("router_sum", "lower")
    below = "below at none" if t1l == 0 else f"below at {WORDS.get(t1l, t1l)}"
    at = f"all {WORDS.get(n, n)}" if rsl == n else f"{WORDS.get(rsl, rsl)} of the {WORDS.get(n, n)}"
    return (f"`top1_union` is above `base` at {WORDS.get(t1h, t1h)} of the {WORDS.get(n, n)} points and {below}; "
            f"`router_sum` is below at {at}")


def _loss(model: str, budget: int) -> float:
    t = _csv(TABLE)
    dense = t[(t["model"] == model) & (t["method"] == "dense")]["accuracy"].item()
    return t[(t["model"] == model) & (t["method"] == "base") & (t["budget"] == budget)]["accuracy"].item() - dense


def loss_sizes() -> str:
    return (f"(base minus dense {_minus(_loss('mini', 6))} at M=6 against {_minus(_loss('mini_olmoe', 6))} on "
            f"`mini_olmoe`)")


def olmoe_fit() -> str:
    t = _csv(TABLE)
    scale = t[(t["model"] == "mini_olmoe") & (t["method"] == "dense")]["weight_scale"].item()
    r2 = {m: _csv(rel)["r2"] for m, rel in zip(("mini", "mini_olmoe"), R2)}
    return (f"whose top-8 weights sum to {scale:.2f} per token and whose predictor fits less well (held-out R² "
            f"{_rng(r2['mini_olmoe'], '.2f')} against {_rng(r2['mini'], '.2f')})")


def _where(frame: pd.DataFrame, call: str) -> str:
    """'at all three budgets', 'at two of the three budgets (inconclusive at M=9)', ..."""
    n, hit = len(frame), frame[frame["call"] == call]
    if len(hit) == n:
        return f"at all {WORDS.get(n, n)} budgets"
    other = ", ".join(f"{c} at M={int(b)}" for c, b in zip(frame.loc[frame["call"] != call, "call"],
                                                            frame.loc[frame["call"] != call, "budget"]))
    return f"at {WORDS.get(len(hit), len(hit))} of the {WORDS.get(n, n)} budgets ({other})"


def anchor_counts() -> str:
    """Where base_anchor(k0=1) is above base, per model."""
    p = _primary()
    a = p[p["method"] == "base_anchor(k0=1)"]
    mini, olmoe = (a[a["model"] == m].sort_values("budget") for m in ("mini", "mini_olmoe"))
    return (f"(`base_anchor`, k0 = 1) is above `base` {_where(mini, 'higher')} on `mini` and "
            f"{_where(olmoe, 'higher')} on `mini_olmoe`")


def router_sq_calls() -> str:
    p = _primary()
    r = p[p["method"] == "router_sq"]
    calls = sorted(set(r["call"]))
    return (f"`router_sq` is {calls[0]} at all {WORDS.get(len(r), len(r))}" if len(calls) == 1 else
            "`router_sq`: " + ", ".join(f"{c} at {int((r['call'] == c).sum())}" for c in calls))


def first_run() -> str:
    """The calls of the first run (engine c1, results/archive/replication_2166d53/) that the re-run changed."""
    old = pd.read_csv(ROOT / "results/archive/replication_2166d53/replication_paired.csv")
    old = old[old["family"] == "primary"].set_index(["model", "method", "budget"])["call"]
    new = _primary().set_index(["model", "method", "budget"])["call"]
    changed = [(k, old[k], new[k]) for k in new.index if old.get(k) != new[k]]
    return (f"{len(changed)} of the {len(new)} primary calls differ from the first run's: "
            + "; ".join(f"{m} at M={int(b)} on `{model}` {o} → {n}" for (model, m, b), o, n in changed))


def olmoe_secondary() -> str:
    p = _csv(PAIRED)
    s = p[(p["family"] == "secondary") & (p["model"] == "mini_olmoe") & (p["method"] == "base_anchor(k0=1)")]
    acc = _primary()
    acc = acc[(acc["model"] == "mini_olmoe") & (acc["method"] == "base_anchor(k0=1)")].sort_values("budget")
    every = lambda frame, call: (frame["call"] == call).all()
    if not (every(s[s["metric"] == "out_error"], "higher") and every(s[s["metric"] == "energy_retained"], "lower")):
        return "the calls no longer say: base_anchor's error higher and its energy lower at every budget"
    return (f"`base_anchor` is above `base` in accuracy {_where(acc, 'higher')} while its MoE-output error is higher "
            "and its retained energy lower at every budget")


RESULTS_CHECKS = [
    ("Pre-registered replication", "results/*_paired.csv (analysis.power)",
     "the minimal detectable difference planned from the committed grids' discordance was 0.013 at the median",
     planned_mdd),
    ("Pre-registered replication", RUNS, "The 44 runs took 131–660 s each (median 278 s), 3.55 h in all", run_times),
    ("Pre-registered replication", PAIRED, "(`base_anchor`, k0 = 1) is above `base` at all three budgets on `mini` "
     "and at two of the three budgets (inconclusive at M=9) on `mini_olmoe`", anchor_counts),
    ("Pre-registered replication", PAIRED, "`router_sq` is inconclusive at all six", router_sq_calls),
    ("Pre-registered replication", PAIRED, "`top1_union` is above `base` at four of the six points and below at "
     "none; `router_sum` is below at all six", rule_counts),
    ("Pre-registered replication", INTERACTION, "(Kendall's tau 0.47–0.60)", tau_short),
    ("Pre-registered replication", TABLE, "(base minus dense −0.116 at M=6 against −0.057 on `mini_olmoe`)", loss_sizes),
    ("Pre-registered replication", f"{TABLE}, {', '.join(R2)}", "whose top-8 weights sum to 0.58 per token and whose "
     "predictor fits less well (held-out R² 0.78–0.87 against 0.86–0.93)", olmoe_fit),
    ("Pre-registered replication", PAIRED, "`base_anchor` is above `base` in accuracy at two of the three budgets "
     "(inconclusive at M=9) while its MoE-output error is higher and its retained energy lower at every budget",
     olmoe_secondary),
    ("Pre-registered replication", "results/archive/replication_2166d53/replication_paired.csv, " + PAIRED,
     "6 of the 36 primary calls differ from the first run's: base_anchor(k0=2) at M=8 on `mini` inconclusive → higher; oracle at M=8 on `mini` higher → inconclusive; base_anchor(k0=2) at M=10 on `mini` inconclusive → higher; top1_union at M=6 on `mini_olmoe` inconclusive → higher; base_anchor(k0=1) at M=9 on `mini_olmoe` higher → inconclusive; top1_union at M=12 on `mini_olmoe` higher → inconclusive", first_run),
]
