r"""The book's one standard of evidence: paired comparisons, findings, multiplicity and power.

Every qualitative sentence of the book is a *finding*: a named statement with its statistic,
its standard error and a decision taken here, by one rule, in every chapter. The rule:

* **Comparisons are paired.** Two quantities measured on the same Monte Carlo replicates (common
  random numbers) are compared through the per-replicate differences (:func:`paired`, built on
  :func:`nwlib.paired_difference`); a quantity with a standard error of its own (a jackknife, a
  delta method) enters through :func:`estimate`.
* **A finding is a one-sided test.** "A is larger than B" holds when the paired difference is
  significantly above 0 (:meth:`Findings.greater`, :meth:`Findings.less`). A statement of *no*
  effect ("flat", "no significant increase", "agrees with the law") is an equivalence test with a
  stated margin (:meth:`Findings.within`, :meth:`Findings.at_most`): it holds when the data show the
  effect to be *smaller than the margin*, so less data makes it harder, never easier, to pass.
  A statement about several quantities at once ("lower MSE *and* lower covariance", "no step
  increases") holds when every part does (an intersection-union test: its p-value is the largest
  of its parts', valid without a correction).
* **One level, one multiplicity rule.** The findings of one notebook are one family; Holm's step-down
  procedure keeps the family-wise error rate at :data:`ALPHA`.
* **Sized to hold.** Each finding reports its estimated power (the probability that a rerun with
  another seed decides it the same way, from the measured standard errors and the Bonferroni level
  :data:`ALPHA`/m) and the factor by which the replicates must grow for that power to reach
  :data:`POWER`. A finding is *asserted* under the profiles it is declared for (by default every
  profile): an asserted finding that does not hold fails its notebook; under the other profiles it
  is reported, not asserted, and the book says so.
* **Facts** (:meth:`Findings.fact`) are statements that are exact or deterministic given the code
  (an identity, a count fixed by the design): they take part in no test and carry no power.

The same module sizes the tolerance of ``make verify`` (:func:`family_threshold`) and gives the
floating-point tolerance of deterministic values (:func:`fp_tolerance`). It needs neither torch nor
pandas at import time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal, NamedTuple

__all__ = [
    "ALPHA",
    "POWER",
    "PROFILES",
    "Comparison",
    "Finding",
    "Findings",
    "OneSided",
    "against",
    "crossed",
    "estimate",
    "welch_df",
    "family_threshold",
    "fp_tolerance",
    "holm",
    "independent",
    "mean",
    "paired",
    "se_of_se",
    "significant",
]

ALPHA = 0.05
"""Family-wise error rate of one notebook's findings (Holm), and of ``make verify``'s comparisons."""

POWER = 0.99
"""Target probability that an asserted finding holds on a rerun with another seed."""

PROFILES: tuple[str, ...] = ("quick", "standard", "full")
"""The parameter profiles; a finding is asserted under those it names (default: all)."""

_N = NormalDist()


class _EstimateSE(NamedTuple):
    estimate: float
    """The estimate (for :func:`paired`: the mean over replicates of ``a - b``)."""
    se: float
    """Its standard error."""


class Comparison(_EstimateSE):
    """A Monte Carlo estimate (usually a paired difference), its standard error and the SE's degrees of freedom.

    A pair ``(estimate, se)`` (it unpacks and compares as one); ``df``, an attribute, is the
    number of degrees of freedom of the standard error: R − 1 for the mean of R replicates,
    Welch–Satterthwaite for a combination, ``inf`` where the SE is known or unstated. ``make
    verify`` compares a rerun within a Student-t multiple of the combined SE with these degrees of
    freedom, so that an SE estimated from three restarts is not trusted like one from a thousand.
    """

    df: float

    def __new__(cls, estimate: float, se: float, df: float = math.inf) -> Comparison:
        self = super().__new__(cls, estimate, se)
        df = float(df)
        if not df > 0:
            raise ValueError(f"df must be positive (inf for a known standard error), got {df}")
        self.df = df
        return self

    def __getnewargs__(self) -> tuple[float, float, float]:  # pickles keep df
        return (self.estimate, self.se, self.df)

    @property
    def z(self) -> float:
        """``estimate / se`` (±inf for a nonzero estimate with a zero SE, 0 for 0/0)."""
        if self.se > 0:
            return self.estimate / self.se
        return 0.0 if self.estimate == 0 else math.copysign(math.inf, self.estimate)

    def __str__(self) -> str:
        return f"{self.estimate:.4g} ± {self.se:.2g}"


def welch_df(*parts: tuple[float, float]) -> float:
    """Welch–Satterthwaite degrees of freedom of a sum of independent variance parts ``(variance, df)``.

    Examples
    --------
    >>> welch_df((1.0, 4), (1.0, 4))  # two equal parts with 4 df each
    8.0
    >>> welch_df((1.0, math.inf), (0.0, 2))
    inf
    """
    total = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if v > 0 and math.isfinite(df))
    if total <= 0 or denominator <= 0:
        return math.inf
    return total * total / denominator


def _real(value: Any, name: str) -> float:
    if hasattr(value, "item") and getattr(value, "shape", None) in ((), (1,)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return value


def estimate(value: Any, se: Any, df: float = math.inf) -> Comparison:
    """A quantity with a standard error of its own (jackknife, delta method), as a :class:`Comparison`.

    Parameters
    ----------
    value : float or 0-dim tensor
    se : float or 0-dim tensor
        Non-negative and finite.
    df : float, default inf
        The standard error's degrees of freedom (G − 1 for a delete-a-group jackknife of G groups).

    Examples
    --------
    >>> estimate(0.5, 0.25).z
    2.0
    """
    value, se = _real(value, "value"), _real(se, "se")
    if not math.isfinite(se) or se < 0:
        raise ValueError(f"se must be finite and non-negative, got {se}")
    return Comparison(value, se, df)


def paired(a: Any, b: Any) -> Comparison:
    """The paired difference of two per-replicate series under common random numbers.

    Replicate r of ``a`` and of ``b`` must come from the same training set (the same random
    numbers), so the standard error is that of the differences (:func:`nwlib.paired_difference`).

    Parameters
    ----------
    a, b : Tensor, shape (R,)
        Per-replicate values, R >= 2.

    Returns
    -------
    Comparison
        Mean of ``a - b`` and its standard error, as floats.

    Examples
    --------
    >>> import torch
    >>> a = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    >>> c = paired(a, a - torch.tensor([0.5, 0.7, 0.5, 0.3], dtype=torch.float64))
    >>> round(c.estimate, 6), round(c.se, 6)
    (0.5, 0.08165)
    """
    from .combination import paired_difference

    if getattr(a, "dim", lambda: 0)() != 1:
        raise ValueError(f"a must be a 1-dimensional tensor of replicates, got shape {tuple(getattr(a, 'shape', ()))}")
    d = paired_difference(a, b)
    return Comparison(float(d.mean), float(d.se), a.shape[0] - 1)


def mean(values: Any) -> Comparison:
    """The mean of independent per-replicate values and its standard error (R − 1 denominator).

    Parameters
    ----------
    values : Tensor, shape (R,)
        R >= 2 independent replicates of one quantity (not a difference: that is :func:`paired`).

    Examples
    --------
    >>> import torch
    >>> c = mean(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    >>> c.estimate, round(c.se, 6)
    (2.5, 0.645497)
    """
    import torch

    if not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise ValueError("values must be a 1-dimensional tensor of replicates")
    return paired(values, torch.zeros_like(values))


def independent(a: Comparison, b: Comparison) -> Comparison:
    """The difference ``a − b`` of two estimates from independent draws (SEs add in quadrature).

    For estimates on the same draws use :func:`paired` on the per-replicate values instead: their
    errors are correlated and this would misstate the standard error.

    Examples
    --------
    >>> independent(estimate(1.0, 0.3), estimate(0.5, 0.4))
    Comparison(estimate=0.5, se=0.5)
    """
    a, b = _as_comparison(a, "a"), _as_comparison(b, "b")
    df = welch_df((a.se**2, getattr(a, "df", math.inf)), (b.se**2, getattr(b, "df", math.inf)))
    return Comparison(a.estimate - b.estimate, math.hypot(a.se, b.se), df)


def crossed(a: Any, b: Any = None) -> Comparison:
    """The mean of a two-way table of errors (or of ``a − b``, paired) over two crossed sources.

    Rows and columns are independent sources of randomness that a rerun draws anew: training
    sets × evaluation points, say, or output-weight fits × evaluation replicates. The standard
    error adds the two sources' variances, each estimated from the means over the other one:
    ``se² = var(row means)/R + var(column means)/m`` (R − 1 and m − 1 denominators). It covers
    a rerun that redraws both (slightly conservative: each part also carries the interaction).

    Parameters
    ----------
    a : Tensor, shape (R, m)
        R >= 2 rows (one source) and m >= 2 columns (the other).
    b : Tensor, shape (R, m), optional
        A second table on the same draws; the comparison is then of ``a − b``, paired cell by cell.

    Returns
    -------
    Comparison

    Examples
    --------
    >>> import torch
    >>> t = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]], dtype=torch.float64)
    >>> c = crossed(t)
    >>> c.estimate, round(c.se, 6)  # sqrt(2/2 + 1/3)
    (3.0, 1.154701)
    """
    import torch

    if not isinstance(a, torch.Tensor) or a.dim() != 2 or min(a.shape) < 2:
        raise ValueError(f"a must be a (R, m) tensor with R, m >= 2, got shape {tuple(getattr(a, 'shape', ()))}")
    if b is not None:
        if not isinstance(b, torch.Tensor) or b.shape != a.shape:
            raise ValueError(f"b must be a tensor of a's shape {tuple(a.shape)}")
        a = a - b
    a = a.double()
    rows, columns = a.mean(1), a.mean(0)
    parts = (
        (float(rows.var()) / rows.numel(), rows.numel() - 1),
        (float(columns.var()) / columns.numel(), columns.numel() - 1),
    )
    return Comparison(float(a.mean()), math.sqrt(parts[0][0] + parts[1][0]), welch_df(*parts))


def against(value: float, draws: Any) -> Comparison:
    """A value minus the mean of a reference law's draws, with the spread of one new draw from it.

    The question "is this trained value typical of the law (random subspaces, an initialisation)?"
    compares one value with one new draw, not with the law's mean: the standard error is the
    draws' standard deviation times ``sqrt(1 + 1/N)`` (a prediction interval), so it does not
    shrink as more draws are made.

    Parameters
    ----------
    value : float
        The observed value (a statistic of a trained model).
    draws : Tensor, shape (N,)
        N >= 2 independent draws of the same statistic under the reference law.

    Returns
    -------
    Comparison

    Examples
    --------
    >>> import torch
    >>> c = against(1.0, torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64))
    >>> c.estimate, round(c.se, 6)  # 1 - 1, and 1 * sqrt(4/3)
    (0.0, 1.154701)
    """
    import torch

    if not isinstance(draws, torch.Tensor) or draws.dim() != 1 or draws.numel() < 2:
        raise ValueError("draws must be a 1-dimensional tensor of at least 2 draws")
    value = _real(value, "value")
    draws = draws.double()
    n = draws.numel()
    return Comparison(value - float(draws.mean()), float(draws.std()) * math.sqrt(1 + 1 / n), n - 1)


def se_of_se(se: float, replicates: int) -> float:
    """Standard error of a standard error estimated from ``replicates`` values: ``se / sqrt(2 (R − 1))``.

    The class of a glued standard error (``glue(..., se=se_of_se(se, R))``): it is itself a Monte
    Carlo estimate (normal theory; a guide, not exact for skewed replicates).

    Examples
    --------
    >>> se_of_se(0.1, 51)
    0.01
    """
    if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 2:
        raise ValueError(f"replicates must be an integer >= 2, got {replicates!r}")
    return _real(se, "se") / math.sqrt(2 * (replicates - 1))


def _as_comparison(value: Any, name: str) -> Comparison:
    if isinstance(value, Comparison):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return estimate(*value)
    raise TypeError(
        f"{name} must be a Comparison (from paired or estimate) or an (estimate, se) pair, got {type(value).__name__}"
    )


@dataclass(frozen=True)
class OneSided:
    """One one-sided test: H1 is ``estimate > bound`` (``side="greater"``) or ``< bound`` (``"less"``)."""

    comparison: Comparison
    side: Literal["greater", "less"]
    bound: float

    @property
    def distance(self) -> float:
        """Standardised distance of the estimate from the bound, positive in the direction of H1."""
        c = self.comparison
        gap = c.estimate - self.bound if self.side == "greater" else self.bound - c.estimate
        if c.se > 0:
            return gap / c.se
        return 0.0 if gap == 0 else math.copysign(math.inf, gap)

    @property
    def p_value(self) -> float:
        """One-sided p-value: Student t with the comparison's degrees of freedom (normal when infinite)."""
        d = self.distance
        if math.isinf(d):
            return 0.0 if d > 0 else 1.0
        return _upper_tail(d, self.comparison.df)


