"""Differential-privacy mechanisms: pure math, no I/O.

Local randomizers (run on the device) with their server-side estimators, and central
mechanisms (thresholded noise, quantiles, Theil-Sen) in an OpenDP-style framework of
transformations and measurements with exact, conservative privacy maps.
"""

from mechanisms.core import (
    APPROX_MAX_DIVERGENCE,
    APPROX_ZERO_CONCENTRATED_DIVERGENCE,
    DISCRETE_DISTANCE,
    INSERT_DELETE_DISTANCE,
    MAX_DIVERGENCE,
    SMOOTHED_MAX_DIVERGENCE,
    SYMMETRIC_DISTANCE,
    ZERO_CONCENTRATED_DIVERGENCE,
    Domain,
    Measure,
    Measurement,
    Metric,
    PrivacyProfile,
    Transformation,
    approximate,
    make_composition,
    make_fix_delta,
    make_user_measurement,
    make_user_transformation,
)
from mechanisms.errors import (
    BudgetExceededError,
    CompositionError,
    DomainError,
    MechanismError,
    ParameterError,
    PrivacyMapError,
)
from mechanisms.estimates import Estimate, normal_quantile
from mechanisms.rng import CryptoRandom, RandomSource, SeededRandom, crypto_random

# --- local randomizers and estimators (issue 3) ---

# --- RAPPOR (issue 3) ---

# --- thresholded noise, samplers, zCDP (issue 4) ---

# --- quantile, Theil-Sen, accountant (issue 4) ---

__all__ = [
    "APPROX_MAX_DIVERGENCE",
    "APPROX_ZERO_CONCENTRATED_DIVERGENCE",
    "DISCRETE_DISTANCE",
    "INSERT_DELETE_DISTANCE",
    "MAX_DIVERGENCE",
    "SMOOTHED_MAX_DIVERGENCE",
    "SYMMETRIC_DISTANCE",
    "ZERO_CONCENTRATED_DIVERGENCE",
    "BudgetExceededError",
    "CompositionError",
    "CryptoRandom",
    "Domain",
    "DomainError",
    "Estimate",
    "Measure",
    "Measurement",
    "MechanismError",
    "Metric",
    "ParameterError",
    "PrivacyMapError",
    "PrivacyProfile",
    "RandomSource",
    "SeededRandom",
    "Transformation",
    "approximate",
    "crypto_random",
    "make_composition",
    "make_fix_delta",
    "make_user_measurement",
    "make_user_transformation",
    "normal_quantile",
]
