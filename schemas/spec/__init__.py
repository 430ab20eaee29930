"""The collection spec: one file, shared by producers and agents, that says what is collected and how.

A spec is YAML (``.yaml``/``.yml``) or TOML (``.toml``), validated by the frozen pydantic models of this package.
:func:`load_spec` is the only entry point that reads files; every problem in a bad file is reported at
once in one :class:`SpecError`, each as ``<path>: <reason>`` with pydantic's location mapped to the
file's own shape, e.g. ``metrics[2].prob: must be in [0.25, 1] for 4 categories``.

Shape (YAML)::

    version: 1
    name: demo
    topics: {reports: ptel.reports, releases: ptel.releases, dead_letter: ptel.dead-letter, partitions: 6}
    window: {size_s: 10, grace_s: 5, retention_s: 3600, retry_horizon_s: 900}
    confidence: 0.95
    metrics:
      - {name: crashed, kind: bool, prob: 0.75, reports_per_window: 1}
      - {name: theme, kind: categorical, categories: [a, b, c, d], epsilon: 1.0, protocol: auto}
      - {name: homepage, kind: rappor, variant: standard, k: 32, h: 2, m: 8, f: 0.5, p: 0.5, q: 0.75,
         candidates: [...]}
      - {name: errors, kind: keyed, keys_per_window: 4, value: {prob: 0.75},
         release: {mechanism: laplace, scale: 2.0, threshold: 40, dtype: int}}
      - {name: latency_vs_size, kind: regression, x_bounds: [0, 10], y_bounds: [0, 100], scale: 1.0}

Metric kinds (``kind`` is the discriminator):

- ``bool``: boolean randomized response, ``prob`` of answering truthfully in [0.5, 1] or ``epsilon``
  (``prob = e^ε / (1 + e^ε)``; [RR]).
- ``categorical``: k categories (or ``bins`` of a number, binned on the device), with ``protocol``
  ``krr`` (k-ary RR, ``prob`` in [1/k, 1] or ``epsilon``), ``oue``, ``olh`` (``epsilon``), or ``auto``
  (the mechanisms' ``choose_protocol(k, ε)``).
- ``rappor``: strings through RAPPOR [RAPPOR] with Bloom bits ``k``, hashes ``h``, cohorts ``m``,
  permanent RR ``f``, instantaneous RR ``p``/``q``, ``variant`` and the ``candidates`` for decoding.
- ``keyed``: an open set of keys (feature or error names) sent in clear, each with a boolean value
  privatized on the device by RR (``value``); keys and counts are released centrally through the
  thresholded noise mechanism (``release``, [THRESHOLD]), whose sensitivity comes from the bounds
  (Δ0 = ``keys_per_window``, Δ∞ = 1 report per key per window).
- ``regression``: (x, y) pairs from *trusted* sources (sent in clear), released centrally by DP
  Theil-Sen [THEIL-SEN] with ``x_bounds``, ``y_bounds``, ``scale``, ``runs``.

Shuffle mode: a local metric with ``shuffle: {n_min, delta, close_after_s}`` (:class:`ShuffleSpec`) goes through the
gateway's shuffler and carries a central (ε, δ) per window besides its local ε₀ (``metric.shuffle_guarantee()``).

Contribution bounds are per client pseudonym and window (see ``schemas.wire``): ``reports_per_window``
for every kind, ``keys_per_window`` for keyed metrics (and, per window and source partition rather than
per client, ``max_keys_per_partition`` distinct keys, which bounds the agents' state records; default
:func:`default_max_keys_per_partition`). ``budget`` is per metric over the retention
horizon ``window.retention_s``: ``(epsilon, delta)`` or ``(rho, delta)``. For the local kinds the spec
checks at load that the budget covers the local loss of ``reports_per_window * windows_per_horizon``
reports (RAPPOR: per client only for fresh reports, f = 0; memoized variants must say ``guarantee:
client_value``, RAPPOR's longitudinal guarantee, at most ε∞ per client and value); for keyed and regression
metrics the budget is the central one the agents' accountant spends.

What producers and agents read besides the fields (stable names):

- ``spec.metric(name)``; ``metric.fingerprint`` (uint32 carried by every report);
- ``BoolMetric.resolved_prob()``, ``KeyedMetric.value.resolved_prob()``: the RR keep probability;
- ``CategoricalMetric.k``, ``.labels`` (category names or bin labels, index = wire index),
  ``.resolved_protocol()`` (``krr``/``oue``/``olh``: wire payload CATEGORY/UNARY/LOCAL_HASH),
  ``.resolved_epsilon()``;
- ``RapporMetric.params()`` (the mechanism's ``RapporParams``), ``.bits`` (k), ``.candidates``;
- ``metric.horizon_epsilon(reports)`` for local kinds; ``spec.window.windows_per_horizon``.

The mechanisms' own constructors validate the privacy parameters (RR prob in [1/k, 1], RAPPOR's f, p,
q, k, h, m); their ``ParameterError`` becomes the field's problem.

Layout: the shared pieces in :mod:`~schemas.spec.base` (errors, topics, windows, budgets, the fields of every
metric), one module per metric kind (``bool_metric``, ``categorical_metric``, ``rappor_metric``, ``keyed_metric``,
``regression_metric``), and :mod:`~schemas.spec.collection` (the ``Metric`` union, :class:`CollectionSpec`,
:func:`parse_spec`, :func:`load_spec`). Every name is importable from ``schemas.spec``.

Sources cited in brackets ([RAPPOR], [RR], [THEIL-SEN], [THRESHOLD]): docs/references.md.
"""

