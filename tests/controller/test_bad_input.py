"""A corpus of malformed matrices: each is rejected by `validate` and `expand` with a message that names the
field (its full `bench_*` path) and what is allowed there, on the same line."""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import pytest

from controller import matrix

SECRET = "hf_PlantedSecretValue0123456789"

Mutation = Callable[[dict[str, Any]], Any]


def base() -> dict[str, Any]:
    """A valid suite touching every level: suite, phase, config, sweep, model, sampling, timeouts."""
    return {
        "suite_name": "corpus", "engine": "sglang", "backend": "process", "engine_python": "/py", "gpu_count": 4,
        "model": {"name": "m", "path": "/m", "revision": "r1", "max_model_len": 4096},
        "draft_model": {"name": "d", "path": "/d"},
        "sampling": {"temperature": 0.0, "ignore_eos": False},
        "timeouts": {"health_s": 600, "request_s": 600, "stop_s": 30, "release_s": 60},
        "estimate": {"startup_s": 60, "tok_s": 25, "prefill_tok_s": 5000},
        "repetitions": 3, "max_tokens": [256], "warmup_max_tokens": 32,
        "env": {"HF_HUB_OFFLINE": "1"}, "server_args": ["--mem-fraction-static", "0.8"],
        "workloads": {"poem": "Write a poem."},
        "phases": [{"name": "tp1", "tp": 1,
                    "configs": [{"method": "autoregressive"}, {"method": "ddtree", "budget": 16},
                                {"method": "ngram", "num_speculative_tokens": 4}],
                    "sweeps": [{"workloads": ["fib", "poem"], "max_tokens": [256], "context_tokens": [0, 512],
                                "concurrency": [1, 2], "repetitions": 2, "methods": ["ddtree-b16"]}]}],
    }


def _walk(suite: dict[str, Any], path: str) -> tuple[Any, Any]:
    obj: Any = suite
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    for k in keys[:-1]:
        obj = obj[k]
    return obj, keys[-1]


def put(path: str, value: Any) -> Mutation:
    """Set `path` (dotted, list indexes as numbers) to `value`."""
    def apply(s: dict[str, Any]) -> None:
        obj, last = _walk(s, path)
        obj[last] = value
    return apply


def drop(path: str) -> Mutation:
    def apply(s: dict[str, Any]) -> None:
        obj, last = _walk(s, path)
        del obj[last]
    return apply


def add_config(cfg: dict[str, Any]) -> Mutation:
    def apply(s: dict[str, Any]) -> None:
        s["phases"][0]["configs"].append(cfg)
    return apply


def also(*mutations: Mutation) -> Mutation:
    def apply(s: dict[str, Any]) -> None:
        for m in mutations:
            m(s)
    return apply


def replace_suite(value: Any) -> Mutation:
    def apply(s: dict[str, Any]) -> Any:
        return value
    return apply


def unchanged(s: dict[str, Any]) -> None:
    pass


def second_phase(s: dict[str, Any]) -> None:
    s["phases"].append(copy.deepcopy(s["phases"][0]))


def case(mutation: Mutation, field: str, allowed: str, *, id: str, phases: Optional[list[str]] = None,
         hidden: Optional[str] = None) -> Any:
    """`field`: the start of the message line (the full path); `allowed`: text on that line saying what is
    allowed; `hidden`: a value that must not appear anywhere in the message."""
    return pytest.param(mutation, phases, field, allowed, hidden, id=id)


