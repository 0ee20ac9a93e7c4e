"""What specfleet may overwrite or delete among a run's report files: only what it can show it wrote. Each report
file is recognised by what specfleet writes at its head (report.md its `# Run` title and speedup section, a CSV its
header, report.json its `run` key, report.html its page head, a plot the `specfleet` mark in its PNG or SVG
metadata); anything else at one of those names, or any PNG or SVG without the mark in a plots folder, is refused
(`Foreign`, naming the path and why) before anything is written, and left as it was. So are run.json, host
folders and a host's archive at the place the pull fetches it to (`archive_made`).

Standard library only: `stamp` and `unpack` check run.json and host folders with it without loading pandas."""
from __future__ import annotations

import json
import os
import tarfile
import zlib
from pathlib import Path
from typing import Callable, Optional

from agent import bounded

from .. import HTML_FILE, PACK_FILE, PLOTS_DIR, VS_FILE

MARK = "specfleet"  # the creator named in every plot's metadata (PNG Software, SVG dc:creator)
HEAD = 4096  # bytes read from a file's head to recognise it
PLOT_SUFFIXES = (".png", ".svg")


class Foreign(Exception):
    """A path specfleet would overwrite or delete holds something it cannot show it made: refused, left as it
    was."""


def refusal(path: Path, why: str, what: str) -> Foreign:
    """The refusal of `path`, one line: what is there, what specfleet expected, and what to do."""
    return Foreign(f"{path}: {why}, not {what} specfleet wrote; left as it is: move it away (or point specfleet "
                   f"at another folder) and run the same command again")


def _kind(path: Path) -> Optional[str]:
    """What `path` is when it is not a plain file (a directory, a symbolic link, a FIFO...); None for a plain
    file."""
    return bounded.kind(path, follow=False)


def _head(path: Path, size: int = HEAD) -> bytes:
    with open(path, "rb") as f:
        return f.read(size)


def _md(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.readline(HEAD).startswith(b"# Run ") and b"## Speedup vs the autoregressive baseline\n" in f


def _csv(*columns: str) -> Callable[[Path], bool]:
    def recognised(path: Path) -> bool:
        header = _head(path).split(b"\n", 1)[0].decode(errors="replace").split(",")
        return header[:4] == ["host", "engine", "model", "tp"] and all(c in header for c in columns)
    return recognised


def _json(path: Path) -> bool:
    return _head(path, 16).startswith(b'{\n  "run": ') and b'\n  "rows": [' in path.read_bytes()


def _html(path: Path) -> bool:
    head = _head(path)
    return head.startswith(b"<!DOCTYPE html>") and b"<title>specfleet run " in head


# Every report file in the run folder, with how specfleet recognises its own (the plots: `plot_made`)
REPORT_FILES: dict[str, Callable[[Path], bool]] = {
    "report.md": _md,
    "report.csv": _csv("config_id", "tok_s_mean", "speedup"),
    "report.json": _json,
    VS_FILE: _csv("ddtree_config_id", "ddtree_over_dflash"),
    PACK_FILE: _csv("pack_check_config_id", "packed_over_alone"),
    HTML_FILE: _html,
}


def png_metadata() -> dict[str, Optional[str]]:
    """savefig's metadata for a PNG: the mark as its Software."""
    import matplotlib

    return {"Software": f"{MARK} (Matplotlib {matplotlib.__version__})"}


def svg_metadata() -> dict[str, Optional[str]]:
    """savefig's metadata for an SVG: the mark as its creator, and no date (the file stays the same)."""
    import matplotlib

    return {"Date": None, "Creator": f"{MARK} (Matplotlib {matplotlib.__version__})"}


def plot_made(path: Path, legacy: bool = False) -> bool:
    """Whether a PNG or SVG carries specfleet's mark (`legacy`: or Matplotlib's own, as plots drawn before the mark
    do: accepted in a run folder's plots/ only)."""
    head = _head(path)
    creators = [MARK] + (["Matplotlib"] if legacy else [])
    if path.suffix == ".png":
        return head.startswith(b"\x89PNG") and any(f"tEXtSoftware\0{c}".encode() in head for c in creators)
    return b"<svg" in head and any(f"<dc:title>{c}".encode() in head for c in creators)


def run_json_made(path: Path) -> Optional[str]:
    """Why `path` is not a run.json specfleet wrote (None: it is, or there is none)."""
    if not os.path.lexists(path):
        return None
    kind = _kind(path)
    if kind:
        return kind
    try:
        meta = json.loads(bounded.read_bytes(path, bounded.RECORD))
    except bounded.BoundError as exc:
        return str(exc.strerror)
    except ValueError:
        return "not JSON"
    return None if isinstance(meta, dict) and isinstance(meta.get("run_id"), str) else "JSON without a run_id"


def check_run_json(root: Path) -> None:
    """Foreign when the run folder's run.json, which specfleet is about to rewrite, is not specfleet's."""
    why = run_json_made(root / "run.json")
    if why:
        raise refusal(root / "run.json", why, "a run.json")


def check_plots(folder: Path) -> None:
    """Foreign when `folder` (where plots are about to be drawn, and those of an earlier report removed) is not a
    folder or holds a PNG or SVG that specfleet did not draw; nothing is changed either way."""
    if not os.path.lexists(folder):
        return
    what = _kind(folder)
    if what != "a directory":
        raise refusal(folder, what or "a file", "a plots folder")
    run_json = folder.parent / "run.json"
    legacy = folder.name == PLOTS_DIR and run_json.is_file() and run_json_made(run_json) is None
    for path in sorted(folder.iterdir()):
        if path.suffix not in PLOT_SUFFIXES:
            continue  # never touched
        kind = _kind(path)
        if kind or not plot_made(path, legacy):
            raise refusal(path, kind or f"a {path.suffix[1:].upper()} without specfleet's mark", "a plot")


def check_report(root: Path) -> None:
    """Foreign when any report file in the run folder `root` (each is written again, or removed when the run no
    longer has it) or its plots folder holds what specfleet did not write; run before anything is written, so
    that a refusal leaves everything as it was."""
    for name, recognised in REPORT_FILES.items():
        path = root / name
        if not os.path.lexists(path):
            continue
        kind = _kind(path)
        if kind or not recognised(path):
            raise refusal(path, kind or "its content is not specfleet's report", f"a {name}")
    check_plots(root / PLOTS_DIR)


def host_folder_made(path: Path) -> bool:
    """Whether `path` is a host's results folder as the agent writes it (its events.jsonl or host.json)."""
    return path.is_dir() and not path.is_symlink() and any((path / f).is_file() for f in ("events.jsonl",
                                                                                         "host.json"))


def archive_made(path: Path, host: str) -> Optional[str]:
    """Why `path` is not an archive of `host`'s results as a pull fetches it (None: it is): a gzip'd tar whose first
    entry is the folder `host`, as the agent's `pack` writes it, or an empty file (a fetch cut short before its
    first byte). Only its head is read."""
    kind = _kind(path)
    if kind:
        return kind
    if path.stat().st_size == 0:
        return None
    try:
        with tarfile.open(path, "r|gz") as tar:  # a stream: its first entry's headers are all that is read
            first = tar.next()
    except (OSError, EOFError, tarfile.TarError, zlib.error):
        return "not a gzip'd tar archive"
    if first is None or not first.isdir() or first.name.rstrip("/") != host:
        return f"an archive whose first entry is not the folder {host}/"
    return None
