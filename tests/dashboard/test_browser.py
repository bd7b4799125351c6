"""The Overview page in a real headless Chromium against the real collector and store."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.dashboard.conftest import make_traffic, send

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOT_COPY = Path("/tmp/servelens_overview.png")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                       reason="needs Debian's chromium and chromium-driver"),
]

# Recent traffic inside the last hour, older traffic only inside the last 24 h.
RECENT = make_traffic(12, seed=3, ago=(60, 1800))
OLDER = make_traffic(18, seed=4, ago=(3 * 3600, 20 * 3600))


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1440,1000", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _first_text(driver: webdriver.Chrome, by: str, locator: str) -> str:
    """The text of the first element found, "" if none."""
    for _ in range(3):  # a refresh may replace the element between find and read
        try:
            found = driver.find_elements(by, locator)
            return found[0].text if found else ""
        except StaleElementReferenceException:
            continue
    return ""


def _text(driver: webdriver.Chrome, element_id: str) -> str:
    return _first_text(driver, By.ID, element_id)


def _click(driver: webdriver.Chrome, xpath: str) -> bool:
    found = driver.find_elements(By.XPATH, xpath)
    if found:
        found[0].click()
    return bool(found)


def test_overview_shows_live_numbers_and_follows_the_time_range(browser, dashboard, otlp_http, store, tmp_path):
    send(otlp_http, RECENT + OLDER)
    assert store.client().command("SELECT count() FROM llm_requests") == len(RECENT + OLDER)
    # Callbacks re-render the cards and lists: an element found a moment ago may be gone.
    wait = WebDriverWait(browser, 15, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])

    browser.get(f"{dashboard.url}/")
    wait.until(lambda d: _text(d, "ov-requests") == str(len(RECENT + OLDER)))
    assert _text(browser, "ov-binding_constraint") == "decode"
    assert _text(browser, "ov-gpu_utilization") == "—"  # no GPU samples: null, not 0
    assert _text(browser, "ov-ttft_p99_ms").endswith(" ms")
    assert _text(browser, "ov-cost_per_request_usd").startswith("$")
    assert {"gpt-4o", "gpt-4o-mini", "llama-3-8b"} <= set(_text(browser, "overview-latency").split())
    assert {"acme", "globex", "initech"} <= set(_text(browser, "overview-cost").split())

    wait.until(lambda d: _click(d, "//div[contains(@class, 'range-selector')]//label[normalize-space()='1 h']"))
    wait.until(lambda d: _text(d, "ov-requests") == str(len(RECENT)))
    assert "Last 1 h" in _text(browser, "overview-updated")

    # The model filter offers what the window holds, and narrows every number.
    wait.until(lambda d: _click(d, "//*[@id='filter-model']"))
    wait.until(lambda d: _click(d, "//*[contains(@class, 'dash-options-list-option')][normalize-space()='gpt-4o']"))
    wait.until(lambda d: _text(d, "ov-requests") == str(sum(r.model == "gpt-4o" for r in RECENT)))

    browser.save_screenshot(str(tmp_path / "overview.png"))
    shutil.copyfile(tmp_path / "overview.png", SCREENSHOT_COPY)
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []
