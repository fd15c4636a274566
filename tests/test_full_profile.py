"""tools/full_profile.py and the full-profile table: the reduced profiles, the extrapolation, the record.

The reduced parameters and the fitted line are checked against values written out by hand; the
specification against the profiles it scales; the README against the committed record.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))  # the benchmarks package

import full_profile as fp  # noqa: E402
import run_notebooks  # noqa: E402

from benchmarks import report  # noqa: E402


def test_reduced_parameters_scale_only_the_listed_counts():
    full = {"replicates": 4000, "floor": 1000, "n": 2048, "sizes": [1, 2, 5, 10, 50, 200, 1000], "tau": 0.3}
    out = fp.reduced_parameters(full, {"replicates": 40, "floor": 20, "sizes": 1}, 0.05)
    # 0.05 * 4000 = 200 (a multiple of 40); 0.05 * 1000 = 50 -> 40 (2.5 multiples of 20 round to 2); sizes 2.5 -> 2
    assert out == {"replicates": 200, "floor": 40, "n": 2048, "sizes": [1, 2, 10, 50], "tau": 0.3}
    assert full["replicates"] == 4000  # not modified


def test_reduced_parameters_keep_a_multiple_and_never_exceed_the_full_value():
    assert fp.reduced_parameters({"r": 100}, {"r": 40}, 0.01) == {"r": 40}  # at least the multiple
    assert fp.reduced_parameters({"r": 30}, {"r": 40}, 0.9) == {"r": 30}  # at most the full value
    assert fp.reduced_parameters({"r": 7}, {"r": 1}, 1.0) == {"r": 7}


@pytest.mark.parametrize(
    ("full", "scale", "fraction", "match"),
    [
        ({"r": 10}, {"x": 1}, 0.5, "'x' is not in the full profile"),
        ({"r": 10}, {"r": 1}, 0.0, "fraction must be in"),
        ({"r": 10}, {"r": 1}, 1.5, "fraction must be in"),
        ({"r": 0.5}, {"r": 1}, 0.5, "positive integer"),
        ({"r": True}, {"r": 1}, 0.5, "positive integer"),
    ],
)
def test_reduced_parameters_refuse_bad_input(full, scale, fraction, match):
    with pytest.raises(ValueError, match=match):
        fp.reduced_parameters(full, scale, fraction)


def test_extrapolate_recovers_a_line():
    # t(f) = 12 + 340 f, measured at f = 0.05 and 0.15: 29 and 63 s
    line = fp.extrapolate((0.05, 0.15), (29.0, 63.0))
    assert line == {"intercept_s": pytest.approx(12.0), "slope_s": pytest.approx(340.0), "full_s": pytest.approx(352.0)}


def test_extrapolate_is_flat_through_the_longer_time_when_the_larger_run_was_faster():
    assert fp.extrapolate((0.1, 0.2), (31.0, 30.0)) == {"intercept_s": 31.0, "slope_s": 0.0, "full_s": 31.0}
    with pytest.raises(ValueError, match="fractions"):
        fp.extrapolate((0.2, 0.1), (1.0, 2.0))
    with pytest.raises(ValueError, match="seconds"):
        fp.extrapolate((0.1, 0.2), (float("nan"), 2.0))


def test_the_specification_scales_counts_of_the_full_profiles():
    spec = fp.load_spec()
    notebooks = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert set(spec) <= notebooks
    for name, entry in spec.items():
        full = run_notebooks.load_parameters("full", ROOT / "notebooks" / f"{name}.ipynb")
        quick = run_notebooks.load_parameters("quick", ROOT / "notebooks" / f"{name}.ipynb")
        for param, multiple in entry["scale"].items():
            value = full[param]
            values = value if isinstance(value, list) else [value]
            assert all(isinstance(v, int) and v >= 1 for v in values), (name, param)
            assert param not in quick or isinstance(quick[param], type(value)), (name, param)  # same kind under quick
            for f in entry["fractions"]:
                scaled = fp.reduced_parameters(full, entry["scale"], f)[param]
                if not isinstance(scaled, list):
                    assert scaled % multiple == 0, (name, param, f)
    # a notebook the specification leaves out must have nothing to scale: its full profile is its standard one
    for name in notebooks - set(spec):
        full = run_notebooks.load_parameters("full", ROOT / "notebooks" / f"{name}.ipynb")
        standard = run_notebooks.load_parameters("standard", ROOT / "notebooks" / f"{name}.ipynb")
        assert {k: v for k, v in full.items() if k != "profile"} == {
            k: v for k, v in standard.items() if k != "profile"
        }, name


def test_a_fraction_needs_the_full_profile():
    with pytest.raises(SystemExit):
        run_notebooks.main(["--profile", "quick", "--fraction", "0.1", "--sources-only"])
    with pytest.raises(SystemExit):
        run_notebooks.main(["--profile", "full", "--fraction", "2", "--sources-only"])


def _record(tmp_path: Path, rows: list[dict]) -> Path:
    (tmp_path / report.FULL_PROFILE_FILE).write_text(json.dumps({"machine": "m", "notebooks": rows}))
    return tmp_path


def _two_rows() -> list[dict]:
    """A measured appendix and chapter 6 extrapolated from f = 0.04 and 0.08 (t = 60 + 6000 f s), on one core."""
    ch06 = {"notebook": "ch06_head_count", "how": "extrapolated", "status": "ok", "sweep": True}
    ch06["runs"] = [{"fraction": 0.04, "seconds": 300.0}, {"fraction": 0.08, "seconds": 540.0}]
    ch06 |= {"intercept_s": 60.0, "slope_s": 6000.0, "full_s": 6060.0, "cores": 1, "load": 2.34}
    return [{"notebook": "appendix_environment", "how": "measured", "status": "ok", "full_s": 9.0}, ch06]


def test_full_profile_table_rows_and_total(tmp_path):
    rows = [
        *_two_rows(),
        {
            "notebook": "ch07_one_principle",
            "how": "extrapolated",
            "status": "ok",
            "runs": [{"fraction": 0.1, "seconds": 200.0}, {"fraction": 0.2, "seconds": 380.0}],
            "intercept_s": 20.0,
            "slope_s": 1800.0,
            "full_s": 1820.0,
        },
    ]
    table = report.full_profile_table(report.full_profile(results=_record(tmp_path, rows)))
    assert list(table["notebook"]) == ["environment", "ch06", "ch07", "all"]
    assert list(table["full profile"]) == ["9 s", "101 min", "30 min", "2.2 h"]
    assert list(table["grid"]) == ["–", "run_sweep", "serial only", "–"]
    assert table.loc[1, "reduced runs"] == "f = 0.04: 5 min; f = 0.08: 9 min"
    # where the record has the conditions; one machine in the record ("m"), so a row without its own takes it
    assert list(table["ran on"]) == ["–", "m, 1 core, load 2.3", "–", "–"]
    assert table.loc[3, "seconds"] == pytest.approx(9 + 6060 + 1820)


def test_full_profile_table_refuses_a_record_that_contradicts_itself(tmp_path):
    row = {"notebook": "ch01", "how": "extrapolated", "status": "ok", "runs": [], "intercept_s": 1.0, "slope_s": 2.0}
    with pytest.raises(report.ResultFileError, match="not intercept"):
        report.full_profile_table({"notebooks": [{**row, "full_s": 5.0}]})
    with pytest.raises(report.ResultFileError, match="did not finish"):
        report.full_profile_table({"notebooks": [{**row, "status": "FAILED", "full_s": 3.0}]})
    assert report.full_profile(results=tmp_path) is None


def test_the_readme_quotes_the_committed_record():
    record = report.full_profile()
    if record is None:
        pytest.skip("no benchmarks/results/full-profile.json yet")
    table = report.full_profile_table(record)
    readme = (ROOT / "README.md").read_text()
    section = readme.split("<!-- full-profile-table -->")[1]
    for _, row in table.iterrows():
        cells = re.search(rf"^\| {re.escape(row['notebook'])} \| ([^|]+) \| ([^|]+) \|", section, re.M)
        assert cells is not None, f"README's full-profile table has no row {row['notebook']}"
        assert cells.group(1).strip() == row["full profile"], row["notebook"]
        assert cells.group(2).strip() == row["how"], row["notebook"]
    assert yaml.safe_load((ROOT / "profiles" / "full-reduced.yaml").read_text())


def _manifest(folder: Path, values: dict[str, tuple]) -> Path:
    folder.mkdir(parents=True)
    lines = []
    for key, (value, cls, se, tol) in values.items():
        kind = "float" if isinstance(value, float) else "int"
        entry = {"key": key, "value": value, "kind": kind, "cls": cls, "se": se, "df": None, "tol": tol}
        lines.append(json.dumps(entry | {"verify": True, "notebook": "ch06_head_count", "profile": "full"}))
    (folder / "ch06_head_count.provenance.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_agreement_counts_identical_and_tolerated_values(tmp_path):
    serial = _manifest(
        tmp_path / "a",
        {"n": (12, "exact", None, None), "x": (1.0, "fp", None, 1e-9), "mse": (0.50, "mc", 0.01, None)},
    )
    same = _manifest(
        tmp_path / "b",
        {"n": (12, "exact", None, None), "x": (1.0 + 1e-12, "fp", None, 1e-9), "mse": (0.51, "mc", 0.01, None)},
    )
    assert fp.agreement(serial, same) == {"values": 3, "identical": 1, "agree": 3, "missing": 0}
    other = _manifest(tmp_path / "c", {"n": (13, "exact", None, None), "mse": (0.70, "mc", 0.01, None)})
    assert fp.agreement(serial, other) == {"values": 2, "identical": 0, "agree": 0, "missing": 1}


def test_full_profile_values_quote_the_record():
    record = {
        "machine": "AMD EPYC",
        "cpus": 2,
        "date": "2026-12-02",
        "commit": "abc1234",
        "notebooks": _two_rows(),
        "checks": [
            {"notebook": "ch06_head_count", "fraction": 0.2, "seconds": 1320.0, "predicted_s": 1260.0, "status": "ok"}
        ],
        "distributed": {
            "notebook": "ch06_head_count",
            "fraction": 0.04,
            "executor": "dask:local:2",
            "values": 40,
            "identical": 40,
            "agree": 40,
            "missing": 0,
            "seconds": 100.0,
            "serial_seconds": 300.0,
        },
    }
    values = report.full_profile_values(record)
    assert set(values) == {"full_profile_total_h", *report.FULL_PROFILE_TEXT_KEYS}  # what the appendix glues
    assert values["full_profile_total_h"] == pytest.approx(6069 / 3600)
    assert values["full_profile_longest"] == "ch06 (101 min)"
    assert values["full_profile_over"] == "ch06 (101 min)"
    assert values["full_profile_check"] == "ch06 at f = 0.2 took 22 min against 21 min predicted by the line (+5%)"
    assert values["full_profile_distributed"] == (
        "ch06 at f = 0.04 on dask:local:2: 40 of 40 verified values agree with the serial run, 40 of them bit for bit"
        " (100 s against 5 min serially)"
    )
    assert values["full_profile_machine"] == "AMD EPYC, 2 CPU cores, 2026-12-02, commit abc1234"


def test_a_run_that_fails_only_its_findings_check_is_complete_for_timing(tmp_path):
    stage = tmp_path / "ch03-f0.04"
    (stage / "notebooks").mkdir(parents=True)
    (stage.with_name("ch03-f0.04-logs")).mkdir()
    timings = [{"notebook": "ch03", "profile": "full", "seconds": 194.2, "status": "FAILED", "cached": False}]
    (stage / "notebooks" / "_timings.json").write_text(json.dumps(timings))
    log = stage.with_name("ch03-f0.04-logs") / "ch03.log"
    log.write_text("AssertionError: 1 finding(s) of ch03 do not hold under profile 'full':\n  x: ...\n")
    assert fp.stage_result("ch03", stage) == (194.2, "ok, findings not established")
    log.write_text("NameError: name 'x' is not defined\n")
    assert fp.stage_result("ch03", stage) == (194.2, "FAILED")


def test_a_record_from_two_machines_says_which_row_ran_where(tmp_path):
    rows = _two_rows()
    rows[1] |= {"machine": "Intel(R) Xeon(R) Processor", "cores": 2, "load": 1.04, "commit": "8c4aa38"}
    rows.append(
        {"notebook": "ch01_attention_is_nw", "how": "measured", "status": "ok", "full_s": 60.0, "cores": 1, "load": 0.5}
    )
    record = {"machine": "AMD EPYC", "cpus": 2, "date": "d1, d2", "commit": "c1, c2", "notebooks": rows}
    record = fp.summarise(record)  # the tool's header: every machine of the rows, the old rows keep theirs
    assert record["machine"] == "AMD EPYC and Intel(R) Xeon(R) Processor"
    assert rows[2]["machine"] == "AMD EPYC"
    table = report.full_profile_table(record)
    assert table.loc[1, "ran on"] == "Intel Xeon, 2 cores, load 1.0, at 8c4aa38"  # the commit it ran at
    assert table.loc[2, "ran on"] == "AMD EPYC, 1 core, load 0.5"
    assert table.loc[0, "ran on"] == "–"  # no conditions recorded: no machine claimed either
    where = report.full_profile_values(record)["full_profile_machine"]
    assert where.startswith("AMD EPYC and Intel Xeon (2 CPU cores each;") and "which notebook ran where" in where


@pytest.mark.parametrize(
    "model, short",
    [
        ("Intel(R) Xeon(R) Processor", "Intel Xeon"),
        ("AMD EPYC 7B13 64-Core Processor", "AMD EPYC 7B13 64-Core"),
        ("Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz", "Intel Core i7-8650U"),
        ("Apple M2", "Apple M2"),
    ],
)
def test_short_machine_drops_marks_and_clock(model, short):
    assert report.short_machine(model) == short
