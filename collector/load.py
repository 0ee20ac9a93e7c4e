"""Read a run folder per the results contract, tolerating damage: every problem is reported
with its file (and line) and skipped, never fatal."""
from __future__ import annotations

import json
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


def _check_row(row: Any) -> str | None:
    if not isinstance(row, dict):
        return "not a JSON object"
    for key, typ in REQUIRED.items():
        if key not in row:
            return f"missing field {key!r}"
        if typ is int and (isinstance(row[key], bool) or not isinstance(row[key], int)):
            return f"field {key!r} should be an integer, got {row[key]!r}"
        if typ is not int and not isinstance(row[key], typ):
            return f"field {key!r} should be {typ.__name__}, got {type(row[key]).__name__}"
    for key in NUMERIC_OR_NULL:
        v = row.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"field {key!r} should be a number or null, got {v!r}"
    if row["ok"] and not isinstance(row.get("output_tok_s"), (int, float)):
        return "ok request without output_tok_s"
    return None


def read_requests(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    rows = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        problems.append(f"{path}: unreadable ({exc})")
        return rows
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{n}: malformed JSON ({exc.msg}); line skipped")
            continue
        why = _check_row(row)
        if why:
            problems.append(f"{path}:{n}: {why}; line skipped")
            continue
        rows.append(row)
    return rows


def _read_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        problems.append(f"{path}: unreadable JSON ({exc}); skipped")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path}: not a JSON object; skipped")
        return None
    return obj


def load_run(root: Path) -> Run:
    """Every host folder (one holding host.json or config folders) and its configs."""
    problems: list[str] = []
    run = Run(root=root, meta=_read_json(root / "run.json", problems) or {}, problems=problems)
    for host_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        host_json = _read_json(host_dir / "host.json", problems)
        cfg_dirs = sorted(p for p in host_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        if host_json is None and not cfg_dirs:
            continue
        run.hosts[host_dir.name] = host_json or {}
        for d in cfg_dirs:
            status = _read_json(d / "status.json", problems)
            if status is None:
                problems.append(f"{d}: no status.json (config incomplete or interrupted); skipped")
                continue
            if status.get("status") not in ("ok", "failed", "skipped"):
                problems.append(f"{d / 'status.json'}: status {status.get('status')!r} is not "
                                f"ok|failed|skipped; skipped")
                continue
            config = _read_json(d / "config.json", problems) or {}
            reqs = read_requests(d / "requests.jsonl", problems) if (d / "requests.jsonl").exists() else []
            run.configs.append(ConfigResult(host_dir.name, d.name, config, status, reqs))
    return run
