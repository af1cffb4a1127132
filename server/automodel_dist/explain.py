"""Map pasted AutoModel / torch error text back to the rule table (cause and fix)."""

from __future__ import annotations

import re
from functools import lru_cache

from .report import ExplainReport, Explanation
from .rules import RULES


@lru_cache(maxsize=1)
def _compiled() -> list[tuple[str, re.Pattern[str]]]:
    return [(r.id, re.compile(p)) for r in RULES.values() for p in r.patterns]


MAX_TEXT = 200_000


def explain_error(text: str) -> ExplainReport:
    """Find every rule whose known error text appears in ``text`` (a message or a whole traceback)."""
    text = text[-MAX_TEXT:] if len(text) > MAX_TEXT else text
    seen: dict[str, Explanation] = {}
    for rule_id, pattern in _compiled():
        m = pattern.search(text)
        if m and rule_id not in seen:
            r = RULES[rule_id]
            seen[rule_id] = Explanation(rule=rule_id, title=r.title, family=r.family, severity=r.severity,
                                        matched=m.group(0)[:300], cause=r.cause or r.title, fix=r.fix or "")
    report = ExplainReport(matches=list(seen.values()))
    if not report.matches:
        report.hint = ("no known AutoModel/torch distributed error matched; validate the config with "
                       "`automodel-dist validate` and reproduce with `automodel-dist smoke`")
    return report
