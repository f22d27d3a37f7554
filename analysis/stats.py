"""The statistics behind every comparison the analysis reports: one test per comparison, one
correction per grid, and three calls (issue 20).

    acc = paired_accuracy(correct_a_P, correct_b_P)            # one batching seed: exact path
    kl = paired_ratio(kl_sum_a_P, kl_sum_b_P, tokens_P, "kl")  # cluster bootstrap over prompts
    calls = grid_calls(table)                                  # Holm over the grid, then the call

Calls (`call()`), after Holm's correction over every comparison of one grid (statsmodels):
    higher / lower   the two-sided test of "no difference" rejects at ALPHA (corrected);
    tie              it does not, and the two one-sided tests (TOST) against the metric's stated
                     margin (MARGINS) reject at ALPHA (corrected): the difference is within +-margin;
    inconclusive     neither: the data cannot tell a difference from a tie.

Tests:
  accuracy, one batching seed (each prompt a pair of 0/1 outcomes):
    - difference: exact McNemar (scipy.stats.binomtest on the discordant prompts, p = 1/2);
    - interval and TOST: Tango's score statistic for a difference of paired proportions (Tango
      1998, Stat Med 17:891), which keeps its level with few discordant prompts where a percentile
      bootstrap does not (4 discordant prompts, one way: the bootstrap excludes 0, McNemar p = 0.125).
      The call comes from the exact test; the score interval can exclude 0 at 4-5 discordant
      prompts where the exact test does not reject.
  accuracy, several batching seeds (each prompt's outcome averaged over seeds, seeds nested):
    - difference: paired sign-flip permutation test over prompts (scipy.stats.permutation_test);
    - interval: cluster bootstrap over prompts (percentile); TOST: normal, with the bootstrap's
      standard error.
  kl, dll (per prompt: sums over its scored tokens), out_error and energy_retained (per decode
  batch: sums over its steps; a per-batch quantity, so the cluster is the batch's prompts):
    - ratio of sums, tokens weighted, paired: cluster bootstrap (scipy.stats.bootstrap) over
      prompts or decode batches, percentile interval; z-test and TOST with its standard error.

Minimal detectable difference (`mdd`): the difference each test finds with 80 % power at the
strictest Holm level ALPHA / m (m comparisons in the grid): (z_{1-a/2m} + z_{0.8}) * standard error,
the McNemar standard error being sqrt(discordant fraction / prompts), at least one discordant prompt.

What is called (issue 27), `grid_calls`:
  - a tie is a call only for TIE_METRICS. Accuracy is not among them: at a grid's ~1,050 prompts and
    Holm's level the equivalence test cannot pass for rules that disagree with base on 2-27 % of the
    prompts (`equivalence_n`: about 8,800 prompts at 5 % discordance, a 1-point margin and ALPHA/28),
    so an accuracy comparison that does not reject is inconclusive, stated with its `mdd`;
  - a row may be excluded from its family (column `excluded`, the reason): a metric that mirrors
    another (MIRRORS: dll, the log-likelihood change, is near -KL: one secondary metric, not two
    calls) and rows null by construction (dense under two batchings or admissions: a dense greedy
    decode does not depend on who shares its step), which the analysis that builds the table marks.
  Over many grids: `bh` (Benjamini-Hochberg q over every committed comparison) and Holm over a
  headline family; analysis/cross_grid.py applies both and labels the calls that fail "exploratory".

Planning (for a pre-registered grid): `detect_n` (prompts for the primary family to detect a
difference), `equivalence_power` and `equivalence_n` (prompts for a paired accuracy TOST).

Intervals beside tests: accuracy (one seed) shows Tango's 95 % score interval beside the exact
McNemar p; the score test it inverts is the asymptotic McNemar test, which the exact test is more
conservative than (4-5 discordant prompts one way, or ~190 split 107/80: the interval can exclude 0
at p = 0.053-0.0625). A TOST at ALPHA corresponds to the 90 % interval (`tost_interval`), not the
95 % one. `crossed` and `sign_flip` return the interval that inverts their own test.

Shapes: P prompts (or decode batches), L MoE layers, R bootstrap resamples.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

ALPHA = 0.05
POWER = 0.8
N_BOOT = 4000
# Equivalence margins (the "tie" of each metric), in the metric's own units: 1 point of accuracy;
# nats per token for KL and the log-likelihood change; the relative MoE-output error and the
# retained energy in absolute fractions. About a tenth of what base loses at the grids' budgets.
# Which way is better, per metric (dll: a log-likelihood change, closer to 0 from below is better).
HIGHER_IS_BETTER = {"accuracy": True, "energy_retained": True, "kl": False, "dll": True, "out_error": False,
                    "top1_agree": True}
MARGINS = {"accuracy": 0.01, "kl": 0.005, "dll": 0.005, "out_error": 0.002, "energy_retained": 0.002}
# Metrics whose equivalence test makes a "tie" call (module docstring: why not accuracy).
TIE_METRICS = ("kl", "out_error", "energy_retained")
# A metric reported beside the one it mirrors, not called: dll is close to -KL per token.
MIRRORS = {"dll": "kl"}
EXCLUDED = "excluded"  # the call of a row left out of its family (its reason in column `excluded`)


@dataclass(frozen=True)
class Comparison:
    """One paired difference A - B: estimate, 95 % interval, p of "no difference", p of the TOST
    against `margin`, standard error (nan for the exact path), and the units it rests on."""
    diff: float
    low: float
    high: float
    p: float
    p_tost: float
    margin: float
    se: float
    n: int
    test: str
    a_only: int | None = None  # accuracy: prompts A got right and B wrong
    b_only: int | None = None

    def row(self) -> dict:
        return asdict(self)


# ---- accuracy, one seed: exact McNemar, Tango's score interval and TOST ------------------------

def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value (binomial test on the discordant pairs)."""
    n = a_only + b_only
    return 1.0 if n == 0 else float(stats.binomtest(a_only, n, 0.5).pvalue)


