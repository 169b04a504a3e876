"""The chat page in a real browser: Chromium from Debian's packages driven by Playwright (no browser
download), against ``localchat serve`` with the demo, demo-tools (its ``add`` tool approved in the
page), demo-vision and a model that never stops. One browser for the module; every page checks that
no request left loopback and that the console stayed clean. .ci/run installs Chromium."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from in_process import run_cli
from routed import Serve

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]
REMEMBER = "Remember the code harbor 17. Reply only OK."
RECALL = "What was the code? Reply with the code only."
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

if not CHROMIUM.exists():
    why = "Chromium is not installed (apt-get install chromium; .ci/run installs it)"
    if os.environ.get("CI"):
        raise RuntimeError(why)
    pytest.skip(why, allow_module_level=True)


@pytest.fixture(scope="module")
def rambling_model(tmp_path_factory):
    """A random-weight model that never ends its reply, big enough to take seconds over 512 tokens."""
    from demo.random_model import build_random_model

    return build_random_model(tmp_path_factory.mktemp("models") / "slow-rambling", hidden=384, layers=8,
                              intermediate=1536, heads=6)


@pytest.fixture(scope="module")
def served(tmp_path_factory, rambling_model):
    """The page's serve, with the rambling model in its registry as ``rambling``: 192 tokens a reply
    (a page has no token limit of its own: a registry's default is what it takes)."""
    home = tmp_path_factory.mktemp("web-home")
    models = tmp_path_factory.mktemp("registry") / "models.yaml"
    models.write_text((ROOT / "localchat" / "models.yaml").read_text() + f"""
  - id: rambling
    source: {rambling_model}
    description: a random-weight model that never ends its reply
    family: demo
    defaults: {{temperature: 0.0, max_tokens: 192}}
""")
    serve = Serve(home, "-m", "demo", "-m", "demo-tools", "-m", "demo-vision", "-m", "rambling",
                  "--tools", str(ROOT / "examples" / "tools" / "add.py"), "--results", str(ROOT / "docs"),
                  env={"LOCALCHAT_MODELS": str(models)})
    serve.home = home
    yield serve
    serve.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser, served):
    """A fresh page on the served chat, watched: every request it makes, every console error."""
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    opened = context.new_page()
    opened.requests, opened.errors = [], []
    opened.on("request", lambda r: opened.requests.append(r.url))
    opened.on("console", lambda m: opened.errors.append(m.text) if m.type == "error" else None)
    opened.on("pageerror", lambda e: opened.errors.append(str(e)))
    opened.goto(served.url + "/")
    opened.get_by_test_id("model").locator("option").first.wait_for(state="attached")
    yield opened
    context.close()
    loopback = (served.url, "data:", "blob:")
    assert [u for u in opened.requests if not u.startswith(loopback)] == []
    assert opened.errors == []


def say(page, text: str, *, enter: bool = True) -> str:
    """Send ``text`` and wait for the answer's figures: the answer's text."""
    before = page.get_by_test_id("figures").count()
    page.get_by_test_id("composer").fill(text)
    page.get_by_test_id("composer").press("Enter") if enter else page.get_by_test_id("send").click()
    page.get_by_test_id("figures").nth(before).wait_for()
    return answers(page)[-1]


def answers(page) -> list[str]:
    return [
        m.locator(".body").inner_text().strip()
        for m in page.locator("[data-testid=message][data-role=assistant]").all()
    ]


def localchat(home: Path, *args: str) -> subprocess.CompletedProcess:
    """The terminal's side of a conversation, on the page's data directory: what the two share is
    the directory, not a process (the CLI runs in this one)."""
    return run_cli(home, *args)