CORPUS = [
    # --- wrong types, at every level -------------------------------------------------------------------------
    case(replace_suite(["x"]), "(top level)", "allowed: a mapping with keys api_key, backend", id="suite-not-mapping"),
    case(put("phases", "tp1"), "bench_phases", "allowed: a list of at least 1 item, each a mapping with keys",
         id="phases-not-list"),
    case(put("phases.0", "tp1"), "bench_phases[0]", "allowed: a mapping with keys configs, env, name",
         id="phase-not-mapping"),
    case(put("phases.0.configs", {"method": "autoregressive"}), "bench_phases[0].configs",
         "is not of type 'array'; allowed: a list of at least 1 item", id="configs-not-list"),
    case(put("phases.0.configs.1", "ddtree"), "bench_phases[0].configs[1]",
         "allowed: a mapping with keys block_size, budget", id="config-not-mapping"),
    case(put("phases.0.sweeps.0", ["fib"]), "bench_phases[0].sweeps[0]",
         "allowed: a mapping with keys arrival, concurrency, context_tokens", id="sweep-not-mapping"),
    case(put("phases.0.sweeps.0.workloads", "fib"), "bench_phases[0].sweeps[0].workloads",
         "allowed: a list of at least 1 item, no repeats, each a string", id="workloads-not-list"),
    case(put("phases.0.configs.1.budget", "16"), "bench_phases[0].configs[1].budget",
         "'16' is not of type 'integer'; allowed: an integer from 1 to 1024", id="budget-string"),
    case(put("repetitions", "abc"), "bench_repetitions",
         "'abc' is not of type 'integer'; allowed: an integer from 1 to 1000", id="repetitions-string"),
    case(put("repetitions", "3"), "bench_repetitions",
         "allowed: an integer from 1 to 1000 (a quoted string: write it unquoted in YAML; on the command line pass "
         "JSON: -e '{\"bench_repetitions\": 3}')", id="repetitions-quoted-number"),
    case(put("gpu_count", True), "bench_gpu_count", "True is not of type 'integer'; allowed: an integer >= 0",
         id="gpu_count-bool"),
    case(put("phases.0.tp", "2"), "bench_phases[0].tp", "allowed: an integer >= 1 (a quoted string",
         id="tp-string"),
    case(put("model", "tiny-llama"), "bench_model", "allowed: a mapping with keys max_model_len, name, path, revision "
         "(name, path required)", id="model-not-mapping"),
    case(put("model.max_model_len", "4k"), "bench_model.max_model_len", "allowed: an integer >= 1",
         id="max_model_len-string"),
    case(put("sampling.temperature", "hot"), "bench_sampling.temperature", "allowed: a number >= 0",
         id="temperature-string"),
    case(put("sampling.ignore_eos", "yes"), "bench_sampling.ignore_eos", "allowed: a boolean",
         id="ignore_eos-string"),
    case(put("timeouts.health_s", "10m"), "bench_timeouts.health_s", "allowed: a number > 0", id="timeout-string"),
    case(put("max_tokens", 256), "bench_max_tokens", "allowed: a list of at least 1 item, no repeats, each an "
         "integer from 1 to 1048576", id="max_tokens-scalar"),
    case(put("phases.0.sweeps.0.context_tokens", [0, "512"]), "bench_phases[0].sweeps[0].context_tokens[1]",
         "allowed: an integer from 0 to 10000000", id="context_tokens-item-string"),
    case(put("workloads", {"poem": 7}), "bench_workloads.poem", "allowed: a non-empty string",
         id="workload-prompt-not-string"),
    case(put("phases.0.sweeps.0.methods", "ddtree-b16"), "bench_phases[0].sweeps[0].methods",
         "allowed: a list, each a string", id="sweep-methods-not-list"),
    # --- unknown keys, at every level ------------------------------------------------------------------------
    case(put("repetiton", 3), "bench_repetiton", "not a variable of the matrix; allowed: bench_api_key",
         id="suite-unknown-key"),
    case(put("phases.0.gpus", 2), "bench_phases[0].gpus",
         "unknown key; allowed keys: configs, env, name, server_args, slots, sweeps, tp", id="phase-unknown-key"),
    case(put("phases.0.configs.1.k", 4), "bench_phases[0].configs[1].k",
         "unknown key; allowed keys: block_size, budget, draft_model, env, id, method", id="config-unknown-key"),
    case(put("phases.0.sweeps.0.workload", "fib"), "bench_phases[0].sweeps[0].workload",
         "unknown key; allowed keys: arrival, concurrency, context_tokens, duration_s, max_tokens, methods, name, "
         "repetitions, request_rates, requests, seed, slo, workloads", id="sweep-unknown-key"),
    case(put("model.revison", "main"), "bench_model.revison",
         "unknown key; allowed keys: max_model_len, name, path, revision", id="model-unknown-key"),
    case(put("draft_model.max_len", 10), "bench_draft_model.max_len",
         "unknown key; allowed keys: max_model_len, name, path, revision", id="draft_model-unknown-key"),
    case(put("sampling.top_p", 0.9), "bench_sampling.top_p", "unknown key; allowed keys: ignore_eos, temperature",
         id="sampling-unknown-key"),
    case(put("timeouts.health", 10), "bench_timeouts.health",
         "unknown key; allowed keys: health_s, release_s, request_s, stop_s", id="timeouts-unknown-key"),
    case(put("estimate.tokens_s", 10), "bench_estimate.tokens_s",
         "unknown key; allowed keys: prefill_tok_s, startup_s, tok_s", id="estimate-unknown-key"),
    # --- unknown method, engine, workload, backend -----------------------------------------------------------
    case(put("phases.0.configs.1.method", "medusa"), "bench_phases[0].configs[1].method",
         "'medusa' is not one of autoregressive, ngram, draft_model, eagle, eagle3, mtp, dflash, ddtree",
         id="unknown-method"),
    case(put("engine", "tgi"), "bench_engine", "'tgi' is not one of llamacpp, sglang, vllm", id="unknown-engine"),
    case(put("backend", "docker"), "bench_backend", "'docker' is not one of process, systemd", id="unknown-backend"),
    case(put("phases.0.sweeps.0.workloads", ["fib", "sonnet"]), "bench_phases[0].sweeps[0].workloads[1]",
         "unknown workload 'sonnet'; allowed: arith, fib, json, poem, qsort", id="unknown-workload"),
    case(put("engine", "vllm"), "bench_phases[0].configs[1].method",
         "'ddtree' is not supported by engine vllm; allowed: autoregressive", id="method-not-in-engine"),
    case(put("phases.0.sweeps.0.methods", ["ddtree-b99"]), "bench_phases[0].sweeps[0].methods[0]",
         "'ddtree-b99' is not a config of phase tp1; allowed: autoregressive, ddtree-b16, ngram-k4",
         id="sweep-methods-unknown-config"),
    # --- zero or negative sizes ------------------------------------------------------------------------------
    case(put("phases.0.sweeps.0.max_tokens", [0]), "bench_phases[0].sweeps[0].max_tokens[0]",
         "0 is less than the minimum of 1; allowed: an integer from 1 to 1048576", id="max_tokens-zero"),
    case(put("max_tokens", [-1]), "bench_max_tokens[0]", "-1 is less than the minimum of 1; allowed: an integer from 1 "
         "to 1048576", id="suite-max_tokens-negative"),
    case(put("phases.0.sweeps.0.concurrency", [1, 0]), "bench_phases[0].sweeps[0].concurrency[1]",
         "0 is less than the minimum of 1", id="concurrency-zero"),
    case(put("repetitions", 0), "bench_repetitions", "0 is less than the minimum of 1; allowed: an integer from 1 to "
         "1000", id="repetitions-zero"),
    case(put("phases.0.sweeps.0.repetitions", -2), "bench_phases[0].sweeps[0].repetitions",
         "-2 is less than the minimum of 1", id="sweep-repetitions-negative"),
    case(put("phases.0.configs.1.budget", 0), "bench_phases[0].configs[1].budget",
         "0 is less than the minimum of 1; allowed: an integer from 1 to 1024", id="budget-zero"),
    case(put("phases.0.configs.1.budget", 4096), "bench_phases[0].configs[1].budget",
         "4096 is greater than the maximum of 1024; allowed: an integer from 1 to 1024", id="budget-too-large"),
    case(put("phases.0.configs.2.num_speculative_tokens", 0), "bench_phases[0].configs[2].num_speculative_tokens",
         "allowed: an integer from 1 to 64", id="num_speculative_tokens-zero"),
    case(put("timeouts.stop_s", 0), "bench_timeouts.stop_s", "allowed: a number > 0", id="timeout-zero"),
    case(put("timeouts.request_s", -5), "bench_timeouts.request_s", "allowed: a number > 0", id="timeout-negative"),
    case(put("phases.0.sweeps.0.context_tokens", [-1]), "bench_phases[0].sweeps[0].context_tokens[0]",
         "-1 is less than the minimum of 0; allowed: an integer from 0 to 10000000", id="context_tokens-negative"),
    case(put("phases.0.tp", 0), "bench_phases[0].tp", "allowed: an integer >= 1", id="tp-zero"),
    case(put("gpu_count", -1), "bench_gpu_count", "allowed: an integer >= 0", id="gpu_count-negative"),
    case(put("warmup_max_tokens", 0), "bench_warmup_max_tokens", "allowed: an integer >= 1", id="warmup-zero"),
    case(put("model.max_model_len", 0), "bench_model.max_model_len", "allowed: an integer >= 1",
         id="max_model_len-zero"),
    case(put("port", 70000), "bench_port", "allowed: an integer from 0 to 65535", id="port-out-of-range"),
    # --- tp against the GPU count; context against the model ------------------------------------------------
    case(put("phases.0.tp", 8), "bench_phases[0].tp", "8 is above the host's GPU count (4); allowed 1..4",
         id="tp-above-gpu-count"),
    case(also(put("gpu_count", 0), put("phases.0.tp", 2)), "bench_phases[0].tp",
         "2 is above the host's GPU count (0); allowed 1..1", id="tp2-on-cpu-host"),
    case(put("phases.0.sweeps.0.context_tokens", [0, 4000]), "bench_phases[0].sweeps[0].context_tokens",
         "context + max_tokens = 4256 exceeds the model's max_model_len 4096 (context 4000, max_tokens 256); "
         "allowed: context_tokens + max_tokens <= 4096", id="context-longer-than-model"),
    case(also(drop("phases.0.sweeps.0.context_tokens"), put("phases.0.sweeps.0.max_tokens", [8192])),
         "bench_phases[0].sweeps[0].max_tokens", "allowed: context_tokens + max_tokens <= 4096",
         id="max_tokens-longer-than-model"),
    # --- duplicates ------------------------------------------------------------------------------------------
    case(add_config({"method": "ddtree", "budget": 16}), "bench_phases[0].configs[3]",
         "duplicate config id 'tp1-ddtree-b16' (also bench_phases[0].configs[1]); set a distinct `id`",
         id="duplicate-config-id"),
    case(add_config({"method": "dflash", "id": "ngram-k4"}), "bench_phases[0].configs[3]",
         "duplicate config id 'tp1-ngram-k4' (also bench_phases[0].configs[2]); set a distinct `id`",
         id="duplicate-explicit-id"),
    case(second_phase, "bench_phases[1].name", "duplicate phase name 'tp1' (also bench_phases[0]); allowed: a name "
         "no other phase has",
         id="duplicate-phase-name"),
    case(put("phases.0.sweeps.0.max_tokens", [256, 128, 256]), "bench_phases[0].sweeps[0].max_tokens",
         "256 appears more than once; allowed: a list of at least 1 item, no repeats", id="duplicate-max_tokens"),
    # --- empty lists -----------------------------------------------------------------------------------------
    case(put("phases", []), "bench_phases", "[] should be non-empty (at least 1 item)", id="phases-empty"),
    case(put("phases.0.configs", []), "bench_phases[0].configs", "should be non-empty (at least 1 item)",
         id="configs-empty"),
    case(put("phases.0.sweeps", []), "bench_phases[0].sweeps", "should be non-empty (at least 1 item)",
         id="sweeps-empty"),
    case(put("phases.0.sweeps.0.workloads", []), "bench_phases[0].sweeps[0].workloads",
         "should be non-empty (at least 1 item)", id="workloads-empty"),
    case(put("max_tokens", []), "bench_max_tokens", "should be non-empty (at least 1 item)", id="max_tokens-empty"),
    # --- missing or misplaced parts --------------------------------------------------------------------------
    case(put("phases.0.configs", [{"method": "ddtree", "budget": 16}]), "bench_phases[0].configs",
         "every phase needs an autoregressive baseline config; add {method: autoregressive} (methods now: ddtree)",
         id="phase-without-baseline"),
    case(put("draft_model", None), "bench_phases[0].configs[1].draft_model",
         "method ddtree needs a draft model (set bench_draft_model or the config's draft_model)",
         id="draft-model-missing"),
    case(add_config({"method": "dflash", "budget": 4}), "bench_phases[0].configs[3].budget",
         "only method ddtree takes a budget (this config's method is 'dflash'); remove it or use method ddtree",
         id="budget-on-non-ddtree"),
    case(drop("phases.0.configs.1.budget"), "bench_phases[0].configs[1].budget",
         "is required for method ddtree; allowed: an integer from 1 to 1024", id="ddtree-without-budget"),
    case(drop("phases.0.configs.2.num_speculative_tokens"), "bench_phases[0].configs[2].num_speculative_tokens",
         "is required for method ngram; allowed: an integer from 1 to 64", id="ngram-without-k"),
    case(drop("model.path"), "bench_model.path", "is required; allowed: a non-empty string", id="model-without-path"),
    case(put("engine", None), "bench_engine", "None is not one of llamacpp, sglang, vllm", id="engine-null"),
    case(drop("phases.0.name"), "bench_phases[0].name", "is required; allowed: a name of letters, digits",
         id="phase-without-name"),
    case(put("phases.0.name", "tp 1"), "bench_phases[0].name",
         "'tp 1' is not a valid name; allowed: letters, digits, '.', '_' and '-', starting with a letter or digit",
         id="phase-name-with-space"),
    case(put("phases.0.configs.1.id", "-b16"), "bench_phases[0].configs[1].id", "is not a valid name; allowed:",
         id="config-id-bad-name"),
    case(put("engine_python", ""), "bench_engine_python", "'' should be non-empty (at least 1 character)",
         id="engine_python-empty"),
    case(put("phases.0.configs.1.draft_model", {"name": "d2"}), "bench_phases[0].configs[1].draft_model.path",
         "is required; allowed: a non-empty string", id="config-draft-model-without-path"),
    case(put("phases.0.configs.1.block_size", 1), "bench_phases[0].configs[1].block_size",
         "allowed: an integer from 2 to 64", id="block_size-one"),
    case(unchanged, "phases", "unknown phase 'tp9'; allowed: tp1", phases=["tp9"],
         id="unknown-phase-selected"),
    # --- exposure and secrets --------------------------------------------------------------------------------
    case(put("bind_host", "0.0.0.0"), "bench_api_key", "need an API key of at least 16 characters (keep it in a "
         "vault); or set bench_bind_host: 127.0.0.1", id="exposed-without-api-key"),
    case(also(put("bind_host", "10.0.0.5"), put("api_key", "short")), "bench_api_key",
         "API key of at least 16 characters", id="exposed-with-short-api-key", hidden="short"),
    case(put("env", {"HF_HUB_OFFLINE": "1", "HF_TOKEN": [SECRET]}), "bench_env.HF_TOKEN",
         "a list (value not shown: may be a secret) is not of type 'string', 'number' or 'boolean'; allowed: "
         "a string, a number or a boolean", id="secret-env-wrong-type", hidden=SECRET),
    case(put("phases.0.configs.1.env", {"SGLANG_API_KEY": {"v": SECRET}}),
         "bench_phases[0].configs[1].env.SGLANG_API_KEY", "value not shown", id="config-secret-env-wrong-type",
         hidden=SECRET),
    case(put("phases.0.env", [f"HF_TOKEN={SECRET}"]), "bench_phases[0].env",
         "allowed: a mapping of names to a string, a number or a boolean", id="phase-env-not-mapping",
         hidden=SECRET),
    case(put("api_key", 1234567890123456789), "bench_api_key", "allowed: a string or null",
         id="api_key-wrong-type", hidden="1234567890123456789"),
    case(put("server_args", ["--api-key", 98765432109876]), "bench_server_args[1]", "allowed: a string",
         id="secret-server-arg-wrong-type", hidden="98765432109876"),
    # --- hardening round 2: numbers that are not what they look like ----------------------------------------
    case(put("sampling.temperature", float("nan")), "bench_sampling.temperature",
         "allowed: a number >= 0 (a finite number)", id="temperature-nan"),
    case(put("timeouts.request_s", float("inf")), "bench_timeouts.request_s", "allowed: a number > 0 and <= 604800 (a "
         "finite number)", id="timeout-inf"),
    case(put("estimate.tok_s", float("-inf")), "bench_estimate.tok_s", "(a finite number)", id="estimate-minus-inf"),
    case(put("phases.0.tp", 1.0), "bench_phases[0].tp", "allowed: an integer >= 1 (a whole number written as "
         "1.0: write 1)", id="tp-whole-float"),
    case(put("phases.0.configs.2.num_speculative_tokens", 3.0), "bench_phases[0].configs[2].num_speculative_tokens",
         "(a whole number written as 3.0: write 3)", id="k-whole-float"),
    case(put("repetitions", 2.5), "bench_repetitions", "2.5 is not of type 'integer'; allowed: an integer from 1 to "
         "1000", id="repetitions-fraction"),
    case(put("timeouts.health_s", 10 ** 400), "bench_timeouts.health_s", "is out of range; allowed: a number > 0 "
         "and <= 604800", id="timeout-huge-integer"),
    case(put("env", {1: "x"}), "bench_env", "is not of type 'string'; allowed: a string", id="env-name-integer"),
    case(put("engine_python", "/py\x00thon"), "bench_engine_python", "contains a NUL byte", id="engine-python-nul"),
    case(put("server_log_max_mib", 4096), "bench_server_log_max_mib", "allowed: an integer from 1 to 1024",
         id="log-bound-too-large"),
    # --- cross-field limits ----------------------------------------------------------------------------------
    case(put("warmup_max_tokens", 5000), "bench_warmup_max_tokens", "exceed the model's max_model_len 4096; "
         "allowed: at most 4096", id="warmup-longer-than-model"),
    case(add_config({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5,
                     "prompt_lookup_max": 2}), "bench_phases[0].configs[3].prompt_lookup_min",
         "5 is above prompt_lookup_max 2; allowed: prompt_lookup_min <= prompt_lookup_max", id="lookup-min-above-max"),
    # --- open-loop load and latency limits --------------------------------------------------------------------
    case(put("phases.0.sweeps.0.request_rates", [0]), "bench_phases[0].sweeps[0].request_rates[0]",
         '0 is not a request rate; allowed: a number of requests per second > 0', id="rate-zero"),
    case(put("phases.0.sweeps.0.request_rates", [2, "fast"]), "bench_phases[0].sweeps[0].request_rates[1]",
         "'fast' is not a request rate; allowed: a number of requests per second > 0 and <= 1000000, or \"inf\"",
         id="rate-word"),
    case(put("phases.0.sweeps.0.request_rates", [float("-inf")]), "bench_phases[0].sweeps[0].request_rates[0]",
         "-.inf (minus infinity) is not a request rate; allowed: a number of requests per second > 0",
         id="rate-yaml-minus-inf"),
    case(put("phases.0.sweeps.0.request_rates", [2, 2.0]), "bench_phases[0].sweeps[0].request_rates",
         "2.0 appears more than once", id="rate-repeated"),
    case(also(put("phases.0.sweeps.0.request_rates", [2]), put("phases.0.sweeps.0.requests", 8),
              put("phases.0.sweeps.0.arrival", "bursty")), "bench_phases[0].sweeps[0].arrival",
         "'bursty' is not one of poisson, constant", id="arrival-unknown"),
    case(put("phases.0.sweeps.0.requests", 8), "bench_phases[0].sweeps[0].requests",
         "applies to open-loop cells only, and this sweep has no request_rates; allowed: give request_rates too",
         id="requests-without-rates"),
    case(put("phases.0.sweeps.0.request_rates", [2]), "bench_phases[0].sweeps[0].requests",
         "is required for request rate 2; allowed: the requests each repetition sends (or duration_s",
         id="rates-without-a-count"),
    case(also(put("phases.0.sweeps.0.request_rates", [2, "inf"]), put("phases.0.sweeps.0.duration_s", 30)),
         "bench_phases[0].sweeps[0].requests", "is required for request rate inf (a duration gives no count when "
         "every request is due at once)", id="inf-with-a-duration-only"),
    case(also(put("phases.0.sweeps.0.request_rates", [2]), put("phases.0.sweeps.0.requests", 0)),
         "bench_phases[0].sweeps[0].requests", "allowed: an integer from 1 to 100000", id="requests-zero"),
    case(put("slo", {"ttft": 2000}), "bench_slo.ttft", "unknown key; allowed keys: attainment, e2e_ms, itl_ms, "
         "tpot_ms, ttft_ms", id="slo-key-without-unit"),
    case(put("slo", {"tpot_ms": -5}), "bench_slo.tpot_ms", "allowed: a number > 0", id="slo-negative"),
    case(put("slo", {"ttft_ms": 500, "attainment": 90}), "bench_slo.attainment", "allowed: a number > 0 and <= 1",
         id="slo-attainment-percent"),
    case(put("phases.0.sweeps.0.slo", {}), "bench_phases[0].sweeps[0].slo", "should be non-empty",
         id="sweep-slo-empty"),
    case(also(put("phases.0.sweeps.0.request_rates", [2]), put("phases.0.sweeps.0.requests", 8),
              lambda s: s["phases"][0]["sweeps"].append({**s["phases"][0]["sweeps"][0], "arrival": "constant"})),
         "bench_phases[0].sweeps[1]", "with other arrival, requests, seed or slo; allowed: one way per cell",
         id="one-cell-two-ways"),
    # --- names and ids ---------------------------------------------------------------------------------------
    case(put("phases.0.name", "tp1\n"), "bench_phases[0].name", "'tp1\\n' is not a valid name; allowed: letters",
         id="phase-name-trailing-newline"),
    case(put("phases.0.configs.1.id", "b16\x07"), "bench_phases[0].configs[1].id", "is not a valid name",
         id="config-id-control-character"),
    case(put("phases.0.name", "p" * 65), "bench_phases[0].name", "at most 64 characters", id="phase-name-too-long"),
    case(put("phases.0.configs.2.id", "d" * 62), "bench_phases[0].configs[2]", "is too long for a folder name; "
         "allowed: at most 64 characters", id="config-id-too-long"),
    # --- environment -----------------------------------------------------------------------------------------
    case(put("env", {"1BAD": "x"}), "bench_env", "'1BAD' is not a valid environment variable name; allowed: "
         "letters, digits and '_', not starting with a digit", id="env-name-digit"),
    case(put("env", {"MY VAR": "x"}), "bench_env", "'MY VAR' is not a valid environment variable name",
         id="env-name-space"),
    case(put("phases.0.configs.1.env", {"A=B": "x"}), "bench_phases[0].configs[1].env",
         "'A=B' is not a valid environment variable name", id="env-name-equals"),
    case(put("env", {"HF_TOKEN": f"{SECRET}\x00tail"}), "bench_env.HF_TOKEN", "contains a NUL byte",
         id="env-value-nul", hidden=SECRET),
    case(put("server_args", ["--x", "a\x00b"]), "bench_server_args[1]", "contains a NUL byte", id="arg-nul"),
    # --- secrets and the bind address -------------------------------------------------------------------------
    case(also(put("bind_host", "0.0.0.0"), put("api_key", "<secret:0>")), "bench_api_key",
         "holds text of the form <secret:N>", id="api-key-placeholder-shaped"),
    case(put("env", {"FOO": "x<secret:0>"}), "bench_env.FOO", "holds text of the form <secret:N>",
         id="env-placeholder-shaped"),
    case(also(put("bind_host", "0.0.0.0"), put("api_key", " " * 16)), "bench_api_key",
         "holds spaces or control characters (value not shown)", id="api-key-spaces"),
    case(put("bind_host", "0.0.0.0; rm -rf /"), "bench_bind_host", "is not an address; allowed: an IPv4 or IPv6 "
         "address or a host name", id="bind-host-unparseable"),
]


