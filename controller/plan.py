"""The plan of one host, on the controller: the invocation's switches checked, the matrix validated once and
expanded into configs with every secret replaced by a placeholder, and the plan as text. What it knows of the
host comes from the role's probe (`agent.probe`, read-only) when the host answered; plan mode and check mode
work for hosts that cannot be reached. Every problem names the variable and what is allowed.
The `bench_plan` action plugin calls `build`.
"""
from __future__ import annotations

import difflib
import json
import re
import shlex
from pathlib import Path
from typing import Any, Callable, Mapping

from agent import pack, records, secrets
from agent.engines import DISTRIBUTIONS, ENGINES
from agent.store import redact_argv, redact_env
from agent.systemd import instance_name

from . import agent_archive, estimate, hostcheck, hub, matrix, passthrough, schema_errors, settings

PREFIX = matrix.PREFIX
ROLE = Path(__file__).resolve().parents[1] / "roles" / "bench"


def known_variables() -> set[str]:
    """Every bench_* variable the role reads: its settings (`controller.settings`) and the run id it fixes."""
    return {s.name for s in settings.SETTINGS} | {"bench_run_id"}


def unknown_variables(task_vars: dict[str, Any]) -> list[str]:
    """`bench_*` variables set for the host that the role does not know (a typo is silently ignored
    otherwise), each with the closest known name."""
    known = known_variables()
    out = []
    for name in sorted(k for k in task_vars if k.startswith("bench_") and k not in known):
        close = difflib.get_close_matches(name, known, n=1)
        out.append(f"{name}: unknown variable" + (f"; did you mean {close[0]}?" if close else
                                                   f"; allowed: {', '.join(sorted(known))}"))
    return out


TRUE = ("true", "yes", "1")
FALSE = ("false", "no", "0")


def _shown(value: Any) -> str:
    return schema_errors.shown(value, secret=False)


def switch(name: str, value: Any, problems: list[str]) -> bool:
    """A boolean extra var (`-e plan=true`), strictly: a typo fails instead of meaning false."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    problems.append(f"{name}: {_shown(value)} is not a boolean; allowed: true, false, yes, no, 1, 0 "
                    f"(e.g. -e {name}=true)")
    return False


def names(key: str, value: Any, problems: list[str], example: str) -> list[str] | None:
    """`-e phases=tp1,tp4` (also configs=, sweeps=): names separated by commas, a list, or a single name (a
    number too); None for all."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = str(value).split(",")
    if isinstance(value, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        found = [str(v).strip() for v in value if str(v).strip()]
        return found or None
    problems.append(f"{key}: {_shown(value)} is not a list of {key[:-1]} names; allowed: names separated by commas "
                    f"(e.g. -e {key}={example})")
    return None


def phase_names(value: Any, problems: list[str]) -> list[str] | None:
    return names("phases", value, problems, "tp1,tp4")


def select(suite: dict[str, Any], phases: list[str] | None, configs: list[str] | None,
           sweeps: list[str] | None, problems: list[str]) -> dict[str, Any]:
    """The suite narrowed to `-e configs=` (labels such as dflash, ddtree-b16, or full ids tp1-dflash) and
    `-e sweeps=` (sweep names) within the selected phases. Each phase keeps its baseline: speedups need it
    (a baseline already ok in this run is not run again)."""
    if not configs and not sweeps:
        return suite
    chosen = [p for p in suite["phases"] if not phases or p["name"] in phases]
    labels = {matrix.label(c) for p in chosen for c in p["configs"]}
    ids = {f"{p['name']}-{matrix.label(c)}" for p in chosen for c in p["configs"]}
    sweep_names = {w["name"] for p in chosen for w in p["sweeps"] if w.get("name")}
    for name in configs or []:
        if name not in labels | ids:
            problems.append(f"configs: unknown config {name!r}; allowed: {', '.join(sorted(labels))} (or a full id "
                            f"such as {sorted(ids)[0] if ids else 'tp1-dflash'})")
    for name in sweeps or []:
        if name not in sweep_names:
            problems.append(f"sweeps: unknown sweep {name!r}; allowed: "
                            f"{', '.join(sorted(sweep_names)) or '(no sweep has a name)'}")
    out = {**suite, "phases": []}
    for phase in suite["phases"]:
        picked = [c for c in phase["configs"] if not configs or matrix.label(c) in configs
                  or f"{phase['name']}-{matrix.label(c)}" in configs]
        ways = [w for w in phase["sweeps"] if not sweeps or w.get("name") in sweeps]
        if picked and ways:
            base = [c for c in phase["configs"] if c["method"] == "autoregressive" and c not in picked]
            out["phases"].append({**phase, "configs": base + picked, "sweeps": ways})
    return out


def _cell_key(cell: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in cell.items() if k != "repetitions"}, sort_keys=True)