def test_two_turns_recall_show_their_figures_and_are_in_the_log(page, served):
    assert say(page, REMEMBER) == "OK"
    assert say(page, RECALL, enter=False) == "harbor 17"
    figures = page.get_by_test_id("figures").all_inner_texts()
    assert len(figures) == 2 and all(f.startswith("[TTFT") and " in " in f and " out " in f for f in figures)
    assert "cached" in figures[1]
    logged = localchat(served.home, "log", "-q", '"harbor 17"')
    assert logged.returncode == 0 and "harbor 17" in logged.stdout
    page.screenshot(path=str(served.home / "page.png"))
    page.reload()  # the conversation comes back, as history holds it
    page.get_by_test_id("figures").nth(1).wait_for()
    assert answers(page) == ["OK", "harbor 17"]
    assert page.get_by_test_id("conversation").count() >= 1


def test_history_off_forgets(page):
    page.get_by_test_id("history").uncheck()
    say(page, REMEMBER)
    assert say(page, RECALL) == "I don't know."


def test_retry_edit_and_undo_follow_the_terminal(page):
    say(page, REMEMBER)
    page.get_by_test_id("retry").click()
    page.get_by_test_id("figures").first.wait_for()
    page.wait_for_timeout(300)
    assert answers(page) == ["OK"]  # the retried answer replaced the old one: one turn
    page.locator("#edit").click()
    assert page.get_by_test_id("composer").input_value() == REMEMBER
    page.get_by_test_id("composer").fill("Remember the code lantern 42. Reply only OK.")
    page.get_by_test_id("composer").press("Enter")
    page.get_by_test_id("figures").first.wait_for()
    assert say(page, RECALL) == "lantern 42"
    page.get_by_test_id("undo").click()
    page.locator("[data-testid=message]").nth(2).wait_for(state="detached")
    assert page.locator("[data-testid=message][data-role=user]").all_inner_texts() == [
        "Remember the code lantern 42. Reply only OK."]


def test_stop_mid_stream_keeps_nothing(page, served):
    page.get_by_test_id("model").select_option("rambling")
    page.get_by_test_id("composer").fill("Talk forever.")
    page.get_by_test_id("send").click()
    page.locator("[data-role=assistant] .body p").first.wait_for()  # text is streaming
    page.get_by_test_id("stop").click()
    page.get_by_test_id("send").wait_for()
    page.wait_for_timeout(300)
    assert page.locator("[data-testid=message]").count() == 0  # history is unchanged: nothing kept
    assert "not kept (stopped" in page.locator("#notice").inner_text()


def test_a_conversation_started_by_chat_goes_on_in_the_page_and_is_found_by_log(page, served):
    started = localchat(served.home, "chat", REMEMBER)
    assert started.returncode == 0 and started.stdout.strip() == "OK", started.stderr
    page.reload()
    page.get_by_test_id("search").fill("harbor")
    entry = page.get_by_test_id("conversation").first
    entry.wait_for()
    page.get_by_test_id("conversation").filter(has_text="Remember").first.click()
    page.locator("[data-testid=message][data-role=assistant]").first.wait_for()
    assert say(page, RECALL) == "harbor 17"
    shown = localchat(served.home, "log", "-q", '"What was the code"')
    assert shown.returncode == 0 and "What was the code" in shown.stdout


def uid_of(served, text: str) -> str:
    """The id of the conversation the page lists whose first question holds ``text``."""
    return next(c["id"] for c in httpx.get(served.url + "/api/chats", timeout=10).json() if text in c["title"])


