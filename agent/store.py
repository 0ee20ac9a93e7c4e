"""Results on disk: atomic writes and the per-config layout of the results contract."""
from __future__ import annotations

import json
import os
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from . import bounded
from .records import Event

# TOKENIZERS_PARALLELISM and friends name no secret
SECRET_KEY = re.compile(r"(TOKEN(?!IZER)|SECRET|PASSWORD|API_?KEY|CREDENTIAL)", re.I)
SECRET_FLAGS = ("--api-key", "--hf-token", "--token")
REDACTED = "<redacted>"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, fsync, then rename: readers see all or nothing. An OSError names
    `path` (a full disk fails the write itself, which names no file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _named(exc, path) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise _named(exc, path) from exc
        raise
    _fsync_dir(path.parent)


def _named(exc: OSError, path: Path) -> OSError:
    """`exc` with `path` as its file (of its own class: ENOSPC stays an OSError, EACCES a PermissionError); one
    without an errno as it is."""
    if exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    write_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())


def read_json(path: Path) -> Any | None:
    """A JSON record (None when missing or damaged); one that is not a regular file within bounded.RECORD raises
    bounded.BoundError before it is read (a FIFO is never waited on, a device never read without end)."""
    try:
        return json.loads(bounded.read_text(path, bounded.RECORD))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if SECRET_KEY.search(k) else v) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    out, hide = [], False
    for a in argv:
        if hide:
            out.append(REDACTED)
            hide = False
        elif a in SECRET_FLAGS:
            out.append(a)
            hide = True
        elif any(a.startswith(f + "=") for f in SECRET_FLAGS):
            out.append(a.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(a)
    return out


def secret_values(env: dict[str, str], argv: list[str]) -> list[str]:
    """The values that redaction hides: secret-looking env vars and arguments of secret flags."""
    values = [v for k, v in env.items() if SECRET_KEY.search(k)]
    for flag, value in zip(argv, argv[1:]):
        if flag in SECRET_FLAGS:
            values.append(value)
    values += [a.split("=", 1)[1] for a in argv if any(a.startswith(f + "=") for f in SECRET_FLAGS)]
    return [v for v in values if v]


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Remove secret values from free text (logs, details); the longest first, so that a secret that begins
    another leaves nothing of it behind."""
    for s in sorted(set(secrets), key=len, reverse=True):
        if s and len(s) >= 4:
            text = text.replace(s, REDACTED)
    return text


class HostStore:
    """`<root>/<host>/`: host.json, one folder per config, the agent's events and state."""

    def __init__(self, root: Path, host: str, invocation: str = "") -> None:
        self.host = host
        self.dir = root / host
        self.invocation = invocation
        self.dir.mkdir(parents=True, exist_ok=True)

    def config_dir(self, config_id: str) -> Path:
        return self.dir / config_id

    def status(self, config_id: str) -> dict[str, Any] | None:
        return read_json(self.config_dir(config_id) / "status.json")

    def event(self, kind: Event, **fields: Any) -> None:
        """Append one progress event (a line is written whole or not at all)."""
        line = json.dumps({"t": now_iso(), "event": Event(kind).value, "invocation": self.invocation, **fields},
                          sort_keys=True) + "\n"
        fd = os.open(self.dir / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
