"""Map pasted AutoModel / torch error text back to the rule table (cause and fix)."""

from __future__ import annotations

import re
from functools import lru_cache

from .report import ExplainReport, Explanation
from .rules import RULES


@lru_cache(maxsize=1)
def _compiled() -> list[tuple[str, re.Pattern[str]]]:
    return [(r.id, re.compile(p)) for r in RULES.values() for p in r.patterns]


MAX_TEXT = 2_000_000  # the end of a longer log is read (a job's failure and its aftermath come last); ~0.3 s
MAX_HITS = 1000  # matches of one pattern read for their ranks
_RANK = re.compile(r"^\s*\[rank(\d+)\]:|\[Rank (\d+)\]")


def _line_rank(text: str, pos: int) -> int | None:
    """The rank a log line names: torchrun's ``[rankN]:`` prefix or NCCL's ``[Rank N]``."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    m = _RANK.search(text[start : end if end >= 0 else len(text)])
    return int(m.group(1) or m.group(2)) if m else None


def explain_error(text: str) -> ExplainReport:
    """Find every rule whose known error text appears in ``text`` (a message, a traceback or a whole multi-rank log).
    Root causes come first, in the order they appear; failures that usually follow another rank's (collective
    timeouts, vanished peers) after them. Each says on which line it first matched and which ranks' lines did."""
    text = text[-MAX_TEXT:] if len(text) > MAX_TEXT else text
    matched: dict[str, str] = {}  # rule -> the text its first pattern that matches matched
    first: dict[str, int] = {}  # rule -> earliest position any of its patterns matched at
    ranks: dict[str, set[int]] = {}
    for rule_id, pattern in _compiled():
        for i, m in enumerate(pattern.finditer(text)):
            if i >= MAX_HITS:
                break
            matched.setdefault(rule_id, m.group(0)[:300])
            first[rule_id] = min(first.get(rule_id, m.start()), m.start())
            rank = _line_rank(text, m.start())
            if rank is not None:
                ranks.setdefault(rule_id, set()).add(rank)
    order = sorted(matched, key=lambda rid: (RULES[rid].consequence, first[rid]))
    report = ExplainReport(
        matches=[
            Explanation(
                rule=rid,
                title=RULES[rid].title,
                family=RULES[rid].family,
                severity=RULES[rid].severity,
                matched=matched[rid],
                cause=RULES[rid].cause or RULES[rid].title,
                fix=RULES[rid].fix or "",
                line=text.count("\n", 0, first[rid]) + 1,
                ranks=sorted(ranks.get(rid, ())),
                consequence=RULES[rid].consequence,
            )
            for rid in order
        ]
    )
    if not report.matches:
        report.hint = (
            "no known AutoModel/torch distributed error matched; validate the config with "
            "`automodel-dist validate` and reproduce with `automodel-dist smoke`"
        )
    return report
