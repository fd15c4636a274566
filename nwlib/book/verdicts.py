"""Verdict labels for the paper's claims, decided in one place by one rule.

Every chapter ends with a verdict per claim, and the claims ledger collects them.
The labels and the rule that picks one live here, so that the chapters cannot
drift apart in vocabulary or in standards:

``reproduced``
    the claim holds as stated in every case tested;
``reproduced under the paper's conditions``
    a counterexample to the literal statement exists, but it violates a condition
    that the paper states or clearly implies, and the claim holds under those
    conditions;
``not reproduced as stated``
    a counterexample exists within the paper's conditions (or the conditions that
    rescue the claim are ours): the chapter then states, derives and tests a
    corrected proposition;
``not testable as stated``
    the statement is too vague to be checked, or is an analogy.

A verdict also records which labels the evidence *could* have produced. A check
that cannot fail (an algebraic identity recomputed by the code, say) yields a
label, but no evidence for it; :attr:`Verdict.decisive` says so, and the chapter
must say so too.

"Within the paper's conditions" is decided by one rule, :func:`judge`, from the cases
each chapter records: a :class:`Case` says whether the claim held in one experimental
setting (from a finding's decision) and describes the setting by attributes (kernel,
combination, head quality, regime, ...); the chapter declares the paper's conditions
as the attribute values the paper states or clearly implies, citing it. A case lies
within the paper's conditions when each of its attributes named by the conditions
takes an allowed value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

__all__ = [
    "LABELS",
    "Case",
    "Reading",
    "ReadingVerdict",
    "Verdict",
    "decide",
    "judge",
    "judge_readings",
    "within_conditions",
]

REPRODUCED = "reproduced"
UNDER_CONDITIONS = "reproduced under the paper's conditions"
NOT_REPRODUCED = "not reproduced as stated"
NOT_TESTABLE = "not testable as stated"

LABELS: tuple[str, ...] = (REPRODUCED, UNDER_CONDITIONS, NOT_REPRODUCED, NOT_TESTABLE)
"""The four verdict labels, from strongest support to none."""


@dataclass(frozen=True)
class Verdict:
    """A claim's verdict with the evidence behind it.

    Attributes
    ----------
    claim : str
        The claim's number, e.g. ``"C4"``.
    label : str
        One of :data:`LABELS`.
    reason : str
        One sentence: the deciding evidence (with numbers, formatted by the caller).
    possible : tuple of str
        The labels this experiment could have produced with other outcomes.
    readings : tuple of ReadingVerdict
        The readings of the claim that were tested, each with its own label, when the verdict
        comes from :func:`judge_readings` (empty from :func:`decide` and :func:`judge`).
    """

    claim: str
    label: str
    reason: str
    possible: tuple[str, ...]
    readings: tuple[ReadingVerdict, ...] = ()

    @property
    def charitable(self) -> ReadingVerdict | None:
        """The charitable reading, whose label is the claim's (None without readings)."""
        return next((r for r in self.readings if r.charitable), None)

    @property
    def decisive(self) -> bool:
        """Whether the evidence could have produced another label (otherwise it is no evidence)."""
        return len(self.possible) > 1

    def text(self) -> str:
        """The label with its reason, and a warning when the label could not have come out otherwise."""
        charitable = self.charitable
        on = f"on the charitable reading, {charitable.name}: " if charitable is not None else ""
        out = f"{self.label} ({on}{self.reason})"
        if not self.decisive:
            out += "; this check could not have produced another label, so it is no evidence for the claim"
        return out


