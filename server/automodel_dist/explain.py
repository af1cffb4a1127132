"""Map pasted AutoModel / torch error text back to the rule table (cause and fix).

Pasted text rarely matches a message byte for byte: quotes get dropped or turned curly, a colon appears where
the message had none, lines wrap, terminals add colours and logs add ``[rankN]:`` and timestamp prefixes. The
text is normalised line by line (so line numbers stay those of the paste) and every pattern is compiled to
accept those variants (``tolerant``)."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from functools import lru_cache

from .report import ExplainReport, Explanation
from .rules import RULES

MAX_TEXT = 2_000_000  # the end of a longer log is read (a job's failure and its aftermath come last); ~0.3 s
MAX_HITS = 1000  # matches of one pattern read for their ranks
_RANK = re.compile(r"^\s*\[(?:rank|default)(\d+)\]:|\[Rank (\d+)\]")

QUOTES = "'\"`"
_ANY_QUOTE = "[" + QUOTES + "]"
_QUANTIFIER = "*+?{"

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CURLY = str.maketrans({"‘": "'", "’": "'", "‚": "'", "‛": "'", "“": '"', "”": '"', "„": '"', "´": "'"})
_TIME = r"\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
_DATE_TIME = rf"\d{{4}}-\d{{2}}-\d{{2}}[T ]{_TIME}(?:Z|[+-]\d{{2}}:?\d{{2}})?"
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
# What logs put before a message, repeated in any order: torchrun's [rankN]: / [defaultN]:, srun -l's "N: ",
# ISO or bracketed timestamps, glog's "W1202 05:25:54.123456 1234 file.cpp:12]" (bare or in brackets) and
# AutoModel's "%(asctime)s | LEVEL | logger |".
_PREFIX = re.compile(
    r"^(?:[ \t]*(?:"
    r"\[(?:rank|default)\d+\]:"
    r"|\d+: "
    rf"|\[?{_DATE_TIME}\]?(?:[ \t]*\|[ \t]*{_LEVEL}[ \t]*\|[ \t]*[\w.\-]+[ \t]*\|)?"
    rf"|\[{_TIME}\]"
    rf"|{_LEVEL}[ \t]*\|[ \t]*[\w.\-]+[ \t]*\|"
    rf"|\[?[IWEF]\d{{4}} {_TIME}[ \t]+\d+[ \t]+[^\s\]]+:\d+\]"
    r")[ \t]?)+",
    re.M,
)


def _plain(text: str) -> str:
    return _ANSI.sub("", text).translate(_CURLY)


def normalise(text: str) -> str:
    """The text as a pattern reads it: no ANSI escapes, straight quotes, no per-line log prefixes. Every line
    stays one line, so a position's line number is the pasted text's."""
    return _PREFIX.sub("", _plain(text))


def _class_end(pattern: str, start: int) -> int:
    """The index just past the character class that opens at ``start``."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1  # a leading ] is a member
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def tolerant(pattern: str) -> str:
    """``pattern`` rewritten to accept what pasting does to a message: a literal quote matches any quote or none,
    a literal space any run of whitespace (a wrapped line) with an optional colon or comma before it, a literal
    hyphen a line break after it, and a negated class that excludes a quote (a quoted value) stops at whitespace
    too, so the value is found when its quotes are gone."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            if pattern[i + 1] not in QUOTES + " ":
                out.append(pattern[i : i + 2])
                i += 2
                continue
            i += 1
            c = pattern[i]
        if c == "[":
            end = _class_end(pattern, i)
            members = pattern[i:end]
            if members.startswith("[^") and any(q in members for q in QUOTES):
                members = "[^" + QUOTES + r"\s" + members[2:]
            out.append(members)
            i = end
            continue
        quantified = i + 1 < n and pattern[i + 1] in _QUANTIFIER
        if c in QUOTES:
            out.append(_ANY_QUOTE if quantified else _ANY_QUOTE + "?")
        elif c == " ":
            out.append(r"\s" if quantified else r"[:,]?\s+")
        elif c == "-" and not quantified:
            out.append(r"-\s*")
        else:
            out.append(c)
        i += 1
    return "".join(out)


@lru_cache(maxsize=1)
def _compiled() -> list[tuple[str, re.Pattern[str]]]:
    return [(r.id, re.compile(tolerant(p))) for r in RULES.values() for p in r.patterns]


def _rank(line: str) -> int | None:
    """The rank a log line names: torchrun's ``[rankN]:`` prefix or NCCL's ``[Rank N]``."""
    m = _RANK.search(line)
    return int(m.group(1) or m.group(2)) if m else None


# A checkpoint save in AutoModel 0.7.0's log (rank 0's Python logging; base_recipe.save_checkpoint and
# the consolidation backport), and what shows that the save finished or training went on.
_SAVE_STARTS = re.compile(r"Saving checkpoint to (\S+)|Consolidating safetensors files from (\S+)")
_SAVE_ENDS = re.compile(
    r"Successfully exported consolidated HF safetensors|Done consolidating\.|Final checkpoint was saved with"
    r"|^step \d+ \| epoch \d+ \| loss",
    re.M,
)
_WORK = re.compile(r"OpType=(\w+)(?:, NumelIn=(\d+))?(?:, NumelOut=(\d+))?(?:, Timeout\(ms\)=(\d+))?")
STRAGGLER = "runtime-checkpoint-straggler"
_TIMEOUTS = ("runtime-collective-timeout", STRAGGLER)
_OP_READING = {
    "BROADCAST": "OpType=BROADCAST with NumelIn=1 is DCP's final broadcast: the other ranks had sent their part "
    "and waited while rank 0 ran the save's finish(); with single_rank_consolidation that is rank 0 writing the "
    "whole consolidated model",
    "ALLREDUCE": "OpType=ALLREDUCE with NumelIn=1 is a barrier (or AutoModel's checkpoint-lifecycle flag): the "
    "other ranks waited while rank 0 did its own filesystem work (removing a stale directory, pruning old "
    "checkpoints for max_recent_checkpoints, symlinks, metadata, the PEFT adapter)",
    "ALLGATHER": "OpType=ALLGATHER with NumelIn=1 is the size exchange of an object collective (DCP's plan and "
    "gather): some ranks were still writing their shards while the others waited",
}


@dataclass
class _Hit:
    rule: str
    matched: str
    start: int
    ranks: set[int]


def _straggler(text: str, hits: dict[str, _Hit]) -> _Hit | None:
    """A collective timeout that fell inside a checkpoint save: the save's slow ranks, not a failing one."""
    timeouts = [hits[r] for r in _TIMEOUTS if r in hits]
    if not timeouts:
        return None
    first = min(t.start for t in timeouts)
    start = None
    for m in _SAVE_STARTS.finditer(text, 0, first):
        start = m
    if start is None or _SAVE_ENDS.search(text, start.end(), first):
        return None
    ranks = set().union(*(t.ranks for t in timeouts))
    return _Hit(STRAGGLER, start.group(0)[:300], start.start(), ranks)


