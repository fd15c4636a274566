"""nwlib: multi-head attention as an ensemble of Nadaraya–Watson estimators.

The library behind the companion book to Fokoué, *Multi-Head Attention as
Ensemble Nadaraya-Watson Estimation* (arXiv:2605.20271). The public names are
listed in ``__all__``; implementation lives in the submodules, one concept each.
One name per concept throughout, torch's where torch has one: ``num_heads`` (H),
``embed_dim`` (D), ``head_dim`` (d_k). The book's tooling (glue) lives in
:mod:`nwlib.book`, outside this namespace, and so do two larger submodules whose
names are used qualified: :mod:`nwlib.models.pretrained` (a BERT-style model read from
safetensors and run with NW heads) and :mod:`nwlib.models.training` (a one-layer attention
regressor, its training loop, and direct optimisation of head subspaces); likewise
:mod:`nwlib.sweep` (seeded grid sweeps on any ``concurrent.futures`` executor, Dask
included, resumable) and :mod:`nwlib.experiments.head_count` (chapter 6's head-count experiment).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# Each public name and the submodule that defines it. Importing nwlib loads none of them (and not
# torch): a name's module is imported on first use (PEP 562), so that the book tooling
# (nwlib.book, nwlib.evidence) and the tools that read results start without torch.
_EXPORTS: dict[str, str] = {
    "multiangle_heads": "angles",
    "noise_covariance_factor": "angles",
    "orthogonal_heads": "angles",
    "signal_mass": "angles",
    "BandwidthSelection": "bandwidth",
    "loo_cv_score": "bandwidth",
    "scott_bandwidth": "bandwidth",
    "select_bandwidth": "bandwidth",
    "CovarianceSplit": "combination",
    "JackknifeEstimate": "combination",
    "PairedDifference": "combination",
    "conditional_moments": "combination",
    "covariance_split": "combination",
    "grouped_jackknife": "combination",
    "paired_difference": "combination",
    "Decomposition": "decomposition",
    "IntegratedDecomposition": "decomposition",
    "decompose": "decomposition",
    "noise_covariance": "decomposition",
    "resolve_device": "device",
    "Equicorrelation": "combination",
    "bootstrap_indices": "ensembles",
    "draw_training_sets": "ensembles",
    "equicorrelation": "combination",
    "feature_subsets": "ensembles",
    "forest_member_predictions": "ensembles",
    "forest_weights": "ensembles",
    "resampled_nw": "ensembles",
    "KERNELS": "kernels",
    "nadaraya_watson": "kernels",
    "nadaraya_watson_weights": "kernels",
    "cosine_attention": "kernels",
    "MemoryEstimate": "montecarlo",
    "memory_estimate": "montecarlo",
    "simulate": "montecarlo",
    "MultiHeadNW": "multihead",
    "split_projection": "multihead",
    "NESTED_SCHEMES": "ranking",
    "ValidationRanking": "ranking",
    "kendall_tau": "ranking",
    "nested_weights": "ranking",
    "validation_ranking": "ranking",
    "pairwise_rv": "similarity",
    "rv_coefficient": "similarity",
    "rv_diversity": "similarity",
    "NORMALIZATIONS": "subspaces",
    "cross_gram": "subspaces",
    "equiangular_heads": "subspaces",
    "hdi": "subspaces",
    "orthonormal_basis": "subspaces",
    "principal_angles": "subspaces",
    "random_subspaces": "subspaces",
    "RegressionTask": "tasks",
    "TASKS": "tasks",
    "make_task": "tasks",
    "HeadRanking": "weighting",
    "assign_by_rank": "weighting",
    "combination_mse": "weighting",
    "error_second_moments": "weighting",
    "fibonacci_weights": "weighting",
    "geometric_weights": "weighting",
    "least_squares_weights": "weighting",
    "optimal_weights": "weighting",
    "rank_heads": "weighting",
    "replicate_mse": "weighting",
    "uniform_weights": "weighting",
}

# explicit, as einops does: tests/test_public_api.py checks it against _EXPORTS
__all__ = [
    "BandwidthSelection",
    "CovarianceSplit",
    "Decomposition",
    "Equicorrelation",
    "HeadRanking",
    "IntegratedDecomposition",
    "JackknifeEstimate",
    "KERNELS",
    "MemoryEstimate",
    "MultiHeadNW",
    "NESTED_SCHEMES",
    "NORMALIZATIONS",
    "PairedDifference",
    "RegressionTask",
    "TASKS",
    "ValidationRanking",
    "assign_by_rank",
    "bootstrap_indices",
    "combination_mse",
    "conditional_moments",
    "covariance_split",
    "cross_gram",
    "decompose",
    "draw_training_sets",
    "equiangular_heads",
    "equicorrelation",
    "error_second_moments",
    "feature_subsets",
    "fibonacci_weights",
    "forest_member_predictions",
    "forest_weights",
    "geometric_weights",
    "grouped_jackknife",
    "hdi",
    "kendall_tau",
    "least_squares_weights",
    "loo_cv_score",
    "make_task",
    "memory_estimate",
    "multiangle_heads",
    "nadaraya_watson",
    "nadaraya_watson_weights",
    "cosine_attention",
    "nested_weights",
    "noise_covariance",
    "noise_covariance_factor",
    "optimal_weights",
    "orthogonal_heads",
    "orthonormal_basis",
    "paired_difference",
    "pairwise_rv",
    "principal_angles",
    "random_subspaces",
    "rank_heads",
    "replicate_mse",
    "resampled_nw",
    "resolve_device",
    "rv_coefficient",
    "rv_diversity",
    "scott_bandwidth",
    "select_bandwidth",
    "signal_mass",
    "split_projection",
    "simulate",
    "uniform_weights",
    "validation_ranking",
]

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from .angles import (
        multiangle_heads,
        noise_covariance_factor,
        orthogonal_heads,
        signal_mass,
    )
    from .bandwidth import (
        BandwidthSelection,
        loo_cv_score,
        scott_bandwidth,
        select_bandwidth,
    )
    from .combination import (
        CovarianceSplit,
        Equicorrelation,
        JackknifeEstimate,
        PairedDifference,
        conditional_moments,
        covariance_split,
        equicorrelation,
        grouped_jackknife,
        paired_difference,
    )
    from .decomposition import (
        Decomposition,
        IntegratedDecomposition,
        decompose,
        noise_covariance,
    )
    from .device import (
        resolve_device,
    )
    from .ensembles import (
        bootstrap_indices,
        draw_training_sets,
        feature_subsets,
        forest_member_predictions,
        forest_weights,
        resampled_nw,
    )
    from .kernels import (
        KERNELS,
        cosine_attention,
        nadaraya_watson,
        nadaraya_watson_weights,
    )
    from .montecarlo import (
        MemoryEstimate,
        memory_estimate,
        simulate,
    )
    from .multihead import (
        MultiHeadNW,
        split_projection,
    )
    from .ranking import (
        NESTED_SCHEMES,
        ValidationRanking,
        kendall_tau,
        nested_weights,
        validation_ranking,
    )
    from .similarity import (
        pairwise_rv,
        rv_coefficient,
        rv_diversity,
    )
    from .subspaces import (
        NORMALIZATIONS,
        cross_gram,
        equiangular_heads,
        hdi,
        orthonormal_basis,
        principal_angles,
        random_subspaces,
    )
    from .tasks import (
        TASKS,
        RegressionTask,
        make_task,
    )
    from .weighting import (
        HeadRanking,
        assign_by_rank,
        combination_mse,
        error_second_moments,
        fibonacci_weights,
        geometric_weights,
        least_squares_weights,
        optimal_weights,
        rank_heads,
        replicate_mse,
        uniform_weights,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nwlib' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