@pytest.mark.parametrize(("mutation", "phases", "field", "allowed", "hidden"), CORPUS)
def test_bad_matrix_names_field_and_allowed_values(mutation: Mutation, phases: Optional[list[str]], field: str,
                                                   allowed: str, hidden: Optional[str]) -> None:
    suite = base()
    replaced = mutation(suite)
    if replaced is not None:
        suite = replaced
    with pytest.raises(matrix.MatrixError) as by_validate:
        matrix.validate(suite, phases)
    with pytest.raises(matrix.MatrixError) as by_expand:
        matrix.expand(suite, phases)
    msg = str(by_validate.value)
    assert str(by_expand.value) == msg
    lines = [line for line in msg.splitlines() if line.startswith(f"{field}: ")]
    assert lines, f"no line for {field} in:\n{msg}"
    assert any(allowed in line for line in lines), f"{allowed!r} not on the {field} line of:\n{msg}"
    assert len(lines) == len(msg.splitlines()), f"problems beyond {field} reported for one damage:\n{msg}"
    if hidden is not None:
        assert hidden not in msg


def test_corpus_base_is_valid() -> None:
    """Every case is one damage away from this suite, which passes: a case fails only for its own damage."""
    configs = matrix.expand(base())
    assert [c["config_id"] for c in configs] == ["tp1-autoregressive", "tp1-ddtree-b16", "tp1-ngram-k4"]


