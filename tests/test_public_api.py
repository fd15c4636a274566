"""The public surface: every exported name resolves and is documented."""

import inspect

import nwlib


def test_every_exported_name_resolves():
    assert len(nwlib.__all__) == len(set(nwlib.__all__)), "duplicate names in __all__"
    for name in nwlib.__all__:
        assert hasattr(nwlib, name), name


def test_public_callables_have_numpy_style_docstrings():
    for name in nwlib.__all__:
        obj = getattr(nwlib, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            doc = inspect.getdoc(obj) or ""
            assert doc, f"{name} has no docstring"
            if inspect.isfunction(obj) and inspect.signature(obj).parameters:
                assert "Parameters\n----------" in doc, f"{name} docstring lacks a Parameters section"
