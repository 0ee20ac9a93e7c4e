"""The `specfleet` command (also `python -m collector`): `report`, `compare`, `plot`, `where`, `pull`, `db` and
`history` (the history store), and for the playbooks `stamp` (run.json), `unpack` (one host's archive into the run
folder), `finish` (run.json closed, the history store updated, the report written, the run judged) and
`verdict`.

Every subcommand's exit status means one thing (`main` maps what a subcommand raises; docs/results.md lists them):
0 done; 1 the verdict: the run's statuses fail --fail-on (`finish`, `verdict`) or a cell regressed (`compare`);
2 refused before anything changed: bad usage or input, a path that holds what specfleet did not make, or a file it
was pointed at that is not a regular file within its limit (agent.bounded: a FIFO, a device, a folder);
3 the system refused an operation (a full disk, a permission, an I/O error, a module not installed): said in one
line with the path, the reason and what to do, nothing half-written left; 4 an unexpected error, a fault in
specfleet (its traceback, then one line); 5 `pull`: the pull playbook failed on a host (its failed tasks above)."""
from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import traceback
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable

from agent.bounded import BoundError, open_regular
from agent.records import SCHEMA_VERSION
from agent.store import now_iso, read_json, write_json

from . import HTML_FILE, PACK_FILE, PLOTS_DIR, VS_FILE
from .outputs.own import Foreign, archive_made, check_report, check_run_json, host_folder_made, refusal
from .verdict import FAIL_ON

DONE, VERDICT, REFUSED, SYSTEM, FAULT, PULL_FAILED = 0, 1, 2, 3, 4, 5

# Where a failed step loses nothing: the hosts keep their results, and the same command brings them home
KEPT_ON_HOSTS = ("finish", "unpack", "pull")

# What a command needs is imported by that command: the playbooks call `stamp` and `unpack` on every run, and
# neither should pay for pandas and scipy. So each command's arguments are declared here, beside the code that runs
# it (the table of commands: COMMANDS, at the end).

# ---------------------------------------------------------------------------------------------------------------
# Arguments more than one command takes
# ---------------------------------------------------------------------------------------------------------------

RUN_DIR = "the run's folder, results/<run_id>"
DB_BESIDE_RUN = 'specfleet.duckdb beside the run folder, when there is one; "": none'
DB_IN_RESULTS = "RESULTS/specfleet.duckdb"


def run_dir_argument(p: argparse.ArgumentParser, help: str = RUN_DIR, **kw: Any) -> None:
    """RUN_DIR, the run's folder."""
    p.add_argument("run_dir", metavar="RUN_DIR", help=help, **kw)


def db_option(p: argparse.ArgumentParser, what: str, default: str) -> None:
    """--db: the history store, `what` the command does with it, `default` where it is when not given."""
    p.add_argument("--db", help=f"{what} (default: {default})")


def format_option(p: argparse.ArgumentParser, choices: tuple[str, ...], help: str) -> None:
    """--format: one of `choices`, the first by default."""
    p.add_argument("--format", choices=choices, default=choices[0], help=help)


def results_option(p: argparse.ArgumentParser) -> None:
    """--results: the results folder that holds the history store."""
    p.add_argument("--results", default="results", help="the results folder (default: %(default)s)")


def suite_option(p: argparse.ArgumentParser) -> None:
    """--suite: the suite's name, for run.json."""
    p.add_argument("--suite", help="the suite's name")


def hosts_option(p: argparse.ArgumentParser, help: str = "the hosts of the session") -> None:
    """--hosts: the hosts of a playbook's session."""
    p.add_argument("--hosts", nargs="*", default=[], help=help)


def fail_on_option(p: argparse.ArgumentParser) -> None:
    """--fail-on: what fails the run (bench_fail_on)."""
    p.add_argument("--fail-on", choices=FAIL_ON, default="none_ok", help="what fails the run (default: none_ok)")


def _count(text: str, least: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is below {least}")
    return value


def _positive(text: str) -> int:
    return _count(text, 1)


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a fraction from 0 up to (not including) 1")
    return value


# ---------------------------------------------------------------------------------------------------------------
# The playbooks' commands: stamp, unpack, finish, verdict
# ---------------------------------------------------------------------------------------------------------------

def _commit() -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10)
        return res.stdout.strip() or None
    except OSError:
        return None


def stamp(args: argparse.Namespace) -> int:
    """Create or update `run.json`; started_at is kept across resumed sessions."""
    check_run_json(Path(args.run_dir))
    _stamp(Path(args.run_dir), args.event, args.suite, args.hosts)
    return 0


def stamp_arguments(p: argparse.ArgumentParser) -> None:
    run_dir_argument(p)
    p.add_argument("event", choices=("start", "finish"), help="which end of the session")
    suite_option(p)
    hosts_option(p)


def _stamp(root: Path, event: str, suite: str | None, hosts: list[str]) -> None:
    """run.json opened or closed for a session (the caller has checked that a run.json there is specfleet's)."""
    meta = read_json(root / "run.json") or {}
    now = now_iso()
    meta.setdefault("run_id", root.name)
    meta.setdefault("started_at", now)
    meta.update(schema_version=SCHEMA_VERSION, suite=suite or meta.get("suite"),
                project_version=_commit() or meta.get("project_version"))
    if event == "start":
        meta["finished_at"] = None
        meta.setdefault("sessions", []).append({"started_at": now, "hosts": hosts})
    else:
        meta["finished_at"] = now
        hosts = sorted({*meta.get("hosts", []), *hosts})
        meta["hosts"] = hosts
    write_json(root / "run.json", meta)


def unpack(args: argparse.Namespace) -> int:
    """Put one host's results in place all at once: extract beside the run's host folder, then swap it in,
    so an interrupted pull never leaves a half-extracted folder that looks complete. Only what specfleet made is
    replaced or removed: the host folder (the agent's events.jsonl or host.json in it), unpack's own staging
    folder (its mark in it, or empty) and, with --remove-archive, the archive it has just put in place; anything
    else there is refused and left as it is. --before-fetch: only free the archive's place for the pull's fetch
    (an earlier pull's archive of the host removed, anything else there refused)."""
    root, host, archive = Path(args.run_dir), args.host, Path(args.archive)
    if args.before_fetch:
        return _free(archive, host)
    new, dest = root / f".{host}.unpack", root / host
    old = root / f".{host}.old"  # where an earlier specfleet kept the replaced folder while swapping
    with open_regular(archive) as packed:  # a FIFO or a device there is refused before anything changes
        for path, made in ((new, _staging_made), (old, host_folder_made), (dest, host_folder_made)):
            if os.path.lexists(path) and not made(path):
                raise refusal(path, "it holds no results of a host (no events.jsonl or host.json)" if path.is_dir()
                              else "a file", "a host folder" if path != new else "an unpack folder")
        _clear(new)
        shutil.rmtree(old, ignore_errors=True)
        new.mkdir(parents=True)
        (new / UNPACKING).touch()
        try:
            if not _extract(archive, packed, new, host):
                return REFUSED
            if dest.exists():
                os.rename(dest, new / REPLACED)
            os.rename(new / host, dest)
        finally:
            _clear(new)  # nothing half-extracted stays behind
    if args.remove_archive:
        archive.unlink()  # its results are in place: the copy would double the space the run takes
    return DONE


def unpack_arguments(p: argparse.ArgumentParser) -> None:
    run_dir_argument(p)
    p.add_argument("host", help="the host the archive came from")
    p.add_argument("archive", help="the host's tar archive of its results")
    p.add_argument("--remove-archive", action="store_true", help="remove the archive once its results are in place "
                   "(the pull's fetched copy)")
    p.add_argument("--before-fetch", action="store_true", help="only free the archive's place for a fetch: an "
                   "earlier pull's archive of the host there is removed, anything else refused")


def _free(archive: Path, host: str) -> int:
    """The place the pull fetches `host`'s archive to, made free: an earlier pull's archive there (one that a pull
    cut short or an earlier specfleet left) removed and said on stdout; anything else refused (Foreign)."""
    if not os.path.lexists(archive):
        return DONE
    why = archive_made(archive, host)
    if why:
        raise refusal(archive, why, f"an archive of {host}'s results")
    archive.unlink()
    print(f"removed an earlier pull's archive of {host}: {archive}")
    return DONE


UNPACKING, REPLACED = ".specfleet-unpack", ".specfleet-replaced"  # unpack's mark, and the host folder it replaces


