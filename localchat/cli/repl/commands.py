"""The REPL's ``/`` commands. Nothing here is sent to the model except by ``/retry`` and
``/compact``; every change to the history goes through the session and its history builder.
Bad arguments are one line (usage or the reason), and the REPL goes on."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from localchat.cli.figures import saved_line
from localchat.conversation.attachment import read_attachment
from localchat.conversation.compaction import compact
from localchat.conversation.settings import DEFAULT_KEEP
from localchat.errors import LocalchatError, UsageError
from localchat.sampling import SETTINGS, parse_setting
from localchat.wording import count

if TYPE_CHECKING:
    from localchat.cli.repl.loop import ReplLoop as Repl


@dataclass(frozen=True)
class Command:
    name: str
    usage: str  # the argument, as /help shows it
    summary: str
    run: Callable[[Repl, str], bool]  # False: leave the REPL


def _history(repl: Repl, _: str) -> bool:
    conversation = repl.session.conversation
    messages = conversation.messages()
    repl.ui.messages(messages, f"history: {count(len(messages), 'message')}", conversation.picture_labels())
    if conversation.fold_system and conversation.system:
        repl.ui.info("this model's template takes no system message: it is sent at the head of the first "
                     "user message")
    return True


def _preview(repl: Repl, arg: str) -> bool:
    if not arg:
        repl.ui.error("usage: /preview TEXT")
        return True
    session = repl.session
    messages = session.preview(repl.attachment.into(arg) if repl.attachment else arg)
    tokens = session.count(messages)
    counted = f", {count(tokens, 'token')}" if tokens is not None else ""
    repl.ui.messages(messages, f"preview: {count(len(messages), 'message')}{counted} (history unchanged)",
                     session.conversation.picture_labels())
    return True


def _reset(repl: Repl, _: str) -> bool:
    repl.session.conversation.reset()
    kept = " and pins" if repl.session.conversation.pins else ""
    repl.ui.info(f"history and notes cleared (system message{kept} kept)")
    return True


def _retry(repl: Repl, _: str) -> bool:
    result = repl.turn(lambda: repl.session.retry(repl.ui.listeners(), repl.ui.compaction))
    if result is not None and result.committed:
        repl.taken_back += 1  # the old answer leaves the kept conversation (the log keeps it, marked)
    if result is not None:
        repl.ui.info("the new answer replaced the old one, which is gone (/undo would remove this whole turn)"
                     if result.committed else "kept the old answer: the new one was not kept (see above)")
    return True


def _undo(repl: Repl, _: str) -> bool:
    turn = repl.session.conversation.take_back()
    repl.taken_back += 1
    left = len(repl.session.conversation.turns)
    repl.ui.info(f"took back the last turn ({_short(turn.user)}); {count(left, 'turn')} left")
    return True


def _load(repl: Repl, arg: str) -> bool:
    """``/load FILE``: the file's text goes into the next message; ``/load`` alone drops it."""
    if not arg:
        if repl.attachment is None:
            raise UsageError("usage: /load FILE (its text goes into your next message)")
        repl.ui.info(f"dropped {repl.attachment.name}")
        repl.attachment = None
        return True
    try:
        names = shlex.split(arg)
    except ValueError as exc:
        raise UsageError(f"/load: {exc} (quote a name with spaces: /load \"my notes.md\")") from None
    if len(names) != 1:
        raise UsageError("usage: /load FILE (one file; quote a name with spaces)")
    attachment = read_attachment(names[0], repl.session.trim.max_input_chars)
    message = [{"role": "user", "content": attachment.text}]
    tokens = repl.session.count(message)
    counted = f", {count(tokens, 'token')}" if tokens is not None else ""
    repl.attachment = attachment
    repl.ui.info(f"loaded {attachment.name}: {count(len(attachment.text), 'character')}{counted}; it goes into "
                 "your next message (/load alone drops it)")
    return True


def _image(repl: Repl, arg: str) -> bool:
    """``/image FILE``: a picture for the next message; ``/image`` alone drops the attached ones."""
    from localchat.cli.images import attach, check_backend_sees, read_pictures

    conversation = repl.session.conversation
    if not arg:
        if not conversation.attached:
            raise UsageError("usage: /image FILE (a picture for your next message)")
        repl.ui.info(f"dropped {count(len(conversation.attached), 'picture')}")
        conversation.attached = ()
        return True
    try:
        names = shlex.split(arg)
    except ValueError as exc:
        raise UsageError(f"/image: {exc} (quote a name with spaces: /image \"my photo.png\")") from None
    if len(names) != 1 or names[0] == "-":
        raise UsageError("usage: /image FILE (one file; quote a name with spaces)")
    pictures = read_pictures((names[0],), None, "/image")
    check_backend_sees(repl.session.backend)
    attach(repl.session, pictures, lambda line: repl.ui.info(f"{line}; it goes with your next message "
                                                              "(/image alone drops it)"))
    return True


