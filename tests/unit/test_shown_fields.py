"""Every estimate a release carries is shown (issue 33 item 2): the fields each kind releases are enumerated from the
records themselves -- every estimate in ``estimates`` and every :class:`~schemas.releases.EstimateRecord` a released
key carries (``KeyRelease.value_true`` today, any such field added later) -- and each must be in the ``ptel releases``
table (value and interval), in the PNG (a legend entry) and in its kind's presentation descriptor, which the
dashboard reads (its drawing: ``tests/integration/test_dashboard_estimates_shown.py``).

Mutation evidence (seen red): the keyed presentation without ``key_fields`` (main before issue 33) -> value_true is
in none of the three.
"""

from __future__ import annotations

from typing import get_args

import pytest

from ptel.commands.releases import format_release
from ptel.release_plot import release_figure
from schemas.kinds import METRIC_KINDS
from schemas.presentation import presentation_of
from schemas.releases import EstimateRecord, KeyRelease, Release
from tests.integration.dashboard_fixture import _release, fixture_spec

#: A window of the fixture with data for every kind (not refused, not empty).
WINDOW = 16


def _estimate_fields() -> list[str]:
    """The fields of a released key that hold an estimate (an ``EstimateRecord``), from the model itself."""
    return [
        name
        for name, info in KeyRelease.model_fields.items()
        if EstimateRecord in (get_args(info.annotation) or (info.annotation,))
    ]


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.0f}"


def _released(kind: str) -> Release:
    spec = fixture_spec()
    metric = next(m for m in spec.metrics if m.kind == kind)
    return _release(spec, metric.name, kind, WINDOW)


def test_estimate_fields_of_a_released_key_are_found() -> None:
    assert _estimate_fields() == ["value_true"]  # the enumeration itself can see the field it is about


@pytest.mark.parametrize("kind", sorted(METRIC_KINDS))
def test_every_released_estimate_is_shown_in_the_table_the_png_and_the_descriptor(kind: str) -> None:
    rel = _released(kind)
    shown = presentation_of(kind)
    table = format_release(rel, None, rows=100)
    fig = release_figure([rel], None)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    # what the record holds, enumerated
    held: list[tuple[str, EstimateRecord]] = [(e.label, e) for e in rel.estimates]
    fields = {f.field for f in shown.key_fields}
    for key in rel.released_keys:
        for name in _estimate_fields():
            e = getattr(key, name)
            if e is None:
                continue
            assert name in fields, f"{kind}: released keys carry {name}, which its presentation does not show"
            held.append((f"{key.key}.{name}", e))
            heading = next(f.heading for f in shown.key_fields if f.field == name)
            assert heading in table.splitlines()[2], f"{kind}: no column for {name}"
            assert any(f"({heading})" in t for t in legend), f"{kind}: {name} not in the PNG legend"
    assert held, kind
    for what, e in held:
        if e.value is None:  # not estimated: said so on its row, never a number
            assert any(what[:27] in line and "not estimated" in line for line in table.splitlines()), what
            continue
        assert _fmt(e.value) in table, f"{kind}: {what} = {e.value} is not in the table"
        if e.ci_low is not None and e.ci_high is not None:
            assert _fmt(e.ci_low) in table and _fmt(e.ci_high) in table, f"{kind}: the interval of {what}"
