"""What specfleet did not make, it does not destroy: every command that overwrites, deletes or replaces something
under a path it was given (the history store, report files, plots, run.json, a host folder) refuses a thing it
cannot show it made, names it, and leaves it (and everything else) byte for byte as it was; no message recommends a
command that would destroy it. Its own artifacts are still rebuilt, overwritten and removed as before."""
from __future__ import annotations

import os
import re
import shutil
import tarfile
from pathlib import Path
from typing import Callable

import duckdb
import pytest

from collector import PACK_FILE, PLOTS_DIR, VS_FILE, store
from collector import __main__ as cli
from collector.outputs import OUTPUTS
from collector.outputs.own import REPORT_FILES
from tests.collector.test_exit_status import HOST, agent_run

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"a photo of the sea" * 10
DESTROYS = re.compile(r"--rebuild|\brm\b|delete|remov|overwrite", re.I)


def tree(root: Path) -> dict[str, object]:
    """Everything under `root`: each file's bytes, each link's target, each folder: what a refusal leaves as it was."""
    out: dict[str, object] = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            p = Path(folder) / name
            key = str(p.relative_to(root))
            out[key] = ("link", os.readlink(p)) if p.is_symlink() else ("dir",) if p.is_dir() else p.read_bytes()
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run as the agent writes it, its report and plots written by specfleet, and its host's archive."""
    base = tmp_path_factory.mktemp("own")
    run_dir = agent_run(base / "results")
    assert cli.main(["report", str(run_dir), "--write", "--db", ""]) == 0
    with tarfile.open(base / f"{HOST}.tar.gz", "w:gz") as tar:
        tar.add(run_dir / HOST, arcname=HOST)
    return base


@pytest.fixture
def place(built: Path, tmp_path: Path) -> Path:
    """A copy of the built run, its results folder and archive, for one test to change."""
    shutil.copytree(built, tmp_path / "t", symlinks=True)
    return tmp_path / "t"


def user_duckdb(path: Path) -> Path:
    """A DuckDB database of the user's own, with a table named as one of the store's."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE runs (note VARCHAR)")
    con.execute("INSERT INTO runs VALUES ('my own numbers')")
    con.close()
    return path


def _clear(path: Path) -> Path:
    """`path` made free for the user's thing (specfleet's own there goes first)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    return path