def trim(configs: list[dict[str, Any]], selected: bool) -> list[dict[str, Any]]:
    """Configs without cells dropped; with `-e configs=`, each baseline keeps only the cells some other selected
    config of its phase measures (when there is one)."""
    if selected:
        for base in (c for c in configs if c["method"] == "autoregressive"):
            used = {_cell_key(x) for c in configs if c["phase"] == base["phase"] and c["method"] != "autoregressive"
                    for x in c["cells"]}
            if used:
                base["cells"] = [x for x in base["cells"] if _cell_key(x) in used]
                base["prompts"] = {w: t for w, t in base["prompts"].items()
                                   if any(x["workload"] == w for x in base["cells"])}
                base["requests"] = sum(records.requests_of(x) * x["repetitions"] for x in base["cells"])
    return [c for c in configs if c["cells"]]


def run_checks(args: dict[str, Any], host: str, problems: list[str]) -> dict[str, Any]:
    """What the invocation is (plan only, force, run id, phases) and where it goes, checked before any host is
    touched; returns the normalised values."""
    if not matrix.NAME_RE.match(str(host)):
        problems.append(f"inventory host {_shown(host)}: not usable as a results folder name; "
                        f"allowed: {matrix.NAME_TEXT}")
    run_id = args.get("run_id")
    if not isinstance(run_id, (str, int)) or isinstance(run_id, bool) or not matrix.NAME_RE.match(str(run_id)):
        problems.append(f"run_id: {_shown(run_id)} is not a valid run id; allowed: {matrix.NAME_TEXT}")
    host_dir = args.get("host_dir")
    if not isinstance(host_dir, str) or not host_dir.startswith("/") or not host_dir.isprintable():
        problems.append(f"{PREFIX}host_dir: {_shown(host_dir)} is not an absolute path; allowed: an absolute path "
                        f"on the host without control characters, e.g. /var/lib/specfleet")
    suite = args.get("suite") or {}
    unit = suite.get("backend") == "systemd"
    for name, value in (("agent_python", args.get("agent_python")), ("engine_python", suite.get("engine_python")),
                        ("engine_binary", suite.get("engine_binary"))):
        problems += program_problems(name, value, unit and name == "agent_python")
    for name, value in sorted((args.get("limits") or {}).items()):  # whole numbers by the role's bench_number
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{name}: {_shown(value)} is not a positive whole number of seconds; allowed: an "
                            f"integer >= 1")
    return {"plan_only": switch("plan", args.get("plan", False), problems),
            "force": switch("force", args.get("force", False), problems),
            "skip_unsupported": switch("skip_unsupported", args.get("skip_unsupported", False), problems),
            "wait_for_host": switch("wait_for_host", args.get("wait_for_host", False), problems),
            "phases": phase_names(args.get("phases"), problems),
            "config_names": names("configs", args.get("configs"), problems, "dflash,ddtree-b16"),
            "sweep_names": names("sweeps", args.get("sweeps"), problems, "short,context"), "run_id": str(run_id)}


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _axis(cells: list[dict[str, Any]], key: str) -> str:
    values = sorted({c[key] for c in cells}, key=lambda v: (isinstance(v, str), v))
    return ",".join(str(v) for v in values)


