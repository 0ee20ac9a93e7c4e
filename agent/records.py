"""The results contract, defined once: the fields of `requests.jsonl`, `status.json`, `config.json` and `gpu.jsonl`,
what a cell is, and the progress events. The agent writes through it, the collector reads through it,
and the JSON Schemas under `schemas/` are generated from it (`python -m agent schemas`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import bounded

SCHEMA_VERSION = 1
# A cell within a config: one prompt workload at one length and context, under one load: `concurrency` requests
# released together (closed loop), or, for an open-loop cell, requests sent at `request_rate` per second
# (concurrency 0; a closed-loop cell has no request_rate, read as None).
CELL = ("workload", "max_tokens", "context_tokens", "concurrency", "request_rate")
OPEN_LOOP = ("request_rate", "arrival", "requests", "seed")  # what an open-loop cell adds to the grid's point
INF = "inf"  # request_rate of an open-loop cell that sends all its requests at once
# What a request row carries of its config, so each row pairs with its baseline on its own.
IDENTITY = ("host", "config_id", "method", "method_params", "tp", "engine", "model", "phase")


class Event(str, Enum):
    """The agent's progress events (`events.jsonl`), followed by the controller as they happen."""

    SUITE_START = "suite_start"
    LEFTOVER_UNIT_STOPPED = "leftover_unit_stopped"
    CONFIG_KEPT = "config_kept"
    # a config (or a packed phase: config_id is the phase) waits for the machine, held by another suite sharing it
    # (bench_machine_lock): holder (that suite's host, run and config in words)
    MACHINE_WAIT = "machine_wait"
    CONFIG_START = "config_start"
    CONFIG_READY = "config_ready"
    # within a config's timed requests, after a burst once `progress_s` has passed since the last one:
    # config_id, done and total (requests), tok_s (the server's completion_tokens of the requests finished in
    # the window over its wall seconds), window_s, eta_s (requests left x mean seconds per request so far)
    CONFIG_PROGRESS = "config_progress"
    CONFIG_END = "config_end"
    SUITE_END = "suite_end"


