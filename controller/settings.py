"""Every variable of the bench role, defined once: its type, default, allowed values and description.

The matrix's settings (`Setting.schema` set) make the JSON Schema that `controller.matrix` validates a host's
suite with (`SCHEMA`, each property's `default` the documented default); the others say how an invocation runs
and where things live. `python -m controller.rolefiles --write` generates the role's `defaults/main.yml` and
`meta/argument_specs.yml` from this module, and the `bench_plan` action reads the matrix's variables the
definitions list (`suite_from`): a new setting is one entry here and the generator. (Past 400 lines: the
definitions themselves, one entry per variable with its description.)
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

from agent import pack
from agent.engines import ENGINES
from agent.logbound import DEFAULT_MAX_BYTES

METHODS = ("autoregressive", "ngram", "draft_model", "eagle", "eagle3", "mtp", "dflash", "ddtree")
NEEDS_DRAFT = ("draft_model", "eagle", "eagle3", "dflash", "ddtree")
NEEDS_K = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
PREFIX = "bench_"

# `\Z`, not `$`: `$` also matches before a trailing newline
NAME_MAX = 64
NAME_PATTERN = f"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{NAME_MAX - 1}}}\\Z"
NAME_TEXT = f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most {NAME_MAX} characters"
ENV_NAME_PATTERN = "^[A-Za-z_][A-Za-z0-9_]*\\Z"
ENV_NAME_TEXT = "letters, digits and '_', not starting with a digit"
NO_NUL = "^[^\\x00]*\\Z"
HOSTNAME_RE = re.compile(r"^(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*\Z")
NAME_RE = re.compile(NAME_PATTERN)
_pos_int = {"type": "integer", "minimum": 1}
_int_list = {"type": "array", "minItems": 1, "items": _pos_int, "uniqueItems": True}
# Bounds past any plausible use: a typo there would plan days of requests or ship megabytes to every host.
MAX_CONCURRENCY, MAX_REPETITIONS, MAX_OUTPUT, MAX_CONTEXT = 4096, 1000, 1 << 20, 10_000_000
MAX_PROMPT_CHARS = 1 << 20  # a workload's prompt; long contexts come from context_tokens, built on the host
_tokens_list = {**_int_list, "items": {**_pos_int, "maximum": MAX_OUTPUT}}
_concurrency_list = {**_int_list, "items": {**_pos_int, "maximum": MAX_CONCURRENCY}}
_repetitions = {**_pos_int, "maximum": MAX_REPETITIONS}
# Roles a field plays beyond its type, as schema keywords of their own (jsonschema ignores them): each rule that
# guards a role walks the fields marked with it (`values`), and the tests select a role's fields the same way
# (`fields`), so a field declared with its role is checked and tested with the others of that role.
LAUNCH = "x-launch"    # a string that reaches the engine's command line or environment (no placeholder documented)
CONTEXT = "x-context"  # a context limit declared on a model, in tokens: every request of a config using it must fit
INF = "x-inf"          # a number that may also be infinite, written inf
INF_SPELLED = re.compile(r"\+?\.?inf(inity)?\Z", re.I)  # inf as YAML (.inf, +.Inf), JSON (Infinity) or Python spell it
_launch = {"type": "string", "minLength": 1, "pattern": NO_NUL, LAUNCH: True}
_str_list = {"type": "array", "items": {"type": "string", "pattern": NO_NUL, LAUNCH: True}}
_env = {"type": "object", "propertyNames": {"type": "string", "pattern": ENV_NAME_PATTERN},
        "additionalProperties": {"type": ["string", "number", "boolean"], "pattern": NO_NUL, LAUNCH: True}}
MODEL_SCHEMA = {  # the target: its path and name are the server's --model and --served-model-name
    "type": "object", "required": ["name", "path"], "additionalProperties": False,
    "properties": {"name": _launch, "path": _launch,
                   "revision": {"type": ["string", "null"]}, "max_model_len": {**_pos_int, CONTEXT: True}},
}
DRAFT_SCHEMA = {  # a drafter: its path reaches the speculative flags, its name only the records
    **MODEL_SCHEMA,
    "properties": {**MODEL_SCHEMA["properties"], "name": {"type": "string", "minLength": 1, "pattern": NO_NUL}},
}
# The conditions apply to mappings that name a method; anything else is reported by type/required.
_has_method = {"type": "object", "required": ["method"]}
CONFIG_SCHEMA = {
    "type": "object", "required": ["method"], "additionalProperties": False,
    "properties": {
        "method": {"enum": list(METHODS)},
        "id": {"type": "string", "pattern": NAME_PATTERN},
        "num_speculative_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
        "budget": {"type": "integer", "minimum": 1, "maximum": 1024},
        "block_size": {"type": "integer", "minimum": 2, "maximum": 64},
        "topk": _pos_int, "num_draft_tokens": _pos_int,
        "prompt_lookup_min": _pos_int, "prompt_lookup_max": _pos_int,
        # llama.cpp's synthetic acceptance (benchmarking only): a mean acceptance length, the target's token included,
        # or the acceptance rate at each draft position
        "synth_len": {"type": "number", "minimum": 1, "maximum": 65},
        "synth_rates": {"type": "array", "minItems": 1, "maxItems": 64,
                        "items": {"type": "number", "minimum": 0, "maximum": 1}},
        "draft_model": DRAFT_SCHEMA, "server_args": _str_list, "env": _env,
    },
    "allOf": [
        {"if": {**_has_method, "properties": {"method": {"const": "ddtree"}}}, "then": {"required": ["budget"]}},
        {"if": {**_has_method, "properties": {"method": {"enum": list(NEEDS_K)}}},
         "then": {"required": ["num_speculative_tokens"]}},
        {"if": {**_has_method, "properties": {"method": {"enum": [m for m in METHODS if m != "ddtree"]}}},
         "then": {"not": {"required": ["budget"]}}},
    ],
}
SLOTS_SCHEMA = {"type": "array", "items": {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {"gpus": {"type": "array", "minItems": 1, "uniqueItems": True,
                            "items": {"type": "integer", "minimum": 0}},
                   "cpus": {"type": ["string", "integer"], "minimum": 0, "pattern": pack.CPU_LIST.pattern}}}}
# Open-loop load: a rate of requests per second (or "inf", all at once) and how many requests a cell sends
MAX_RATE, MAX_OPEN_REQUESTS = 1_000_000, 100_000
RATE_INF_PATTERN = "^inf\\Z"  # after `matrix.with_inf_written`: YAML's .inf and the other spellings of it are inf
RATE_TEXT = (f'a number of requests per second > 0 and <= {MAX_RATE}, or "inf" (every request due at once; YAML\'s '
             '.inf is taken as inf)')
_rate = {"type": ["number", "string"], "exclusiveMinimum": 0, "maximum": MAX_RATE, "pattern": RATE_INF_PATTERN,
         INF: True}
ARRIVALS = ("poisson", "constant")
SLO_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")  # a request meets the limits when it is within every one given
SLO_SCHEMA = {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {**{k: {"type": "number", "exclusiveMinimum": 0, "maximum": 86_400_000} for k in SLO_KEYS},
                   "attainment": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
}
OPEN_LOOP_ONLY = ("arrival", "requests", "duration_s", "seed")
_sweep = {
    "type": "object", "required": ["workloads"], "additionalProperties": False,
    "dependentRequired": {k: ["request_rates"] for k in OPEN_LOOP_ONLY},
    "properties": {
        "name": {"type": "string"},
        "workloads": {"type": "array", "minItems": 1, "items": {"type": "string"}, "uniqueItems": True},
        "max_tokens": _tokens_list,
        "context_tokens": {"type": "array", "minItems": 1, "uniqueItems": True,
                           "items": {"type": "integer", "minimum": 0, "maximum": MAX_CONTEXT}},
        "concurrency": _concurrency_list,
        "request_rates": {"type": "array", "minItems": 1, "uniqueItems": True, "items": _rate},
        "arrival": {"enum": list(ARRIVALS)},
        "requests": {**_pos_int, "maximum": MAX_OPEN_REQUESTS},
        "duration_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 86_400},
        "seed": {"type": "integer", "minimum": 0},
        "slo": SLO_SCHEMA,
        "repetitions": _repetitions,
        "methods": {"type": "array", "items": {"type": "string"}},
    },
}
PHASES_SCHEMA = {
            "type": "array", "minItems": 1,
            "items": {
                "type": "object", "required": ["name", "configs", "sweeps"], "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": NAME_PATTERN},
                    "tp": _pos_int,
                    "server_args": _str_list,
                    "env": _env,
                    "slots": SLOTS_SCHEMA,
                    "configs": {"type": "array", "minItems": 1, "items": CONFIG_SCHEMA},
                    "sweeps": {"type": "array", "minItems": 1, "items": _sweep},
                },
            },
        }


# ---------------------------------------------------------------------------------------------------------------
# The definitions
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """One variable, `bench_<key>`. A matrix setting has a `schema` (its `default` there is the role's default);
    any other has its role `default` here (a value, or Jinja text for the role to render). `coerce` takes a
    `-e key=value` string as the number or boolean it spells. `doc` is the line's comment in defaults/main.yml;
    `entries` the role's entry points that declare it, with a description of their own where `describe` says."""

    key: str
    description: str
    schema: Optional[dict[str, Any]] = None
    type: Optional[str] = None          # argument_specs type (derived from the schema for a matrix setting)
    elements: Optional[str] = None
    allowed: tuple[Any, ...] = ()       # the choices argument_specs lists (a matrix setting's: its enum, reordered)
    default: Any = None                 # the role's default of a setting outside the matrix
    spec_default: Any = None            # the default argument_specs shows where it differs (Jinja defaults)
    required: bool = False
    no_log: bool = False
    coerce: Optional[str] = None        # "number" or "bool"
    doc: str = ""
    entries: tuple[str, ...] = ("plan", "run", "main")
    describe: tuple[tuple[str, str], ...] = ()
    group: str = "matrix"

    @property
    def name(self) -> str:
        return PREFIX + self.key

    @property
    def in_matrix(self) -> bool:
        return self.schema is not None


def _number(minimum: float = 0, **more: Any) -> dict[str, Any]:
    return {"type": "number", "exclusiveMinimum": minimum, **more}


_TIMEOUTS = (("health_s", 900), ("request_s", 900), ("stop_s", 60), ("release_s", 120))
_ESTIMATE = (("startup_s", 120), ("tok_s", 25), ("prefill_tok_s", 5000))
_SEE_PLAN = "When the play fails over the configs' statuses (see the plan entry point)."
_AGENT_PYTHON = "Python that runs the agent on the host."
_RESULTS = "Folder on the controller where runs are pulled to."

SETTINGS: tuple[Setting, ...] = (
    # ---- what to benchmark: the matrix
    Setting("suite_name", "Name of the suite, recorded in run.json.", {"type": "string"},
            entries=("plan", "run", "main", "report")),
    Setting("engine", "The inference engine.", {"enum": sorted(ENGINES), "default": "vllm"},
            doc="vllm | sglang | llamacpp", allowed=("vllm", "sglang", "llamacpp")),
    Setting("backend", "How servers run, a child process group of the agent or an instance of the engine's unit.",
            {"enum": ["process", "systemd"], "default": "process"}, group="service"),
    Setting("engine_python", "The Python interpreter of the engine's environment on the host.",
            {**_launch, "default": "/opt/specfleet/engine/bin/python"}),
    Setting("engine_binary", "The engine's server program on the host, for an engine that is a program of its own "
            "rather than a Python module (C(llamacpp): its C(llama-server), as the llamacpp role builds it).",
            {**_launch, "default": "/opt/specfleet/llama.cpp/llama-server"}),
    Setting("engine_patches", "Patches applied to the engine build, recorded in host.json.",
            {"type": "array", "default": []}, elements="raw",
            doc="names + hashes of patches applied to the engine build"),
    Setting("model", "The target model, C({name, path, revision, max_model_len}).", MODEL_SCHEMA, required=True,
            doc="{name, path, revision, max_model_len}"),
    Setting("draft_model",
            "The draft model for methods that need one, C({name, path, revision, max_model_len}); its "
            "C(max_model_len), where given, bounds every request of the configs that use it, as the target's does.",
            {**DRAFT_SCHEMA, "type": ["object", "null"], "default": None}, type="dict",
            doc="{name, path, revision, max_model_len} for methods that need one"),
    Setting("gpu_count", "GPUs on the host; tp above it is rejected. 0 means a CPU host.",
            {"type": "integer", "minimum": 0, "default": 0}, coerce="number", doc="0 = CPU host (tp 1 only)"),
    Setting("gpu_memory_mib",
            "Memory of one GPU in MiB for the memory-fit check before each start (weights, drafter, memory "
            "fraction, KV cache of the largest cell); 0 reads it with nvidia-smi on the host (no GPU, no check).",
            {"type": "integer", "minimum": 0, "default": 0}, coerce="number",
            doc="memory of one GPU for the fit check; 0 = read by nvidia-smi on the host"),
    Setting("pack",
            "Pack the GPUs: in each phase the baseline runs alone on the first slot, then the phase's other "
            "configs run at once, each on its own slot (a set of tp GPUs by C(CUDA_VISIBLE_DEVICES) and, for "
            "systemd, the unit's device allow list; or a CPU set by taskset / C(AllowedCPUs=)), a slot taking the "
            "next config as it frees. Each record names its slot and the configs that ran beside it.",
            {"type": "boolean", "default": False}, coerce="bool",
            doc="configs of a phase at once, each on its own slot (after the baseline)"),
    Setting("pack_check",
            "With bench_pack, measure each packed phase's baseline a second time (config C(<baseline>-packed)) "
            "while the other slots are busy; the report sets its tok/s against the baseline measured alone.",
            {"type": "boolean", "default": False}, coerce="bool",
            doc="with bench_pack: the baseline measured again while the other slots are busy"),
    Setting("slots",
            "The slots of every phase (a phase's own C(slots) replace them): each C({gpus: [indices], cpus: "
            "\"0-3\"}), gpus exactly the phase's tp, disjoint across slots. Empty: one slot per tp GPUs of the host "
            "(no packing on a host without GPUs unless CPU sets are named).",
            {**SLOTS_SCHEMA, "default": []}, elements="dict",
            doc='[{gpus: [0], cpus: "0-15"}, ...]; [] = one slot per tp GPUs of the host'),
    Setting("machine_lock",
            "A file on the host that inventory hosts which are one machine share (e.g. one engine each): a config's "
            "server runs only while its suite holds the machine, and suites sharing it take turns config by config "
            "(a packed phase: the phase), so that two suites of one run never measure at the same time. Empty: "
            "none.", {"type": ["string", "null"], "pattern": NO_NUL, "default": ""}, type="str",
            doc="a file shared by inventory hosts on one machine: their configs take turns"),
    Setting("bind_host", "Address the servers bind to; anything but a loopback address needs O(bench_api_key).",
            {**_launch, "default": "127.0.0.1"}, doc="another address needs bench_api_key"),
    Setting("port", "Port of every server; 0 takes a free port per config.",
            {"type": "integer", "minimum": 0, "maximum": 65535, "default": 0}, coerce="number",
            doc="0: a free port per config; else this fixed port"),
    Setting("api_key",
            "Key the servers require and the client sends (Authorization Bearer); required, 16 characters or more, "
            "when O(bench_bind_host) is not a loopback address. Never written to results, logs or plan output.",
            {"type": ["string", "null"], LAUNCH: True, "default": ""}, type="str", no_log=True,
            doc="required (>= 16 chars) when bench_bind_host is not loopback"),
    Setting("server_args", "Arguments appended to every launch command.", {**_str_list, "default": []},
            elements="str", doc="appended to every launch command"),
    Setting("env", "Environment of every server; keys that look secret are redacted in every record.",
            {**_env, "default": {}}, doc="environment of every server"),
    Setting("sampling", "C(temperature) and C(ignore_eos) of every request; keys left out keep their defaults.",
            {"type": "object", "additionalProperties": False, "properties": {
                "temperature": {"type": "number", "minimum": 0, "default": 0.0},
                "ignore_eos": {"type": "boolean", "default": False}}}),
    Setting("repetitions", "Repetitions of every cell unless a sweep says otherwise.",
            {**_repetitions, "default": 3}, coerce="number"),
    Setting("slo",
            "Latency limits a request must meet to count towards goodput, unless a sweep gives its own C(slo): any of "
            "C(ttft_ms), C(tpot_ms), C(itl_ms) (the longest wait between two stream chunks), C(e2e_ms), and "
            "C(attainment), the share of a load's requests that must meet them for the load to be within limits "
            "(default 0.9). Read by the report only: changing it measures nothing again.",
            {**SLO_SCHEMA, "minProperties": 0, "default": {}},
            doc="{ttft_ms, tpot_ms, itl_ms, e2e_ms, attainment}: goodput's limits (report only)"),
    Setting("max_tokens", "Output lengths unless a sweep says otherwise.", {**_tokens_list, "default": [256]},
            elements="int"),
    Setting("warmup_max_tokens", "Output length of the warmup request (not recorded).",
            {**_pos_int, "default": 32}, coerce="number"),
    Setting("workloads", "Extra prompts by name, beside fib, qsort, arith and json.",
            {"type": "object", "default": {},
             "additionalProperties": {"type": "string", "minLength": 1, "maxLength": MAX_PROMPT_CHARS}},
            doc="extra prompts by name, beside fib, qsort, arith, json"),
    Setting("workloads_file",
            "A JSONL file on the controller (relative paths from the playbook's folder) adding workloads beside the "
            "built-ins and C(bench_workloads), one JSON object a line: C({\"name\": ..., \"prompt\": \"...\"}) or "
            "C({\"name\": ..., \"messages\": [{\"role\": ..., \"content\": ...}, ...]}) (messages go through the "
            "server's chat template). Checked with the matrix; each problem names the file, line and field. Empty "
            "for none.",
            {"type": ["string", "null"], "pattern": NO_NUL, "default": ""}, type="str",
            doc='JSONL on the controller: {"name", "prompt"} or {"name", "messages"} a line'),
    Setting("timeouts",
            "C(health_s), C(request_s), C(stop_s), C(release_s) deadlines in seconds; keys left out keep their "
            "defaults.",
            {"type": "object", "additionalProperties": False, "properties": {
                k: _number(maximum=604800, default=v) for k, v in _TIMEOUTS}}),   # at most a week
    Setting("progress_s",
            "Within a config's timed requests, a progress event (requests done, output tok/s over the window, the "
            "config's ETA) after a burst once this many seconds have passed since the last one.",
            _number(maximum=604800, default=10), coerce="number",
            doc="within a config, a progress line after a burst once this many s passed"),
    Setting("max_plan_hours",
            "A plan whose estimated wall time passes this many hours fails before any host is touched, with the "
            "estimate and how to allow it; raise it for a longer study.",
            _number(default=24), coerce="number",
            doc="a plan estimated longer than this fails (raise it for a longer study)"),
    Setting("server_log_max_mib",
            "Bound of each config's server.log in MiB: past it the first and the last halves are kept and a line "
            "says how many bytes were dropped between them (the systemd journal itself keeps everything).",
            {"type": "integer", "minimum": 1, "maximum": 1024,  # half of it is held in memory
             "default": DEFAULT_MAX_BYTES >> 20}, coerce="number",
            doc="each server.log keeps its first and last halves of this; the drop is said"),
    Setting("estimate",
            "C(startup_s), C(tok_s), C(prefill_tok_s) used only for the plan's time estimate; keys left out keep "
            "their defaults.",
            {"type": "object", "additionalProperties": False, "properties": {
                k: _number(default=v) for k, v in _ESTIMATE}},
            doc="only for the plan's time estimate"),
    Setting("phases", "Phases, each with C(name), C(tp), C(configs) (methods and their parameters) and C(sweeps).",
            PHASES_SCHEMA, elements="dict", required=True, spec_default=[]),

    # ---- where things live
    Setting("host_dir", "Folder on the host for the agent, plans and results.", type="str",
            default="/var/lib/specfleet", doc="on the benchmarked host: agent, plans, results",
            entries=("run", "main", "pull"), group="places"),
    Setting("agent_python", "Python (3.9 or newer) that runs the agent on the host.", type="str",
            default="/usr/bin/python3", doc="any Python >= 3.9 on the host; the agent needs no packages",
            entries=("run", "main", "pull"), describe=(("pull", _AGENT_PYTHON),), group="places"),
    Setting("controller_results", _RESULTS, type="str", default="{{ role_path | dirname | dirname }}/results",
            entries=("run", "main", "pull", "report"), group="places"),

    # ---- how this invocation runs (short extra vars: -e plan=true phases=tp1 run_id=... force=true)
    Setting("plan_only",
            "Print the plan and start nothing. Set with C(-e plan=true); only true/false/yes/no/1/0 are taken, "
            "anything else fails before any host is touched.",
            type="raw", default="{{ plan | default(false) }}", doc="true/false/yes/no/1/0; anything else fails",
            group="invocation"),
    Setting("phases_selected", "Phases to run (list or comma-separated); empty runs all. Set with C(-e phases=tp1).",
            type="raw", default="{{ phases | default([]) }}", group="invocation"),
    Setting("run_id_requested", "Run id to start or resume; empty makes a new one. Set with C(-e run_id=...).",
            type="str", default="{{ run_id | default('') }}", entries=("plan", "run", "main", "pull"),
            describe=(("pull", "The run to fetch; empty fetches the newest run on the host."),), group="invocation"),
    Setting("force",
            "Re-run configs already ok in this run. Set with C(-e force=true); only true/false/yes/no/1/0 are taken.",
            type="raw", default="{{ force | default(false) }}", spec_default=False, entries=("run", "main"),
            group="invocation"),
    Setting("skip_unsupported",
            "Record configs whose launch flags (or a flag's value) the installed engine does not know as "
            "C(skipped) (reason C(unsupported_flag)) instead of C(failed). Set with C(-e skip_unsupported=true).",
            type="raw", default="{{ skip_unsupported | default(false) }}", spec_default=False,
            doc="configs with unknown flags: skipped, not failed", group="invocation"),
    Setting("wait_for_host",
            "One suite runs per host. When another run's suite holds the host, wait for it to end instead of "
            "refusing this one (the refusal names the running run id). Set with C(-e wait_for_host=true).",
            type="raw", default="{{ wait_for_host | default(false) }}", spec_default=False,
            doc="another run's suite on the host: wait, not refuse", group="invocation"),
    Setting("configs_selected",
            "Configs to run (labels such as C(dflash), C(ddtree-b16), or full ids such as C(tp1-dflash)); each "
            "phase keeps its baseline, limited to the cells the selected configs measure. Set with "
            "C(-e configs=...).",
            type="raw", default="{{ configs | default([]) }}",
            doc="-e configs=dflash,ddtree-b16 (each phase keeps its baseline)", group="invocation"),
    Setting("sweeps_selected", "Sweeps to run, by name. Set with C(-e sweeps=short,context).", type="raw",
            default="{{ sweeps | default([]) }}", doc="-e sweeps=short,context", group="invocation"),
    Setting("probe",
            "Before planning, ask the host (read-only, also in check mode) for the installed engine's C(--help) and "
            "version, the model folders' C(config.json) and weight sizes and the GPUs' memory; the plan then marks "
            "each config that would end C(unsupported_flag) or C(does_not_fit). An unreachable host is planned "
            "without it.",
            type="bool", default=True, doc="plan/check/run: read the host's engine --help, model folders, GPU memory",
            group="invocation"),
    Setting("fail_on",
            "When the play fails over the configs' statuses: C(none_ok) when a host finished no config ok (its "
            "table would hold no number), C(any) when any config failed or was skipped, C(never).",
            type="str", allowed=("none_ok", "any", "never"), default="none_ok",
            doc="none_ok: fail when a host finished no config ok | any | never",
            entries=("plan", "run", "main", "report"), describe=(("report", _SEE_PLAN),), group="invocation"),
    Setting("report_plots",
            "Draw the plots (plots/*.png and *.svg, embedded in report.html). C(false) writes every report file "
            "without them, a few seconds sooner on a small run, and removes the plots of an earlier report of the "
            "run, which would no longer match it; C(specfleet plot) draws them later.",
            type="bool", default=True, doc="false: the report files without plots (quicker; `specfleet plot` later)",
            entries=("report",), group="invocation"),
    Setting("history_db",
            "The history store (one DuckDB file) that the report step brings up to date with every run under the "
            "results folder at the end of a run, before the report is written, so that report.html shows the run's "
            "cells against their earlier runs. Empty: no store. C(specfleet db) builds it by hand; C(specfleet "
            "history) reads it.",
            type="str", default="{{ bench_controller_results }}/specfleet.duckdb",
            doc='the history store the report updates; "": none', entries=("report",), group="invocation"),
    Setting("async_s", "The detached suite is stopped after this many seconds.", type="int", default=604800,
            doc="the detached suite is stopped after this long", entries=("run", "main"), group="invocation"),
    Setting("follow_timeout_s", "How long the controller follows progress before leaving the suite running.",
            type="int", default=172800, entries=("run", "main"), group="invocation"),
    Setting("follow_interval_s",
            "The longest pause between polls while the agent starts; once it runs, each poll waits on the host for "
            "the next event.",
            type="int", default=2, doc="then each poll waits on the host for the next event", entries=("run", "main"),
            group="invocation"),

    # ---- how servers run under systemd
    Setting("service_user", "The unprivileged user the systemd units run as.", type="str", default="specfleet",
            entries=("run", "main"), group="service"),
    Setting("service_limit_nofile", "LimitNOFILE of the units.", type="int", default=65536, entries=("run", "main"),
            group="service"),
    Setting("service_read_only_paths",
            "Folders bound read-only into the units (model and venv folders hidden by the hardening).", type="list",
            elements="str", default=[], doc="extra folders bound read-only into the unit (models, venvs)",
            entries=("run", "main"), group="service"),
    Setting("service_read_write_paths", "Extra writable folders of the units.", type="list", elements="str",
            default=[], entries=("run", "main"), group="service"),
    Setting("service_device_allow",
            "Devices the units may open (beside systemd's DevicePolicy=closed set), each C(PATH [ACCESS]) or "
            "C(char-NAME [ACCESS]). A path may be a glob (C(/dev/nvidia[0-9]* rw)): every path entry is expanded on "
            "the host into one DeviceAllow= line per device node it matches, since systemd takes no glob in a path; "
            "a path entry that matches nothing is reported; on a host with O(bench_gpu_count) above 0 a list that "
            "resolves to nothing fails before anything changes. C(char-)/C(block-) groups of /proc/devices are "
            "written as given.",
            type="list", elements="str", default=[], entries=("run", "main"), group="service"),
)
MATRIX: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.in_matrix)
ENTRY_POINTS = {
    "plan": "Validate the matrix and render every config (no host access)",
    "run": "Run the suite on the host, detached, follow it and pull the results",
    "main": "Plan, run and report the suite on the host",
    "pull": "Fetch a run's results from the host to the controller",
    "report": "Write run.json and the speedup report on the controller",
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["engine", "engine_python", "model", "phases"],
    "additionalProperties": False,
    "properties": {s.key: s.schema for s in MATRIX},
}
# The matrix's defaults are the schema's `default`s: for a mapping whose keys all have one (sampling, timeouts,
# estimate), the mapping of them, completed key by key when the variable sets only some keys (Ansible replaces a
# dict variable whole).
PARTIAL = tuple(k for k, v in SCHEMA["properties"].items()
                if v.get("properties") and all("default" in p for p in v["properties"].values()))
