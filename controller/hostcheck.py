"""What the plan can say about each config from the host's own answer (`agent.probe`, run on the host as
`python3 -c`): whether the installed engine knows every launch flag and value, whether the drafter fits its target
(`agent.classify.drafter_problems`: its path, the target layers it taps, its vocabulary, its DFlash block), and
whether weights, drafter and the largest cell's KV cache fit one GPU at the config's TP. Without an answer (host
unreachable, probe off) each config says why it was not checked; the agent checks them again before it starts a
server.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from agent import fit, probe
from agent.classify import Reason, drafter_problems
from agent.engines import ENGINES
from agent.store import read_json


@dataclass
class Check:
    """One config's verdicts; `None` where nothing could be judged."""

    supported: bool | None = None
    unsupported: list[str] = field(default_factory=list)
    engine_line: str = ""
    fit: fit.Fit | None = None
    fit_line: str = ""
    limits: list[str] = field(default_factory=list)  # what it asks that the build or its models cannot give
    missing: list[str] = field(default_factory=list)  # drafters not on the host yet (a check-mode plan says so)
    offsite: str = ""  # where the models of an off-site fit were read (said once above the configs)


def parse(answer: Any) -> tuple[dict[str, Any] | None, str]:
    """The probe's JSON from the registered command result, or why there is none."""
    if not isinstance(answer, Mapping) or answer.get("skipped"):
        return None, "not probed (bench_probe is false)"
    if answer.get("unreachable"):
        return None, f"not probed: host unreachable ({str(answer.get('msg', '')).strip()[:160]})"
    if answer.get("rc") not in (0, None) or not answer.get("stdout"):
        err = str(answer.get("stderr") or answer.get("msg") or "").strip().splitlines()[-1:] or ["no output"]
        return None, f"not probed: the probe failed ({err[0][:200]})"
    try:
        data = json.loads(answer["stdout"])
    except ValueError:
        return None, "not probed: the probe's answer is not JSON"
    return (data, "") if isinstance(data, dict) else (None, "not probed: the probe's answer is not an object")


def recorded(results: Path, host: str) -> tuple[dict[str, Any], str] | None:
    """The newest host.json of `host` on the controller that holds the engine's flags, as a probe answer, with
    where it comes from; None when no run recorded them."""
    found = []
    for path in results.glob(f"*/{host}/host.json"):
        info = read_json(path)
        if isinstance(info, dict) and isinstance((info.get("engine") or {}).get("help"), dict):
            found.append((path.stat().st_mtime, path.parent.parent.name, info))
    if not found:
        return None
    _, run_id, info = max(found, key=lambda f: f[0])
    eng = info["engine"]
    build = eng.get("build") or {}
    totals = [d.get("memory.total") for d in (info.get("gpus") or {}).get("devices") or []
              if isinstance(d.get("memory.total"), int)]
    data = {"engine": {"version": eng.get("version"), "flags": eng["help"].get("flags") or [],
                       "choices": eng["help"].get("choices") or {}, "features": eng.get("features") or {},
                       "defaults": eng["help"].get("defaults") or {}},
            "models": {k: info[k] for k in ("model", "draft_model") if isinstance(info.get(k), dict)},
            "gpu_memory_mib": min(totals) if totals else None}
    what = " ".join(str(build[k]) for k in ("refspec", "ref") if build.get(k))
    commit = f" @ {str(build['commit'])[:12]}" if build.get("commit") else ""
    return data, f"as recorded in run {run_id}" + (f" ({what}{commit})" if what or commit else "")


def probe_models(suite: Mapping[str, Any]) -> dict[str, str]:
    """The model folders the probe reads for the plan, by key: the target (`model`), the suite's drafter
    (`draft_model`) and each other drafter a config names (`draft_model@<path>`), so that every model a config
    uses is judged by its own config.json and weights."""
    out = {k: suite[k]["path"] for k in ("model", "draft_model") if isinstance(suite.get(k), Mapping)}
    for phase in suite.get("phases") or []:
        for cfg in phase.get("configs") or []:
            path = (cfg.get("draft_model") or {}).get("path")
            if path and path not in out.values():
                out[f"draft_model@{path}"] = path
    return out