def test_every_problem_is_reported_at_once() -> None:
    """Several schema problems in one matrix: one line each, sorted by field, none hidden behind the first."""
    s = base()
    for m in (put("repetitions", 0), put("phases.0.configs.1.budget", "16"), put("phases.0.sweeps.0.speed", 1),
              put("sampling.top_p", 1.0)):
        m(s)
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.validate(s)
    fields = [line.split(": ", 1)[0] for line in str(exc.value).splitlines()]
    assert fields == ["bench_phases[0].configs[1].budget", "bench_phases[0].sweeps[0].speed", "bench_repetitions",
                      "bench_sampling.top_p"]


def test_cross_field_problems_are_reported_at_once() -> None:
    s = base()
    for m in (put("phases.0.tp", 8), add_config({"method": "ddtree", "budget": 16}),
              put("phases.0.sweeps.0.workloads", ["sonnet"])):
        m(s)
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.validate(s, ["tp9"])
    fields = [line.split(": ", 1)[0] for line in str(exc.value).splitlines()]
    assert fields == ["bench_phases[0].tp", "bench_phases[0].configs[3]", "bench_phases[0].sweeps[0].workloads[0]",
                      "phases"]


# -- what specfleet sets itself ----------------------------------------------------------------------
LEVELS = {"suite": ("server_args", "env"), "phase": ("phases.0.server_args", "phases.0.env"),
          "config": ("phases.0.configs.1.server_args", "phases.0.configs.1.env")}
