"""What one load run measured: a record per request, and the figures made from them.

The per-request figures come from the one clock (``TurnClock``) every chat turn uses: TTFT to the
first token of any kind, TTFA to the first answer token, ITL the gaps between streamed chunks,
TPOT = (end-to-end − TTFT) / (output tokens − 1), end-to-end from submit to the last byte.
Percentiles are ``conversation.stats.percentiles`` (nearest rank), as in bench.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from localchat.conversation.stats import percentiles
from localchat.conversation.turn import TurnResult, TurnStatus

OK_STATUSES = {TurnStatus.COMMITTED.value, TurnStatus.NOT_KEPT.value, TurnStatus.CUT.value,
               TurnStatus.EMPTY.value, TurnStatus.INVALID.value,
               TurnStatus.UNRENDERABLE.value}  # the server answered in full
ERROR_KINDS = (  # (what the one-line error starts with or contains, its kind)
    ("cannot connect", "connect"), ("made no progress", "timeout"), ("sent nothing", "timeout"),
    ("closed the connection", "disconnected"), ("ended before the reply finished", "cut-stream"),
    ("HTTP 5", "http-5xx"), ("HTTP 4", "http-4xx"), ("the server reported an error", "server-error"),
)


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, record: RequestRecord) -> bool:
        if not record.ok:
            return False
        ttft_ok = self.ttft_s is None or (record.ttft_s is not None and record.ttft_s <= self.ttft_s)
        tpot_ok = self.tpot_s is None or record.tpot_s is None or record.tpot_s <= self.tpot_s
        return ttft_ok and tpot_ok


@dataclass(frozen=True)
class RequestRecord:
    users: int  # concurrency of the run
    history: bool
    user: int
    conversation: int
    turn: int
    started_s: float  # since the run began
    status: str  # TurnStatus, or "interrupted" once the run was stopped
    error_kind: str | None
    error: str | None
    ttft_s: float | None
    ttfa_s: float | None
    itl_median_s: float | None
    tpot_s: float | None
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    estimated: bool
    scored: bool
    correct: bool | None
    compaction_tokens: int = 0  # a summary call before this request (its prompt and completion)
    tool_rounds: int = 0  # model rounds that ended in tool calls before the answer
    tool_s: float = 0.0  # inside the tools, apart from model time
    tool_prompt_tokens: int = 0  # what the calls and their results add to the answer's prompt

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES


def error_kind(message: str | None) -> str:
    text = message or ""
    return next((kind for needle, kind in ERROR_KINDS if needle in text), "other")


def request_record(result: TurnResult, *, users: int, history: bool, user: int, conversation: int, turn: int,
                   started_s: float, correct: bool | None, scored: bool, stopped: bool) -> RequestRecord:
    s = result.stats
    status = result.status.value
    if status in (TurnStatus.ERROR.value, TurnStatus.INTERRUPTED.value) and stopped:
        status = "interrupted"
    failed = status not in OK_STATUSES
    tpot = (
        (s.total_s - s.ttft_s) / (s.completion_tokens - 1) if s.ttft_s is not None and s.completion_tokens > 1 else None
    )
    gaps = sorted(result.token_gaps_s)
    return RequestRecord(
        users=users, history=history, user=user, conversation=conversation, turn=turn, started_s=started_s,
        status=status, error_kind=(error_kind(result.error) if status == "error" else status) if failed else None,
        error=result.error, ttft_s=s.ttft_s, ttfa_s=s.ttfa_s if s.thought else None,
        itl_median_s=gaps[len(gaps) // 2] if gaps else None, tpot_s=tpot, e2e_s=s.total_s,
        prompt_tokens=s.prompt_tokens, cached_tokens=s.cached_tokens, completion_tokens=s.completion_tokens,
        reasoning_tokens=s.reasoning_tokens, estimated=s.estimated, scored=scored,
        correct=correct if not failed else None, compaction_tokens=_summary_tokens(result),
        tool_rounds=len(result.steps), tool_s=result.tool_s,
        tool_prompt_tokens=result.tool_prompt_tokens)


def _summary_tokens(result: TurnResult) -> int:
    summary = result.compaction.result if result.compaction else None
    return summary.stats.prompt_tokens + summary.stats.completion_tokens if summary else 0


def summarize(records: list[RequestRecord], gaps: list[float], wall_s: float, slo: Slo) -> dict:
    """The figures of one run (one concurrency, one history setting)."""
    ok = [r for r in records if r.ok]
    scored = [r for r in ok if r.scored]
    tokens = sum(r.completion_tokens for r in ok)
    per_user: Counter[int] = Counter()
    for r in ok:
        per_user[r.user] += r.completion_tokens
    good = [r for r in records if slo.met(r)]
    return {
        "requests": len(records), "ok": len(ok),
        "errors": dict(Counter(r.error_kind for r in records if not r.ok)),
        "wall_s": wall_s,
        "request_rate": len(ok) / wall_s if wall_s else None,
        "output_tokens": tokens,
        "output_tps": tokens / wall_s if wall_s else None,
        "output_tps_per_user": {str(u): n / wall_s for u, n in sorted(per_user.items())} if wall_s else {},
        "ttft_s": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        "ttfa_s": percentiles([r.ttfa_s for r in ok if r.ttfa_s is not None]),
        "itl_s": percentiles(gaps),
        "tpot_s": percentiles([r.tpot_s for r in ok if r.tpot_s is not None]),
        "e2e_s": percentiles([r.e2e_s for r in ok]),
        "goodput": {"requests": len(good), "rate": len(good) / wall_s if wall_s else None,
                    "share": len(good) / len(records) if records else None,
                    "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s},
        "accuracy": {"correct": sum(bool(r.correct) for r in scored), "scored": len(scored),
                     "rate": sum(bool(r.correct) for r in scored) / len(scored) if scored else None},
        "by_turn": by_turn(ok),
        "compactions": {"calls": sum(r.compaction_tokens > 0 for r in records),
                        "tokens": sum(r.compaction_tokens for r in records)},
        "estimated_counts": any(r.estimated for r in ok),
        "tools": {"rounds": sum(r.tool_rounds for r in records), "seconds": sum(r.tool_s for r in records),
                  "prompt_tokens_per_request": sum(r.tool_prompt_tokens for r in ok) / len(ok) if ok else None},
    }


def by_turn(records: list[RequestRecord]) -> dict[str, dict]:
    """Prompt and cached tokens by turn index: the prefix-cache hit rate as history grows."""
    turns: dict[int, list[RequestRecord]] = {}
    for r in records:
        turns.setdefault(r.turn, []).append(r)
    table = {}
    for n, rs in sorted(turns.items()):
        prompt, cached = sum(r.prompt_tokens for r in rs), sum(r.cached_tokens for r in rs)
        table[str(n)] = {"requests": len(rs), "prompt_tokens_mean": prompt / len(rs),
                         "cached_tokens_mean": cached / len(rs), "hit_rate": cached / prompt if prompt else None}
    return table