def _straggler_cause(text: str, hit: _Hit, gloo: bool) -> str:
    parts = [RULES[STRAGGLER].cause]
    work = _WORK.search(text, hit.start)
    if gloo:
        parts.append(
            "Here the ranks gave up in the Gloo consolidation group's synchronisation, after "
            "checkpoint.consolidation_timeout_minutes (30 by default): the ranks with output files to write were "
            "still writing."
        )
    if work:
        op, numel_in, _, timeout_ms = work.groups()
        if numel_in == "1" and op in _OP_READING:
            parts.append(_OP_READING[op] + ".")
        if timeout_ms:
            minutes = int(timeout_ms) / 60_000
            default = " (the recipes' dist_env.timeout_minutes default)" if int(timeout_ms) == 60_000 else ""
            parts.append(f"The NCCL timeout was {minutes:g} min{default}: too short for a save that writes GBs.")
    if hit.ranks:
        parts.append(f"Ranks {sorted(hit.ranks)} timed out waiting; none of them is the cause.")
    return " ".join(parts)


def explain_error(text: str) -> ExplainReport:
    """Find every rule whose known error text appears in ``text`` (a message, a traceback or a whole multi-rank log).
    Root causes come first, in the order they appear; failures that usually follow another rank's (collective
    timeouts, vanished peers) after them. Each says on which line it first matched and which ranks' lines did. A
    collective timeout inside a checkpoint save is explained as the save's straggler first."""
    text = text[-MAX_TEXT:] if len(text) > MAX_TEXT else text
    plain = _plain(text)
    lines = plain.split("\n")  # with their prefixes, for the ranks they name
    clean = _PREFIX.sub("", plain)
    starts = [0] + [m.end() for m in re.finditer("\n", clean)]

    def line_of(pos: int) -> int:
        return bisect.bisect_right(starts, pos)  # 1-based

    hits: dict[str, _Hit] = {}
    for rule_id, pattern in _compiled():
        for i, m in enumerate(pattern.finditer(clean)):
            if i >= MAX_HITS:
                break
            hit = hits.setdefault(rule_id, _Hit(rule_id, m.group(0)[:300], m.start(), set()))
            if m.start() < hit.start:
                hit.start = m.start()
            rank = _rank(lines[line_of(m.start()) - 1])
            if rank is not None:
                hit.ranks.add(rank)
    straggler = _straggler(clean, hits)
    causes: dict[str, str] = {}
    if straggler is not None:
        gloo = STRAGGLER in hits
        if gloo:
            straggler.ranks |= hits[STRAGGLER].ranks
        hits[STRAGGLER] = straggler
        causes[STRAGGLER] = _straggler_cause(clean, straggler, gloo)
    order = sorted(hits, key=lambda rid: (RULES[rid].consequence, hits[rid].start))
    report = ExplainReport(
        matches=[
            Explanation(
                rule=rid,
                title=RULES[rid].title,
                family=RULES[rid].family,
                severity=RULES[rid].severity,
                matched=hits[rid].matched,
                cause=causes.get(rid) or RULES[rid].cause or RULES[rid].title,
                fix=RULES[rid].fix or "",
                line=line_of(hits[rid].start),
                ranks=sorted(hits[rid].ranks),
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
