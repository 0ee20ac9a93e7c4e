"""Matrix validation (each bad input names its field) and expansion into ordered configs."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.engines import flag_value
from controller import matrix

ROOT = Path(__file__).resolve().parents[2]
SUITE_KEYS = tuple(matrix.SCHEMA["properties"])  # every bench_* variable of the matrix, from its one definition


def suite_from_host_vars(host: str) -> dict[str, Any]:
    """The suite as the bench role assembles it: role defaults overlaid with host_vars."""
    defaults = yaml.safe_load((ROOT / "roles/bench/defaults/main.yml").read_text())
    host_vars = yaml.safe_load((ROOT / f"host_vars/{host}.yml").read_text())
    merged = {**defaults, **host_vars}
    return {k: merged[f"bench_{k}"] for k in SUITE_KEYS if f"bench_{k}" in merged}


def base() -> dict[str, Any]:
    return {
        "engine": "sglang", "engine_python": "/py", "gpu_count": 4,
        "model": {"name": "m", "path": "/m", "max_model_len": 4096},
        "draft_model": {"name": "d", "path": "/d"},
        "phases": [{"name": "tp1", "tp": 1,
                    "configs": [{"method": "autoregressive"}, {"method": "ddtree", "budget": 16}],
                    "sweeps": [{"workloads": ["fib"], "max_tokens": [256]}]}],
    }


def error_of(suite: dict[str, Any], phases: list[str] | None = None) -> str:
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.validate(suite, phases)
    return str(exc.value)


def mutate(path: str, value: Any) -> dict[str, Any]:
    s = copy.deepcopy(base())
    obj: Any = s
    keys = path.split(".")
    for k in keys[:-1]:
        obj = obj[int(k)] if k.isdigit() else obj[k]
    last = keys[-1]
    if value is KeyError:
        del obj[last]
    elif last.isdigit():
        obj[int(last)] = value
    else:
        obj[last] = value
    return s


@pytest.mark.parametrize("path, value, expected", [
    ("phases.0.configs.1.method", "medusa2", "bench_phases[0].configs[1].method: 'medusa2' is not one of"),
    ("phases.0.configs.1.budget", 0, "bench_phases[0].configs[1].budget: 0 is less than the minimum of 1"),
    ("phases.0.configs.1.budget", "16", "bench_phases[0].configs[1].budget: '16' is not of type 'integer'"),
    ("phases.0.configs.1.budget", KeyError,
     "bench_phases[0].configs[1].budget: is required for method ddtree; allowed: an integer from 1 to 1024"),
    ("phases.0.sweeps.0.max_tokens", [0], "bench_phases[0].sweeps[0].max_tokens[0]: 0 is less than the minimum"),
    ("phases.0.sweeps.0.max_tokens", [-5], "bench_phases[0].sweeps[0].max_tokens[0]: -5 is less than the minimum"),
    ("phases.0.sweeps.0.workloads", ["poem"], "bench_phases[0].sweeps[0].workloads[0]: unknown workload 'poem'"),
    ("phases.0.tp", 8, "bench_phases[0].tp: 8 is above the host's GPU count (4)"),
    ("engine", "tgi", "bench_engine: 'tgi' is not one of llamacpp, sglang, vllm"),
    ("phases.0.configs.1.speed", 3,
     "bench_phases[0].configs[1].speed: unknown key; allowed keys: block_size, budget, draft_model"),
    ("phases", [], "bench_phases: [] should be non-empty"),
    ("phases.0.configs.0", {"method": "ngram"},
     "bench_phases[0].configs[0].num_speculative_tokens: is required for method ngram; "
     "allowed: an integer from 1 to 64"),
    ("phases.0.sweeps.0.concurrency", [0], "bench_phases[0].sweeps[0].concurrency[0]: 0 is less than the minimum"),
    ("repetitions", 0, "bench_repetitions: 0 is less than the minimum of 1"),
])
def test_bad_input_names_the_field(path: str, value: Any, expected: str) -> None:
    assert expected in error_of(mutate(path, value))


def test_duplicate_config_ids() -> None:
    s = base()
    s["phases"][0]["configs"].append({"method": "ddtree", "budget": 16})
    assert "bench_phases[0].configs[2]: duplicate config id 'tp1-ddtree-b16'" in error_of(s)


def test_budget_only_for_ddtree() -> None:
    assert "only method ddtree takes a budget" in error_of(mutate("phases.0.configs.1", {"method": "dflash",
                                                                                         "budget": 4}))


def test_method_not_supported_by_engine() -> None:
    s = mutate("engine", "vllm")
    assert "bench_phases[0].configs[1].method: 'ddtree' is not supported by engine vllm" in error_of(s)


def test_baseline_required_in_every_phase() -> None:
    s = mutate("phases.0.configs", [{"method": "ddtree", "budget": 8}])
    assert "bench_phases[0].configs: every phase needs an autoregressive baseline" in error_of(s)


def test_draft_model_required() -> None:
    s = mutate("draft_model", None)
    assert "bench_phases[0].configs[1].draft_model: method ddtree needs a draft model" in error_of(s)


def test_context_longer_than_model() -> None:
    s = mutate("phases.0.sweeps.0.context_tokens", [4000])
    assert "bench_phases[0].sweeps[0].context_tokens: context + max_tokens = 4256 exceeds" in error_of(s)


def test_cpu_host_allows_tp1_only() -> None:
    s = mutate("gpu_count", 0)
    s["phases"][0]["tp"] = 2
    assert "bench_phases[0].tp: 2 is above the host's GPU count (0); allowed 1..1" in error_of(s)


def test_unknown_phase_selected() -> None:
    assert "phases: unknown phase 'tp9'; allowed: tp1" in error_of(base(), ["tp9"])


def test_sweep_method_subset_must_name_configs() -> None:
    s = mutate("phases.0.sweeps.0.methods", ["ddtree-b99"])
    assert "bench_phases[0].sweeps[0].methods[0]: 'ddtree-b99' is not a config of phase tp1" in error_of(s)


def test_expansion_puts_baseline_first_and_counts_requests() -> None:
    s = base()
    s["phases"][0]["configs"].reverse()
    s["phases"][0]["sweeps"] = [
        {"workloads": ["fib", "json"], "max_tokens": [256], "concurrency": [1, 4], "repetitions": 3},
        {"workloads": ["arith"], "context_tokens": [3000], "methods": ["ddtree-b16"], "repetitions": 2},
    ]
    configs = matrix.expand(s)
    assert [c["config_id"] for c in configs] == ["tp1-autoregressive", "tp1-ddtree-b16"]
    # 2 workloads x (1 + 4 concurrent) x 3 reps, plus 1 context cell x 2 reps for both
    assert [c["requests"] for c in configs] == [32, 32]
    assert configs[1]["method_params"] == {"budget": 16}
    assert configs[0]["draft_model"] is None and configs[1]["draft_model"]["path"] == "/d"


def test_open_loop_cells_carry_their_schedule_and_the_limits_stay_out_of_the_digest() -> None:
    """request_rates beside concurrency: a closed-loop cell per concurrency, then an open-loop cell per rate
    (concurrency 0, its arrival, requests per repetition from `requests` or rate × duration_s, seed); the sweep's
    slo, else bench_slo, on every cell; the requests counted from both; new limits change no config digest."""
    from agent.config_run import config_digest

    s = base()
    s["slo"] = {"ttft_ms": 2000}
    s["phases"][0]["sweeps"] = [
        {"workloads": ["fib"], "concurrency": [1, 2], "request_rates": [0.5, "inf"], "requests": 6,
         "repetitions": 2},
        {"workloads": ["json"], "request_rates": [4], "duration_s": 2.5, "arrival": "constant", "seed": 7,
         "slo": {"tpot_ms": 50, "attainment": 0.5}, "repetitions": 1},
    ]
    base_cfg = matrix.expand(s)[0]
    loads = [(c["workload"], c["concurrency"], c.get("request_rate"), c.get("arrival"), c.get("requests"),
              c.get("seed"), c["slo"]) for c in base_cfg["cells"]]
    assert loads == [("fib", 1, None, None, None, None, {"ttft_ms": 2000}),
                     ("fib", 2, None, None, None, None, {"ttft_ms": 2000}),
                     ("fib", 0, 0.5, "poisson", 6, 0, {"ttft_ms": 2000}),
                     ("fib", 0, "inf", "poisson", 6, 0, {"ttft_ms": 2000}),
                     ("json", 0, 4, "constant", 10, 7, {"tpot_ms": 50, "attainment": 0.5})]
    assert base_cfg["requests"] == (1 + 2 + 6 + 6) * 2 + 10
    s["slo"] = {"ttft_ms": 100}
    assert config_digest(matrix.expand(s)[0]) == config_digest(base_cfg)
    s["phases"][0]["sweeps"][1]["seed"] = 8
    assert config_digest(matrix.expand(s)[0]) != config_digest(base_cfg)


def test_sweep_subset_leaves_other_methods_out() -> None:
    s = base()
    s["phases"][0]["configs"].append({"method": "dflash"})
    s["phases"][0]["sweeps"].append({"workloads": ["qsort"], "max_tokens": [2048], "methods": ["dflash"]})
    by_id = {c["config_id"]: c for c in matrix.expand(s)}
    assert {c["workload"] for c in by_id["tp1-ddtree-b16"]["cells"]} == {"fib"}
    assert {c["workload"] for c in by_id["tp1-dflash"]["cells"]} == {"fib", "qsort"}
    assert {c["workload"] for c in by_id["tp1-autoregressive"]["cells"]} == {"fib", "qsort"}


def test_shipped_profiles_are_valid() -> None:
    local = matrix.expand(suite_from_host_vars("local"))
    assert [c["config_id"] for c in local] == ["tp1-autoregressive", "tp1-ngram-k2", "tp1-ngram-k4",
                                               "tp1-draft_model-k3", "tp1-dflash-blk4", "tp1-dflash-blk8",
                                               "tp1-eagle3-k3"]
    # 3 reps of: 4 workloads x 2 contexts at 128 tokens, and for the baseline and the n-gram and draft-model configs
    # (the load and rate sweeps' `methods`) fib at 64 tokens at 1, 2, 4 and 8 concurrent and 8 requests at each of
    # 3 rates
    loaded = {"tp1-autoregressive", "tp1-ngram-k2", "tp1-ngram-k4", "tp1-draft_model-k3"}
    assert {c["config_id"]: c["requests"] for c in local} == {
        c["config_id"]: 3 * (4 * 2 + (1 + 2 + 4 + 8 + 3 * 8 if c["config_id"] in loaded else 0)) for c in local}
    ct200 = matrix.expand(suite_from_host_vars("ct200"))
    assert len(ct200) == 27
    assert [c["config_id"] for c in ct200[:9]] == [
        "tp1-autoregressive", "tp1-dflash", "tp1-dflash-nooverlap", "tp1-ddtree-b8", "tp1-ddtree-b12",
        "tp1-ddtree-b15", "tp1-ddtree-b16", "tp1-ddtree-b32", "tp1-ddtree-b64"]
    assert {c["tp"] for c in ct200} == {1, 4, 8}
    assert [c["config_id"] for c in matrix.expand(suite_from_host_vars("ct200"), ["tp4"])][0] == "tp4-autoregressive"


# --- concurrency above what the server runs at once ---------------------------------------------------------------

def batch_suite(engine: str, concurrency: int, gpus: int = 0, mib: int = 0, tp: int = 1,
                suite_args: tuple[str, ...] = (), phase_args: tuple[str, ...] = (), cfg_args: tuple[str, ...] = (),
                methods: list[str] | None = None) -> dict[str, Any]:
    sweep: dict[str, Any] = {"workloads": ["fib"], "max_tokens": [64], "concurrency": [1, concurrency]}
    if methods:
        sweep["methods"] = methods
    return {"engine": engine, "engine_python": "/py", "gpu_count": gpus, "gpu_memory_mib": mib,
            "model": {"name": "m", "path": "/m"}, "server_args": list(suite_args),
            "phases": [{"name": "p", "tp": tp, "server_args": list(phase_args),
                        "configs": [{"method": "autoregressive"},
                                    {"method": "ngram", "num_speculative_tokens": 2, "server_args": list(cfg_args)}],
                        "sweeps": [sweep]}]}


BATCH_CASES = [
    # (engine, concurrency, gpus, MiB per GPU, tp, suite / phase / config server args, methods) -> the limit or None
    ("vllm", 129, 0, 0, 1, (), (), (), None, 128),                      # vLLM's CPU default: 128 x tp
    ("vllm", 256, 2, 0, 2, (), (), (), None, None),                       # GPUs of unknown memory: not judged
    ("vllm", 1025, 8, 144384, 1, (), (), (), None, 1024),                 # H200: 1024
    ("vllm", 1025, 8, 98304, 4, (), (), (), None, 1024),                  # RTX PRO 6000 (96 GB): 1024
    ("vllm", 300, 8, 81920, 1, (), (), (), None, None),                   # 80 GB: may be an A100 (256): not judged
    ("vllm", 257, 8, 49152, 1, (), (), (), None, 256),                    # a 48 GB card: 256
    ("vllm", 257, 0, 0, 1, ("--performance-mode=throughput",), (), (), None, 256),  # doubled
    ("vllm", 9, 0, 0, 1, ("--max-num-seqs", "8"), (), (), None, 8),       # the suite's flag
    ("vllm", 9, 0, 0, 1, (), ("--max-num-seqs=8",), (), None, 8),         # the phase's, `=` spelling
    ("vllm", 17, 0, 0, 1, ("--max-num-seqs", "64"), (), ("--max-num-seqs", "16"), None, 16),  # the last one wins
    ("sglang", 33, 1, 98304, 1, (), (), ("--max-running-requests", "32"), None, 32),
    ("sglang", 4000, 1, 98304, 1, (), (), (), None, None),                # its default follows the KV pool
    ("vllm", 17, 0, 0, 1, (), (), ("--max-num-seqs", "16"), ["autoregressive"], None),  # sweep skips the config
]


@pytest.mark.parametrize("engine, conc, gpus, mib, tp, s_args, p_args, c_args, methods, limit", BATCH_CASES)
def test_concurrency_above_the_servers_batch_fails_naming_the_limit_and_its_source(
        engine: str, conc: int, gpus: int, mib: int, tp: int, s_args: tuple[str, ...], p_args: tuple[str, ...],
        c_args: tuple[str, ...], methods: list[str] | None, limit: int | None) -> None:
    suite = batch_suite(engine, conc, gpus, mib, tp, s_args, p_args, c_args, methods)
    if limit is None:
        matrix.validate(suite)
        return
    msg = error_of(suite)
    assert f"bench_phases[0].sweeps[0].concurrency: {conc} is above the {limit} requests that p-" in msg, msg
    assert f"allowed: at most {limit}, or " in msg
    flag = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}[engine]
    given = any(flag in a for a in (*s_args, *p_args, *c_args))
    assert (f"({flag} {limit} in its server_args)" in msg) if given else (f"{flag} is not given" in msg), msg
    matrix.validate(batch_suite(engine, limit, gpus, mib, tp, s_args, p_args, c_args, methods))  # at the limit: ok


def test_flag_value_reads_the_last_spelling() -> None:
    assert flag_value(["--a", "1", "--a=2", "--b", "3"], "--a") == "2"
    assert flag_value(["--ab", "1"], "--a") is None and flag_value(["--a"], "--a") is None


# --- llama.cpp's synthetic acceptance, as its server takes it -------------------------------------------------------
def synth_suite(engine: str, **config: Any) -> dict[str, Any]:
    s = base()
    s.update(engine=engine, engine_binary="/srv/llama-server", gpu_count=0)
    s["phases"][0]["configs"] = [{"method": "autoregressive"}, config]
    return s


@pytest.mark.parametrize("engine, config, expected", [
    ("vllm", {"method": "draft_model", "num_speculative_tokens": 3, "synth_len": 2.5},
     "configs[1].synth_len: synthetic acceptance is llama.cpp's (engine llamacpp); engine vllm has none"),
    ("sglang", {"method": "dflash", "block_size": 4, "synth_rates": [0.5]}, "engine sglang has none"),
    ("llamacpp", {"method": "autoregressive", "id": "ar-synth", "synth_len": 2.0},
     "configs[1].synth_len: synthetic acceptance needs a speculative method"),
    ("llamacpp", {"method": "draft_model", "num_speculative_tokens": 3, "synth_len": 2.0, "synth_rates": [0.5]},
     "configs[1].synth_rates: synth_len and synth_rates are exclusive"),
    ("llamacpp", {"method": "draft_model", "num_speculative_tokens": 3, "synth_len": 4.5},
     "configs[1].synth_len: 4.5 is above the draft length + 1 (4: "),
    ("llamacpp", {"method": "dflash", "block_size": 4, "synth_len": 4.01}, "4.01 is above the draft length + 1 (4"),
    ("llamacpp", {"method": "eagle3", "num_speculative_tokens": 2, "synth_rates": [0.9, 0.5, 0.2]},
     "configs[1].synth_rates: 3 rates for a draft of 2 tokens"),
    ("llamacpp", {"method": "draft_model", "num_speculative_tokens": 3, "synth_rates": [0.5, 0.6]},
     "configs[1].synth_rates: [0.5, 0.6] rise"),
    ("llamacpp", {"method": "draft_model", "num_speculative_tokens": 3, "synth_len": 0.5},
     "configs[1].synth_len: 0.5 is less than the minimum of 1"),
])
def test_synthetic_acceptance_is_refused_as_llamacpp_would(engine: str, config: dict[str, Any], expected: str) -> None:
    assert expected in error_of(synth_suite(engine, **config))


@pytest.mark.parametrize("config, cid, flags", [
    ({"method": "draft_model", "num_speculative_tokens": 3, "synth_len": 4}, "tp1-draft_model-k3-synth4",
     ["--spec-draft-n-max", "3", "--spec-synth-len", "4"]),
    ({"method": "dflash", "block_size": 4, "synth_rates": [0.9, 0.9, 0.1]}, "tp1-dflash-blk4-synth",
     ["--spec-draft-n-max", "3", "--spec-synth-rates", "0.9,0.9,0.1"]),
])
def test_synthetic_acceptance_at_its_bounds_reaches_the_server(config: dict[str, Any], cid: str,
                                                                 flags: list[str]) -> None:
    [_, cfg] = matrix.expand(matrix.validate(synth_suite("llamacpp", **config)))
    assert cfg["config_id"] == cid and " ".join(flags) in " ".join(cfg["command"]), cfg["command"]