FIELDS = {"suite": "bench_server_args", "phase": "bench_phases[0].server_args",
          "config": "bench_phases[0].configs[1].server_args"}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("level", list(LEVELS))
def test_flags_specfleet_sets_are_refused_at_every_level_in_every_form(engine: str, level: str) -> None:
    """A bind address, port, tp, model path, served name, key or speculative flag in server_args would make the
    config's label say one thing and the server do another (or expose it without its key): refused, each naming
    its field and index, as written, as `--flag=value` and as an abbreviation argparse would take."""
    owned = matrix.owned_flags(matrix.ENGINES[engine])
    for flag in owned:
        for args in ([flag, "1"], [f"{flag}=1"], *([[flag[:-1], "1"]] if flag.startswith("--") and len(flag) > 6
                                                    else [])):
            s = base()
            s["engine"] = engine
            if engine == "vllm":
                s["phases"][0]["configs"][1] = {"method": "ngram", "num_speculative_tokens": 2, "id": "x"}
                s["phases"][0]["sweeps"][0]["methods"] = ["x"]
            _walk(s, LEVELS[level][0])[0][LEVELS[level][0].rsplit(".", 1)[-1]] = ["--enable-metrics", *args]
            with pytest.raises(matrix.MatrixError) as exc:
                matrix.validate(s)
            lines = str(exc.value).splitlines()
            assert lines == [f"{FIELDS[level]}[1]: {args[0].split('=')[0]} is set by specfleet ({owned[flag]}); "
                             f"allowed: any other flag"], (flag, args, lines)


