"""GPU-state samples: agent.gpu's sample parsing on real captures from an H200 host, the summary of a real
sampler run, and agent.gpusample's Sampler end to end.

The captures (tests/fixtures/nvidia-h200, README there) are the driver's own output: its field list
(help-query-gpu.txt), one-shot queries with both reason prefixes and a rejected field (query-gpu-sample.log),
a 1 Hz stream idle → bf16 matrix products → idle (query-gpu-stream.csv) in which the driver reports SW power
cap, and the sampler's own gpu.jsonl from a run on that GPU (sampler-run.jsonl).

The Sampler tests put a stand-in `nvidia-smi` on PATH (tests/fakes/nvidia-smi, no driver can exist here): it
reproduces the real interface from those captures, accepting exactly the field names of the captured
help-query-gpu.txt (rejecting others with the captured message and exit status) and printing the captured
stream's lines at the interval asked with `-lms`, until killed. Lines marked "derived" below are real lines
with one value changed (a reason the real GPU never showed, a second GPU index); the tests say which.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable, Dict, List

import pytest

from agent import gpu, gpusample, records

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-h200"
FAKE = ROOT / "tests" / "fakes" / "nvidia-smi"
EVENT = gpu.sample_fields("clocks_event_reasons")
THROTTLE = gpu.sample_fields("clocks_throttle_reasons")


def capture(name: str) -> str:
    return (FIXTURES / name).read_text()


def section(title: str) -> List[str]:
    """The lines of one `== title` section of query-gpu-sample.log."""
    text = capture("query-gpu-sample.log")
    body = text.split(f"== {title}\n", 1)[1].split("\n== ", 1)[0]
    return [ln for ln in body.splitlines() if ln.strip()]


def stream_lines() -> List[str]:
    return [ln for ln in capture("query-gpu-stream.csv").splitlines() if ln.strip()]


# -- parsing the real formats -----------------------------------------------------------------------------------

def test_every_sample_field_is_one_the_driver_lists() -> None:
    """Both prefixes' names are in the driver's own --help-query-gpu list (580.159.04 accepts both)."""
    listed = set(re.findall(r'"([^"]+)"', capture("help-query-gpu.txt")))
    for fields in (EVENT, THROTTLE):
        assert set(fields.split(",")) <= listed, set(fields.split(",")) - listed


def test_one_shot_idle_line() -> None:
    """`--format=csv,noheader,nounits`, idle: SM 345 MHz, memory 3201 MHz, ~80 W, only gpu_idle in the mask."""
    lines = section("one-shot 1, clocks_event_reasons, csv,noheader,nounits")
    assert lines[-1] == "rc=0"
    [s] = gpu.parse_sample(lines[0], EVENT)
    assert s["index"] == 0 and s["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"
    assert s["smi_time"] == "2026/12/02 04:27:00.365"
    assert (s["clocks.sm"], s["clocks.mem"], s["power.draw"], s["temperature.gpu"]) == (345, 3201, 80.72, 38)
    assert (s["utilization.gpu"], s["utilization.memory"], s["memory.used"]) == (0, 0, 0)
    assert s["reasons_mask"] == 1 and s["reasons"] == ["gpu_idle"]
    assert not any(s[r] for r in gpu.THROTTLE_KINDS)


def test_old_prefix_is_answered_alike() -> None:
    """The same driver answers clocks_throttle_reasons.* with the same columns."""
    [s] = gpu.parse_sample(section("one-shot, clocks_throttle_reasons, csv,noheader,nounits")[0], THROTTLE)
    assert s["reasons_mask"] == 1 and s["sw_power_cap"] is False and s["clocks.sm"] == 345


def test_header_names_are_the_drivers_canonical_ones() -> None:
    """With a header, the driver names clocks.sm/clocks.mem by their long names and keeps units in the header
    even with nounits; the header-reading parser takes the row as nvidia-smi wrote it."""
    [row] = gpu.parse_query_csv(capture("query-gpu-sample-nounits.csv"))
    assert row["clocks.current.sm"] == 345 and row["clocks.current.memory"] == 3201
    assert row["clocks_event_reasons.active"] == "0x0000000000000001"
    assert row["clocks_event_reasons.sw_power_cap"] == "Not Active"


def test_rejected_field_is_not_a_sample() -> None:
    """The driver's answer to an unknown field (stdout, exit 2) parses as no sample."""
    lines = section("a field the driver does not know (stdout)")
    assert lines == ['Field "no_such.field" is not a valid field to query.', "rc=2"]
    assert gpu.parse_sample(lines[0], EVENT) == []
    assert section("the same (stderr)") == ["rc=2"]


