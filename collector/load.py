"""Read a run folder per the results contract, tolerating damage: every problem is reported
with its file (and line) and skipped, never fatal."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REQUIRED = {
    "host": str, "config_id": str, "method": str, "method_params": dict, "tp": int, "workload": str,
    "max_tokens": int, "context_tokens": int, "concurrency": int, "rep": int, "ok": bool,
}
NUMERIC_OR_NULL = ("prompt_tokens", "completion_tokens", "ttft_s", "e2e_s", "output_tok_s", "accept_length")


@dataclass
class ConfigResult:
    host: str
    config_id: str
    config: dict[str, Any]
    status: dict[str, Any]
    requests: list[dict[str, Any]]


@dataclass
class Run:
    root: Path
    meta: dict[str, Any]
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    configs: list[ConfigResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _check_row(row: Any, config_id: str) -> str | None:
    if not isinstance(row, dict):
        return f"not a JSON object (got {type(row).__name__})"
    for key, typ in REQUIRED.items():
        if key not in row:
            return f"missing field {key!r}"
        if typ is int and (isinstance(row[key], bool) or not isinstance(row[key], int)):
            return f"field {key!r} should be an integer, got {row[key]!r}"
        if typ is not int and not isinstance(row[key], typ):
            return f"field {key!r} should be {typ.__name__}, got {type(row[key]).__name__}"
    for key in NUMERIC_OR_NULL:
        v = row.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            return f"field {key!r} should be a finite number or null, got {v!r}"
    if row["ok"] and not isinstance(row.get("output_tok_s"), (int, float)):
        return "ok request without output_tok_s"
    if row["config_id"] != config_id:
        return f"config_id {row['config_id']!r} is not its folder's ({config_id!r})"
    return None


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
        why = _check_row(row, path.parent.name)
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


def _identity_from(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What config.json would say of a config's identity, from its first request line (which the agent writes
    with engine, model name, method, params and tp), so that its rows still pair with their baseline."""
    if not rows:
        return {}
    first = rows[0]
    out = {k: first[k] for k in ("engine", "method", "method_params", "tp") if k in first}
    if isinstance(first.get("model"), str):
        out["model"] = {"name": first["model"]}
    return out


def _config(host_dir: Path, d: Path, problems: list[str]) -> ConfigResult | None:
    status_path = d / "status.json"
    if not status_path.exists():
        problems.append(f"{status_path}: missing (config incomplete or interrupted); config skipped")
        return None
    status = _read_json(status_path, problems, "config skipped")
    if status is None:
        return None
    if status.get("status") not in ("ok", "failed", "skipped"):
        problems.append(f"{status_path}: status {status.get('status')!r} is not ok|failed|skipped; config skipped")
        return None
    config = _read_json(d / "config.json", problems, "the config's identity taken from its request lines")
    if config is None and not (d / "config.json").exists():
        problems.append(f"{d / 'config.json'}: missing; the config's identity taken from its request lines")
    jsonl = d / "requests.jsonl"
    reqs = read_requests(jsonl, problems) if jsonl.exists() else []
    if config is None:
        config = _identity_from(reqs)
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