def tango_z(a_only: int, b_only: int, n: int, delta: float) -> float:
    """Tango's score statistic for H0: p_A - p_B = delta over n paired binary outcomes.

    Under the constraint, the MLE of P(B right, A wrong) is the positive root of
    2n q^2 + W q - b_only * delta * (1 - delta) = 0, W = -a_only - b_only + (2n - a_only + b_only) delta;
    Var(a_only - b_only) = n (2q + delta (1 - delta))."""
    w = -a_only - b_only + (2 * n - a_only + b_only) * delta
    q = (np.sqrt(w * w + 8 * n * b_only * delta * (1 - delta)) - w) / (4 * n)
    var = n * (2 * q + delta * (1 - delta))
    num = a_only - b_only - n * delta
    if var <= 0:
        return 0.0 if num == 0 else float(np.sign(num) * np.inf)
    return float(num / np.sqrt(var))


def tango_interval(a_only: int, b_only: int, n: int, level: float = 1 - ALPHA) -> tuple[float, float]:
    """The deltas Tango's two-sided score test at 1 - level does not reject (z decreases in delta)."""
    z = stats.norm.ppf(0.5 + level / 2)
    est = (a_only - b_only) / n
    eps = 1e-12

    def edge(sign: int) -> float:
        end = sign * (1 - eps)
        f = lambda d: tango_z(a_only, b_only, n, d) - sign * -z
        if f(end) * sign > 0:  # not reached before the boundary: the interval runs to it
            return float(end)
        return float(optimize.brentq(f, est, end, xtol=1e-10))

    return edge(-1), edge(+1)