from __future__ import annotations

from schemas.kinds import MetricKind
from schemas.spec.base import (
    DEFAULT_GRACE_S,
    DEFAULT_RETRY_HORIZON_S,
    FORWARD_DELAY_BOUND_S,
    KEYED_PARTIAL_KEY_BYTES,
    RETRY_HORIZON_RANGE_S,
    SHUFFLE_DELTA_RANGE,
    SHUFFLE_N_MIN_RANGE,
    SPEC_VERSION,
    BudgetSpec,
    RandomizedResponseSpec,
    ShuffleSpec,
    SpecError,
    SpecFieldError,
    TopicsSpec,
    WindowSpec,
    default_max_keys_per_partition,
    keyed_entry_bytes,
)
from schemas.spec.bool_metric import BoolMetric
from schemas.spec.categorical_metric import BinsSpec, CategoricalMetric
from schemas.spec.collection import CENTRAL_KINDS, METRIC_TYPES, CollectionSpec, Metric, load_spec, parse_spec
from schemas.spec.keyed_metric import CapacityWarning, KeyedMetric, ThresholdReleaseSpec
from schemas.spec.rappor_metric import RapporMetric
from schemas.spec.regression_metric import RegressionMetric

__all__ = [
    "CENTRAL_KINDS",
    "DEFAULT_GRACE_S",
    "DEFAULT_RETRY_HORIZON_S",
    "FORWARD_DELAY_BOUND_S",
    "KEYED_PARTIAL_KEY_BYTES",
    "METRIC_TYPES",
    "RETRY_HORIZON_RANGE_S",
    "SHUFFLE_DELTA_RANGE",
    "SHUFFLE_N_MIN_RANGE",
    "SPEC_VERSION",
    "BinsSpec",
    "BoolMetric",
    "BudgetSpec",
    "CapacityWarning",
    "CategoricalMetric",
    "CollectionSpec",
    "KeyedMetric",
    "Metric",
    "MetricKind",
    "RandomizedResponseSpec",
    "RapporMetric",
    "RegressionMetric",
    "ShuffleSpec",
    "SpecError",
    "SpecFieldError",
    "ThresholdReleaseSpec",
    "TopicsSpec",
    "WindowSpec",
    "default_max_keys_per_partition",
    "keyed_entry_bytes",
    "load_spec",
    "parse_spec",
]
