"""Differential-privacy mechanisms: pure math, no I/O.

Local randomizers (run on the device) with their server-side estimators, and central
mechanisms (thresholded noise, quantiles, Theil-Sen) in an OpenDP-style framework of
transformations and measurements with exact, conservative privacy maps.
"""

from mechanisms.accountant import (
    LedgerEntry,
    PrivacyAccountant,
    PrivacyBudget,
    ReleaseConflictError,
    ReleaseRefusedError,
)
from mechanisms.category_set import (
    CategorySet,
)
from mechanisms.consistency import (
    norm_sub,
    project_to_simplex,
)
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
    array2_domain,
    atom_domain,
    linf_distance,
    make_composition,
    make_drop_null,
    make_fix_delta,
    make_user_measurement,
    make_user_transformation,
    vector_domain,
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
from mechanisms.frequency_estimation import (
    count_categories,
    estimate_counts,
    estimate_frequencies,
    estimate_local_hashing_counts,
    estimate_local_hashing_frequencies,
    estimate_rr_bool_count,
    estimate_rr_bool_mean,
    estimate_rr_counts,
    estimate_rr_frequencies,
    estimate_unary_counts,
    estimate_unary_frequencies,
)
from mechanisms.local_hashing import (
    LocalHashing,
    hash_buckets,
    make_local_hashing,
    make_optimized_local_hashing,
    olh_support_counts,
)
from mechanisms.local_randomizer import LocalRandomizer
from mechanisms.protocol_choice import (
    ProtocolChoice,
    choose_protocol,
    grr_variance,
    make_frequency_oracle,
    olh_variance,
    oue_variance,
)
from mechanisms.quantile import (
    make_noisy_max,
    make_private_quantile,
    make_quantile_score_candidates,
)
from mechanisms.randomized_response import (
    RandomizedResponse,
    RandomizedResponseBool,
    make_randomized_response,
    make_randomized_response_bool,
    make_randomized_response_bool_from_epsilon,
    make_randomized_response_from_epsilon,
    randomized_response_epsilon,
    randomized_response_prob,
)
from mechanisms.rappor import (
    RapporClient,
    RapporParams,
    RapporVariant,
    bloom_bits,
    cohort_of,
    make_rappor,
    new_client_secret,
    pack_report,
    prr_context,
    unpack_report,
)
from mechanisms.rappor import (
    encode_batch as encode_rappor_batch,
)
from mechanisms.rappor import (
    encode_batch_packed as encode_rappor_batch_packed,
)
from mechanisms.rappor_advisor import (
    RapporAdvice,
)
from mechanisms.rappor_advisor import (
    advise as advise_rappor,
)
from mechanisms.rappor_estimation import (
    DetectedString,
    RapporDecodeResult,
    bit_count_variance,
    design_matrix,
    estimate_basic_histogram,
    estimate_bit_counts,
    significance_decisions,
)
from mechanisms.rappor_estimation import (
    decode as decode_rappor,
)
from mechanisms.rappor_estimation import (
    sum_bits as sum_rappor_bits,
)
from mechanisms.rng import CryptoRandom, RandomSource, SeededRandom, crypto_random
from mechanisms.samplers import (
    bernoulli_exp_neg,
    bernoulli_rational,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)
from mechanisms.theil_sen import (
    make_pairwise_predict,
    make_private_percentile_medians,
    make_private_theil_sen,
    make_select_column,
)
from mechanisms.threshold import (
    ThresholdMeasurement,
    make_gaussian_threshold,
    make_laplace_threshold,
)
from mechanisms.unary_encoding import (
    UnaryEncoding,
    make_optimized_unary_encoding,
    make_symmetric_unary_encoding,
    make_unary_encoding,
    oue_probabilities,
    sue_probabilities,
    unary_support_counts,
)
from mechanisms.zcdp import (
    ZCDPProfile,
    cdp_delta,
    cdp_epsilon,
    make_zcdp_to_approxdp,
)

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
    "CategorySet",
    "CompositionError",
    "CryptoRandom",
    "DetectedString",
    "Domain",
    "DomainError",
    "Estimate",
    "LedgerEntry",
    "LocalHashing",
    "LocalRandomizer",
    "Measure",
    "Measurement",
    "MechanismError",
    "Metric",
    "ParameterError",
    "PrivacyAccountant",
    "PrivacyBudget",
    "PrivacyMapError",
    "PrivacyProfile",
    "ProtocolChoice",
    "RandomSource",
    "RandomizedResponse",
    "RandomizedResponseBool",
    "RapporAdvice",
    "RapporClient",
    "RapporDecodeResult",
    "RapporParams",
    "RapporVariant",
    "ReleaseConflictError",
    "ReleaseRefusedError",
    "SeededRandom",
    "ThresholdMeasurement",
    "Transformation",
    "UnaryEncoding",
    "ZCDPProfile",
    "advise_rappor",
    "approximate",
    "array2_domain",
    "atom_domain",
    "bernoulli_exp_neg",
    "bernoulli_rational",
    "bit_count_variance",
    "bloom_bits",
    "cdp_delta",
    "cdp_epsilon",
    "choose_protocol",
    "cohort_of",
    "count_categories",
    "crypto_random",
    "decode_rappor",
    "design_matrix",
    "encode_rappor_batch",
    "encode_rappor_batch_packed",
    "estimate_basic_histogram",
    "estimate_bit_counts",
    "estimate_counts",
    "estimate_frequencies",
    "estimate_local_hashing_counts",
    "estimate_local_hashing_frequencies",
    "estimate_rr_bool_count",
    "estimate_rr_bool_mean",
    "estimate_rr_counts",
    "estimate_rr_frequencies",
    "estimate_unary_counts",
    "estimate_unary_frequencies",
    "grr_variance",
    "hash_buckets",
    "linf_distance",
    "make_composition",
    "make_drop_null",
    "make_fix_delta",
    "make_frequency_oracle",
    "make_gaussian_threshold",
    "make_laplace_threshold",
    "make_local_hashing",
    "make_noisy_max",
    "make_optimized_local_hashing",
    "make_optimized_unary_encoding",
    "make_pairwise_predict",
    "make_private_percentile_medians",
    "make_private_quantile",
    "make_private_theil_sen",
    "make_quantile_score_candidates",
    "make_randomized_response",
    "make_randomized_response_bool",
    "make_randomized_response_bool_from_epsilon",
    "make_randomized_response_from_epsilon",
    "make_rappor",
    "make_select_column",
    "make_symmetric_unary_encoding",
    "make_unary_encoding",
    "make_user_measurement",
    "make_user_transformation",
    "make_zcdp_to_approxdp",
    "new_client_secret",
    "norm_sub",
    "normal_quantile",
    "olh_support_counts",
    "olh_variance",
    "oue_probabilities",
    "oue_variance",
    "pack_report",
    "project_to_simplex",
    "prr_context",
    "randomized_response_epsilon",
    "randomized_response_prob",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
    "significance_decisions",
    "sue_probabilities",
    "sum_rappor_bits",
    "unary_support_counts",
    "unpack_report",
    "vector_domain",
]
