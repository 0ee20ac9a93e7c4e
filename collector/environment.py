"""What a run was measured on, per host, in a few short lines (host.json and run.json), and what differs
between two runs."""
from __future__ import annotations

from collections import Counter
from typing import Any

from .results import Run

COMMIT_CHARS = 12  # a commit is shown by its first characters
HASH_CHARS = 8  # a patch's sha256 likewise
MISSING = "-"  # the value on the side of a difference that does not have it


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _text(v: Any) -> str:
    """A scalar as text; empty for None, blank and anything that is not a scalar."""
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        return ""
    return str(v).strip()


def _gib(mib: Any) -> str:
    if isinstance(mib, bool) or not isinstance(mib, (int, float)) or mib <= 0:
        return ""
    return f"{mib / 1024:.0f} GiB"


def gpus_text(gpus: dict[str, Any]) -> str:
    """`8x NVIDIA RTX PRO 6000 (96 GiB)`: the GPUs by model and memory, `none` when the host reported none."""
    devices = [d for d in gpus.get("devices") or [] if isinstance(d, dict)]
    if not devices:
        return "none" if gpus.get("count") == 0 else ""
    kinds = Counter((_text(d.get("name")) or "GPU", _gib(d.get("memory.total", d.get("memory_total_mib"))))
                    for d in devices)
    return ", ".join(f"{n}x {name}" + (f" ({mem})" if mem else "") for (name, mem), n in kinds.items())


def _patch_text(p: Any) -> str:
    """`ddtree.patch@1a2b3c4d` for a recorded {name, sha256}, the name itself for a plain string."""
    if isinstance(p, dict):
        name, sha = _text(p.get("name")) or "?", _text(p.get("sha256"))
        return f"{name}@{sha[:HASH_CHARS]}" if sha else name
    return _text(p)


def _engine(engine: dict[str, Any]) -> list[tuple[str, str]]:
    """engine, engine commit (with the ref or refspec it was built from) and patches."""
    build = _dict(engine.get("build"))
    name = _text(engine.get("distribution")) or _text(engine.get("name"))
    out = []
    if name:
        out.append(("engine", f"{name} {_text(engine.get('version'))}".strip()))
    commit = _text(build.get("commit")) or _text(engine.get("commit"))
    ref = _text(build.get("refspec")) or _text(build.get("ref"))
    if commit:
        out.append(("engine commit", commit[:COMMIT_CHARS] + (f" ({ref})" if ref else "")))
    patches = build.get("patches") if build else engine.get("patches")
    if isinstance(patches, list) and (patches or build):
        out.append(("patches", ", ".join(filter(None, map(_patch_text, patches))) or "none"))
    return out


def _model(m: dict[str, Any]) -> str:
    """`Qwen3-8B (revision main, digest 0123abcd)`."""
    name = _text(m.get("name"))
    if not name:
        return ""
    revision, digest = _text(m.get("revision")), _text(m.get("digest"))[:HASH_CHARS]
    about = ([f"revision {revision}"] if revision else []) + ([f"digest {digest}"] if digest else [])
    return name + (f" ({', '.join(about)})" if about else "")


def _cpu(info: dict[str, Any]) -> str:
    cpu = _dict(info.get("cpu"))
    model, count, usable = _text(cpu.get("model")), cpu.get("count"), cpu.get("usable")
    cores = f"{usable} of {count} CPUs" if usable not in (None, count) else (f"{count} CPUs" if count else "")
    memory = _gib(info.get("memory_total_mib"))
    return ", ".join(filter(None, [model, cores, f"{memory} RAM" if memory else ""]))


def host_environment(info: dict[str, Any], meta: dict[str, Any]) -> list[tuple[str, str]]:
    """One host's header lines from its host.json (`info`) and the run's run.json (`meta`)."""
    gpus = _dict(info.get("gpus"))
    pairs = [("GPUs", gpus_text(gpus) if gpus else ""), ("driver", _text(gpus.get("driver_version"))),
             ("CUDA", _text(gpus.get("cuda_version"))), *_engine(_dict(info.get("engine"))),
             ("model", _model(_dict(info.get("model")))), ("drafter", _model(_dict(info.get("draft_model")))),
             ("specfleet", _text(meta.get("project_version"))), ("CPU", _cpu(info)),
             ("OS", " ".join(filter(None, [_text(info.get("os")), _text(info.get("kernel"))])))]
    return [(label, value) for label, value in pairs if value]


def environment(run: Run) -> dict[str, list[tuple[str, str]]]:
    """Per host of the run: ordered (label, value) pairs of what it was measured on, only what is known."""
    return {host: host_environment(info, run.meta) for host, info in run.hosts.items()}


def differences(a: Run, b: Run) -> list[tuple[str, str, str, str]]:
    """(host, label, value in a, value in b) for every label whose value differs between the runs, hosts matched
    by name; a host in one run only is one entry, `host`, with `-` on the other side."""
    env_a, env_b = environment(a), environment(b)
    out = []
    for host in dict.fromkeys([*env_a, *env_b]):
        if host not in env_a or host not in env_b:
            out.append((host, "host", "present" if host in env_a else MISSING,
                        "present" if host in env_b else MISSING))
            continue
        va, vb = dict(env_a[host]), dict(env_b[host])
        for label in dict.fromkeys([*va, *vb]):
            if va.get(label) != vb.get(label):
                out.append((host, label, va.get(label, MISSING), vb.get(label, MISSING)))
    return out