def _spellings(flag: str) -> list[list[str]]:
    """Other names vLLM's parser reads as `flag`: underscores for dashes, and a dotted key of it (JSON flags)."""
    out = [[f"{flag}.method=ngram"]]
    if "-" in flag[2:]:
        out += [["--" + flag[2:].replace("-", "_"), "1"], ["--" + flag[2:].replace("-", "_", 1) + "=1"]]
    return out


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_owned_flags_in_the_spellings_the_engines_parser_reads(engine: str) -> None:
    """vLLM reads `--tensor_parallel_size` as `--tensor-parallel-size` and `--speculative-config.method=x` as a key
    of `--speculative-config`: refused for vLLM, naming how it is read; SGLang's parser takes names as written (its
    own flag check refuses such a name as unknown), so they are not taken for the flags there."""
    owned = matrix.owned_flags(matrix.ENGINES[engine])
    for flag in [f for f in owned if f.startswith("--")]:
        for args in _spellings(flag):
            s = base()
            s["engine"] = engine
            s["phases"][0]["configs"][1] = {"method": "ngram", "num_speculative_tokens": 2, "id": "x"}
            s["phases"][0]["sweeps"][0]["methods"] = ["x"]
            s["phases"][0]["configs"][1]["server_args"] = ["--enable-metrics", *args]
            written = args[0].split("=")[0]
            if engine == "sglang":
                if not any(o.startswith(written) for o in owned if len(written) > 3):  # not an abbreviation
                    matrix.validate(s)
                continue
            with pytest.raises(matrix.MatrixError) as exc:
                matrix.validate(s)
            assert str(exc.value).splitlines() == [
                f"bench_phases[0].configs[1].server_args[1]: {written} (read as {flag}) is set by specfleet "
                f"({owned[flag]}); allowed: any other flag"], (flag, args)


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("var", sorted(matrix.OWNED_ENV))
def test_environment_specfleet_sets_is_refused_at_every_level(level: str, var: str) -> None:
    s = base()
    _walk(s, LEVELS[level][1])[0][LEVELS[level][1].rsplit(".", 1)[-1]] = {"HF_HUB_OFFLINE": "1", var: "0"}
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.validate(s)
    field = FIELDS[level].replace("server_args", "env")
    assert str(exc.value).splitlines() == [f"{field}.{var}: set by specfleet ({matrix.OWNED_ENV[var]}); allowed: "
                                           "any other variable"]


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("value", ["{port}", "127.0.0.1:{port}", "--x={port}", "a{port}b"])
def test_the_port_placeholder_is_refused_outside_the_port_flag_at_every_level(level: str, value: str) -> None:
    """`{port}` is filled with the server's own port in specfleet's --port only: elsewhere it would be passed on
    literally, or (a whole argument) silently replaced by the port."""
    args_path, env_path = LEVELS[level]
    for path, put in ((args_path, ["--enable-metrics", value]), (env_path, {"HF_HUB_OFFLINE": "1", "X_ADDR": value})):
        s = base()
        _walk(s, path)[0][path.rsplit(".", 1)[-1]] = put
        with pytest.raises(matrix.MatrixError) as exc:
            matrix.validate(s)
        field = FIELDS[level] + "[1]" if path == args_path else FIELDS[level].replace("server_args", "env") + ".X_ADDR"
        [line] = str(exc.value).splitlines()
        assert line.startswith(f"{field}: ") and "holds {port}, the placeholder specfleet fills" in line, line
        assert line.endswith("allowed: a literal value")


