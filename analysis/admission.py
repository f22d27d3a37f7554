"""Union-aware admission against FIFO: the same method, budget and batching seed, both admissions.

    python -m analysis.admission outputs/admission_mini results/admission_mini

Reads the evaluate runs of one experiment folder (`conf/experiment/admission_*.yaml`: continuous
batching, eval.admission=fifo,union, several eval.seed) and pairs each union run with the FIFO run
of the same method, budget and seed. Per (method, budget): each admission's mean over seeds of the
union before selection, kept experts, occupancy and accuracy; union minus FIFO per seed (every
seed's sign is listed, no interval over so few seeds); and accuracy union minus FIFO over prompts
(analysis/stats.py: the exact McNemar test for one seed; for several, each prompt's accuracy
averaged over its seeds and a sign-flip permutation test over prompts, so a prompt counts once),
Holm-corrected over the table's comparisons, with its call. Writes <dest>.csv and <dest>.md.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from analysis import stats as S
from analysis.paired import load_samples

METRICS = ("union_mean", "kept_mean", "occupancy_mean", "accuracy")


def runs(root: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(root.rglob("report.json")):
        rep = json.loads(path.read_text())
        if rep.get("stage") != "evaluate":
            continue
        ev = rep["eval"]
        # reports from before eval.admission was recorded: the run's overrides name it
        admission = ev.get("admission") or ("union" if "eval.admission=union" in rep.get("overrides", "") else "fifo")
        rows.append({"method": rep["method"], "budget": rep["budget"], "seed": ev["batch_seed"],
                     "admission": admission, "dir": path.parent, **{m: rep["summary"].get(m) for m in METRICS}})
    if not rows:
        raise SystemExit(f"no evaluate runs under {root}")
    return pd.DataFrame(rows)


def compare(df: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (method, budget), g in df.groupby(["method", "budget"], dropna=False):
        fifo, union = g[g["admission"] == "fifo"].set_index("seed"), g[g["admission"] == "union"].set_index("seed")
        seeds = sorted(set(fifo.index) & set(union.index))
        row = {"method": method, "budget": budget, "seeds": len(seeds)}
        for m in METRICS:
            row[f"{m}_fifo"] = fifo.loc[seeds, m].mean()
            row[f"{m}_union"] = union.loc[seeds, m].mean()
            row[f"{m}_diff_by_seed"] = " ".join(f"{union.loc[s, m] - fifo.loc[s, m]:+.3f}" for s in seeds)
        per_seed = []
        for s in seeds:
            j = load_samples(union.loc[s, "dir"]).merge(load_samples(fifo.loc[s, "dir"]), on=["task", "doc_id"],
                                                       suffixes=("_u", "_f"))
            if (j["prompt_hash_u"] != j["prompt_hash_f"]).any():
                raise SystemExit(f"{method} seed {s}: the two admissions scored different prompts")
            per_seed.append(j.set_index(["task", "doc_id"])[["correct_u", "correct_f"]])
        by_prompt = pd.concat(per_seed).groupby(level=[0, 1]).mean()  # a prompt counts once, seeds nested
        c = S.paired_accuracy(by_prompt["correct_u"].to_numpy(), by_prompt["correct_f"].to_numpy())
        row.update(accuracy_diff=c.diff, accuracy_low=c.low, accuracy_high=c.high, prompts=c.n, test=c.test,
                   p=c.p, p_tost=c.p_tost)
        out.append(row)
    t = pd.DataFrame(out)
    t["p_holm"], t["p_tost_holm"] = S.holm(t["p"].to_numpy()), S.holm(t["p_tost"].to_numpy())
    t["call"] = [S.call(d, p, q) for d, p, q in zip(t["accuracy_diff"], t["p_holm"], t["p_tost_holm"])]
    return t


def main(src: str, dest: str) -> None:
    table = compare(runs(Path(src)))
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    text = (f"Union-aware admission against FIFO, from {src} (`python -m analysis.admission {src} {dest}`): "
            "means over the seeds both have, union minus FIFO per seed, and accuracy union minus FIFO over "
            f"prompts (each prompt's accuracy averaged over its seeds; test named per row), Holm over the {len(table)} "
            f"rows, tie by the equivalence test within ±{S.MARGINS['accuracy']:g}.\n\n" + table.round(4).to_markdown(index=False) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
