"""The report as read in a terminal, on a ct200-shaped run written the way the agent writes it (configs expanded by
`matrix.expand`, config.json, status.json and requests.jsonl through the agent's own `record`, request lines
through `records.request_row`, host.json through its fingerprint, run.json from `collector stamp`): two hosts, tp1
and tp4, the baseline, DFlash on both scheduling paths, DDTree at budgets 8/12/15/16/32/64, an n-gram config with a
long id, failures and skips, packed configs with their neighbours and a pack check, and a damaged request line.
Expected figures are worked out by hand."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent import fingerprint, records
from agent.classify import Reason
from agent.config_run import Host, Result, fresh_folder, record
from agent.engines import ENGINES
from agent.pack import PACK_SUFFIX
from agent.records import Outcome
from agent.store import HostStore, write_json
from collector.__main__ import main as collector_main
from collector.environment import environment
from collector.load import load_run
from collector.report import render
from collector.tables import COLUMNS
from collector.tables.speedup import table
from collector.views import AR, budget_key, by_workload, fit_rows, method_label, outcomes, wrap
from controller import matrix

HOSTS = ("gpu-node-a", "gpu-node-b")
MAX_TOKENS = 64
BUDGETS = (64, 8, 32, 12, 16, 15)  # listed out of order: the report orders them
LONG_ID = "ngram-k4-lookup-window-2-to-8-flashinfer-long"
CONFIGS: list[dict[str, Any]] = [
    {"method": "autoregressive"},
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 8,
     "id": LONG_ID},
    *({"method": "ddtree", "budget": b, "block_size": 16, "server_args": ["--page-size", "1"]} for b in BUDGETS),
    {"method": "dflash", "block_size": 16, "id": "dflash-nooverlap", "server_args": ["--disable-overlap-schedule"]},
    {"method": "dflash", "block_size": 16, "id": "dflash"},
]
# Base tok/s of each label (the baseline 12); a sample is base × (5/6, 1, 7/6) on gpu-node-a, × 1.5 on gpu-node-b
SPEED = {"autoregressive": 12.0, LONG_ID: 15.0, "dflash": 24.0, "dflash-nooverlap": 18.0, "ddtree-b8": 36.0,
         "ddtree-b12": 33.0, "ddtree-b15": 30.0, "ddtree-b16": 27.0, "ddtree-b32": 21.0, "ddtree-b64": 16.5}
SCALE = {"gpu-node-a": 1.0, "gpu-node-b": 1.5}
# (host, config_id) -> how it ends instead of measuring
FAILED = {("gpu-node-b", "tp1-ddtree-b64"): (Outcome.FAILED, Reason.OOM, "CUDA out of memory"),
          ("gpu-node-b", "tp4-autoregressive"): (Outcome.FAILED, Reason.HEALTH_TIMEOUT, "not healthy in 1800 s")}


def suite() -> dict[str, Any]:
    sweeps = [{"name": "short", "workloads": ["fib", "qsort"], "max_tokens": [MAX_TOKENS]},
              {"name": "context", "workloads": ["arith"], "max_tokens": [MAX_TOKENS], "context_tokens": [1000],
               "methods": ["dflash", "ddtree-b16"]},
              {"name": "concurrency", "workloads": ["fib"], "max_tokens": [MAX_TOKENS], "concurrency": [4],
               "methods": ["dflash-nooverlap"]}]
    return {"suite_name": "terminal", "engine": "sglang", "engine_python": "/opt/specfleet/sglang/bin/python",
            "gpu_count": 8, "pack": True, "pack_check": True,
            "model": {"name": "Qwen3.6-27B", "path": "/models/Qwen3.6-27B", "max_model_len": 4096},
            "draft_model": {"name": "Qwen3.6-27B-DFlash", "path": "/models/Qwen3.6-27B-DFlash"},
            "phases": [{"name": "tp1", "tp": 1, "configs": CONFIGS, "sweeps": sweeps},
                       {"name": "tp4", "tp": 4, "configs": CONFIGS[:1] + CONFIGS[-2:], "sweeps": sweeps[:1]}]}


def label_of(cfg: dict[str, Any]) -> str:
    return cfg["config_id"].split("-", 1)[1]


def samples(host: str, cfg: dict[str, Any]) -> list[float]:
    """A pack check measures its baseline's figures × 0.9."""
    base = SPEED[label_of(cfg).removesuffix(PACK_SUFFIX)] * SCALE[host] * (0.9 if cfg.get("pack_check_of") else 1)
    return [base * 5 / 6, base, base * 7 / 6]