def _upper_tail(d: float, df: float) -> float:
    """P(T > d) for Student's t with ``df`` degrees of freedom (the normal when ``df`` is infinite)."""
    if math.isinf(df):
        return 1.0 - _N.cdf(d)
    from scipy.stats import t  # lazy: only comparisons with finite df need scipy

    return float(t.sf(d, df))


def _quantile(level: float, df: float) -> float:
    """The ``level`` quantile of Student's t with ``df`` degrees of freedom (normal when infinite)."""
    if math.isinf(df):
        return _N.inv_cdf(level)
    from scipy.stats import t

    return float(t.ppf(level, df))


def _tests(comparisons: Any, name: str) -> list[Comparison]:
    if isinstance(comparisons, (Comparison, tuple)) and not (
        isinstance(comparisons, tuple) and comparisons and isinstance(comparisons[0], (Comparison, tuple))
    ):
        return [_as_comparison(comparisons, name)]
    out = [_as_comparison(c, name) for c in comparisons]
    if not out:
        raise ValueError(f"{name} must hold at least one comparison")
    return out


@dataclass
class Finding:
    """A named statement of the book, its tests and its decision (see :class:`Findings`)."""

    name: str
    statement: str
    tests: tuple[OneSided, ...]
    asserted: bool
    profiles: tuple[str, ...]
    fact: bool | None = None
    """For a fact: whether it holds (no test)."""
    hypothesis: str = ""
    """What the tests establish, as text (estimates, standard errors and bounds)."""
    p_value: float = math.nan
    """Intersection-union p-value: the largest of the tests' one-sided p-values."""
    p_adjusted: float = math.nan
    """Holm-adjusted p-value within the family."""
    holds: bool = False
    """The decision: Holm-adjusted p-value at most :data:`ALPHA` (for a fact: the fact)."""
    power: float = math.nan
    """Estimated probability that a rerun decides the finding the same way (tests at level ALPHA/m)."""
    size_factor: float = math.nan
    """By how much the replicates must grow for :attr:`power` to reach :data:`POWER` (1 when it does)."""

    @property
    def is_fact(self) -> bool:
        return self.fact is not None

    @property
    def statistic(self) -> str:
        """The tests' estimates with their standard errors, as text."""
        if self.is_fact:
            return "exact"
        return self.hypothesis

    @property
    def summary(self) -> str:
        """:attr:`statistic`, or for more than three tests the weakest one (largest p-value) and their count."""
        if self.is_fact or len(self.tests) <= 3:
            return self.statistic
        weakest = max(self.tests, key=lambda t: t.p_value)
        sign = ">" if weakest.side == "greater" else "<"
        return f"{weakest.comparison} {sign} {weakest.bound:g} (the weakest of {len(self.tests)} comparisons)"

    @property
    def decision(self) -> str:
        """'holds' or 'does not hold', and whether the profile asserts it."""
        verdict = "holds" if self.holds else "does not hold"
        return verdict if self.asserted else f"{verdict}, reported, not asserted"


