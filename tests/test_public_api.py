"""The public surface: every exported name resolves, is documented, and speaks one vocabulary.

``PUBLIC_SIGNATURES`` is the API contract: a change to a public signature must change
this list in the same commit, so that it is a decision and not an accident.
"""

import inspect

import pytest

import nwlib

PUBLIC_SIGNATURES = {
    "MultiHeadNW": "(embed_dim, num_heads, *, bias=True, kdim=None, vdim=None, batch_first=False, device=None, dtype=None)",
    "nadaraya_watson": "(queries, keys, values, *, kernel='exp', bandwidth=None)",
    "nadaraya_watson_weights": "(queries, keys, *, kernel='exp', bandwidth=None)",
    "cosine_attention": "(queries, keys, values, *, temperature)",
    "resolve_device": "(device='auto')",
    "loo_cv_score": "(keys, values, bandwidth, *, kernel='gaussian')",
    "scott_bandwidth": "(n, d, sigma=1.0)",
    "split_projection": "(weight, num_heads)",
    "select_bandwidth": (
        "(keys, values, *, kernel='gaussian', method='loo', candidates=None, num_candidates=25, "
        "refine_steps=24, memory_budget=268435456)"
    ),
    "BandwidthSelection": "(bandwidth, score, candidates, scores)",
    "decompose": "(predictions, target, weights=None)",
    "noise_covariance": "(weights, noise_sd)",
    "paired_difference": "(a, b)",
    "bootstrap_indices": "(replicates, num_members, n, *, generator, sample_size=None)",
    "draw_training_sets": "(task, n, replicates, *, generator, dtype=torch.float32)",
    "equicorrelation": "(predictions, target=None)",
    "feature_subsets": "(replicates, num_members, embed_dim, subset_dim, *, generator)",
    "forest_member_predictions": "(forests, eval_points)",
    "forest_weights": "(forest, train_inputs, eval_points)",
    "resampled_nw": "(x, y, eval_points, *, rows=None, columns=None, kernel='gaussian', bandwidth=None, chunk_size=None)",
    "grouped_jackknife": "(statistic, *arrays, groups=20)",
    "conditional_moments": "(weights, f_values, noise_sd)",
    "covariance_split": "(conditional_mean, noise_cov)",
    "make_task": "(name, embed_dim, *, noise_sd=0.5, **kwargs)",
    "memory_estimate": (
        "(*, num_heads, n, m, embed_dim, head_dim, replicates, chunk_size, head_data='shared', "
        "kernel='gaussian', head_values=False, dtype=torch.float32, device='cpu')"
    ),
    "simulate": (
        "(task, key_projections, eval_points, *, n, replicates, generator, kernel='gaussian', bandwidth=None, "
        "head_data='shared', chunk_size=None, progress=False, query_projections=None, value_projections=None, "
        "memory_budget=268435456)"
    ),
    "cross_gram": "(A, B, *, normalization='orthonormal')",
    "equiangular_heads": (
        "(angle, *, num_heads, head_dim, embed_dim, shared_dim=0, generator=None, dtype=None, device=None)"
    ),
    "hdi": "(projections, *, normalization='orthonormal')",
    "multiangle_heads": "(angles, *, num_heads, embed_dim, shared_dim=0, dtype=None, device=None)",
    "orthogonal_heads": "(masses, *, head_dim, embed_dim, dtype=None, device=None)",
    "signal_mass": "(key_projections, direction=None)",
    "rv_coefficient": "(A, B, *, centered=False)",
    "pairwise_rv": "(projections, *, centered=False)",
    "rv_diversity": "(projections, *, centered=False)",
    "noise_covariance_factor": "(angles, bandwidth)",
    "orthonormal_basis": "(A, *, name='A')",
    "principal_angles": "(A, B)",
    "random_subspaces": "(num_heads, head_dim, embed_dim, *, generator, batch_shape=(), dtype=None, device=None)",
    "assign_by_rank": "(weights, order)",
    "combination_mse": "(weights, M)",
    "error_second_moments": "(predictions, target)",
    "fibonacci_weights": "(num_heads, *, dtype=None, device=None)",
    "geometric_weights": "(num_heads, ratio, *, dtype=None, device=None)",
    "optimal_weights": "(M, *, ridge=0.0)",
    "least_squares_weights": "(predictions, target, *, ridge=0.0)",
    "rank_heads": "(predictions, target)",
    "replicate_mse": "(predictions, target, weights)",
    "uniform_weights": "(num_heads, *, dtype=None, device=None)",
    "nested_weights": "(scheme, order, *, ratio=None, second_moments=None, ridge=0.0, dtype=None)",
    "validation_ranking": "(predictions, responses)",
    "kendall_tau": "(order, reference)",
}

# Spellings the library no longer uses for its three sizes (torch's names win).
RETIRED_NAMES = {"H", "heads", "n_heads", "nheads", "dim", "D", "d_k", "dk", "d_model", "model_dim"}


def _plain(sig: inspect.Signature) -> str:
    """The signature without annotations: names, kinds and defaults."""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _public_callables():
    for name in nwlib.__all__:
        obj = getattr(nwlib, name)
        if inspect.isfunction(obj) or (inspect.isclass(obj) and PUBLIC_SIGNATURES.get(name)):
            yield name, obj


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


