"""nwlib.evidence, the book's one standard of evidence, against independent references.

scipy's paired t statistic and normal quantiles, statsmodels' Holm procedure, explicit TOST
formulas, and a Monte Carlo check that the reported power is the rejection rate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from statsmodels.stats.multitest import multipletests

from nwlib import evidence
from nwlib.evidence import (
    ALPHA,
    POWER,
    Comparison,
    Findings,
    estimate,
    family_threshold,
    fp_tolerance,
    holm,
    paired,
    significant,
)


def _series(seed: int, r: int = 200, shift: float = 0.1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(r, generator=g, dtype=dtype)
    return a, a - shift + 0.3 * torch.randn(r, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_paired_z_is_the_paired_t_statistic(dtype):
    a, b = _series(0, dtype=dtype)
    c = paired(a, b)
    ref = stats.ttest_rel(a.double().numpy(), b.double().numpy())
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    assert c.z == pytest.approx(ref.statistic, rel=tol)
    assert c.estimate == pytest.approx(float((a - b).double().mean()), rel=tol)


def test_paired_rejects_bad_input():
    a, b = _series(0)
    with pytest.raises(ValueError, match="a must be"):
        paired(a[None], b[None])
    with pytest.raises(ValueError, match="shape"):
        paired(a, b[:-1])
    with pytest.raises(TypeError):
        paired(a, b.float())


def test_estimate_checks_its_arguments():
    with pytest.raises(ValueError, match="se"):
        estimate(1.0, -0.1)
    with pytest.raises(TypeError, match="value"):
        estimate("1", 0.1)
    with pytest.raises(ValueError, match="NaN"):
        estimate(math.nan, 0.1)
    assert Comparison(1.0, 0.0).z == math.inf and Comparison(0.0, 0.0).z == 0.0


def test_holm_matches_statsmodels():
    rng = np.random.default_rng(1)
    p = rng.uniform(0, 0.1, size=12)
    ref = multipletests(p, alpha=ALPHA, method="holm")[1]
    assert holm(p.tolist()) == pytest.approx(ref.tolist(), abs=1e-12)


def test_one_sided_findings_use_the_normal_p_value_and_holm():
    f = Findings("t", profile="quick")
    ests = [estimate(0.25, 0.1), estimate(0.15, 0.1), estimate(-0.5, 0.1)]
    f.greater("a", "first is positive", ests[0])
    f.greater("b", "second is positive", ests[1])
    f.less("c", "third is negative", ests[2])
    found = {x.name: x for x in f.decide()}
    p = [stats.norm.sf(2.5), stats.norm.sf(1.5), stats.norm.cdf(-5.0)]
    adj = multipletests(p, method="holm")[1]
    for name, pv, pa in zip("abc", p, adj, strict=True):
        assert found[name].p_value == pytest.approx(pv, rel=1e-9)
        assert found[name].p_adjusted == pytest.approx(pa, rel=1e-9)
        assert found[name].holds == (pa <= ALPHA)
    assert found["a"].holds and not found["b"].holds and found["c"].holds


def test_equivalence_is_tost_and_gets_harder_with_less_data():
    f = Findings("t", profile="quick")
    f.within("flat", "the MSE moves by less than 0.02", estimate(0.005, 0.004), margin=0.02)
    f.within("noisy", "the same with a larger SE", estimate(0.005, 0.02), margin=0.02)
    f.at_most("no_rise", "no increase above 0.02", [estimate(0.0, 0.005), estimate(0.01, 0.004)], margin=0.02)
    found = {x.name: x for x in f.decide()}
    tost = max(stats.norm.sf((0.005 + 0.02) / 0.004), stats.norm.cdf((0.005 - 0.02) / 0.004))
    assert found["flat"].p_value == pytest.approx(tost, rel=1e-9)
    assert found["flat"].holds and not found["noisy"].holds  # noise alone never passes "no effect"
    assert found["no_rise"].p_value == pytest.approx(stats.norm.cdf((0.01 - 0.02) / 0.004), rel=1e-9)


def test_power_is_the_rejection_rate_of_a_rerun():
    # One finding (m = 1): a rerun draws estimate ~ N(delta, se^2); the finding holds when z > z_{1-alpha}.
    delta, se = 0.3, 0.1
    f = Findings("t", profile="quick")
    f.greater("x", "positive", estimate(delta, se))
    power = f["x"].power
    rng = np.random.default_rng(2)
    draws = rng.normal(delta, se, size=40_000)
    rate = float(np.mean(stats.norm.sf(draws / se) <= ALPHA))
    assert power == pytest.approx(stats.norm.cdf(delta / se - stats.norm.ppf(1 - ALPHA)), rel=1e-9)
    assert abs(rate - power) < 4 * math.sqrt(power * (1 - power) / draws.size)
    # With size_factor times the replicates the SE shrinks by its square root and the power is POWER.
    k = f["x"].size_factor
    assert stats.norm.cdf(delta * math.sqrt(k) / se - stats.norm.ppf(1 - ALPHA)) == pytest.approx(POWER, abs=1e-9)


def test_a_finding_is_asserted_only_under_its_profiles():
    for profile, should_raise in (("quick", False), ("standard", True)):
        f = Findings("t", profile=profile)
        f.greater("weak", "a small effect", estimate(0.05, 0.1), profiles=("standard", "full"))
        f.fact("identity", "an identity", True)
        assert f["weak"].asserted == (profile == "standard")
        if should_raise:
            with pytest.raises(AssertionError, match="weak"):
                f.check()
        else:
            f.check()
            assert "reported, not asserted" in f["weak"].decision


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda f: f.greater("not an id", "s", estimate(1, 1)), ValueError),
        (lambda f: f.greater("x", "", estimate(1, 1)), TypeError),
        (lambda f: f.within("x", "s", estimate(1, 1), margin=0), ValueError),
        (lambda f: f.at_most("x", "s", estimate(1, 1), margin=-1), ValueError),
        (lambda f: f.greater("x", "s", 1.0), TypeError),
        (
            lambda f: f.greater(
                "x",
                "s",
                [],
            ),
            ValueError,
        ),
        (lambda f: f.greater("x", "s", estimate(1, 1), profiles=("fast",)), ValueError),
        (lambda f: f.fact("x", "s", 1), TypeError),
    ],
)
def test_findings_reject_bad_declarations(call, error):
    with pytest.raises(error):
        call(Findings("t", profile="quick"))


def test_findings_reject_a_duplicate_name_and_a_bad_profile():
    f = Findings("t", profile="quick")
    f.fact("x", "s", True)
    with pytest.raises(ValueError, match="already"):
        f.fact("x", "s", True)
    with pytest.raises(ValueError, match="profile"):
        Findings("t", profile="fast")


def test_significant_is_holm_on_two_sided_p_values():
    comps = [estimate(0.3, 0.1), estimate(-0.25, 0.1), estimate(0.1, 0.1)]
    p = [2 * stats.norm.sf(abs(c.z)) for c in comps]
    assert significant(comps) == list(multipletests(p, alpha=ALPHA, method="holm")[0])
    assert significant(comps, alternative="greater") == [True, False, False]


@pytest.mark.parametrize("count", [1, 10, 1000])
def test_family_threshold_is_bonferroni(count):
    assert family_threshold(count) == pytest.approx(stats.norm.ppf(1 - ALPHA / (2 * count)), rel=1e-12)
    with pytest.raises(ValueError):
        family_threshold(0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_fp_tolerance_follows_the_dtype(dtype):
    assert fp_tolerance(dtype, scale=2.0, condition=3.0) == pytest.approx(1024 * torch.finfo(dtype).eps * 6.0)
    with pytest.raises(ValueError):
        fp_tolerance("int32")
    with pytest.raises(ValueError):
        fp_tolerance(dtype, condition=0.5)


def test_mean_is_the_one_sample_t_statistic():
    from nwlib.evidence import mean

    a, _ = _series(3)
    assert mean(a).z == pytest.approx(stats.ttest_1samp(a.numpy(), 0.0).statistic, rel=1e-10)
    with pytest.raises(ValueError):
        mean(a[None])


def test_independent_difference_adds_variances_and_se_of_se_matches_simulation():
    from nwlib.evidence import independent, se_of_se

    c = independent(estimate(1.0, 0.3), estimate(0.2, 0.4))
    assert c.estimate == pytest.approx(0.8) and c.se == pytest.approx(0.5)
    # the spread of estimated SEs of the mean of R normal values, against se_of_se
    rng = np.random.default_rng(4)
    R = 50
    ses = rng.normal(size=(20_000, R)).std(axis=1, ddof=1) / math.sqrt(R)
    assert float(ses.std()) == pytest.approx(se_of_se(1 / math.sqrt(R), R), rel=0.03)
    with pytest.raises(ValueError):
        se_of_se(0.1, 1)


def test_the_family_is_closed_once_a_decision_is_read():
    f = Findings("t", profile="quick")
    f.greater("a", "an effect", estimate(0.22, 0.1))
    assert f.holds("a")
    with pytest.raises(RuntimeError, match="declare every finding"):
        f.greater("b", "a later effect", estimate(0.22, 0.1))


# --- crossed (two-way tables) and against (one value versus a reference law) ---


def test_crossed_matches_the_two_source_formula_and_pairs_cell_by_cell():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(7, 11)) + rng.normal(size=(7, 1)) + rng.normal(size=(1, 11))
    b = a - rng.normal(0.2, 0.1, size=(7, 11))
    expect_var = np.var(a.mean(1), ddof=1) / 7 + np.var(a.mean(0), ddof=1) / 11
    c = evidence.crossed(torch.from_numpy(a))
    assert c.estimate == pytest.approx(a.mean()) and c.se == pytest.approx(np.sqrt(expect_var))
    d = evidence.crossed(torch.from_numpy(a), torch.from_numpy(b))
    diff = a - b
    assert d.estimate == pytest.approx(diff.mean())
    assert d.se == pytest.approx(np.sqrt(np.var(diff.mean(1), ddof=1) / 7 + np.var(diff.mean(0), ddof=1) / 11))


def test_crossed_se_covers_a_rerun_that_redraws_both_sources():
    # rows and columns are independent random effects: the SE's mean square is at least the true variance
    gen = torch.Generator().manual_seed(0)
    means, ses = [], []
    for _ in range(400):
        t = (
            torch.randn(6, 1, generator=gen)
            + 0.5 * torch.randn(1, 9, generator=gen)
            + 0.3 * torch.randn(6, 9, generator=gen)
        )
        c = evidence.crossed(t.double())
        means.append(c.estimate)
        ses.append(c.se)
    true_var = 1 / 6 + 0.25 / 9 + 0.09 / 54
    assert np.var(means) == pytest.approx(true_var, rel=0.2)
    assert np.mean(np.square(ses)) >= 0.95 * true_var


@pytest.mark.parametrize("bad", [torch.zeros(5), torch.zeros(1, 5), torch.zeros(5, 1), np.zeros((3, 3))])
def test_crossed_rejects_tables_without_two_levels_per_source(bad):
    with pytest.raises(ValueError, match="a must be"):
        evidence.crossed(bad)
    with pytest.raises(ValueError, match="b must be"):
        evidence.crossed(torch.zeros(3, 3), torch.zeros(3, 4))


def test_against_is_a_prediction_interval_for_one_new_draw():
    draws = np.array([0.3, 0.5, 0.4, 0.9, 0.6])
    c = evidence.against(0.7, torch.tensor(draws))
    assert c.estimate == pytest.approx(0.7 - draws.mean())
    # the normal-theory prediction interval for one new draw: s * sqrt(1 + 1/N)
    assert c.se == pytest.approx(np.std(draws, ddof=1) * np.sqrt(1 + 1 / 5))
    with pytest.raises(ValueError, match="draws"):
        evidence.against(0.7, torch.tensor([0.5]))
    with pytest.raises(TypeError, match="value"):
        evidence.against("0.7", torch.tensor(draws))


# --- degrees of freedom of a standard error ---


def test_comparisons_carry_the_degrees_of_freedom_of_their_standard_error():
    import copy
    import pickle

    x = torch.arange(8, dtype=torch.float64) ** 0.5
    assert evidence.paired(x, x.flip(0)).df == 7 and evidence.mean(x).df == 7
    assert evidence.against(0.3, x).df == 7
    assert evidence.estimate(1.0, 0.1).df == math.inf and evidence.estimate(1.0, 0.1, df=4).df == 4
    t = torch.randn(5, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    c = evidence.crossed(t)
    v_rows, v_cols = float(t.mean(1).var()) / 5, float(t.mean(0).var()) / 9
    assert c.df == pytest.approx((v_rows + v_cols) ** 2 / (v_rows**2 / 4 + v_cols**2 / 8))
    # Welch-Satterthwaite for a difference of independent estimates (scipy's ttest_ind uses the same df)
    a, b = evidence.estimate(1.0, 0.3, df=5), evidence.estimate(0.5, 0.2, df=9)
    assert evidence.independent(a, b).df == pytest.approx((0.09 + 0.04) ** 2 / (0.09**2 / 5 + 0.04**2 / 9))
    # still a pair: unpacks, compares, copies and pickles with its df
    est, se = a
    assert (est, se) == (1.0, 0.3) and a == (1.0, 0.3)
    assert copy.copy(a).df == 5 and pickle.loads(pickle.dumps(a)).df == 5
    with pytest.raises(ValueError, match="df"):
        evidence.Comparison(1.0, 0.1, 0)


def test_family_threshold_is_students_t_with_finite_df():
    assert evidence.family_threshold(10, 0.05, df=4) == pytest.approx(stats.t.ppf(1 - 0.05 / 20, 4))
    assert evidence.family_threshold(10, 0.05) == pytest.approx(stats.norm.ppf(1 - 0.05 / 20))
    assert evidence.family_threshold(10, 0.05, df=1e9) == pytest.approx(evidence.family_threshold(10, 0.05), rel=1e-6)


def test_finding_p_value_uses_student_t_with_the_comparisons_df():
    """Few replicates (df = 3) widen the test: the p-value is t's upper tail, not the normal's."""
    from scipy.stats import norm, t

    from nwlib.evidence import Findings, estimate

    f = Findings("ch99", profile="quick")
    f.greater("few", "a gain on four seeds", estimate(0.22, 0.1, df=3))
    f.greater("many", "a gain on many replicates", estimate(0.22, 0.1))
    f.decide()
    assert f["few"].p_value == pytest.approx(t.sf(2.2, 3), rel=1e-12)
    assert f["many"].p_value == pytest.approx(norm.sf(2.2), rel=1e-12)
    # t(3) at 2.2 SE is not significant after Holm over two findings; the normal is
    assert not f.holds("few") and f.holds("many")
    assert f["few"].power < f["many"].power


def test_the_findings_table_summarises_many_tests_by_the_weakest():
    from nwlib.evidence import Findings, estimate

    f = Findings("summary", profile="quick")
    f.greater("few", "two effects", [estimate(1.0, 0.1), estimate(2.0, 0.1)])
    f.greater("many", "five effects", [estimate(v, 0.1) for v in (3.0, 0.5, 2.0, 4.0, 5.0)])
    table = f.table().set_index("finding")
    assert table.loc["two effects", "statistic"] == f["few"].statistic  # all of them, as before
    # the weakest is 0.5 ± 0.1 (z = 5): named, with the count
    assert table.loc["five effects", "statistic"] == f"{estimate(0.5, 0.1)} > 0 (the weakest of 5 comparisons)"
