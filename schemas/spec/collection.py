"""A whole collection spec (:class:`CollectionSpec`, the union :data:`Metric` of the metric kinds) and the
entry points that read one (:func:`parse_spec`, :func:`load_spec`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    Field,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from mechanisms.core.directed import mul_up
from mechanisms.core.errors import MechanismError, ParameterError
from schemas.kinds import METRIC_KINDS
from schemas.kinds import MetricKind as MetricKind  # re-exported: the spec's name for it
from schemas.spec.base import (
    _METRIC_NAME,
    Real,
    SpecError,
    SpecFieldError,
    TopicsSpec,
    WindowSpec,
    _Frozen,
)
from schemas.spec.bool_metric import BoolMetric
from schemas.spec.categorical_metric import CategoricalMetric
from schemas.spec.keyed_metric import KeyedMetric
from schemas.spec.rappor_metric import RapporMetric
from schemas.spec.regression_metric import RegressionMetric

#: The one union of the spec's metric types (the registry of metric kinds on the spec side: one member a kind).
Metric = Annotated[
    BoolMetric | CategoricalMetric | RapporMetric | KeyedMetric | RegressionMetric,
    Field(discriminator="kind"),
]

#: The metric types of :data:`Metric`, in its order.
METRIC_TYPES: tuple[type[Metric], ...] = get_args(get_args(Metric)[0])

#: The metric kinds released with central noise (``CENTRAL``): their ε is an add/remove ε.
CENTRAL_KINDS: frozenset[str] = frozenset(
    get_args(cls.model_fields["kind"].annotation)[0] for cls in METRIC_TYPES if cls.CENTRAL
)


class CollectionSpec(_Frozen):
    """A whole collection spec: topics, windows, the confidence level of intervals and the metrics."""

    version: Literal[1] = 1
    name: Annotated[StrictStr, Field(pattern=_METRIC_NAME)] = "ptel"
    topics: TopicsSpec = TopicsSpec()
    window: WindowSpec
    #: Confidence level of the intervals the agents publish with each estimate.
    confidence: Real = 0.95
    metrics: tuple[Metric, ...]

    @field_validator("confidence")
    @classmethod
    def _confidence(cls, v: float) -> float:
        if not 0.5 <= v < 1.0:
            raise ValueError("must be in [0.5, 1)")
        return v

    @model_validator(mode="after")
    def _unique(self) -> CollectionSpec:
        if not self.metrics:
            raise SpecFieldError("metrics", "must list at least one metric")
        seen: dict[str, int] = {}
        for i, metric in enumerate(self.metrics):
            self._check_local_budget(i, metric)
            self._check_shuffle_close(i, metric)
            if metric.name in seen:
                raise SpecFieldError(
                    f"metrics[{i}].name", f"duplicate metric name {metric.name!r} (also metrics[{seen[metric.name]}])"
                )
            seen[metric.name] = i
        return self

    def _check_local_budget(self, i: int, metric: Any) -> None:
        """A metric's budget must cover its loss over the retention horizon.

        Local kinds: the local loss of ``reports_per_window * windows_per_horizon`` reports. Keyed and
        regression metrics: one central release per window, composed over the windows of the horizon
        (basic composition: ε, ρ and δ add up), at the cost :meth:`KeyedMetric.window_cost` /
        :meth:`RegressionMetric.window_cost` computes with the mechanisms' own privacy maps.
        """
        budget = metric.budget
        if budget is None:
            return
        if metric.CENTRAL:
            self._check_central_budget(i, metric)
            return
        if budget.epsilon is None:
            raise SpecFieldError(f"metrics[{i}].budget.rho", "local metrics spend ε: give budget.epsilon")
        reports = metric.reports_per_window * self.window.windows_per_horizon
        loss = metric.horizon_epsilon(reports)
        # RAPPOR's longitudinal guarantee is per client and value (RapporMetric.guarantee): say so
        unit = "per client and value" if getattr(metric, "guarantee", "client") == "client_value" else "per client"
        if loss > budget.epsilon:
            raise SpecFieldError(
                f"metrics[{i}].budget.epsilon",
                f"the local loss over the retention horizon ({reports} reports {unit}) is {loss:.4g}, "
                f"above the budget {budget.epsilon}",
            )

    def _check_shuffle_close(self, i: int, metric: Metric) -> None:
        """A shuffled metric's window closes at its end plus ``close_after_s``, and its batch must be in Kafka before
        the window's grace ends: ``1 <= close_after_s <= window.grace_s - 1``."""
        if metric.shuffle is None:
            return
        most = self.window.grace_s - 1
        where = f"metrics[{i}].shuffle.close_after_s"
        if most < 1:
            raise SpecFieldError(
                where,
                f"needs window.grace_s of at least 2 (it is {self.window.grace_s}): the shuffler closes a window "
                "after its end and must forward its batch before the grace ends",
            )
        if not 1 <= metric.shuffle.close_after_s <= most:
            raise SpecFieldError(where, f"must be whole seconds in [1, window.grace_s - 1 = {most}]")

    def _check_central_budget(self, i: int, metric: Metric) -> None:
        budget = metric.budget
        if budget is None:
            return
        where = f"metrics[{i}].{metric.COST_FIELD}"
        try:
            unit, first, delta = metric.window_cost()
        except (MechanismError, ArithmeticError) as err:  # e.g. a map that overflows for extreme parameters
            raise SpecFieldError(where, f"the mechanism's privacy map cannot be evaluated: {err}") from err
        given = budget.epsilon if unit == "epsilon" else budget.rho
        if given is None:
            other = "rho" if unit == "epsilon" else "epsilon"
            raise SpecFieldError(f"metrics[{i}].budget.{other}", f"this release spends {unit}: give budget.{unit}")
        windows = self.window.windows_per_horizon
        try:
            total, total_delta = mul_up(windows, first), mul_up(windows, delta)  # toward the larger loss
        except (MechanismError, ArithmeticError):  # the horizon's loss is past the largest float
            raise SpecFieldError(
                f"metrics[{i}].budget.{unit}",
                f"{windows} releases over the retention horizon spend {unit} = {windows} x {first:.4g} (per window), "
                f"beyond any budget: raise the release's scale",
            ) from None
        if total > given:
            raise SpecFieldError(
                f"metrics[{i}].budget.{unit}",
                f"{windows} releases over the retention horizon spend {unit} = {total:.4g} "
                f"({first:.4g} per window), above the budget {given}",
            )
        if total_delta > budget.delta:
            raise SpecFieldError(
                f"metrics[{i}].budget.delta",
                f"{windows} releases over the retention horizon spend delta = {total_delta:.3g} "
                f"({delta:.3g} per window), above the budget {budget.delta}",
            )

    def metric(self, name: str) -> Metric:
        """The metric called ``name`` (``KeyError`` if none)."""
        for metric in self.metrics:
            if metric.name == name:
                return metric
        raise KeyError(name)


