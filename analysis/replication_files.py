"""The committed files of issue 27's pre-registered replication, named once (paths from the repository
root): analysis/replication.py writes them (its default --out, results/replication), and
analysis/claims_replication.py and analysis/headline.py read them."""

TABLE = "results/replication.csv"  # a row per model, method and budget
PAIRED = "results/replication_paired.csv"  # the family's calls, each rule minus base
INTERACTION = "results/replication_interaction.csv"  # how the rule effects differ between the two models
RUNS = "results/replication_runs.csv"  # each run's wall time (the grid folders' sweep_summary.csv)
