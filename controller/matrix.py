"""The benchmark matrix: validation (naming the offending field) and expansion into configs.

The controller validates the `bench_*` variables of each host with `validate()` before any
server starts, and `expand()` turns them into the ordered config list the agent runs. Schema
checks use jsonschema (controller only) against `controller.settings.SCHEMA`, where each setting is defined;
cross-field checks are plain code. The workloads of
`bench_workloads_file` are read here, on the controller, and travel to the host inside the configs.
"""
from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from agent import pack, records, workloads
from agent.engines import ENGINES, PORT, draft_length, flag_at, flag_value, ngram_lookup
from agent.secrets import PLACEHOLDER
from collector.vocab import cell_words

from . import estimate, settings
from .names import LABEL_TEXT, label_problem
from .schema_errors import field_path, is_secret, schema_errors, shown, type_of
from .settings import DEFAULTS as DEFAULTS  # re-exported: the names the role, plan and tests know them by
from .settings import HOSTNAME_RE as _HOSTNAME
from .settings import METHODS as METHODS
from .settings import NAME_MAX, NAME_RE, NAME_TEXT, NEEDS_DRAFT, NEEDS_K, PARTIAL, PREFIX
from .settings import SCHEMA as SCHEMA
from .workloads_file import read_workloads_file


def with_defaults(suite: dict[str, Any]) -> dict[str, Any]:
    """The suite with every default filled in: missing variables whole, partial mappings key by key.
    Values of the wrong type are left as they are, for `validate` to name."""
    if not isinstance(suite, dict):
        return suite
    out = {k: json.loads(json.dumps(v)) for k, v in DEFAULTS.items() if k not in suite}
    for k, v in suite.items():
        out[k] = {**DEFAULTS[k], **v} if k in PARTIAL and isinstance(v, dict) else v
    return out


def _put(obj: Any, parts: tuple[Any, ...], value: Any) -> Any:
    """`obj` with the value at `parts` replaced, the containers on the way copied (the caller's are left as they
    are)."""
    if not parts:
        return value
    head, rest = parts[0], parts[1:]
    if isinstance(obj, dict):
        return {**obj, head: _put(obj[head], rest, value)}
    out = list(obj)
    out[head] = _put(obj[head], rest, value)
    return out


def _spells_inf(value: Any) -> bool:
    """Whether a value is infinity other than as `inf`: YAML's `.inf` and JSON's `Infinity` (floats), or a string
    spelling it (`.Inf`, `+.inf`, `Infinity`: from `-e key=value` or a quoted YAML value)."""
    if isinstance(value, float):
        return value == math.inf
    return (isinstance(value, str) and value != records.INF
            and settings.INF_SPELLED.fullmatch(value.strip()) is not None)


def with_inf_written(suite: Any) -> Any:
    """The suite with every spelling of infinity in a field that takes inf (`settings.INF`) written `inf`, as the
    agent and the records take it. Minus infinity and NaN are left for the validator to name."""
    found = [parts for parts, schema, value in settings.values(suite)
             if schema.get(settings.INF) and _spells_inf(value)]
    for parts in found:
        suite = _put(suite, parts, records.INF)
    return suite


class MatrixError(ValueError):
    """A matrix problem; the message names the field and what is allowed."""


def label(cfg: dict[str, Any]) -> str:
    """The config's name within its phase, e.g. `ddtree-b16`, `ngram-k4`, `autoregressive`."""
    if cfg.get("id"):
        return cfg["id"]
    m = cfg["method"]
    if m == "ddtree":
        return f"ddtree-b{cfg['budget']}"
    synth = f"-synth{cfg['synth_len']:g}" if isinstance(cfg.get("synth_len"), (int, float)) else (
        "-synth" if "synth_rates" in cfg else "")
    if m in NEEDS_K:
        return f"{m}-k{cfg['num_speculative_tokens']}{synth}"
    if m == "dflash" and "block_size" in cfg:
        return f"dflash-blk{cfg['block_size']}{synth}"
    return m + synth