def test_flags_that_only_look_alike_pass() -> None:
    s = base()
    s["server_args"] = ["--hostname-override", "x", "--port-range=1", "--tp-comm-overlap",
                        "--model-loader-extra-config", "{}", "--enable-metrics"]
    s["env"] = {"CUDA_VISIBLE_DEVICES_ORDER": "PCI_BUS_ID", "HF_HUB_OFFLINE": "1"}
    matrix.validate(s)


# -- names that are not what they look like ----------------------------------------------------------
# one of each class: zero-width, bidirectional controls, other format characters, line and paragraph separators,
# control characters, private use, unassigned; the characters in the middle, at the end, or all there is
UNSEEN = ["\u200b", "\u200d", "\ufeff", "\u202e", "\u2066", "\u061c", "\u00ad", "\u2028", "\u2029", "\x1b", "\x7f",
          "\ue000", "\U000e0001", "\u0378"]
LABEL_FIELDS = {"suite_name": "bench_suite_name", "model.name": "bench_model.name",
                "draft_model.name": "bench_draft_model.name",
                "phases.0.sweeps.0.name": "bench_phases[0].sweeps[0].name"}


@pytest.mark.parametrize("path", list(LABEL_FIELDS))
@pytest.mark.parametrize("char", UNSEEN, ids=[f"U+{ord(c):04X}" for c in UNSEEN])
def test_shown_names_with_unseen_characters_are_refused(path: str, char: str) -> None:
    for value in (f"cor{char}pus", f"corpus{char}"):
        s = base()
        obj, key = _walk(s, path)
        obj[key] = value
        with pytest.raises(matrix.MatrixError) as exc:
            matrix.validate(s)
        assert str(exc.value).startswith(f"{LABEL_FIELDS[path]}: ") and f"U+{ord(char):04X}" in str(exc.value)


