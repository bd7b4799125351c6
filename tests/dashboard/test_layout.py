"""The Overview's tables fit their panels at 1440 px, in a real headless Chromium.

Traffic with the names production sends (dated model snapshots, namespaced open models,
long tenant ids) and token counts in the millions goes through the real collector;
every header and cell of every table must lie inside its panel, none cut off at its edge.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

from tests.dashboard.conftest import make_traffic, send

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                       reason="needs Debian's chromium and chromium-driver"),
]

MODELS = ["gpt-4o-mini-2024-07-18", "gpt-4o-2024-08-06", "claude-3-5-sonnet-20241022",
          "meta-llama/Llama-3.1-70B-Instruct"]
TENANTS = ["acme-corporation-emea", "globex-international", "initech-payments-prod"]


def _traffic() -> list:
    rng = random.Random(11)
    return [replace(r, model=rng.choice(MODELS), tenant=rng.choice(TENANTS), input_tokens=r.input_tokens * 40)
            for r in make_traffic(40, seed=7, ago=(60, 3000))]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1440,900", "--hide-scrollbars",
                f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


# Every header and cell of a table in a panel, with the panel's and its own box: a cell
# beyond the panel's right edge (or cut by a scroll box inside it) does not fit.
_OVERFLOWS = """
const out = [];
for (const panel of document.querySelectorAll('.panel')) {
  const p = panel.getBoundingClientRect();
  const title = (panel.querySelector('h2') || {}).textContent;
  for (const cell of panel.querySelectorAll('th, td')) {
    const c = cell.getBoundingClientRect();
    if (c.width === 0) continue;
    if (c.left < p.left - 0.5 || c.right > p.right + 0.5) {
      out.push(`${title}: "${cell.textContent}" spans ${c.left.toFixed(0)}-${c.right.toFixed(0)}, `
               + `panel ${p.left.toFixed(0)}-${p.right.toFixed(0)}`);
    }
  }
  for (const box of panel.querySelectorAll('*')) {
    if (box.scrollWidth > box.clientWidth + 1 && getComputedStyle(box).overflowX !== 'visible') {
      out.push(`${title}: ${box.className || box.tagName} scrolls ${box.scrollWidth} > ${box.clientWidth}`);
    }
  }
}
return out;
"""


def _rendered(driver: webdriver.Chrome) -> bool:
    text = driver.execute_script(
        "return ['overview-latency', 'overview-cost'].map(i => (document.getElementById(i) || {}).innerText || '')")
    return "meta-llama/Llama-3.1-70B-Instruct" in text[0] and "initech-payments-prod" in text[1]


def test_overview_tables_fit_their_panels_at_1440_px(browser, dashboard, otlp_http, store, tmp_path) -> None:
    traffic = _traffic()
    send(otlp_http, traffic)
    assert store.client().command("SELECT count() FROM llm_requests") == len(traffic)
    browser.get(f"{dashboard.url}/")
    WebDriverWait(browser, 20, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]).until(_rendered)
    assert browser.execute_script("return window.innerWidth") == 1440
    headers = browser.execute_script("return [...document.querySelectorAll('.panel th')].map(h => h.innerText)")
    assert {"p99", "TPOT p50", "Unpriced"} <= set(headers)
    browser.save_screenshot(str(tmp_path / "overview-1440.png"))
    overflows = browser.execute_script(_OVERFLOWS)
    assert overflows == [], "\n".join(overflows)
