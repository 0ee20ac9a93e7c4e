"""Read a run folder per the results contract, tolerating damage: every problem is reported
with its file (and line) and skipped, never fatal."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import records

OUTCOMES = [o.value for o in records.Outcome]

@dataclass
class ConfigResult:
    host: str
    config_id: str
    config: dict[str, Any]
    status: dict[str, Any]
    requests: list[dict[str, Any]]

    def identity(self) -> dict[str, Any]:
        """What the config is (engine, model name, method, params, tp), from config.json or, when that is lost,
        from its first request line (which carries the same fields), so its rows still pair with their
        baseline."""
        cfg, first = self.config, (self.requests[0] if self.requests else {})
        model = cfg.get("model")
        return {"host": self.host, "config_id": self.config_id,
                "engine": cfg.get("engine") or first.get("engine", ""),
                "model": model.get("name") if isinstance(model, dict) else (first.get("model") or ""),
                "tp": cfg.get("tp", first.get("tp")), "method": cfg.get("method") or first.get("method", ""),
                "method_params": cfg.get("method_params", first.get("method_params", {}))}


@dataclass
class Run:
    root: Path
    meta: dict[str, Any]
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    configs: list[ConfigResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_requests(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The valid request lines of a requests.jsonl; every other line is reported as `path:line` and skipped."""
    rows: list[dict[str, Any]] = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        problems.append(f"{path}: unreadable ({exc.strerror or exc}); its requests skipped")
        return rows
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{n}: malformed JSON ({exc.msg}, column {exc.colno}); line skipped")
            continue
        why = records.request_problem(row, path.parent.name)
        if why:
            problems.append(f"{path}:{n}: {why}; line skipped")
            continue
        rows.append(row)
    return rows


def _read_json(path: Path, problems: list[str], then: str) -> dict[str, Any] | None:
    """A JSON object file; None when missing (not reported) or damaged (reported with `then`, what follows)."""
    try:
        text = path.read_text(errors="replace")
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


def _config(host_dir: Path, d: Path, problems: list[str]) -> ConfigResult | None:
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
    reqs = read_requests(jsonl, problems) if jsonl.exists() else []
    if config is None:
        config = {}
    if status["status"] == "ok" and not jsonl.exists():
        problems.append(f"{jsonl}: missing, though status.json says ok; its cells have no data")
    elif status["status"] == "ok" and not reqs and jsonl.exists() and not jsonl.read_bytes().strip():
        problems.append(f"{jsonl}: empty, though status.json says ok; its cells have no data")
    return ConfigResult(host_dir.name, d.name, config, status, reqs)


def load_run(root: Path) -> Run:
    """Every host folder (one holding host.json or config folders) and its configs. Damage is reported in
    `problems`, each naming its file (and line), and skipped; everything intact is kept."""
    problems: list[str] = []
    meta = _read_json(root / "run.json", problems, "run metadata unknown")
    if meta is None and not (root / "run.json").exists():
        problems.append(f"{root / 'run.json'}: missing; run metadata unknown")
    run = Run(root=root, meta=meta or {}, problems=problems)
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
    return run