def _loads(cells: list[dict[str, Any]]) -> str:
    """`concurrency 1,4`, `request rates 2,8,inf/s (poisson, 16 requests)` or both: the loads of a config's cells."""
    closed = [c for c in cells if c.get("request_rate") is None]
    opened = [c for c in cells if c.get("request_rate") is not None]
    out = [f"concurrency {_axis(closed, 'concurrency')}"] if closed else []
    if opened:
        out.append(f"request rates {_axis(opened, 'request_rate')}/s ({_axis(opened, 'arrival')}, "
                   f"{_axis(opened, 'requests')} requests)")
    return "; ".join(out)


def _quote(arg: str) -> str:
    return arg if arg == "{port}" else shlex.quote(arg)


def _pairs(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in values.items())


COMMIT = re.compile(r"[0-9a-f]{40}")


def unpinned(suite: dict[str, Any]) -> list[str]:
    """The models whose revision is not a commit: a later run of the same plan may measure other weights."""
    out = []
    for key in ("model", "draft_model"):
        model = suite.get(key)
        if isinstance(model, dict) and not COMMIT.fullmatch(str(model.get("revision") or "")):
            out.append(f"{PREFIX}{key}.revision {model.get('revision')!r} is not pinned to a commit: the weights "
                       f"it names can change between runs (the model_weights role records the commit it fetched; "
                       f"pin that)")
    return out


def describe(host: str, configs: list[dict[str, Any]], suite: dict[str, Any] | None = None,
             checks: Mapping[str, hostcheck.Check] | None = None, skip_unsupported: bool = False) -> list[str]:
    """The plan as text: the effective defaults, each config's exact launch command, environment, unit, what the
    host's engine and GPUs say of it, requests and time; then the memory fit per TP."""
    checks = checks or {}
    serial = sum(c["estimate_s"] for c in configs)
    packed = packed_lines(configs, suite) if suite and suite.get("pack") else []
    lines = [f"Plan for {host}: {len(configs)} configs, {sum(c['requests'] for c in configs)} timed requests, "
             f"estimated {_hms(wall(configs, suite))}" + (f" packed ({_hms(serial)} one at a time)" if packed else "")]
    if suite:
        lines += [f"    {PREFIX}{k}: {_pairs(suite[k])}" for k in matrix.PARTIAL]
        lines.append(f"    {PREFIX}repetitions: {suite['repetitions']}; {PREFIX}max_tokens: {suite['max_tokens']}; "
                     f"{PREFIX}warmup_max_tokens: {suite['warmup_max_tokens']}")
        lines += [f"    warning: {w}" for w in unpinned(suite)]
    bad = [cid for cid, ch in checks.items() if ch.supported is False]
    if bad:
        lines.append(f"    warning: {len(bad)} configs use flags the installed engine does not know: they will "
                     + ("be recorded skipped (skip_unsupported)" if skip_unsupported else
                        "fail unsupported_flag without starting (-e skip_unsupported=true records them skipped)"))
    said = {line for ch in checks.values() for line in (ch.engine_line, ch.fit_line) if line.startswith("not ")
            and all(line in (other.engine_line, other.fit_line) for other in checks.values())}  # said once
    if said:
        lines += [f"    host checks: {line}" for line in sorted(said)]
    lines += [f"    memory fit off-site, the models read from {source}"
              for source in sorted({ch.offsite for ch in checks.values() if ch.offsite})]
    systemd = bool(suite) and suite.get("backend") == "systemd"  # type: ignore[union-attr]
    for k, c in enumerate(configs, 1):
        cells = c["cells"]
        check = checks.get(c["config_id"])
        lines += [
            f"[{k}/{len(configs)}] {c['config_id']}  ({c['engine']}, {c['method']} {c['method_params'] or ''}, "
            f"tp {c['tp']}): {c['requests']} requests in {len(cells)} cells, ~{_hms(c['estimate_s'])}"
            + (f" ({c['estimate_source']})" if c.get("estimate_source") else ""),
            "    env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(c["env"]).items())),
            "    cmd: " + " ".join(_quote(a) for a in redact_argv(c["command"])),
            f"    cells over: workloads {_axis(cells, 'workload')}; max_tokens {_axis(cells, 'max_tokens')}; "
            f"context {_axis(cells, 'context_tokens')}; {_loads(cells)}; reps {_axis(cells, 'repetitions')}",
        ]
        if systemd:
            lines.append(f"    unit: specfleet-{c['engine']}@{instance_name(c['config_id'])}.service "
                         f"(its journal is server.log)")
        if check:
            shown = (("engine", check.engine_line), ("memory", check.fit_line))
            lines += [f"    {what}: {line}" for what, line in shown if line not in said]
    lines.append("    ({port} is a free port chosen on the host at launch)")
    return lines + packed + hostcheck.fit_table(configs, checks)


