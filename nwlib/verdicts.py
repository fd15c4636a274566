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
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LABELS", "Verdict", "decide"]

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
    """

    claim: str
    label: str
    reason: str
    possible: tuple[str, ...]

    @property
    def decisive(self) -> bool:
        """Whether the evidence could have produced another label (otherwise it is no evidence)."""
        return len(self.possible) > 1

    def text(self) -> str:
        """The label with its reason, and a warning when the label could not have come out otherwise."""
        out = f"{self.label} ({self.reason})"
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