DEFAULTS: dict[str, Any] = {
    k: ({name: p["default"] for name, p in v["properties"].items()} if k in PARTIAL else v["default"])
    for k, v in SCHEMA["properties"].items() if k in PARTIAL or "default" in v}


def role_default(s: Setting) -> Any:
    """The value of `s` in the role's defaults/main.yml."""
    if not s.in_matrix:
        return s.default
    if s.key in DEFAULTS:
        return DEFAULTS[s.key]
    return {"suite_name": "{{ inventory_hostname }}", "model": {}, "phases": []}.get(s.key)


# ---------------------------------------------------------------------------------------------------------------
# The suite from the role's variables
# ---------------------------------------------------------------------------------------------------------------

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def as_number(value: Any) -> Any:
    """A whole number given as a string (`-e bench_repetitions=2`) as that number; anything else unchanged, for the
    validator to judge."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def as_bool(value: Any) -> Any:
    """true/false/yes/no/1/0 given as a string (`-e bench_pack=true`) as that boolean; anything else unchanged, for
    the validator to judge (a typo fails instead of meaning false)."""
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    return value


def suite_from(get: Callable[[str], Any], playbook_dir: str) -> dict[str, Any]:
    """The suite the validator sees, from the role's variables (`get(name)`: the rendered value of `bench_<key>`),
    each matrix setting under its key: `-e` strings taken as the numbers and booleans they spell, a relative
    `bench_workloads_file` from the playbook's folder."""
    suite: dict[str, Any] = {}
    for s in MATRIX:
        value = get(s.name)
        value = as_number(value) if s.coerce == "number" else as_bool(value) if s.coerce == "bool" else value
        if s.key == "workloads_file" and value and isinstance(value, str) and not os.path.isabs(value):
            value = f"{playbook_dir}/{value}"
        suite[s.key] = value
    return suite


