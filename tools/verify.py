"""Compare every recorded value of a run with the committed reference for its profile.

    python tools/verify.py _build/test/stage/notebooks                 # make verify (quick)
    python tools/verify.py _build/test/stage/notebooks --update        # make verify-update
    python tools/verify.py _build/robustness/seed-1 --other-seed       # a rerun with another seed

Each executed notebook leaves a results manifest (``<notebook>.provenance.jsonl``,
written by ``nwlib.book.glue``). The reference, ``verify/<profile>.json``, holds
every entry marked for verification with its class (see ``nwlib.book.glue``). A value passes when

* class ``exact`` (strings, integers, booleans, exact floats): it is equal;
* class ``fp`` (deterministic up to rounding): it is within the larger of the two recorded
  floating-point tolerances;
* class ``mc`` (a Monte Carlo estimate with its standard error): it is within ``z*`` combined
  standard errors ``sqrt(se_ref² + se_run²)``, where ``z*`` is the family-wise threshold for the
  number of Monte Carlo values compared (``nwlib.evidence.family_threshold``: Bonferroni at
  ``ALPHA``), so that a thousand comparisons raise a false alarm with probability at most ``ALPHA``.

With ``--other-seed`` the run used another seed than the reference: only what must not depend on
the seed is compared, namely the Monte Carlo values (as above), the asserted findings
(``finding_*``) and the verdict labels (``verdict_*_short``); the other exact and ``fp`` values
are counted, not compared.

A key in the reference that the run did not record, or a new key the reference does
not have, fails too (not with ``--other-seed``, where a finding asserted under one seed is
always asserted). The table lists value, reference, tolerance and status for every
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


# nwlib's book tooling and its standard of evidence import no torch (nwlib loads its numerical
# modules on first use), so reading manifests stays quick.
from nwlib.book._provenance import read_manifests  # noqa: E402
from nwlib.evidence import ALPHA, family_threshold, welch_df  # noqa: E402

KEEP = ("value", "kind", "cls", "se", "df", "tol")


def seed_independent(key: str, ref: dict[str, Any]) -> bool:
    """What a rerun with another seed must reproduce: MC values, asserted findings, verdict labels."""
    name = key.split("::", 1)[-1]
    if ref["cls"] == "mc":
        return True
    return ref["cls"] == "exact" and (
        (name.startswith("finding_") and not name.endswith("_power"))
        or (name.startswith("verdict_") and name.endswith("_short"))
    )


def compare(
    value: Any, got: dict[str, Any] | None, ref: dict[str, Any], z_star: float, count: int = 1
) -> tuple[bool, str]:
    """Whether ``value`` agrees with its reference entry, and the tolerance applied (as text)."""
    cls = ref["cls"]
    if cls == "exact" or ref["kind"] != "float" or not isinstance(ref["value"], float):
        return value == ref["value"], "exact"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False, "-"
    if cls == "fp":
        allowed = max(float(ref["tol"] or 0.0), float((got or {}).get("tol") or 0.0))
    else:  # mc: within the family threshold of Student's t with the two SEs' Welch df
        se_ref, se_run = float(ref["se"] or 0.0), float((got or {}).get("se") or 0.0)
        df = welch_df((se_ref**2, ref.get("df") or math.inf), (se_run**2, (got or {}).get("df") or math.inf))
        threshold = z_star if math.isinf(df) else family_threshold(count, ALPHA, df)
        allowed = threshold * math.hypot(se_ref, se_run)
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
    parser.add_argument(
        "--other-seed", action="store_true", help="the run used another seed: compare only what must not depend on it"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the summary as JSON here")
    parser.add_argument("--quiet", action="store_true", help="print failures only")
    parser.add_argument(
        "--only", nargs="+", default=None, metavar="NOTEBOOK", help="compare these notebooks only (stems or paths)"
    )
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
        reference = {k: {f: e.get(f) for f in KEEP} for k, e in sorted(entries.items())}
        seeds = sorted({e.get("seed") for e in entries.values()}, key=str)
        reference_path.parent.mkdir(parents=True, exist_ok=True)
        reference_path.write_text(
            json.dumps(
                {"profile": profiles[0], "seed": seeds[0] if len(seeds) == 1 else seeds, "entries": reference},
                indent=1,
                ensure_ascii=False,
            )
            + "\n"
        )
        print(f"wrote {len(reference)} reference values to {reference_path}")
        return 0

    if not reference_path.is_file():
        print(f"no reference {reference_path}: run make verify-update and commit it", file=sys.stderr)
        return 1
    reference = json.loads(reference_path.read_text())["entries"]
    keys = sorted(set(reference) | set(entries))
    if args.only:
        wanted = {Path(name).stem for name in args.only}
        keys = [k for k in keys if Path(k.split("::", 1)[0]).stem in wanted]
    if args.other_seed:
        keys = [k for k in keys if k in reference and seed_independent(k, reference[k])]
    n_mc = sum(1 for k in keys if k in reference and reference[k]["cls"] == "mc")
    z_star = family_threshold(max(n_mc, 1), ALPHA)
    rows, failures = [], 0
    counts = {"exact": 0, "fp": 0, "mc": 0}
    for key in keys:
        ref, got = reference.get(key), entries.get(key)
        if ref is None:
            status, tol, ref_text = "FAIL: not in the reference", "-", "-"
        elif got is None:
            status, tol, ref_text = "FAIL: not recorded by this run", "-", _short(ref["value"])
        else:
            ok, tol = compare(got["value"], got, ref, z_star, max(n_mc, 1))
            status, ref_text = ("ok" if ok else "FAIL"), _short(ref["value"])
            counts[ref["cls"]] = counts.get(ref["cls"], 0) + 1
        failures += status != "ok"
        rows.append((key, _short(got["value"]) if got else "-", ref_text, tol, status))
    width = max([len("value")] + [len(r[0]) for r in rows])  # no rows: nothing here is seed-independent
    print(f"{'value':<{width}}  {'this run':>38}  {'reference':>38}  {'tolerance':>10}  status")
    for key, got_text, ref_text, tol, status in rows:
        if not args.quiet or status != "ok":
            print(f"{key:<{width}}  {got_text:>38}  {ref_text:>38}  {tol:>10}  {status}")
    print(
        f"{len(rows) - failures} of {len(rows)} values agree with {reference_path.name} "
        f"({counts.get('exact', 0)} exact, {counts.get('fp', 0)} within a floating-point tolerance, "
        f"{counts.get('mc', 0)} Monte Carlo within {z_star:.2f} combined SE: family-wise level {ALPHA})"
    )
    if args.json:
        seeds = sorted({str(e.get("seed")) for e in entries.values()})
        args.json.write_text(
            json.dumps(
                {
                    "seed": seeds,
                    "compared": len(rows),
                    "failures": failures,
                    "z_star": z_star,
                    "counts": counts,
                    "failed": [r[0] for r in rows if r[4] != "ok"],
                },
                indent=1,
            )
            + "\n"
        )
    if failures:
        print(
            f"{failures} value(s) differ: if the change is deliberate, run `make verify-update` and commit "
            f"{reference_path.relative_to(ROOT) if reference_path.is_relative_to(ROOT) else reference_path}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
