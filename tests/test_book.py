"""nwlib.book's prologue, epilogue and glue helpers, read back from the manifest they write."""

from __future__ import annotations

import pytest
import torch

from nwlib.book import _provenance, glue, glue_values, glue_verdict, start
from nwlib.book.verdicts import Case, judge
from nwlib.evidence import estimate


@pytest.fixture
def notebook(tmp_path, monkeypatch):
    """A notebook under the runner: NWLIB_NOTEBOOK set, its folder the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(_provenance.ENV_NOTEBOOK, "ch98_book")
    _provenance._started.discard("ch98_book")
    threads = torch.get_num_threads()
    yield tmp_path
    torch.set_num_threads(threads)


def _entries(folder):
    return {key: e for (_, key), e in _provenance.read_manifests(folder).items()}


def test_start_resolves_the_run_and_glues_its_sizes_exact(notebook):
    run = start("ch98_book", profile="quick", seed=3, device="cpu", dtype="float64", threads=1, sizes={"n": 64})
    assert run.device == torch.device("cpu") and run.dtype == torch.float64 and torch.get_num_threads() == 1
    assert run.findings.family == "ch98_book" and run.seed == 3
    got = _entries(notebook)
    assert got["n"]["cls"] == "exact" and got["n"]["value"] == 64 and got["profile"]["value"] == "quick"
    assert got["n"]["seed"] == 3 and got["n"]["dtype"] == "float64"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(seed=-1), ValueError, "seed"),
        (dict(seed=1.5), TypeError, "seed"),
        (dict(dtype="float65"), ValueError, "dtype"),
        (dict(threads=0), ValueError, "threads"),
    ],
)
def test_start_names_a_bad_argument(notebook, kwargs, error, match):
    with pytest.raises(error, match=match):
        start("ch98_book", profile="quick", **{"seed": 0, "device": "cpu", **kwargs})


def test_glue_values_keeps_each_class_and_a_comparison_its_se(notebook):
    start("ch98_book", profile="quick", seed=0, device="cpu")
    glue_values({"a": estimate(0.5, 0.1), "b": 3, "c": "text"})
    glue_values({"d": 0.25}, tol=1e-12, dtype="float32")
    got = _entries(notebook)
    assert (got["a"]["cls"], got["a"]["value"], got["a"]["se"], got["a"]["df"]) == ("mc", 0.5, 0.1, None)
    assert got["b"]["cls"] == "exact" and got["c"]["cls"] == "exact"
    assert (got["d"]["cls"], got["d"]["tol"], got["d"]["dtype"]) == ("fp", 1e-12, "float32")
    with pytest.raises(TypeError, match="class"):
        glue_values({"e": 0.5})
    glue("h", estimate(0.5, 0.1, df=2))
    assert _entries(notebook)["h"]["df"] == 2.0
    with pytest.raises(TypeError, match="carries its se"):
        glue("f", estimate(0.5, 0.1), se=0.2)
    with pytest.raises(TypeError, match="df= qualifies"):
        glue("i", 0.5, df=3)
    with pytest.raises(TypeError, match="mapping"):
        glue_values([("g", 1)])


def test_glue_verdict_glues_the_ledgers_four_keys(notebook):
    start("ch98_book", profile="quick", seed=0, device=None, dtype=None)
    cases = [Case("a", holds=True, attributes={"kernel": "exp"}), Case("b", holds=False, attributes={"kernel": "x"})]
    verdict = judge("C99", cases, conditions={"kernel": ["exp"]}, reason="only the paper's kernel was asked for")
    glue_verdict(verdict)
    got = _entries(notebook)
    assert got["verdict_C99_short"]["value"] == verdict.label and got["verdict_C99_short"]["cls"] == "exact"
    assert got["verdict_C99"]["verify"] is False
    assert got["verdict_C99_decisive"]["value"] == ("yes" if verdict.decisive else "no")
    possible = got["verdict_C99_possible"]["value"]
    assert all(f"“{label}”" in possible for label in verdict.possible)


def test_finish_checks_the_findings_and_glues_the_time(notebook):
    run = start("ch98_book", profile="quick", seed=0, device="cpu")
    run.findings.greater("positive", "the estimate is positive", estimate(-1.0, 0.1))
    with pytest.raises(AssertionError, match="positive"):
        run.finish()
    got = _entries(notebook)
    assert got["elapsed_s"]["verify"] is False and got["finding_positive"]["value"] is False


def test_start_applies_the_book_figure_style():
    """Every notebook's figures share one style: legible fonts, the colour-blind-safe cycle, opaque PNGs."""
    import matplotlib as mpl

    from nwlib.book import FIGURE_COLOURS, FIGURE_STYLE, _apply_figure_style

    with mpl.rc_context():
        mpl.rcParams["font.size"] = 6.0
        _apply_figure_style()
        assert mpl.rcParams["font.size"] == FIGURE_STYLE["font.size"] >= 10
        assert min(mpl.rcParams[k] for k in ("xtick.labelsize", "ytick.labelsize", "legend.fontsize")) >= 10
        assert mpl.rcParams["axes.prop_cycle"].by_key()["color"] == list(FIGURE_COLOURS)
        assert mpl.rcParams["savefig.facecolor"] == "white" and not mpl.rcParams["savefig.transparent"]


@pytest.mark.parametrize(
    "value, se, expected",
    [
        (0.1012313, 0.0031, "0.1012 ± 0.0031"),
        (0.5, 0.25, "0.50 ± 0.25"),
        (-1e-9, 1e-3, "0.0000 ± 0.0010"),
        (2.0, 0.0, "2"),
        (3.14159, float("nan"), "3.142"),
        (-0.123456, 0.0099, "-0.1235 ± 0.0099"),
    ],
)
def test_with_se_rounds_to_the_standard_error(value, se, expected):
    from nwlib.book import with_se

    assert with_se(value, se) == expected
    with pytest.raises(ValueError, match="digits"):
        with_se(value, se, digits=0)