def pools(configs: list[dict[str, Any]], suite: Mapping[str, Any] | None) -> dict[str, list[pack.Slot]]:
    """Each phase's slots as the agent will make them (the host's GPU count from the matrix)."""
    suite = suite or {}
    return {phase: pack.slots(suite, phase, group[0]["tp"], int(suite.get("gpu_count") or 0))
            for phase, group in pack.phase_order(configs)}


def wall(configs: list[dict[str, Any]], suite: Mapping[str, Any] | None) -> float:
    """The suite's estimated wall time, packed where the phases are."""
    return max((p.end_s for p in pack.timeline(configs, pools(configs, suite))), default=0.0)


def packed_lines(configs: list[dict[str, Any]], suite: Mapping[str, Any]) -> list[str]:
    """Per phase: its slots, its estimate packed against one config at a time, and each slot's timeline (times
    from the phase's start)."""
    slots = pools(configs, suite)
    placed = pack.timeline(configs, slots)
    check = bool(suite.get("pack_check"))
    lines = [f"Packing ({PREFIX}pack): in each phase the baseline starts first on the first slot; the other configs "
             + ("start once it has finished ok (alone: the pack check compares it with its packed copy)" if check
                else "start beside it and send their first request once its server is up and answered its "
                     "warmup (it then measures packed beside them; if it fails first, they are stopped unused)")
             + ", each on the slot that frees first"]
    for phase, group in pack.phase_order(configs):
        mine = [p for p in placed if p.phase == phase]
        start, end = min(p.start_s for p in mine), max(p.end_s for p in mine)
        serial = sum(c["estimate_s"] for c in group)
        pool = slots[phase]
        if len(pool) == 1:
            lines.append(f"  phase {phase}: 1 slot, one config at a time (tp {group[0]['tp']} of "
                         f"{suite.get('gpu_count') or 0} GPUs; {PREFIX}slots names none for it), ~{_hms(serial)}")
            continue
        ratio = serial / (end - start) if end > start else 1.0
        lines.append(f"  phase {phase}: {len(pool)} slots, ~{_hms(end - start)} packed against ~{_hms(serial)} one "
                     f"at a time ({ratio:.1f}x shorter)")
        for slot in pool:
            runs = [p for p in mine if p.slot == slot]
            lines.append(f"    {slot.describe()}: " + ("; ".join(
                f"{_hms(p.start_s - start)}-{_hms(p.end_s - start)} {p.config_id}" for p in runs) or "idle"))
    return lines


Ask = Callable[[str, dict[str, Any]], dict[str, Any]]


def probe_request(suite: Mapping[str, Any], host_dir: str | None = None) -> dict[str, Any]:
    """What `agent.probe` is asked on the host: the engine's interpreter, module and distributions, the models, and
    where the agent keeps the engine's help it read before."""
    engine = ENGINES[suite["engine"]]
    models = hostcheck.probe_models(suite)
    return {"engine": {"python": engine.program(suite), "module": engine.module,
                       "dists": DISTRIBUTIONS[engine.name], "help_arg": engine.help_arg}, "models": models,
            "cache": f"{host_dir.rstrip('/')}/cache" if host_dir else None}