def read_model(models: Mapping[str, Any], model: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """What the probe (or an earlier run, or the off-site read) says of `model`: the entry read from its path;
    None when it was not read."""
    path = (model or {}).get("path")
    return next((m for m in models.values() if isinstance(m, Mapping) and path and m.get("path") == path), None)


def engine_help(answer: Any) -> dict[str, Any] | None:
    """The engine's version, flags and choices as the probe read them, for the agent (which then does not run
    `--help` again); None when the probe did not read them."""
    eng = (parse(answer)[0] or {}).get("engine") or {}
    if eng.get("error") or not eng.get("flags"):
        return None
    return {k: eng.get(k) for k in ("python", "module", "version", "flags", "choices", "features", "defaults",
                                    "key")}


def assess(configs: list[dict[str, Any]], answer: Any, engine: str, gpu_memory_mib: int,
           earlier: tuple[dict[str, Any], str] | None = None,
           offsite: tuple[dict[str, Any], list[str]] | None = None) -> dict[str, Check]:
    """Per config id: the engine line and the memory-fit line of the plan. Without an answer from the host, what
    an `earlier` run recorded of it (`recorded`) is judged instead, and each line says so; with neither, the fit
    is judged from the models read on the controller (`offsite`: controller.hub) and bench_gpu_memory_mib."""
    data, why = parse(answer)
    if data is None and earlier is None and offsite is not None:
        return _offsite(configs, engine, gpu_memory_mib, why, *offsite)
    source = ""
    if data is None and earlier is not None:
        data, source = earlier[0], f" ({earlier[1]}; the host: {why})"
    eng = (data or {}).get("engine") or {}
    version = f"{engine} {eng.get('version') or '(version unknown)'}"
    gpu_mib = gpu_memory_mib or int((data or {}).get("gpu_memory_mib") or 0)
    models = (data or {}).get("models") or {}
    out = {}
    for cfg in configs:
        check = Check()
        if data is None:
            check.engine_line = check.fit_line = why
        elif eng.get("error"):
            check.engine_line = f"not checked: {eng['error'].splitlines()[0][:200]}"
        else:
            check.unsupported = probe.unsupported(cfg["command"], set(eng.get("flags") or ()), eng.get("choices") or {},
                                                  ENGINES[engine].flexible_names if engine in ENGINES else False)
            check.supported = not check.unsupported
            check.engine_line = (f"supported by {version}" if check.supported else
                                 f"unsupported_flag: {', '.join(check.unsupported)} not known to {version}") + source
            check.limits = [why for _, why in probe.build_limits(
                cfg, eng.get("features") or {}, read_model(models, cfg.get("draft_model")),
                read_model(models, cfg.get("model")))]
        if data is not None:  # the drafter against its target, whatever the engine said
            found = drafter_problems(cfg, read_model(models, cfg.get("draft_model")),
                                     read_model(models, cfg.get("model")))
            check.missing = [line for reason, line in found if reason is Reason.MISSING_MODEL]
            check.limits[:0] = [line for reason, line in found if reason is not Reason.MISSING_MODEL]
            check.fit, check.fit_line = _fit(cfg, engine, models, gpu_mib, eng.get("defaults"))
            check.fit_line += source if check.fit is not None else ""
        out[cfg["config_id"]] = check
    if (eng.get("features") or {}).get("dflash_overlap") is False:
        for twin, first in probe.same_servers(configs).items():
            out[twin].engine_line += (f"; the same server as {first} on this build (it runs DFlash without overlap "
                                      "scheduling always: SGLang up to 0.5.13)")
    return out


def _offsite(configs: list[dict[str, Any]], engine: str, gpu_mib: int, why: str, models: dict[str, Any],
             said: list[str]) -> dict[str, Check]:
    """The engine unchecked (`why`), the fit judged from the models read off-site, each fit line saying so."""
    out = {}
    source = "; ".join(said)
    for cfg in configs:
        check = Check(engine_line=why)
        drafter_missing = cfg.get("draft_model") and read_model(models, cfg["draft_model"]) is None
        if not gpu_mib:
            check.fit_line = ("not checked off-site: no GPU memory known (set bench_gpu_memory_mib to nvidia-smi's "
                              "memory.total in MiB; after one run the host's host.json gives it)")
        elif "model" not in models or drafter_missing:
            check.fit_line = f"not checked off-site: {source}"
        else:
            check.fit, check.fit_line = _fit(cfg, engine, models, gpu_mib)
            check.fit_line += " (off-site)" if check.fit is not None else ""
            check.offsite = source if check.fit is not None else ""
        out[cfg["config_id"]] = check
    return out


def _fit(cfg: Mapping[str, Any], engine: str, models: Mapping[str, Any], gpu_mib: int,
         stated: Mapping[str, str] | None = None) -> tuple[fit.Fit | None, str]:
    """The fit line of a config; `stated`: the defaults the host's engine states in its help."""
    target = models.get("model") or {}
    if not gpu_mib:
        return None, "not checked: no GPU memory known (nvidia-smi found none; set bench_gpu_memory_mib)"
    if not isinstance(target.get("config"), dict) or not target.get("weights_bytes"):
        if target.get("config_problem"):  # there, but not a file that can be read (a FIFO, a device, too large)
            return None, f"not checked: {target['config_problem']}"
        return None, f"not checked: no config.json or weights in {cfg['model']['path']} on the host"
    drafter = 0
    if cfg.get("draft_model"):
        read = read_model(models, cfg["draft_model"])
        if read is None:
            return None, f"not checked: the drafter {cfg['draft_model']['path']} was not read on the host"
        drafter = int(read.get("weights_bytes") or 0)
    verdict = fit.judge(cfg, engine, cfg["command"], gpu_mib, target, drafter, stated)
    if verdict is None:
        return None, "not checked: the model's config.json lacks the fields the fit needs"
    return verdict, ("fits: " if verdict.fits else "does_not_fit: ") + verdict.detail


def fit_table(configs: list[dict[str, Any]], checks: Mapping[str, Check]) -> list[str]:
    """Per TP: the configs that fit and the one that needs the most KV cache, with its arithmetic."""
    by_tp: dict[int, list[dict[str, Any]]] = {}
    for cfg in configs:
        if checks.get(cfg["config_id"]) and checks[cfg["config_id"]].fit is not None:
            by_tp.setdefault(cfg["tp"], []).append(cfg)
    if not by_tp:
        return []
    lines = ["Memory fit per tp (one GPU; the largest cell of each config: (context + output) × concurrency):"]
    for tp in sorted(by_tp):
        cfgs = by_tp[tp]
        bad = [c["config_id"] for c in cfgs if not checks[c["config_id"]].fit.fits]  # type: ignore[union-attr]
        worst = max(cfgs, key=lambda c: fit.largest_tokens(c["cells"], c.get("warmup_max_tokens", 0)))
        lines.append(f"    tp {tp}: {len(cfgs) - len(bad)}/{len(cfgs)} fit"
                     + (f"; does_not_fit: {', '.join(bad)}" if bad else "")
                     + f"; largest {worst['config_id']}: {checks[worst['config_id']].fit.detail}")  # type: ignore[union-attr]
    return lines
