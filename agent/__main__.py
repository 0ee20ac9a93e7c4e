"""`python -m agent run|pack|progress|hostlock|schemas`: the host-side entry points the bench role calls."""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import tarfile
import time
import uuid
from pathlib import Path

from . import bounded, progress, records, secrets
from .store import now_iso, read_json, write_json


def load_plan(path: Path) -> dict:
    """The plan with its secrets resolved in memory; the file keeps placeholders only from here on."""
    plan = json.loads(path.read_text())
    values = plan.pop("secrets", None) or {}
    if values:
        write_json(path, plan)  # atomic, mode 0600: the secrets leave the disk before anything runs
    return secrets.resolve(plan, values)


def holder_state(host_dir: Path, wait_s: float = 5.0) -> dict:
    """The state file of the start that holds the run's lock. It writes the file right after it takes the lock:
    a state that does not say `running` yet is read again until `wait_s` has passed."""
    end = time.monotonic() + wait_s
    while True:
        state = read_state(host_dir / "agent.json")
        if state.get("state") == "running" or time.monotonic() > end:
            return state
        time.sleep(0.05)


def read_state(path: Path) -> dict:
    """A state file as a mapping ({} when it is missing, damaged or not a mapping)."""
    state = read_json(path)
    return state if isinstance(state, dict) else {}


def note_attach(host_dir: Path, invocation: str, state: dict) -> None:
    """Tell whoever follows `invocation` (the controller that started it) to follow the start that holds the
    lock instead: one appended line of `agent.attach.jsonl`, read by `progress`. Without it, a holder that ends
    between this refusal and the controller's first poll would leave nothing to follow."""
    if not state.get("invocation"):
        return
    line = json.dumps({"invocation": invocation, "follow": state["invocation"], "pid": state.get("pid"),
                       "at": now_iso()}) + "\n"
    fd = os.open(host_dir / progress.ATTACH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, line.encode())  # one short write on O_APPEND: whole lines, also from starts racing
    finally:
        os.close(fd)


SUITE_LOCK, SUITE_STATE = ".suite.lock", ".suite.json"  # in the results root: one suite per host


