"""Union-aware admission against FIFO: the same method, budget and batching seed, both admissions.

    python -m analysis.admission outputs/admission_mini results/admission_mini

Reads the evaluate runs of one experiment folder (`conf/experiment/admission_*.yaml`: continuous
batching, eval.admission=fifo,union, several eval.seed) and pairs each union run with the FIFO run
of the same method, budget and seed. Per (method, budget): each admission's mean over seeds of the
union before selection, kept experts, occupancy and accuracy; union minus FIFO per seed (every
seed's sign is listed, no interval over so few seeds); and for accuracy the discordant (seed,
prompt) pairs with the exact McNemar p (pairs of one prompt under several seeds are not
independent: read p as descriptive). Writes <dest>.csv and <dest>.md.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from analysis.paired import load_samples
from analysis.stats import mcnemar_exact

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
        union_only = fifo_only = 0
        for s in seeds:
            j = load_samples(union.loc[s, "dir"]).merge(load_samples(fifo.loc[s, "dir"]), on=["task", "doc_id"],
                                                       suffixes=("_u", "_f"))
            union_only += int(((j["correct_u"] > 0.5) & (j["correct_f"] <= 0.5)).sum())
            fifo_only += int(((j["correct_f"] > 0.5) & (j["correct_u"] <= 0.5)).sum())
        row.update(union_only=union_only, fifo_only=fifo_only, mcnemar_p=mcnemar_exact(union_only, fifo_only))
        out.append(row)
    return pd.DataFrame(out)


def main(src: str, dest: str) -> None:
    table = compare(runs(Path(src)))
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    text = (f"Union-aware admission against FIFO, from {src} (`python -m analysis.admission {src} {dest}`): "
            "means over the seeds both have, union minus FIFO per seed, and accuracy's discordant (seed, prompt) "
            "pairs with the exact McNemar p.\n\n" + table.round(4).to_markdown(index=False) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
