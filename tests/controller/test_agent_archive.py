"""The agent as one archive (controller/agent_archive.py): deterministic, runnable as a script from any folder,
carrying bytecode that a host on the same Python uses and a host on another ignores, and a cached copy is used
only when its bytes are the ones built."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from controller import agent_archive

ROOT = Path(__file__).resolve().parents[2]


def test_same_sources_same_bytes_and_every_module_inside(tmp_path: Path) -> None:
    a, b = agent_archive.archive_bytes(ROOT), agent_archive.archive_bytes(ROOT)
    assert a == b
    path = agent_archive.build(ROOT, tmp_path)
    assert path.read_bytes() == a and path.name.startswith("agent-") and path.suffix == ".pyz"
    names = zipfile.ZipFile(path).namelist()
    assert names[0] == "__main__.py"
    sources = list((ROOT / "agent").glob("*.py"))
    assert sorted(names[1:]) == sorted([f"agent/{p.name}" for p in sources] + [f"agent/{p.stem}.pyc" for p in sources])
    assert agent_archive.build(ROOT, tmp_path) == path and len(list(tmp_path.iterdir())) == 1  # reused, no temp left


def test_a_changed_source_gives_another_archive(tmp_path: Path) -> None:
    project = tmp_path / "p"
    (project / "agent").mkdir(parents=True)
    for src in (ROOT / "agent").glob("*.py"):
        (project / "agent" / src.name).write_bytes(src.read_bytes())
    first = agent_archive.build(project, tmp_path / "cache")
    (project / "agent" / "records.py").write_text((project / "agent" / "records.py").read_text() + "\n# edited\n")
    second = agent_archive.build(project, tmp_path / "cache")
    assert first != second and first.exists() and second.exists()


def test_a_tampered_cached_copy_is_rewritten(tmp_path: Path) -> None:
    path = agent_archive.build(ROOT, tmp_path)
    path.write_bytes(b"not the agent")
    assert agent_archive.build(ROOT, tmp_path) == path
    assert path.read_bytes() == agent_archive.archive_bytes(ROOT)


def test_the_archive_runs_the_agent_and_no_other_copy_shadows_it(tmp_path: Path) -> None:
    path = agent_archive.build(ROOT, tmp_path / "cache")
    shadow = tmp_path / "work" / "agent"  # an older agent package in the working folder, as an earlier layout left
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    (shadow / "__main__.py").write_text("raise SystemExit('the stale copy ran')\n")
    res = subprocess.run([sys.executable, str(path), "schemas", "--out", str(tmp_path / "schemas")],
                         cwd=shadow.parent, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    made = sorted(p.name for p in (tmp_path / "schemas").iterdir())
    assert made == sorted(p.name for p in (ROOT / "schemas").iterdir())


def test_no_agent_package_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no agent package"):
        agent_archive.archive_bytes(tmp_path)


def test_controllers_in_other_processes_build_the_same_bytes(tmp_path: Path) -> None:
    """Bytecode is part of the archive: two controller processes (other hash seeds) must still build the same
    bytes, or every run would copy the agent again."""
    code = "import sys; from pathlib import Path; from controller import agent_archive; " \
           "sys.stdout.buffer.write(agent_archive.archive_bytes(Path(sys.argv[1])))"
    built = {hashlib.sha256(subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=ROOT, capture_output=True,
                                           check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout).hexdigest()
             for seed in ("1", "2", "random")}
    assert built == {hashlib.sha256(agent_archive.archive_bytes(ROOT)).hexdigest()}  # digests: no diff of 270 KB


WHERE = "import agent.__main__ as m, agent.records as r; print(r.__file__); print(m.__file__)"


def test_a_host_on_this_python_runs_the_bytecode_and_another_the_source(tmp_path: Path) -> None:
    """The same interpreter loads each module from its pyc; an interpreter of another version finds a foreign
    magic number (here: the archive's pyc made foreign) and compiles the source, and the agent still runs."""
    path = agent_archive.build(ROOT, tmp_path / "cache")
    res = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(path)!r}); {WHERE}"],
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    assert [line.rsplit("/", 1)[1] for line in res.stdout.split()] == ["records.pyc", "__main__.pyc"]
    foreign = tmp_path / "foreign.pyz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(foreign, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            out.writestr(info, b"\x00\x00" + data[2:] if info.filename.endswith(".pyc") else data)
    res = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(foreign)!r}); {WHERE}"],
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    assert [line.rsplit("/", 1)[1] for line in res.stdout.split()] == ["records.py", "__main__.py"]
    run = subprocess.run([sys.executable, str(foreign), "schemas", "--out", str(tmp_path / "schemas")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    made = sorted(p.name for p in (tmp_path / "schemas").iterdir())
    assert made == sorted(p.name for p in (ROOT / "schemas").iterdir())
