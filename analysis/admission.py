"""Union-aware admission against FIFO: the same method, budget and batching seed, both admissions.

    python -m analysis.admission outputs/admission_mini results/admission_mini
    python -m analysis.admission --from-table results/admission_mini   # re-test a committed table

Reads the evaluate runs of one experiment folder (`conf/experiment/admission_*.yaml`: continuous
batching, scheduler.admission=fifo,union, several eval.seed) and pairs each union run with the FIFO run
of the same method, budget and seed. Per (method, budget): each admission's mean over seeds of the
union before selection, kept experts, occupancy and accuracy; union minus FIFO per seed (every
seed's sign is listed); and accuracy union minus FIFO.

Accuracy (analysis/stats.py): one seed, the exact McNemar test over prompts. Several seeds: the
prompts and the batching seeds are both random (issue 27): a prompt-bootstrap standard error of
the per-prompt means over seeds (se_prompt, its sign-flip permutation p as p_prompt) holds the
prompts' variation, the spread of the per-seed differences (se_seed) that of re-batching, which
moves many prompts at once; `stats.crossed` adds the two and tests with Welch-Satterthwaite t, and
its interval inverts that test. Holm over the table's rows except dense (null by construction: a
dense decode does not depend on who shares its step); no accuracy tie (stats.TIE_METRICS).

`--from-table` recomputes the crossed test from a committed table: se_prompt from its prompt
bootstrap's TOST p (stats.se_from_tost), the per-seed differences from accuracy_diff_by_seed as
whole prompts (each printed to 0.001 of 1/prompts steps; the counts that print so and add up to
the committed mean difference). Writes <dest>.csv and <dest>.md.
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import records as R
from analysis import stats as S

METRICS = ("union_mean", "kept_mean", "occupancy_mean", "accuracy")
NULL_BY_CONSTRUCTION = {"dense": "null by construction: a dense decode does not depend on its batch mates"}


def runs(root: Path) -> pd.DataFrame:
    return R.runs(root, METRICS)


def compare(df: pd.DataFrame) -> pd.DataFrame:
    """The table from the runs of one admission folder (runs())."""
    prompts = R.of_runs(df)[0]
    out = []
    for (method, budget), g in df.groupby(["method", "budget"], dropna=False):
        fifo, union = g[g["admission"] == "fifo"].set_index("seed"), g[g["admission"] == "union"].set_index("seed")
        seeds = sorted(set(fifo.index) & set(union.index))
        row = {"method": method, "budget": budget, "seeds": len(seeds)}
        for m in METRICS:
            row[f"{m}_fifo"] = fifo.loc[seeds, m].mean()
            row[f"{m}_union"] = union.loc[seeds, m].mean()
            row[f"{m}_diff_by_seed"] = " ".join(f"{union.loc[s, m] - fifo.loc[s, m]:+.6f}" for s in seeds)
        at = R.at_point(prompts, method, budget, seeds)
        per_seed = []
        for s in seeds:
            u = at[(at["seed"] == s) & (at["admission"] == "union")].set_index(R.PROMPT)
            f = at[(at["seed"] == s) & (at["admission"] == "fifo")].set_index(R.PROMPT)
            j = u.add_suffix("_u").join(f.add_suffix("_f"), how="inner")
            if len(j) != len(u) or len(j) != len(f) or (j["prompt_hash_u"] != j["prompt_hash_f"]).any():
                raise SystemExit(f"error: {method} seed {s}: the two admissions scored different prompts")
            per_seed.append(j[["correct_u", "correct_f"]].astype(float))
        by_prompt = pd.concat(per_seed).groupby(level=[0, 1]).mean()  # a prompt counts once, seeds nested
        prompt = S.paired_accuracy(by_prompt["correct_u"].to_numpy(), by_prompt["correct_f"].to_numpy())
        seed_diffs = [float((d["correct_u"] - d["correct_f"]).mean()) for d in per_seed]
        out.append({**row, **_accuracy(method, prompt, seed_diffs)})
    return S.grid_calls(pd.DataFrame(out))


def _accuracy(method: str, prompt: S.Comparison, seed_diffs: list[float]) -> dict:
    """The accuracy columns: the call's comparison (crossed for several seeds, else the exact test
    over prompts) and the prompt-level one beside it."""
    # the exact path: every prompt scored the same under every seed, so re-batching moved nothing
    exact = prompt.test.startswith("exact")
    c = S.crossed(prompt.diff, prompt.se, seed_diffs, prompt.n) if len(seed_diffs) > 1 and not exact else prompt
    se_seed = float(np.std(seed_diffs, ddof=1) / np.sqrt(len(seed_diffs))) if len(seed_diffs) > 1 else np.nan
    return {"metric": "accuracy", "diff": c.diff, "low": c.low, "high": c.high, "p": c.p, "p_tost": c.p_tost,
            "se": c.se, "n": c.n, "test": c.test, "se_prompt": prompt.se, "se_seed": se_seed,
            "p_prompt": prompt.p, "low_prompt": prompt.low, "high_prompt": prompt.high,
            "excluded": NULL_BY_CONSTRUCTION.get(method, "")}


# ---- a committed table, re-tested -----------------------------------------------------------------

def seed_counts(printed: str, prompts: int, mean_diff: float) -> list[int] | None:
    """The per-seed differences as whole prompts: the counts k_s with k_s / prompts printing as
    `printed` ("+0.012 -0.004 -0.009", three decimals) whose mean is `mean_diff`; None unless
    exactly one set of counts does."""
    shown = [float(v) for v in printed.split()]
    digits = max(len(v.split(".")[1]) if "." in v else 0 for v in printed.split())
    options = [[k for k in range(int(np.floor(v * prompts)) - 2, int(np.ceil(v * prompts)) + 3)
                if round(k / prompts, digits) == round(v, digits)] for v in shown]
    total = mean_diff * len(shown) * prompts
    fits = [ks for ks in itertools.product(*options) if abs(sum(ks) - total) < 1e-6 * max(1.0, abs(total)) + 1e-6]
    return list(fits[0]) if len(fits) == 1 else None


def from_table(t: pd.DataFrame) -> pd.DataFrame:
    """A table as compare() wrote it before issue 27 (accuracy_diff, prompt bootstrap p_tost, per-seed
    differences printed to three decimals), with the crossed test in place of the prompt-level one."""
    rows = []
    for _, r in t.iterrows():
        n = int(r["prompts"])
        diff, base = float(r["accuracy_diff"]), {k: r[k] for k in t.columns if not k.startswith("accuracy_")
                                                 and k not in ("prompts", "test", "p", "p_tost", "p_holm",
                                                               "p_tost_holm", "call")}
        base |= {k: r[k] for k in ("accuracy_fifo", "accuracy_union")}
        counts = seed_counts(str(r["accuracy_diff_by_seed"]), n, diff)
        if counts is None:
            raise SystemExit(f"error: {r['method']}: the per-seed differences {r['accuracy_diff_by_seed']!r} do not give "
                             f"whole prompts of {n} adding up to {diff}")
        seed_diffs = [k / n for k in counts]
        base["accuracy_diff_by_seed"] = " ".join(f"{d:+.6f}" for d in seed_diffs)
        exact = str(r["test"]).startswith("exact")  # its se is not a bootstrap's, and not needed
        se = np.nan if exact else S.se_from_tost(diff, float(r["p_tost"]), S.MARGINS["accuracy"])
        prompt = S.Comparison(diff, r["accuracy_low"], r["accuracy_high"], r["p"], r["p_tost"], S.MARGINS["accuracy"],
                              se, n, str(r["test"]))
        rows.append({**base, **_accuracy(r["method"], prompt, seed_diffs)})
    return S.grid_calls(pd.DataFrame(rows))


def markdown(table: pd.DataFrame, src: str, dest: str, command: str) -> str:
    fam = int((table["call"] != S.EXCLUDED).sum())
    return (f"Union-aware admission against FIFO, from {src} (`{command}`): means over the seeds both have, "
            "union minus FIFO per seed, and accuracy union minus FIFO: diff, its 95 % interval (low, high) and p "
            "from the test named per row (several seeds: prompts and batching seeds crossed, stats.crossed: se^2 = "
            "se_prompt^2 + se_seed^2, t with Welch-Satterthwaite df, the interval inverting that test; beside it the "
            "prompt-level p_prompt and interval), Holm over the "
            f"{fam} row(s) not null by construction (dense answers the same under both admissions); no accuracy tie "
            f"is called (stats.TIE_METRICS; p_tost against ±{S.MARGINS['accuracy']:g} reported).\n\n"
            + table.round(4).to_markdown(index=False) + "\n")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--from-table"]:
        dest = argv[1]
        table = from_table(pd.read_csv(f"{dest}.csv"))
        src, command = f"{dest}.csv", f"python -m analysis.admission --from-table {dest}"
    else:
        src, dest = argv[0], argv[1]
        table = compare(runs(Path(src)))
        command = f"python -m analysis.admission {src} {dest}"
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    text = markdown(table, src, dest, command)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
