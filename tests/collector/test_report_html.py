"""report.html opened from disk in a real headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium): it loads with no console error, every plot decodes, the full table has the CSV's rows and sorts
numerically by a numeric column, and a failed config's reason is on the page, as text."""
from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from collector.load import Run, load_run
from collector.outputs.html import render as render_html
from collector.outputs.plots import write as write_plots
from collector.report import render
from collector.tables import table
from tests.collector.test_plots import FAILED, write_run

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [pytest.mark.slow,  # a real browser: `make test` runs it, `make test-fast` does not
              pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                 reason="needs Debian's chromium and chromium-driver (make host-deps)")]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path, list[Path]]:
    """A run's report.html and plots/, written as `report --write` writes them."""
    run = load_run(write_run(tmp_path_factory.mktemp("html")))
    df = table(run)
    plots = write_plots(run, df, run.root / "plots")
    page = run.root / "report.html"
    page.write_text(render_html(run, df, plots), encoding="utf-8")
    return run, page, plots


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    except WebDriverException as exc:  # installed but unable to start here: say why
        pytest.fail(f"chromium did not start: {exc.msg}")
    yield driver
    driver.quit()


@pytest.fixture
def opened(report: tuple[Run, Path, list[Path]], browser: WebDriver) -> WebDriver:
    browser.get_log("browser")  # read and so emptied: each test sees the log of its own load only
    browser.get(report[1].as_uri())
    return browser


def severe(driver: WebDriver) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_loads_with_no_console_error_and_every_image_decodes(report: tuple[Run, Path, list[Path]],
                                                             opened: WebDriver) -> None:
    """No console error on load; one <img> per PNG plot, each decoded with a non-zero natural size; then a
    console error of our own is seen, so the check above is live."""
    assert severe(opened) == []
    images = opened.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight]);")
    pngs = [p.stem for p in report[2] if p.suffix == ".png"]
    assert [alt for alt, *_ in images] == pngs and len(pngs) >= 10
    assert all(done and w > 0 and h > 0 for _, done, w, h in images), images
    assert opened.execute_script("return location.protocol;") == "file:"
    opened.execute_script("console.error('a console error on purpose');")
    assert any("on purpose" in e["message"] for e in severe(opened))


def test_full_table_has_the_csv_rows(report: tuple[Run, Path, list[Path]], opened: WebDriver) -> None:
    """The full table: the CSV's columns as headers and as many rows as the CSV."""
    rows = list(csv.DictReader(io.StringIO(render(report[0], "csv"))))
    shown = opened.find_elements(By.CSS_SELECTOR, "#full-table tbody tr")
    assert len(shown) == len(rows) > 0
    headers = [th.text for th in opened.find_elements(By.CSS_SELECTOR, "#full-table thead th")]
    assert headers == list(rows[0])


def test_failed_config_reason_is_visible_text(opened: WebDriver) -> None:
    """Each failed config's reason is shown in the failures section and in the workload view; its detail is
    text (markup in it escaped, no element made of it); the crashed config's log tail holds server.log's end."""
    for config_id, (reason, detail) in FAILED.items():
        (tr,) = opened.find_elements(By.CSS_SELECTOR, f'#failures-table tr.failure[data-config="{config_id}"]')
        cell = tr.find_element(By.CSS_SELECTOR, "td.reason")
        assert cell.is_displayed() and cell.text == reason.value
        assert detail in tr.text
    assert opened.find_elements(By.CSS_SELECTOR, "#failures-table b") == []
    tr = opened.find_element(By.CSS_SELECTOR, '#failures-table tr.failure[data-config="tp1-ddtree-b16"]')
    tr.find_element(By.TAG_NAME, "summary").click()
    log = tr.find_element(By.TAG_NAME, "pre")
    assert log.is_displayed() and "RuntimeError: CUDA graph capture failed <at> step 3" in log.text
    view = [td.text for td in opened.find_elements(By.CSS_SELECTOR, "td.bad") if td.is_displayed()]
    assert "failed: does_not_fit" in view and "failed: crashed" in view


def column(driver: WebDriver, index: int) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#full-table tbody tr'))"
        ".map(r => r.cells[arguments[0]].dataset.v);", index)


def test_numeric_header_sorts_by_number(opened: WebDriver) -> None:
    """A click on tok_s_mean sorts the rows by value ascending (9 before 14, which text would not), empty cells
    last; a second click descending, empty cells still last."""
    headers = opened.find_elements(By.CSS_SELECTOR, "#full-table thead th")
    i = [th.text for th in headers].index("tok_s_mean")
    assert headers[i].get_attribute("data-type") == "num"
    before = column(opened, i)
    numbers = [float(v) for v in before if v]
    assert sorted(numbers) != sorted(numbers, key=str)  # text order would differ
    headers[i].click()
    after = column(opened, i)
    filled = [float(v) for v in after if v]
    assert filled == sorted(numbers) and after[len(filled):] == [""] * (len(after) - len(filled))
    assert len(filled) < len(after)  # the failed configs' rows have no tok/s
    assert headers[i].get_attribute("aria-sort") == "ascending"
    headers[i].click()
    again = column(opened, i)
    assert [float(v) for v in again if v] == sorted(numbers, reverse=True) and again[-1] == ""
    assert severe(opened) == []