class Outcome(str, Enum):
    """A config's `status`."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Field:
    """One field of a record: its JSON types (`"null"` among them when it may be null), whether every
    record has it, and what it means."""

    name: str
    types: tuple[str, ...]
    required: bool
    doc: str


def _f(name: str, types: str, doc: str, required: bool = True) -> Field:
    return Field(name, tuple(types.split("|")), required, doc)


REQUEST = (
    _f("host", "string", "inventory host name"),
    _f("config_id", "string", "the config's folder name"),
    _f("method", "string", "autoregressive for the baseline, else the speculative method"),
    _f("method_params", "object", "the method's parameters, {} for the baseline"),
    _f("tp", "integer", "tensor-parallel size"),
    _f("engine", "string", "vllm or sglang", required=False),
    _f("model", "string", "the served model name", required=False),
    _f("phase", "string", "the phase the config belongs to", required=False),
    _f("workload", "string", "prompt id"),
    _f("max_tokens", "integer", "requested output length"),
    _f("context_tokens", "integer", "target prompt length in tokens, 0 for the plain prompt"),
    _f("concurrency", "integer", "requests released together (closed loop); 0 for an open-loop cell"),
    _f("request_rate", "number|string|null", "open-loop cells only: requests per second of the schedule, \"inf\" "
       "when all were due at once", required=False),
    _f("rep", "integer", "repetition index, from 0"),
    _f("slot", "integer", "which of the concurrent requests", required=False),
    _f("started_at", "string", "when the request was sent (UTC, ISO 8601)", required=False),
    _f("prompt_tokens", "integer|null", "prompt tokens, from the server's usage", required=False),
    _f("completion_tokens", "integer|null", "output tokens, from the server's usage", required=False),
    _f("ttft_s", "number|null", "seconds to the first content-bearing chunk", required=False),
    _f("e2e_s", "number|null", "seconds from send to the last byte", required=False),
    _f("output_tok_s", "number|null", "completion_tokens / e2e_s", required=False),
    _f("decode_tok_s", "number|null", "(completion_tokens - 1) / (e2e_s - ttft_s)", required=False),
    _f("tpot_s", "number|null", "time per output token after the first: (e2e_s - ttft_s) / (completion_tokens - 1)",
       required=False),
    _f("itl_mean_s", "number|null", "mean gap between content chunks spread over the tokens each carried (chunk "
       "arrival: shaped by how the server batches its stream; use tpot_s for speed)", required=False),
    _f("itl_p50_s", "number|null", "median of the same chunk gaps (see itl_mean_s)", required=False),
    _f("chunk_gap_mean_s", "number|null", "mean time between content chunks, whole: with one chunk per engine "
       "step (as vLLM and SGLang stream) the time between speculative steps", required=False),
    _f("chunk_gap_p50_s", "number|null", "median of the same gaps", required=False),
    _f("chunk_tokens_mean", "number|null", "tokens per content chunk after the first (the server's count): tokens "
       "per step under the same condition", required=False),
    _f("chunks", "integer", "stream chunks received (not tokens)", required=False),
    _f("finish_reason", "string|null", "the server's finish reason", required=False),
    _f("accept_length", "number|null", "mean accepted tokens per verify step, null for the baseline",
       required=False),
    _f("spec_steps", "integer|null", "verify steps of the request as the server counts them (speculative configs)",
       required=False),
    _f("spec_accepted_tokens", "integer|null", "draft tokens accepted over those steps", required=False),
    _f("spec_draft_tokens", "integer|null", "draft tokens proposed, as the server counts them (llama.cpp)",
       required=False),
    _f("accept_scope", "string", "where accept_length and spec_steps come from when the request's own answer lacks "
       "its verify steps (llama.cpp): `request` (the server's counter of drafts around this request alone) or "
       "`burst` (around its burst: the burst's acceptance length on each of its rows, spec_steps null)",
       required=False),
    _f("chunk_gap_max_s", "number|null", "the longest wait between two content chunks (what a reader of the stream "
       "waits at worst; a whole verify step under speculation)", required=False),
    _f("sent_s", "number", "when it was sent, in seconds after the config's first timed request was sent",
       required=False),
    _f("scheduled_s", "number", "open-loop cells only: when it was due by the schedule, on the clock of sent_s "
       "(sent_s - scheduled_s: how late the client sent it)", required=False),
    _f("done_s", "number|null", "when its last byte arrived, on the same clock as sent_s", required=False),
    _f("ok", "boolean", "false when the request errored"),
    _f("error", "string|null", "the error when not ok", required=False),
)

STATUS = (
    _f("config_id", "string", "the config's folder name"),
    _f("status", "string", "ok, failed or skipped"),
    _f("reason", "string|null", "the classified failure reason (docs/how-a-run-goes.md), null when ok"),
    _f("detail", "string|null", "the failure in words, secrets removed"),
    _f("config_digest", "string", "what the config measures; a kept result must match it"),
    _f("log_tail", "string", "the end of server.log, secrets removed"),
    _f("started_at", "string", "UTC, ISO 8601"),
    _f("finished_at", "string", "UTC, ISO 8601"),
    _f("ready_s", "number|null", "seconds from launch to a healthy server"),
    _f("foreign", "array", "processes on the host that were not this run's, before the config or in its timed window: "
       "pid, why (engine, specfleet, gpu), cmd, when (before, timed)", required=False),
    _f("startup", "object", "where the startup went, from the server's log: seconds from launch to the end of "
       "each phase found (weights, compile, kv_cache, graphs, serving)", required=False),
    _f("requests", "integer", "request rows written"),
    _f("requests_ok", "integer", "of those, ok"),
    _f("port", "integer", "the server's port", required=False),
    _f("timed_s", "number", "seconds spent in timed requests", required=False),
    _f("stop_s", "number", "seconds the stop took", required=False),
    _f("wall_s", "number", "seconds for the whole config", required=False),
    _f("survivors", "array", "processes that outlived the server and were killed", required=False),
    _f("unsupported_flags", "array", "flags the installed engine does not know", required=False),
    _f("same_server_as", "string", "skipped as `same_server`: the config whose server this one is on this build",
       required=False),
    _f("memory_fit", "string", "the memory arithmetic of a config refused as does_not_fit", required=False),
    _f("gpu_state", "object",
       "the GPUs during the timed requests, from gpu.jsonl (agent.gpusample.summarize): window_s, interval_s, "
       "samples (sampling instants in the window), gpus (per GPU: index, uuid, samples, min/max/mean of clocks.sm, "
       "clocks.mem [MHz], power.draw [W], temperature.gpu [C], utilization.gpu, utilization.memory [%], "
       "memory.used [MiB], throttle: samples per active reason), throttled (one entry per GPU and reason: gpu, "
       "reason, kind thermal|power cap|HW slowdown, samples, of; empty when nothing throttled), note; absent "
       "on hosts without nvidia-smi", required=False),
    _f("counters", "object", "the server's counters over the timed requests against the rows: verdict ok, "
       "suspect or unchecked, each check with both figures (agent/counters.py)", required=False),
    _f("order_seed", "integer", "seed of the shuffled request order", required=False),
    _f("prompts_s", "number", "seconds building the prompts with the server's tokenizer, once it was ready",
       required=False),
    _f("warmup_s", "number", "seconds of the untimed warmup request (the engine's first request after its "
       "start: first-use compilation lands here)", required=False),
    _f("cold_start", "object|null", "the first timed request's TTFT against its cell's median; outlier when "
       "above 3x", required=False),
    _f("host_load", "object|null", "CPU seconds of the engine and of everything else during the timed "
       "requests, and the 1-minute load average", required=False),
    _f("preflight_s", "number", "seconds before the server was started: the flag and memory checks and the wait "
       "for its GPUs' memory to come back (its slot's GPUs when packed)", required=False),
    _f("waited_for_neighbours_s", "number", "packed: seconds it waited, ready, so that the pack check's timed "
       "requests and those of the configs beside it start together", required=False),
    _f("gate_wait_s", "number", "packed: seconds its server, up, waited for the phase's baseline to answer its "
       "warmup before its own first request (0 for the baseline and when the gate was already open)",
       required=False),
    _f("timed_window", "array", "[from, to] of the timed requests, epoch seconds", required=False),
    _f("slot", "object", "where a packed config ran: index, gpus (nvidia-smi indices), cpus (a CPU list or null) "
       "and, with cpus, cpus_seen (the server's Cpus_allowed_list once ready); absent when it had the whole host",
       required=False),
    _f("neighbours", "array", "the configs whose servers ran at the same time (packing): config_id, slot, "
       "overlap_s (both servers up), timed_overlap_s (both in timed requests)", required=False),
)

GPU_SAMPLE = (
    _f("mono_s", "number", "the agent's monotonic clock when the line arrived (the clock of the timed window)"),
    _f("utc", "string", "UTC, ISO 8601, when the line arrived"),
    _f("sample", "integer", "sampling instant, from 0; the lines of one instant share it"),
    _f("smi_time", "string|null", "nvidia-smi's own timestamp (host local time)", required=False),
    _f("index", "integer", "the GPU's index"),
    _f("uuid", "string|null", "the GPU's UUID"),
    _f("clocks.sm", "number|null", "SM clock, MHz"),
    _f("clocks.mem", "number|null", "memory clock, MHz"),
    _f("power.draw", "number|null", "power draw, W"),
    _f("temperature.gpu", "number|null", "GPU core temperature, C"),
    _f("utilization.gpu", "number|null", "percent of the sample period a kernel ran"),
    _f("utilization.memory", "number|null", "percent of the sample period device memory was read or written"),
    _f("memory.used", "number|null", "device memory in use, MiB"),
    _f("reasons_mask", "integer|null", "clocks_event_reasons.active (clocks_throttle_reasons.active on older "
                                       "drivers), the bitmask"),
    _f("reasons", "array|null", "every reason set in the bitmask, by name (gpu_idle, sw_power_cap, ...)"),
    _f("sw_power_cap", "boolean|null", "clocks lowered to keep power under the limit"),
    _f("hw_slowdown", "boolean|null", "hardware slowdown (temperature, power brake or power draw)"),
    _f("hw_thermal_slowdown", "boolean|null", "hardware slowdown for temperature"),
    _f("sw_thermal_slowdown", "boolean|null", "clocks lowered by the driver for temperature"),
    _f("hw_power_brake_slowdown", "boolean|null", "hardware slowdown by an external power brake"),
)

CONFIG = (
    _f("config_id", "string", "the config's folder name"),
    _f("phase", "string", "the phase it belongs to"),
    _f("host", "string", "inventory host name"),
    _f("engine", "string", "vllm or sglang"),
    _f("engine_version", "string|null", "the installed engine's version"),
    _f("model", "object", "name, path, revision, max_model_len"),
    _f("draft_model", "object|null", "the drafter, for methods that need one"),
    _f("method", "string", "autoregressive or the speculative method"),
    _f("method_params", "object", "the method's parameters"),
    _f("tp", "integer", "tensor-parallel size"),
    _f("server_args", "array", "extra server arguments"),
    _f("sampling", "object", "temperature, ignore_eos"),
    _f("warmup_max_tokens", "integer", "output length of the untimed warmup request"),
    _f("cells", "array", "the cells measured: workload, max_tokens, context_tokens, concurrency, repetitions; an "
       "open-loop cell also request_rate, arrival (poisson or constant), requests (per repetition) and seed (of its "
       "arrivals, the same for every config); slo: the latency limits its requests are judged by"),
    _f("requests", "integer", "timed requests planned"),
    _f("command", "array", "the exact launch command, secrets redacted"),
    _f("environment", "object", "the config's environment, secrets redacted"),
    _f("timeouts", "object", "health_s, request_s, stop_s, release_s", required=False),
    _f("estimate_s", "number", "the plan's time estimate", required=False),
    _f("estimate_ready_s", "number", "the part of the estimate that is the server's startup", required=False),
    _f("estimate_source", "string", "what the estimate came from: an earlier run's measurement or the profile",
       required=False),
    _f("pack_check_of", "string", "on the pack check only: the baseline it measures again while the other slots "
       "are busy", required=False),
)

RECORDS: dict[str, tuple[Field, ...]] = {"requests.jsonl": REQUEST, "status.json": STATUS, "config.json": CONFIG,
                                         "gpu.jsonl": GPU_SAMPLE}
_PY = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list,
       "null": type(None)}


_WORDS = {"string": "a string", "integer": "an integer", "number": "a finite number", "boolean": "a boolean",
          "object": "an object", "array": "a list", "null": "null"}


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "number" and isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, _PY[kind])


def problem(obj: Any, fields: Sequence[Field]) -> str | None:
    """The first way `obj` breaks the record's fields, in words; None when it keeps them."""
    if not isinstance(obj, dict):
        return f"not a JSON object (got {type(obj).__name__})"
    for f in fields:
        if f.name not in obj:
            if f.required:
                return f"missing field {f.name!r}"
            continue
        value = obj[f.name]
        if not any(_is(value, t) for t in f.types):
            return f"field {f.name!r} should be {' or '.join(_WORDS[t] for t in f.types)}, got {value!r}"[:300]
    return None


