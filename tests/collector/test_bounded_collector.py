"""The collector's and the plan's remaining reads of files a user's folders hold, each planted as a FIFO without a
writer, /dev/zero or a folder: the history store and the write-ahead log DuckDB keeps beside it, a failed
config's server.log (the report page's log tail), an earlier run's records (the plan's estimates and recorded
flags), run.json (`stamp`) and a host's archive (`unpack`). Each is refused or passed over in one line naming the
file and what it is, within seconds, and read as before when it is a regular file. Every case runs in a child
process with a deadline and a cap on its memory: a read that would block or never end fails the case, not the
machine."""
from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest

from collector import __main__ as cli
from tests.child import DEADLINE_S, within_deadline

HOST, CONFIG, RUN = "h", "tp1-autoregressive", "run-00"
ROW = {"host": HOST, "config_id": CONFIG, "method": "autoregressive", "method_params": {}, "tp": 1, "workload": "fib",
       "max_tokens": 8, "context_tokens": 0, "concurrency": 1, "rep": 0, "ok": True, "output_tok_s": 10.0,
       "decode_tok_s": 10.0}
KEPT = "INFO the engine's last words"  # the log tail status.json keeps

# each bad kind: how to plant it, and what it is called where it is judged without (lstat) or through a link
KINDS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "fifo": (os.mkfifo, "a FIFO", "a FIFO"),
    "dev-zero": (lambda at: at.symlink_to("/dev/zero"), "a symbolic link", "a character device"),
    "folder": (lambda at: at.mkdir(), "a directory", "a directory"),
}


# ---------------------------------------------------------------------------------------------------------------
# The inputs: where each lies under the case's folder, how a fine one is made, and how it is read
# ---------------------------------------------------------------------------------------------------------------

def _cli(*argv: str) -> Callable[[Path], tuple[Optional[int], list[str]]]:
    """A `specfleet` command on the case's folder ({T}): its status and its lines on stderr."""
    def read(t: Path) -> tuple[Optional[int], list[str]]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = cli.main([a.format(T=t) for a in argv])
        return rc, err.getvalue().splitlines()
    return read


def _store(t: Path) -> None:
    from collector import store

    (t / "results").mkdir(exist_ok=True)
    store._new(t / "results" / store.DB_FILE)  # an empty store of specfleet's own


def _records(t: Path) -> None:
    """An earlier run of the host in the results folder, as the agent and `stamp` leave it."""
    cfg = t / "results" / RUN / HOST / CONFIG
    cfg.mkdir(parents=True, exist_ok=True)
    files = {t / "results" / RUN / "run.json": {"run_id": RUN},
             cfg.parent / "host.json": {"host": HOST, "engine": {"help": {"flags": ["--port"]}}},
             cfg / "status.json": {"status": "ok", "ready_s": 1.0},
             cfg / "config.json": {"config_id": CONFIG, "method": "autoregressive", "engine": "vllm"}}
    for path, obj in files.items():
        if not os.path.lexists(path):
            path.write_text(json.dumps(obj))
    if not os.path.lexists(cfg / "requests.jsonl"):
        (cfg / "requests.jsonl").write_text(json.dumps(ROW) + "\n")


def _plan_reads(t: Path) -> tuple[Optional[int], list[str]]:
    """What the plan reads of earlier runs (controller.plan: its estimates, the engine's recorded flags); an
    OSError fails the plan with its line."""
    from controller import estimate, hostcheck

    try:
        evidence = estimate.history(t / "results", HOST)
        recorded = hostcheck.recorded(t / "results", HOST)
    except OSError as exc:
        return None, [str(exc)]
    return None, [] if evidence and recorded else ["not read"]


def _log_tail(t: Path) -> tuple[Optional[int], list[str]]:
    """The report page's tail of a failed config's server.log (status.json's log_tail when it is not read)."""
    from collector.outputs.html import log_tail
    from collector.results import ConfigResult

    (t / "results" / RUN / HOST / CONFIG).mkdir(parents=True, exist_ok=True)
    c = ConfigResult(HOST, CONFIG, {}, {"status": "failed", "log_tail": KEPT})
    return None, log_tail(c, t / "results" / RUN).splitlines()


def _stamp_past_its_check(t: Path) -> tuple[Optional[int], list[str]]:
    """`stamp` reading run.json itself (agent.store.read_json), as when a FIFO takes its place after the check."""
    cli.check_run_json = lambda root: None  # this case's own process only
    return _cli("stamp", "{T}/results/" + RUN, "finish")(t)


def _archive(t: Path) -> None:
    host = t / "packed" / HOST
    host.mkdir(parents=True, exist_ok=True)
    (host / "events.jsonl").write_text('{"event": "suite_end"}\n')
    if os.path.lexists(t / "archive.tar.gz"):
        return  # the case's own
    with tarfile.open(t / "archive.tar.gz", "w:gz") as tar:
        tar.add(host, arcname=HOST)


