"""Issue 41's held-out grid as the front page reads it: the "Which rule to use" bullet for models the
project was not developed on, from the grid's committed calls (results/heldout/grid_*.csv, written
by `python -m experiments.heldout.grid_calls outputs results/heldout/grid`; the tests and the
decision rules are docs/preregistration_heldout.md's). Reads results/ only.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
GRID = "results/heldout/grid"
RECOMMENDED = "base_anchor(k0=1)"  # the rule whose family docs/preregistration_heldout.md tests (its second)
FAMILY = {"olmoe": "OLMoE-style (weights not renormalised)", "qwen3_moe": "Qwen3-style (renormalised)"}


def _tables(root: Path) -> dict[str, pd.DataFrame] | None:
    paths = {n: root / f"{GRID}_{n}.csv" for n in ("models", "recommended", "calibrated", "diagnostic")}
    if not all(p.exists() for p in paths.values()):
        return None
    return {n: pd.read_csv(p) for n, p in paths.items()}


def _cells(rows: pd.DataFrame) -> str:
    return ", ".join(f"{r.model} M={int(r.budget)}" + (f" against `{r.other}`" if "other" in rows else "")
                     for r in rows.itertuples())


def _count(fam: pd.DataFrame, call: str) -> pd.DataFrame:
    return fam[fam["call"] == call]


def by_family(diag: pd.DataFrame, models: pd.DataFrame) -> list[str]:
    """`base` against `router_sq`, per router family: the condition a user can read off a model's config."""
    fam_of = models.set_index("model")["family"]
    out = []
    for family, g in diag.assign(family=diag["model"].map(fam_of)).groupby("family", sort=True):
        hi, lo = _count(g, "higher"), _count(g, "lower")
        out.append(f"on {FAMILY.get(family, family)} models `base` is above `router_sq` at {len(hi)} of {len(g)} "
                   f"budgets{' (' + _cells(hi) + ')' if len(hi) else ''} and below at "
                   + (f"{len(lo)} ({_cells(lo)})" if len(lo) else "none"))
    return out


def picks_below(rec: pd.DataFrame, models: pd.DataFrame, picks: list[str]) -> list[str]:
    """For each rule recommended elsewhere (`picks`, e.g. the replication's per-family picks) other
    than the grid's recommended rule: where the recommended-rule family calls it lower than that
    rule (the only test of these rules the pre-registration makes)."""
    fam_of = models.set_index("model")["family"]
    out = []
    for pick in picks:
        if pick == RECOMMENDED:
            continue
        lost = rec[(rec["other"] == pick) & (rec["call"] == "higher")]
        fams = sorted({FAMILY.get(fam_of.get(m), str(fam_of.get(m))) for m in lost["model"]})
        out.append(f"`{pick}` is below `{RECOMMENDED}` at " + (_cells(lost.drop(columns="other")) + f" ({', '.join(fams)})"
                                                             if len(lost) else "no cell"))
    return out


def recommendation_bullet(root: Path = ROOT, link: str = "", picks: list[str] | None = None) -> str:
    """The bullet, or a line saying the grid's calls are not committed yet. `picks`: the rules the
    other bullets recommend, each checked against the grid's recommended rule."""
    t = _tables(root)
    if t is None:
        return ("- **Models it was not developed on**: the pre-registered held-out grid "
                f"([docs/preregistration_heldout.md]({link}docs/preregistration_heldout.md)) has no committed calls yet.")
    models, rec, cal, diag = t["models"], t["recommended"], t["calibrated"], t["diagnostic"]
    inn = models[models["status"] == "in"]
    missing = models.loc[models["status"] == "not run", "model"].tolist()
    left = models.loc[models["status"] == "left out", "model"].tolist()
    kinds = "; ".join(f"{len(g)} {FAMILY.get(f, f)}: {'/'.join(str(int(e)) for e in g['experts'])} experts"
                      for f, g in inn.groupby("family", sort=True))
    rec_lo, rec_hi = _count(rec, "lower"), _count(rec, "higher")
    cal_lo, cal_hi = _count(cal, "lower"), _count(cal, "higher")
    partial = bool(missing) or bool((inn["budgets"] < 3).any())
    anchor = ("it is lower than no other deployable rule anywhere, so it stays the serving recommendation"
              if rec_lo.empty else f"it is lower at {_cells(rec_lo)}: there it is not the rule to use")
    calibrated = ("lower in no comparison: it meets the bar for the default" if cal_lo.empty
                  else f"lower at {_cells(cal_lo)}: it does not become the default")
    called = diag[diag["call"] != "inconclusive"]
    agree = int(called["signs_agree"].astype(str).str.lower().eq("true").sum())
    diagnostic = ("no cell's online difference is called, so its sign cannot be checked" if called.empty else
                  f"{'validated' if agree == len(called) else 'not validated'}: its `base` − `router_sq` sign "
                  f"agrees with the online call in {agree} of {len(called)} called cells"
                  + ("" if agree == len(called) else ", so its start-time warning is a hint, not a call"))
    text = (f"- **Models it was not developed on** (the pre-registered held-out grid, "
            f"[docs/preregistration_heldout.md]({link}docs/preregistration_heldout.md); `results/heldout/grid.md`, "
            f"commands in `results/heldout/README.md`): {len(inn)} model{'s' if len(inn) != 1 else ''} trained here ({kinds}), "
            f"{int(rec['n'].iloc[0]):,} fresh prompts, three budgets each from its dense union, continuous batching; "
            f"exact McNemar, Holm over each family. `base_anchor(k0=1)` against each other deployable rule "
            f"({len(rec)} comparisons): higher in {len(rec_hi)}, lower in {len(rec_lo)}; {anchor}. "
            f"The calibrated BASE (`method.shrink=auto`, {len(cal)} comparisons): higher in {len(cal_hi)}, "
            f"{calibrated}. Per condition you can check in the model's config: " + "; ".join(by_family(diag, models))
            + f" (Holm over {len(diag)} cells). The start-time diagnostic: {diagnostic}.")
    below = picks_below(rec, models, picks or [])
    if below:
        text += " Of the rules recommended above and below: " + "; ".join(below) + "."
    if left:
        text += f" Left out (dense accuracy below the pre-registered floor): {', '.join(left)}."
    if partial:
        text += (f" **Partial**: not run yet: {', '.join(missing) or 'some budgets'}; these are not the "
                 "pre-registered calls.")
    return text