def request_problem(row: Any, config_id: str) -> str | None:
    """What is wrong with one line of a config's requests.jsonl, or None."""
    why = problem(row, REQUEST)
    if why:
        return why
    if row["ok"] and not _is(row.get("output_tok_s"), "number"):
        return "ok request without output_tok_s"
    if not rate_ok(row.get("request_rate")):
        return f"field 'request_rate' should be a number above 0 or \"inf\", got {row['request_rate']!r}"[:300]
    if row["config_id"] != config_id:
        return f"config_id {row['config_id']!r} is not its folder's ({config_id!r})"
    return None


# The plain reader of requests.jsonl, a line at a time (the controller's estimates; the collector's last word)

def plain_line(path: Path, n: int, line: str, problems: list[str]) -> dict[str, Any] | None:
    """Line `n` of a requests.jsonl read the plain way: the row, or None (blank, or reported and skipped)."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        problems.append(f"{path}:{n}: malformed JSON ({exc.msg}, column {exc.colno}); line skipped")
        return None
    why = request_problem(row, path.parent.name)
    if why:
        problems.append(f"{path}:{n}: {why}; line skipped")
        return None
    return row


def _text(data: bytes) -> str:
    """A file's text as `Path.read_text(errors="replace")` gives it: UTF-8, universal newlines."""
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def plain_rows(path: Path, data: bytes, problems: list[str]) -> list[dict[str, Any]]:
    rows = (plain_line(path, n, line, problems) for n, line in enumerate(_text(data).splitlines(), 1))
    return [r for r in rows if r is not None]


