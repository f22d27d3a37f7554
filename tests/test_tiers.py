"""The test tiers (tests/conftest.py): `make test` runs a parametrized test's first and last case,
`make test-all` every case; cases marked slow or gpu by hand keep their marks."""
from __future__ import annotations

pytest_plugins = ["pytester"]

MODULE = '''
import pytest

@pytest.mark.parametrize("n", range(5))
def test_family(n):
    pass

@pytest.mark.parametrize("n", [0, pytest.param(1, marks=pytest.mark.slow), 2])
def test_with_a_slow_case(n):
    pass

@pytest.mark.parametrize("n", [0, 1])
def test_pair(n):
    pass

def test_single():
    pass
'''


def _collected(pytester, *args: str) -> set[str]:
    pytester.makeconftest("from tests.conftest import pytest_collection_modifyitems  # noqa: F401")
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    gpu: gpu\n")
    pytester.makepyfile(test_fam=MODULE)
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    return {line.split("::")[1] for line in result.outlines if "::" in line}


def test_the_fast_tier_runs_the_first_and_last_case_and_test_all_runs_every_case(pytester):
    fast = _collected(pytester, "-m", "not slow")
    assert fast == {"test_family[0]", "test_family[4]", "test_with_a_slow_case[0]", "test_with_a_slow_case[2]",
                    "test_pair[0]", "test_pair[1]", "test_single"}
    every = _collected(pytester, "-m", "slow or not slow")
    assert len(every) == 5 + 3 + 2 + 1