def packed(cfg: dict[str, Any]) -> dict[str, Any]:
    """status.json's slot and neighbours of a config measured beside others (every tp1 config but the baseline)."""
    if cfg["phase"] != "tp1" or cfg["config_id"] == "tp1-autoregressive":
        return {}
    others = [f"tp1-{LONG_ID}", "tp1-ddtree-b64", "tp1-autoregressive-packed"]
    return {"slot": {"index": 1, "gpus": [1], "cpus": "8-15"},
            "neighbours": [{"config_id": o, "slot": i + 2, "overlap_s": 95.0, "timed_overlap_s": 80.0}
                           for i, o in enumerate(o for o in others if o != cfg["config_id"])]}


def write_host(run_dir: Path, host: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    """host.json from the agent's fingerprint (no GPUs on this machine, no engine: what it finds), and the agent's
    Host for `record`."""
    with monkeypatch.context() as m:
        m.setattr(fingerprint, "ENGINE_BUILD_RECORD", tmp / "no-record.json")
        write_json(run_dir / host / "host.json", fingerprint.collect({"host": host, "suite": suite()}))
    return Host(suite=suite(), engine=ENGINES["sglang"], store=HostStore(run_dir, host),
                engine_info={"version": "0.5.11"})


def measured(host: str, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    identity = {"host": host, "config_id": cfg["config_id"], "method": cfg["method"],
                "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                "model": cfg["model"]["name"], "phase": cfg["phase"]}
    rows = []
    for cell in cfg["cells"]:
        for rep, tok in enumerate(samples(host, cfg)):
            for slot in range(cell["concurrency"]):
                rows.append(records.request_row(identity, cell, rep, {
                    "prompt_tokens": 40, "completion_tokens": MAX_TOKENS, "ttft_s": 0.05, "e2e_s": MAX_TOKENS / tok,
                    "output_tok_s": tok, "ok": True, "error": None, "sent_s": 10.0 * rep + 0.01 * slot,
                    "done_s": 10.0 * rep + 0.01 * slot + MAX_TOKENS / tok,
                    "accept_length": None if cfg["method"] == "autoregressive" else 4.0}))
    return rows


def write_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run_dir = tmp_path / "results" / "run-terminal"
    for host in HOSTS:
        agent_host = write_host(run_dir, host, tmp_path, monkeypatch)
        failed_phase: set[str] = set()
        for cfg in matrix.expand(suite()):
            folder = fresh_folder(agent_host.store, cfg["config_id"])
            (folder / "server.log").write_text("INFO The server is fired up and ready to roll!\n")
            if (host, cfg["config_id"]) in FAILED:
                outcome, reason, detail = FAILED[(host, cfg["config_id"])]
                result = Result(outcome, reason, detail)
                failed_phase.update([cfg["phase"]] if cfg["method"] == "autoregressive" else [])
            elif cfg["phase"] in failed_phase:
                result = Result(Outcome.SKIPPED, Reason.BASELINE_FAILED, "the phase's baseline failed")
            else:
                result = Result(Outcome.OK, rows=measured(host, cfg), argv=cfg["command"],
                                fields={"ready_s": 61.5, "warmup_s": 1.5, "timed_s": 30.25, "stop_s": 2.0,
                                        "wall_s": 100.0, **packed(cfg)})
            record(agent_host, cfg, result, folder, "2026-12-01T10:00:00.000+00:00")
    with (run_dir / HOSTS[0] / "tp1-ddtree-b8" / "requests.jsonl").open("a") as f:
        f.write('{"host": "gpu-node-a", "config_id": "tp1-ddtree-b8", "workl\n')  # cut short while written
    assert collector_main(["stamp", str(run_dir), "start", "--suite", "terminal", "--hosts", *HOSTS]) == 0
    assert collector_main(["stamp", str(run_dir), "finish", "--suite", "terminal", "--hosts", *HOSTS]) == 0
    return run_dir


@pytest.fixture()
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return write_run(tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------------------------
# views: the order of methods, their labels, the methods-as-columns view
# ---------------------------------------------------------------------------------------------------------------

def test_budget_key_orders_baseline_dflash_ddtree_by_number_then_the_rest() -> None:
    expanded = [c for c in matrix.expand(suite(), ["tp1"]) if not c.get("pack_check_of")]
    keyed = sorted(expanded, key=lambda c: (budget_key(c["method"], json.dumps(c["method_params"])), c["config_id"]))
    assert [label_of(c) for c in keyed] == [
        "autoregressive", "dflash", "dflash-nooverlap", "ddtree-b8", "ddtree-b12", "ddtree-b15", "ddtree-b16",
        "ddtree-b32", "ddtree-b64", LONG_ID]
    # params as config.json holds them (an object) key the same; a DDTree without a budget comes after those with
    assert budget_key("ddtree", {"budget": 12}) == budget_key("ddtree", '{"budget": 12}')
    assert budget_key("ddtree", "{}") > budget_key("ddtree", '{"budget": 64}') > budget_key("ddtree", '{"budget": 8}')
    assert budget_key("ddtree", '{"budget": 8}') < budget_key("eagle", "{}") < budget_key("ngram", "{}")


def test_method_labels_are_the_matrix_labels(run_dir: Path) -> None:
    df = table(load_run(run_dir))
    got = {(r["tp"], r["config_id"]): method_label(r) for _, r in df.iterrows()}
    assert got[(1, "tp1-autoregressive")] == AR and got[(4, "tp4-autoregressive")] == AR
    assert got[(1, "tp1-ddtree-b8")] == "ddtree-b8" and got[(4, "tp4-dflash-nooverlap")] == "dflash-nooverlap"
    assert got[(1, f"tp1-{LONG_ID}")] == LONG_ID
    # a phase not named after its tp: the config_id itself
    assert method_label({"method": "dflash", "config_id": "long-dflash", "tp": 1}) == "long-dflash"


def test_by_workload_has_a_row_per_cell_and_a_column_per_method(run_dir: Path) -> None:
    run = load_run(run_dir)
    view = by_workload(table(run), outcomes(run))
    assert list(view.columns) == ["host", "tp", "workload", "max_tokens", "context_tokens", "concurrency",
                                  "request_rate", AR,
                                  "dflash", "dflash-nooverlap", "ddtree-b8", "ddtree-b12", "ddtree-b15", "ddtree-b16",
                                  "ddtree-b32", "ddtree-b64", LONG_ID]
    cells = [tuple(r) for r in view[["host", "tp", "workload", "context_tokens", "concurrency"]].itertuples(False)]
    a_tp1 = [("gpu-node-a", 1, "arith", 1000, 1), ("gpu-node-a", 1, "fib", 0, 1), ("gpu-node-a", 1, "fib", 0, 4),
             ("gpu-node-a", 1, "qsort", 0, 1)]
    assert cells[:4] == a_tp1 and len(cells) == 2 * (4 + 2)
    row = view.iloc[1].to_dict()  # gpu-node-a tp1 fib: tok/s (speedup), speedup = base / 12
    assert row[AR] == "12.0 (1.00x)" and row["dflash"] == "24.0 (2.00x)" and row["ddtree-b12"] == "33.0 (2.75x)"
    assert row["ddtree-b64"] == "16.5 (1.38x)" and row[LONG_ID] == "15.0 (1.25x)"
    arith = view.iloc[0].to_dict()  # only DFlash and b16 measure the long context; the baseline does too
    assert [c for c in view.columns[7:] if arith[c]] == [AR, "dflash", "ddtree-b16"]
    assert arith["dflash"] == "24.0 (2.00x)"
    b = view[(view["host"] == "gpu-node-b") & (view["workload"] == "fib") & (view["concurrency"] == 1)]
    b_tp1, b_tp4 = b.iloc[0].to_dict(), b.iloc[1].to_dict()
    assert b_tp1["ddtree-b64"] == "failed: oom" and b_tp1["ddtree-b8"] == "54.0 (3.00x)"
    assert b_tp4[AR] == "failed: health_timeout" and b_tp4["dflash"] == "skipped: baseline_failed"
    assert b_tp4["ddtree-b8"] == ""  # tp4 has no DDTree
    # without outcomes, a skip is told by its reason
    assert by_workload(table(run)).equals(view)


def test_fit_rows_splits_columns_to_the_width_and_repeats_the_keys() -> None:
    rows = [{"cell": f"fib, {n} tok", **{f"method-{i}": f"{10 * i + n:.1f} ({i / 3:.2f}x)" for i in range(12)}}
            for n in (64, 1024)]
    lines = fit_rows(rows, ["cell"], width=80)
    tables = "\n".join(lines).split("\n\n")
    assert len(tables) > 1 and all(len(line) <= 80 for line in lines)
    assert all(t.startswith("| cell ") for t in tables)
    headers = [h.strip() for t in tables for h in t.splitlines()[0].strip("|").split("|")[1:]]
    assert headers == [f"method-{i}" for i in range(12)]  # every column once, in order
    widest = fit_rows(rows, ["cell"], width=10_000)
    assert "\n\n" not in "\n".join(widest) and max(map(len, widest)) > 80
    # a table is as wide as the columns allow: one more column would not fit
    first = tables[0].splitlines()
    assert len(first[0]) + len(tables[1].splitlines()[0].split("|")[2]) + 1 > 80


def test_wrap_keeps_the_mark_and_paths_whole() -> None:
    path = "/results/run-1/" + "x" * 130 + "/requests.jsonl:3:"
    lines = wrap(f"- {path} malformed JSON (Expecting value, column 1); line skipped", 120, indent="")
    assert lines == ["- " + path, "  malformed JSON (Expecting value, column 1); line skipped"]
    seed = "  fib (ctx 1000, c4): 24.0 ± 4.0 tok/s  (n=3, 2.00x [1.37, 2.92], accept 4.00, burst 96.0 tok/s)"
    assert wrap(seed, 60) == ["  fib (ctx 1000, c4): 24.0 ± 4.0 tok/s  (n=3, 2.00x [1.37,",
                              "    2.92], accept 4.00, burst 96.0 tok/s)"]
    assert wrap("short") == ["short"] and wrap("") == [""] and wrap(" " * 130) == [""]
    assert re.fullmatch(r"(.{1,40}\n)+.{1,40}", "\n".join(wrap("word " * 30, 40)))


# ---------------------------------------------------------------------------------------------------------------
# The md report: 120 columns, the environment first, the seed lines, methods as columns; --wide adds the rest
# ---------------------------------------------------------------------------------------------------------------

SECTIONS = ["Environment", "Speedup vs the autoregressive baseline", "Checks that did not pass, and packing",
            "Where speculation pays", "Baseline alone vs packed", "Across hosts and engines",
            "DDTree budgets against DFlash", "Acceptance per config", "Time per config (seconds)",
            "Problems in the results (skipped)"]
TP1_ORDER = ["autoregressive", "dflash", "dflash-nooverlap", *(f"ddtree-b{b}" for b in (8, 12, 15, 16, 32, 64)),
             LONG_ID]


def fenced(md: str) -> list[tuple[str, bool]]:
    """Each line, and whether it lies inside a fenced block (the fences themselves count as inside)."""
    out, inside = [], False
    for line in md.splitlines():
        fence = line.startswith("```")
        out.append((line, inside or fence))
        inside = inside != fence
    return out


def headings(md: str) -> list[str]:
    return [line[3:] for line, inside in fenced(md) if line.startswith("## ") and not inside]


def section(md: str, title: str) -> str:
    start = md.index(f"\n## {title}\n")
    end = md.find("\n## ", start + 1)
    return md[start:] if end < 0 else md[start:end]


def subsections(text: str) -> dict[str, str]:
    parts = re.split(r"^### (.*)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def tables(text: str) -> list[list[list[str]]]:
    """The pipe tables of a text, each as its rows of cells, the header first (the rule left out)."""
    found: list[list[list[str]]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-:|]+\|", line):
            row = [c.strip() for c in line.strip("|").split("|")]
            if previous.startswith("|"):
                found[-1].append(row)
            else:
                found.append([row])
        previous = line
    return found


def merged(text: str, keys: int) -> dict[tuple[str, ...], dict[str, str]]:
    """Every table of a text put together: per row (its first `keys` cells), each other column's cell."""
    out: dict[tuple[str, ...], dict[str, str]] = {}
    for header, *rows in tables(text):
        for row in rows:
            out.setdefault(tuple(row[:keys]), {}).update(zip(header[keys:], row[keys:]))
    return out


def columns_of(text: str, keys: int) -> list[str]:
    return [h for header, *_ in tables(text) for h in header[keys:]]


def unwrapped(text: str) -> str:
    return re.sub(r"\n +(?=\S)", " ", text)


@pytest.fixture()
def reports(run_dir: Path) -> tuple[Any, str, str]:
    run = load_run(run_dir)
    return run, render(run, "md"), render(run, "md", wide=True)


def test_every_line_fits_120_columns_but_a_path_in_a_fenced_block(run_dir: Path,
                                                                   reports: tuple[Any, str, str]) -> None:
    run, md, wide = reports
    long = [(line, inside) for line, inside in fenced(md) if len(line) > 120]
    # only the damaged request line's problem: it names its file, whole on its line
    assert long == [(f"- {run_dir}/gpu-node-a/tp1-ddtree-b8/requests.jsonl:7: malformed JSON (Unterminated string "
                     "starting at, column 54); line skipped", True)]
    assert run.problems == [long[0][0][2:]]
    # laid out whole, the tables and paragraphs are wider: the fit did something
    assert sum(len(line) > 120 and not inside for line, inside in fenced(wide)) > 10


def test_the_environment_comes_first_then_the_seed_lines(reports: tuple[Any, str, str]) -> None:
    run, md, _ = reports
    assert md.startswith("# Run run-terminal\n\n## Environment\n\n- gpu-node-a: ")
    env = unwrapped(section(md, "Environment"))
    for host, pairs in environment(run).items():
        assert f"- {host}: " + "; ".join(f"{label} {value}" for label, value in pairs) + "\n" in env
    assert headings(md) == SECTIONS
    seed = md.split("```")[1]
    assert "gpu-node-a tp1-autoregressive:\n  arith (ctx 1000): 12.0 ± 2.0 tok/s  (n=3, [noisy])\n" in seed
    assert "  fib: 36.0 ± 6.0 tok/s  (n=3, 3.00x [2.06, 4.38], accept 4.00, [packed,noisy])\n" in seed
    assert "gpu-node-b tp1-ddtree-b64:\n  fib: oom\n  qsort: oom\n" in seed
    configs = re.findall(r"^gpu-node-a (tp1-\S+):$", seed, re.M)
    assert configs == [f"tp1-{label}" for label in TP1_ORDER]  # budgets by number


def test_the_main_table_has_the_methods_as_columns(reports: tuple[Any, str, str]) -> None:
    run, md, wide = reports
    main = subsections(section(md, "Speedup vs the autoregressive baseline"))
    assert list(main) == ["gpu-node-a tp1", "gpu-node-a tp4", "gpu-node-b tp1", "gpu-node-b tp4"]
    assert columns_of(main["gpu-node-a tp1"], 1) == [AR, *TP1_ORDER[1:]]
    assert columns_of(main["gpu-node-b tp4"], 1) == [AR, "dflash", "dflash-nooverlap"]  # no empty DDTree columns
    assert len(tables(main["gpu-node-a tp1"])) > 1  # split by columns to fit, the cell in every part
    cells = merged(main["gpu-node-a tp1"], 1)
    assert list(cells) == [("arith, 64 tok, ctx 1000",), ("fib, 64 tok",), ("fib, 64 tok, c4",), ("qsort, 64 tok",)]
    assert cells[("fib, 64 tok",)] == {AR: "12.0 (1.00x)", "dflash": "24.0 (2.00x)", "dflash-nooverlap": "18.0 (1.50x)",
                                       "ddtree-b8": "36.0 (3.00x)", "ddtree-b12": "33.0 (2.75x)",
                                       "ddtree-b15": "30.0 (2.50x)", "ddtree-b16": "27.0 (2.25x)",
                                       "ddtree-b32": "21.0 (1.75x)", "ddtree-b64": "16.5 (1.38x)",
                                       LONG_ID: "15.0 (1.25x)"}
    assert cells[("fib, 64 tok, c4",)] == {AR: "12.0 (1.00x)", "dflash-nooverlap": "18.0 (1.50x)",
                                           **{c: "" for c in TP1_ORDER[1:] if c != "dflash-nooverlap"}}
    assert merged(main["gpu-node-b tp1"], 1)[("qsort, 64 tok",)]["ddtree-b64"] == "failed: oom"
    assert merged(main["gpu-node-b tp4"], 1)[("fib, 64 tok",)] == {
        AR: "failed: health_timeout", "dflash": "skipped: baseline_failed",
        "dflash-nooverlap": "skipped: baseline_failed"}
    # the same table, whole, with --wide; the full table only there
    wide_main = subsections(section(wide, "Speedup vs the autoregressive baseline"))
    assert {k: merged(v, 1) for k, v in wide_main.items()} == {k: merged(v, 1) for k, v in main.items()}
    assert all(len(tables(v)) == 1 for v in wide_main.values())
    assert "speedup_ci_low" not in md and "Every column" not in md


def test_wide_adds_every_column_with_budgets_by_number(reports: tuple[Any, str, str]) -> None:
    run, _, wide = reports
    assert headings(wide) == [*SECTIONS[:2], "Every column", *SECTIONS[2:]]
    (full,) = tables(section(wide, "Every column"))
    header, rows = full[0], full[1:]
    assert header == [c for c in COLUMNS if c not in ("engine", "model", "method", "method_params", "checks")]
    assert len(rows) == len(table(run))
    at = {h: i for i, h in enumerate(header)}
    fib = [r[at["config_id"]] for r in rows if (r[at["host"]], r[at["tp"]], r[at["workload"]],
                                                r[at["concurrency"]]) == ("gpu-node-a", "1", "fib", "1")]
    assert fib == [f"tp1-{label}" for label in TP1_ORDER]
    b12 = next(r for r in rows if r[at["config_id"]] == "tp1-ddtree-b12" and r[at["workload"]] == "fib")
    assert (b12[at["tok_s_mean"]], b12[at["speedup"]], b12[at["flags"]]) == ("33", "2.75", "packed,noisy")


def test_the_other_sections_keep_their_content_and_order_budgets_by_number(reports: tuple[Any, str, str]) -> None:
    run, md, wide = reports
    # checks: the same items, wrapped; configs by budget
    checks, wide_checks = (unwrapped(section(m, "Checks that did not pass, and packing")) for m in (md, wide))
    assert checks == wide_checks
    assert re.findall(r"^- gpu-node-a (tp1-ddtree-b\d+) ", checks, re.M) == [
        f"tp1-ddtree-b{b}" for b in (8, 12, 15, 16, 32, 64)]
    # the pack check and DDTree against DFlash: every cell of the whole tables, split to fit
    pack, wide_pack = (section(m, "Baseline alone vs packed") for m in (md, wide))
    assert merged(pack, 3) == merged(wide_pack, 3) and len(merged(pack, 3)) == 12
    assert [line for line in unwrapped(pack).splitlines() if line.startswith("- ")] == [
        line for line in unwrapped(wide_pack).splitlines() if line.startswith("- ")]
    vs, wide_vs = (subsections(section(m, "DDTree budgets against DFlash")) for m in (md, wide))
    assert {k: merged(v, 2) for k, v in vs.items()} == {k: merged(v, 2) for k, v in wide_vs.items()}
    fib = merged(vs["gpu-node-b tp1: fib, 64 tok"], 2)
    assert [budget for budget, _ in fib] == ["8", "12", "15", "16", "32", "64"]
    assert fib[("64", "tp1-ddtree-b64")]["status"] == "failed: oom"
    assert fib[("8", "tp1-ddtree-b8")]["÷ tp1-dflash-nooverlap (same path)"] == "2.00 [1.37, 2.92]"
    # across hosts and engines: per config and cell, each host's tok/s and speedup, and the spread; configs by budget
    hosts = section(md, "Across hosts and engines")
    assert columns_of(hosts, 2)[:3] == ["gpu-node-a (sglang) tok_s", "gpu-node-b (sglang) tok_s",
                                        "gpu-node-a (sglang) speedup"]
    across = merged(hosts, 2)
    assert across[("tp1-ddtree-b8", "fib, 64 tok")] == {
        "gpu-node-a (sglang) tok_s": "36", "gpu-node-b (sglang) tok_s": "54", "gpu-node-a (sglang) speedup": "3",
        "gpu-node-b (sglang) speedup": "3", "tok_s_spread": "0.5"}
    assert [cid for cid in dict.fromkeys(cid for cid, _ in across)] == [
        *(f"tp1-{label}" for label in TP1_ORDER), "tp4-autoregressive", "tp4-dflash", "tp4-dflash-nooverlap"]
    # time per config: every config, the pack checks too, by budget
    times = merged(section(md, "Time per config (seconds)"), 2)
    assert [cid for host, cid in times if host == "gpu-node-a"][:11] == [
        "tp1-autoregressive", "tp1-autoregressive-packed", *(f"tp1-{label}" for label in TP1_ORDER[1:])]
    assert times[("gpu-node-b", "tp1-ddtree-b64")]["status"] == "oom"
    # each time as status.json records it; specfleet's own overhead what the wall time leaves of the phases
    assert times[("gpu-node-a", "tp1-dflash")] == {"status": "ok", "ready_s": "61.5", "warmup_s": "1.5",
                                                  "timed_s": "30.2", "stop_s": "2", "specfleet_overhead_s": "4.8",
                                                  "wall_s": "100"}
    # a config that recorded no phase: every time blank, the overhead too (never worked out from the others)
    assert set(times[("gpu-node-b", "tp1-ddtree-b64")].values()) == {"oom", ""}
    assert "- specfleet_overhead_s: specfleet's own overhead: wall_s - (ready_s + warmup_s + timed_s + stop_s)" in md
