"""Unit tests for agent.gpu on real captures from an H200 host (tests/fixtures/nvidia-h200)."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from agent.gpu import (
    RELEASE_TOLERANCE_MIB,
    driver_from_proc,
    parse_query_csv,
    parse_smi_xml,
    released,
    used_by_index,
    wait_released,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-h200"

H200_TOTAL_MIB = 143771


def capture(name: str) -> str:
    return (FIXTURES / name).read_text()


def held_used_mib() -> int:
    """memory.used while a process held ~20 GB: the `--query-gpu=memory.used --format=csv` section of
    gpu-hold.log, read with the parser under test (header with units, value with units)."""
    text = capture("gpu-hold.log")
    section = text[text.index("memory.used [MiB]"):]
    rows = parse_query_csv(section.split("\n\n")[0])
    assert len(rows) == 1
    return int(rows[0]["memory.used"])


def query_csv_with_used(used_mib: int) -> str:
    """The real query-gpu.csv with memory.used/free replaced: what `query()` returns at that usage."""
    header, values = [ln for ln in capture("query-gpu.csv").splitlines() if ln.strip()]
    names = [h.strip() for h in header.split(",")]
    cells = [v.strip() for v in values.split(",")]
    cells[names.index("memory.used [MiB]")] = f"{used_mib} MiB"
    cells[names.index("memory.free [MiB]")] = f"{H200_TOTAL_MIB - 615 - used_mib} MiB"
    return header + "\n" + ", ".join(cells) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# Parsers
# ---------------------------------------------------------------------------------------------------------------

def test_parse_query_csv_real_capture() -> None:
    """query-gpu.csv (header with units): one H200, 143771 MiB total, 0 used, driver 580.159.04, cc 9.0."""
    rows = parse_query_csv(capture("query-gpu.csv"))
    assert len(rows) == 1
    g = rows[0]
    assert g["index"] == 0
    assert g["name"] == "NVIDIA H200"
    assert g["memory.total"] == H200_TOTAL_MIB
    assert g["memory.used"] == 0
    assert g["memory.free"] == 143156
    assert str(g["driver_version"]) == "580.159.04"
    assert float(g["compute_cap"]) == pytest.approx(9.0)
    assert g["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"
    assert g["persistence_mode"] == "Enabled"
    assert used_by_index(rows) == {0: 0}


def test_parse_query_csv_noheader_nounits_with_fields() -> None:
    """`--format=csv,noheader,nounits` text with the header given as `fields`."""
    rows = parse_query_csv("0, 19601\n1, 3\n", fields="index,memory.used")
    assert rows == [{"index": 0, "memory.used": 19601}, {"index": 1, "memory.used": 3}]
    assert used_by_index(rows) == {0: 19601, 1: 3}


def test_parse_query_csv_empty_text() -> None:
    """No output (no GPUs) gives no rows."""
    assert parse_query_csv("") == []
    assert parse_query_csv("\n\n", fields="index,memory.used") == []


def test_parse_smi_xml_real_capture() -> None:
    """`nvidia-smi -q -x`: driver 580.159.04, CUDA 13.0, one GPU with 143771 MiB of framebuffer."""
    info = parse_smi_xml(capture("nvidia-smi-q.xml"))
    assert info["driver_version"] == "580.159.04"
    assert info["cuda_version"] == "13.0"
    assert info["count"] == 1
    assert len(info["gpus"]) == 1
    assert info["gpus"][0]["name"] == "NVIDIA H200"
    assert info["gpus"][0]["memory_total_mib"] == H200_TOTAL_MIB  # fb_memory_usage, not bar1 (262144)
    assert info["gpus"][0]["memory_used_mib"] == 0


def test_driver_from_proc_real_capture() -> None:
    """/proc/driver/nvidia/version of the open kernel module."""
    assert driver_from_proc(capture("proc-driver-version.txt")) == "580.159.04"
    assert driver_from_proc("no driver here\n") is None


def test_held_reading_from_capture() -> None:
    """The gpu-hold.log reading is what the release tests below use: 19601 MiB in use."""
    assert held_used_mib() == 19601
    assert used_by_index(parse_query_csv(query_csv_with_used(19601))) == {0: 19601}


# ---------------------------------------------------------------------------------------------------------------
# released()
# ---------------------------------------------------------------------------------------------------------------

def test_released_held_vs_free() -> None:
    """Idle 0 MiB: 19601 MiB in use (a process holding 20 GB) is not released; 0 MiB is."""
    assert released({0: 0}, {0: held_used_mib()}) is False
    assert released({0: 0}, {0: 0}) is True


@pytest.mark.parametrize(("used", "expected"), [
    (RELEASE_TOLERANCE_MIB - 1, True),
    (RELEASE_TOLERANCE_MIB, True),
    (RELEASE_TOLERANCE_MIB + 1, False),
])
def test_released_tolerance_boundary(used: int, expected: bool) -> None:
    """Within the tolerance of the idle level counts as released; one MiB beyond does not."""
    assert RELEASE_TOLERANCE_MIB == 1024
    assert released({0: 0}, {0: used}) is expected
    assert released({0: 500}, {0: 500 + used}) is expected


def test_released_custom_tolerance_and_every_gpu() -> None:
    """tolerance_mib is honoured, and every GPU must be back, not just one."""
    assert released({0: 0}, {0: 1}, tolerance_mib=0) is False
    assert released({0: 0}, {0: 0}, tolerance_mib=0) is True
    assert released({0: 0, 1: 0}, {0: 0, 1: 19601}) is False
    assert released({0: 0, 1: 0}, {0: 3, 1: 0}) is True


# ---------------------------------------------------------------------------------------------------------------
# wait_released()
# ---------------------------------------------------------------------------------------------------------------

class Clock:
    """agent.gpu's `time`, faked: `monotonic` reads `now`, which only `sleep` moves on (by what it is asked), so
    that a wait's deadline and its polls are counted exactly, however fast the machine."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    import agent.gpu

    fake = Clock()
    monkeypatch.setattr(agent.gpu, "time", fake)
    return fake