def test_stream_under_load_reports_sw_power_cap() -> None:
    """The 1 Hz stream: idle, then bf16 matrix products (SW power cap at ~690 W, SM 1395–1530 MHz), then idle;
    the driver's Active/Not Active answers agree with the bitmask as decoded here on every line."""
    samples = [s for ln in stream_lines() for s in gpu.parse_sample(ln, EVENT)]
    assert len(samples) == len(stream_lines()) == 18
    capped = [s for s in samples if s["sw_power_cap"]]
    assert len(capped) == 8
    assert all(s["reasons"] == ["sw_power_cap"] and s["reasons_mask"] == 4 for s in capped)
    assert min(s["clocks.sm"] for s in capped) == 1395 and max(s["power.draw"] for s in capped) == 691.76
    assert all(s["utilization.gpu"] >= 99 for s in capped)
    for s in samples:
        assert {r for r in gpu.THROTTLE_KINDS if s[r]} == set(gpu.decode_reasons(s["reasons_mask"])) & set(
            gpu.THROTTLE_KINDS)


def test_unavailable_readings_become_null() -> None:
    """Derived: a real line with power.draw `[N/A]` and the reason answers `[N/A]` (what nvidia-smi prints for a
    reading it cannot give): the reading is None, the reasons come from the bitmask."""
    cells = stream_lines()[10].split(", ")
    cells[5] = "[N/A]"
    cells[11:] = ["[N/A]"] * 5
    [s] = gpu.parse_sample(", ".join(cells), EVENT)
    assert s["power.draw"] is None and s["sw_power_cap"] is True and s["hw_slowdown"] is False


def test_decode_reasons() -> None:
    assert gpu.decode_reasons(0) == []
    assert gpu.decode_reasons(0x4 | 0x8 | 0x40) == ["sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"]


# -- the summary of a real run -----------------------------------------------------------------------------------

def test_real_sampler_run_records_keep_the_contract() -> None:
    rows = gpusample.read(FIXTURES / "sampler-run.jsonl")
    assert len(rows) == 19 and [r["sample"] for r in rows] == list(range(19))
    assert all(records.problem(r, records.GPU_SAMPLE) is None for r in rows)


def test_summary_of_the_real_run() -> None:
    """sampler-run.jsonl: 19 samples at 1 s; samples 7–16 ran matrix products under SW power cap."""
    rows = gpusample.read(FIXTURES / "sampler-run.jsonl")
    by = {r["sample"]: r["mono_s"] for r in rows}
    state = gpusample.summarize(rows, by[7] - 0.5, by[16] + 0.5)
    assert state["samples"] == 10 and state["window_s"] == pytest.approx(10.0, abs=0.01)
    [g] = state["gpus"]
    assert g["samples"] == 10 and g["uuid"].startswith("GPU-")
    assert g["clocks.sm"] == {"min": 1455, "max": 1500, "mean": 1477.5}
    assert g["power.draw"]["max"] == 693.11 and g["power.draw"]["min"] == 448.93
    assert g["temperature.gpu"] == {"min": 60, "max": 64, "mean": 63.0}
    assert g["throttle"] == {"sw_power_cap": 10}
    assert state["throttled"] == [{"gpu": 0, "reason": "sw_power_cap", "kind": "power cap", "samples": 10, "of": 10}]
    idle = gpusample.summarize(rows, by[0], by[6])
    assert idle["samples"] == 7 and idle["throttled"] == [] and idle["gpus"][0]["throttle"] == {}
    assert json.loads(json.dumps(state)) == state


def test_summary_of_an_empty_window() -> None:
    rows = gpusample.read(FIXTURES / "sampler-run.jsonl")
    state = gpusample.summarize(rows, 0.0, 1.0)
    assert state["samples"] == 0 and state["gpus"] == [] and state["throttled"] == []
    assert "no GPU sample" in state["note"]
    assert gpusample.read(FIXTURES / "no-such.jsonl") == []


# -- the Sampler, end to end with the stand-in --------------------------------------------------------------------

@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH with the stand-in as its only nvidia-smi; returns the file its calls are logged in."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvidia-smi").symlink_to(FAKE)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("NVIDIA_SMI_CAPTURES", str(FIXTURES))
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("NVIDIA_SMI_CALLS", str(calls))
    monkeypatch.delenv("NVIDIA_SMI_STREAM", raising=False)
    monkeypatch.delenv("NVIDIA_SMI_UNKNOWN_FIELDS", raising=False)
    return calls


