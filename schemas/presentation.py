"""How the releases of each metric kind are shown: one descriptor per kind, read by ``ptel releases`` (its table and
``--plot``) and served as JSON by the monitor (``/api/overview/`` and ``/api/stream/``: each metric's
``presentation``), so the dashboard's script names no kind.

A descriptor says what a release's estimates are (:attr:`KindPresentation.scale`: a fraction in [0, 1], a count of
at least 0 -- a negative estimate is noise around a small count --, or a coefficient anywhere), which series are
drawn over the windows (fixed labels, or the largest estimates), and the words that go with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Literal

from schemas.errors import SchemaError
from schemas.kinds import METRIC_KINDS

__all__ = ["PRESENTATIONS", "KeyField", "KindPresentation", "presentation_of"]


@dataclass(frozen=True)
class KeyField:
    """An estimate a released key carries besides its count (``KeyRelease.<field>``, an ``EstimateRecord``), shown
    beside the key in the table, the dashboard's window panel and the PNG."""

    #: The field of :class:`schemas.releases.KeyRelease` holding the estimate (e.g. ``value_true``).
    field: str
    #: A short heading ("value true").
    heading: str
    #: What it is, for a legend.
    legend: str


@dataclass(frozen=True)
class KindPresentation:
    """What differs in how the releases of one metric kind are shown."""

    #: ``fraction`` (clamped to [0, 1]), ``count`` (clamped at 0) or ``coefficient`` (anywhere; a rule at 0).
    scale: Literal["fraction", "count", "coefficient"]
    #: The value axis' label on the dashboard.
    axis_label: str
    #: The value axis' label in ``ptel releases --plot``.
    plot_axis_label: str
    #: The labels drawn over the windows, always the same; empty: the largest estimates (ranked).
    series: tuple[str, ...] = ()
    #: What the fixed :attr:`series` are, for a legend ("the fitted slope and intercept").
    series_legend: str = ""
    #: What the chosen window's panel shows, for a fixed-series kind ("Dots: the fitted coefficients").
    panel_legend: str = ""
    #: What the ranked estimates are, plural ("categories", "candidates", "keys").
    noun: str = ""
    #: The one row of the chosen window's panel (its label, then the estimate labels it reads, first found);
    #: ``None``: one row per estimate.
    panel_row: tuple[str, tuple[str, ...]] | None = None
    #: Order of the panel's rows: ``fixed`` (as released), ``labels`` (as released unless too many to show, then by
    #: value) or ``value`` (largest first).
    order: Literal["fixed", "labels", "value"] = "value"
    #: Estimates exist only for released keys (a noisy threshold): a missing estimate is "not released", never 0;
    #: the series are the keys with the largest total over the windows.
    released_keys: bool = False
    #: An estimate marked not significant (``significant`` false) is an undetected candidate: drawn faint.
    undetected_faint: bool = False
    #: Said after "no data" (a window without reports estimates nothing), e.g. ", no fit".
    no_data_note: str = ""
    #: The estimates each released key carries besides its count (keyed: the debiased count of its reports whose
    #: value is true, with its interval), shown beside the key everywhere a key is.
    key_fields: tuple[KeyField, ...] = ()
    #: What one headline number of the metric is (``headline``: "of devices" for a fraction, "reports" for a
    #: count); the overview says it in words (:func:`headline`).
    headline_unit: str = ""

    def to_json(self) -> dict[str, Any]:
        """The descriptor as the monitor serves it (tuples as lists)."""
        return asdict(self)


_COUNT_AXIS = "count"

#: The presentation of each metric kind (one line a new kind adds).
PRESENTATIONS: Mapping[str, KindPresentation] = MappingProxyType(
    {
        "bool": KindPresentation(
            scale="fraction",
            axis_label="fraction of clients reporting true",
            plot_axis_label="fraction true",
            series=("true_fraction",),
            series_legend="estimated fraction of clients reporting true",
            panel_legend="Bar: fraction of clients reporting true",
            panel_row=("true", ("true_fraction", "true")),
            headline_unit="of devices",
        ),
        "categorical": KindPresentation(
            scale="count",
            axis_label="estimated reports per category",
            plot_axis_label=_COUNT_AXIS,
            noun="categories",
            order="labels",
            headline_unit="reports",
        ),
        "rappor": KindPresentation(
            scale="count",
            axis_label="estimated reports per candidate",
            plot_axis_label=_COUNT_AXIS,
            noun="candidates",
            undetected_faint=True,
            headline_unit="clients",
        ),
        "keyed": KindPresentation(
            scale="count",
            axis_label="estimated reports per key",
            plot_axis_label=_COUNT_AXIS,
            noun="keys",
            released_keys=True,
            key_fields=(
                KeyField(
                    field="value_true",
                    heading="value true",
                    legend="reports of the key whose value is true (debiased, with its interval)",
                ),
            ),
            headline_unit="reports",
        ),
        "regression": KindPresentation(
            scale="coefficient",
            axis_label="coefficient (y per unit of x; intercept in y)",
            plot_axis_label="coefficient",
            series=("slope", "intercept"),
            series_legend="the fitted slope and intercept",
            panel_legend="Dots: the fitted coefficients",
            order="fixed",
            no_data_note=", no fit",
            headline_unit="",
        ),
    }
)

if set(PRESENTATIONS) != set(METRIC_KINDS):  # pragma: no cover - a kind added to one table and not the other
    raise SchemaError(f"presentations {sorted(PRESENTATIONS)} differ from the metric kinds {sorted(METRIC_KINDS)}")


def presentation_of(kind: str) -> KindPresentation:
    """The presentation of metric kind ``kind``; an unknown kind is an error, never a fallback."""
    presentation = PRESENTATIONS.get(kind)
    if presentation is None:
        raise SchemaError(f"no presentation for metric kind {kind!r} (known: {sorted(PRESENTATIONS)})")
    return presentation