_UNIT_PATH = re.compile(r"-?/[^\s%\x00-\x1f\x7f]*")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


_EXEC_PATH = re.compile(r"/[^\s%\x00-\x1f\x7f]*")


def program_problems(name: str, value: Any, unit: bool) -> list[str]:
    """A program the host runs (`bench_agent_python`, `bench_engine_python`, `bench_engine_binary`): a path on one
    line without control characters; where the systemd backend writes it into the unit's ExecStart (`unit`), an
    absolute path without spaces or `%` too (a space would split it, a `%` be read as a specifier, a newline start a
    new unit line)."""
    if value is None:
        return []  # not given: the role always gives the agent's; the matrix says a missing engine_python
    if not isinstance(value, str) or not value or not value.isprintable():
        return [f"{PREFIX}{name}: {_shown(value)} is not a program path; allowed: a path on one line without "
                f"control characters"]
    if unit and not _EXEC_PATH.fullmatch(value):
        return [f"{PREFIX}{name}: {_shown(value)} is not a path the unit's ExecStart can take ({PREFIX}backend: "
                f"systemd); allowed: an absolute path without spaces, control characters or '%'"]
    return []


def service_problems(service: Mapping[str, Any] | None) -> list[str]:
    """The values the systemd backend writes into the engine's unit, checked before any host is contacted: a
    newline there would start a new unit line, a space split one path into two, a `%` be read as a specifier."""
    if not service:
        return []
    out = []
    user = service.get("user")
    if not isinstance(user, str) or not _USER.fullmatch(user):
        out.append(f"{PREFIX}service_user: {_shown(user)} is not a user name; allowed: lowercase letters, digits, "
                   f"'_' and '-', starting with a letter or '_', at most 32 characters")
    nofile = service.get("limit_nofile")
    if isinstance(nofile, bool) or not (isinstance(nofile, int) and nofile >= 1
                                        or isinstance(nofile, str) and nofile.isdigit() and int(nofile) >= 1):
        out.append(f"{PREFIX}service_limit_nofile: {_shown(nofile)} is not a positive whole number; allowed: an "
                   f"integer >= 1")
    for key in ("read_only_paths", "read_write_paths"):
        paths = service.get(key)
        if not isinstance(paths, list):
            out.append(f"{PREFIX}service_{key}: {_shown(paths)} is not a list; allowed: a list of absolute paths")
            continue
        for i, path in enumerate(paths):
            if not isinstance(path, str) or not _UNIT_PATH.fullmatch(path):
                out.append(f"{PREFIX}service_{key}[{i}]: {_shown(path)} is not a path the unit can take; allowed: "
                           f"an absolute path (a leading '-': may be missing) without spaces, control characters "
                           f"or '%'")
    entries = service.get("device_allow")
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        out.append(f"{PREFIX}service_device_allow: {_shown(entries)} is not a list of strings; allowed: entries "
                   f"`PATH [ACCESS]` or `char-NAME [ACCESS]`")
    else:
        for i, entry in enumerate(entries):
            if not entry.isprintable():
                out.append(f"{PREFIX}service_device_allow[{i}]: {_shown(entry)} holds control characters; allowed: "
                           f"`PATH [ACCESS]` or `char-NAME [ACCESS]` on one line")
        out += [f"{PREFIX}service_device_allow: {p}" for p in passthrough.device_allow(
            [e for e in entries if e.isprintable()])["problems"]]
    return out


def plausible(host: str, configs: list[dict[str, Any]], suite: dict[str, Any]) -> str | None:
    """Why a plan is too long to start (its estimate past `bench_max_plan_hours`), with the figure and the switch
    that allows it; None when it is not."""
    hours, limit = wall(configs, suite) / 3600, float(suite["max_plan_hours"])
    if hours <= limit:
        return None
    requests = sum(c["requests"] for c in configs)
    return (f"{host}: the plan is estimated at {_hms(hours * 3600)} ({len(configs)} configs, {requests} timed "
            f"requests), past {PREFIX}max_plan_hours {limit:g}; nothing was started. Narrow it (-e phases=..., "
            f"-e configs=..., -e sweeps=...) or allow it: -e {PREFIX}max_plan_hours={max(int(hours) + 1, 1)}")


