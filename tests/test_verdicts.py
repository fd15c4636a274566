"""Tests of nwlib.book.verdicts: the decision table of the ledger's labels."""

from __future__ import annotations

import pytest

from nwlib.book.verdicts import LABELS, Verdict, decide

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
    v = decide(
        "C0",
        holds_as_stated=as_stated,
        holds_under_paper_conditions=under,
        counterexample_within_paper_conditions=within,
        reason="evidence",
    )
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


# --- judge: the one rule for "within the paper's conditions" ---
from nwlib.book.verdicts import Case, judge, within_conditions  # noqa: E402

PAPER = {"heads": ["heterogeneous"]}


def _cases(inside: bool | None, outside: bool | None):
    cases = []
    if inside is not None:
        cases.append(Case("unequal quality", inside, {"heads": "heterogeneous", "kernel": "gaussian"}))
    if outside is not None:
        cases.append(Case("equal quality", outside, {"heads": "homogeneous", "kernel": "gaussian"}))
    return cases


@pytest.mark.parametrize(
    "inside, outside, label",
    [
        (True, True, "reproduced"),
        (True, False, "reproduced under the paper's conditions"),
        (False, True, "not reproduced as stated"),
        (False, False, "not reproduced as stated"),
        (None, False, "not reproduced as stated"),  # no case within the conditions: nothing rescues it
        (True, None, "reproduced"),
    ],
)
def test_judge_applies_the_one_rule(inside, outside, label):
    v = judge("C11", _cases(inside, outside), conditions=PAPER, reason="because")
    assert v.label == label
    assert v.label in v.possible


def test_judge_records_which_labels_could_have_come_out():
    both = judge("C11", _cases(True, True), conditions=PAPER, reason="r")
    assert (
        set(both.possible) == {"reproduced", "reproduced under the paper's conditions", "not reproduced as stated"}
        and both.decisive
    )
    only_inside = judge("C11", _cases(True, None), conditions=PAPER, reason="r")
    assert "reproduced under the paper's conditions" not in only_inside.possible
    identity = judge("C1", [Case("identity", True, {}, could_fail=False)], conditions={}, reason="r")
    assert identity.possible == ("reproduced",) and not identity.decisive
    assert "no evidence" in identity.text()


def test_unconditional_claims_have_every_case_inside():
    v = judge("C4", _cases(True, False), conditions={}, reason="r")
    assert v.label == "not reproduced as stated"


def test_a_case_must_state_the_attributes_the_conditions_name():
    with pytest.raises(ValueError, match="lacks the attribute"):
        within_conditions(Case("x", True, {"kernel": "gaussian"}), PAPER)
    with pytest.raises(TypeError, match="holds"):
        Case("x", 1, {})  # a literal number is not a finding's decision
    with pytest.raises(TypeError, match="attributes"):
        Case("x", True, {"heads": 2})
    with pytest.raises(TypeError, match="cases"):
        judge("C1", [], conditions={}, reason="r")


# --- readings: the charitable reading decides, every reading is reported --------------------
from nwlib.book.verdicts import Reading, judge_readings  # noqa: E402


def _reading(name, holds, *, charitable=False, inside=True):
    attrs = {"heads": "heterogeneous" if inside else "homogeneous"}
    return Reading(
        name, f"{name} statement", (Case(name, holds, attrs),), {"heads": ["heterogeneous"]}, charitable=charitable
    )


@pytest.mark.parametrize(
    "charitable_holds, strict_holds, expected",
    [(True, False, "reproduced"), (False, True, "not reproduced as stated"), (True, True, "reproduced")],
)
def test_charitable_reading_decides_label(charitable_holds, strict_holds, expected):
    v = judge_readings(
        "C0", [_reading("strict", strict_holds), _reading("loose", charitable_holds, charitable=True)], reason="r"
    )
    assert v.label == expected
    assert [r.name for r in v.readings] == ["strict", "loose"]
    assert v.charitable.name == "loose"
    # the strict reading keeps its own label, computed by judge on its own cases
    assert v.readings[0].label == ("reproduced" if strict_holds else "not reproduced as stated")
    assert "on the charitable reading, loose" in v.text()


def test_reading_possible_labels_follow_charitable_reading():
    sure = Reading("identity", "s", (Case("algebra", True, could_fail=False),), charitable=True)
    v = judge_readings("C0", [sure, _reading("empirical", False)], reason="r")
    assert v.possible == ("reproduced",) and not v.decisive
    assert v.readings[1].decisive
    assert "could not have come out otherwise" in v.readings[0].text()


def test_readings_rejects_bad_input():
    good = _reading("a", True, charitable=True)
    with pytest.raises(ValueError, match="charitable"):
        judge_readings("C0", [_reading("a", True)], reason="r")
    with pytest.raises(ValueError, match="charitable"):
        judge_readings("C0", [good, _reading("b", True, charitable=True)], reason="r")
    with pytest.raises(ValueError, match="distinct"):
        judge_readings("C0", [good, _reading("a", True)], reason="r")
    with pytest.raises(ValueError, match="at least one"):
        judge_readings("C0", [], reason="r")
    with pytest.raises(TypeError, match="Reading"):
        judge_readings("C0", [good, "b"], reason="r")
    with pytest.raises(TypeError, match="cases"):
        Reading("a", "s", ())
    with pytest.raises(TypeError, match="statement"):
        Reading("a", " ", (Case("x", True),))


def test_untestable_reading_is_not_testable_whatever_its_cases():
    analogy = Reading(
        "analogy",
        "three systems share one principle",
        (Case("identity", True, could_fail=False),),
        charitable=True,
        testable=False,
    )
    bare = Reading("analogy, no case", "as summarised", (), testable=False)
    v = judge_readings("C12", [analogy, bare, _reading("law", False)], reason="r")
    assert v.label == "not testable as stated" and v.possible == ("not testable as stated",) and not v.decisive
    assert [r.label for r in v.readings] == ["not testable as stated"] * 2 + ["not reproduced as stated"]
    with pytest.raises(TypeError, match="non-empty for a testable"):
        Reading("empty", "s", ())
    with pytest.raises(TypeError, match="testable"):
        Reading("x", "s", (), testable="no")


def test_finding_with_no_profile_is_reported_everywhere_asserted_nowhere():
    from nwlib.evidence import Findings, estimate

    for profile in ("quick", "standard", "full"):
        f = Findings("ch99", profile=profile)
        f.greater("expected_to_fail", "a gain the data may contradict", estimate(-1.0, 0.1), profiles=())
        f.decide()
        assert not f["expected_to_fail"].asserted and not f.holds("expected_to_fail")
        f.check()  # a failing finding that no profile asserts does not stop the notebook
