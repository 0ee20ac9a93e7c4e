"""What a host can do, read before any start: the installed engine's `--help` (its flags and the values a flag
accepts) and version, the model folders' `config.json` and weight sizes, and the GPUs' memory.

Standard library only and without package-relative imports: the plan sends this file's text to the host as
`python3 -c <text> <json>` (nothing is written there, so plan and check mode can use it) and reads back one
JSON object. The agent imports the help parser from here too, so flags are read one way.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*")
# argparse's rendering of `choices`: "--speculative-algorithm {EAGLE,EAGLE3,NGRAM}"
CHOICES = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)[ =]\{([^{}\s]+)\}")

VERSION = (
    "import importlib.metadata as m, sys\n"
    "for d in sys.argv[1:]:\n"
    "    try:\n"
    "        print(m.version(d)); break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
)


def help_flags(text: str) -> Set[str]:
    """Every `--flag` a help text mentions."""
    return set(FLAG.findall(text))


def help_choices(text: str) -> Dict[str, List[str]]:
    """The values each flag accepts where the help lists them as argparse choices."""
    out: Dict[str, List[str]] = {}
    for flag, values in CHOICES.findall(text):
        out.setdefault(flag, [v for v in values.split(",") if v])
    return out


def unsupported(argv: Sequence[str], flags: Set[str], choices: Mapping[str, Sequence[str]]) -> List[str]:
    """The launch arguments the engine would refuse: flags its help does not know, and values outside a
    flag's listed choices (`--speculative-algorithm DDTREE`)."""
    out = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg.partition("=")
        if name not in flags:
            out.append(name)
            continue
        if name in choices:
            given = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if given not in choices[name]:
                out.append(f"{name} {given}")
    return out


def read_help(python: str, module: str, env: Optional[Mapping[str, str]] = None,
              timeout: float = 600) -> Tuple[Set[str], Dict[str, List[str]]]:
    """The flags and choices of `<python> -m <module> --help`; RuntimeError naming the command when it fails or
    names no flags, OSError when the interpreter is not there."""
    argv = [python, "-m", module, "--help"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=None if env is None else dict(env))
    text = res.stdout + res.stderr
    flags = help_flags(text)
    if res.returncode != 0 or "--help" not in flags and len(flags) < 5:
        lines = (res.stderr or res.stdout).strip().splitlines()[-10:]
        raise RuntimeError(f"`{' '.join(argv)}` failed ({res.returncode}): " + "\n".join(lines))
    return flags, help_choices(text)


def engine(python: str, module: str, dists: Sequence[str], env: Optional[Mapping[str, str]] = None,
           timeout: float = 600) -> Dict[str, Any]:
    """The engine's version and `--help` as flags and choices, or why they could not be read."""
    out: Dict[str, Any] = {"python": python, "module": module, "version": None}
    try:
        ver = subprocess.run([python, "-c", VERSION, *dists], capture_output=True, text=True, timeout=120,
                             env=None if env is None else dict(env))
        out["version"] = ver.stdout.strip() or None
        flags, choices = read_help(python, module, env, timeout)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        out["error"] = str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"
        return out
    out.update(flags=sorted(flags), choices=choices)
    return out


def model(path: str) -> Dict[str, Any]:
    """A model folder's config.json and the bytes of its weights (safetensors, else PyTorch files)."""
    folder = Path(path)
    out: Dict[str, Any] = {"path": path, "config": None, "weights_bytes": None}
    try:
        out["config"] = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        pass
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        files = [p for p in folder.glob(pattern) if p.is_file()]
        if files:
            out["weights_bytes"] = sum(p.stat().st_size for p in files)
            break
    return out


def gpu_memory_mib() -> Optional[int]:
    """The smallest GPU's total memory by nvidia-smi; None without GPUs or driver."""
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    totals = [int(v) for v in res.stdout.split() if v.strip().isdigit()] if res.returncode == 0 else []
    return min(totals) if totals else None


def probe(request: Mapping[str, Any]) -> Dict[str, Any]:
    """{engine: {python, module, dists, env}, models: {key: path}} → what the host says about each."""
    e = request["engine"]
    return {"engine": engine(e["python"], e["module"], e.get("dists", []), e.get("env")),
            "models": {k: model(p) for k, p in (request.get("models") or {}).items() if p},
            "gpu_memory_mib": gpu_memory_mib()}


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))