def suite_holder(results: Path) -> dict | None:
    """The suite that holds this host (its run id, invocation, pid, start), or None when none does. Read only:
    nothing is created (plan and check mode ask it too)."""
    try:
        fd = os.open(results / SUITE_LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_state(results / SUITE_STATE) or {"run_id": None}
    finally:
        os.close(fd)
    return None


def busy_message(holder: dict) -> str:
    run_id = holder.get("run_id") or "?"
    return (f"this host is running suite {run_id} (invocation {holder.get('invocation') or '?'}, pid "
            f"{holder.get('pid') or '?'}, since {holder.get('started_at') or '?'}): one suite per host. To follow "
            f"it: -e run_id={run_id}; to start this one once it ends: -e wait_for_host=true")


def take_host(results: Path, host_dir: Path, plan: dict, args: argparse.Namespace, state: dict) -> object | None:
    """The host-wide lock of a suite, held (by the returned file) until this process exits. Held by another run:
    None after recording why (this start's state says `refused`), or, with --wait-for-host, wait for it."""
    lock = open(results / SUITE_LOCK, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = read_state(results / SUITE_STATE)
        if not args.wait_for_host:
            message = busy_message(holder)
            write_json(host_dir / "agent.json", {**state, "state": "refused", "error": message,
                                                  "finished_at": now_iso()})
            print(message, file=sys.stderr)
            lock.close()
            return None
        write_json(host_dir / "agent.json", {**state, "waiting_for": holder.get("run_id")})
        fcntl.flock(lock, fcntl.LOCK_EX)  # queued: the kernel hands the lock over when that suite's agent exits
    write_json(results / SUITE_STATE, {"run_id": plan["run_id"], "host": plan["host"], "pid": os.getpid(),
                                       "invocation": args.invocation, "started_at": now_iso()})
    return lock


def show_holder(args: argparse.Namespace) -> int:
    """`hostlock`: the suite holding this host as JSON ({"held": false} when none)."""
    holder = suite_holder(Path(args.results))
    print(json.dumps({"held": holder is not None, **({"holder": holder, "message": busy_message(holder)}
                                                      if holder is not None else {})}))
    return 0


def run(args: argparse.Namespace) -> int:
    plan = load_plan(Path(args.plan))
    root = Path(args.results) / plan["run_id"]
    host_dir = root / plan["host"]
    host_dir.mkdir(parents=True, exist_ok=True)
    lock = open(host_dir / "agent.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        state = holder_state(host_dir)
        note_attach(host_dir, args.invocation, state)
        print(f"run {plan['run_id']} is already running on this host (pid {state.get('pid')})", file=sys.stderr)
        return 3
    state = {"pid": os.getpid(), "run_id": plan["run_id"], "state": "running", "started_at": now_iso(),
             "invocation": args.invocation}
    suite_lock = take_host(Path(args.results), host_dir, plan, args, state)
    if suite_lock is None:
        return 4
    # only `run` measures: the polls and packs (a fresh process each, beside the engine) import none of it
    from .server import become_subreaper
    from .suite import Suite

    become_subreaper()
    write_json(host_dir / "agent.json", state)
    try:
        rc = Suite(plan, root, force=args.force, invocation=args.invocation,
                   skip_unsupported=args.skip_unsupported, cache=Path(args.results).parent / "cache").run()
        state.update(state="finished", finished_at=now_iso())
        return rc
    except BaseException as exc:
        state.update(state="failed", error=f"{type(exc).__name__}: {exc}", finished_at=now_iso())
        raise
    finally:
        write_json(host_dir / "agent.json", state)


def pack(args: argparse.Namespace) -> int:
    """Archive one host's results (`<results>/<run_id>/<host>`) for the controller to fetch."""
    src = Path(args.results) / args.run_id / args.host
    tmp = Path(args.out + ".tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(src, arcname=args.host,
                    filter=lambda ti: None if ti.name.endswith(("agent.lock", progress.ATTACH)) else ti)
        os.replace(tmp, args.out)
    finally:
        tmp.unlink(missing_ok=True)  # a failed pack leaves nothing half-written behind
    return 0


def show_progress(args: argparse.Namespace) -> int:
    events, state = Path(args.events), Path(args.state)
    try:
        out = (progress.wait(events, args.offset, state, args.wait) if args.wait > 0
               else progress.read(events, args.offset, state))
    except bounded.BoundError as exc:  # the events file is not one the agent wrote: said in one line
        print(f"cannot read the agent's events: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


def schemas(args: argparse.Namespace) -> int:
    """Write the JSON Schemas of the record files (the published form of `records`)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in records.RECORDS:
        write_json(out / f"{name}.schema.json", records.json_schema(name))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a plan's configs on this host")
    r.add_argument("--plan", required=True)
    r.add_argument("--results", required=True, help="results root on this host")
    r.add_argument("--force", action="store_true", help="re-run configs already ok")
    r.add_argument("--skip-unsupported", action="store_true",
                   help="record configs with flags the engine does not know as skipped, not failed")
    r.add_argument("--invocation", default=uuid.uuid4().hex, help="an id for this start, carried by its events")
    r.add_argument("--wait-for-host", action="store_true",
                   help="when another run's suite holds this host, wait for it instead of refusing (exit 4)")
    r.set_defaults(func=run)
    h = sub.add_parser("hostlock", help="the suite that holds this host, as JSON (read only)")
    h.add_argument("--results", required=True)
    h.set_defaults(func=show_holder)
    k = sub.add_parser("pack", help="archive one host's results")
    k.add_argument("--results", required=True)
    k.add_argument("--run-id", required=True)
    k.add_argument("--host", required=True)
    k.add_argument("--out", required=True)
    k.set_defaults(func=pack)
    g = sub.add_parser("progress", help="new events and the agent's state, for the controller's follow")
    g.add_argument("--events", required=True)
    g.add_argument("--offset", type=int, default=0)
    g.add_argument("--state", required=True)
    g.add_argument("--wait", type=float, default=0.0,
                   help="answer once a new event is there or the agent is gone, after this many seconds at the latest")
    g.set_defaults(func=show_progress)
    s = sub.add_parser("schemas", help="write the JSON Schemas of the results' record files")
    s.add_argument("--out", required=True)
    s.set_defaults(func=schemas)
    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
