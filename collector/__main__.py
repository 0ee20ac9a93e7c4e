"""`python -m collector report RUN_DIR --format md|csv|json`, `stamp` (run.json), `verdict`, `pull`, and `unpack`
(one host's archive into the run folder)."""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from agent.records import SCHEMA_VERSION
from agent.store import now_iso, read_json, write_atomic, write_json

from . import PACK_FILE, VS_FILE
from .load import load_run
from .pull import pull
from .verdict import FAIL_ON, judge


def _commit() -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10)
        return res.stdout.strip() or None
    except OSError:
        return None


def stamp(args: argparse.Namespace) -> int:
    """Create or update `run.json`; started_at is kept across resumed sessions."""
    root = Path(args.run_dir)
    meta = read_json(root / "run.json") or {}
    now = now_iso()
    meta.setdefault("run_id", root.name)
    meta.setdefault("started_at", now)
    meta.update(schema_version=SCHEMA_VERSION, suite=args.suite or meta.get("suite"),
                project_version=_commit() or meta.get("project_version"))
    if args.event == "start":
        meta["finished_at"] = None
        meta.setdefault("sessions", []).append({"started_at": now, "hosts": args.hosts})
    else:
        meta["finished_at"] = now
        hosts = sorted({*meta.get("hosts", []), *args.hosts})
        meta["hosts"] = hosts
    write_json(root / "run.json", meta)
    return 0


def unpack(args: argparse.Namespace) -> int:
    """Put one host's results in place all at once: extract beside the run's host folder, then swap it in,
    so an interrupted pull never leaves a half-extracted folder that looks complete."""
    root, host = Path(args.run_dir), args.host
    new, old = root / f".{host}.unpack", root / f".{host}.old"
    for leftover in (new, old):
        shutil.rmtree(leftover, ignore_errors=True)
    new.mkdir(parents=True)
    with tarfile.open(args.archive) as tar:
        tar.extractall(new, filter="data")
    if not (new / host).is_dir():
        print(f"{args.archive} holds no folder {host!r}", file=sys.stderr)
        return 2
    if (root / host).exists():
        os.rename(root / host, old)
    os.rename(new / host, root / host)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(new, ignore_errors=True)
    return 0


def report(args: argparse.Namespace) -> int:
    root = Path(args.run_dir)
    if not root.is_dir():
        print(f"no such run folder: {root}", file=sys.stderr)
        return 2
    # the report's modules (pandas, scipy) load here while other processes read the request lines of a large run
    run = load_run(root, meanwhile=lambda: importlib.import_module(".report", __package__))
    from .report import ddtree_vs_dflash_csv, pack_check_csv, render

    for p in run.problems:
        print(f"warning: {p}", file=sys.stderr)
    if args.write:
        for fmt in ("md", "csv", "json"):
            write_atomic(root / f"report.{fmt}", render(run, fmt).encode())
        # no DDTree and DFlash in one group, no pack check (any more): no file, not an empty one
        for name, text in ((VS_FILE, ddtree_vs_dflash_csv(run)), (PACK_FILE, pack_check_csv(run))):
            if text is None:
                (root / name).unlink(missing_ok=True)
            else:
                write_atomic(root / name, text.encode())
    sys.stdout.write(render(run, args.format))
    return 0


def verdict(args: argparse.Namespace) -> int:
    root = Path(args.run_dir)
    if not root.is_dir():
        print(f"no such run folder: {root}", file=sys.stderr)
        return 2
    result = judge(load_run(root), args.hosts, args.fail_on)
    print("\n".join(result.lines))
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m collector")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="print the speedup table of a run")
    r.add_argument("run_dir")
    r.add_argument("--format", choices=("md", "csv", "json"), default="md")
    r.add_argument("--write", action="store_true", help="also write report.md/.csv/.json into the run folder, "
                   f"{VS_FILE} when DDTree and DFlash share a cell, and {PACK_FILE} when a packed phase has a "
                   "pack check")
    r.set_defaults(func=report)
    s = sub.add_parser("stamp", help="record the start or end of a session of a run in run.json")
    s.add_argument("run_dir")
    s.add_argument("event", choices=("start", "finish"))
    s.add_argument("--suite")
    s.add_argument("--hosts", nargs="*", default=[])
    s.set_defaults(func=stamp)
    k = sub.add_parser("unpack", help="put one host's results archive in place under a run folder")
    k.add_argument("run_dir")
    k.add_argument("host")
    k.add_argument("archive")
    k.set_defaults(func=unpack)
    v = sub.add_parser("verdict", help="exit 1 when the run's statuses fail bench_fail_on")
    v.add_argument("run_dir")
    v.add_argument("--fail-on", choices=FAIL_ON, default="none_ok")
    v.add_argument("--hosts", nargs="*", default=[])
    v.set_defaults(func=verdict)
    u = sub.add_parser("pull", help="fetch a run's results from hosts through ansible-runner")
    u.add_argument("-l", "--limit", required=True, help="hosts or groups, as for ansible-playbook -l")
    u.add_argument("run_id", nargs="?", help="the run to fetch (default: the newest on each host)")
    u.add_argument("-i", "--inventory", action="append", default=[], help="inventory (default: the project's)")
    u.add_argument("--results", help="the controller's results folder (default: the project's results/)")
    u.set_defaults(func=lambda a: pull(a.limit, a.run_id, a.inventory, a.results))
    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