def _file(rel: str, data: bytes = b"my own notes\n") -> Callable[[Path], Path]:
    def put(t: Path) -> Path:
        path = _clear(t / rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path
    return put


def _folder(rel: str) -> Callable[[Path], Path]:
    def put(t: Path) -> Path:
        path = _clear(t / rel)
        (path / "mine").mkdir(parents=True)
        (path / "mine" / "notes.txt").write_text("my own notes\n")
        return path
    return put


def _link(rel: str) -> Callable[[Path], Path]:
    def put(t: Path) -> Path:
        (t / "mine.txt").write_text("my own notes\n")
        path = t / rel
        path.unlink()
        path.symlink_to(t / "mine.txt")
        return path
    return put


def _duckdb(rel: str) -> Callable[[Path], Path]:
    return lambda t: user_duckdb(t / rel)


def _new_link(rel: str) -> Callable[[Path], Path]:
    def put(t: Path) -> Path:
        (t / "mine.txt").write_text("my own notes\n")
        (t / rel).symlink_to(t / "mine.txt")
        return t / rel
    return put


def _user_archive(rel: str, top: str = "photos") -> Callable[[Path], Path]:
    """A gzip'd tar of the user's whose first entry is the folder `top`."""
    def put(t: Path) -> Path:
        (t / top).mkdir(exist_ok=True)
        (t / top / "notes.txt").write_text("my own notes\n")
        with tarfile.open(t / rel, "w:gz") as tar:
            tar.add(t / top, arcname=top)
        return t / rel
    return put


R, S = "results/run-00", "results"
FETCHED = f"{R}/.{HOST}.tar.gz"  # where the pull fetches the host's archive to (roles/bench/tasks/pull.yml)
# (what is there, put by `put` under the test's folder T) -> the command that would write or delete it: refused
CASES: list[tuple[str, Callable[[Path], Path], list[str]]] = [
    ("db: --db a text file", _file("notes.txt"), ["db", "--results", "{T}/results", "--db", "{T}/notes.txt"]),
    ("db --rebuild: --db a text file", _file("notes.txt"),
     ["db", "--results", "{T}/results", "--db", "{T}/notes.txt", "--rebuild"]),
    ("db --rebuild: a DuckDB database of the user's at the store's path", _duckdb(f"{S}/specfleet.duckdb"),
     ["db", "--results", "{T}/results", "--rebuild"]),
    ("db --sql: a DuckDB database of the user's", _duckdb("user.duckdb"),
     ["db", "--results", "{T}/results", "--db", "{T}/user.duckdb", "--sql", "SELECT 1"]),
    ("db: a folder at the store's path", _folder(f"{S}/specfleet.duckdb"), ["db", "--results", "{T}/results"]),
    ("db: an empty file at the store's path", _file(f"{S}/specfleet.duckdb", b""), ["db", "--results", "{T}/results"]),
    ("history: --db a text file", _file("notes.txt"), ["history", "--results", "{T}/results", "--db", "{T}/notes.txt"]),
    ("history: a DuckDB database of the user's", _duckdb("user.duckdb"),
     ["history", "--results", "{T}/results", "--db", "{T}/user.duckdb"]),
    *((f"report --write: {name} of the user's", _file(f"{R}/{name}"), ["report", f"{{T}}/{R}", "--write", "--db", ""])
      for name in REPORT_FILES),
    ("report --write: report.md a folder", _folder(f"{R}/report.md"), ["report", f"{{T}}/{R}", "--write"]),
    ("report --write: report.md a link to the user's file", _link(f"{R}/report.md"),
     ["report", f"{{T}}/{R}", "--write"]),
    ("finish: report.html of the user's", _file(f"{R}/report.html"), ["finish", f"{{T}}/{R}", "--hosts", HOST]),
    ("finish: run.json of the user's", _file(f"{R}/run.json"), ["finish", f"{{T}}/{R}", "--hosts", HOST]),
    ("finish --no-plots: a picture of the user's in plots/", _file(f"{R}/{PLOTS_DIR}/holiday.png", PNG),
     ["finish", f"{{T}}/{R}", "--hosts", HOST, "--no-plots"]),
    ("finish: plots a file", _file(f"{R}/{PLOTS_DIR}"), ["finish", f"{{T}}/{R}", "--hosts", HOST]),
    ("stamp: run.json JSON without a run id", _file(f"{R}/run.json", b'{"mine": 1}\n'),
     ["stamp", f"{{T}}/{R}", "finish"]),
    ("plot --out: a folder of the user's pictures", _file("pictures/photo.png", PNG),
     ["plot", f"{{T}}/{R}", "--out", "{T}/pictures", "--db", ""]),
    ("plot: an SVG of the user's at a plot's own name", _file(f"{R}/{PLOTS_DIR}/tok-s-{HOST}-tp1.svg", b"<svg>mine"),
     ["plot", f"{{T}}/{R}", "--db", ""]),
    ("plot --out: a file", _file("pictures"), ["plot", f"{{T}}/{R}", "--out", "{T}/pictures", "--db", ""]),
    ("report --format html: a drawing of the user's in plots/", _file(f"{R}/{PLOTS_DIR}/mine.svg", b"<svg/>"),
     ["report", f"{{T}}/{R}", "--format", "html", "--db", ""]),
    ("unpack: a folder of the user's where the host's goes", _folder(f"{R}/{HOST}"),
     ["unpack", f"{{T}}/{R}", HOST, f"{{T}}/{HOST}.tar.gz"]),
    ("unpack: a folder of the user's at the staging name", _folder(f"{R}/.{HOST}.unpack"),
     ["unpack", f"{{T}}/{R}", HOST, f"{{T}}/{HOST}.tar.gz"]),
    ("unpack: a file where the host's folder goes", _file(f"{R}/other-host"),
     ["unpack", f"{{T}}/{R}", "other-host", f"{{T}}/{HOST}.tar.gz"]),
    *((f"unpack --before-fetch: {what} at the place the pull fetches the archive to", put,
       ["unpack", f"{{T}}/{R}", HOST, f"{{T}}/{FETCHED}", "--before-fetch"])
      for what, put in (("a file of the user's", _file(FETCHED)), ("a folder", _folder(FETCHED)),
                        ("a link to the user's file", _new_link(FETCHED)),
                        ("a gzip'd tar of the user's", _user_archive(FETCHED)),
                        ("another host's archive", _user_archive(FETCHED, "other-host")))),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_what_specfleet_did_not_make_is_refused_named_and_left_as_it_was(
        case: tuple[str, Callable[[Path], Path], list[str]], place: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, put, args = case
    foreign = put(place)
    before = tree(place)
    capsys.readouterr()
    rc = cli.main([a.format(T=place) for a in args])
    err = capsys.readouterr().err
    line = [s for s in err.splitlines() if s.strip()][-1]
    assert rc == cli.REFUSED, err
    assert str(foreign) in line and "left as it is" in line, line
    assert not DESTROYS.search(line), line
    assert tree(place) == before  # the foreign thing and everything else, byte for byte


# ---------------------------------------------------------------------------------------------------------------
# specfleet's own: rebuilt, overwritten and removed as before
# ---------------------------------------------------------------------------------------------------------------

def test_every_report_file_has_a_way_to_be_recognised() -> None:
    assert {o.file for o in OUTPUTS if not o.folder} == set(REPORT_FILES)


def test_its_own_report_files_and_plots_are_written_again_and_stale_ones_removed(
        place: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = place / R
    plots = run_dir / PLOTS_DIR
    drawn = sorted(p.name for p in plots.iterdir())
    assert drawn and all(p.endswith((".png", ".svg")) for p in drawn)
    shutil.copy(plots / drawn[0], plots / f"speedup-vs-budget-oldhost-tp1{Path(drawn[0]).suffix}")  # an earlier one
    (plots / "notes.txt").write_text("mine: never touched\n")
    (run_dir / "report.md").write_text((run_dir / "report.md").read_text() + "a line of the user's\n")  # still its
    assert cli.main(["finish", str(run_dir), "--hosts", HOST]) == cli.DONE
    assert sorted(p.name for p in plots.iterdir()) == sorted([*drawn, "notes.txt"])
    assert "a line of the user's" not in (run_dir / "report.md").read_text()
    assert cli.main(["finish", str(run_dir), "--hosts", HOST, "--no-plots"]) == cli.DONE  # its plots go
    assert [p.name for p in plots.iterdir()] == ["notes.txt"]
    capsys.readouterr()


def test_a_plot_drawn_before_the_mark_counts_as_its_own_in_a_run_folder_only(place: Path) -> None:
    """Matplotlib's own creator (plots of an earlier specfleet) is taken as specfleet's in a run's plots/, not in
    any other folder."""
    import io

    import matplotlib
    from matplotlib.figure import Figure

    matplotlib.use("Agg")
    buf = io.BytesIO()
    Figure().savefig(buf, format="png")
    run_dir = place / R
    (run_dir / PLOTS_DIR / "tok-s-oldhost-tp1.png").write_bytes(buf.getvalue())
    (place / "pictures").mkdir()
    (place / "pictures" / "chart.png").write_bytes(buf.getvalue())
    assert cli.main(["finish", str(run_dir), "--hosts", HOST, "--no-plots"]) == cli.DONE
    assert not any((run_dir / PLOTS_DIR).iterdir())
    assert cli.main(["plot", str(run_dir), "--out", str(place / "pictures"), "--db", ""]) == cli.REFUSED
    assert [p.name for p in (place / "pictures").iterdir()] == ["chart.png"]


def test_its_own_comparison_and_pack_files_are_removed_when_the_run_no_longer_has_them(
        place: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.collector.test_collector import FIB, cell, make_config, make_run
    from tests.collector.test_ddtree_vs_dflash import write_run as vs_run
    from tests.collector.test_pack_check import CHECK, patch_config

    vs = vs_run(place / "vs")
    packed = make_run(place / "pack")
    make_config(packed, "h1", "tp1-autoregressive", method="autoregressive", cells=[cell("fib")],
                samples={FIB: [10.0, 12.0, 14.0]})
    check = make_config(packed, "h1", CHECK, method="autoregressive", cells=[cell("fib")],
                        samples={FIB: [9.0, 10.8, 12.6]})
    patch_config(check, pack_check_of="tp1-autoregressive")
    for run_dir, name in ((vs, VS_FILE), (packed, PACK_FILE)):
        for _ in range(2):  # written, then written again over its own
            assert cli.main(["finish", str(run_dir), "--no-plots", "--db", ""]) == cli.DONE
        assert (run_dir / name).is_file()
        shutil.copy(run_dir / name, place / R / name)  # a run that no longer has it: its own file goes
    assert cli.main(["finish", str(place / R), "--no-plots", "--db", ""]) == cli.DONE
    assert not (place / R / VS_FILE).exists() and not (place / R / PACK_FILE).exists()
    capsys.readouterr()


def test_its_own_store_is_built_rebuilt_and_rebuilt_on_a_new_schema(place: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    results = place / S
    db = results / store.DB_FILE
    assert cli.main(["db", "--results", str(results)]) == cli.DONE
    assert cli.main(["db", "--results", str(results), "--rebuild"]) == cli.DONE
    assert ", rebuilt" in capsys.readouterr().out
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = '0123456789abcdef' WHERE key = 'schema'")  # an earlier schema's store
    con.close()
    assert cli.main(["db", "--results", str(results)]) == cli.DONE
    assert ", rebuilt" in capsys.readouterr().out
    assert cli.main(["history", "--results", str(results)]) == cli.DONE
    assert [p.name for p in results.iterdir() if p.name.startswith(".")] == []  # no temporary store left


def test_unpack_replaces_its_own_host_folder_and_its_own_leftovers(place: Path) -> None:
    run_dir = place / R
    (run_dir / HOST / "stale.txt").write_text("from an earlier pull\n")  # its own host folder: replaced whole
    staging = run_dir / f".{HOST}.unpack"
    staging.mkdir()
    (staging / ".specfleet-unpack").touch()
    (staging / "half").write_text("an unpack cut short\n")
    assert cli.main(["unpack", str(run_dir), HOST, str(place / f"{HOST}.tar.gz")]) == cli.DONE
    assert (run_dir / HOST / "events.jsonl").is_file() and not (run_dir / HOST / "stale.txt").exists()
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".")] == []


def test_the_pull_removes_only_the_archives_it_fetched(place: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The place the pull fetches to: an earlier pull's archive there (an earlier specfleet's, or one a pull cut
    short, even before its first byte) is removed before the fetch, and said; nothing there is nothing to do. The
    archive unpacked with --remove-archive goes once its results are in place, and nothing else with it."""
    run_dir, fetched = place / R, place / FETCHED
    free = ["unpack", str(run_dir), HOST, str(fetched), "--before-fetch"]
    for earlier in ((place / f"{HOST}.tar.gz").read_bytes(), b""):
        fetched.write_bytes(earlier)
        capsys.readouterr()
        assert cli.main(free) == cli.DONE
        assert capsys.readouterr().out == f"removed an earlier pull's archive of {HOST}: {fetched}\n"
        assert not os.path.lexists(fetched)
    assert cli.main(free) == cli.DONE and capsys.readouterr().out == ""  # again: nothing to do, nothing said
    shutil.copy(place / f"{HOST}.tar.gz", fetched)
    before = {k: v for k, v in tree(place).items() if not k.startswith(f"{R}/{HOST}/") and k != FETCHED}
    assert cli.main(["unpack", str(run_dir), HOST, str(fetched), "--remove-archive"]) == cli.DONE
    assert not os.path.lexists(fetched) and (run_dir / HOST / "events.jsonl").is_file()
    assert {k: v for k, v in tree(place).items() if not k.startswith(f"{R}/{HOST}/")} == before
    fetched.write_bytes(b"not an archive\n")  # one it cannot unpack is left as it is
    assert cli.main(["unpack", str(run_dir), HOST, str(fetched), "--remove-archive"]) == cli.REFUSED
    assert fetched.read_bytes() == b"not an archive\n"


@pytest.mark.parametrize("name", sorted(REPORT_FILES))
def test_a_direct_caller_of_report_write_is_refused_as_the_command_is(name: str, place: Path) -> None:
    """collector.report.write checks the run folder itself: a caller that is not the command line (a notebook, a
    script) cannot overwrite a report file of the user's either."""
    from collector.load import load_run
    from collector.outputs.own import Foreign
    from collector.report import write

    run_dir = place / R
    foreign = _file(f"{R}/{name}")(place)
    before = tree(place)
    with pytest.raises(Foreign) as refused:
        write(run_dir, load_run(run_dir), plots=False)
    assert str(foreign) in str(refused.value) and "left as it is" in str(refused.value)
    assert tree(place) == before
