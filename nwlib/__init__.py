"""nwlib: multi-head attention as an ensemble of Nadaraya–Watson estimators.

The library behind the companion book to Fokoué, *Multi-Head Attention as
Ensemble Nadaraya-Watson Estimation* (arXiv:2605.20271). The public names are
listed in ``__all__``; implementation lives in the submodules, one concept each.
"""

from .device import resolve_device
from .kernels import KERNELS, nadaraya_watson, nadaraya_watson_weights
from .multihead import MultiHeadNW
from .reporting import glue, glue_figure, glue_math

# --- Monte Carlo engine (Theorem 3.1) ---
from .decomposition import Decomposition, IntegratedDecomposition, decompose
from .montecarlo import simulate
from .tasks import TASKS, RegressionTask, make_task
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
# --- structured head weights (Theorem 7.1) ---
from .weighting import (
    HeadRanking,
    assign_by_rank,
    combination_mse,
    error_second_moments,
    fibonacci_weights,
    geometric_weights,
    optimal_weights,
    rank_heads,
    replicate_mse,
    uniform_weights,
)

__version__ = "0.1.0"

__all__ = [
    "KERNELS",
    "MultiHeadNW",
    "nadaraya_watson",
    "nadaraya_watson_weights",
    "glue",
    "glue_figure",
    "glue_math",
    "resolve_device",
    # --- Monte Carlo engine names ---
    "Decomposition",
    "IntegratedDecomposition",
    "RegressionTask",
    "TASKS",
    "decompose",
    "make_task",
    "simulate",
    # --- subspace names ---
    "NORMALIZATIONS",
    "cross_gram",
    "equiangular_heads",
    "hdi",
    "orthonormal_basis",
    "principal_angles",
    "random_subspaces",
    # --- weighting names ---
    "HeadRanking",
    "assign_by_rank",
    "combination_mse",
    "error_second_moments",
    "fibonacci_weights",
    "geometric_weights",
    "optimal_weights",
    "rank_heads",
    "replicate_mse",
    "uniform_weights",
]
