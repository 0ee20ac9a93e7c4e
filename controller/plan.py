"""The plan of one host, on the controller: the invocation's switches checked, the matrix validated once and
expanded into configs with every secret replaced by a placeholder, and the plan as text. Reads nothing
from the host, so plan mode and check mode work for hosts that cannot be reached; every problem names
the variable and what is allowed. The `bench_plan` action plugin calls `build`.
"""
from __future__ import annotations

import difflib
import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from agent import secrets
from agent.store import redact_argv, redact_env

from . import estimate, matrix

PREFIX = matrix.PREFIX
ROLE = Path(__file__).resolve().parents[1] / "roles" / "bench"


def known_variables() -> set[str]:
    """Every bench_* variable the role reads: its defaults and its argument specs."""
    names = set(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()) or {})
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry in specs.values():
        names |= set(entry.get("options") or {})
    return names | {"bench_run_id"}


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
    return matrix.shown(value, secret=False)


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


def phase_names(value: Any, problems: list[str]) -> list[str] | None:
    """`-e phases=tp1,tp4`, a list, or a single name (a number too); None for all phases."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = str(value).split(",")
    if isinstance(value, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        names = [str(v).strip() for v in value if str(v).strip()]
        return names or None
    problems.append(f"phases: {_shown(value)} is not a list of phase names; allowed: names separated by commas "
                    f"(e.g. -e phases=tp1,tp4)")
    return None


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
    for name, value in sorted((args.get("limits") or {}).items()):  # whole numbers by the role's bench_number
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{name}: {_shown(value)} is not a positive whole number of seconds; allowed: an "
                            f"integer >= 1")
    return {"plan_only": switch("plan", args.get("plan", False), problems),
            "force": switch("force", args.get("force", False), problems),
            "phases": phase_names(args.get("phases"), problems), "run_id": str(run_id)}


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _axis(cells: list[dict[str, Any]], key: str) -> str:
    values = sorted({c[key] for c in cells}, key=lambda v: (isinstance(v, str), v))
    return ",".join(str(v) for v in values)


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


def describe(host: str, configs: list[dict[str, Any]], suite: dict[str, Any] | None = None) -> list[str]:
    """The plan as text: the effective defaults, each config's exact launch command and environment,
    requests and time."""
    lines = [f"Plan for {host}: {len(configs)} configs, {sum(c['requests'] for c in configs)} timed requests, "
             f"estimated {_hms(sum(c['estimate_s'] for c in configs))}"]
    if suite:
        lines += [f"    {PREFIX}{k}: {_pairs(suite[k])}" for k in matrix.PARTIAL]
        lines.append(f"    {PREFIX}repetitions: {suite['repetitions']}; {PREFIX}max_tokens: {suite['max_tokens']}; "
                     f"{PREFIX}warmup_max_tokens: {suite['warmup_max_tokens']}")
        lines += [f"    warning: {w}" for w in unpinned(suite)]
    for k, c in enumerate(configs, 1):
        cells = c["cells"]
        lines += [
            f"[{k}/{len(configs)}] {c['config_id']}  ({c['engine']}, {c['method']} {c['method_params'] or ''}, "
            f"tp {c['tp']}): {c['requests']} requests in {len(cells)} cells, ~{_hms(c['estimate_s'])}"
            + (f" ({c['estimate_source']})" if c.get("estimate_source") else ""),
            "    env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(c["env"]).items())),
            "    cmd: " + " ".join(_quote(a) for a in redact_argv(c["command"])),
            f"    cells over: workloads {_axis(cells, 'workload')}; max_tokens {_axis(cells, 'max_tokens')}; "
            f"context {_axis(cells, 'context_tokens')}; concurrency {_axis(cells, 'concurrency')}; "
            f"reps {_axis(cells, 'repetitions')}",
        ]
    lines.append("    ({port} is a free port chosen on the host at launch)")
    return lines


def build(args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
    """The action's result: `failed` with every problem, or the configs, the secret-free suite and the plan."""
    suite = args.get("suite") or {}
    host = task_vars.get("inventory_hostname", "?")
    problems = unknown_variables(task_vars)
    run = run_checks(args, host, problems)
    if problems:
        return {"failed": True, "msg": f"invalid benchmark matrix for {host}:\n" + "\n".join(problems)}
    try:
        checked = matrix.validate(suite, run["phases"])
    except matrix.MatrixError as exc:
        return {"failed": True, "msg": f"invalid benchmark matrix for {host}:\n{exc}"}
    hidden = checked.hide(secrets.split(checked.suite)[0])  # configs and this result never hold a secret
    configs = matrix.expand(hidden)
    evidence = estimate.history(Path(args["results"]), host) if args.get("results") else {}
    estimate.apply(configs, hidden.suite["estimate"], evidence)
    return {"changed": False, "configs": configs, "suite": hidden.suite, "plan_lines": describe(host, configs,
            hidden.suite), **run, "requests": sum(c["requests"] for c in configs),
            "estimate_s": sum(c["estimate_s"] for c in configs)}