class Findings:
    """The findings of one notebook: one family, decided together under :data:`ALPHA` (Holm).

    Parameters
    ----------
    family : str
        The family's name (the notebook's stem).
    profile : str
        The profile this run executes; a finding is asserted only under the profiles it names.
    alpha : float, default :data:`ALPHA`
        Family-wise error rate. Chapters use the default; tests may pass another.

    Examples
    --------
    >>> f = Findings("ch99", profile="quick")
    >>> f.greater("gain", "the ensemble beats one head", estimate(0.5, 0.1))
    >>> f.within("flat", "the MSE does not move by more than 0.1", estimate(0.01, 0.02), margin=0.1)
    >>> f.fact("exact", "the decomposition adds up", True)
    >>> [(x.name, x.holds) for x in f.decide()]
    [('gain', True), ('flat', True), ('exact', True)]
    >>> f.check()
    """

    def __init__(self, family: str, *, profile: str, alpha: float = ALPHA) -> None:
        if not isinstance(family, str) or not family:
            raise TypeError(f"family must be a non-empty string, got {family!r}")
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
        alpha = _real(alpha, "alpha")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        self.family, self.profile, self.alpha = family, profile, alpha
        self._findings: dict[str, Finding] = {}
        self._decided = False
        self._read = False  # a decision was read: the family is closed

    # --- declaring findings ---
    def _add(
        self,
        name: str,
        statement: str,
        tests: list[OneSided],
        profiles: Iterable[str] | None,
        fact: bool | None = None,
        hypothesis: str = "",
    ) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be an identifier (it becomes a glue key), got {name!r}")
        if name in self._findings:
            raise ValueError(f"name {name!r} is already a finding of {self.family}")
        if self._read:
            raise RuntimeError(
                f"finding {name!r} declared after a decision of {self.family} was read: Holm decides the "
                "whole family at once, so declare every finding before reading any decision"
            )
        if not isinstance(statement, str) or not statement.strip():
            raise TypeError("statement must be a non-empty string: the sentence the book states")
        profiles = PROFILES if profiles is None else tuple(profiles)
        unknown = [p for p in profiles if p not in PROFILES]
        if unknown:  # () is allowed: reported under every profile, asserted under none
            raise ValueError(f"profiles must be a subset of {PROFILES}, got {profiles}")
        self._findings[name] = Finding(
            name, statement.strip(), tuple(tests), self.profile in profiles, profiles, fact=fact, hypothesis=hypothesis
        )
        self._decided = False

    def greater(
        self, name: str, statement: str, comparisons: Any, *, than: float = 0.0, profiles: Sequence[str] | None = None
    ) -> None:
        """Declare "each estimate exceeds ``than``" (for a paired difference a − b: a > b).

        Parameters
        ----------
        name : str
            Identifier of the finding (glued as ``finding_<name>``).
        statement : str
            The sentence as the book states it.
        comparisons : Comparison or sequence of Comparison
            One estimate, or several that must all exceed ``than`` (intersection-union test).
        than : float, default 0
        profiles : sequence of str, optional
            Where the finding is asserted (default: every profile; ``()``: reported everywhere,
            asserted nowhere, for a statement no profile is sized to decide or one the data may contradict).
        """
        bound, cs = _real(than, "than"), _tests(comparisons, "comparisons")
        self._add(
            name,
            statement,
            [OneSided(c, "greater", bound) for c in cs],
            profiles,
            hypothesis="; ".join(f"{c} > {bound:g}" for c in cs),
        )

    def less(
        self, name: str, statement: str, comparisons: Any, *, than: float = 0.0, profiles: Sequence[str] | None = None
    ) -> None:
        """Declare "each estimate is below ``than``" (for a paired difference a − b: a < b)."""
        bound, cs = _real(than, "than"), _tests(comparisons, "comparisons")
        self._add(
            name,
            statement,
            [OneSided(c, "less", bound) for c in cs],
            profiles,
            hypothesis="; ".join(f"{c} < {bound:g}" for c in cs),
        )

    def at_most(
        self, name: str, statement: str, comparisons: Any, *, margin: float, profiles: Sequence[str] | None = None
    ) -> None:
        """Declare "no estimate exceeds ``margin``" (no significant increase): one-sided equivalence.

        Holds when every estimate is significantly below ``margin > 0``, so it cannot pass on
        noise alone: a small sample gives large standard errors and fails it.
        """
        margin = _real(margin, "margin")
        if margin <= 0:
            raise ValueError(f"margin must be positive, got {margin}")
        cs = _tests(comparisons, "comparisons")
        self._add(
            name,
            statement,
            [OneSided(c, "less", margin) for c in cs],
            profiles,
            hypothesis="; ".join(f"{c} < {margin:g} (margin)" for c in cs),
        )

    def within(
        self,
        name: str,
        statement: str,
        comparisons: Any,
        *,
        margin: float,
        center: float = 0.0,
        profiles: Sequence[str] | None = None,
    ) -> None:
        """Declare "each estimate lies within ``center ± margin``": an equivalence test (TOST).

        Parameters
        ----------
        margin : float
            Half-width of the equivalence region, > 0, chosen for what the sentence means (e.g.
            "moves by less than 2 %" is a margin of 2 % of the reference value), never from the data.
        center : float, default 0
        """
        margin, center = _real(margin, "margin"), _real(center, "center")
        if margin <= 0:
            raise ValueError(f"margin must be positive, got {margin}")
        tests, cs = [], _tests(comparisons, "comparisons")
        for c in cs:
            tests += [OneSided(c, "greater", center - margin), OneSided(c, "less", center + margin)]
        self._add(
            name, statement, tests, profiles, hypothesis="; ".join(f"{c} within {center:g} ± {margin:g}" for c in cs)
        )

    def fact(self, name: str, statement: str, holds: bool, *, profiles: Sequence[str] | None = None) -> None:
        """Declare a statement that is exact or deterministic given the code (no test, no power)."""
        if not isinstance(holds, bool):
            raise TypeError(f"holds must be a bool, got {type(holds).__name__}")
        self._add(name, statement, [], profiles, fact=holds)

    # --- deciding ---
    def decide(self) -> list[Finding]:
        """Holm over the family's tested findings; power and size factor for each. Returns the findings."""
        tested = [f for f in self._findings.values() if not f.is_fact]
        m = len(tested)
        for f in tested:
            f.p_value = max(t.p_value for t in f.tests)
        adjusted = holm([f.p_value for f in tested])
        z_power = _N.inv_cdf(POWER)
        for f, p in zip(tested, adjusted, strict=True):
            f.p_adjusted = p
            f.holds = p <= self.alpha
            powers, factors = [], []
            for t in f.tests:
                d = t.distance
                # the Bonferroni level of a rerun, on the comparison's own t distribution
                z_level = _quantile(1 - self.alpha / max(m, 1), t.comparison.df)
                powers.append(1.0 if d == math.inf else 0.0 if d == -math.inf else _N.cdf(d - z_level))
                factors.append(
                    1.0 if d == math.inf else math.inf if d <= 0 else max(1.0, ((z_level + z_power) / d) ** 2)
                )
            f.power = math.prod(powers)
            f.size_factor = max(factors)
        for f in self._findings.values():
            if f.is_fact:
                f.holds = bool(f.fact)
        self._decided = True
        return list(self._findings.values())

    def __getitem__(self, name: str) -> Finding:
        if not self._decided:
            self.decide()
        self._read = True
        return self._findings[name]

    def __iter__(self):
        if not self._decided:
            self.decide()
        self._read = True
        return iter(self._findings.values())

    def __len__(self) -> int:
        return len(self._findings)

    def holds(self, name: str) -> bool:
        """The decision for one finding (deciding the family first if needed)."""
        return self[name].holds

    def failed(self) -> list[Finding]:
        """The asserted findings that do not hold."""
        return [f for f in self if f.asserted and not f.holds]

    def check(self) -> None:
        """Raise AssertionError naming every asserted finding that does not hold under this profile."""
        bad = self.failed()
        if bad:
            lines = "\n".join(f"  {f.name}: {f.statement} [{f.statistic}, Holm p = {f.p_adjusted:.3g}]" for f in bad)
            raise AssertionError(
                f"{len(bad)} finding(s) of {self.family} do not hold under profile {self.profile!r}:\n{lines}"
            )

    def table(self) -> Any:
        """The findings as a pandas DataFrame, one row per finding.

        Columns: ``finding`` (the statement: the reader's label; the finding's name is the
        notebook's), ``statistic`` (:attr:`Finding.summary`: every test, or the weakest of more
        than three), ``Holm p``, ``power``, ``asserted in`` and ``decision``.
        """
        import pandas as pd

        def p_text(p: float) -> str:
            return "< 0.0001" if p < 1e-4 else f"{p:.2g}"

        rows = [
            {
                "statistic": f.summary,
                "Holm p": p_text(f.p_adjusted) if not f.is_fact else "—",
                "power": f"{f.power:.3f}" if not f.is_fact else "—",
                "asserted in": ", ".join(f.profiles),
                "decision": f.decision,
            }
            for f in self
        ]
        return pd.DataFrame([{"finding": f.statement, **row} for f, row in zip(self, rows, strict=True)])

    def glue(self) -> None:
        """Glue every finding's decision and the family's table.

        Keys: ``finding_<name>`` (bool), ``finding_<name>_decision`` (text: "holds", or
        "holds, reported, not asserted" under a profile that does not assert it),
        ``finding_<name>_power``, ``findings_asserted``, ``findings_reported``,
        ``findings_alpha`` and ``findings_table`` (the :meth:`table`, also displayed in the
        notebook with its cells unabridged; a finding of more than three tests shows its weakest,
        and ``findings[name].statistic`` has them all).

        An asserted decision is recorded as exact (a rerun on any seed or machine must repeat
        it); a finding reported but not asserted is informational.
        """
        from .book import glue

        for f in self:
            glue(f"finding_{f.name}", f.holds, exact=f.asserted, verify=f.asserted)
            glue(f"finding_{f.name}_decision", f.decision, verify=f.asserted)
            glue(f"finding_{f.name}_power", f.power if not f.is_fact else 1.0, verify=False)
        glue("findings_asserted", sum(f.asserted for f in self))
        glue("findings_reported", sum(not f.asserted for f in self))
        glue("findings_alpha", self.alpha, exact=True)
        glue("findings_table", _FindingsTable(self.table()), display=True)


