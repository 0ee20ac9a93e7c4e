"""The stand-in engine (engine.py) and the wrapper that makes it a suite's `engine_python`."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Mapping

ENGINE = Path(__file__).resolve().parent / "engine.py"


def write_python(folder: Path, env: Mapping[str, str] | None = None, python: str = sys.executable,
                 name: str = "standin-python") -> Path:
    """An executable in `folder` that runs the stand-in as the engine's Python (`-m <engine module> ...`,
    `-c <probe>`), with `env` as the knobs of every server of a suite that uses it (a config's own `env` wins)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    exports = "".join(f"export {k}=\"${{{k}-{_double_quoted(str(v))}}}\"\n" for k, v in (env or {}).items())
    path.write_text(f"#!/bin/sh\n{exports}exec {shlex.quote(python)} {shlex.quote(str(ENGINE))} \"$@\"\n")
    path.chmod(0o755)
    return path


def _double_quoted(value: str) -> str:
    """`value` as the shell reads it between double quotes."""
    return "".join("\\" + c if c in '\\"$`' else c for c in value)
