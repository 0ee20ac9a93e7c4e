"""report.html opened from disk in a real headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium) in a window 1280 px wide: it loads with no console error, every plot decodes, the full table has the CSV's
rows and sorts numerically by a numeric column, and a failed config's reason is on the page, as text. It reads like
report.md: every section of report.md is a section of the page under the same heading, with report.md's tables
(the same headers, rows and cell text; 'Where speculation pays' first of all, on a run swept over loads both ways
with latency limits too), and those tables fit the window, each cell on one line."""
from __future__ import annotations

import csv
import io
import re
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

from collector.load import load_run
from collector.outputs.html import render as render_html
from collector.outputs.plots import write as write_plots
from collector.report import render
from collector.results import Run
from collector.tables.speedup import table
from tests.collector.test_crossover import write_run as write_swept_run
from tests.collector.test_plots import FAILED, write_run

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
WINDOW = 1280  # the window's width, in px
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
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """test_crossover's run (closed-loop loads c1 to c8 and open-loop rates, latency limits, a failed load): its
    report.html, without plots."""
    run = load_run(write_swept_run(tmp_path_factory.mktemp("swept")))
    page = run.root / "report.html"
    page.write_text(render_html(run, table(run), []), encoding="utf-8")
    return run, page


@pytest.fixture(scope="module")
def pages(report: tuple[Run, Path, list[Path]], swept: tuple[Run, Path]) -> dict[str, tuple[str, Path]]:
    """Per run, its report.md (as `report --write` writes it) and its report.html."""
    return {"plots": (render(report[0], "md"), report[1]), "swept": (render(swept[0], "md"), swept[1])}


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={WINDOW},1000"):
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


def open_page(driver: WebDriver, page: Path) -> WebDriver:
    driver.get_log("browser")
    driver.get(page.as_uri())
    return driver


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


def md_sections(md: str) -> dict[str, list[tuple[str, Any]]]:
    """report.md's sections by heading, each its `###` headings and tables in order: ("h3", text) and ("table",
    [header, *rows]), a row the cells' text."""
    out: dict[str, list[tuple[str, Any]]] = {}
    fenced, parts, table_lines = False, None, None
    for line in md.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.startswith("## "):
            parts = out.setdefault(line[3:], [])
        elif parts is None:
            continue
        if line.startswith("|"):
            if table_lines is None:
                table_lines = []
                parts.append(("table", table_lines))
            if not re.fullmatch(r"\|(:?-+:?\|)+", line):  # the alignment line
                table_lines.append([c.strip() for c in line.strip()[1:-1].split("|")])
            continue
        table_lines = None
        if line.startswith("### "):
            parts.append(("h3", re.sub(r"`([^`]*)`", r"\1", line[4:])))
    return out


# The page's section under the <h2> of this id: its <h3> headings and tables, as md_sections has report.md's
SECTION = """
var h2 = document.getElementById(arguments[0]);
return Array.from(h2.parentElement.querySelectorAll("h3, table")).map(function (el) {
  return el.tagName === "H3" ? ["h3", el.textContent]
    : ["table", Array.from(el.rows).map(function (r) {
        return Array.from(r.cells).map(function (c) { return c.textContent; }); })];
});
"""
HEADINGS = "return Array.from(document.querySelectorAll('h2')).map(h => [h.textContent, h.id]);"


@pytest.mark.parametrize("name", ["plots", "swept"])
def test_where_speculation_pays_has_report_md_tables(name: str, pages: dict[str, tuple[str, Path]],
                                                     browser: WebDriver) -> None:
    """The page's 'Where speculation pays' holds report.md's tables of that section: per host and tp the pays-at
    and crossover tables (on the swept run, split by columns as report.md splits them), then the per-load tables,
    each with report.md's header, rows and cell text, in report.md's order under the same <h3> headings."""
    md, page = pages[name]
    want = md_sections(md)["Where speculation pays"]
    got = [(kind, value) for kind, value in open_page(browser, page).execute_script(SECTION, "pays")]
    assert got == want
    tables = [value for kind, value in want if kind == "table"]
    headers = [h for t in tables for h in t[0]]
    assert {"loads", "best", "pays at", "crossover", "tok/s", "÷ baseline"} <= set(headers)
    if name == "swept":  # closed and open loop, limits: the report.md tables split by columns
        assert {"goodput crossover", "within limits up to", "not measured", "achieved req/s"} <= set(headers)
        assert len(tables) >= 4
        rows = [dict(zip(t[0], r)) for t in tables for r in t[1:]]
        assert any(r.get("crossover", "").startswith("3 (") for r in rows)  # tp1-ngram-k2's, as test_crossover
    assert severe(browser) == []


@pytest.mark.parametrize("name", ["plots", "swept"])
def test_every_report_md_section_is_on_the_page(name: str, pages: dict[str, tuple[str, Path]],
                                                browser: WebDriver) -> None:
    """Each `##` section of report.md is an <h2> of the page with the same words; each but the environment (a list
    of facts per host on the page) has report.md's <h3> headings and tables, as they are there; the page's full
    table and the plots, failures and history sections follow."""
    md, page = pages[name]
    sections = md_sections(md)
    assert {"Environment", "Speedup vs the autoregressive baseline", "Where speculation pays",
            "Time per config (seconds)"} <= set(sections)
    if name == "plots":
        assert "DDTree budgets against DFlash" in sections
    driver = open_page(browser, page)
    ids = dict(driver.execute_script(HEADINGS))
    assert set(sections) <= set(ids), set(sections) - set(ids)
    assert {"History", "Full table", "Plots", "Failed and skipped configs"} <= set(ids)
    for heading, want in sections.items():
        if heading != "Environment":
            assert [tuple(p) for p in driver.execute_script(SECTION, ids[heading])] == want, heading


# Per readable table (those of report.md's sections): its width, its container's and the page's; and how many
# lines of text its most wrapped cell takes
WIDTHS = """
return Array.from(document.querySelectorAll("table.md")).map(function (t) {
  var lines = Array.from(t.querySelectorAll("th, td")).map(function (c) {
    var range = document.createRange();
    range.selectNodeContents(c);
    return new Set(Array.from(range.getClientRects()).map(function (r) { return Math.round(r.top); })).size;
  });
  return [t.scrollWidth, t.parentElement.clientWidth, Math.max.apply(null, lines.concat([0]))];
});
"""


@pytest.mark.parametrize("name", ["plots", "swept"])
def test_readable_tables_fit_a_1280_px_window(name: str, pages: dict[str, tuple[str, Path]],
                                              browser: WebDriver) -> None:
    """In a window 1280 px wide, no table of report.md's sections is wider than its container (nothing to scroll
    sideways), every cell of them is on one line, and the page itself does not scroll sideways."""
    driver = open_page(browser, pages[name][1])
    assert 1000 < driver.execute_script("return window.innerWidth;") <= WINDOW
    tables = driver.execute_script(WIDTHS)
    assert len(tables) >= 4
    assert all(width <= room and lines == 1 for width, room, lines in tables), tables
    assert driver.execute_script("return document.documentElement.scrollWidth <= "
                                 "document.documentElement.clientWidth;")
