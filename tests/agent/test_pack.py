"""Packing: a phase's slots, what is wrong with named slots, the timeline the plan prints and the agent follows,
the neighbours of each config, and the systemd drop-in that confines a unit to its slot."""
from __future__ import annotations

from typing import Any, Dict, List

import pytest

from agent import pack
from agent.pack import Slot
from agent.systemd import device_allow, slot_dropin


def suite(**over: Any) -> Dict[str, Any]:
    s: Dict[str, Any] = {"pack": True, "phases": [{"name": "tp1", "tp": 1}, {"name": "tp4", "tp": 4},
                                                  {"name": "tp8", "tp": 8}]}
    s.update(over)
    return s


def test_slots_one_per_tp_gpus_of_the_host() -> None:
    s = suite()
    assert [x.gpus for x in pack.slots(s, "tp1", 1, 8)] == [(i,) for i in range(8)]
    assert [x.gpus for x in pack.slots(s, "tp4", 4, 8)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert pack.slots(s, "tp8", 8, 8) == [Slot(0)]  # one config fills the host: nothing to pack
    assert pack.slots(s, "tp4", 4, 6) == [Slot(0)]
    assert pack.slots(s, "tp1", 1, 0) == [Slot(0)]  # a CPU host without named CPU sets


def test_no_packing_unless_asked() -> None:
    assert pack.slots(suite(pack=False, slots=[{"cpus": "0"}, {"cpus": "1"}]), "tp1", 1, 8) == [Slot(0)]


def test_named_slots_and_a_phases_own_replace_the_derived_ones() -> None:
    s = suite(slots=[{"cpus": "0"}, {"cpus": 1}])
    assert pack.slots(s, "tp1", 1, 0) == [Slot(0, (), "0"), Slot(1, (), "1")]
    s["phases"][1]["slots"] = [{"gpus": [4, 5, 6, 7], "cpus": "32-63"}, {"gpus": [0, 1, 2, 3], "cpus": "0-31"}]
    assert pack.slots(s, "tp4", 4, 8) == [Slot(0, (4, 5, 6, 7), "32-63"), Slot(1, (0, 1, 2, 3), "0-31")]


def test_a_slot_gives_its_server_only_its_gpus_numbered_like_nvidia_smi() -> None:
    assert Slot(1, (2, 3)).env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert Slot(0, (), "0-3").env() == {}
    assert Slot(1, (2, 3), "8-15").record() == {"index": 1, "gpus": [2, 3], "cpus": "8-15"}
    assert Slot(0, (5,)).describe() == "slot 0 (GPU 5)" and Slot(0).describe() == "slot 0 (the whole host)"


@pytest.mark.parametrize(("text", "cpus"), [("0", [0]), ("0-3,8", [0, 1, 2, 3, 8]), ("2-2", [2])])
def test_cpu_lists(text: str, cpus: List[int]) -> None:
    assert pack.cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["", "0-", "a", "3-1", "0,,1", "0 1", "-1"])
def test_not_cpu_lists(text: str) -> None:
    with pytest.raises(ValueError):
        pack.cpu_list(text)


@pytest.mark.parametrize(("over", "gpus", "expected"), [
    ({"slots": [{"gpus": [0, 1]}]}, 8, "bench_slots[0].gpus: 2 GPU(s) [0, 1], but phase tp1 runs tp 1"),
    ({"slots": [{"gpus": [0]}, {"gpus": [0]}]}, 8, "bench_slots[1].gpus: GPU 0 is also in slot 0"),
    ({"slots": [{"gpus": [9]}]}, 8, "bench_slots[0].gpus: GPU 9 does not exist (the host has 8: 0-7)"),
    ({"slots": [{"gpus": [0]}]}, 0, "bench_slots[0].gpus: the host has no GPUs"),
    ({"slots": [{"cpus": "0-1"}, {"cpus": "1"}]}, 0, "bench_slots[1].cpus: CPU 1 is also in slot 0"),
    ({"slots": [{"cpus": "3-1"}]}, 0, "bench_slots[0].cpus: '3-1': the range runs backwards"),
    ({"slots": [{"gpus": [0], "cpus": "0"}, {"cpus": "1"}]}, 8, "bench_slots: some slots name GPUs and some do not"),
    ({"pack": False, "pack_check": True}, 8, "bench_pack_check: true needs bench_pack: true"),
    ({"port": 8000}, 8, "bench_port: 8000 is one fixed port, but phase tp1 runs configs at once"),
])
def test_slot_problems_name_the_field(over: Dict[str, Any], gpus: int, expected: str) -> None:
    s = {**suite(**over), "phases": [{"name": "tp1", "tp": 1}]}
    found = pack.problems(s, gpus)
    assert any(line.startswith(expected) for line in found), found


def test_good_slots_have_no_problems() -> None:
    s = suite(slots=[{"cpus": "0"}, {"cpus": "1"}], phases=[{"name": "tp1", "tp": 1}])
    assert pack.problems(s, 0) == []
    s = suite(phases=[{"name": "tp4", "tp": 4, "slots": [{"gpus": [0, 1, 2, 3]}, {"gpus": [4, 5, 6, 7]}]}])
    assert pack.problems(s, 8) == []


def cfg(cid: str, est: float, method: str = "dflash", phase: str = "tp1", **more: Any) -> Dict[str, Any]:
    return {"config_id": cid, "phase": phase, "method": method, "estimate_s": est, **more}