@pytest.mark.parametrize("value, why", [(" corpus", "leading or trailing spaces"), ("x" * 121, "121 characters")])
def test_shown_names_padded_or_unreadably_long_are_refused(value: str, why: str) -> None:
    s = base()
    s["suite_name"] = value
    with pytest.raises(matrix.MatrixError, match=why):
        matrix.validate(s)


@pytest.mark.parametrize("name, why", [("po\u200bem", "not a valid workload name"), ("poem\u202e", "not a valid"),
                                       ("a b", "not a valid"), ("fib", "the name of a built-in workload")])
def test_workload_names_are_names_and_not_a_built_in_ones(name: str, why: str) -> None:
    s = base()
    s["workloads"] = {name: "Write a poem."}
    s["phases"][0]["sweeps"][0]["workloads"] = [name]
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.validate(s)
    assert any(line.startswith("bench_workloads.") and why in line for line in str(exc.value).splitlines())


# look-alikes: a letter of another script inside a Latin (or Cyrillic, Greek) name, and letters or digits in a
# compatibility form of another (fullwidth, mathematical, circled, superscript, ligature); each named by code point
LOOKALIKE = [("Qwen3.6-27\u0412", "U+0412"), ("\u0430rith", "U+0430"), ("Blackwell-\u03bf", "U+03BF"),
             ("\u0421\u0435\u0440\u0432\u0435\u0440-a", "U+0061"), ("\uff51wen", "U+FF51"),
             ("\U0001d410wen", "U+1D410"), ("tp\u00b2", "U+00B2"), ("\ufb01b", "U+FB01"), ("run-\u2460", "U+2460"),
             ("\u0585pen", "U+0585"), ("\u13a1nd", "U+13A1")]


@pytest.mark.parametrize("path", list(LABEL_FIELDS))
@pytest.mark.parametrize("value, code", LOOKALIKE, ids=[c for _, c in LOOKALIKE])
def test_shown_names_with_look_alike_letters_are_refused(path: str, value: str, code: str) -> None:
    s = base()
    obj, key = _walk(s, path)
    obj[key] = value
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.validate(s)
    [line] = str(exc.value).splitlines()
    assert line.startswith(f"{LABEL_FIELDS[path]}: ") and f"look-alike letters: {code} " in line, line


@pytest.mark.parametrize("value", ["ct200 — Qwen3.6 27B, DFlash ✓ (Blackwell)", "Qwen 通义千问 27B", "Москва-2",
                                   "Ελληνικά", "café déjà vu", "日本語モデル v2", "한국어 model"])
def test_readable_unicode_in_shown_names_passes(value: str) -> None:
    s = base()
    s["suite_name"] = value
    matrix.validate(s)


@pytest.mark.parametrize("given, field, want", [
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 5}, "prompt_lookup_min", "5 is above prompt_lookup_max 2 "
     "(prompt_lookup_max is not given: 2, the default)"),
    ({"num_speculative_tokens": 4, "prompt_lookup_max": 1}, "prompt_lookup_max", "2 is above prompt_lookup_max 1 "
     "(prompt_lookup_min is not given: 2, the default)"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}, "prompt_lookup_min",
     "5 is above prompt_lookup_max 3;"),
])
def test_an_implicit_lookup_bound_is_checked_as_the_server_gets_it(given: dict[str, int], field: str,
                                                                   want: str) -> None:
    """A bound the matrix leaves out is the adapter's default (agent.engines.ngram_lookup): vLLM refuses
    min > max whichever of them was written."""
    s = base()
    s["engine"] = "vllm"
    s["phases"][0]["configs"] = [{"method": "autoregressive"}, {"method": "ngram", **given}]
    del s["phases"][0]["sweeps"][0]["methods"]
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.validate(s)
    line = str(exc.value)
    assert line.startswith(f"bench_phases[0].configs[1].{field}: prompt_lookup_min {want}"), line
    assert line.endswith("allowed: prompt_lookup_min <= prompt_lookup_max")



@pytest.mark.parametrize("path, value, field, allowed", [
    ("phases.0.sweeps.0.concurrency", [1, 100000], "bench_phases[0].sweeps[0].concurrency[1]", "from 1 to 4096"),
    ("phases.0.sweeps.0.repetitions", 5000, "bench_phases[0].sweeps[0].repetitions", "from 1 to 1000"),
    ("repetitions", 1001, "bench_repetitions", "from 1 to 1000"),
    ("max_tokens", [2 ** 21], "bench_max_tokens[0]", "from 1 to 1048576"),
    ("phases.0.sweeps.0.context_tokens", [0, 10 ** 8], "bench_phases[0].sweeps[0].context_tokens[1]",
     "from 0 to 10000000"),
    ("workloads", {"poem": "x" * (2 ** 20 + 1)}, "bench_workloads.poem", "1048576"),
])
def test_values_past_any_plausible_use_are_refused(path: str, value: Any, field: str, allowed: str) -> None:
    """A typo that would plan days of requests or ship megabytes to every host: refused, naming the bound."""
    s = base()
    obj, key = _walk(s, path)
    obj[key] = value
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.validate(s)
    line = next((x for x in str(exc.value).splitlines() if x.startswith(f"{field}: ")), str(exc.value))
    assert allowed in line, line
