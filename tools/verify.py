"""Compare every recorded value of a run with the committed reference for its profile.

    python tools/verify.py _build/test/stage/notebooks                 # make verify (quick)
    python tools/verify.py _build/test/stage/notebooks --update        # make verify-update

Each executed notebook leaves a results manifest (``<notebook>.provenance.jsonl``,
written by ``nwlib.book.glue``). The reference, ``verify/<profile>.json``, holds
the value of every entry marked for verification. A value passes when

* strings, integers and booleans, and floats glued with ``exact=True``: it is equal;
* floats glued with a Monte Carlo standard error ``se``: it is within
  ``SE_MULTIPLE`` reference standard errors (a change of code that moves a Monte Carlo
  estimate by more than its noise fails);
* other floats (derived constants, rounding-level checks): ``|a - b| <= RTOL·max(|a|, |b|) + ATOL``.

A key in the reference that the run did not record, or a new key the reference does
not have, fails too. The table lists value, reference, tolerance and status for every
entry; the exit status is 1 on any failure. A deliberate change of results goes with
``--update`` in the same commit, so it is a decision, not an accident.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _load_provenance():
    """nwlib/_provenance.py by path: reading manifests needs neither nwlib's package nor torch."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_nwlib_provenance", ROOT / "nwlib" / "_provenance.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


read_manifests = _load_provenance().read_manifests

SE_MULTIPLE = 4.0
RTOL, ATOL = 1e-3, 1e-6


def compare(value: Any, ref: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``value`` agrees with its reference entry, and the tolerance applied (as text)."""
    if ref["exact"] or ref["kind"] != "float" or not isinstance(ref["value"], float):
        return value == ref["value"], "exact"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False, "-"
    if ref.get("se"):
        allowed = SE_MULTIPLE * float(ref["se"])
    else:
        allowed = RTOL * max(abs(float(value)), abs(ref["value"])) + ATOL
    diff = abs(float(value) - ref["value"])
    return math.isfinite(diff) and diff <= allowed, f"±{allowed:.3g}"


def _short(value: Any) -> str:
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 38 else text[:35] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="folder of executed notebooks and their manifests")
    parser.add_argument("--reference", type=Path, default=None, help="default: verify/<profile of the run>.json")
    parser.add_argument("--update", action="store_true", help="rewrite the reference from this run")
    parser.add_argument("--quiet", action="store_true", help="print failures only")
    args = parser.parse_args(argv)

    entries = {f"{nb}::{key}": e for (nb, key), e in read_manifests(args.folder).items() if e["verify"]}
    if not entries:
        print(f"no verifiable entries in manifests under {args.folder}", file=sys.stderr)
        return 1
    profiles = sorted({str(e["profile"]) for e in entries.values()})
    if len(profiles) != 1:
        print(f"the run mixes profiles {profiles}", file=sys.stderr)
        return 1
    reference_path = args.reference or ROOT / "verify" / f"{profiles[0]}.json"

    if args.update:
        keep = ("value", "kind", "se", "exact")
        reference = {k: {f: e[f] for f in keep} for k, e in sorted(entries.items())}
        reference_path.parent.mkdir(parents=True, exist_ok=True)
        reference_path.write_text(json.dumps({"profile": profiles[0], "entries": reference}, indent=1,
                                             ensure_ascii=False) + "\n")
        print(f"wrote {len(reference)} reference values to {reference_path}")
        return 0

    if not reference_path.is_file():
        print(f"no reference {reference_path}: run make verify-update and commit it", file=sys.stderr)
        return 1
    reference = json.loads(reference_path.read_text())["entries"]
    rows, failures = [], 0
    for key in sorted(set(reference) | set(entries)):
        ref, got = reference.get(key), entries.get(key)
        if ref is None:
            status, tol, ref_text = "FAIL: not in the reference", "-", "-"
        elif got is None:
            status, tol, ref_text = "FAIL: not recorded by this run", "-", _short(ref["value"])
        else:
            ok, tol = compare(got["value"], ref)
            status, ref_text = ("ok" if ok else "FAIL"), _short(ref["value"])
        failures += status != "ok"
        rows.append((key, _short(got["value"]) if got else "-", ref_text, tol, status))
    width = max(len(r[0]) for r in rows)
    print(f"{'value':<{width}}  {'this run':>38}  {'reference':>38}  {'tolerance':>10}  status")
    for key, got_text, ref_text, tol, status in rows:
        if not args.quiet or status != "ok":
            print(f"{key:<{width}}  {got_text:>38}  {ref_text:>38}  {tol:>10}  {status}")
    print(f"{len(rows) - failures} of {len(rows)} values agree with {reference_path.name}")
    if failures:
        print(f"{failures} value(s) differ: if the change is deliberate, run `make verify-update` and commit "
              f"{reference_path.relative_to(ROOT) if reference_path.is_relative_to(ROOT) else reference_path}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