def decide(
    claim: str,
    *,
    holds_as_stated: bool | None,
    holds_under_paper_conditions: bool | None = None,
    counterexample_within_paper_conditions: bool | None = None,
    reason: str,
    possible: tuple[str, ...] | None = None,
) -> Verdict:
    """Pick a claim's label from what the experiments found.

    Parameters
    ----------
    claim : str
        The claim's number (``"C1"`` to ``"C12"``).
    holds_as_stated : bool or None
        Whether the literal statement held in every case tested; ``None`` when
        the statement cannot be tested as given.
    holds_under_paper_conditions : bool, optional
        Needed when ``holds_as_stated`` is False: whether the claim held in every
        tested case that satisfies the conditions the paper states or clearly
        implies (not conditions of our own).
    counterexample_within_paper_conditions : bool, optional
        Needed when ``holds_as_stated`` is False: whether a counterexample
        satisfies the paper's own conditions. If it does, the label is "not
        reproduced as stated" whatever ``holds_under_paper_conditions`` says.
    reason : str
        The deciding evidence, in one sentence.
    possible : tuple of str, optional
        The labels the experiment could have produced. Default: all four when the
        claim is testable (``holds_as_stated`` not None), otherwise only "not
        testable as stated".

    Returns
    -------
    Verdict

    Raises
    ------
    TypeError
        If a flag is not a bool (or None where allowed) or ``reason`` is not a string.
    ValueError
        If ``reason`` is empty, a needed flag is missing, ``possible`` names an
        unknown label, or the chosen label is not among ``possible``.

    Examples
    --------
    >>> v = decide("C6", holds_as_stated=False, holds_under_paper_conditions=False,
    ...            counterexample_within_paper_conditions=True, reason="MSE rises with the HDI")
    >>> v.label, v.decisive
    ('not reproduced as stated', True)
    """
    if not isinstance(claim, str) or not claim:
        raise TypeError(f"claim must be a non-empty string, got {claim!r}")
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a string, got {type(reason).__name__}")
    if not reason.strip():
        raise ValueError("reason must say what decided the verdict")
    for name, flag in (
        ("holds_as_stated", holds_as_stated),
        ("holds_under_paper_conditions", holds_under_paper_conditions),
        ("counterexample_within_paper_conditions", counterexample_within_paper_conditions),
    ):
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool or None, got {type(flag).__name__}")
    if holds_as_stated is None:
        label = NOT_TESTABLE
    elif holds_as_stated:
        label = REPRODUCED
    else:
        if holds_under_paper_conditions is None or counterexample_within_paper_conditions is None:
            raise ValueError(
                "holds_under_paper_conditions and counterexample_within_paper_conditions are needed "
                "when holds_as_stated is False"
            )
        if holds_under_paper_conditions and not counterexample_within_paper_conditions:
            label = UNDER_CONDITIONS
        else:
            label = NOT_REPRODUCED
    if possible is None:
        possible = LABELS if holds_as_stated is not None else (NOT_TESTABLE,)
    possible = tuple(possible)
    unknown = [p for p in possible if p not in LABELS]
    if unknown:
        raise ValueError(f"possible must contain labels from {list(LABELS)}, got {unknown}")
    if label not in possible:
        raise ValueError(f"possible must contain the decided label {label!r}, got {list(possible)}")
    return Verdict(claim=claim, label=label, reason=reason.strip(), possible=possible)


@dataclass(frozen=True)
class Case:
    """One experimental setting in which a claim was tested.

    Attributes
    ----------
    name : str
        Short identifier (e.g. ``"dot-product kernel, least squares, heterogeneous heads"``).
    holds : bool
        Whether the claim held in this setting: a finding's decision
        (:meth:`nwlib.evidence.Findings.holds`), never a literal.
    attributes : mapping of str to str
        The setting, e.g. ``{"kernel": "dot-product", "combination": "least squares",
        "heads": "heterogeneous"}``.
    could_fail : bool, default True
        False when the check cannot fail for a correct program (an identity recomputed).
    """

    name: str
    holds: bool
    attributes: Mapping[str, str] = field(default_factory=dict)
    could_fail: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.holds, bool):
            raise TypeError(f"holds must be a bool (a finding's decision), got {type(self.holds).__name__}")
        if not isinstance(self.attributes, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.attributes.items()
        ):
            raise TypeError("attributes must map attribute names (str) to values (str)")
        if not isinstance(self.could_fail, bool):
            raise TypeError(f"could_fail must be a bool, got {type(self.could_fail).__name__}")


def within_conditions(case: Case, conditions: Mapping[str, Iterable[str]]) -> bool:
    """Whether ``case`` satisfies ``conditions`` (attribute -> allowed values).

    Raises
    ------
    ValueError
        If the case lacks an attribute the conditions name: every case must say where it stands.

    Examples
    --------
    >>> within_conditions(Case("a", True, {"heads": "heterogeneous"}), {"heads": ["heterogeneous"]})
    True
    """
    for attribute, allowed in conditions.items():
        if attribute not in case.attributes:
            raise ValueError(f"case {case.name!r} lacks the attribute {attribute!r} that the conditions name")
        if case.attributes[attribute] not in set(allowed):
            return False
    return True


