"""The plan of a packed suite: ct200's profile with `bench_pack`, its per-slot timelines and phase estimates, the
pack check in the config list, and named slots rejected with the field before anything starts."""
from __future__ import annotations

import re
from typing import Any

import pytest

from controller import matrix, plan
from tests.controller.test_matrix import suite_from_host_vars


def build(suite: dict[str, Any], **extra: Any) -> dict[str, Any]:
    args = {"suite": suite, "run_id": "r1", "host_dir": "/var/lib/specfleet", "agent_python": "/usr/bin/python3",
            "limits": {}, **extra}
    return plan.build(args, {"inventory_hostname": "ct200"})


def seconds(hms: str) -> int:
    h, m, s = (int(x) for x in hms.split(":"))
    return 3600 * h + 60 * m + s


def test_ct200_packed_plan_shows_each_slot_and_each_phase_against_one_at_a_time() -> None:
    suite = {**suite_from_host_vars("ct200"), "pack": True}
    out = build(suite)
    assert not out.get("failed"), out.get("msg")
    text = "\n".join(out["plan_lines"])
    serial = sum(c["estimate_s"] for c in out["configs"])
    head = re.search(r"estimated (\d+:\d\d:\d\d) packed \((\d+:\d\d:\d\d) one at a time\)", text)
    assert head and abs(seconds(head[2]) - serial) <= 1
    assert abs(seconds(head[1]) - out["estimate_s"]) <= 1 and out["estimate_s"] < serial
    tp1 = [c for c in out["configs"] if c["phase"] == "tp1"]
    base = next(c for c in tp1 if c["method"] == "autoregressive")
    longest = max(c["estimate_s"] for c in tp1 if c is not base)
    phase = re.search(r"phase tp1: 8 slots, ~(\S+) packed against ~(\S+) one at a time \((\S+)x shorter\)", text)
    assert phase, text
    # the baseline first, the others beside it from the start, each sending its requests from the baseline's
    # gate (its startup, as long as theirs on this profile): 8 others on 7 free slots, so the phase lasts the
    # longest config (the two shortest share a slot within that time); at least 5.5x shorter than one at a time
    ready = base["estimate_ready_s"]
    assert ready == 240 and abs(seconds(phase[1]) - max(base["estimate_s"], longest)) <= 1
    assert abs(seconds(phase[2]) - sum(c["estimate_s"] for c in tp1)) <= 1
    assert float(phase[3]) == pytest.approx(sum(c["estimate_s"] for c in tp1) / max(base["estimate_s"], longest),
                                            abs=0.05)
    assert float(phase[3]) >= 5.5
    for g in range(8):
        assert f"    slot {g} (GPU {g}): " in text
    assert "    slot 0 (GPU 0): 0:00:00-0:30:35 tp1-autoregressive\n" in text + "\n"
    assert "    slot 1 (GPU 1): 0:00:00-" in text
    assert re.search(r"phase tp4: 2 slots, .*\n    slot 0 \(GPUs 0,1,2,3\): .*\n    slot 1 \(GPUs 4,5,6,7\): ", text)
    assert re.search(r"phase tp8: 1 slot, one config at a time \(tp 8 of 8 GPUs", text)
    assert not any(c.get("pack_check_of") for c in out["configs"])


def test_pack_check_adds_the_baseline_again_in_packed_phases_only() -> None:
    suite = {**suite_from_host_vars("ct200"), "pack": True, "pack_check": True}
    out = build(suite)
    checks = {c["config_id"]: c for c in out["configs"] if c.get("pack_check_of")}
    assert sorted(checks) == ["tp1-autoregressive-packed", "tp4-autoregressive-packed"]  # tp8 has one slot
    base = next(c for c in out["configs"] if c["config_id"] == "tp1-autoregressive")
    copy = checks["tp1-autoregressive-packed"]
    assert copy["pack_check_of"] == "tp1-autoregressive" and copy["cells"] == base["cells"]
    assert copy["method"] == "autoregressive" and copy["command"] == base["command"]
    text = "\n".join(out["plan_lines"])
    assert "    slot 0 (GPU 0): 0:00:00-0:30:35 tp1-autoregressive; 0:30:35-1:01:10 tp1-autoregressive-packed" in text


def test_an_unpacked_plan_says_nothing_of_slots() -> None:
    out = build(suite_from_host_vars("ct200"))
    text = "\n".join(out["plan_lines"])
    assert "slot" not in text and " packed" not in text
    assert out["estimate_s"] == pytest.approx(sum(c["estimate_s"] for c in out["configs"]))


@pytest.mark.parametrize(("over", "field"), [
    ({"pack": True, "slots": [{"gpus": [0, 1]}]}, "bench_slots[0].gpus: 2 GPU(s) [0, 1], but phase tp1 runs tp 1"),
    ({"pack": True, "slots": [{"cpus": "0-3"}, {"cpus": "zero"}]},
     "bench_slots[1].cpus: 'zero' is not a CPU list; allowed: CPU numbers"),
    ({"pack": "sometimes"}, "bench_pack: 'sometimes' is not"),
    ({"pack_check": True}, "bench_pack_check: true needs bench_pack: true"),
])
def test_bad_slots_fail_the_plan_naming_the_field(over: dict[str, Any], field: str) -> None:
    out = build({**suite_from_host_vars("ct200"), **over})
    assert out.get("failed") and field in out["msg"], out.get("msg")
    with pytest.raises(matrix.MatrixError):
        matrix.validate({**suite_from_host_vars("ct200"), **over})
