"""analysis/gpu_tests.py: the index of the committed GPU test logs reads each log's GPU, commit,
pytest processes, counts and exit status, and calls a run with failures, a cut run and a clean one
apart; the committed results/gpu_tests/README.md is what the committed logs give."""
from __future__ import annotations

from analysis import gpu_tests as gt

HEADER = "NVIDIA H200, 580.159.04, 345 MHz, 3201 MHz, 36\ntorch 2.11.0 triton 3.6.0 transformers 5.17.0\ncommit abc1234\n"


def _write(folder, name, text):
    (folder / name).write_text(text)
    return folder / name


def test_a_whole_suite_log_gives_its_gpu_commit_processes_and_counts(tmp_path):
    log = _write(tmp_path, "make_gpu_test_x_h200.log", HEADER + "pytest processes 4\n[gw0] PASSED t::a\n"
                 "=== 88 passed, 7 skipped, 1419 deselected, 15 warnings in 329.25s (0:05:29) ====\nrc=0\n")
    row = gt.read_log(log)
    assert (row.gpu, row.commit, row.processes, row.seconds, row.rc) == ("NVIDIA H200", "abc1234", 4, 329.25, 0)
    assert row.counts == {"passed": 88, "failed": 0, "errors": 0, "skipped": 7}
    assert row.outcome == "no failures"


def test_failures_errors_and_a_cut_run_are_told_apart(tmp_path):
    failed = gt.read_log(_write(tmp_path, "a.log", HEADER + "== 3 failed, 80 passed, 1 error in 300.00s (0:05:00) ==\nrc=1\n"))
    assert failed.counts["failed"] == 3 and failed.counts["errors"] == 1 and failed.outcome == "4 failed"
    assert failed.processes == 1  # a log from before the processes line
    no_summary = gt.read_log(_write(tmp_path, "b.log", HEADER + "tests/test_x.py::t PASSED\n"))
    assert no_summary.counts is None and no_summary.outcome == "cut"
    limit = gt.read_log(_write(tmp_path, "c.log", "........ [100%]\n8 passed, 45 deselected in 80.35s (0:01:20)\nrc=124\n"))
    assert limit.counts["passed"] == 8 and limit.outcome == "cut" and limit.gpu == "not recorded"


def test_the_page_has_a_row_per_log_and_check_tells_a_stale_page(tmp_path, capsys):
    _write(tmp_path, "make_gpu_test_1_h100.log", HEADER + "== 90 passed, 6 skipped in 432.07s ==\nrc=0\n")
    _write(tmp_path, "make_gpu_test_1_h100.xml", "<testsuites/>")
    assert gt.main(["--folder", str(tmp_path)]) == 0
    page = (tmp_path / "README.md").read_text()
    assert "| [make_gpu_test_1_h100.log](make_gpu_test_1_h100.log) | NVIDIA H200 | abc1234 | 1 | 90 | 0 | 6 | 432.07 | 0 | no failures | yes |" in page
    assert gt.main(["--folder", str(tmp_path), "--check"]) == 0
    _write(tmp_path, "make_gpu_test_2_h200.log", HEADER + "== 1 failed in 3.00s ==\nrc=1\n")
    assert gt.main(["--folder", str(tmp_path), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def test_the_committed_page_is_what_the_committed_logs_give():
    assert gt.main(["--check"]) == 0, "run python -m analysis.gpu_tests"
