"""A saved session as a document: JSON (the messages exactly as they are sent, with every turn's
figures, reasoning and tool calls) or Markdown to read (``localchat sessions export``)."""

from __future__ import annotations

import json

from localchat.conversation.history import context_message, system_first, turn_messages
from localchat.conversation.stats import stats_to_dict
from localchat.store.saved_sessions import SavedSession


def export_json(session: SavedSession) -> str:
    return json.dumps({
        "name": session.name, "model": session.model, "backend": session.backend, "params": session.params,
        "created": session.created, "updated": session.updated,
        "messages": system_first(context_message(session.system, list(session.pins), session.summary),
                                 turn_messages(session.turns)),
        "pins": list(session.pins), "summary": session.summary,
        "turn_stats": [stats_to_dict(t.stats) if t.stats else None for t in session.turns],
        "turn_reasoning": [t.reasoning or None for t in session.turns],
    }, ensure_ascii=False, indent=2)


def export_markdown(session: SavedSession) -> str:
    lines = [f"# {session.name}", "",
             f"model: {session.model or '(server default)'} · backend: {session.backend} · "
             f"saved {session.updated}", ""]
    if session.system:
        lines += ["## System", "", session.system, ""]
    if session.pins:
        lines += ["## Pinned", "", *(f"- {p}" for p in session.pins), ""]
    if session.summary:
        lines += ["## Notes of earlier turns", "", session.summary, ""]
    for i, turn in enumerate(session.turns, 1):
        lines += [f"## Turn {i}", "", *(f"![{p.ref.name}]({p.data_url()})" for p in turn.images),
                  *([""] if turn.images else []), f"**User:** {turn.user}", ""]
        for step in turn.steps:
            for call, result in zip(step.calls, step.results):
                arguments = call["arguments"] if isinstance(call["arguments"], str) else json.dumps(call["arguments"])
                lines += [f"**Tool call:** `{call['name']}({arguments})` → {result}", ""]
        if turn.reasoning:
            lines += ["<details><summary>Reasoning</summary>", "", turn.reasoning, "", "</details>", ""]
        lines += [f"**Assistant:** {turn.assistant}", ""]
    return "\n".join(lines)