def _staging_made(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and ((path / UNPACKING).is_file() or not any(path.iterdir()))


def _clear(folder: Path) -> None:
    """Remove unpack's staging folder, its mark last: an unpack cut short leaves it marked (or empty)."""
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.name == UNPACKING:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    if [c.name for c in folder.iterdir()] in ([UNPACKING], []):
        (folder / UNPACKING).unlink(missing_ok=True)
        folder.rmdir()


def _extract(archive: Path, packed: BinaryIO, into: Path, host: str) -> bool:
    """The archive (`packed`, open) extracted into `into`; False once it is said that it is not a host's results
    archive."""
    try:
        with tarfile.open(fileobj=packed) as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        print(f"{archive}: not a readable results archive ({exc}): fetch it again (run the same command again)",
              file=sys.stderr)
        return False
    except OSError as exc:  # a full disk fails a write that names no file: the folder it extracts into
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, os.strerror(exc.errno), str(into)) from exc
        raise
    if not host_folder_made(into / host):
        print(f"{archive} holds no results of {host!r} (no folder {host}/ with events.jsonl or host.json)",
              file=sys.stderr)
        return False
    return True


def finish(args: argparse.Namespace) -> int:
    """The end of a playbook's session, in one process: run.json closed, every report file written, the markdown
    report printed, then the verdict as one JSON line ({"ok", "lines"}); exit 1 when the run fails `--fail-on`."""
    root = Path(args.run_dir)
    check_run_json(root)  # what finish rewrites is specfleet's, or nothing is changed
    check_report(root)
    _stamp(root, "finish", args.suite, args.hosts)
    run = _load(root, keep_rows=args.db != "")  # its request rows kept for the history store
    from .report import write
    from .verdict import judge

    history, stored = _store_run(root, args.db, run)
    report_md = write(root, run, plots=not args.no_plots, history=history)["md"]
    result = judge(run, args.hosts, args.fail_on)
    sys.stdout.write(report_md)
    print("\n" + json.dumps({"ok": result.ok, "lines": result.lines, "history": stored}))
    return 0 if result.ok else 1


def finish_arguments(p: argparse.ArgumentParser) -> None:
    run_dir_argument(p)
    suite_option(p)
    fail_on_option(p)
    hosts_option(p)
    db_option(p, "the history store to update", 'specfleet.duckdb in the results folder that holds RUN_DIR; "": none')
    p.add_argument("--no-plots", action="store_true", help="write the report files without plots (and remove an "
                   "earlier report's plots of the run): bench_report_plots=false")


def _store_run(root: Path, db: str | None, run: Any) -> tuple[list[dict[str, Any]], str]:
    """The history store brought up to date with the results folder that holds `root` (`run`: the run there,
    read with its request rows, stored without reading it again), and the run's cells' history from it; a store
    that cannot be updated costs the report its history, nothing else. `db` "": none."""
    if db == "":
        return [], "history store: off"
    try:
        from .history import for_run
        from .store_update import update

        summary = update(root.parent, Path(db) if db else None, warn=lambda s: print(s, file=sys.stderr),
                         loaded=run)
        return for_run(summary.db, root.name), summary.line()
    except Exception as exc:  # noqa: BLE001  (the report is written whatever the store's trouble)
        line = f"history store not updated: {type(exc).__name__}: {exc}"
        print(f"warning: {line}", file=sys.stderr)
        return [], line


def verdict(args: argparse.Namespace) -> int:
    root = _run_dir(args.run_dir)
    if root is None:
        return 2
    from .load import load_run
    from .verdict import judge

    result = judge(load_run(root), args.hosts, args.fail_on)
    print("\n".join(result.lines))
    return 0 if result.ok else 1


def verdict_arguments(p: argparse.ArgumentParser) -> None:
    run_dir_argument(p)
    fail_on_option(p)
    hosts_option(p, "the hosts to judge (default: every host of the run)")


# ---------------------------------------------------------------------------------------------------------------
# A run's report, plots and place: report, plot, where
# ---------------------------------------------------------------------------------------------------------------

def _run_dir(path: str, what: str = "run folder") -> Path | None:
    """The folder, or None once it is said that there is no such folder."""
    root = Path(path)
    if not root.is_dir():
        print(f"no such {what}: {root}", file=sys.stderr)
        return None
    return root