def judge(
    claim: str,
    cases: Iterable[Case],
    *,
    conditions: Mapping[str, Iterable[str]],
    reason: str,
) -> Verdict:
    """A claim's verdict from its tested cases, by the one rule of the book.

    * every case holds: ``reproduced``;
    * a case fails, but every failing case lies outside the paper's conditions and at least
      one case within them holds: ``reproduced under the paper's conditions``;
    * a case within the paper's conditions fails (or no case lies within them):
      ``not reproduced as stated``.

    The labels the cases *could* have produced are recorded (:attr:`Verdict.possible`): "under
    the paper's conditions" needs a case outside and a case inside them, "not reproduced" a case
    inside that could fail, "reproduced" a case that could fail or none at all.

    Parameters
    ----------
    claim : str
    cases : iterable of Case
        At least one.
    conditions : mapping of str to iterable of str
        The paper's conditions: for each attribute, the values the paper states or clearly
        implies. An empty mapping means the claim is unconditional.
    reason : str
        The deciding evidence in one sentence.

    Examples
    --------
    >>> cases = [Case("equal quality", False, {"heads": "homogeneous"}),
    ...          Case("unequal quality", True, {"heads": "heterogeneous"})]
    >>> judge("C11", cases, conditions={"heads": ["heterogeneous"]}, reason="...").label
    "reproduced under the paper's conditions"
    """
    cases = list(cases)
    if not cases or not all(isinstance(c, Case) for c in cases):
        raise TypeError("cases must be a non-empty iterable of Case")
    if not isinstance(conditions, Mapping):
        raise TypeError(f"conditions must be a mapping, got {type(conditions).__name__}")
    within = [within_conditions(c, conditions) for c in cases]
    inside = [c for c, w in zip(cases, within, strict=True) if w]
    outside = [c for c, w in zip(cases, within, strict=True) if not w]
    holds_as_stated = all(c.holds for c in cases)
    possible = {REPRODUCED} if any(c.could_fail for c in cases) or holds_as_stated else set()
    if any(c.could_fail for c in cases):
        if inside and outside:
            possible.add(UNDER_CONDITIONS)
        if any(c.could_fail for c in inside) or not inside:
            possible.add(NOT_REPRODUCED)
    verdict_kwargs = {}
    if not holds_as_stated:
        verdict_kwargs = dict(
            holds_under_paper_conditions=bool(inside) and all(c.holds for c in inside),
            counterexample_within_paper_conditions=any(not c.holds for c in inside) or not inside,
        )
    verdict = decide(claim, holds_as_stated=holds_as_stated, reason=reason, possible=LABELS, **verdict_kwargs)
    possible.add(verdict.label)
    return replace(verdict, possible=tuple(x for x in LABELS if x in possible))


@dataclass(frozen=True)
class Reading:
    """One reading of a claim: what the (summarised) statement is taken to say, and its cases.

    We judge a summary of the paper, so a claim often admits several reasonable readings
    (existential or universal, one definition of a symbol or another). Each reading is tested
    by its own cases under its own statement of the paper's conditions; exactly one reading
    per claim is marked *charitable*: the reading most favourable to the paper that the
    summary's words still support. The claim's label is the charitable reading's label
    (:func:`judge_readings`); the other readings' labels are reported beside it.

    Attributes
    ----------
    name : str
        A few words naming the reading (``"existential"``, ``"own-dimension bandwidth"``).
    statement : str
        The reading in one sentence, as tested.
    cases : tuple of Case
        At least one.
    conditions : mapping of str to iterable of str, default {}
        The paper's conditions under this reading (see :func:`judge`).
    charitable : bool, default False
        Whether this is the charitable reading.
    testable : bool, default True
        False for a reading too vague to be checked, or an analogy: it is labelled "not testable
        as stated" whatever its cases (which may then be empty) say, and could not be labelled
        otherwise.
    """

    name: str
    statement: str
    cases: tuple[Case, ...]
    conditions: Mapping[str, Iterable[str]] = field(default_factory=dict)
    charitable: bool = False
    testable: bool = True

    def __post_init__(self) -> None:
        for attribute in ("name", "statement"):
            value = getattr(self, attribute)
            if not isinstance(value, str) or not value.strip():
                raise TypeError(f"{attribute} must be a non-empty string, got {value!r}")
        if not isinstance(self.testable, bool):
            raise TypeError(f"testable must be a bool, got {type(self.testable).__name__}")
        cases = tuple(self.cases)
        if (self.testable and not cases) or not all(isinstance(c, Case) for c in cases):
            raise TypeError("cases must be a sequence of Case, non-empty for a testable reading")
        object.__setattr__(self, "cases", cases)
        if not isinstance(self.conditions, Mapping):
            raise TypeError(f"conditions must be a mapping, got {type(self.conditions).__name__}")
        if not isinstance(self.charitable, bool):
            raise TypeError(f"charitable must be a bool, got {type(self.charitable).__name__}")


