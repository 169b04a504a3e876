"""The chat page's picture in docs/ (docs/web-page.png), taken by the browser the tests drive:
Debian's Chromium under Playwright, against ``localchat serve -m demo -m demo-tools --tools
examples/tools/add.py`` (a tool call approved in the page, then two turns that recall).

    uv run python scripts/screenshot_page.py [--out docs/web-page.png]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from localchat.serve.started import StartedServe

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")  # Debian's, as the tests drive it (no browser download)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def send(page, text: str) -> None:
    shown = page.get_by_test_id("figures").count()
    page.get_by_test_id("composer").fill(text)
    page.get_by_test_id("composer").press("Enter")
    page.get_by_test_id("figures").nth(shown).wait_for()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "web-page.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="page-shot-") as home:
        shoot(Path(home), args.out)
    print(f"wrote {args.out}")


def shoot(home: Path, out: Path) -> None:
    """The page of a serve whose data directory is ``home``, after a tool call and a recall, in ``out``."""
    from playwright.sync_api import sync_playwright

    serve = StartedServe(home, "-m", "demo", "-m", "demo-tools",
                         "--tools", str(ROOT / "examples" / "tools" / "add.py"))
    try:
        if not serve.wait_ready():
            raise SystemExit(f"serve did not start: {serve.out}")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1100, "height": 640})
            page.goto(serve.url + "/")
            page.get_by_test_id("model").locator("option").first.wait_for(state="attached")
            page.get_by_test_id("model").select_option("demo-tools")
            page.get_by_test_id("composer").fill("What is 12 plus 30?")
            page.get_by_test_id("send").click()
            page.get_by_test_id("tool-approve").click()
            page.get_by_test_id("figures").first.wait_for()
            page.get_by_test_id("new-chat").click()
            page.get_by_test_id("model").select_option("demo")
            send(page, "Remember the code harbor 17. Reply only OK.")
            send(page, "What was the code? Reply with the code only.")
            page.screenshot(path=str(out))
            browser.close()
    finally:
        serve.stop()


if __name__ == "__main__":
    main()