def _load(root: Path, keep_rows: bool = False) -> Any:
    from .load import load_run

    # the report's modules (pandas, scipy) load here while other processes read the request lines of a large run
    run = load_run(root, meanwhile=lambda: importlib.import_module(".report", __package__), keep_rows=keep_rows)
    for p in run.problems:
        print(f"warning: {p}", file=sys.stderr)
    return run


def report(args: argparse.Namespace) -> int:
    root = _run_dir(args.run_dir)
    if root is None:
        return 2
    if args.write:
        check_report(root)  # before anything is written
    run = _load(root)
    from .report import render, write

    history = _history(root, args.db)
    written = write(root, run, history=history) if args.write else {}
    shown = written.get(args.format) if not args.wide or args.format == "html" else None
    sys.stdout.write(shown if shown is not None else render(run, args.format, wide=args.wide, folder=root,
                                                            history=history))
    return 0


def report_arguments(p: argparse.ArgumentParser) -> None:
    run_dir_argument(p)
    format_option(p, ("md", "csv", "json", "html"), "md: readable in a terminal (default); csv/json: every column, for "
                  "programs; html: the self-contained page with the plots")
    p.add_argument("--wide", action="store_true", help="md: also the full table with every column (wider than "
                   "120 columns)")
    p.add_argument("--write", action="store_true", help="also write report.md/.csv/.json and report.html into "
                   f"the run folder, the plots into {PLOTS_DIR}/, {VS_FILE} when DDTree and DFlash share a cell, "
                   f"and {PACK_FILE} when a packed phase has a pack check")
    db_option(p, "the history store whose earlier runs of the run's cells the written report shows", DB_BESIDE_RUN)


def _history(root: Path, db: str | None) -> list[dict[str, Any]]:
    """The run's cells over their earlier runs, from the history store as it is (default: the one beside the run
    folder; "": none): what its trend plots and the page's History section are drawn from."""
    if db == "":
        return []
    from .history import for_run
    from .store import DB_FILE

    return for_run(Path(db) if db else root.parent / DB_FILE, root.name)


def plot(args: argparse.Namespace) -> int:
    root = _run_dir(args.run_dir)
    if root is None:
        return 2
    run = _load(root)
    from .outputs import plots
    from .tables.speedup import table

    written = plots.write(run, table(run), Path(args.out) if args.out else root / PLOTS_DIR, _history(root, args.db))
    print("\n".join(str(p) for p in written) if written else "no plot: the run has no data to draw")
    return 0


def plot_arguments(p: argparse.ArgumentParser) -> None:
    run_dir_argument(p)
    p.add_argument("--out", help=f"where to write them (default: RUN_DIR/{PLOTS_DIR})")
    db_option(p, "the history store whose earlier runs of the run's cells the trend plots draw", DB_BESIDE_RUN)


def where(args: argparse.Namespace) -> int:
    """Say where a run's report and plots are (the newest run under `--results` when no run is named)."""
    if args.run_dir:
        root = Path(args.run_dir)
    else:
        runs = sorted((p for p in Path(args.results).glob("*/run.json")), key=lambda p: p.stat().st_mtime)
        if not runs:
            print(f"no run under {args.results}", file=sys.stderr)
            return 2
        root = runs[-1].parent
    page, shown = root / HTML_FILE, root / PLOTS_DIR
    if not page.is_file():
        print(f"{root} has no {HTML_FILE}: run `specfleet report {root} --write`", file=sys.stderr)
        return 2
    pngs = sorted(shown.glob("*.png"))
    print(f"report: {page}  (open it in a browser; also report.md, report.csv, report.json)")
    print(f"plots:  {shown}/ ({len(pngs)} PNG, each also as SVG)" + (f", e.g. {pngs[0]}" if pngs else ""))
    return 0


def where_arguments(p: argparse.ArgumentParser) -> None:
    run_dir_argument(p, "the run's folder (default: the newest run)", nargs="?")
    p.add_argument("--results", default="results", help="where runs are, for the newest (default: results)")


# ---------------------------------------------------------------------------------------------------------------
# Runs against each other and over time: compare, db, history
# ---------------------------------------------------------------------------------------------------------------