def fake_pids(tmp_path: Path) -> List[int]:
    """Processes running this test's stand-in."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and str(tmp_path / "bin") in (p / "cmdline").read_text():
                found.append(int(p.name))
        except OSError:
            continue
    return found


def until(cond: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    """Poll `cond` until it holds; fail naming `what` after `seconds` (a machine's pace is not the measure)."""
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, f"{what}: not within {seconds:g} s"
        time.sleep(0.01)


def run_for(path: Path, lines: int, **kw: object) -> tuple:
    """Sample until `lines` lines are written (the window opens at the first; this machine may be loaded, so
    time is not the measure); the sampler and the window."""
    with gpusample.Sampler(path, **kw) as s:  # type: ignore[arg-type]
        assert s.wait_first(30.0), s.note
        t0 = time.monotonic()
        until(lambda: s.samples >= lines, f"{lines} sample lines")
        t1 = time.monotonic()
    return s, t0, t1


def test_one_process_samples_at_the_interval_and_ends_with_the_block(smi: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi asked for a sample every 100 ms, and each line read as nvidia-smi prints it, not in bursts: the
    stand-in prints its next sample only when the test lets it (NVIDIA_SMI_STEP), and the line is in gpu.jsonl,
    stamped after it was let out, before the next one is."""
    path, steps = tmp_path / "gpu.jsonl", tmp_path / "steps"
    steps.mkdir()
    monkeypatch.setenv("NVIDIA_SMI_STEP", str(steps))
    let_out, seen = [], []
    with gpusample.Sampler(path, interval_s=0.1, indices=[0]) as s:
        for n in range(10):
            let_out.append(time.monotonic())
            (steps / str(n)).touch()
            until(lambda n=n: s.samples > n, f"sample {n} read")
            seen.append(time.monotonic())
            assert s.samples == n + 1  # the one let out, alone
        t0, t1 = let_out[0], time.monotonic()
    assert fake_pids(tmp_path) == [] and s._proc is not None and s._proc.poll() is not None
    calls = smi.read_text().splitlines()
    assert calls == [f"--query-gpu={EVENT} --format=csv,noheader,nounits -lms 100 -i 0"]
    rows = gpusample.read(path)
    assert s.prefix == "clocks_event_reasons" and s.note is None and s.samples == len(rows)
    assert len(rows) == 10
    assert all(records.problem(r, records.GPU_SAMPLE) is None for r in rows)
    assert [r["sample"] for r in rows] == list(range(len(rows)))
    for r, out, read in zip(rows, let_out, seen):  # stamped as read (mono_s is rounded to the millisecond)
        assert out - 1e-3 <= r["mono_s"] <= read + 1e-3, (r["mono_s"], out, read)
    state = s.summary(t0, t1)
    assert state is not None and state["gpus"][0]["clocks.mem"]["min"] == 3201
    assert state["samples"] == len({r["sample"] for r in rows if t0 <= r["mono_s"] <= t1})


def test_power_cap_in_the_stream_flags_the_window(smi: Path, tmp_path: Path) -> None:
    """The whole real stream (18 lines, 8 under SW power cap) at 50 ms: the window is throttled by power cap."""
    s, t0, t1 = run_for(tmp_path / "gpu.jsonl", 19, interval_s=0.05)
    state = s.summary(t0, t1)
    assert state is not None
    [t] = state["throttled"]
    assert (t["gpu"], t["reason"], t["kind"]) == (0, "sw_power_cap", "power cap")
    assert 0 < t["samples"] < t["of"] == state["gpus"][0]["samples"]


def test_thermal_and_hw_slowdown_are_named(smi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Derived: the real stream with HW slowdown and HW thermal slowdown set (mask 0x48 and the two answers
    Active) on its last two lines, which the real GPU never showed."""
    lines = stream_lines()
    for i in (16, 17):
        cells = lines[i].split(", ")
        cells[10], cells[12], cells[14] = "0x0000000000000048", "Active", "Active"
        lines[i] = ", ".join(cells)
    stream = tmp_path / "stream.csv"
    stream.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("NVIDIA_SMI_STREAM", str(stream))
    s, t0, t1 = run_for(tmp_path / "gpu.jsonl", 19, interval_s=0.05)
    state = s.summary(t0, t1)
    assert state is not None
    kinds = {t["reason"]: t["kind"] for t in state["throttled"]}
    assert kinds == {"sw_power_cap": "power cap", "hw_slowdown": "HW slowdown", "hw_thermal_slowdown": "thermal"}


def test_two_gpus_make_one_sample_per_instant(smi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Derived: each real line followed by a copy as GPU 1 (nvidia-smi prints one line per GPU per sample)."""
    lines = []
    for ln in stream_lines()[:8]:
        cells = ln.split(", ")
        lines += [ln, ", ".join(cells[:1] + ["1", cells[2].replace("5555", "6666")] + cells[3:])]
    stream = tmp_path / "stream.csv"
    stream.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("NVIDIA_SMI_STREAM", str(stream))
    s, t0, t1 = run_for(tmp_path / "gpu.jsonl", 10, interval_s=0.1)
    rows = gpusample.read(tmp_path / "gpu.jsonl")
    per: Dict[int, List[int]] = {}
    for r in rows:
        per.setdefault(r["sample"], []).append(r["index"])
    assert all(v == [0, 1] for k, v in per.items() if k < max(per)), per
    state = s.summary(t0 - 1, t1 + 1)
    assert state is not None and [g["index"] for g in state["gpus"]] == [0, 1]
    assert state["samples"] == len(per)


def test_older_driver_names_are_the_fallback(smi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that rejects clocks_event_reasons.* (the stand-in told to) is asked again with
    clocks_throttle_reasons.*; the records are the same."""
    monkeypatch.setenv("NVIDIA_SMI_UNKNOWN_FIELDS", "clocks_event_reasons")
    s, _, _ = run_for(tmp_path / "gpu.jsonl", 3, interval_s=0.1)
    assert s.prefix == "clocks_throttle_reasons" and s.note is None
    calls = smi.read_text().splitlines()
    assert [c.split()[0] for c in calls] == [f"--query-gpu={EVENT}", f"--query-gpu={THROTTLE}"]
    rows = gpusample.read(tmp_path / "gpu.jsonl")
    assert rows and rows[0]["reasons"] == ["gpu_idle"] and rows[0]["sw_power_cap"] is False


def test_process_ends_when_the_block_raises(smi: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="request failed"):
        with gpusample.Sampler(tmp_path / "gpu.jsonl", interval_s=0.1) as s:
            assert s.wait_first(30.0)
            raise RuntimeError("request failed")
    assert s._proc is not None and s._proc.poll() is not None
    assert fake_pids(tmp_path) == []


def test_without_nvidia_smi_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No nvidia-smi on PATH: no process, no gpu.jsonl, a note, and no gpu_state (summary None)."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with gpusample.Sampler(tmp_path / "gpu.jsonl") as s:
        t0 = time.monotonic()
        assert s.wait_first(0.1) is False
        t1 = time.monotonic()
    assert not (tmp_path / "gpu.jsonl").exists()
    assert s.available is False and s._thread is None and s.summary(t0, t1) is None
    assert s.note == "no nvidia-smi on PATH: GPU state not sampled"


def write_tool(folder: Path, body: str) -> None:
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)


def test_failing_nvidia_smi_leaves_an_empty_file_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi present but the driver unreachable (its real message and exit status 9)."""
    said = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
            "NVIDIA driver is installed and running.")
    write_tool(tmp_path / "bin", f'echo "{said}"\nexit 9\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    with gpusample.Sampler(tmp_path / "gpu.jsonl") as s:
        t0 = time.monotonic()
        assert s.wait_first(2.0) is False
        s._thread.join(20)  # type: ignore[union-attr]  # the reader ends when nvidia-smi does
        t1 = time.monotonic()
    assert (tmp_path / "gpu.jsonl").read_text() == ""
    assert s.note is not None and "rc 9" in s.note and "couldn't communicate" in s.note
    state = s.summary(t0, t1)
    assert state is not None and state["samples"] == 0 and state["throttled"] == [] and "rc 9" in state["note"]


def test_a_silent_nvidia_smi_never_holds_the_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An nvidia-smi that hangs without a line (for an hour): the block is entered while it is silent, and left
    with it ended, without a line."""
    write_tool(tmp_path / "bin", "exec sleep 3600\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    t = time.monotonic()
    with gpusample.Sampler(tmp_path / "gpu.jsonl") as s:
        entered = time.monotonic() - t
        until(lambda: s._proc is not None, "nvidia-smi started")  # leaving must end a running one
        assert s.samples == 0
        t = time.monotonic()
    left = time.monotonic() - t
    # hang detectors: a block that waited for this nvidia-smi would wait for its hour
    assert entered < 30 and left < 30, (entered, left)
    assert s._proc is not None and s._proc.poll() is not None
    assert s.note == "no sample before the block ended"