def paired_accuracy(correct_a_P: np.ndarray, correct_b_P: np.ndarray, margin: float = MARGINS["accuracy"],
                    seed: int = 0) -> Comparison:
    """A - B in accuracy over the same prompts. Binary outcomes (one seed): exact path; outcomes
    averaged over several seeds (fractions): permutation test and prompt bootstrap."""
    a, b = np.asarray(correct_a_P, float), np.asarray(correct_b_P, float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError("paired_accuracy needs two equal-length, non-empty per-prompt vectors")
    n, diff = len(a), float(a.mean() - b.mean())
    binary = np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all()
    if binary:
        a_only, b_only = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
        low, high = tango_interval(a_only, b_only, n)
        p_tost = max(stats.norm.sf(tango_z(a_only, b_only, n, -margin)), stats.norm.cdf(tango_z(a_only, b_only, n, margin)))
        se = np.sqrt(max(a_only + b_only, 1) / n) / np.sqrt(n)  # at least one discordant prompt: mdd > 0
        return Comparison(diff, low, high, mcnemar_exact(a_only, b_only), float(p_tost), margin, float(se), n,
                          "exact McNemar; Tango score interval", a_only, b_only)
    d = a - b
    if not d.any():
        p = 1.0
    else:
        res = stats.permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis), permutation_type="samples",
                                     vectorized=True, n_resamples=9999, rng=np.random.default_rng(seed))
        p = float(res.pvalue)
    low, high, se = _bootstrap(lambda i: d[i].mean(-1), n, seed)
    return Comparison(diff, low, high, p, tost_normal(diff, se, margin), margin, se, n,
                      "sign-flip permutation over prompts; prompt bootstrap")


# ---- ratios of sums (kl, dll per prompt; out_error, energy per decode batch) ---------------------

def paired_ratio(num_a_P: np.ndarray, num_b_P: np.ndarray, den_P: np.ndarray, metric: str,
                 den_b_P: np.ndarray | None = None, seed: int = 0) -> Comparison:
    """A - B of a ratio of sums, clusters (axis 0) resampled together for both runs.

    1-D: sum(num) / sum(den) (kl, dll: den = scored tokens, the same for both runs). 2-D (P, L):
    the mean over layers of the per-layer ratio (out_error, energy_retained, as a run's summary
    states them); den_b_P is B's own denominator where it differs from A's."""
    na, nb, da = (np.asarray(x, float) for x in (num_a_P, num_b_P, den_P))
    db = da if den_b_P is None else np.asarray(den_b_P, float)
    n = na.shape[0]

    def ratio(num, den, i):  # i: (..., n) cluster indices
        if num.ndim == 1:
            return num[i].sum(-1) / np.clip(den[i].sum(-1), 1e-30, None)
        return (num[i].sum(-2) / np.clip(den[i].sum(-2), 1e-30, None)).mean(-1)

    stat = lambda i: ratio(na, da, i) - ratio(nb, db, i)
    diff = float(stat(np.arange(n)))
    low, high, se = _bootstrap(stat, n, seed)
    margin = MARGINS[metric]
    return Comparison(diff, low, high, p_normal(diff, se), tost_normal(diff, se, margin), margin, se, n,
                      "cluster bootstrap" + (" over prompts" if na.ndim == 1 else " over decode batches"))


def _bootstrap(stat, n: int, seed: int) -> tuple[float, float, float]:
    """Percentile 95 % interval and standard error of stat(indices) over resampled clusters."""
    if n < 2:
        return float("nan"), float("nan"), float("nan")
    # stat takes an index vector (..., n): resampling indices keeps every array of a cluster together
    res = stats.bootstrap((np.arange(n),), lambda i, axis=-1: stat(i), vectorized=True, n_resamples=N_BOOT,
                          method="percentile", rng=np.random.default_rng(seed), batch=200)
    return float(res.confidence_interval.low), float(res.confidence_interval.high), float(res.standard_error)


def p_normal(diff: float, se: float) -> float:
    """Two-sided normal p of diff / se. se == 0 (every resample the same difference): 0 or 1; an
    undefined se (nan: one cluster, nothing to resample) tests nothing: nan, which leaves the row
    out of its family and makes its call inconclusive."""
    if np.isnan(se):
        return float("nan")
    if not se > 0:
        return 1.0 if diff == 0 else 0.0
    return float(2 * stats.norm.sf(abs(diff) / se))


