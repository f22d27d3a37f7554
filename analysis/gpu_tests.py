"""The index of the committed GPU test logs: results/gpu_tests/README.md, one row per log.

    python -m analysis.gpu_tests               # (re)write results/gpu_tests/README.md from the logs
    python -m analysis.gpu_tests --check       # exit 1, naming the difference, if README.md is not what the logs give

A log is `make gpu-test`'s (experiments/gpu/gpu_test.sh: the GPU's nvidia-smi line, the versions,
`commit <sha>`, `table <kernels/configs file> <sha256, 16 hex digits>` per tuned table (since
session 36), `pytest processes <N>`, pytest's output, `rc=<exit status>`), or an older partial
run's, which may lack the header. tests/test_tuned_tables_tested.py reads the table lines: every
GPU's tuned table must have a run here that tested it.

Each row: the GPU, the commit the log names, pytest's processes (1 where the log predates the
line), pytest's own counts and seconds from its last summary line, the exit status, and what that
adds up to:
  no failures   a summary with nothing failed or in error, and rc 0 (or no rc line);
  N failed      tests failed or errored;
  cut           no summary line (the run was stopped before pytest reported), or a non-zero rc
                with nothing failed (a limit reached after the tests it names).
Whether a log is the whole suite or a subset is not in the log: the file name says (`_tables`,
`_select`, `_part1`, ...; `make_gpu_test_<date>_<gpu>.log` without a suffix is the whole suite).
Reads results/ only.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "gpu_tests"
COUNTS = ("passed", "failed", "errors", "skipped")
# pytest's closing line: "==== 90 passed, 6 skipped, 63 warnings in 178.20s (0:02:58) ====", or in
# quiet mode without the rules
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in ([0-9.]+)s(?: \([0-9:]+\))?\s*=*$")


@dataclass(frozen=True)
class LogRow:
    log: str
    gpu: str
    commit: str
    processes: int
    counts: dict[str, int] | None  # None: no summary line
    seconds: float | None
    rc: int | None
    tables: dict[str, str]  # kernels/configs/<name> -> the first 16 hex digits of its sha256 (logs since session 36)

    @property
    def outcome(self) -> str:
        if self.counts is None:
            return "cut"
        bad = self.counts["failed"] + self.counts["errors"]
        if bad:
            return f"{bad} failed"
        return "no failures" if self.rc in (0, None) else "cut"


def read_log(path: Path) -> LogRow:
    lines = path.read_text(errors="replace").splitlines()
    gpu, commit, processes, counts, seconds, rc = "not recorded", "not recorded", 1, None, None, None
    tables: dict[str, str] = {}
    if lines and " MHz," in lines[0]:  # nvidia-smi's csv: name, driver, SM clock, memory clock, temperature
        gpu = lines[0].split(",")[0].strip()
    for line in lines:
        if line.startswith("commit ") and commit == "not recorded":
            commit = line[len("commit "):].strip()
        elif line.startswith("pytest processes "):
            processes = int(line.split()[-1])
        elif line.startswith("table ") and len(line.split()) == 3:
            _, name, digest = line.split()
            tables[name] = digest
        elif line.startswith("rc="):
            rc = int(line[3:])
        elif m := SUMMARY.match(line.strip()):
            found = {}
            for part in m.group(1).split(", "):
                n, word = part.split(" ", 1)
                found["errors" if word == "error" else word] = int(n)
            counts = {k: found.get(k, 0) for k in COUNTS}
            seconds = float(m.group(2))
    return LogRow(path.name, gpu, commit, processes, counts, seconds, rc, tables)


def render(folder: Path) -> str:
    rows = [read_log(p) for p in sorted(folder.glob("*.log"))]
    out = [
        "# GPU test logs",
        "",
        "Every committed GPU test run: `make gpu-test` (experiments/gpu/gpu_test.sh) on a device call, its log",
        "and JUnit XML copied here under the date and GPU. A change to kernels/ or the decode path is done",
        "when a run here names its commit with no failures. Written by `python -m analysis.gpu_tests`",
        "from the logs (`--check` says whether this page is current); see analysis/gpu_tests.py for how",
        "each column is read. A log without a suffix is the whole suite; a suffix names a subset",
        "(GPU_TEST_FILES). A log's SKIPPED lines say why a test skipped (most need two GPUs).",
        "",
        "| log | GPU | commit | pytest processes | passed | failed or error | skipped | pytest s | rc | outcome | XML |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        c = r.counts or {}
        cells = [f"[{r.log}]({r.log})", r.gpu, r.commit, str(r.processes),
                 str(c["passed"]) if c else "", str(c["failed"] + c["errors"]) if c else "",
                 str(c["skipped"]) if c else "",
                 f"{r.seconds:.2f}" if r.seconds is not None else "", "" if r.rc is None else str(r.rc),
                 r.outcome, "yes" if (folder / r.log.replace(".log", ".xml")).exists() else "no"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only say whether README.md is current (exit 1 if not)")
    ap.add_argument("--folder", type=Path, default=FOLDER, help="the folder of logs (default results/gpu_tests)")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"gpu_tests: no folder {args.folder}", file=sys.stderr)
        return 2
    text, readme = render(args.folder), args.folder / "README.md"
    if args.check:
        if readme.exists() and readme.read_text() == text:
            print(f"{readme}: current ({len(list(args.folder.glob('*.log')))} logs)")
            return 0
        print(f"{readme}: out of date with the logs; run python -m analysis.gpu_tests", file=sys.stderr)
        return 1
    readme.write_text(text)
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