def sequence_reader(held_calls: int, held: str, free: str,
                    clock: Optional[Clock] = None) -> tuple[Callable[[], Optional[str]], list[float]]:
    """A `read` returning `held` for the first `held_calls` calls, then `free`; records call times (on `clock`)."""
    calls: list[float] = []

    def read() -> Optional[str]:
        calls.append(clock.now if clock is not None else time.monotonic())
        return held if len(calls) <= held_calls else free

    return read, calls


def test_wait_released_after_k_held_readings() -> None:
    """Held for 3 polls, then free: released, last reading {0: 0}, and polling stops there."""
    read, calls = sequence_reader(3, query_csv_with_used(held_used_mib()), query_csv_with_used(0))
    ok, now = wait_released({0: 0}, deadline_s=5.0, read=read, interval=0.01)
    assert ok is True
    assert now == {0: 0}
    assert len(calls) == 4


def test_wait_released_like_release_log(clock: Clock) -> None:
    """release.log: memory back 0.204 s after the kill. A reader that is held until then is waited for, and the
    wait ends at the first poll that finds it back (polls every 0.05 s: at 0.25 s)."""
    m = re.search(r"kill->memory released s ([0-9.]+) used after (\d+)", capture("release.log"))
    assert m, "release.log format changed"
    release_after, used_after = float(m.group(1)), int(m.group(2))
    held, free = query_csv_with_used(29139), query_csv_with_used(used_after)
    seen: list[float] = []

    def read() -> str:
        seen.append(clock.now)
        return free if clock.now >= release_after else held

    ok, now = wait_released({0: 0}, deadline_s=30.0, read=read, interval=0.05)
    assert ok is True
    assert now == {0: used_after}
    assert all(t < release_after for t in seen[:-1]) and release_after <= seen[-1] < release_after + 0.05
    assert clock.now == seen[-1]  # no sleep after the reading that found it back


def test_wait_released_times_out_when_always_held(clock: Clock) -> None:
    """Always held, deadline 0.5 s, a poll every 0.1 s: (False, the held reading), at the deadline and not before,
    after a reading at each poll."""
    held = query_csv_with_used(held_used_mib())
    read, calls = sequence_reader(10**9, held, held, clock)
    ok, now = wait_released({0: 0}, deadline_s=0.5, read=read, interval=0.1)
    assert ok is False
    assert now == {0: 19601}
    assert clock.now == pytest.approx(0.5)
    assert calls == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])


def test_wait_released_no_gpus_returns_at_once(clock: Clock) -> None:
    """idle {} (no GPUs at start): released at once, even if a reading would look busy."""
    read, calls = sequence_reader(10**9, query_csv_with_used(held_used_mib()), "", clock)
    ok, _ = wait_released({}, deadline_s=10.0, read=read, interval=1.0)
    assert ok is True
    assert clock.slept == [] and len(calls) <= 1


def test_wait_released_unreadable_smi_is_not_released() -> None:
    """If nvidia-smi stops answering while the GPU was known busy, the wait must not claim it is free."""
    ok, _ = wait_released({0: 0}, deadline_s=0.2, read=lambda: None, interval=0.05)
    assert ok is False


def test_driver_versions_stay_strings() -> None:
    """A two-part driver version such as 575.51 must not turn into a float."""
    from agent.gpu import parse_query_csv

    rows = parse_query_csv("index, driver_version, memory.used [MiB]\n0, 575.51, 3 MiB\n")
    assert rows == [{"index": 0, "driver_version": "575.51", "memory.used": 3}]
