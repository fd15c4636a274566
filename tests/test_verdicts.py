"""Tests of nwlib.verdicts: the decision table of the ledger's labels."""

from __future__ import annotations

import pytest

from nwlib.verdicts import LABELS, Verdict, decide

REPRODUCED, UNDER, NOT_REPRODUCED, NOT_TESTABLE = LABELS


@pytest.mark.parametrize(
    "as_stated, under, within, expected",
    [
        (True, None, None, REPRODUCED),
        (False, True, False, UNDER),  # the counterexample breaks a condition the paper states
        (False, True, True, NOT_REPRODUCED),  # a counterexample inside the paper's conditions
        (False, False, False, NOT_REPRODUCED),  # fails even under the paper's conditions
        (False, False, True, NOT_REPRODUCED),
        (None, None, None, NOT_TESTABLE),
    ],
)
def test_decision_table(as_stated, under, within, expected):
    v = decide("C0", holds_as_stated=as_stated, holds_under_paper_conditions=under,
               counterexample_within_paper_conditions=within, reason="evidence")
    assert isinstance(v, Verdict) and v.label == expected and v.claim == "C0"


def test_a_check_that_cannot_fail_is_flagged():
    v = decide("C3", holds_as_stated=True, reason="identity to rounding", possible=(REPRODUCED,))
    assert not v.decisive
    assert "could not have produced another label" in v.text()
    w = decide("C3", holds_as_stated=True, reason="paired test")
    assert w.decisive and "could not" not in w.text() and w.text().startswith(REPRODUCED)


def test_untestable_claims_default_to_one_possible_label():
    v = decide("C12", holds_as_stated=None, reason="an analogy")
    assert v.label == NOT_TESTABLE and v.possible == (NOT_TESTABLE,) and not v.decisive


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"claim": ""}, TypeError, "claim"),
        ({"reason": " "}, ValueError, "reason"),
        ({"reason": 3}, TypeError, "reason"),
        ({"holds_as_stated": "yes"}, TypeError, "holds_as_stated"),
        ({"holds_as_stated": False}, ValueError, "holds_under_paper_conditions"),
        ({"possible": ("holds",)}, ValueError, "possible"),
        ({"possible": (NOT_TESTABLE,)}, ValueError, "possible must contain the decided label"),
    ],
)
def test_bad_input(kwargs, exc, match):
    args = {"claim": "C1", "holds_as_stated": True, "reason": "r", **kwargs}
    with pytest.raises(exc, match=match):
        decide(args.pop("claim"), **args)
