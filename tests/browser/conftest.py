"""Playwright (sync API) on Debian's Chromium against pytest-django's live_server, with real
`runworker` subprocesses sharing the test database (transactional_db: rows are committed)."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make between
# browser steps are still plain synchronous code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("OX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
PASSWORD = "correct horse battery"  # noqa: S105  (a test account)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, live_server, transactional_db) -> Iterator[object]:
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1360, "height": 900})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    yield tab
    context.close()


@pytest.fixture
def operator(transactional_db) -> User:
    user = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_task", content_type__app_label="ox"))
    return user


def log_in(page, username: str, next_path: str = "/") -> None:
    page.goto(next_path)
    page.fill('input[name="username"]', username)
    page.fill('input[name="password"]', PASSWORD)
    page.click('button[type="submit"]:has-text("Log in")')


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