def test_timeline_baseline_alone_then_longest_first_on_the_slot_that_frees_first() -> None:
    base = cfg("tp1-ar", 100, "autoregressive")
    configs = [base, pack.check_copy(base), cfg("a", 30), cfg("b", 90), cfg("c", 60), cfg("d", 20),
               cfg("tp4-ar", 50, "autoregressive", "tp4"), cfg("e", 10, phase="tp4")]
    two = [Slot(0, (0,)), Slot(1, (1,))]
    placed = {p.config_id: p for p in pack.timeline(configs, {"tp1": two, "tp4": [Slot(0)]})}
    assert (placed["tp1-ar"].slot.index, placed["tp1-ar"].start_s, placed["tp1-ar"].end_s) == (0, 0, 100)
    # then the pack check first, the others longest first, each on the slot that frees first
    assert (placed["tp1-ar-packed"].slot.index, placed["tp1-ar-packed"].start_s) == (0, 100)
    assert (placed["b"].slot.index, placed["b"].start_s) == (1, 100)
    assert (placed["c"].slot.index, placed["c"].start_s) == (1, 190)
    assert (placed["a"].slot.index, placed["a"].start_s) == (0, 200)
    assert (placed["d"].slot.index, placed["d"].start_s) == (0, 230)
    # the next phase starts when the last slot of this one is free, and runs one at a time
    assert (placed["tp4-ar"].start_s, placed["e"].start_s, placed["e"].end_s) == (250, 300, 310)
    assert pack.check_copy(base)["pack_check_of"] == "tp1-ar"


def test_timeline_without_the_pack_check_starts_the_others_beside_the_baseline() -> None:
    """The other slots start with the baseline; a config up before the baseline's gate (its server up and its
    warmup answered, 20 s here) sends its first request only then."""
    configs = [cfg("tp1-ar", 100, "autoregressive", estimate_ready_s=20), cfg("a", 30, estimate_ready_s=10),
               cfg("b", 90, estimate_ready_s=5), cfg("c", 60, estimate_ready_s=20), cfg("d", 20, estimate_ready_s=10)]
    two = [Slot(0, (0,)), Slot(1, (1,))]
    placed = {p.config_id: (p.slot.index, p.start_s, p.end_s) for p in pack.timeline(configs, {"tp1": two})}
    # b: up at 5, waits for the gate at 20, then its 85 s of requests; the rest as their slots free
    assert placed == {"tp1-ar": (0, 0, 100), "b": (1, 0, 105), "c": (0, 100, 160), "a": (1, 105, 135),
                      "d": (1, 135, 155)}
    assert pack.gate_s(configs[0], configs) == 20
    # with the pack check in the phase the baseline is alone to its end, and the others start after it
    check = [*configs, pack.check_copy(configs[0])]
    assert pack.alone(check) and pack.gate_s(configs[0], check) == 100
    after = [p for p in pack.timeline(check, {"tp1": two}) if p.config_id != "tp1-ar"]
    assert min(p.start_s for p in after) == 100


def test_timeline_of_an_unpacked_suite_is_the_sum() -> None:
    configs = [cfg("ar", 10, "autoregressive"), cfg("x", 20), cfg("y", 5)]
    assert max(p.end_s for p in pack.timeline(configs, {"tp1": [Slot(0)]})) == 35


def test_neighbours_are_the_configs_up_at_the_same_time() -> None:
    spans = {"ar": {"slot": 0, "up": [0, 100], "timed": [50, 100]},
             "x": {"slot": 0, "up": [100, 200], "timed": [150, 190]},
             "y": {"slot": 1, "up": [100, 160], "timed": [120, 160]},
             "z": {"slot": 1, "up": [160, 230], "timed": None}}
    near = pack.neighbours(spans)
    assert near["ar"] == []
    assert near["x"] == [{"config_id": "y", "slot": 1, "overlap_s": 60, "timed_overlap_s": 10},
                         {"config_id": "z", "slot": 1, "overlap_s": 40, "timed_overlap_s": 0}]
    assert [n["config_id"] for n in near["y"]] == ["x"] and [n["config_id"] for n in near["z"]] == ["x"]


SHOW = """DeviceAllow=/dev/nvidia0 rw
DeviceAllow=/dev/nvidia1 rw
DeviceAllow=/dev/nvidia10 rw
DeviceAllow=/dev/nvidiactl rw
DeviceAllow=/dev/nvidia-uvm rw
DeviceAllow=/dev/nvidia-caps/nvidia-cap1 r
"""


def test_the_dropin_keeps_the_slots_gpus_and_the_shared_nodes_only() -> None:
    allowed = device_allow(SHOW)
    assert allowed[0] == "/dev/nvidia0 rw" and len(allowed) == 6
    assert device_allow("DeviceAllow=\n") == []
    text = slot_dropin(Slot(1, (1, 10), "8-15,40"), allowed)
    lines = text.splitlines()
    assert lines[1:] == ["[Service]", "CPUAffinity=8-15 40", "AllowedCPUs=8-15,40", "DeviceAllow=",
                         "DeviceAllow=/dev/nvidia1 rw", "DeviceAllow=/dev/nvidia10 rw", "DeviceAllow=/dev/nvidiactl rw",
                         "DeviceAllow=/dev/nvidia-uvm rw", "DeviceAllow=/dev/nvidia-caps/nvidia-cap1 r"]
    cpu_only = slot_dropin(Slot(0, (), "0"), allowed).splitlines()
    assert "DeviceAllow=" not in cpu_only and "AllowedCPUs=0" in cpu_only