def read_requests(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The valid request lines of a requests.jsonl; every other line is reported as `path:line` and skipped."""
    try:
        data = bounded.read_bytes(path, bounded.REQUESTS)
    except OSError as exc:  # a device, FIFO or folder too, named with the limit before anything is read
        problems.append(f"{path}: unreadable ({exc.strerror or exc}); its requests skipped")
        return []
    return plain_rows(path, data, problems)


def request_row(identity: Mapping[str, Any], cell: Mapping[str, Any], rep: int,
                measured: Mapping[str, Any]) -> dict[str, Any]:
    """One line of requests.jsonl: the config's identity, the cell (request_rate only for an open-loop cell), the
    repetition and the measurement."""
    return {**{k: identity[k] for k in IDENTITY}, **{k: cell[k] for k in CELL if k in cell}, "rep": rep, **measured}


def rate(value: Any) -> float | None:
    """A request_rate as a number: None for a closed-loop cell, math.inf for "inf"."""
    if value is None:
        return None
    return math.inf if value == INF else float(value)


def rate_ok(value: Any) -> bool:
    """Whether a request_rate is one: absent (None), a number above 0, or "inf"."""
    return value is None or value == INF or (_is(value, "number") and value > 0)


def cell_key(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """A cell's key within a config, from a cell or a request row (request_rate as `rate` gives it)."""
    return (*(obj.get(k) for k in CELL[:-1]), rate(obj.get("request_rate")))


def requests_of(cell: Mapping[str, Any]) -> int:
    """Requests of one repetition of a cell: its concurrency, or an open-loop cell's `requests`."""
    return cell["requests"] if cell.get("request_rate") is not None else cell["concurrency"]


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one record file, from its fields."""
    fields = RECORDS[name]
    props = {f.name: {"type": list(f.types) if len(f.types) > 1 else f.types[0], "description": f.doc}
             for f in fields}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://specfleet.dev/schemas/v{SCHEMA_VERSION}/{name}.schema.json",
            "title": f"{name} (one {'line' if name.endswith('.jsonl') else 'file'} per config)",
            "type": "object", "required": [f.name for f in fields if f.required], "properties": props,
            "additionalProperties": True}