def test_every_public_function_is_listed():
    functions = {name for name in nwlib.__all__ if inspect.isfunction(getattr(nwlib, name))}
    assert functions <= set(PUBLIC_SIGNATURES), f"unlisted public functions: {functions - set(PUBLIC_SIGNATURES)}"


@pytest.mark.parametrize("name", sorted(k for k, v in PUBLIC_SIGNATURES.items() if v is not None))
def test_public_signature(name):
    assert _plain(inspect.signature(getattr(nwlib, name))) == PUBLIC_SIGNATURES[name]


def test_one_name_per_concept():
    offenders = [
        f"{name}({param})"
        for name, obj in _public_callables()
        for param in inspect.signature(obj).parameters
        if param in RETIRED_NAMES
    ]
    assert not offenders, f"retired spellings in public signatures: {offenders}"


def test_book_tooling_is_outside_the_library_namespace():
    import nwlib.book

    for name in ("glue", "glue_figure", "glue_math"):
        assert name not in nwlib.__all__ and not hasattr(nwlib, name)
        assert callable(getattr(nwlib.book, name))


QUALIFIED_SIGNATURES = {
    "nwlib.book.glue": "(name, value, display=False, *, se=None, exact=None, tol=None, verify=True, dtype=None, device=None, df=None)",
    "nwlib.book.setup": "(*, profile, seed, device, dtype)",
    "nwlib.book.start": "(notebook, *, profile, seed, device='auto', dtype='float64', threads=None, sizes=None)",
    "nwlib.book.glue_values": "(values, *, exact=None, tol=None, verify=True, dtype=None, device=None)",
    "nwlib.book.glue_verdict": "(verdict, *, verify_text=False)",
    "nwlib.evidence.crossed": "(a, b=None)",
    "nwlib.evidence.against": "(value, draws)",
    "nwlib.evidence.paired": "(a, b)",
    "nwlib.evidence.mean": "(values)",
    "nwlib.evidence.independent": "(a, b)",
    "nwlib.evidence.se_of_se": "(se, replicates)",
    "nwlib.evidence.estimate": "(value, se, df=inf)",
    "nwlib.evidence.holm": "(p_values)",
    "nwlib.evidence.significant": "(comparisons, *, alpha=0.05, alternative='two-sided')",
    "nwlib.evidence.family_threshold": "(count, alpha=0.05, df=inf)",
    "nwlib.evidence.fp_tolerance": "(dtype='float64', *, scale=1.0, condition=1.0)",
    "nwlib.evidence.Findings": "(family, *, profile, alpha=0.05)",
    "nwlib.book.verdicts.judge": "(claim, cases, *, conditions, reason)",
    "nwlib.book.verdicts.Case": "(name, holds, attributes=<factory>, could_fail=True)",
}


@pytest.mark.parametrize("path", sorted(QUALIFIED_SIGNATURES))
def test_qualified_signatures_are_pinned(path):
    import importlib

    module, name = path.rsplit(".", 1)
    obj = getattr(importlib.import_module(module), name)
    assert _plain(inspect.signature(obj)) == QUALIFIED_SIGNATURES[path]


@pytest.mark.parametrize("module", ["nwlib.evidence", "nwlib.book.verdicts", "nwlib.book"])
def test_every_export_of_the_qualified_modules_resolves_and_is_documented(module):
    import importlib

    mod = importlib.import_module(module)
    for name in mod.__all__:
        obj = getattr(mod, name)
        if callable(obj):
            assert inspect.getdoc(obj), f"{module}.{name} has no docstring"


def test_lazy_exports_match_all():
    assert set(nwlib._EXPORTS) == set(nwlib.__all__)
    for name, module in nwlib._EXPORTS.items():
        import importlib

        assert getattr(importlib.import_module(f"nwlib.{module}"), name) is getattr(nwlib, name)


@pytest.mark.parametrize(
    "modules", ["nwlib", "nwlib.book", "nwlib.book.verdicts", "nwlib.book._provenance", "nwlib.evidence", "nwlib.sweep"]
)
def test_book_tooling_imports_no_torch(modules):
    import subprocess
    import sys

    code = (
        f"import sys, {modules}; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _layer_modules():
    import importlib
    import pkgutil

    import nwlib.experiments
    import nwlib.models

    for package in (nwlib.experiments, nwlib.models):
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                yield importlib.import_module(f"{package.__name__}.{info.name}")


def test_one_name_per_concept_in_the_experiments_and_models():
    offenders = []
    for module in _layer_modules():
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                try:
                    params = inspect.signature(obj).parameters
                except (TypeError, ValueError):
                    continue
                # "heads" names a collection (an ensemble's member predictions) as often as a count:
                # only a count, annotated int, must be num_heads
                offenders += [
                    f"{module.__name__}.{name}({p})"
                    for p, param in params.items()
                    if p in RETIRED_NAMES and (p != "heads" or "int" in str(param.annotation))
                ]
    assert not offenders, f"retired spellings in experiment or model signatures: {offenders}"


def test_every_experiment_module_lists_and_documents_its_exports():
    for module in _layer_modules():
        assert module.__doc__, f"{module.__name__} has no docstring"
        assert hasattr(module, "__all__"), f"{module.__name__} has no __all__"
        for name in module.__all__:
            obj = getattr(module, name)  # every export resolves
            if inspect.isfunction(obj) or inspect.isclass(obj):
                assert inspect.getdoc(obj), f"{module.__name__}.{name} has no docstring"