def test_terminal_and_page_continue_each_other_and_no_turn_is_written_over(page, served):
    """terminal → page → terminal → page → terminal: every turn kept and seen by the next; the page
    shows what a terminal kept when the conversation is opened again or comes back into view."""
    codes = ["harbor 17", "lantern 42", "meadow 5", "copper 9", "willow 3"]

    def terminal(code: str) -> None:
        uid = served.uid if hasattr(served, "uid") else None
        args = ["--resume", uid] if uid else []
        done = localchat(served.home, "chat", "--backend", "server", "--base-url", served.url + "/v1", "-m", "demo",
                         *args, f"Remember the code {code}. Reply only OK.")
        assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr

    def page_turn(code: str) -> None:
        if code == codes[1]:
            page.goto(served.url + "/#" + served.uid)  # opened
        else:  # the tab comes back into view after the terminal's turn
            page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
        page.locator("[data-testid=message][data-role=user]").nth(len(asked) - 1).wait_for()
        assert page.locator("[data-testid=message][data-role=user]").all_inner_texts() == asked
        say(page, f"Remember the code {code}. Reply only OK.")

    if hasattr(served, "uid"):
        del served.uid
    asked: list[str] = []
    for number, code in enumerate(codes):
        if number % 2 == 0:
            terminal(code)
            if number == 0:
                served.uid = uid_of(served, code)
        else:
            page_turn(code)
        asked.append(f"Remember the code {code}. Reply only OK.")
    page.get_by_test_id("conversation").filter(has_text=codes[0]).first.click()  # opened from the list
    page.locator("[data-testid=message][data-role=user]").nth(4).wait_for()
    assert page.locator("[data-testid=message][data-role=user]").all_inner_texts() == asked
    shown = localchat(served.home, "log", "show", served.uid)
    assert all(code in shown.stdout for code in codes), shown.stdout


def test_a_page_turn_sent_from_a_stale_view_goes_on_from_the_latest_kept_turn(page, served):
    """The page shows one turn, a second terminal keeps another meanwhile: the page's next turn is
    built on both (never written over the terminal's), and the page then shows all three."""
    started = localchat(served.home, "chat", "Remember the code delta 8. Reply only OK.")
    assert started.returncode == 0, started.stderr
    uid = uid_of(served, "delta 8")
    page.goto(served.url + "/#" + uid)
    page.locator("[data-testid=message][data-role=assistant]").first.wait_for()
    second = localchat(served.home, "chat", "--resume", uid, "Remember the code echo 4. Reply only OK.")
    assert second.returncode == 0, second.stderr
    say(page, "Remember the code fox 6. Reply only OK.")
    page.locator("[data-testid=message][data-role=user]").nth(2).wait_for()
    assert page.locator("[data-testid=message][data-role=user]").all_inner_texts() == [
        f"Remember the code {code}. Reply only OK." for code in ("delta 8", "echo 4", "fox 6")]
    shown = localchat(served.home, "log", "show", uid)
    assert all(code in shown.stdout for code in ("delta 8", "echo 4", "fox 6")), shown.stdout
    resumed = localchat(served.home, "chat", "--resume", uid, RECALL)
    assert resumed.returncode == 0 and ": 3 turn(s)" in resumed.stderr, resumed.stdout + resumed.stderr


def test_the_page_approves_a_tool_call(page):
    page.get_by_test_id("model").select_option("demo-tools")
    page.get_by_test_id("composer").fill("What is 12 plus 30?")
    page.get_by_test_id("send").click()
    page.get_by_test_id("tool-approve").click()
    page.get_by_test_id("figures").first.wait_for()
    assert "42" in answers(page)[-1]
    assert page.locator("details.folded summary").filter(has_text="tool call: add").count() >= 1


def test_a_picture_with_demo_vision(page):
    page.get_by_test_id("model").select_option("demo-vision")
    page.locator("#attach").set_input_files(str(ROOT / "examples" / "images" / "red-circle.png"))
    page.locator("img.thumb").wait_for()
    assert say(page, "What is in the picture?") == "a red circle"
    assert "red-circle" in page.locator(".picture-label").first.inner_text() or page.locator(".picture-label").count()