def method_params(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("num_speculative_tokens", "budget", "block_size", "topk", "num_draft_tokens",
            "prompt_lookup_min", "prompt_lookup_max", "synth_len", "synth_rates")
    return {k: cfg[k] for k in keys if k in cfg}


def _synth_errors(cfg: dict[str, Any], where: str, engine: str) -> list[str]:
    """llama.cpp's synthetic acceptance, as its server takes it (common/speculative.cpp): on a speculative config of
    that engine, one of the two, a length in [1, draft length + 1], at most draft-length rates that never rise."""
    given = [k for k in ("synth_len", "synth_rates") if k in cfg]
    if not given:
        return []
    field = f"{where}.{given[0]}"
    if engine != "llamacpp":
        return [f"{field}: synthetic acceptance is llama.cpp's (engine llamacpp); engine {engine} has none"]
    if cfg["method"] == "autoregressive":
        return [f"{field}: synthetic acceptance needs a speculative method; allowed on "
                f"{', '.join(m for m in ENGINES['llamacpp'].methods if m != 'autoregressive')}"]
    if len(given) == 2:
        return [f"{where}.synth_rates: synth_len and synth_rates are exclusive (llama.cpp takes one); allowed: one"]
    k = draft_length(cfg["method"], cfg)
    if not isinstance(k, int):
        return []
    if "synth_len" in cfg and cfg["synth_len"] > k + 1:
        return [f"{field}: {cfg['synth_len']:g} is above the draft length + 1 ({k + 1}: a step accepts at most "
                f"{k} drafts and adds the target's token); allowed 1..{k + 1}"]
    rates = cfg.get("synth_rates") or []
    if len(rates) > k:
        return [f"{field}: {len(rates)} rates for a draft of {k} tokens; allowed: at most {k}, one per position"]
    if any(b > a for a, b in zip(rates, rates[1:])):
        return [f"{field}: {rates} rise; allowed: rates that never rise (a position is reached only through the "
                f"ones before it)"]
    return []


def is_loopback(host: str) -> bool:
    """Whether an address (or `localhost`) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _strings(obj: Any, parts: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], str]]:
    if isinstance(obj, str):
        yield parts, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(v, (*parts, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _strings(v, (*parts, i))


def _secret_errors(suite: dict[str, Any], secrets_hidden: bool, named: set[str]) -> list[str]:
    """The API key and the bind address; placeholder-shaped text, which would be resolved to a secret on the host.
    Fields in `named` have a problem reported already."""
    errors = []
    if not secrets_hidden:
        for parts, value in _strings(suite):
            if PLACEHOLDER.search(value) and field_path(parts) not in named:
                errors.append(f"{field_path(parts)}: holds text of the form <secret:N>, which marks hidden secrets on "
                              f"the way to the host; allowed: any other text")
    if f"{PREFIX}bind_host" in named:
        return errors
    bind = suite["bind_host"]
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        if not _HOSTNAME.match(bind):
            errors.append(f"{PREFIX}bind_host: {shown(bind, False)} is not an address; allowed: an IPv4 or IPv6 "
                          f"address or a host name (127.0.0.1 keeps the servers on this host)")
            return errors
    key = suite["api_key"] or ""
    if secrets_hidden and PLACEHOLDER.fullmatch(key) or f"{PREFIX}api_key" in named:
        return errors
    if key and not key.isprintable() or any(c.isspace() for c in key):
        errors.append(f"{PREFIX}api_key: holds spaces or control characters (value not shown); allowed: "
                      f"printable characters without spaces")
    elif not is_loopback(bind) and len(key) < 16:
        errors.append(f"{PREFIX}api_key: servers bound to {bind} are reachable from the network and need an API "
                      f"key of at least 16 characters (keep it in a vault); or set {PREFIX}bind_host: 127.0.0.1")
    return errors


@dataclass(frozen=True)
class Matrix:
    """A suite that passed `validate`, with every default filled in, the phases selected (None: all) and the
    workloads read from its `workloads_file`."""

    suite: dict[str, Any]
    phases: tuple[str, ...] | None = None
    file_workloads: dict[str, Any] = field(default_factory=dict)

    def hide(self, suite: dict[str, Any]) -> Matrix:
        """The same matrix with its secrets replaced by placeholders (`secrets.split` of `self.suite`)."""
        return Matrix(with_defaults(suite), self.phases, self.file_workloads)


# What specfleet sets on every server itself: an override in server_args or env would make the config's label
# (tp, bind address, GPU slot, method) say one thing and the server do another, or expose it without its key.
OWNED_FLAGS = {
    "--host": f"the bind address follows {PREFIX}bind_host",
    "--port": "the port is chosen per server",
    "--uds": f"the server listens on {PREFIX}bind_host and its port (a socket would leave both unused)",
    "--served-model-name": f"the served name is {PREFIX}model.name",
    "--api-key": f"the key is {PREFIX}api_key (kept out of logs and records)",
}
OWNED_ENV = {
    "CUDA_VISIBLE_DEVICES": "the GPUs follow the config's slot",
    "NVIDIA_VISIBLE_DEVICES": "the GPUs follow the config's slot",
    "CUDA_DEVICE_ORDER": "GPU indices are nvidia-smi's (PCI bus order), as the slots are",
    "VLLM_API_KEY": f"the key is {PREFIX}api_key (kept out of logs and records)",
}


def owned_flags(engine: Any) -> dict[str, str]:
    """The launch flags specfleet sets for `engine`, each with where its value comes from."""
    spec = {"vllm": ("--speculative-config",),
            "sglang": ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
                       "--speculative-num-draft-tokens", "--speculative-num-steps", "--speculative-eagle-topk",
                       "--speculative-ddtree-budget")}.get(engine.name, ())
    return {**OWNED_FLAGS,
            **{f: f"the model path is {PREFIX}model.path" for f in (engine.model_flag, "--model", "--model-path")},
            **{f: "the tensor-parallel size is the phase's tp"
               for f in (engine.tp_flag, "--tensor-parallel-size", "--tp-size", "--tp", "-tp")},
            # vLLM's and SGLang's spellings of the other ways to spread a server over more GPUs, or onto others
            **{f: "a config's GPUs are its phase's tp on this host (its slot), which these would change"
               for f in ("--pipeline-parallel-size", "--pp-size", "-pp", "--data-parallel-size",
                         "--data-parallel-size-local", "--dp-size", "--dp", "-dp", "-dpl", "--base-gpu-id",
                         "--gpu-id-step", "--nnodes")},
            **{f: "speculation follows the config's method and its parameters" for f in spec}}


def _name_errors(suite: dict[str, Any]) -> list[str]:
    """Names a reader sees: the suite's, the models', the sweeps' (labels: any readable text); the workloads of
    bench_workloads (names: as a config id, and not a built-in workload's)."""
    errors = []
    labels = [(f"{PREFIX}suite_name", suite.get("suite_name")),
              *((f"{PREFIX}{k}.name", (suite.get(k) or {}).get("name")) for k in ("model", "draft_model")),
              *((f"{PREFIX}phases[{i}].sweeps[{j}].name", sw.get("name")) for i, ph in enumerate(suite["phases"])
                for j, sw in enumerate(ph["sweeps"])),
              *((f"{PREFIX}phases[{i}].configs[{j}].draft_model.name", (c.get("draft_model") or {}).get("name"))
                for i, ph in enumerate(suite["phases"]) for j, c in enumerate(ph["configs"]))]
    for where, value in labels:
        why = label_problem(value) if isinstance(value, str) else None
        if why:
            errors.append(f"{where}: {shown(value, False)} {why}; allowed: {LABEL_TEXT}")
    builtin = set(workloads.known())
    for name in suite["workloads"]:
        if not isinstance(name, str):  # a YAML key written as a number
            errors.append(f"{PREFIX}workloads: the key {shown(name, False)} is {type_of(name)}, not a workload name; "
                          f"allowed: {NAME_TEXT}")
        elif not NAME_RE.match(name):
            errors.append(f"{PREFIX}workloads.{shown(name, False)}: not a valid workload name; allowed: {NAME_TEXT}")
        elif name in builtin:
            errors.append(f"{PREFIX}workloads.{name}: the name of a built-in workload; allowed: another name "
                          f"(built-in: {', '.join(sorted(builtin))})")
    return errors


def _override_errors(suite: dict[str, Any], engine: Any) -> list[str]:
    """server_args and env, at every level, that would override what specfleet sets (a flag's `=value` form
    and an abbreviation argparse would take for it included)."""
    owned = owned_flags(engine)
    places: list[tuple[str, dict[str, Any]]] = [(PREFIX.rstrip("_"), suite)]
    for i, phase in enumerate(suite["phases"]):
        places.append((f"{PREFIX}phases[{i}]", phase))
        places += [(f"{PREFIX}phases[{i}].configs[{j}]", cfg) for j, cfg in enumerate(phase["configs"])]
    errors = []
    for where, obj in places:
        field = f"{where}.server_args" if where != PREFIX.rstrip("_") else f"{PREFIX}server_args"
        for k, arg in enumerate(obj.get("server_args") or []):
            written = str(arg).split("=", 1)[0]
            name = engine.flag_name(str(arg))  # as the engine's parser reads it: --tp_size, --speculative-config.x
            hit = owned.get(name) or next((why for flag, why in owned.items() if len(name) > 3
                                          and flag.startswith("--") and flag.startswith(name)), None)
            if name.startswith("-") and hit:
                spelled = written if written == name else f"{written} (read as {name})"
                errors.append(f"{field}[{k}]: {spelled} is set by specfleet ({hit}); allowed: any other flag")
        env_field = f"{where}.env" if where != PREFIX.rstrip("_") else f"{PREFIX}env"
        for key in obj.get("env") or {}:
            if key in OWNED_ENV:
                errors.append(f"{env_field}.{key}: set by specfleet ({OWNED_ENV[key]}); allowed: any other variable")
    return errors


def _named(errors: Iterable[str]) -> set[str]:
    """The fields a list of problems names (each line starts with its field)."""
    return {line.split(": ", 1)[0] for line in errors}


def _placeholder_errors(suite: dict[str, Any], named: set[str]) -> list[str]:
    """Every value that reaches the engine's command line or environment (`settings.LAUNCH`: paths, names, the API
    key, the bind address, server_args and env at every level) holding `{port}`: specfleet fills it with the
    server's own port in its --port only; elsewhere it would be passed on as written, or, a whole argument, be
    replaced by the port as well. Fields in `named` have a problem reported already."""
    out = []
    for parts, schema, value in settings.values(suite):
        where = field_path(parts)
        if schema.get(settings.LAUNCH) and isinstance(value, str) and PORT in value and where not in named:
            what = "" if is_secret(list(parts)) else f"{shown(value, False)} "
            out.append(f"{where}: {what}holds {PORT}, the placeholder specfleet fills with the server's own port in "
                       f"its --port only; allowed: a literal value")
    return out


def validate(suite: dict[str, Any], phases: list[str] | None = None, *, secrets_hidden: bool = False) -> Matrix:
    """The checked matrix; MatrixError listing every problem, each naming its field. `secrets_hidden`: the
    suite's secrets are already placeholders (secrets.split)."""
    suite = with_inf_written(with_defaults(suite))
    errors = schema_errors(suite)
    if errors:
        raise MatrixError("\n".join(errors))
    engine = ENGINES[suite["engine"]]
    errors += _override_errors(suite, engine)
    errors += _placeholder_errors(suite, _named(errors))
    errors += _secret_errors(suite, secrets_hidden, _named(errors))
    errors += _name_errors(suite)
    taken = {**{w: "a built-in workload" for w in workloads.known()},
             **{w: f"a workload of {PREFIX}workloads" for w in suite["workloads"] if isinstance(w, str)}}
    from_file, problems = read_workloads_file(suite["workloads_file"], taken)
    errors += problems
    known = set(taken) | set(from_file)
    gpus = suite["gpu_count"]
    max_tp = gpus if gpus > 0 else 1
    seen_ids: dict[str, str] = {}
    names = [p["name"] for p in suite["phases"]]
    for i, phase in enumerate(suite["phases"]):
        where = f"{PREFIX}phases[{i}]"
        first = names.index(phase["name"])
        if first < i:
            errors.append(f"{where}.name: duplicate phase name {phase['name']!r} (also {PREFIX}phases[{first}]); "
                          f"allowed: a name no other phase has (phase names are config id prefixes)")
        tp = phase.get("tp", 1)
        if tp > max_tp:
            errors.append(f"{where}.tp: {tp} is above the host's GPU count ({gpus}); allowed 1..{max_tp}")
        labels = []
        for j, cfg in enumerate(phase["configs"]):
            cw = f"{where}.configs[{j}]"
            if cfg["method"] not in engine.methods:
                errors.append(f"{cw}.method: {cfg['method']!r} is not supported by engine {engine.name}; "
                              f"allowed: {', '.join(engine.methods)}")
            errors += _synth_errors(cfg, cw, engine.name)
            if cfg["method"] in NEEDS_DRAFT and not (cfg.get("draft_model") or suite.get("draft_model")):
                errors.append(f"{cw}.draft_model: method {cfg['method']} needs a draft model "
                              f"(set {PREFIX}draft_model or the config's draft_model)")
            lo, hi = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
            if lo is not None and hi is not None and lo > hi and not (cfg["method"] == "ngram"
                                                                        and engine.name == "vllm"):
                errors.append(f"{cw}.prompt_lookup_min: {lo} is above prompt_lookup_max {hi}; allowed: "
                              f"prompt_lookup_min <= prompt_lookup_max")
            if cfg["method"] == "ngram" and engine.name == "vllm" and isinstance(
                    cfg.get("num_speculative_tokens", 1), int):
                lo, hi = ngram_lookup(cfg)  # a bound left out is the adapter's default, which the server gets
                if lo > hi:
                    given = [f"prompt_lookup_{b}" for b in ("min", "max") if f"prompt_lookup_{b}" in cfg]
                    field = "prompt_lookup_min" if "prompt_lookup_min" in cfg else "prompt_lookup_max"
                    implied = "" if len(given) == 2 else (
                        f" (prompt_lookup_{'max' if field == 'prompt_lookup_min' else 'min'} is not given: "
                        f"{hi if field == 'prompt_lookup_min' else lo}, the default)")
                    errors.append(f"{cw}.{field}: prompt_lookup_min {lo} is above prompt_lookup_max {hi}{implied}; "
                                  f"allowed: prompt_lookup_min <= prompt_lookup_max")
            cid = f"{phase['name']}-{label(cfg)}"
            if not NAME_RE.match(cid):
                errors.append(f"{cw}: config id {cid[:80]!r} is too long for a folder name; allowed: at most "
                              f"{NAME_MAX} characters (shorten the phase name or set a shorter `id`)")
            if cid in seen_ids and first == i:  # a duplicate phase name is reported once, above
                errors.append(f"{cw}: duplicate config id {cid!r} (also {seen_ids[cid]}); set a distinct `id`")
            seen_ids.setdefault(cid, cw)
            labels.append(label(cfg))
        if "autoregressive" not in [c["method"] for c in phase["configs"]]:
            errors.append(f"{where}.configs: every phase needs an autoregressive baseline config; add "
                          f"{{method: autoregressive}} (methods now: "
                          f"{', '.join(sorted({c['method'] for c in phase['configs']}))})")
        errors += length_problems(suite, i, engine)
        for j, sweep in enumerate(phase["sweeps"]):
            sw = f"{where}.sweeps[{j}]"
            for k, w in enumerate(sweep["workloads"]):
                if w not in known:
                    errors.append(f"{sw}.workloads[{k}]: unknown workload {w!r}; allowed: {', '.join(sorted(known))}")
            for k, m in enumerate(sweep.get("methods", [])):
                if m not in labels:
                    errors.append(f"{sw}.methods[{k}]: {m!r} is not a config of phase {phase['name']}; "
                                  f"allowed: {', '.join(labels)}")
        errors += batch_problems(suite, phase, where, engine)
        errors += open_loop_problems(suite, phase, where)
    errors += pack.problems(suite, gpus, PREFIX)
    for p in phases or []:
        if p not in names:
            errors.append(f"phases: unknown phase {p!r}; allowed: {', '.join(names)}")
    if errors:
        raise MatrixError("\n".join(errors))
    return Matrix(suite, tuple(phases) if phases else None, from_file)


def measures(sweep: Mapping[str, Any], cfg: Mapping[str, Any]) -> bool:
    """Whether a sweep's cells are measured by a config: every config's without `methods`, else the configs it
    names and the baseline (which measures every cell its phase's configs measure)."""
    return not sweep.get("methods") or label(cfg) in sweep["methods"] or cfg["method"] == "autoregressive"


@dataclass(frozen=True)
class Limit:
    """A context limit a config's requests must fit (prompt + output, in tokens), and the field that declares it."""

    tokens: int
    what: str    # "the model's max_model_len", "the drafter's max_model_len", "the server's --context-length"
    source: str  # the field: bench_draft_model.max_model_len, bench_phases[0].server_args[3], ...


def _uses_drafter(suite: Mapping[str, Any], cfg: Mapping[str, Any]) -> bool:
    return cfg["method"] in NEEDS_DRAFT and bool(cfg.get("draft_model") or suite.get("draft_model"))


def declared_limits(suite: dict[str, Any]) -> list[tuple[tuple[Any, ...], int]]:
    """Every context limit the suite declares (`settings.CONTEXT`), with its path."""
    return [(parts, value) for parts, schema, value in settings.values(suite)
            if schema.get(settings.CONTEXT) and isinstance(value, int)]


def context_limits(suite: dict[str, Any], i: int, j: int, engine: Any,
                   declared: list[tuple[tuple[Any, ...], int]] | None = None) -> list[Limit]:
    """Every context limit config j of phase i must fit: each declared on a model it uses (`settings.CONTEXT`: the
    target's, and its drafter's, its own or the suite's, where it takes one; `declared`: `declared_limits`) and the
    server's own context flag, where its server_args set it (the last one given, at any level, is the one the
    engine takes)."""
    phase = suite["phases"][i]
    cfg = phase["configs"][j]
    models = {(): "the suite's", ("model",): "the model's", ("phases", i): "the phase's",
              ("phases", i, "configs", j): "the config's"}
    if _uses_drafter(suite, cfg):
        models[("phases", i, "configs", j, "draft_model") if cfg.get("draft_model") else ("draft_model",)] = \
            "the drafter's"
    out = [Limit(value, f"{models[parts[:-1]]} {parts[-1]}", field_path(parts))
           for parts, value in (declared_limits(suite) if declared is None else declared) if parts[:-1] in models]
    if engine.context_flag:
        levels = ((f"{PREFIX}server_args", suite), (f"{PREFIX}phases[{i}].server_args", phase),
                  (f"{PREFIX}phases[{i}].configs[{j}].server_args", cfg))
        placed = [(f"{field}[{k}]", str(arg)) for field, obj in levels
                  for k, arg in enumerate(obj.get("server_args") or [])]
        found = flag_at([arg for _, arg in placed], engine.context_flag, engine.flexible_names)
        if found and found[0].isdigit():  # anything else: the engine's own argparse says what is wrong with it
            out.append(Limit(int(found[0]), f"the server's {engine.context_flag}", placed[found[1]][0]))
    return out


def _same_tokens(limits: Iterable[Limit]) -> list[list[Limit]]:
    """Limits grouped by their tokens, in their order: one length declared twice (bench_model.max_model_len and the
    server's flag, as the embedded profile has them) is one problem."""
    groups: dict[int, list[Limit]] = {}
    for limit in limits:
        groups.setdefault(limit.tokens, []).append(limit)
    return list(groups.values())


def length_problems(suite: dict[str, Any], i: int, engine: Any) -> list[str]:
    """Phase i's requests against every context limit of the configs that send them (`context_limits`): the
    longest request of each sweep (its largest context + its largest max_tokens), and each config's warmup (its
    first cell's context + bench_warmup_max_tokens). One line per sweep and length exceeded, naming every field
    that declares it, and the configs it binds where it does not bind them all."""
    phase, where = suite["phases"][i], f"{PREFIX}phases[{i}]"
    declared = declared_limits(suite)
    limits = [context_limits(suite, i, j, engine, declared) for j in range(len(phase["configs"]))]
    out: list[str] = []
    for k, sweep in enumerate(phase["sweeps"]):
        sw = f"{where}.sweeps[{k}]"
        out_len = max(sweep.get("max_tokens", suite["max_tokens"]))
        context = max(sweep.get("context_tokens", [0]))
        field = f"{sw}.context_tokens" if context else f"{sw}.max_tokens" if "max_tokens" in sweep \
            else f"{PREFIX}max_tokens"
        users = [j for j, cfg in enumerate(phase["configs"]) if measures(sweep, cfg)]
        over: dict[Limit, list[str]] = {}
        for j in users:
            for limit in limits[j]:
                if context + out_len > limit.tokens:
                    over.setdefault(limit, []).append(f"{phase['name']}-{label(phase['configs'][j])}")
        by_configs: dict[tuple[str, ...], list[Limit]] = {}
        for limit, ids in over.items():
            by_configs.setdefault(tuple(ids), []).append(limit)
        for ids, bound in by_configs.items():
            whom = "" if len(ids) == len(users) else f"; of {', '.join(ids)}"
            for group in _same_tokens(bound):
                out.append(f"{field}: context + max_tokens = {context + out_len} exceeds {group[0].what} "
                           f"{group[0].tokens} (context {context}, max_tokens {out_len}{whom}); allowed: "
                           f"context_tokens + max_tokens <= {group[0].tokens} "
                           f"({', '.join(x.source for x in group)})")
    warmup, said = suite["warmup_max_tokens"], set()
    for j, cfg in enumerate(phase["configs"]):
        # the warmup request uses the config's first cell: the first sweep that includes it
        k, sweep = next(((k, s) for k, s in enumerate(phase["sweeps"]) if measures(s, cfg)), (0, {}))
        context = (sweep.get("context_tokens") or [0])[0]
        for group in _same_tokens(x for x in limits[j] if context + warmup > x.tokens and x not in said):
            said.update(group)
            out.append(f"{PREFIX}warmup_max_tokens: {warmup} tokens after the warmup prompt of "
                       f"{where}.configs[{j}] ({context} context tokens, {where}.sweeps[{k}]) exceed "
                       f"{group[0].what} {group[0].tokens}; allowed: at most {max(group[0].tokens - context, 0)} "
                       f"({', '.join(x.source for x in group)})")
    return out


def batch_problems(suite: dict[str, Any], phase: dict[str, Any], where: str, engine: Any) -> list[str]:
    """A sweep's concurrency above what a config's server runs at once (`--max-num-seqs` / `--max-running-requests`
    in its server args, else the engine's own default where the host tells it): the requests past it would wait
    in the engine's queue, and the cell would not measure the concurrency it names."""
    out: list[str] = []
    if not engine.batch_flag:
        return out
    tp, gpus, mib = phase.get("tp", 1), suite["gpu_count"], suite["gpu_memory_mib"]
    for cfg in phase["configs"]:
        args = [*suite["server_args"], *phase.get("server_args", []), *cfg.get("server_args", [])]
        given = flag_value(args, engine.batch_flag, engine.flexible_names)
        if given is not None:
            if not given.isdigit():
                continue  # the engine's own argparse says what is wrong with it
            limit, source, switch = int(given), f"{engine.batch_flag} {given} in its server_args", "raise it"
        else:
            limit = engine.default_batch(tp, gpus, mib, args)
            if limit is None:
                continue
            source = f"{engine.name}'s default here: {engine.batch_flag} is not given"
            switch = f"set {engine.batch_flag} in server_args"
        for j, sweep in enumerate(phase["sweeps"]):
            if not measures(sweep, cfg):
                continue
            most = max(sweep.get("concurrency", [1]))
            if most > limit:
                out.append(f"{where}.sweeps[{j}].concurrency: {most} is above the {limit} requests that "
                           f"{phase['name']}-{label(cfg)} runs at once ({source}): the rest would wait in its queue "
                           f"and the cell would not measure concurrency {most}; allowed: at most {limit}, or "
                           f"{switch}")
    return out


def open_requests(sweep: Mapping[str, Any], rate: Any) -> int | None:
    """Requests per repetition of a sweep's open-loop cell at `rate`: its `requests`, else `duration_s` worth of
    the schedule (at least one); None when neither says (or "inf" with a duration only)."""
    if "requests" in sweep:
        return sweep["requests"]
    if "duration_s" in sweep and rate != records.INF:
        return max(1, round(rate * sweep["duration_s"]))
    return None


def open_loop_problems(suite: dict[str, Any], phase: dict[str, Any], where: str) -> list[str]:
    """An open-loop sweep without a request count; one cell measured by two sweeps that say differently how
    (arrival, requests, seed, latency limits): its rows could not tell which they measured."""
    out: list[str] = []
    for j, sweep in enumerate(phase["sweeps"]):
        sw = f"{where}.sweeps[{j}]"
        for rate in sweep.get("request_rates", []):
            if open_requests(sweep, rate) is None:
                out.append(f"{sw}.requests: is required for request rate {rate}"
                           + (" (a duration gives no count when every request is due at once)"
                              if "duration_s" in sweep else "")
                           + "; allowed: the requests each repetition sends (or duration_s for a finite rate)")
                break
    if out:
        return out
    seen: dict[str, tuple[str, str]] = {}  # cell -> (its sweep, what it says beside the grid's point)
    for cfg in phase["configs"]:
        for j, sweep in enumerate(phase["sweeps"]):
            if not measures(sweep, cfg):
                continue
            for cell in _cells(suite, sweep):
                key = json.dumps(records.cell_key(cell))
                how = json.dumps({k: cell.get(k) for k in ("arrival", "requests", "seed", "slo")}, sort_keys=True)
                first = seen.setdefault(key, (f"{where}.sweeps[{j}]", how))
                if first[1] != how:
                    out.append(f"{where}.sweeps[{j}]: measures cell ({cell_words(cell)}) of {phase['name']}-"
                               f"{label(cfg)} as {first[0]} does, with other arrival, requests, seed or slo; "
                               f"allowed: one way per cell (give the cell to one sweep, or the same settings)")
                    return out
    return out


def _cells(suite: dict[str, Any], sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """A sweep's grid, one cell (records.CELL) per point: each concurrency (closed loop), then each request rate
    (open loop: concurrency 0, with its arrival, requests per repetition and seed); the latency limits the
    report judges its requests by (`slo`: the sweep's, else bench_slo) where there are any."""
    loads: list[dict[str, Any]] = [{"concurrency": c} for c in sweep.get("concurrency", [] if
                                                                         "request_rates" in sweep else [1])]
    for rate in sweep.get("request_rates", []):
        loads.append({"concurrency": 0, "request_rate": rate, "arrival": sweep.get("arrival", "poisson"),
                      "requests": open_requests(sweep, rate), "seed": sweep.get("seed", 0)})
    slo = sweep.get("slo") or suite.get("slo") or {}
    return [{"workload": w, "max_tokens": mt, "context_tokens": ctx, **load, **({"slo": dict(slo)} if slo else {})}
            for w in sweep["workloads"]
            for mt in sweep.get("max_tokens", suite["max_tokens"])
            for ctx in sweep.get("context_tokens", [0])
            for load in loads]


def expand(checked: Matrix | dict[str, Any], phases: list[str] | None = None, *, secrets_hidden: bool = False
           ) -> list[dict[str, Any]]:
    """Resolved configs in run order: phase by phase, the baseline first in each. Takes a checked `Matrix`
    (a plain suite is validated first)."""
    if not isinstance(checked, Matrix):
        checked = validate(checked, phases, secrets_hidden=secrets_hidden)
    suite, phases = checked.suite, list(checked.phases or ())
    engine = ENGINES[suite["engine"]]
    est = suite["estimate"]
    reps_default = suite["repetitions"]
    prompts = {**workloads.PROMPTS, **suite["workloads"], **checked.file_workloads}
    out = []
    for phase in suite["phases"]:
        if phases and phase["name"] not in phases:
            continue
        ordered = sorted(phase["configs"], key=lambda c: c["method"] != "autoregressive")
        for cfg in ordered:
            lab = label(cfg)
            grid: dict[str, dict[str, Any]] = {}
            for sweep in phase["sweeps"]:
                if not measures(sweep, cfg):
                    continue
                reps = sweep.get("repetitions", reps_default)
                for cell in _cells(suite, sweep):
                    key = json.dumps(cell, sort_keys=True)
                    grid[key] = {**cell, "repetitions": max(reps, grid.get(key, {}).get("repetitions", 0))}
            cells = list(grid.values())
            draft = cfg.get("draft_model") or suite.get("draft_model") if cfg["method"] in NEEDS_DRAFT else None
            resolved: dict[str, Any] = {
                "config_id": f"{phase['name']}-{lab}",
                "phase": phase["name"],
                "engine": engine.name,
                "model": suite["model"],
                "draft_model": draft,
                "method": cfg["method"],
                "method_params": method_params(cfg),
                "tp": phase.get("tp", 1),
                "server_args": [*suite["server_args"], *phase.get("server_args", []),
                                *cfg.get("server_args", [])],
                "env": {k: str(v) for k, v in {**suite["env"], **phase.get("env", {}),
                                               **cfg.get("env", {})}.items()},
                "sampling": dict(suite["sampling"]),
                "warmup_max_tokens": suite["warmup_max_tokens"],
                "timeouts": dict(suite["timeouts"]),
                "cells": cells,
                "prompts": {c["workload"]: prompts[c["workload"]] for c in cells},
            }
            resolved["command"] = engine.launch_command(engine.program(suite), resolved,
                                                        suite["bind_host"])
            if suite["api_key"]:
                argv, env = engine.auth(suite["api_key"])
                resolved["command"] += argv
                resolved["env"].update(env)
            resolved["requests"] = sum(records.requests_of(c) * c["repetitions"] for c in cells)
            resolved["estimate_s"] = round(estimate.seconds(cells, est["startup_s"], est["tok_s"],
                                                            est["prefill_tok_s"]), 1)
            out.append(resolved)
            if (cfg["method"] == "autoregressive" and suite["pack_check"]
                    and len(pack.slots(suite, phase["name"], resolved["tp"], suite["gpu_count"])) > 1):
                out.append(pack.check_copy(resolved))  # the same baseline again, packed among the others
    return out
