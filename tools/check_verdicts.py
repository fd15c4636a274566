"""Check the verdict labels that executed notebooks glued against the book's committed ledger.

    python tools/check_verdicts.py _build/stage/notebooks          # after `make book` (standard)
    python tools/check_verdicts.py _build/test/stage/notebooks     # after the quick run of `make test`

Every chapter notebook glues ``verdict_<claim>_short`` (a label picked by
``nwlib.book.verdicts.decide``). ``book/verdicts.yaml`` records the label each claim
must get. Both ``make book`` (standard profile) and ``make test`` (quick profile)
run this check, so a label that differs between the profiles, or that a change
to the code moves, fails loudly until someone decides it and updates the file.
Prints one line per claim; exits 1 on any difference, a missing label, or a
label outside the ledger's vocabulary.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nwlib.book.verdicts import LABELS  # noqa: E402

LEDGER = ROOT / "book" / "verdicts.yaml"


def glued_labels(folder: Path) -> dict[str, tuple[str, str]]:
    """``{claim: (label, notebook)}`` from every ``verdict_<claim>_short`` glued in ``folder``."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(folder.glob("*.ipynb")):
        notebook = json.loads(path.read_text())
        for cell in notebook.get("cells", []):
            for output in cell.get("outputs", []):
                scrap = output.get("metadata", {}).get("scrapbook", {})
                name = scrap.get("name", "")
                if not (name.startswith("verdict_") and name.endswith("_short")):
                    continue
                text = output.get("data", {}).get(scrap.get("mime_prefix", "") + "text/plain")
                if text is None:
                    continue
                found[name[len("verdict_") : -len("_short")]] = (ast.literal_eval(text), path.name)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="folder of executed notebooks")
    parser.add_argument("--ledger", type=Path, default=LEDGER)
    args = parser.parse_args(argv)
    expected: dict[str, str] = yaml.safe_load(args.ledger.read_text())
    found = glued_labels(args.folder)
    failures = 0
    for claim in sorted(set(expected) | set(found), key=lambda c: (len(c), c)):
        want = expected.get(claim)
        got, notebook = found.get(claim, (None, "-"))
        if got is not None and got not in LABELS:
            status = f"FAIL: {got!r} is not a ledger label"
        elif want is None:
            status = "FAIL: not in book/verdicts.yaml"
        elif got is None:
            status = "FAIL: no notebook glued it"
        elif got != want:
            status = f"FAIL: expected {want!r}"
        else:
            status = "ok"
        failures += status != "ok"
        print(f"  {claim:>4}  {str(got):<42} {notebook:<40} {status}")
    if failures:
        print(
            f"{failures} verdict(s) differ from {args.ledger}: if the evidence changed on "
            "purpose, update that file in the same commit",
            file=sys.stderr,
        )
        return 1
    print(f"verdicts agree with {args.ledger}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