def test_markup_from_users_and_stored_answers_is_shown_as_text(page, served):
    from localchat.conversation.history import Turn
    from localchat.store.saved_sessions import SavedSession, SessionStore

    hostile = ('<img src=x onerror="document.title=\'pwned\'"> <script>document.title="pwned"</script> '
               '[x](javascript:alert(1))')
    stored = hostile + "\n\n```python\nprint('<b>hi</b>')\n```\n\n**bold** and [a link](https://example.org)"
    store = SessionStore(served.home / "sessions.sqlite3")
    store.save(SavedSession(name=None, uid="20990101-000000-beef", model="demo", backend="server", system=None,
                            params={}, turns=(Turn(hostile, stored),)), log=(Turn(hostile, stored),))
    page.goto(served.url + "/#20990101-000000-beef")
    page.locator("[data-testid=message][data-role=assistant]").first.wait_for()
    say(page, hostile)
    assert page.locator(".message img, .message script, .message a[href^=javascript], .message b").count() == 0
    assert page.locator(".message pre code").first.inner_text() == "print('<b>hi</b>')"  # a code block, as text
    assert page.locator(".message strong").first.inner_text() == "bold"
    link = page.locator(".message a").first
    assert link.get_attribute("href") == "https://example.org" and link.get_attribute("rel") == "noopener noreferrer"
    assert "onerror" in page.locator("[data-role=user]").first.inner_text()
    assert "<script>" in page.locator("[data-role=assistant] .body").first.inner_text()
    assert page.title() == "localchat"
    headers = httpx.get(served.url + "/", headers={"accept": "text/html"}).headers
    assert "script-src 'self'" in headers["content-security-policy"] and "unsafe-inline" not in headers[
        "content-security-policy"]


def test_system_and_temperature_are_the_conversations_own(page, served):
    """The temperature's answer arriving while the system prompt is being typed (a busy server) does
    not undo the typing: what is saved is what was typed."""
    say(page, REMEMBER)
    uid = page.evaluate("() => location.hash.slice(1)")
    assert page.locator("#system").input_value() == "You are a helpful assistant."  # the model's default, shown
    held = []
    page.route("**/api/chats/*", lambda route: held.append(route) if route.request.method == "PATCH" and
               "temperature" in (route.request.post_data or "") else route.continue_())
    page.locator("#temperature").fill("0.7")
    page.locator("#temperature").press("Tab")
    deadline = time.monotonic() + 30
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    page.locator("#system-box summary").click()
    page.locator("#system").fill("You are terse.")
    with page.expect_response(lambda response: response.request.method == "PATCH"):
        held[0].continue_()  # the temperature's answer comes now, mid-edit
    # (a routed request waits for its handler, and the sync API runs handlers only inside its own calls:
    # left routed, a PATCH sent after the click returned would wait for ever behind a time.sleep)
    page.unroute("**/api/chats/*")
    with page.expect_response(lambda response: response.request.method == "PATCH") as saved:
        page.locator("#system-save").click()
    assert saved.value.ok
    shown = httpx.get(f"{served.url}/api/chats/{uid}").json()
    assert shown["temperature"] == 0.7 and shown["system"] == "You are terse." and len(shown["turns"]) == 1
    assert page.locator("#system").input_value() == "You are terse."
    from localchat.store.saved_sessions import SessionStore

    kept = SessionStore(served.home / "sessions.sqlite3").load(uid)  # the conversation's own: kept, not only live
    assert (kept.system, kept.params["temperature"]) == ("You are terse.", 0.7)


def test_a_narrow_window_stays_usable(browser, served):
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    try:
        page.goto(served.url + "/")
        page.get_by_test_id("model").locator("option").first.wait_for(state="attached")
        for part in ("composer", "send", "model", "history"):
            box = page.get_by_test_id(part).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, part
        assert not page.get_by_test_id("new-chat").is_visible()  # the list folds away …
        page.locator("#menu").click()
        page.get_by_test_id("new-chat").wait_for()  # … and comes back
        page.locator("#menu-close").click()
        assert say(page, REMEMBER) == "OK"
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    finally:
        context.close()


def test_a_page_elsewhere_cannot_drive_it(browser, served):
    class Evil(BaseHTTPRequestHandler):
        def do_GET(self):
            body = (f"<script>fetch('{served.url}/api/chats', {{method: 'POST', body: '{{}}', "
                    "headers: {'content-type': 'application/json'}}).then(r => document.title = 'got ' + r.status)"
                    ".catch(() => document.title = 'refused')</script>").encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    evil = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    before = len(httpx.get(served.url + "/api/chats").json())
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://localhost:{evil.server_address[1]}/")
        page.wait_for_function("document.title.length > 0")
        assert page.title() == "refused"
    finally:
        context.close()
        evil.shutdown()
    refused = httpx.post(served.url + "/api/chats", json={}, headers={"origin": "http://evil.example"})
    assert refused.status_code == 403
    assert len(httpx.get(served.url + "/api/chats").json()) == before


