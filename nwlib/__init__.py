"""nwlib: multi-head attention as an ensemble of Nadaraya–Watson estimators.

The library behind the companion book to Fokoué, *Multi-Head Attention as
Ensemble Nadaraya-Watson Estimation* (arXiv:2605.20271). The public names are
listed in ``__all__``; implementation lives in the submodules, one concept each.
One name per concept throughout, torch's where torch has one: ``num_heads`` (H),
``embed_dim`` (D), ``head_dim`` (d_k). The book's tooling (glue) lives in
:mod:`nwlib.book`, outside this namespace, and so do two larger submodules whose
names are used qualified: :mod:`nwlib.pretrained` (a BERT-style model read from
safetensors and run with NW heads) and :mod:`nwlib.training` (a one-layer attention
regressor, its training loop, and direct optimisation of head subspaces); likewise
:mod:`nwlib.sweep` (seeded grid sweeps on any ``concurrent.futures`` executor, Dask
included, resumable) and :mod:`nwlib.risk_model` (chapter 6's head-count experiment).
"""

from .angles import multiangle_heads, noise_covariance_factor, orthogonal_heads, signal_mass
from .bandwidth import BandwidthSelection, loo_cv_score, select_bandwidth

# --- Monte Carlo engine (Theorem 3.1) ---
from .combination import (
    CovarianceSplit,
    EquicorrelatedFit,
    JackknifeEstimate,
    PairedDifference,
    conditional_moments,
    covariance_split,
    equicorrelated_fit,
    grouped_jackknife,
    paired_difference,
)
from .decomposition import Decomposition, IntegratedDecomposition, decompose, noise_covariance
from .device import resolve_device
from .ensembles import (
    Equicorrelation,
    bootstrap_indices,
    draw_training_sets,
    equicorrelation,
    feature_subsets,
    forest_member_predictions,
    forest_weights,
    resampled_nw,
)
from .kernels import KERNELS, nadaraya_watson, nadaraya_watson_weights
from .montecarlo import MemoryEstimate, memory_estimate, simulate
from .multihead import MultiHeadNW

# --- structured head weights (Theorem 7.1) ---
from .ranking import NESTED_SCHEMES, ValidationRanking, kendall_tau, nested_weights, validation_ranking
from .similarity import pairwise_rv, rv_coefficient, rv_diversity

# --- subspaces and the Head Diversity Index (Theorem 4.2) ---
from .subspaces import (
    NORMALIZATIONS,
    cross_gram,
    equiangular_heads,
    hdi,
    orthonormal_basis,
    principal_angles,
    random_subspaces,
)
from .tasks import TASKS, RegressionTask, make_task
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

__version__ = "0.2.0"

__all__ = [
    "KERNELS",
    "MultiHeadNW",
    "nadaraya_watson",
    "nadaraya_watson_weights",
    "resolve_device",
    # --- bandwidth selection ---
    "BandwidthSelection",
    "loo_cv_score",
    "select_bandwidth",
    # --- Monte Carlo engine names ---
    "CovarianceSplit",
    "EquicorrelatedFit",
    "JackknifeEstimate",
    "PairedDifference",
    "conditional_moments",
    "covariance_split",
    "equicorrelated_fit",
    "grouped_jackknife",
    "paired_difference",
    "Decomposition",
    "IntegratedDecomposition",
    "MemoryEstimate",
    "RegressionTask",
    "TASKS",
    "decompose",
    "make_task",
    "memory_estimate",
    "noise_covariance",
    "simulate",
    # --- other ensembles (chapter 7) ---
    "Equicorrelation",
    "bootstrap_indices",
    "draw_training_sets",
    "equicorrelation",
    "feature_subsets",
    "forest_member_predictions",
    "forest_weights",
    "resampled_nw",
    # --- subspace names ---
    "NORMALIZATIONS",
    "cross_gram",
    "equiangular_heads",
    "hdi",
    "orthonormal_basis",
    "principal_angles",
    "random_subspaces",
    "multiangle_heads",
    "pairwise_rv",
    "rv_coefficient",
    "rv_diversity",
    "noise_covariance_factor",
    "orthogonal_heads",
    "signal_mass",
    # --- weighting names ---
    "NESTED_SCHEMES",
    "ValidationRanking",
    "kendall_tau",
    "nested_weights",
    "validation_ranking",
    "HeadRanking",
    "assign_by_rank",
    "combination_mse",
    "error_second_moments",
    "fibonacci_weights",
    "geometric_weights",
    "least_squares_weights",
    "optimal_weights",
    "rank_heads",
    "replicate_mse",
    "uniform_weights",
]