class _FindingsTable:
    """A findings table as the book shows it: statements as plain text in a wrapping column, and
    the class ``nwlib-findings`` that the book's style sheet lays out as one card per finding on a
    phone. In a notebook (text) every statement and statistic is printed unabridged."""

    def __init__(self, frame: Any) -> None:
        self.frame = frame

    def _repr_html_(self) -> str:
        html: str = self.frame.to_html(index=False, classes="nwlib-findings", border=0, escape=True)
        return html

    def __repr__(self) -> str:
        import pandas as pd

        with pd.option_context("display.max_colwidth", None, "display.width", 200):
            text: str = self.frame.to_string(index=False)
        return text


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order.

    Examples
    --------
    >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03])]
    [0.03, 0.06, 0.06]
    """
    p = [_real(x, "p_values") for x in p_values]
    if any(not 0 <= x <= 1 for x in p):
        raise ValueError("p_values must lie in [0, 1]")
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def significant(
    comparisons: Sequence[Comparison],
    *,
    alpha: float = ALPHA,
    alternative: Literal["two-sided", "greater", "less"] = "two-sided",
) -> list[bool]:
    """Which of a table's comparisons differ from 0, Holm within the table at ``alpha``.

    For descriptive tables (which steps of a path move the MSE); the book's sentences are
    :class:`Findings`.

    Examples
    --------
    >>> significant([estimate(1.0, 0.1), estimate(0.1, 0.1)])
    [True, False]
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}")
    ps = []
    for c in comparisons:
        c = _as_comparison(c, "comparisons")
        if alternative == "two-sided":
            ps.append(min(1.0, 2 * min(OneSided(c, "greater", 0.0).p_value, OneSided(c, "less", 0.0).p_value)))
        else:
            ps.append(OneSided(c, alternative, 0.0).p_value)
    return [p <= alpha for p in holm(ps)]