def test_the_page_asks_once_for_the_key(browser, tmp_path):
    serve = Serve(tmp_path / "home", "-m", "demo", "--api-key", "s3cret-key")
    context = browser.new_context()
    try:
        assert httpx.get(serve.url + "/api/chats").status_code == 401
        page = context.new_page()
        asked = []
        page.on("dialog", lambda d: (asked.append(d.message), d.accept("s3cret-key")))
        page.goto(serve.url + "/")
        page.get_by_test_id("model").locator("option").first.wait_for(state="attached")
        assert say(page, REMEMBER) == "OK" and len(asked) == 1
    finally:
        context.close()
        serve.stop()


def test_the_plots_of_a_results_directory_are_shown(page, served):
    plots = httpx.get(served.url + "/api/results").json()
    assert len(plots) >= 3 and all(name.endswith(".png") for name in plots)
    page.locator("#results-box").click()
    page.locator("#results figcaption").nth(len(plots) - 1).wait_for()  # (each fetched in turn)
    assert page.locator("#results figcaption").all_inner_texts() == plots


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/api/chats", {"model": 5}),
    ("POST", "/api/chats", {"temperature": "hot"}),
    ("POST", "/api/chats", {"model": "llama-70b"}),
    ("POST", "/api/chats/{uid}/turns", []),
    ("POST", "/api/chats/{uid}/turns", {"text": 5}),
    ("POST", "/api/chats/{uid}/turns", {"kind": "rm -rf", "text": "hi"}),
    ("POST", "/api/chats/{uid}/turns", {"text": "hi", "images": "x"}),
    ("POST", "/api/chats/{uid}/turns", {"text": "hi", "images": ["data:text/plain;base64,AAAA"]}),
    ("POST", "/api/chats/{uid}/turns", {"text": "hi", "images": ["data:image/png;base64,!!!"]}),
    ("POST", "/api/chats/{uid}/turns", {"text": "hi", "images": ["file:///etc/passwd"]}),
    ("POST", "/api/chats/{uid}/turns", {"text": "x" * 2_000_000}),
    ("POST", "/api/chats/{uid}/turns", {"text": ""}),
    ("POST", "/api/chats/{uid}/approval", {"decision": "maybe"}),
    ("PATCH", "/api/chats/{uid}", {"history": "false"}),
    ("PATCH", "/api/chats/{uid}", {"temperature": -1}),
    ("PATCH", "/api/chats/{uid}", {"temperature": "hot"}),
    ("PATCH", "/api/chats/{uid}", "MALFORMED"),
    ("POST", "/api/chats", "MALFORMED"),
    ("POST", "/api/chats/{uid}/approval", "MALFORMED"),
    ("PATCH", "/api/chats/{uid}", {"system": ["a"]}),
    ("POST", "/api/chats/{uid}/undo", {}),
    ("GET", "/api/chats/..%2F..%2Fetc", None),
    ("GET", "/api/chats/nosuch", None),
    ("GET", "/static/..%2F..%2Fapi.py", None),
    ("GET", "/api/results/..%2F..%2Fpyproject.toml", None),
    ("GET", "/api/results/" + "x" * 300 + ".png", None),
])
def test_hostile_requests_to_the_page_api_are_one_4xx_line_each(served, method, path, body):
    uid = httpx.post(served.url + "/api/chats", json={}).json()["id"]
    content = b'{"system": "a"' if body == "MALFORMED" else b"[]" if body == [] else None
    answer = httpx.request(method, served.url + path.replace("{uid}", uid), timeout=60, content=content,
                           json=body if body not in (None, [], "MALFORMED") else None)
    assert 400 <= answer.status_code < 500, answer.text
    message = answer.json()["error"]["message"]
    assert message and "\n" not in message and "Traceback" not in message