COMPARE = """One run against another: per matching cell (host, engine, config_id, workload, max_tokens,
context_tokens, concurrency, request_rate) B ÷ A of mean tok/s with the report's 95% interval for a ratio of means;
the cells only one run has, the cells a run failed or skipped, the cells measured by one engine in A and another in
B (not comparable: never judged), and what differs in the hosts' environments. A cell regressed when
B ÷ A is below 1 - threshold and its interval lies wholly below 1; improved, symmetrically. For each config swept
over loads, its crossover (where its throughput, or goodput, falls below the baseline's) in each run: it moved down
when B's interval lies wholly below A's. Exits 1 when a cell regressed, a crossover moved down, or a config ok in A
failed or was skipped in B (it broke), so that it can gate a CI job after an engine bump."""


def _compare(args: argparse.Namespace) -> int:
    from .compare import main as compare_main

    return compare_main(args)


def compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", metavar="RUN_A", help="the reference run's folder (results/<run_id>), e.g. before an "
                   "engine bump")
    p.add_argument("run_b", metavar="RUN_B", help="the run to judge against it, e.g. after the bump")
    p.add_argument("--threshold", type=_threshold, default=0.05,
                   help="a cell regressed when B ÷ A of its tok/s is below 1 - THRESHOLD and its 95%% interval lies "
                        "below 1 (a fraction: 0.05 is 5%%; default: %(default)s)")
    format_option(p, ("md", "json"), "markdown text or JSON (default: md)")
    p.add_argument("--wide", action="store_true", help="markdown: one table with every column instead of "
                   "tables per cell that fit 120 columns")


DB = """Build or update the history store: one DuckDB file (RESULTS/specfleet.duckdb) holding every run under the
results folder: its request rows, its cells (the report's table), configs, statuses and each host's environment
(engine build, driver, GPUs, specfleet commit), keyed by run id, host and config digest. A run already stored and
unchanged is not read again; a run whose folder is gone is dropped; a damaged file is skipped and named with its
line. bench.yml updates it at the end of every run. --sql answers a query from it; the DuckDB CLI opens the file
too."""


def db(args: argparse.Namespace) -> int:
    """Build or update the history store; with --sql, then answer a query from it."""
    from .store import DB_FILE, Busy, Unusable
    from .store_update import update

    results = _run_dir(args.results, "results folder")
    if results is None:
        return 2
    path = Path(args.db) if args.db else results / DB_FILE
    try:
        summary = update(results, path, rebuild=args.rebuild, warn=lambda s: print(s, file=sys.stderr))
    except (Busy, Unusable) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(summary.line(), file=sys.stderr if args.sql else sys.stdout)
    if not args.sql:
        return 0
    from .history import answer

    try:
        sys.stdout.write(answer(path, args.sql, args.format))
    except ValueError as exc:
        print(f"--sql: {exc}", file=sys.stderr)
        return 2
    return 0


def db_arguments(p: argparse.ArgumentParser) -> None:
    results_option(p)
    db_option(p, "the store", DB_IN_RESULTS)
    p.add_argument("--rebuild", action="store_true", help="read every run again, from an empty store")
    p.add_argument("--sql", help="then run this query on the store and print its answer (tables: "
                   "docs/history.md)")
    format_option(p, ("md", "csv", "json"), "--sql's answer as a markdown table (default), CSV or JSON")


HISTORY = """Per cell (host, config, workload, max_tokens, context, load): tok/s, speedup and acceptance length over
the runs in the history store, each with its 95% interval, what changed on the host or in the config since the
cell's previous run (e.g. `sglang a1b2c3 → d4e5f6`, `server args: added --max-num-seqs 8`), and the figures whose
interval lies wholly outside the spread (every interval) of the previous --window runs of the cell."""


def history(args: argparse.Namespace) -> int:
    """Print each matching cell's figures over the runs in the history store."""
    from .history import Filters, points, render, since
    from .store import DB_FILE, Busy, Unusable, connect

    path = Path(args.db) if args.db else Path(args.results) / DB_FILE
    if not os.path.lexists(path):
        print(f"no history store at {path}: build it with `specfleet db`", file=sys.stderr)
        return 2
    try:
        when = since(args.since) if args.since else None
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    f = Filters(host=args.host, config=args.config, workload=args.workload, since=when, last=args.last,
                window=args.window)
    try:
        con = connect(path, read_only=True)
    except (Busy, Unusable) as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        sys.stdout.write(render(points(con, f), args.format, f))
    finally:
        con.close()
    return 0


