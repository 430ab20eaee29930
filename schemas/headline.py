"""One sentence per release a product manager reads without the docs (issue 33 item 6).

``used_dark_mode: 31 % ± 4 % of devices reported true`` -- the estimate in the units of its kind's presentation
(:attr:`schemas.presentation.KindPresentation.headline_unit`), with the half-width of its two-sided interval at the
release's confidence. ``ptel releases`` prints it above each release and the dashboard's overview shows the headline
of each metric's newest window with data. A window without data, a refused window or a keyed window without a
released key says so in words, never as a number.
"""

from __future__ import annotations

from schemas.presentation import presentation_of
from schemas.releases import EstimateRecord, Release

__all__ = ["headline", "plus_minus"]


def _fmt(x: float) -> str:
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def plus_minus(e: EstimateRecord, scale: float = 1.0, suffix: str = "") -> str:
    """``"120 ± 40"`` (the half-width of the interval; without an interval the value alone); ``scale`` multiplies
    both (100 for a percentage)."""
    if e.value is None:
        return "not estimated"
    value = _fmt(e.value * scale) + suffix
    if e.ci_low is None or e.ci_high is None:
        return value
    half = (e.ci_high - e.ci_low) / 2 * scale
    return f"{value} ± {_fmt(half)}{suffix}"


def headline(rel: Release) -> str:
    """The release of one metric and window in one sentence, with its interval (``±`` its half-width)."""
    head = f"{rel.metric}: "
    conf = f"{rel.confidence:.0%} interval"
    if rel.refused is not None:
        return head + "nothing released for this window (refused)"
    if rel.no_data:
        return head + "no data in this window (no reports): nothing estimated"
    shown = presentation_of(rel.kind)
    if shown.series and shown.scale == "fraction":  # bool: the fraction of devices reporting true
        e = next((x for x in rel.estimates if x.label == shown.series[0] and x.value is not None), None)
        if e is None:
            return head + "nothing estimated"
        return head + f"{plus_minus(e, 100, ' %')} {shown.headline_unit} reported true ({conf})"
    if shown.series:  # regression: its coefficients (DP Theil-Sen gives no interval: then none is named)
        coefficients = [e for e in rel.estimates if e.label in shown.series]
        if not coefficients:
            return head + "no fit"
        banded = any(e.ci_low is not None for e in coefficients)
        return head + ", ".join(f"{e.label} {plus_minus(e)}" for e in coefficients) + (f" ({conf})" if banded else "")
    if shown.released_keys:
        keys = sorted(rel.released_keys, key=lambda k: -k.count)
        if not keys:
            return head + "no key released in this window (none above the noisy threshold: unknown, not zero)"
        est = {e.label: e for e in rel.estimates}
        top = keys[0]
        first = plus_minus(est[top.key]) if top.key in est else _fmt(top.count)
        released = f"{len(keys)} key{'s' if len(keys) > 1 else ''} released"
        fields = [(f.heading, getattr(top, f.field, None)) for f in shown.key_fields]  # e.g. value_true
        also = "".join(f", {heading} {plus_minus(e)}" for heading, e in fields if isinstance(e, EstimateRecord))
        return head + f"{released}; most: {top.key!r} {first} {shown.headline_unit}{also} ({conf})"
    estimated = [e for e in rel.estimates if e.value is not None]
    if not estimated:
        return head + f"no {shown.noun} estimated"
    top_e = max(estimated, key=lambda e: e.value or 0.0)
    if shown.undetected_faint:  # RAPPOR: detections among the candidates
        detected = sum(1 for e in rel.estimates if e.significant)
        missing = len(rel.estimates) - len(estimated)
        return head + (
            f"{detected} detected of {len(rel.estimates)} {shown.noun}"
            + (f" ({missing} not estimated)" if missing else "")
            + f"; most: {top_e.label!r} "
            f"{plus_minus(top_e)} {shown.headline_unit} ({conf})"
        )
    if rel.n:  # categorical: the leading category's share of the reports
        return head + f"most reported {top_e.label!r}: {plus_minus(top_e, 100 / rel.n, ' %')} of reports ({conf})"
    return head + f"most: {top_e.label!r} {plus_minus(top_e)} {shown.headline_unit} ({conf})"