def workers(served) -> set[int]:
    """The page's conversations' tool processes (add.py's worker): the children of the serve this
    module started, as the kernel lists that one process's children (their environment is kept
    minimal, so they carry no test mark of their own; no other process is looked at)."""
    children: set[int] = set()
    for task in Path(f"/proc/{served.proc.pid}/task").iterdir():
        try:
            children |= {int(pid) for pid in (task / "children").read_text().split()}
        except OSError:  # (a thread that ended while listed)
            continue
    found = set()
    for pid in children:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] not in "ZX" and b"localchat.tools.worker" in command:
            found.add(pid)
    return found


def turn_events(served, uid: str, text: str, until: str | None = None) -> list[dict]:
    """A turn sent through the page's API, its events read to its end (or to the first ``until``
    event, when the connection is then closed: the page went away)."""
    events = []
    with httpx.stream("POST", f"{served.url}/api/chats/{uid}/turns", json={"text": text}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] in ("end", until):
                    break
    return events


def test_viewing_twenty_conversations_starts_no_process(served):
    before = workers(served)
    uids = [httpx.post(served.url + "/api/chats", json={"model": "demo-tools"}).json()["id"] for _ in range(20)]
    for uid in uids:
        assert httpx.get(f"{served.url}/api/chats/{uid}", timeout=30).status_code == 200
    assert workers(served) - before == set()
    assert turn_events(served, uids[0], "Hello")[-1]["type"] == "end"
    assert len(workers(served) - before) == 1  # the first turn that offers the tools starts them


def test_two_tabs_on_one_conversation_share_one_live_chat(served):
    before = workers(served)
    uid = httpx.post(served.url + "/api/chats", json={"model": "demo-tools"}).json()["id"]
    assert turn_events(served, uid, "Hello")[-1]["kept"]
    second_tab = httpx.get(f"{served.url}/api/chats/{uid}", timeout=30).json()
    assert len(second_tab["turns"]) == 1
    assert turn_events(served, uid, "Hello again")[-1]["kept"]
    assert len(workers(served) - before) == 1


def test_a_page_that_goes_away_during_an_approval_denies_it_and_frees_the_conversation(served):
    uid = httpx.post(served.url + "/api/chats", json={"model": "demo-tools"}).json()["id"]
    asked = turn_events(served, uid, "What is 12 plus 30?", until="approve")
    assert asked[-1]["type"] == "approve"  # the page closed the connection here
    started = time.monotonic()
    while True:  # free again at once, not after the approval's 300 s
        answer = httpx.post(f"{served.url}/api/chats/{uid}/stop", timeout=10).json()
        if not answer["stopping"] or time.monotonic() - started > 60:
            break
        time.sleep(0.1)
    assert not answer["stopping"] and time.monotonic() - started < 60
    assert turn_events(served, uid, "Hello")[-1]["status"] != "stopped"  # the next turn is its own


def test_the_model_picker_switches_the_open_conversation_and_the_list_says_when_and_how_long(page, served):
    say(page, REMEMBER)
    uid = page.evaluate("location.hash.slice(1)")
    page.get_by_test_id("model").select_option("demo-tools")
    page.wait_for_function(f"() => fetch('/api/chats/{uid}').then(r => r.json()).then(c => c.model === 'demo-tools')")
    assert page.evaluate("location.hash.slice(1)") == uid and len(answers(page)) == 1  # the same, still shown
    say(page, "Hello")
    shown = httpx.get(f"{served.url}/api/chats/{uid}", timeout=30).json()
    assert shown["model"] == "demo-tools" and len(shown["turns"]) == 2
    logged = localchat(served.home, "log", "show", uid)
    assert "demo-tools" in logged.stdout and "demo" in logged.stdout  # which model said what
    meta = page.locator(f"[data-testid=conversation][data-id='{uid}'] [data-testid=conversation-meta]").inner_text()
    assert "2 turns" in meta and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", meta), meta


