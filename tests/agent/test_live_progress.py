"""Progress inside a config (agent/measure.py `Pace`): after a burst, once `progress_s` has passed since the last
report, a `config_progress` event with the requests done of all, the output tok/s over that window (the server's
completion_tokens of the requests finished in it) and the config's ETA; measured against the stand-in engine of
test_config_run, and shown by `controller.follow` as one line each between the per-config lines."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from agent import progress
from agent.config_run import run_config
from agent.measure import Pace
from agent.records import Event
from agent.suite import Suite
from controller import follow, matrix
from tests.agent.test_config_run import assert_contract, events, setup, suite, write_engine

OUT = 24  # output tokens per request: about 50 ms a request from the stand-in engine
SWEEPS = [{"workloads": ["fib"], "max_tokens": [OUT], "concurrency": [1, 2]}]


def told() -> Tuple[List[Dict[str, Any]], Any]:
    """A list and an event sink appending to it, as HostStore.event is called."""
    got: List[Dict[str, Any]] = []

    def sink(kind: Event, **fields: Any) -> None:
        got.append({"event": kind.value, **fields})
    return got, sink


# -- Pace ---------------------------------------------------------------------------------------------------------
def clock(*readings: float) -> Any:
    """A clock that reads the given seconds in turn."""
    it = iter(readings)
    return lambda: next(it)


def test_the_window_s_tokens_over_its_seconds_and_the_eta_from_the_mean_so_far() -> None:
    got, sink = told()
    pace = Pace(sink, "tp1-x", 10, 2.0, clock(100.0, 101.0, 102.5, 103.0, 106.5))
    pace.burst([{"ok": True, "completion_tokens": 8}, {"ok": False, "completion_tokens": 5}])  # at 1.0 s: too soon
    pace.burst([{"ok": True, "completion_tokens": 6}, {"ok": True, "completion_tokens": None}])  # 2.5 s
    pace.burst([{"ok": True, "completion_tokens": 7}, {"ok": True, "completion_tokens": 7}])  # 3.0 s: too soon
    pace.burst([{"ok": True, "completion_tokens": 9}] * 4)  # 6.5 s: the last request
    # the failed request's partial tokens are not counted; the window restarts at each report
    assert got == [
        {"event": "config_progress", "config_id": "tp1-x", "done": 4, "total": 10, "tok_s": round(14 / 2.5, 2),
         "window_s": 2.5, "eta_s": round(2.5 / 4 * 6, 1)},
        {"event": "config_progress", "config_id": "tp1-x", "done": 10, "total": 10, "tok_s": round(50 / 4.0, 2),
         "window_s": 4.0, "eta_s": 0.0}]


def test_the_first_window_counts_from_the_timed_requests_start() -> None:
    """Made before the scans and counter reads that precede the timed requests (5 s here), the pace counts its
    first window and the ETA from `begin`, when the requests start."""
    got, sink = told()
    pace = Pace(sink, "tp1-x", 2, 1.0, clock(100.0, 105.0, 107.0))
    pace.begin()
    pace.burst([{"ok": True, "completion_tokens": 10}])
    assert got == [{"event": "config_progress", "config_id": "tp1-x", "done": 1, "total": 2, "tok_s": 5.0,
                    "window_s": 2.0, "eta_s": 2.0}]


def test_nothing_is_said_before_the_interval_nor_without_a_sink() -> None:
    got, sink = told()
    pace = Pace(sink, "tp1-x", 4, 10.0, clock(0.0, 3.0, 6.0, 9.0, 9.99))
    quiet = Pace(None, "tp1-x", 4, 0.0)
    for _ in range(4):
        pace.burst([{"ok": True, "completion_tokens": 8}])
        quiet.burst([{"ok": True, "completion_tokens": 8}])
    assert got == [] and pace.done == quiet.done == 4


# -- against a real server ------------------------------------------------------------------------------------------
def progress_events(evs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [e for e in evs if e["event"] == Event.CONFIG_PROGRESS.value]


def test_a_config_reports_done_tok_s_and_eta_from_its_own_requests(tmp_path: Path) -> None:
    every = 0.15
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"), repetitions=5, progress_s=every,
                          phases=[{"name": "tp1", "configs": [{"method": "autoregressive"}], "sweeps": SWEEPS}])
    cfg = configs["tp1-autoregressive"]
    status = run_config(host, cfg)
    assert status["status"] == "ok", status
    _, _, rows = assert_contract(host.store.config_dir(cfg["config_id"]), cfg["config_id"])
    said = progress_events(events(host))
    # each request streams its 24 tokens a step of at least 2 ms apart: the ten bursts take 0.48 s or more, room
    # for two windows of 0.15 s however fast the machine (a slower one only makes more room)
    assert len(said) >= 2, (status["timed_s"], said)
    kinds = [e["event"] for e in events(host)]
    assert kinds.index(Event.CONFIG_READY.value) < kinds.index(Event.CONFIG_PROGRESS.value)
    elapsed = 0.0
    bounds = [0, *(e["done"] for e in said)]
    for k, (before, e) in enumerate(zip([{"done": 0}, *said], said)):
        assert e["config_id"] == cfg["config_id"] and e["total"] == cfg["requests"] == len(rows) == 15
        assert e["done"] > before["done"] and e["window_s"] >= every  # at most one report per interval
        # the tokens the server counted for the requests finished in the window, over the window's seconds
        tokens = sum(r["completion_tokens"] for r in rows[before["done"]:e["done"]] if r["ok"])
        assert tokens == OUT * (e["done"] - before["done"])
        assert e["tok_s"] == pytest.approx(tokens / e["window_s"], rel=1e-2)
        # the window is the time since the last report: it holds its own requests (the last report came before the
        # first of them was sent, this one after the last of them was done), and no more than the time from the end
        # of the requests before it to the first one after it
        mine, earlier, later = rows[bounds[k]:bounds[k + 1]], rows[:bounds[k]], rows[bounds[k + 1]:]
        assert e["window_s"] + 1e-3 >= max(r["done_s"] for r in mine) - min(r["sent_s"] for r in mine), (k, e)
        if earlier and later:
            assert e["window_s"] <= min(r["sent_s"] for r in later) - max(r["done_s"] for r in earlier) + 1e-3, \
                (k, e)
        # requests left times the mean seconds per request since the timed requests began
        elapsed += e["window_s"]
        assert e["eta_s"] == pytest.approx(elapsed / e["done"] * (e["total"] - e["done"]), abs=0.06)


def test_with_the_default_interval_a_short_config_says_nothing_inside(tmp_path: Path) -> None:
    """Nothing is said before the default 10 s have passed: a config of a fraction of a second (on a machine slow
    enough to take 10 s, a report would say so with its window of 10 s or more)."""
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    assert host.suite["progress_s"] == matrix.DEFAULTS["progress_s"] == 10
    status = run_config(host, configs["tp1-autoregressive"])
    assert status["status"] == "ok"
    kinds = [e["event"] for e in events(host)]
    assert Event.CONFIG_READY.value in kinds
    assert [e for e in progress_events(events(host)) if e["window_s"] < 10] == []


# -- followed from the controller -------------------------------------------------------------------------------------
def test_render_progress() -> None:
    ev = {"event": "config_progress", "config_id": "tp1-ddtree-b16", "done": 120, "total": 480, "tok_s": 812.44,
          "window_s": 10.02, "eta_s": 205.3}
    assert follow.render(ev) == ("      tp1-ddtree-b16: 120/480 requests, 812.4 tok/s over the last 10 s, "
                                 "config ETA 0:03:25")


PROGRESS_LINE = re.compile(r"^      (tp1-autoregressive|tp1-ngram-k3): (\d+)/12 requests, \d+\.\d tok/s over the last "
                           r"\d+ s, config ETA \d:\d\d:\d\d$")


def test_the_suite_followed_shows_progress_lines_between_its_config_lines(tmp_path: Path) -> None:
    full = matrix.validate(suite(write_engine(tmp_path / "engine"), repetitions=4, progress_s=0.1,
                                 phases=[{"name": "tp1", "sweeps": SWEEPS, "configs": [
                                     {"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 3}]}]))
    root = tmp_path / "results" / "run-1"
    plan = {"run_id": "run-1", "host": "gpu-test-1", "suite": full.suite, "configs": matrix.expand(full)}
    assert Suite(plan, root, invocation="inv-1").run() == 0
    host_dir = root / "gpu-test-1"
    answer = progress.read(host_dir / "events.jsonl", 0, host_dir / "agent.json")
    f = follow.Follow("gpu-test-1", "inv-1")
    f.followed = "inv-1"
    lines, done = f.step({**answer, "alive": False})
    assert done is not None and [c["status"] for c in done["configs"]] == ["ok", "ok"]
    shown = [(m.group(1), int(m.group(2))) if (m := PROGRESS_LINE.match(line)) else line for line in lines]
    assert shown[0].startswith("suite run-1: 2 configs") and shown[-1].startswith("suite finished in ")
    for k, cid in enumerate(("tp1-autoregressive", "tp1-ngram-k3"), 1):
        start = next(i for i, x in enumerate(shown) if isinstance(x, str) and x.startswith(f"[{k}/2] {cid}  elapsed"))
        end = next(i for i, x in enumerate(shown) if isinstance(x, str) and x.startswith("      ok in ") and i > start)
        inside = shown[start + 1:end]
        assert inside and all(isinstance(x, tuple) and x[0] == cid for x in inside), shown
        assert [x[1] for x in inside] == sorted({x[1] for x in inside})  # requests done only grow
