"""The console in a real browser (Debian's headless Chromium, driven by Selenium), as a person
uses it: a worker killed with a request in flight, its operation UNRESOLVED on the page, the
form filled and sent, the task finished by a restarted worker, and the audit line shown.

Skipped with a reason where Chromium or its driver is missing, but failed where CI=true
(.ci/run installs them). With INTENTLOG_SCREENSHOTS=1 the screenshots go to docs/images/
(the ones docs/operate.md shows); otherwise to the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import intentlog
from console_support import SCRIPT_TEXT, make_unresolved, running_console, task_path
from intentlog.testing import ReferenceService

HERE = Path(__file__).parent
SUPPORT = HERE / "support"
ROOT = HERE.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: Failure bounds only: every wait below ends as soon as what it waits for is seen.
DEADLINE = 120.0
_T = TypeVar("_T")

#: One Chromium per pytest-xdist worker at most: the browser tests run on one worker, in turn.
pytestmark = pytest.mark.xdist_group("browser")


def _missing_browser() -> str | None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return f"{' and '.join(missing)} missing (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium, driven by Selenium."""
    problem = _missing_browser()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem} (CI=true: the browser tests must run, not skip)", pytrace=False)
        pytest.skip(problem)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--disable-gpu"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(DEADLINE)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot_dir(tmp_path: Path) -> Path:
    if os.environ.get("INTENTLOG_SCREENSHOTS") == "1":
        (ROOT / "docs" / "images").mkdir(parents=True, exist_ok=True)
        return ROOT / "docs" / "images"
    return tmp_path


def until(what: str, check: Callable[[], _T]) -> _T:
    """Poll ``check`` until it returns something true; fails after DEADLINE."""
    end = time.monotonic() + DEADLINE
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not seen in {DEADLINE:.0f} s")
        time.sleep(0.05)


def page_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