def spec_type(s: Setting) -> str:
    """The argument_specs type of a setting: its own, else its schema's (a value of several types: raw)."""
    if s.type:
        return s.type
    assert s.schema is not None
    kind = s.schema.get("type", "string" if "enum" in s.schema else None)
    kinds = [kind] if isinstance(kind, str) else [k for k in kind if k != "null"]
    words = {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "array": "list",
             "object": "dict"}
    return words[kinds[0]] if len(kinds) == 1 else "raw"


def choices(s: Setting) -> Optional[list[Any]]:
    if s.allowed:
        assert not s.schema or set(s.allowed) == set(s.schema.get("enum", s.allowed)), s.key
        return list(s.allowed)
    return list(s.schema["enum"]) if s.schema and "enum" in s.schema else None


NO_DEFAULT = object()  # spec_default's answer for a setting whose argument spec shows no default


def spec_default(s: Setting) -> Any:
    """The default argument_specs shows (NO_DEFAULT: none, as for a required setting or one rendered by Jinja)."""
    if s.spec_default is not None:
        return s.spec_default if not s.required else NO_DEFAULT
    if s.required:
        return NO_DEFAULT
    value = role_default(s)
    if value is None or (isinstance(value, str) and "{{" in value):
        return NO_DEFAULT
    return value