@dataclass(frozen=True)
class Input:
    name: str
    place: str  # relative to the case's folder
    setup: Callable[[Path], None]  # what lies around it (a fine one of its own, unless the case plants a bad one)
    read: Callable[[Path], tuple[Optional[int], list[str]]]  # → (the command's status or None, the lines said)
    linked: bool  # judged through a symbolic link (else the link is refused as itself)
    fine: Callable[[Path, Optional[int], list[str]], bool]  # a fine one was read as before
    good: Optional[bytes] = None  # a fine one's bytes, where no setup makes it (None: none there is fine too)
    passed_over: bool = False  # not refused: passed over with a line (and what is kept instead)


DB, WAL = "results/specfleet.duckdb", "results/specfleet.duckdb.wal"
INPUTS = [
    Input("history store (db)", DB, lambda t: None, _cli("db", "--results", "{T}/results"),
          False, lambda t, rc, lines: rc == 0),
    Input("history store (history)", DB, _store, _cli("history", "--results", "{T}/results"), False,
          lambda t, rc, lines: rc == 0),
    Input("history store (db --sql)", DB, _store, _cli("db", "--results", "{T}/results", "--sql", "SELECT 1"),
          False, lambda t, rc, lines: rc == 0),
    Input("history store's write-ahead log (db)", WAL, _store, _cli("db", "--results", "{T}/results"), False,
          lambda t, rc, lines: rc == 0),
    Input("history store's write-ahead log (history)", WAL, _store, _cli("history", "--results", "{T}/results"),
          False, lambda t, rc, lines: rc == 0),
    Input("server.log (report page)", f"results/{RUN}/{HOST}/{CONFIG}/server.log",
          lambda t: None, _log_tail, True, lambda t, rc, lines: lines == ["a line of the server's"],
          good=b"a line of the server's\n", passed_over=True),
    *(Input(f"earlier run's {name} (plan)", f"results/{RUN}/{HOST}/{'' if name == 'host.json' else CONFIG + '/'}"
            f"{name}", _records, _plan_reads, True, lambda t, rc, lines: lines == [])
      for name in ("status.json", "config.json", "host.json")),
    Input("run.json (stamp)", f"results/{RUN}/run.json", _records, _cli("stamp", "{T}/results/" + RUN, "finish"),
          False, lambda t, rc, lines: rc == 0),
    Input("run.json (stamp's own read, past its check)", f"results/{RUN}/run.json", _records, _stamp_past_its_check,
          True, lambda t, rc, lines: rc == 0),
    Input("host's archive (unpack)", "archive.tar.gz", _archive,
          _cli("unpack", "{T}/results/" + RUN, HOST, "{T}/archive.tar.gz"), True,
          lambda t, rc, lines: rc == 0 and (t / "results" / RUN / HOST / "events.jsonl").is_file()),
]


# ---------------------------------------------------------------------------------------------------------------
# Each case in a child with a deadline
# ---------------------------------------------------------------------------------------------------------------



def _case(t: Path, inp: Input, kind: Optional[str]) -> Callable[[], tuple[Optional[int], list[str]]]:
    def run() -> tuple[Optional[int], list[str]]:
        at = t / inp.place
        at.parent.mkdir(parents=True, exist_ok=True)
        if kind is not None:
            KINDS[kind][0](at)
        elif inp.good is not None:
            at.write_bytes(inp.good)
        inp.setup(t)
        return inp.read(t)
    return run


CASES = [(inp, kind) for inp in INPUTS for kind in KINDS]


@pytest.mark.parametrize(("inp", "kind"), CASES, ids=[f"{inp.name}-{kind}" for inp, kind in CASES])
def test_a_file_that_is_no_file_is_refused_in_one_line_naming_it(tmp_path: Path, inp: Input, kind: str) -> None:
    at = tmp_path / inp.place
    (rc, lines), seconds = within_deadline(_case(tmp_path, inp, kind))
    named = [line for line in lines if f"{at}:" in line]
    assert len(named) == 1, lines  # one line names the file, and says what it is
    assert f"{at}: {KINDS[kind][2] if inp.linked else KINDS[kind][1]}," in named[0], named[0]
    if inp.passed_over:
        assert named[0].endswith("not read; the tail status.json keeps:") and lines[-1] == KEPT, lines
    elif rc is not None:
        assert rc == cli.REFUSED and lines[-1] == named[0], lines  # said last, as the step's own line
        assert "left as it is" in named[0], named[0]
    assert os.path.lexists(at) and seconds < DEADLINE_S


@pytest.mark.parametrize("inp", INPUTS, ids=[i.name for i in INPUTS])
def test_a_regular_file_is_read_as_before(tmp_path: Path, inp: Input) -> None:
    (rc, lines), _ = within_deadline(_case(tmp_path, inp, None))
    assert inp.fine(tmp_path, rc, lines), (rc, lines)