def test_a_model_that_loads_says_so_and_a_server_that_is_gone_keeps_the_question(browser, tmp_path):
    """A turn whose model is not loaded yet shows "loading demo-tools… Ns" until its text comes; when
    serve is gone, the page says the server cannot be reached and the typed question stays."""
    serve = Serve(tmp_path / "home", "-m", "demo", "-m", "demo-tools")
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    page = context.new_page()
    try:
        page.goto(serve.url + "/")
        page.get_by_test_id("model").locator("option").nth(1).wait_for(state="attached")
        page.get_by_test_id("model").select_option("demo-tools")
        page.get_by_test_id("composer").fill("Hello")
        page.get_by_test_id("send").click()
        assert page.get_by_test_id("loading").inner_text().startswith("loading demo-tools…")
        page.get_by_test_id("figures").first.wait_for()
        assert page.get_by_test_id("loading").count() == 0
        serve.stop()
        page.get_by_test_id("composer").fill("Are you still there?")
        page.get_by_test_id("send").click()
        page.wait_for_function("() => document.getElementById('notice').textContent.includes('cannot reach')")
        assert page.get_by_test_id("composer").input_value() == "Are you still there?"
    finally:
        context.close()
        serve.stop()


def test_enter_twice_on_a_new_chat_sends_one_turn_and_makes_one_conversation(page, served):
    """The composer is busy from the first moment: a second Enter while the conversation is made sends nothing."""
    before = {c["id"] for c in httpx.get(served.url + "/api/chats", timeout=10).json()}
    page.get_by_test_id("new-chat").click()
    page.get_by_test_id("composer").fill("Remember the code anchor 31. Reply only OK.")
    page.get_by_test_id("composer").press("Enter")
    page.get_by_test_id("composer").press("Enter", no_wait_after=True)
    page.get_by_test_id("figures").first.wait_for()
    page.wait_for_timeout(500)
    made = [c for c in httpx.get(served.url + "/api/chats", timeout=10).json() if c["id"] not in before]
    assert len(made) == 1 and made[0]["turns"] == 1, made
    assert page.locator("[data-testid=message][data-role=user]").count() == 1


def test_open_without_a_browser_says_where_the_page_is(tmp_path):
    """``serve --open`` on a machine with no browser (none on PATH, no display): one line naming the URL."""
    from localchat.server.launch import free_port

    port, empty = free_port(), tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("BROWSER", "DISPLAY", "WAYLAND_DISPLAY")}
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "serve", "-m", "demo", "--port", str(port), "--open"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env | {"PATH": str(empty), "LOCALCHAT_HOME": str(tmp_path / "home"),
                                       "COLUMNS": "200"})
    try:
        said = ""
        for line in proc.stdout:
            said += line
            if "no browser" in line or "Traceback" in line:
                break
        assert f"no browser to open here: the chat page is at http://127.0.0.1:{port}/" in said, said
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_turn_after_an_abandoned_one_is_not_stopped_by_it(served):
    """The page goes away mid-reply (its turn is discarded); the next turn sent to that conversation,
    as soon as it is free, runs to its own end: a stop belongs to its turn."""
    uid = httpx.post(served.url + "/api/chats", json={"model": "rambling"}).json()["id"]
    assert turn_events(served, uid, "Talk forever.", until="text")[-1]["type"] == "text"  # then hung up
    deadline, events = time.monotonic() + 60, []
    while not events and time.monotonic() < deadline:
        with httpx.stream("POST", f"{served.url}/api/chats/{uid}/turns", json={"text": "Talk again."},
                          timeout=120) as response:
            if response.status_code != 200:  # the abandoned turn is still ending: busy
                time.sleep(0.05)
                continue
            events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    end = next(e for e in events if e["type"] == "end")
    assert end["status"] == "cut", end  # ran to its own end (this model never stops: --max-tokens), not "stopped"