def no_alert(driver: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018 (the property raises when there is no alert)


def fill_and_send(
    driver: Any, key: str, outcome: str, *, actor: str, receipt: str = "", note: str = "",
    confirm: str | None = None, shot: Path | None = None,
) -> None:  # fmt: skip
    """Fill the resolve form of operation ``key`` on the task page shown, and send it."""
    from selenium.webdriver.common.by import By

    form = driver.find_element(By.ID, f"resolve-{key}")
    form.find_element(By.CSS_SELECTOR, f'input[name=outcome][value="{outcome}"]').click()
    typed = {"receipt": receipt, "note": note, "actor": actor}
    if confirm is not None:
        typed["confirm"] = confirm
    for name, value in typed.items():
        field = form.find_element(By.NAME, name)
        field.clear()  # a refused form comes back with what was typed
        field.send_keys(value)
    if shot is not None:
        section = driver.find_element(By.ID, f"op-{key}")
        driver.set_window_size(1280, 2000)  # the whole section in view: an element's
        driver.execute_script("arguments[0].scrollIntoView()", section)  # shot is clipped
        section.screenshot(str(shot))
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def journal_state(url: str, key: str) -> intentlog.State:
    with intentlog.open(url) as journal:
        return journal.operation(key).state


def worker(env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    log = Path(env["INTENTLOG_TEST_MARKER"]).with_name("workers.log")
    with log.open("ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "intentlog.cli", "worker", "--app", "worker_app:registry",
             "--poll", "0.05", *extra],
            env=env, stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip


def test_a_person_settles_in_the_browser_what_a_killed_worker_left(
    tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    shots = screenshot_dir(tmp_path)
    url = str(tmp_path / "journal.db")
    with ReferenceService("neither", db_path=tmp_path / "service.db") as service:
        with intentlog.open(url) as journal:
            journal.start("order", "order-6", {"amount": 600})
            journal.start("order", "order-7", {"amount": 700})
        env = {**os.environ, "PYTHONPATH": str(SUPPORT), "INTENTLOG_URL": url,
               "INTENTLOG_TEST_SERVICE": service.url, "INTENTLOG_TEST_MODE": "neither",
               "INTENTLOG_TEST_MARKER": str(tmp_path / "marker")}  # fmt: skip
        # The first worker finishes order-6, then kills itself with SIGKILL right after its
        # second charge request (order-7's) has left, before the answer is read.
        crash = {**env, "INTENTLOG_CRASH": "after_send:charge:2"}
        first = worker(crash, "--exit-when-idle", "--lease-ttl", "2")
        assert first.wait(timeout=DEADLINE) == -signal.SIGKILL
        with intentlog.open(url) as journal:
            (charge,) = [o for o in journal.operations("order-7") if o.effect == "charge"]
        assert charge.state is intentlog.State.SUBMITTED
        applied = until("the service applied the charge", lambda: service.applied().get(charge.key))
        # A restarted worker cannot settle it (the service neither deduplicates nor answers
        # lookups): it marks it UNRESOLVED and parks the task until a person decides.
        second = worker(env)
        try:
            until(
                "UNRESOLVED", lambda: journal_state(url, charge.key) is intentlog.State.UNRESOLVED
            )
            with running_console(url) as console:
                browser.get(console.base + console.login)
                assert browser.current_url == console.base + "/"  # the token left the address
                text = page_text(browser)
                assert "Needs a person (1)" in text and "order-7" in text
                row = browser.find_element(By.CSS_SELECTOR, "#needs-person tbody tr")
                assert "UNRESOLVED" in row.text and "charge" in row.text
                browser.save_screenshot(str(shots / "console-overview.png"))
                row.find_element(By.CSS_SELECTOR, "a.task-link").click()
                until("the task page", lambda: "/task/order-7" in browser.current_url)
                section = browser.find_element(By.ID, f"op-{charge.key}")
                assert "ESCALATE" in section.text and "cannot be asked" in section.text
                receipt = json.dumps({"id": applied[0], "status": "succeeded"})
                fill_and_send(
                    browser, charge.key, "confirmed", receipt=receipt, actor="alice@ops",
                    note="found in the payments dashboard", shot=shots / "console-resolve.png",
                )  # fmt: skip
                line = until("the audit line", lambda: browser.find_elements(
                    By.CSS_SELECTOR, f"#op-{charge.key} tr.audit-line"))  # fmt: skip
                assert "alice@ops" in line[0].text
                assert "found in the payments dashboard" in line[0].text
                assert "UNRESOLVED → CONFIRMED" in line[0].text
                # The worker that parked the task takes it up again and finishes it.
                with intentlog.open(url) as journal:
                    until("order-7 completes",
                          lambda: journal.task_info("order-7").record.completed)  # fmt: skip
                browser.get(console.base + task_path("order-7"))
                text = page_text(browser)
                assert "none (task complete)" in text and "alice@ops" in text
                assert "found in the payments dashboard" in text
                no_alert(browser)
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=DEADLINE) == 0
        finally:
            second.kill()
            second.wait()
        truth = service.truth()
    assert len(truth) == 6 and set(truth.values()) == {1}  # nothing was sent twice
    with intentlog.open(url) as journal:
        assert journal.operation(charge.key).receipt == json.loads(receipt)
        assert all(t.completed for t in journal.tasks()) and journal.pending() == []


def test_script_in_a_task_id_or_receipt_is_text_and_a_risky_retry_asks_first(
    tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    url = str(tmp_path / "journal.db")
    script_key = make_unresolved(url, SCRIPT_TEXT)
    mail_key = make_unresolved(url, "mail-2")
    with running_console(url) as console:
        browser.get(console.base + console.login)
        link = browser.find_element(By.CSS_SELECTOR, "#needs-person a.task-link")
        assert link.text == SCRIPT_TEXT  # shown as text, not run
        no_alert(browser)
        link.click()
        until("the task page", lambda: SCRIPT_TEXT in browser.title)
        assert browser.find_element(By.CSS_SELECTOR, "h1 .task-id").text == SCRIPT_TEXT
        memo = json.dumps({"memo": SCRIPT_TEXT})
        fill_and_send(browser, script_key, "confirmed", receipt=memo, actor="alice")
        cell = until(
            "the audit line", lambda: browser.find_elements(By.CSS_SELECTOR, "code.receipt")
        )
        assert SCRIPT_TEXT in cell[0].text
        assert SCRIPT_TEXT in browser.find_element(By.CSS_SELECTOR, "pre.receipt").text
        no_alert(browser)

        # A retry of an effect that can neither deduplicate nor be asked: the page warns, and
        # without the phrase typed it is refused, nothing written.
        browser.get(console.base + task_path("mail-2"))
        section = browser.find_element(By.ID, f"op-{mail_key}")
        assert "a retry applies it twice" in section.text
        phrase = section.find_element(By.CSS_SELECTOR, "code.phrase").text
        assert phrase == "retry send_email"
        fill_and_send(browser, mail_key, "retry", actor="bob")
        error = until("the refusal", lambda: browser.find_elements(By.CSS_SELECTOR, ".error"))
        assert "Not retried." in error[0].text and phrase in error[0].text
        assert journal_state(url, mail_key) is intentlog.State.UNRESOLVED
        fill_and_send(browser, mail_key, "retry", actor="bob", confirm=phrase)
        line = until(
            "the audit line", lambda: browser.find_elements(By.CSS_SELECTOR, "tr.audit-line")
        )
        assert "bob" in line[0].text and "UNRESOLVED → PLANNED" in line[0].text
    assert journal_state(url, mail_key) is intentlog.State.PLANNED


def test_the_browser_needs_the_token_and_a_form_needs_its_csrf_token(
    tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    url = str(tmp_path / "journal.db")
    key = make_unresolved(url, "order-9")
    with running_console(url) as console:
        browser.get(console.base + "/")  # no token, no cookie
        assert browser.title == "Token needed"
        assert "UNRESOLVED" not in page_text(browser)
        assert console.token is not None
        browser.get(console.base + "/?token=" + "x" * len(console.token))  # a wrong one
        assert browser.title == "Wrong token"
        browser.get(console.base + console.login)  # the right one
        browser.get(console.base + task_path("order-9"))
        form = browser.find_element(By.ID, f"resolve-{key}")
        # The page itself runs no script (its policy forbids it); the test, through the
        # browser's driver, removes the form's CSRF field as a forged form would lack it.
        browser.execute_script("arguments[0].querySelector('input[name=csrf]').remove()", form)
        fill_and_send(browser, key, "failed", actor="mallory")
        until("the refusal", lambda: "CSRF token is missing or wrong" in page_text(browser))
    assert journal_state(url, key) is intentlog.State.UNRESOLVED  # nothing written
