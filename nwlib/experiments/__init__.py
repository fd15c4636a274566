"""Chapter experiments: pure functions of (parameters, seed, device), one module per chapter.

Each module is named after its notebook (``notebooks/chNN_<name>.ipynb`` calls
``nwlib.experiments.<name>``) and tested in ``tests/experiments/test_<name>.py``.
"""