@dataclass(frozen=True)
class ReadingVerdict:
    """A reading's outcome: its label and the labels its cases could have produced.

    Attributes
    ----------
    name, statement : str
    charitable : bool
    label : str
        One of :data:`LABELS`, from :func:`judge` on the reading's cases and conditions.
    possible : tuple of str
    """

    name: str
    statement: str
    charitable: bool
    label: str
    possible: tuple[str, ...]

    @property
    def decisive(self) -> bool:
        """Whether this reading's cases could have produced another label."""
        return len(self.possible) > 1

    def text(self) -> str:
        """``name (charitable): label``, with a warning when the label could not have come out otherwise."""
        out = f"{self.name}{' (charitable)' if self.charitable else ''}: {self.label}"
        return out if self.decisive else out + " (could not have come out otherwise)"


def judge_readings(claim: str, readings: Iterable[Reading], *, reason: str) -> Verdict:
    """A claim's verdict from every reading tested: the charitable reading decides the label.

    Each reading is judged by :func:`judge` on its own cases and conditions. The claim takes
    the label of the reading marked charitable, and the labels it could have produced; every
    reading's outcome is kept in :attr:`Verdict.readings` for the ledger. Testing only a
    strict reading and calling the claim refuted is what this rule prevents: a claim is "not
    reproduced as stated" only when its most favourable reasonable reading fails.

    Parameters
    ----------
    claim : str
    readings : iterable of Reading
        At least one, with distinct names, exactly one of them charitable.
    reason : str
        The deciding evidence in one sentence.

    Returns
    -------
    Verdict

    Raises
    ------
    TypeError
        If ``readings`` holds something other than :class:`Reading`.
    ValueError
        If there is no reading, not exactly one charitable reading, or two readings share a name.

    Examples
    --------
    >>> strict = Reading("universal", "holds in every setting",
    ...                  (Case("a", False, {"heads": "heterogeneous"}),), {"heads": ["heterogeneous"]})
    >>> loose = Reading("existential", "holds in some setting", (Case("b", True),), charitable=True)
    >>> v = judge_readings("C11", [strict, loose], reason="...")
    >>> v.label, [r.label for r in v.readings]
    ('reproduced', ['not reproduced as stated', 'reproduced'])
    """
    readings = list(readings)
    if not readings:
        raise ValueError("readings must hold at least one Reading")
    if not all(isinstance(r, Reading) for r in readings):
        raise TypeError("readings must be Reading objects")
    names = [r.name for r in readings]
    if len(set(names)) != len(names):
        raise ValueError(f"readings must have distinct names, got {names}")
    charitable = [r for r in readings if r.charitable]
    if len(charitable) != 1:
        raise ValueError(f"exactly one reading must be charitable, got {len(charitable)}")
    outcomes = []
    for r in readings:
        if not r.testable:
            outcomes.append(ReadingVerdict(r.name, r.statement, r.charitable, NOT_TESTABLE, (NOT_TESTABLE,)))
            continue
        v = judge(claim, r.cases, conditions=r.conditions, reason=reason)
        outcomes.append(ReadingVerdict(r.name, r.statement, r.charitable, v.label, v.possible))
    chosen = next(o for o in outcomes if o.charitable)
    return Verdict(
        claim=claim, label=chosen.label, reason=reason.strip(), possible=chosen.possible, readings=tuple(outcomes)
    )
