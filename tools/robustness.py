"""Rerun the quick profile with other seeds and check that the book's statements survive.

    python tools/robustness.py --seeds 1 2 3                 # make robustness (SEEDS="1 2 3")
    python tools/robustness.py --seeds 1 --variant portable  # generic kernels, one thread

For every seed the quick notebooks run into ``_build/robustness/seed-<s>``; then, per seed:

* every notebook ran (``tools/run_notebooks.py``'s status);
* every asserted finding held (a notebook stops on one that does not, so this repeats the first
  point per finding), and how many of the findings reported but not asserted held;
* every verdict label equals ``book/verdicts.yaml`` (``tools/check_verdicts.py``);
* every Monte Carlo value agrees with ``verify/quick.json`` (made with the book's seed) within the
  family-wise number of combined standard errors (``tools/verify.py --other-seed``).

The summary goes to ``verify/robustness-quick.json`` (``verify/portable-quick.json`` for the
portable variant) (committed, like the benchmark results, and
shown on the reproducing page) with the machine it ran on. ``--variant portable`` runs the kernels
with ``ATEN_CPU_CAPABILITY=default`` and one thread, as another CPU would.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = {"native": ROOT / "verify" / "robustness-quick.json", "portable": ROOT / "verify" / "portable-quick.json"}
PORTABLE = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)


def _findings(folder: Path) -> dict[str, int]:
    """Counts of asserted and reported findings, and of those that held, from the manifests."""
    if str(ROOT / "tools") not in sys.path:
        sys.path.insert(0, str(ROOT / "tools"))
    from verify import read_manifests

    counts = {"asserted": 0, "asserted_held": 0, "reported": 0, "reported_held": 0}
    failed: list[str] = []
    for (notebook, key), entry in read_manifests(folder).items():
        if not key.startswith("finding_") or key.endswith("_power") or entry["kind"] != "bool":
            continue
        kind = "asserted" if entry["cls"] == "exact" else "reported"
        counts[kind] += 1
        counts[f"{kind}_held"] += bool(entry["value"])
        if kind == "asserted" and not entry["value"]:
            failed.append(f"{notebook}::{key}")
    return {**counts, "asserted_failed": failed}  # type: ignore[dict-item]


def one_seed(seed: int, variant: str) -> dict:
    stage = ROOT / "_build" / "robustness" / f"{variant}-seed-{seed}"
    env = {**os.environ, **(PORTABLE if variant == "portable" else {})}
    t0 = time.perf_counter()
    run = _run(
        [sys.executable, "tools/run_notebooks.py", "--profile", "quick", "--stage", str(stage), "--seed", str(seed)],
        env,
    )
    seconds = time.perf_counter() - t0
    summary = [line for line in run.stdout.splitlines() if " quick " in line and ("ok" in line or "FAIL" in line)]
    notebooks_failed = [line.split()[0] for line in summary if "FAILED" in line or "TIMEOUT" in line]
    folder = stage / "notebooks"
    labels = _run([sys.executable, "tools/check_verdicts.py", str(folder)])
    summary_json = stage / "verify-summary.json"
    args = [sys.executable, "tools/verify.py", str(folder), "--quiet", "--json", str(summary_json)]
    verify = _run(args + (["--other-seed"] if seed != _reference_seed() else []))
    compared = json.loads(summary_json.read_text()) if summary_json.is_file() else {}
    if verify.returncode not in (0, 1) or not compared:  # the comparison itself did not run
        compared = {"compared": 0, "failed": [f"tools/verify.py exited {verify.returncode}: {verify.stderr[-300:]}"]}
    return {
        "seed": seed,
        "variant": variant,
        "seconds": round(seconds, 1),
        "notebooks_failed": notebooks_failed,
        "labels_agree": labels.returncode == 0,
        "labels_detail": labels.stdout.strip().splitlines()[-1:] if labels.stdout else [],
        "findings": _findings(folder),
        "values_compared": compared.get("compared"),
        "values_failed": compared.get("failed", []),
        "z_star": compared.get("z_star"),
    }


def _reference_seed() -> int:
    reference = json.loads((ROOT / "verify" / "quick.json").read_text())
    return int(reference.get("seed", 0))


def _machine() -> dict:
    import torch

    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--variant", choices=("native", "portable"), default="native")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="default: verify/robustness-quick.json (native) or verify/portable-quick.json (portable)",
    )
    args = parser.parse_args(argv)

    args.output = args.output or OUTPUT[args.variant]
    results = []
    for seed in args.seeds:
        print(f"seed {seed} ({args.variant}) ...", flush=True)
        r = one_seed(seed, args.variant)
        f = r["findings"]
        ok = not r["notebooks_failed"] and r["labels_agree"] and not r["values_failed"] and not f["asserted_failed"]
        r["ok"] = ok
        print(
            f"seed {seed}: notebooks failed {len(r['notebooks_failed'])}, findings held "
            f"{f['asserted_held']}/{f['asserted']} asserted and {f['reported_held']}/{f['reported']} reported, "
            f"labels {'agree' if r['labels_agree'] else 'DIFFER'}, values "
            f"{(r['values_compared'] or 0) - len(r['values_failed'])}/{r['values_compared']} agree "
            f"({'ok' if ok else 'FAILED'}) in {r['seconds']} s",
            flush=True,
        )
        for name in r["notebooks_failed"] + r["values_failed"] + f["asserted_failed"]:
            print(f"  {name}")
        results.append(r)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "profile": "quick",
                "reference_seed": _reference_seed(),
                "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
                "commit": _run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip(),
                "machine": _machine(),
                "seeds": results,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
