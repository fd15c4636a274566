"""nwlib.book.build_record: the build's record read from hand-made files with known answers.

The environment notebook reads what the build left behind (timings, rerun results, manifests,
the staged configuration) and asks git and the machine. Each reader is checked here against
files written by the test, a git repository made by the test, and the values torch, numpy and
platform report themselves.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from nwlib.book import build_record as record

HAS_GIT = shutil.which("git") is not None


def rerun(seed, variant="native", *, failed=(), ok=True, z=3.8, compared=10, values_failed=()):
    return {"seed": seed, "variant": variant, "notebooks_failed": list(failed), "labels_agree": ok,
            "findings": {"asserted": 4, "asserted_held": 4 if ok else 3, "reported": 2, "reported_held": 1},
            "values_compared": compared, "values_failed": list(values_failed), "z_star": z, "ok": ok}  # fmt: skip


def write_reruns(path, seeds, date="2026-12-01", commit="abc1234"):
    machine = {"cpus": 2, "cpu_capability": "AVX2", "torch": "2.13.0"}
    path.write_text(
        json.dumps({"profile": "quick", "date": date, "commit": commit, "machine": machine, "seeds": seeds})
    )
    return path


def test_import_needs_no_torch():
    code = "import sys, nwlib.book.build_record; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_git_and_the_environment_of_a_checkout(tmp_path):
    def sh(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    sh("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    sh("add", "a.txt")
    sh("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert record.git(tmp_path, "rev-parse", "HEAD") == head and len(head) == 40
    now = dt.datetime(2026, 12, 1, 6, 5, tzinfo=dt.UTC)
    env = record.environment("quick", "cpu", tmp_path, now=now)
    assert env["git commit"] == head[:12]
    (tmp_path / "untracked.txt").write_text("new\n")  # untracked files do not count
    assert record.environment("quick", "cpu", tmp_path, now=now)["git commit"] == head[:12]
    (tmp_path / "a.txt").write_text("two\n")
    assert (
        record.environment("quick", "cpu", tmp_path, now=now)["git commit"] == head[:12] + " (with uncommitted changes)"
    )


def test_git_outside_a_checkout(tmp_path):
    assert record.git(tmp_path, "rev-parse", "HEAD") == "unknown"
    assert record.git(tmp_path / "absent", "status") == "unknown"
    with pytest.raises(TypeError, match="repo"):
        record.git(3, "status")


def test_environment_reports_the_running_software(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: Test\nmodel name\t: Test CPU 9000 @ 3.0GHz\nflags\t: fpu\n")
    now = dt.datetime(2026, 12, 1, 6, 5, tzinfo=dt.UTC)
    env = record.environment("standard", torch.device("cpu"), tmp_path, now=now, cpuinfo=cpuinfo)
    assert list(env) == ["profile", "built (UTC)", "git commit", "nwlib", "Python", "torch", "numpy", "platform", "CPU",
                         "device"]  # fmt: skip
    assert env["profile"] == "standard" and env["built (UTC)"] == "2026-12-01 06:05"
    assert env["git commit"] == "unknown"[:12]  # no checkout there
    assert env["torch"] == torch.__version__ and env["numpy"] == np.__version__
    assert env["Python"] == ".".join(map(str, sys.version_info[:3]))
    capability = torch.backends.cpu.get_cpu_capability()
    assert env["CPU"] == f"Test CPU 9000 @ 3.0GHz ({capability}, {torch.get_num_threads()} threads)"
    assert env["device"] == "cpu"
    table = record.environment_table(env)
    assert table.loc["torch", "value"] == torch.__version__ and table.shape == (10, 1)
    with pytest.raises(TypeError, match="profile"):
        record.environment(None, "cpu", tmp_path)


def test_cpu_model_falls_back_to_platform(tmp_path):
    import platform

    assert record.cpu_model(tmp_path / "absent") == (platform.processor() or platform.machine())
    no_name = tmp_path / "cpuinfo"
    no_name.write_text("processor\t: 0\n")
    assert record.cpu_model(no_name) == (platform.processor() or platform.machine())


def test_timings(tmp_path):
    runs = [
        {"notebook": "ch01", "profile": "quick", "seconds": 12.25, "status": "ok"},
        {"notebook": "ch02", "profile": "quick", "seconds": 30.5, "status": "FAILED"},
    ]
    path = tmp_path / "_timings.json"
    path.write_text(json.dumps(runs))
    table = record.timings(path)
    assert table.to_dict("records") == runs
    assert record.timings_values(table) == {"timings_total_s": 42.75, "timings_count": 2}
    empty = record.timings(tmp_path / "absent.json")
    assert list(empty.columns) == list(record.TIMINGS_COLUMNS) and empty.empty
    values = record.timings_values(empty)
    assert math.isnan(values["timings_total_s"]) and values["timings_count"] == 0
    with pytest.raises(TypeError, match="path"):
        record.timings(None)


def test_robustness_rows_and_values(tmp_path):
    native = write_reruns(tmp_path / "robustness.json", [rerun(1), rerun(2, ok=False, z=4.5, values_failed=["k"])])
    portable = write_reruns(tmp_path / "portable.json", [rerun(0, "portable", z=None, compared=None)], date="later")
    rows = record.robustness_rows(native)
    assert [r["seed"] for r in rows] == [1, 2] and rows[0]["meta"]["commit"] == "abc1234"
    assert {k: rows[1][k] for k in rows[1] if k != "meta"} == {
        "run": "native", "seed": 2, "notebooks failed": 0, "asserted held": "3/4", "reported held": "1/2",
        "labels": "differ", "values agree": "9/10", "z*": 4.5, "result": "FAILED",
    }  # fmt: skip
    both = record.robustness([native, portable, tmp_path / "absent.json"])
    assert list(both.table["run"]) == ["native", "native", "portable"] and "meta" not in both.table.columns
    assert both.table["values agree"].iloc[2] == "0/None"  # a rerun that compared nothing says so
    assert both.values == {
        "robustness_seeds": "1, 2",
        "robustness_z": 4.5,
        "robustness_date": "2026-12-01",  # the first file's
        "robustness_commit": "abc1234",
        "robustness_machine": "2 CPUs (AVX2), torch 2.13.0",
    }


def test_robustness_without_files(tmp_path):
    none = record.robustness([tmp_path / "a.json"])
    assert none.table.empty
    assert none.values == {"robustness_seeds": "none", "robustness_z": 0.0, "robustness_date": "never",
                           "robustness_commit": "none", "robustness_machine": "? CPUs (?), torch ?"}  # fmt: skip
    with pytest.raises(TypeError, match="paths"):
        record.robustness(tmp_path / "a.json")


def test_book_urls(tmp_path):
    config = tmp_path / "_config.yml"
    config.write_text("parse:\n  myst_substitutions:\n    repo_url: https://example.org/r\n    site_url: https://s\n")
    assert record.book_urls(config) == ("https://example.org/r", "https://s")
    config.write_text("title: x\n")
    assert record.book_urls(config) == ("unknown", "unknown")
    assert record.book_urls(tmp_path / "absent.yml") == ("unknown", "unknown")


def test_software_entry_and_citations(tmp_path):
    entry = record.software_entry("k", "T", "https://x", year="2026", version="1.0", chapter="ch01_a")
    assert entry.splitlines() == [
        "@software{k,",
        "  title   = {T},",
        "  author  = {{The nwlib companion contributors}},",
        "  year    = {2026},",
        "  version = {1.0},",
        "  url     = {https://x},",
        f"  note    = {{Chapter of: {record.COMPANION}}},",
        "  license = {MIT}",
        "}",
    ]
    with pytest.raises(ValueError, match="key"):
        record.software_entry("", "T", "u", year="2026", version="1")
    (tmp_path / "ch02_second.md").write_text("# Two: the second\n\ntext\n")
    (tmp_path / "ch01_first.md").write_text("# One\n")
    (tmp_path / "intro.md").write_text("# Not a chapter\n")
    entries = record.citations(tmp_path, site="https://s", repo_url="https://r", year="2026", version="1.0")
    assert list(entries) == ["cite_ch01_first", "cite_ch02_second", "cite_companion"]
    assert "  title   = {Two: the second}," in entries["cite_ch02_second"]
    assert "  url     = {https://s/book/ch02_second.html}," in entries["cite_ch02_second"]
    assert entries["cite_companion"].startswith("@software{nwlib_companion,")
    assert "  url     = {https://r}," in entries["cite_companion"] and "note" not in entries["cite_companion"]


def test_provenance(tmp_path):
    def entry(nb, key, value, verify, cell=3):
        return {"notebook": nb, "key": key, "value": value, "execution_count": cell, "profile": "quick", "seed": 0,
                "device": "cpu", "dtype": None, "cls": "exact" if verify else "info", "se": None, "tol": None,
                "verify": verify}  # fmt: skip

    first = [entry("a", "x", 1 / 3, True), entry("a", "s", "y" * 80, False), entry("a", "x", 2.0, True, cell=4)]
    (tmp_path / "a.provenance.jsonl").write_text("\n".join(json.dumps(e) for e in first) + "\n")
    (tmp_path / "b.provenance.jsonl").write_text(json.dumps(entry("b", "n", 7, True)) + "\n")
    manifest, summary = record.provenance(tmp_path)
    assert len(manifest) == 3  # a key glued twice keeps its last value
    assert list(manifest.columns) == ["cell" if c == "execution_count" else c for c in record.MANIFEST_COLUMNS]
    rows = {(r["notebook"], r["key"]): r for r in manifest.to_dict("records")}
    assert rows[("a", "x")]["value"] == "2" and rows[("a", "x")]["cell"] == 4
    assert rows[("a", "s")]["value"] == "y" * 60 and rows[("b", "n")]["value"] == "7"
    assert summary.to_dict("index") == {"a": {"values": 2, "compared": 1}, "b": {"values": 1, "compared": 1}}
    (tmp_path / "c.provenance.jsonl").write_text(json.dumps(entry("c", "f", 0.1234567891, True)) + "\n")
    assert record.provenance(tmp_path)[0].set_index("key").loc["f", "value"] == "0.123457"
    raw = record.provenance(tmp_path, formatted=False)[0].set_index("key")
    assert raw.loc["f", "value"] == 0.1234567891 and raw.loc["s", "value"] == "y" * 80  # the download keeps all
    empty_manifest, empty_summary = record.provenance(tmp_path / "none")
    assert empty_manifest.empty and list(empty_manifest.columns) == list(record.MANIFEST_COLUMNS)
    assert empty_summary.empty