def tost_normal(diff: float, se: float, margin: float) -> float:
    """max of the two one-sided p-values of H0: diff <= -margin and H0: diff >= margin (nan where
    se is: see p_normal)."""
    if np.isnan(se):
        return float("nan")
    if not se > 0:
        return 0.0 if abs(diff) < margin else 1.0
    return float(max(stats.norm.sf((diff + margin) / se), stats.norm.cdf((diff - margin) / se)))


# ---- one run's interval, and the grid's correction -------------------------------------------

def accuracy_interval(correct_P: np.ndarray) -> tuple[float, float, float]:
    """Accuracy and its 95 % interval inside [0, 1]: Wilson for 0/1 outcomes, else the prompt
    bootstrap of the per-prompt means (several seeds)."""
    c = np.asarray(correct_P, float)
    if np.isin(c, (0.0, 1.0)).all():
        low, high = proportion_confint(int(c.sum()), len(c), alpha=ALPHA, method="wilson")
        return float(c.mean()), float(low), float(high)
    low, high, _ = _bootstrap(lambda i: c[i].mean(-1), len(c), 0)
    return float(c.mean()), low, high


def ratio_interval(num_P: np.ndarray, den_P: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """sum(num) / sum(den) with its cluster-bootstrap 95 % interval (one run)."""
    num, den = np.asarray(num_P, float), np.asarray(den_P, float)
    value = float(num.sum() / max(den.sum(), 1e-30))
    low, high, _ = _bootstrap(lambda i: num[i].sum(-1) / np.clip(den[i].sum(-1), 1e-30, None), len(num), seed)
    return value, low, high


def layer_ratio_interval(num_PL: np.ndarray, den_PL: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """The mean over layers of sum(num) / sum(den), clusters (rows) resampled: one run's
    out_error or energy_retained with its 95 % interval."""
    num, den = np.asarray(num_PL, float), np.asarray(den_PL, float)
    stat = lambda i: (num[i].sum(-2) / np.clip(den[i].sum(-2), 1e-30, None)).mean(-1)
    low, high, _ = _bootstrap(stat, len(num), seed)
    return float(stat(np.arange(len(num)))), low, high


def seed_range(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, min, max) over batching seeds: the spread re-batching the same prompts gives, not an
    interval for the population (the seeds share their prompts); one value gives nan ends."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    if len(v) == 1:
        return float(v[0]), float("nan"), float("nan")
    return float(v.mean()), float(v.min()), float(v.max())


def _adjusted(p: np.ndarray, method: str) -> np.ndarray:
    """statsmodels' multipletests adjustment `method`, nan entries left out of the family."""
    p = np.asarray(p, float)
    out = np.full_like(p, np.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = multipletests(p[ok], alpha=ALPHA, method=method)[1]
    return out


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values (statsmodels), nan entries left out of the family."""
    return _adjusted(p, "holm")


def call(diff: float, p_holm: float, p_tost_holm: float, metric: str | None = None) -> str:
    """higher / lower / tie / inconclusive; with `metric`, a tie only for a metric in TIE_METRICS."""
    if p_holm < ALPHA:
        return "higher" if diff > 0 else "lower"
    if p_tost_holm < ALPHA and (metric is None or metric in TIE_METRICS):
        return "tie"
    return "inconclusive"


def mdd(se: float, m: int) -> float:
    """Difference found with POWER at the strictest Holm level ALPHA / m."""
    return float((stats.norm.isf(ALPHA / (2 * max(m, 1))) + stats.norm.ppf(POWER)) * se)


def grid_calls(table, tie_metrics: tuple[str, ...] = TIE_METRICS):
    """Adds excluded, p_holm, p_tost_holm, call and mdd to a table of Comparison rows (one grid: one family).

    Every difference test of the grid's family is one Holm family, every equivalence test of a
    metric in `tie_metrics` another. Rows whose `excluded` column already names a reason, and rows
    of a metric in MIRRORS, are left out of both (call EXCLUDED, p_holm nan); mdd is at the family's
    strictest Holm level. A table without a `metric` column is accuracy."""
    t = table.copy()
    metric = t["metric"].astype(str).to_numpy() if "metric" in t else np.full(len(t), "accuracy")
    given = t["excluded"].fillna("").astype(str).to_numpy() if "excluded" in t else np.full(len(t), "")
    reason = np.array([r or (f"mirrors {MIRRORS[m]}: reported, not called" if m in MIRRORS else "")
                       for r, m in zip(given, metric)], dtype=object)
    family = reason == ""
    ties = family & np.isin(metric, tie_metrics)
    p_holm, p_tost_holm = np.full(len(t), np.nan), np.full(len(t), np.nan)
    p_holm[family] = holm(t["p"].to_numpy(float)[family])
    p_tost_holm[ties] = holm(t["p_tost"].to_numpy(float)[ties])
    t["excluded"], t["p_holm"], t["p_tost_holm"] = reason, p_holm, p_tost_holm
    t["call"] = [call(d, p, q) if f else EXCLUDED for d, p, q, f in zip(t["diff"], p_holm, p_tost_holm, family)]
    m = int((family & t["p"].notna().to_numpy()).sum())
    t["mdd"] = [mdd(se, m) for se in t["se"]]
    return t


# ---- many grids: false discovery rate over every committed comparison ------------------------

def bh(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg q-values (statsmodels' fdr_bh), nan entries left out of the family."""
    return _adjusted(p, "fdr_bh")


# ---- planning a grid: prompts for a difference, power of an equivalence test ------------------

def detect_n(discordance: float, diff: float, m: int = 1, power: float = POWER) -> int:
    """Prompts for the paired accuracy test to find `diff` with `power` at the strictest Holm level
    ALPHA / m, at a discordant fraction `discordance` (the inverse of `mdd`)."""
    z = stats.norm.isf(ALPHA / (2 * max(m, 1))) + stats.norm.ppf(power)
    return int(np.ceil(discordance * (z / diff) ** 2))


def equivalence_power(discordance: float, n: int, margin: float = MARGINS["accuracy"], alpha: float = ALPHA,
                      diff: float = 0.0) -> float:
    """Power of the paired accuracy TOST at level `alpha` (normal approximation, standard error
    sqrt((discordance - diff^2) / n)) when the true difference is `diff`."""
    se = np.sqrt(max(discordance - diff * diff, 1e-12) / n)
    z = stats.norm.isf(alpha)
    return float(max(0.0, stats.norm.cdf((margin - diff) / se - z) - stats.norm.cdf((-margin - diff) / se + z)))


def equivalence_n(discordance: float, margin: float = MARGINS["accuracy"], alpha: float = ALPHA,
                  power: float = POWER, diff: float = 0.0) -> int:
    """The fewest prompts at which equivalence_power reaches `power` (doubling, then bisection)."""
    if abs(diff) >= margin:
        raise ValueError(f"a true difference {diff} outside the margin {margin} is never shown equivalent")
    hi = 1
    while equivalence_power(discordance, hi, margin, alpha, diff) < power:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if equivalence_power(discordance, mid, margin, alpha, diff) < power else (lo, mid)
    return hi


def tost_interval(diff: float, se: float, alpha: float = ALPHA) -> tuple[float, float]:
    """The 1 - 2 alpha interval of a normal TOST: the test passes iff it lies inside +-margin."""
    z = stats.norm.isf(alpha)
    return diff - z * se, diff + z * se


# ---- prompts and batching seeds both random ------------------------------------------------------

def crossed(diff: float, se_prompt: float, seed_diffs: np.ndarray, prompts: int,
            margin: float = MARGINS["accuracy"]) -> Comparison:
    """A difference over P prompts re-batched under S seeds, with both as random factors.

    The prompt bootstrap of per-prompt means (se_prompt) holds the prompts' variation but not that of
    re-batching, which moves many prompts at once; the spread of the per-seed differences holds
    the batching's. Their variances add (crossed design: se^2 = se_prompt^2 + var(seed_diffs) / S),
    with Welch-Satterthwaite degrees of freedom (P - 1 and S - 1); the t test, the TOST against
    `margin` and the interval all use that t distribution, so the interval inverts the test."""
    s = np.asarray(seed_diffs, float)
    if len(s) < 2:
        raise ValueError("crossed needs the differences of at least two batching seeds")
    v1, v2 = float(se_prompt) ** 2, float(s.var(ddof=1)) / len(s)
    se = float(np.sqrt(v1 + v2))
    if not se > 0:
        return Comparison(diff, diff, diff, p_normal(diff, se), tost_normal(diff, se, margin), margin, se, prompts,
                          "prompts and seeds crossed: no variation")
    den = (v1 ** 2 / max(prompts - 1, 1) if v1 else 0.0) + (v2 ** 2 / (len(s) - 1) if v2 else 0.0)
    df = (v1 + v2) ** 2 / den
    t = stats.t(df)
    half = t.isf(ALPHA / 2) * se
    p = float(2 * t.sf(abs(diff) / se))
    p_tost = float(max(t.sf((diff + margin) / se), t.cdf((diff - margin) / se)))
    return Comparison(diff, diff - half, diff + half, p, p_tost, margin, se, prompts,
                      f"prompts and {len(s)} seeds crossed: t ({df:.1f} df), se^2 = prompt bootstrap + seed variance / S")


def se_from_tost(diff: float, p_tost: float, margin: float) -> float:
    """The standard error a normal TOST p-value was computed with (tost_normal inverted): recovers
    a committed prompt-bootstrap se from its table's diff and p_tost."""
    f = lambda se: tost_normal(diff, se, margin) - p_tost
    return float(optimize.brentq(f, 1e-9, 10 * margin, xtol=1e-14))


# ---- sign-flip permutation test over prompts, and the interval that inverts it -----------------

def sign_flip(d_P: np.ndarray, n_resamples: int = 9999, seed: int = 0,
              level: float = 1 - ALPHA) -> tuple[float, float, float]:
    """Two-sided sign-flip permutation test of mean(d) = delta over prompts (each prompt's d - delta
    symmetric about 0 under H0), p at delta = 0, and the interval of deltas it does not reject at
    1 - level: (p, low, high). Every sign vector when 2^P <= n_resamples (exact), else n_resamples
    random ones with the observed one counted ((1 + hits) / (1 + R)); the same vectors serve every
    delta, so the interval inverts exactly the test that gives p."""
    d = np.asarray(d_P, float)
    n = len(d)
    if n == 0:
        raise ValueError("sign_flip needs at least one prompt")
    exact = 2 ** n <= n_resamples
    if exact:
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1).astype(np.int8)
    else:
        signs = np.random.default_rng(seed).choice(np.array([-1, 1], np.int8), size=(n_resamples, n))
    sd, s1 = signs @ d, signs.sum(1).astype(float)
    total, tol = d.sum(), 1e-9 * max(1.0, np.abs(d).sum())

    def pval(delta: float) -> float:
        obs = abs(total - n * delta)
        hits = int((np.abs(sd - delta * s1) >= obs - tol).sum())
        return hits / len(signs) if exact else (1 + hits) / (1 + len(signs))

    est, a = total / n, 1 - level
    span = max(float(np.abs(d - est).max()), 1e-12) * 2

    def edge(sign: int) -> float:
        lo, hi = est, est + sign * span  # p(est) = 1; p at the far end is at its minimum
        if pval(hi) > a:
            return float(hi)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if pval(mid) > a else (lo, mid)
        return float((lo + hi) / 2)

    return pval(0.0), edge(-1), edge(+1)