def history_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="hosts, by name or glob pattern (tp1-*, ct2??)")
    p.add_argument("--config", help="configs, by config_id or glob pattern (tp1-ddtree-*)")
    p.add_argument("--workload", help="workloads, by name or glob pattern")
    p.add_argument("--since", help="runs started on or after this date (YYYY-MM-DD, or an ISO date and time; UTC)")
    p.add_argument("--last", type=_count, default=10, help="the newest runs shown per cell (default: %(default)s; "
                   "0: every run)")
    p.add_argument("--window", type=_positive, default=5, help="a run is judged against the spread of this many "
                   "previous runs of its cell (default: %(default)s)")
    format_option(p, ("md", "csv", "json"), "markdown tables per cell (default), or a row per cell and run as CSV or "
                  "JSON")
    results_option(p)
    db_option(p, "the store", DB_IN_RESULTS)


# ---------------------------------------------------------------------------------------------------------------
# Fetching a run: pull
# ---------------------------------------------------------------------------------------------------------------

def _pull(args: argparse.Namespace) -> int:
    """The pull playbook's outcome: 0, or PULL_FAILED (ansible-playbook's own status said with it)."""
    from .pull import pull

    rc = int(pull(args.limit, args.run_id, args.inventory, args.results, args.project))
    if rc:
        print(f"specfleet pull: the pull playbook failed (ansible-playbook status {rc}): its failed tasks are shown "
              "above; the hosts keep the run: the same command fetches it again", file=sys.stderr)
    return PULL_FAILED if rc else DONE


def pull_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--limit", required=True, help="hosts or groups, as for ansible-playbook -l")
    p.add_argument("run_id", nargs="?", help="the run to fetch (default: the newest on each host)")
    p.add_argument("-i", "--inventory", action="append", default=[], help="inventory (default: the project's)")
    p.add_argument("--results", help="the controller's results folder (default: the project's results/)")
    p.add_argument("--project", help="the specfleet project folder (default: the current folder)")


# ---------------------------------------------------------------------------------------------------------------
# The table of commands, and what a failed one says
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    """A subcommand: its line in `specfleet --help`, its description (`raw`: laid out as written), what it was doing
    when it failed (for the line that says so), its arguments and the function that runs it (its exit status)."""

    name: str
    help: str
    description: str
    doing: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    raw: bool = False


COMMANDS = {c.name: c for c in (
    Command("report", "print the speedup report of a run", "Print the speedup report of a run: per cell each "
            "method's tok/s and speedup over the autoregressive baseline with its 95%% interval.",
            "reading the run and writing its report", report_arguments, report),
    Command("compare", "compare two runs cell by cell; exit 1 when a cell regressed or broke, or a crossover moved "
            "down", COMPARE, "reading the two runs", compare_arguments, _compare, raw=True),
    Command("db", "build or update the history store (every run under the results folder, one DuckDB file); --sql "
            "to query it", DB, "updating the history store", db_arguments, db, raw=True),
    Command("history", "each cell's tok/s, speedup and acceptance over the runs, with what changed between them",
            HISTORY, "reading the history store", history_arguments, history, raw=True),
    Command("plot", "draw a run's plots (PNG and SVG)", "Draw a run's plots: speedup against DDTree budget, tok/s, "
            "acceptance length, context and concurrency sweeps, latency, and with a history store the run's cells "
            "over their earlier runs.", "drawing the run's plots", plot_arguments, plot),
    Command("where", "say where a run's report.html and plots are", "Say where a run's report.html and plots are.",
            "finding the run's report", where_arguments, where),
    Command("pull", "fetch a run's results from hosts through ansible-runner", "Fetch a run's results from hosts "
            "(playbooks/pull.yml) and build its report.", "fetching the run from its hosts", pull_arguments, _pull),
    Command("stamp", "record the start or end of a session of a run in run.json (the playbooks call it)",
            "Record the start or end of a session of a run in run.json.", "recording the session in run.json",
            stamp_arguments, stamp),
    Command("unpack", "put one host's results archive in place under a run folder (the playbooks call it)",
            "Put one host's results archive in place under a run folder, all at once.",
            "putting the host's results in place", unpack_arguments, unpack),
    Command("finish", "close the session in run.json, write the report and judge the run (the playbooks call it)",
            "Close the session in run.json, write every report file, print the report, then the verdict as one JSON "
            "line; exit 1 when the run fails --fail-on.", "closing the run and writing its report", finish_arguments,
            finish),
    Command("verdict", "exit 1 when the run's statuses fail bench_fail_on", "Exit 1 when the run's statuses fail "
            "bench_fail_on.", "reading the run's statuses", verdict_arguments, verdict),
)}
OPERATIONS = {name: c.doing for name, c in COMMANDS.items()}  # what each subcommand was doing, for its failure line


