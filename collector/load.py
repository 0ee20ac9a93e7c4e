"""Read a run folder per the results contract, tolerating damage: every problem is reported with its file (and
line) and skipped, never fatal. run.json, each host's host.json and each config's config.json and status.json are
read here; each requests.jsonl by `collector.request_lines`, all of a run's together."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from agent import bounded, records

from .request_lines import read_all
from .results import ConfigResult, Run

OUTCOMES = [o.value for o in records.Outcome]


def _read_json(path: Path, problems: list[Any], then: str) -> dict[str, Any] | None:
    """A JSON object file; None when missing (not reported) or damaged (reported with `then`, what follows): not
    a regular file within bounded.RECORD is said before anything is read."""
    try:
        text = bounded.read_text(path, bounded.RECORD, errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.append(f"{path}: unreadable ({exc.strerror or exc}); {then}")
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        problems.append(f"{path}:{exc.lineno}: malformed JSON ({exc.msg}, column {exc.colno}); {then}")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path}: not a JSON object (got {type(obj).__name__}); {then}")
        return None
    return obj


@dataclass
class _Later:
    """A place in the problems for what reading a config's requests.jsonl will find."""

    result: ConfigResult
    path: Path


def _config(host_dir: Path, d: Path, problems: list[Any]) -> ConfigResult | None:
    status_path = d / "status.json"
    if not status_path.exists():
        problems.append(f"{status_path}: missing (config incomplete or interrupted); config skipped")
        return None
    status = _read_json(status_path, problems, "config skipped")
    if status is None:
        return None
    if status.get("status") not in OUTCOMES:
        problems.append(f"{status_path}: status {status.get('status')!r} is not ok|failed|skipped; config skipped")
        return None
    config = _read_json(d / "config.json", problems, "the config's identity taken from its request lines")
    if config is None and not (d / "config.json").exists():
        problems.append(f"{d / 'config.json'}: missing; the config's identity taken from its request lines")
    jsonl = d / "requests.jsonl"
    result = ConfigResult(host_dir.name, d.name, config or {}, status)
    if jsonl.exists():
        result.source = jsonl
        problems.append(_Later(result, jsonl))  # read with the others, then its problems go here
    elif status["status"] == "ok":
        problems.append(f"{jsonl}: missing, though status.json says ok; its cells have no data")
    return result


def load_run(root: Path, meanwhile: Optional[Callable[[], Any]] = None, keep_rows: bool = False,
             parallel: bool = True) -> Run:
    """Every host folder (one holding host.json or config folders) and its configs. Damage is reported in
    `problems`, each naming its file (and line), and skipped; everything intact is kept. `meanwhile` runs
    while the request lines are read (in other processes, for a large run; `parallel` false: in this one).
    `keep_rows`: each config's valid request lines are kept too, by column (ConfigResult.rows)."""
    problems: list[Any] = []
    meta = _read_json(root / "run.json", problems, "run metadata unknown")
    if meta is None and not (root / "run.json").exists():
        problems.append(f"{root / 'run.json'}: missing; run metadata unknown")
    run = Run(root=root, meta=meta or {})
    for host_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        host_json = _read_json(host_dir / "host.json", problems, "host facts unknown; its configs are kept")
        cfg_dirs = sorted(p for p in host_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        if host_json is None and not cfg_dirs:
            continue
        if host_json is None and not (host_dir / "host.json").exists():
            problems.append(f"{host_dir / 'host.json'}: missing; host facts unknown; its configs are kept")
        run.hosts[host_dir.name] = host_json or {}
        for d in cfg_dirs:
            result = _config(host_dir, d, problems)
            if result is not None:
                run.configs.append(result)
    later = [p for p in problems if isinstance(p, _Later)]
    files = dict(zip(map(id, later), read_all([p.path for p in later], meanwhile, keep_rows, parallel)))
    for p in problems:
        if not isinstance(p, _Later):
            run.problems.append(p)
            continue
        f, c = files[id(p)], p.result
        c.cells, c.first, c.count, c.rows, c.spec = f.cells, f.first, f.count, f.rows, f.spec
        run.problems += f.problems
        if c.status["status"] == "ok" and not f.count and f.blank:
            run.problems.append(f"{p.path}: empty, though status.json says ok; its cells have no data")
    return run