# --------------------------------------------------------------------------------------------------
# loading


def _path_of(loc: Sequence[int | str]) -> str:
    """pydantic's ``('metrics', 2, 'categorical', 'prob')`` -> ``metrics[2].prob``."""
    out = ""
    kinds = set(METRIC_KINDS)
    prev_was_metric_index = False
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            prev_was_metric_index = out.startswith("metrics")
            continue
        if prev_was_metric_index and part in kinds:  # discriminated-union tag, not a field
            prev_was_metric_index = False
            continue
        prev_was_metric_index = False
        out += ("." if out else "") + part
    return out


def _reason(error: Mapping[str, Any]) -> tuple[str, str]:
    """Extra path suffix and reason for one pydantic error."""
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, SpecFieldError):
        return cause.field, cause.reason
    if isinstance(cause, ParameterError):
        return cause.name, cause.requirement
    kind = error["type"]
    if kind == "extra_forbidden":
        return "", "unknown field"
    if kind == "missing":
        return "", "required field is missing"
    if kind == "union_tag_invalid":
        return "kind", f"unknown kind {ctx.get('tag')!r} (expected one of {ctx.get('expected_tags')})"
    if kind == "union_tag_not_found":
        return "kind", "required field is missing"
    msg = str(error["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return "", msg[:1].lower() + msg[1:]


def parse_spec(data: object, source: str = "<spec>") -> CollectionSpec:
    """Validate an already-parsed document (a mapping) into a :class:`CollectionSpec`; raise :class:`SpecError`."""
    if not isinstance(data, Mapping):
        raise SpecError(source, [("", "the document must be a mapping at its top level")])
    try:
        return CollectionSpec.model_validate(data)
    except (TypeError, ArithmeticError, MechanismError) as err:
        # Defence in depth: validators turn every expected problem into a field error; anything else a
        # mechanism raises on extreme parameters is still a bad spec, reported, never a crash.
        raise SpecError(source, [("", f"{type(err).__name__}: {err}")]) from None
    except ValidationError as err:
        problems: list[tuple[str, str]] = []
        for e in err.errors(include_url=False):
            base = _path_of(e["loc"])
            extra, reason = _reason(e)
            path = (
                ".".join(p for p in (base, extra) if p)
                if extra and not extra.startswith("metrics[")
                else (extra or base)
            )
            problems.append((path, reason))
        raise SpecError(source, problems) from None


def load_spec(path: str | Path) -> CollectionSpec:
    """Read and validate a YAML (``.yaml``/``.yml``) or TOML (``.toml``) spec; raise :class:`SpecError`."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as err:
        raise SpecError(str(p), [("", f"cannot read the file: {err.strerror or err}")]) from None
    try:
        if p.suffix.lower() == ".toml":
            data: object = tomllib.loads(text.decode("utf-8"))
        else:
            data = yaml.safe_load(text)
    except UnicodeDecodeError as err:
        raise SpecError(str(p), [("", f"not UTF-8 text: {err.reason} at byte {err.start}")]) from None
    except tomllib.TOMLDecodeError as err:
        raise SpecError(str(p), [("", f"TOML syntax error: {err}")]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(str(p), [("", f"YAML syntax error{where}: {problem}")]) from None
    return parse_spec(data, str(p))