def add_command(sub: Any, command: Command) -> argparse.ArgumentParser:
    """`command`'s parser, on the subparsers `sub` of the command line."""
    p = sub.add_parser(command.name, help=command.help, description=command.description,
                       **({"formatter_class": argparse.RawDescriptionHelpFormatter} if command.raw else {}))
    command.arguments(p)
    p.set_defaults(func=command.run)
    return p


def failure_line(cmd: str, exc: BaseException) -> str:
    """One line for a subcommand stopped by `exc`: the operation, the path, the system's reason and what to do."""
    doing = OPERATIONS.get(cmd, cmd)
    kept = ("the hosts keep the run: nothing was lost" if cmd in KEPT_ON_HOSTS
            else "no file was left half-written")
    if isinstance(exc, OSError):
        path = exc.filename if exc.filename is not None else "(the system named no file)"
        path = f"{path} -> {exc.filename2}" if exc.filename2 is not None else path
        reason = os.strerror(exc.errno) if exc.errno is not None else str(exc)
        return (f"specfleet {cmd}: {doing} failed: {path}: {reason}; {_advice(exc)}, then run the same command "
                f"again ({kept})")
    if _duckdb_io(exc):
        return (f"specfleet {cmd}: {doing} failed: {str(exc).strip()}; free space on (or give access to) the "
                f"store's filesystem, then run the same command again ({kept})")
    if isinstance(exc, ImportError):
        return (f"specfleet {cmd}: {doing} failed: {exc.name or 'a module'} is not installed here ({exc}); install "
                f"specfleet's requirements (`make venv`), then run the same command again ({kept})")
    return (f"specfleet {cmd}: {doing} stopped on an unexpected error, {type(exc).__name__}: {exc} (a fault in "
            f"specfleet, the traceback above says where: please report it; {kept})")


def _advice(exc: OSError) -> str:
    """What to do about an OSError, by its errno."""
    where = f"the filesystem that holds {exc.filename}" if exc.filename is not None else "the results' filesystem"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free space on {where}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "give this user access to it"
    if exc.errno == errno.EROFS:
        return f"make {where} writable"
    if exc.errno == errno.ENOENT:
        return "check that it exists"
    return "fix the cause"


def _duckdb_io(exc: BaseException) -> bool:
    """DuckDB's own I/O error (a full disk under the history store), told apart without loading DuckDB."""
    return any(c.__name__ == "IOException" and "duckdb" in c.__module__ for c in type(exc).__mro__)


def run(args: argparse.Namespace) -> int:
    """The subcommand, its failures mapped to the exit statuses above: never a bare traceback, and never 1."""
    try:
        return int(args.func(args))
    except Foreign as exc:
        print(exc, file=sys.stderr)
        return REFUSED
    except BoundError as exc:  # a file it was pointed at that is no file, or past its limit: named, left as it is
        print(f"specfleet {args.cmd}: {OPERATIONS.get(args.cmd, args.cmd)} refused: {exc}; left as it is: move "
              "it away, then run the same command again", file=sys.stderr)
        return REFUSED
    except SystemExit as exc:  # a subcommand's own refusal with its message
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return REFUSED
        raise
    except Exception as exc:  # noqa: BLE001  (said as itself, never as a verdict)
        if isinstance(exc, (OSError, ImportError)) or _duckdb_io(exc):
            print(failure_line(args.cmd, exc), file=sys.stderr)
            return SYSTEM
        traceback.print_exc()
        print(failure_line(args.cmd, exc), file=sys.stderr)
        return FAULT


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specfleet", description="Reports, plots and comparisons of specfleet runs "
                                "(results/<run_id>/ on the controller), and fetching runs from hosts.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        add_command(sub, command)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
