"""tools/check_verdicts.py: glued labels against the committed ledger, on synthetic executed notebooks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "check_verdicts.py"


def _glue_output(name: str, value: str) -> dict:
    prefix = "application/papermill.record/"
    return {
        "output_type": "display_data",
        "data": {prefix + "text/plain": repr(value)},
        "metadata": {"scrapbook": {"name": name, "mime_prefix": prefix}},
    }


def _write(tmp: Path, labels: dict[str, str], ledger: dict[str, str]) -> tuple[Path, Path]:
    folder = tmp / "notebooks"
    folder.mkdir()
    cells = [
        {
            "cell_type": "code",
            "source": "",
            "metadata": {},
            "outputs": [_glue_output(f"verdict_{c}_short", v) for c, v in labels.items()],
        }
    ]
    (folder / "ch99.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    ledger_path = tmp / "verdicts.yaml"
    ledger_path.write_text("".join(f"{c}: {v}\n" for c, v in ledger.items()))
    return folder, ledger_path


def _run(folder: Path, ledger: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(folder), "--ledger", str(ledger)], capture_output=True, text=True, cwd=ROOT
    )


def test_agreeing_labels_pass(tmp_path):
    folder, ledger = _write(
        tmp_path,
        {"C1": "reproduced", "C6": "not reproduced as stated"},
        {"C1": "reproduced", "C6": "not reproduced as stated"},
    )
    proc = _run(folder, ledger)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_moved_label_fails_naming_the_claim(tmp_path):
    folder, ledger = _write(
        tmp_path, {"C1": "reproduced", "C6": "reproduced"}, {"C1": "reproduced", "C6": "not reproduced as stated"}
    )
    proc = _run(folder, ledger)
    assert proc.returncode == 1
    line = next(line for line in proc.stdout.splitlines() if line.split()[0] == "C6")
    assert "FAIL: expected 'not reproduced as stated'" in line


def test_missing_and_unknown_labels_fail(tmp_path):
    folder, ledger = _write(tmp_path, {"C1": "holds"}, {"C1": "reproduced", "C2": "reproduced"})
    proc = _run(folder, ledger)
    assert proc.returncode == 1
    assert "not a ledger label" in proc.stdout and "no notebook glued it" in proc.stdout