def _copy(repl: Repl, _: str) -> bool:
    from localchat.cli.clipboard import copy_to_clipboard

    if not repl.last_answer:
        raise UsageError("nothing to copy yet: no answer in this session")
    tool = copy_to_clipboard(repl.last_answer)
    repl.ui.info(f"copied the last answer ({count(len(repl.last_answer), 'character')}) with {tool}")
    return True


def _set(repl: Repl, arg: str) -> bool:
    """``/set NAME VALUE`` for the sampling settings and the system message; ``/set`` shows them."""
    session = repl.session
    name, _, value = arg.partition(" ")
    names = ", ".join([*SETTINGS, "system"])
    if not name:
        params = session.params
        shown = [f"{key} {'off' if getattr(params, key) is None else getattr(params, key)}" for key in SETTINGS]
        system = session.conversation.system
        repl.ui.info(" · ".join([*shown, f"system {_short(system, 60)!r}" if system else "system none"]))
        return True
    if name not in SETTINGS and name != "system":
        raise UsageError(f"unknown setting {_short(name)!r}: one of {names}")
    if name == "system":
        system = value.strip()
        session.set_system(None if system in ("", '""', "''") else system)
        repl.ui.info("system message cleared" if session.conversation.system is None else
                     "system message set; it applies from the next turn")
        return True
    if not value.strip():
        raise UsageError(f"usage: /set NAME VALUE, NAME one of {names}")
    session.params = replace(session.params, **{name: parse_setting(name, value)})
    repl.ui.info(f"{name} {getattr(session.params, name)} from the next turn")
    return True


def _compact(repl: Repl, focus: str) -> bool:
    policy = repl.session.compaction
    done = compact(repl.session, focus, keep=policy.keep if policy else DEFAULT_KEEP,
                   backend=policy.backend if policy else None)
    repl.ui.compaction(done)
    return True


def _uncompact(repl: Repl, _: str) -> bool:
    back = repl.session.conversation.uncompact()
    repl.ui.info(f"restored {count(back, 'turn')}; the notes are gone" if back else
                 "nothing to restore: no compaction in this session (a resumed summary has no turns behind it)")
    return True


def _pin(repl: Repl, text: str) -> bool:
    if not text.strip():
        raise UsageError("usage: /pin TEXT (e.g. /pin the order number is INV-2026-004417)")
    repl.session.pin(text)
    repl.ui.info(f"pinned ({count(len(repl.session.conversation.pins), 'pin')}): trimming and compaction keep it")
    return True


def _pins(repl: Repl, _: str) -> bool:
    pins = repl.session.conversation.pins
    repl.ui.messages([{"role": "pin", "content": p} for p in pins], f"pins: {count(len(pins), 'pin')}")
    return True


def _unpin(repl: Repl, arg: str) -> bool:
    pins = repl.session.conversation.pins
    if not (arg.isascii() and arg.isdigit()) or not 1 <= int(arg) <= len(pins):
        raise UsageError(f"usage: /unpin N, N from 1 to {len(pins)} (see /pins)" if pins else "nothing is pinned")
    repl.ui.info(f"unpinned: {pins.pop(int(arg) - 1)}")
    return True


def _stats(repl: Repl, _: str) -> bool:
    ledger = repl.session.ledger
    repl.ui.ledger(ledger.summary(), ledger.turns[-1] if ledger.turns else None)
    if note := getattr(repl.session.backend, "timing_note", None):
        repl.ui.info(note)
    return True


def _think(repl: Repl, arg: str) -> bool:
    """``/think on|off``: the next turns reason first or answer directly; ``/think N``: at most N
    reasoning tokens (``/think none``: no budget); alone: which it is."""
    session, choices = repl.session, {"on": True, "off": False}
    if arg.strip().lstrip("-").isdigit() or arg.strip() == "none":
        return _think_budget(repl, arg.strip())
    if arg not in choices:
        current = {True: "on", False: "off", None: "the model's default"}[session.params.think]
        budget = session.params.think_budget
        limit = f", at most {budget.tokens} tokens" if budget is not None else ""
        repl.ui.info(f"thinking: {current}{limit} (usage: /think on|off|N|none)")
        return True
    session.params = replace(session.params, think=choices[arg])
    repl.ui.info(f"thinking {arg} from the next turn")
    template = session.backend.template
    said = template.traits.notices(session.backend.model_id, system=False, think=choices[arg]) if template else []
    for notice in said:
        repl.ui.notice(notice.replace("--no-think", "/think off").replace("--think", "/think on"))
    return True


def _think_budget(repl: Repl, arg: str) -> bool:
    from localchat.grammar.think_budget import ThinkBudget, parse_budget

    try:
        tokens = parse_budget(arg)
    except ValueError as exc:
        repl.ui.info(f"{exc} (usage: /think N)")
        return True
    before = repl.session.params.think_budget
    budget = ThinkBudget(tokens=tokens, message=before.message if before else "") if tokens is not None else None
    repl.session.params = replace(repl.session.params, think_budget=budget)
    repl.ui.info(f"thinking budget: {f'{tokens} tokens' if tokens is not None else 'none'} from the next turn")
    return True


