"""HTML pieces that every report shares: the coded insights, fired and silent."""

from __future__ import annotations

import html
from collections.abc import Sequence

from benchfs.analysis.insights import Insight

__all__ = ["insight_html", "insights_html"]


def insight_html(i: Insight) -> str:
    """One fired insight: id, title, (Drishti's codes), evidence, recommendation, trigger."""
    ev = "".join(f"<li>{html.escape(e)}</li>" for e in i.evidence)
    codes = f" <i>Drishti {html.escape(', '.join(i.drishti))}</i>" if i.drishti else ""
    return (
        f'<div class="insight {i.severity}"><b>{i.id}</b> {html.escape(i.title)} '
        f"<i>({i.severity})</i>{codes}<ul>{ev}</ul><p><b>Recommendation:</b> "
        f"{html.escape(i.recommendation)}</p><p class='note'>Trigger: "
        f"{html.escape(i.trigger)}</p></div>"
    )


def insights_html(insights: Sequence[Insight]) -> str:
    """The fired insights in full, then one line for each silent or unevaluated one."""
    fired = "".join(insight_html(i) for i in insights if i.fired) or "<p>No insight fired.</p>"
    silent = "".join(
        f"<li>{i.id} {html.escape(i.title)}: "
        + ("silent" if i.evaluated else f"not evaluated ({html.escape(i.reason)})")
        + "</li>"
        for i in insights
        if not i.fired
    )
    return fired + f'<ul class="silent">{silent}</ul>'
