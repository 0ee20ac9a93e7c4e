"""The report's plots, drawn from a run written the way the agent writes one: configs expanded by
`matrix.expand` (two tp phases, the baseline, DFlash on both scheduling paths, DDTree at budgets 8/12/16/32/64,
a context sweep, a concurrency sweep in tp1 only), records through the agent's own `record`, run.json from
`collector stamp`. Every number a test expects is the collector's own (tables.table)."""
from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import pytest
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from PIL import Image

from agent import records
from agent.classify import Reason
from agent.config_run import Host, Result, fresh_folder, record
from agent.engines import ENGINES
from agent.records import Outcome
from agent.store import HostStore, write_json
from collector.__main__ import main as collector_main
from collector.load import load_run
from collector.outputs import own
from collector.outputs.plots import figures, write
from collector.results import Run
from collector.tables.speedup import table
from controller import matrix

# plots an earlier report drew: marked as specfleet marks its plots (collector.outputs.own), so that they may go
EARLIER_PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x1ctEXtSoftware\x00" + own.MARK.encode() + b" (an earlier report)"
EARLIER_SVG = f"<svg><metadata><dc:title>{own.MARK} (an earlier report)</dc:title></metadata></svg>".encode()

pytestmark = pytest.mark.slow  # matplotlib at scale: `make test` runs it, `make test-fast` does not

HOST, MAX_TOKENS = "gpu1", 64
BUDGETS = (8, 12, 16, 32, 64)
FACTOR = {"autoregressive": 1.0, "dflash": 2.0, "dflash-nooverlap": 1.8,
          **{f"ddtree-b{b}": f for b, f in zip(BUDGETS, (1.5, 2.2, 2.6, 2.4, 1.9))}}
BASE_TOK = {1: 9.0, 2: 14.0}  # per tp: 9 < 14 as numbers, "14" < "9" as text
# tp2's b32 does not fit; tp1's b16 crashed (it is in the context sweep); the detail holds markup, shown as text
FAILED = {"tp2-ddtree-b32": (Reason.DOES_NOT_FIT, "KV cache 30.1 GiB > 21.0 GiB <b>per GPU</b> & more"),
          "tp1-ddtree-b16": (Reason.CRASHED, "exit 1")}
CRASH_LOG = "INFO loading weights\nRuntimeError: CUDA graph capture failed <at> step 3\n"


def phase(name: str, tp: int, concurrency: bool) -> dict[str, Any]:
    configs = [{"method": "autoregressive"},
               {"method": "dflash", "block_size": 16, "id": "dflash"},
               {"method": "dflash", "block_size": 16, "id": "dflash-nooverlap",
                "server_args": ["--disable-overlap-schedule"]},
               *[{"method": "ddtree", "budget": b, "block_size": 16} for b in BUDGETS]]
    sweeps = [{"workloads": ["fib", "qsort"], "max_tokens": [MAX_TOKENS]},
              {"name": "context", "workloads": ["fib"], "max_tokens": [MAX_TOKENS], "context_tokens": [512, 1024],
               "methods": ["dflash-nooverlap", "ddtree-b16"]}]
    if concurrency:
        sweeps.append({"name": "load", "workloads": ["json"], "max_tokens": [MAX_TOKENS], "concurrency": [1, 4],
                       "methods": ["ddtree-b12"]})
    return {"name": name, "tp": tp, "configs": configs, "sweeps": sweeps}


def suite() -> dict[str, Any]:
    return {"suite_name": "plots", "engine": "sglang", "engine_python": "/opt/sglang/bin/python", "gpu_count": 2,
            "model": {"name": "Qwen3.6-27B", "path": "/models/Qwen3.6-27B", "max_model_len": 4096},
            "draft_model": {"name": "Qwen3.6-27B-DFlash", "path": "/models/Qwen3.6-27B-DFlash"},
            "phases": [phase("tp1", 1, True), phase("tp2", 2, False)]}