def family_threshold(count: int, alpha: float = ALPHA, df: float = math.inf) -> float:
    """The |z| beyond which one of ``count`` two-sided comparisons fails at family-wise level ``alpha``.

    Bonferroni: ``Φ⁻¹(1 − alpha / (2·count))``, or with an estimated standard error of ``df``
    degrees of freedom the Student-t quantile ``t⁻¹_df(1 − alpha / (2·count))`` (needs scipy).
    ``make verify`` compares about a thousand Monte Carlo values of a rerun with the reference
    within this many combined standard errors, with the Welch–Satterthwaite df of the two SEs.

    Examples
    --------
    >>> round(family_threshold(1000), 2)
    4.06
    >>> round(family_threshold(1000, df=2), 1)  # an SE from three restarts pins little
    141.4
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    level = 1 - _real(alpha, "alpha") / (2 * count)
    df = _real(df, "df")
    if not df > 0:
        raise ValueError(f"df must be positive, got {df}")
    if math.isinf(df):
        return _N.inv_cdf(level)
    from scipy.stats import t

    return float(t.ppf(level, df))


_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def fp_tolerance(dtype: Any = "float64", *, scale: float = 1.0, condition: float = 1.0) -> float:
    r"""Absolute tolerance of a deterministic value computed in floating point, for reruns elsewhere.

    Another instruction set or thread count changes the order of summation, so a value differs
    by a few rounding errors of its dtype, amplified by the problem's conditioning:
    ``tol = 2**10 · eps(dtype) · condition · scale`` (the factor 2**10 covers reductions of up to
    about a million terms summed in another order; ``scale`` is the value's magnitude).

    Parameters
    ----------
    dtype : torch.dtype or str, default "float64"
    scale : float, default 1
        Magnitude of the value (or of the terms it is computed from).
    condition : float, default 1
        Condition number of the computation (e.g. of a least-squares solve), >= 1.

    Examples
    --------
    >>> fp_tolerance("float64")
    2.2737367544323206e-13
    """
    name = str(dtype).removeprefix("torch.")
    if name not in _EPS:
        raise ValueError(f"dtype must be one of {sorted(_EPS)}, got {dtype!r}")
    scale, condition = abs(_real(scale, "scale")), _real(condition, "condition")
    if condition < 1:
        raise ValueError(f"condition must be >= 1, got {condition}")
    return 2.0**10 * _EPS[name] * condition * max(scale, 1e-300)