def described(s: Setting, entry: str) -> str:
    return dict(s.describe).get(entry, s.description)


def by_key(key: str) -> Setting:
    return next(s for s in SETTINGS if s.key == key)


def number_keys() -> Mapping[str, str]:
    return {s.key: s.coerce for s in MATRIX if s.coerce}


# ---------------------------------------------------------------------------------------------------------------
# The declared fields, by role
# ---------------------------------------------------------------------------------------------------------------

Parts = tuple[Any, ...]
ANY_KEY, ANY_ITEM = "*", "[]"  # in a field's pattern path: any key of a mapping, any item of a list


def fields(schema: Mapping[str, Any] = SCHEMA, parts: Parts = ()) -> Iterator[tuple[Parts, Mapping[str, Any]]]:
    """Every field the schema declares with its own schema, as a pattern path (`ANY_KEY` for any key of a mapping,
    `ANY_ITEM` for any item of a list): `("phases", "[]", "configs", "[]", "draft_model", "path")`."""
    yield parts, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from fields(sub, (*parts, key))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from fields(schema["additionalProperties"], (*parts, ANY_KEY))
    if isinstance(schema.get("items"), dict):
        yield from fields(schema["items"], (*parts, ANY_ITEM))


def values(value: Any, schema: Mapping[str, Any] = SCHEMA, parts: Parts = ()
           ) -> Iterator[tuple[Parts, Mapping[str, Any], Any]]:
    """Every value of a suite with the path it sits at and the schema of the field it fills (values where the
    schema declares no field left out)."""
    yield parts, schema, value
    if isinstance(value, dict):
        known, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for key, item in value.items():
            sub = known.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                yield from values(item, sub, (*parts, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from values(item, schema["items"], (*parts, i))
