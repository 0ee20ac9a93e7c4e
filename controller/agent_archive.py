"""The agent as one file for the host: a zip of `agent/*.py` that Python runs as a script
(`python agent.pyz run ...`), so installing it is one transfer instead of one per module.

Beside each module the archive carries its bytecode for the controller's Python (a pyc checked against the source
it sits next to). Python never caches what it compiles from a zip, and every progress poll and pack is a fresh
process on the host, beside the engine being measured: a host on the controller's Python version skips compiling
the agent on each call; any other version finds the magic number foreign and compiles the source as before.

The archive is deterministic (sorted entries, a fixed timestamp, fixed modes): the same sources give the same bytes,
so a second run copies nothing. It is kept in the user's cache folder under its content hash; a cached file is
used only when its bytes are the ones just built."""
from __future__ import annotations

import hashlib
import importlib.util
import io
import marshal
import os
import tempfile
import zipfile
from pathlib import Path

# Run as a script, the archive itself is sys.path[0]; the working folder is not on sys.path, so no other copy
# of the package can shadow it.
MAIN = b"import runpy\nrunpy.run_module('agent', run_name='__main__', alter_sys=True)\n"
STAMP = (1980, 1, 1, 0, 0, 0)


def bytecode(source: bytes, name: str) -> bytes:
    """`source` compiled by this Python into a pyc checked against the source's hash (no timestamp), its code
    naming the file `name`. The code is marshalled in format 2, which has no back-references: the newer formats
    mark objects by how many references the compiling process holds to them, so the same source could give other
    bytes in another controller process, and the host would be sent the agent again."""
    code = compile(source, name, "exec", dont_inherit=True)
    flags = (0b11).to_bytes(4, "little")  # hash-based, checked against the source
    return importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source) + marshal.dumps(code, 2)


def archive_bytes(project: Path) -> bytes:
    """The zip of `<project>/agent/*.py` (each with its pyc) under `agent/`, with a top-level `__main__.py`
    running the package."""
    sources = sorted((project / "agent").glob("*.py"))
    if not any(p.name == "__main__.py" for p in sources):
        raise FileNotFoundError(f"no agent package with a __main__.py under {project}")
    entries = [("__main__.py", MAIN)]
    for p in sources:
        text = p.read_bytes()
        entries += [(f"agent/{p.name}", text), (f"agent/{p.stem}.pyc", bytecode(text, f"agent/{p.name}"))]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, STAMP)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return buf.getvalue()


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specfleet"


def build(project: Path, cache: Path | None = None) -> Path:
    """The archive's path in the cache, written there (atomically) unless the same bytes already are."""
    data = archive_bytes(project)
    folder = cache or cache_dir()
    path = folder / f"agent-{hashlib.sha256(data).hexdigest()[:16]}.pyz"
    try:
        if path.read_bytes() == data:
            return path
    except OSError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".agent-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