def _save(repl: Repl, arg: str) -> bool:
    if repl.saver is None:
        raise UsageError("saving is not available here")
    saved = repl.saver.save(repl.session, arg or None)
    repl.ui.info(saved_line(saved, len(repl.session.conversation.turns)))
    return True


def _tools(repl: Repl, _: str) -> bool:
    """``/tools``: the functions the model may call, with their parameters, where each comes from and
    whether a call asks first."""
    runner = repl.session.tools
    if runner is None:
        repl.ui.info("no tools offered: start with --tools FILE.py (its public functions) or --mcp FILE (MCP servers)")
        return True
    if not runner.specs:
        repl.ui.info("no tools offered: no source offered one (see /mcp)")
    for spec in (s["function"] for s in runner.specs):
        properties = spec["parameters"].get("properties") or {}
        required = spec["parameters"].get("required") or []
        parameters = ", ".join(f"{name}: {schema.get('type', 'any') if isinstance(schema, dict) else 'any'}"
                               + ("" if name in required else "?") for name, schema in properties.items())
        source = runner.source_of(spec["name"])
        where = source.origin(spec["name"]) if source else "?"
        repl.ui.item(f"{spec['name']}({parameters}) — {_short(spec['description'], 120)} [{where}; "
                     f"{runner.approval(spec['name'])}]")
    return True


def _mcp(repl: Repl, _: str) -> bool:
    """``/mcp``: the MCP servers, each with its state, its tools, its pid or URL and its log."""
    runner = repl.session.tools
    hubs = [s for s in (runner.sources if runner else []) if hasattr(s, "servers")]
    if not hubs:
        repl.ui.info("no MCP servers: start with --mcp FILE ({\"mcpServers\": …})")
        return True
    for info in (info for hub in hubs for info in hub.servers()):
        problem = f" — {info.problem}" if info.problem and info.state != "ready" else ""
        log = f" · log {info.log}" if info.log else ""
        repl.ui.info(f"{info.name}: {info.state} · {count(info.tools, 'tool')} · {info.where}{log}{problem}")
    return True


def _help(repl: Repl, _: str) -> bool:
    repl.ui.help([(f"{c.name} {c.usage}".strip(), c.summary) for c in COMMANDS.values()])
    return True


def _quit(repl: Repl, _: str) -> bool:
    return False


def _short(text: str, width: int = 40) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[:width - 1] + "…"


def guarded(run: Callable[[Repl, str], bool]) -> Callable[[Repl, str], bool]:
    """A command whose failure is one line, after which the REPL goes on."""
    def command(repl: Repl, arg: str) -> bool:
        try:
            return run(repl, arg)
        except LocalchatError as exc:  # usage, a store, a template, a clipboard tool
            repl.ui.error(str(exc))
            return True

    return command


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("/history", "", "the accepted messages (system included), numbered", _history),
    Command("/preview", "TEXT", "the exact messages and token count the next request would send", _preview),
    Command("/retry", "", "ask the last question again (the old answer goes only if the new one is kept)", _retry),
    Command("/undo", "", "take back the last turn", _undo),
    Command("/load", "FILE", "put a text file into your next message (its token count shown first)", _load),
    Command("/image", "FILE", "attach a picture to your next message (its size and tokens shown first)", _image),
    Command("/copy", "", "copy the last answer to the clipboard", _copy),
    Command("/set", "[NAME VALUE]", f"change {', '.join(SETTINGS)} or system; alone: show them", _set),
    Command("/reset", "", "forget every turn, keep the system message and pins", _reset),
    Command("/stats", "", "figures for this session", _stats),
    Command("/think", "on|off|N", "let a thinking model reason first, or answer directly; N: at most N tokens",
            _think),
    Command("/compact", "[FOCUS]", "turn all but the last turns into notes (one model call, counted)", _compact),
    Command("/uncompact", "", "put back the turns the notes replaced (while this session is open)", _uncompact),
    Command("/pin", "TEXT", "keep a fact after the system message: trimming and compaction never drop it", _pin),
    Command("/pins", "", "the pinned facts, numbered", _pins),
    Command("/unpin", "N", "forget pinned fact N", _unpin),
    Command("/save", "[NAME]", "save the conversation (resume: localchat chat --resume NAME)", _save),
    Command("/tools", "", "the tools the model may call, where each comes from, and whether it asks first", _tools),
    Command("/mcp", "", "the MCP servers: state, tools, pid or URL, log file", _mcp),
    Command("/help", "", "this list", _help),
    Command("/quit", "", "leave (Ctrl+D too)", _quit),
    Command("/exit", "", "leave", _quit),
)}
COMMANDS = {name: replace(c, run=guarded(c.run)) for name, c in COMMANDS.items()}
