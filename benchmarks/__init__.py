"""Benchmarks of :func:`nwlib.nadaraya_watson` against what a reader would otherwise write.

Run ``python -m benchmarks.run`` from the repository root (``make bench``); see
:mod:`benchmarks.run` for the options and :mod:`benchmarks.references` for the
implementations compared. Not part of the test suite's pass/fail: timings depend
on the machine, so the targets are checked as ratios measured in one run.
"""