def build(args: dict[str, Any], task_vars: dict[str, Any], ask: Ask | None = None) -> dict[str, Any]:
    """The action's result: `failed` with every problem, or the configs, the secret-free suite and the plan.
    `ask(python, request)` runs `agent.probe` on the host (the action's connection) once the matrix passed."""
    suite = args["suite"] if "suite" in args else {}
    host = task_vars.get("inventory_hostname", "?")
    problems = unknown_variables(task_vars)
    run = run_checks(args, host, problems)
    problems += service_problems(args.get("service"))
    if problems:
        return {"failed": True, "msg": f"invalid benchmark matrix for {host}:\n" + "\n".join(problems)}
    try:
        checked = matrix.validate(suite, run["phases"])
    except matrix.MatrixError as exc:
        return {"failed": True, "msg": f"invalid benchmark matrix for {host}:\n{exc}"}
    narrowed = select(checked.suite, run["phases"], run["config_names"], run["sweep_names"], problems)
    if problems:
        return {"failed": True, "msg": f"invalid benchmark matrix for {host}:\n" + "\n".join(problems)}
    hidden = checked.hide(secrets.split(narrowed)[0])  # configs and this result never hold a secret
    configs = trim(matrix.expand(hidden), bool(run["config_names"]))
    try:  # earlier runs in the results folder the user names: a file there that is not one fails in one line
        evidence = estimate.history(Path(args["results"]), host) if args.get("results") else {}
        earlier = hostcheck.recorded(Path(args["results"]), host) if args.get("results") else None
    except OSError as exc:
        return {"failed": True, "msg": f"{host}: earlier results in {PREFIX}controller_results unreadable: {exc}"}
    estimate.apply(configs, hidden.suite["estimate"], evidence)
    too_long = plausible(host, configs, hidden.suite)
    if too_long:
        return {"failed": True, "msg": too_long}
    answer: Any = {"skipped": True}
    if ask is not None and switch("probe", args.get("probe", True), problems) and configs:
        answer = ask(str(args.get("agent_python") or "python3"), probe_request(hidden.suite, args.get("host_dir")))
    offsite = None
    if earlier is None and not answer.get("skipped") and hostcheck.parse(answer)[0] is None:  # asked, no answer
        offsite = hub.offsite(hidden.suite, args.get("hub_models"), agent_archive.cache_dir())
    checks = hostcheck.assess(configs, answer, hidden.suite["engine"], hidden.suite["gpu_memory_mib"], earlier,
                              offsite)
    unsupported = {cid: ch.unsupported for cid, ch in checks.items() if ch.supported is False}
    missing = [f"  {cid}: {line}" for cid, ch in checks.items() for line in ch.missing]
    refuse_missing = not task_vars.get("ansible_check_mode") or any(ch.limits for ch in checks.values())
    limited = [f"  {cid}: {line}" for cid, ch in checks.items()  # check mode: `make models` may come first
               for line in (ch.missing if refuse_missing else []) + ch.limits]
    if limited:
        return {"failed": True, "msg": f"{host}: these configs ask what the installed engine or the drafter cannot "
                                       "give (nothing was started):\n" + "\n".join(limited)}
    later = [f"{host}: a run now would refuse these configs, their drafters not on the host yet:", *missing]
    return {"changed": False, "configs": configs, "suite": hidden.suite, "plan_lines": describe(
            host, configs, hidden.suite, checks, run["skip_unsupported"]) + (later if missing else []), **run,
            "requests": sum(c["requests"] for c in configs), "estimate_s": wall(configs, hidden.suite),
            "unsupported": unsupported, "engine_help": hostcheck.engine_help(answer)}