def mean_tok(label: str, tp: int, cell: dict[str, Any]) -> float:
    return BASE_TOK[tp] * FACTOR[label] * (1 - cell["context_tokens"] / 4096) / cell["concurrency"] ** 0.5


def request_rows(cfg: dict[str, Any], label: str) -> list[dict[str, Any]]:
    identity = {"host": HOST, "config_id": cfg["config_id"], "method": cfg["method"],
                "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                "model": cfg["model"]["name"], "phase": cfg["phase"]}
    rows = []
    for cell in cfg["cells"]:
        mean = mean_tok(label, cfg["tp"], cell)
        for rep, tok in enumerate((mean * 5 / 6, mean, mean * 7 / 6)):
            for slot in range(cell["concurrency"]):
                ttft = 0.05 + cell["context_tokens"] / 10000 + 0.01 * slot
                e2e = MAX_TOKENS / tok
                rows.append(records.request_row(identity, cell, rep, {
                    "slot": slot, "prompt_tokens": 40 + cell["context_tokens"], "completion_tokens": MAX_TOKENS,
                    "ttft_s": ttft, "e2e_s": e2e, "output_tok_s": tok, "tpot_s": (e2e - ttft) / (MAX_TOKENS - 1),
                    "ok": True, "error": None,
                    "accept_length": None if cfg["method"] == "autoregressive"
                    else 3.0 if cfg["method"] == "dflash" else 2.0 + math.log2(cfg["method_params"]["budget"]) / 2}))
    return rows


def write_run(root: Path, failed: Optional[dict[str, tuple[Reason, str]]] = None) -> Path:
    """results/run-plots/gpu1/<config>/ for every config of the suite; `failed` maps a config id to the reason
    and detail it ends with instead of measuring (FAILED by default)."""
    failed = FAILED if failed is None else failed
    run_dir = root / "results" / "run-plots"
    store = HostStore(run_dir, HOST)
    host = Host(suite=suite(), engine=ENGINES["sglang"], store=store, engine_info={"version": "0.5.10"})
    write_json(store.dir / "host.json", {
        "host": HOST, "hostname": HOST, "gpus": {"count": 2, "driver_version": "580.95.05", "cuda_version": "13.0",
                                                 "devices": [{"name": "NVIDIA H200", "memory_total_mib": 143771}] * 2},
        "engine": {"name": "sglang", "version": "0.5.10"}})
    for cfg in matrix.expand(suite()):
        cid = cfg["config_id"]
        folder = fresh_folder(store, cid)
        if cid in failed:
            (folder / "server.log").write_text(CRASH_LOG)
            record(host, cfg, Result.failed(*failed[cid]), folder, "2026-12-01T10:00:00.000+00:00")
            continue
        (folder / "server.log").write_text("INFO The server is fired up and ready to roll!\n")
        record(host, cfg, Result(Outcome.OK, rows=request_rows(cfg, cid.split("-", 1)[1]), argv=cfg["command"],
                                 fields={"ready_s": 60.0, "timed_s": 30.0, "wall_s": 100.0}),
               folder, "2026-12-01T10:00:00.000+00:00")
    for event in ("start", "finish"):
        assert collector_main(["stamp", str(run_dir), event, "--suite", "plots", "--hosts", HOST]) == 0
    return run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return load_run(write_run(tmp_path_factory.mktemp("plots")))


@pytest.fixture(scope="module")
def drawn(run: Run) -> dict[str, Figure]:
    """Every figure of the run, by name."""
    return dict(figures(run, table(run)))


@pytest.fixture(scope="module")
def written(run: Run, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """The plots folder, with a plot file of an earlier report in it before, and the files written."""
    out = tmp_path_factory.mktemp("report") / "plots"
    out.mkdir()
    (out / "speedup-vs-budget-oldhost-tp1.png").write_bytes(EARLIER_PNG)
    return out, write(run, table(run), out)


def row(df: pd.DataFrame, config_id: str, workload: str = "fib", context: int = 0, concurrency: int = 1) -> pd.Series:
    got = df[(df["config_id"] == config_id) & (df["workload"] == workload) & (df["context_tokens"] == context)
             & (df["concurrency"] == concurrency)]
    assert len(got) == 1
    return got.iloc[0]


def by_gid(fig: Figure, gid: str) -> list[Any]:
    return [a for ax in fig.axes for a in ax.get_children() if a.get_gid() == gid]


def test_files_exist_decode_and_parse(written: tuple[Path, list[Path]]) -> None:
    """Every plot with data is written as PNG (decodes, a sane size) and SVG (parses); a sweep that does not
    exist (concurrency at tp2) gives no file; a plot file of an earlier report is removed."""
    out, paths = written
    kinds = ["speedup-vs-budget", "tok-s", "accept-length-vs-budget", "speedup-vs-context", "ttft", "tpot"]
    want = {f"{k}-gpu1-tp{tp}.{fmt}" for k in kinds for tp in (1, 2) for fmt in ("png", "svg")}
    # the concurrency sweep at tp1 also gives the throughput-against-latency view of its loads
    want |= {f"{k}-gpu1-tp1.{fmt}" for k in ("speedup-vs-concurrency", "throughput-vs-latency")
             for fmt in ("png", "svg")}
    assert {p.name for p in paths} == want
    assert {p.name for p in out.iterdir()} == want
    for p in paths:
        if p.suffix == ".png":
            with Image.open(p) as img:
                img.verify()
            with Image.open(p) as img:
                assert img.format == "PNG" and 400 <= img.width <= 3000 and 300 <= img.height <= 3000, img.size
        else:
            root = ET.parse(p).getroot()
            assert root.tag == "{http://www.w3.org/2000/svg}svg"
            assert root.find(".//{http://www.w3.org/2000/svg}text") is not None  # text stays text


def test_speedup_vs_budget_numeric_with_dflash_references(run: Run, drawn: dict[str, Figure]) -> None:
    """tp1: budgets on a numeric axis in numeric order, each point the table's speedup with its interval as the
    error bar; both DFlash configs as horizontal lines at their speedups; the crashed b16 is a marked gap."""
    df = table(run)
    fig = drawn["speedup-vs-budget-gpu1-tp1"]
    ax = fig.axes[0]
    assert ax.get_title() == "fib, 64 tok"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "12", "16", "32", "64"]
    assert ax.get_xscale() == "log"
    (tree,) = [c for c in ax.containers if c.get_label() == "DDTree"]
    x, y = tree.lines[0].get_data()
    assert list(x) == [8, 12, 16, 32, 64]
    for b, got in zip(BUDGETS, y):
        want = row(df, f"tp1-ddtree-b{b}")["speedup"]
        assert (math.isnan(got) and pd.isna(want)) if b == 16 else got == pytest.approx(want)
    assert row(df, "tp1-ddtree-b8")["speedup"] == pytest.approx(1.5)  # the table's own number, for the record
    bars = tree.lines[2][0].get_segments()  # one vertical segment per point: the 95% interval
    b8 = row(df, "tp1-ddtree-b8")
    assert bars[0][:, 1] == pytest.approx([b8["speedup_ci_low"], b8["speedup_ci_high"]])
    refs = {line.get_label(): line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"}
    assert refs == pytest.approx({"dflash (overlap)": row(df, "tp1-dflash")["speedup"],
                                  "dflash-nooverlap (no overlap)": row(df, "tp1-dflash-nooverlap")["speedup"]})
    (gap,) = by_gid(fig, "p0-gap-tp1-ddtree-b16-at-16")
    assert list(gap.get_xdata()) == [16]


def test_failed_config_is_a_gap_not_a_zero(drawn: dict[str, Figure], written: tuple[Path, list[Path]]) -> None:
    """tp2's b32 did not fit: no value is drawn at 32 in any plot by budget (its point is NaN, never 0), an `x`
    marks it with the reason, and the SVG carries the reason as text in the gap's group."""
    for name in ("speedup-vs-budget-gpu1-tp2", "accept-length-vs-budget-gpu1-tp2"):
        fig = drawn[name]
        panels = {ax.get_title(): k for k, ax in enumerate(fig.axes)}
        assert list(panels) == ["fib, 64 tok", "fib, 64 tok, ctx 512", "fib, 64 tok, ctx 1024", "qsort, 64 tok"]
        for k in (panels["fib, 64 tok"], panels["qsort, 64 tok"]):  # the context sweep has no b32
            ax = fig.axes[k]
            (tree,) = [c for c in ax.containers if c.get_label() == "DDTree"]
            x, y = tree.lines[0].get_data()
            at32 = [v for xv, v in zip(x, y) if xv == 32]
            assert len(at32) == 1 and math.isnan(at32[0])
            assert all(v > 0 for xv, v in zip(x, y) if xv != 32)
            (marker,) = by_gid(fig, f"p{k}-gap-tp2-ddtree-b32-at-32")
            assert list(marker.get_xdata()) == [32] and marker.get_marker() == "x"
            (text,) = by_gid(fig, f"p{k}-gap-tp2-ddtree-b32-at-32-reason")
            assert text.get_text() == "does_not_fit"
    svg = ET.parse(next(p for p in written[1] if p.name == "speedup-vs-budget-gpu1-tp2.svg")).getroot()
    groups = {g.get("id"): g for g in svg.iter("{http://www.w3.org/2000/svg}g")}
    assert {"p0-gap-tp2-ddtree-b32-at-32", "p3-gap-tp2-ddtree-b32-at-32"} <= set(groups)
    assert "".join(groups["p3-gap-tp2-ddtree-b32-at-32-reason"].itertext()).strip() == "does_not_fit"


def test_tok_s_bars_and_their_gaps(run: Run, drawn: dict[str, Figure]) -> None:
    """tok/s per config per cell: each bar the table's tok_s_mean; the failed b32 has no bar, a gap instead."""
    df = table(run)
    fig = drawn["tok-s-gpu1-tp2"]
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    heights = {c.get_label(): [p.get_height() for p in c.patches] for c in bars}
    assert len(heights) == 7  # 8 configs, b32 has no bar in any cell
    cells = [t.get_text() for t in ax.get_xticklabels()]
    assert cells == ["fib, 64 tok", "fib, 64 tok, ctx 512", "fib, 64 tok, ctx 1024", "qsort, 64 tok"]
    base = heights["AR"]
    assert base == pytest.approx([row(df, "tp2-autoregressive", *cell)["tok_s_mean"] for cell in (
        ("fib", 0), ("fib", 512), ("fib", 1024), ("qsort", 0))])
    assert all(h > 0 for hs in heights.values() for h in hs)
    assert len(by_gid(fig, "p0-gap-tp2-ddtree-b32-cell0")) == len(by_gid(fig, "p0-gap-tp2-ddtree-b32-cell3")) == 1


def test_context_and_concurrency_sweeps(run: Run, drawn: dict[str, Figure]) -> None:
    """speedup vs context: the configs of the context sweep, x 0/512/1024, the table's speedups; the crashed b16
    is three gaps. speedup vs concurrency: tp1's b12 at 1 and 4 requests in flight."""
    df = table(run)
    fig = drawn["speedup-vs-context-gpu1-tp1"]
    (ax,) = fig.axes
    assert ax.get_title() == "fib, 64 tok"
    series = {c.get_label(): c.lines[0].get_data() for c in ax.containers}
    assert set(series) == {"dflash-nooverlap", "ddtree-b16"}
    x, y = series["dflash-nooverlap"]
    assert list(x) == [0, 512, 1024]
    assert list(y) == pytest.approx([row(df, "tp1-dflash-nooverlap", "fib", c)["speedup"] for c in (0, 512, 1024)])
    for at in (0, 512, 1024):
        (text,) = by_gid(fig, f"p0-gap-tp1-ddtree-b16-at-{at}-reason")
        assert text.get_text() == "crashed"
    fig = drawn["speedup-vs-concurrency-gpu1-tp1"]
    (ax,) = fig.axes
    assert ax.get_title() == "json, 64 tok"
    ((x, y),) = [c.lines[0].get_data() for c in ax.containers]
    assert list(x) == [1, 4]
    assert list(y) == pytest.approx([row(df, "tp1-ddtree-b12", "json", 0, c)["speedup"] for c in (1, 4)])


def test_latency_distributions_from_the_request_lines(run: Run, drawn: dict[str, Figure]) -> None:
    """TTFT and time per output token: one box per config that has requests, its median the requests' own; the
    failed configs are gaps with their reasons."""
    fig = drawn["ttft-gpu1-tp1"]
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(labels) == 8
    (gap,) = [a for a in ax.get_children() if a.get_gid() == "p0-gap-tp1-ddtree-b16-reason"]
    assert gap.get_text() == "crashed"
    for c in run.configs:
        if c.host == HOST and c.config_id.startswith("tp1-") and c.config_id != "tp1-ddtree-b16":
            (median,) = by_gid(fig, f"median-{c.config_id}")
            assert median.get_ydata()[0] == pytest.approx(pd.Series([r["ttft_s"] for r in c.requests]).median())
    fig = drawn["tpot-gpu1-tp2"]
    c = next(c for c in run.configs if c.config_id == "tp2-dflash")
    (median,) = by_gid(fig, "median-tp2-dflash")
    assert median.get_ydata()[0] == pytest.approx(pd.Series([r["tpot_s"] for r in c.requests]).median())
    assert [a.get_text() for a in by_gid(fig, "p0-gap-tp2-ddtree-b32-reason")] == ["does_not_fit"]


def test_no_figure_without_values(tmp_path: Path) -> None:
    """tp2's baseline failed: no speedup anywhere at tp2, so no speedup plot is written for it (no empty
    figure), while its tok/s and acceptance plots are."""
    run = load_run(write_run(tmp_path, failed={"tp2-autoregressive": (Reason.OOM, "CUDA out of memory")}))
    names = {name for name, _ in figures(run, table(run))}
    assert "speedup-vs-budget-gpu1-tp2" not in names and "speedup-vs-context-gpu1-tp2" not in names
    assert {"tok-s-gpu1-tp2", "accept-length-vs-budget-gpu1-tp2", "speedup-vs-budget-gpu1-tp1"} <= names
    assert json.loads((run.root / HOST / "tp2-autoregressive" / "status.json").read_text())["reason"] == "oom"


def test_run_without_configs_writes_no_plot(tmp_path: Path) -> None:
    """A run folder with no config yet: no figure, no file, and the plot files an earlier report left are gone."""
    run_dir = tmp_path / "results" / "empty"
    write_json(run_dir / "run.json", {"run_id": "empty"})
    out = run_dir / "plots"
    out.mkdir()
    (out / "tok-s-gpu1-tp1.svg").write_bytes(EARLIER_SVG)
    run = load_run(run_dir)
    assert table(run).empty
    assert write(run, table(run), out) == [] and list(out.iterdir()) == []


def test_finish_without_plots_writes_every_report_file_and_removes_the_earlier_plots(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench_report_plots=false (`finish --no-plots`): report.md/.csv/.json and report.html are written, no plot
    is drawn, and the plots of an earlier report of the run go (they would no longer match it)."""
    run_dir = write_run(tmp_path)
    (run_dir / "plots").mkdir()
    (run_dir / "plots" / "tok-s-gpu1-tp1.png").write_bytes(EARLIER_PNG)
    (run_dir / "plots" / "tok-s-gpu1-tp1.svg").write_bytes(EARLIER_SVG)
    assert collector_main(["finish", str(run_dir), "--suite", "plots", "--no-plots", "--hosts", HOST]) == 0
    assert list((run_dir / "plots").iterdir()) == []
    page = (run_dir / "report.html").read_text()
    assert "<p>No plots.</p>" in page and "data:image/png" not in page
    for fmt in ("md", "csv", "json"):
        assert (run_dir / f"report.{fmt}").stat().st_size > 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["ok"] is True
