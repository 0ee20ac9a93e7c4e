"""Real artifacts the role tests install: a repository shaped like SGLang's (python/sglang/..., tagged v0.0.1)
with two real patches made by `git diff` (one changes a line, one adds a file), and pure-Python wheels."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Sequence

SPEC_PY = 'ALGORITHMS = ["EAGLE", "DFLASH"]\n\n\ndef supported(name):\n    return name in ALGORITHMS\n'
PATCHES = ("0001-ddtree.patch", "0002-ddtree-budget.patch")


def pyproject(dependencies: Sequence[str] = ()) -> str:
    deps = f"dependencies = {json.dumps(list(dependencies))}\n" if dependencies else ""
    return ('[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "sglang"\nversion = "0.0.1"\n{deps}\n'
            '[tool.setuptools.packages.find]\ninclude = ["sglang*"]\n')


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_GLOBAL": "/dev/null"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_sglang_source(repo: Path, patches: Path, dependencies: Sequence[str] = ()) -> None:
    """`repo` at tag v0.0.1 with a clean tree; `patches` holding the two patches."""
    (repo / "python/sglang/srt").mkdir(parents=True)
    (repo / "python/sglang/__init__.py").write_text('__version__ = "0.0.1"\n')
    (repo / "python/sglang/srt/__init__.py").write_text("")
    (repo / "python/sglang/srt/spec.py").write_text(SPEC_PY)
    (repo / "python/pyproject.toml").write_text(pyproject(dependencies))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "v0.0.1")
    git(repo, "tag", "v0.0.1")
    patches.mkdir(parents=True)
    (repo / "python/sglang/srt/spec.py").write_text(SPEC_PY.replace('"DFLASH"]', '"DFLASH", "DDTREE"]'))
    (patches / PATCHES[0]).write_text(git(repo, "diff"))
    git(repo, "checkout", "-q", "--", ".")
    (repo / "python/sglang/srt/ddtree.py").write_text("BUDGET = 64\n")
    git(repo, "add", "python/sglang/srt/ddtree.py")
    (patches / PATCHES[1]).write_text(git(repo, "diff", "--cached"))
    git(repo, "reset", "-q", "--hard", "v0.0.1")
    git(repo, "clean", "-fdq")


def make_wheel(path: Path, name: str, version: str) -> None:
    """A real (pure-Python) wheel file of `name`, as pip installs it."""
    files = {f"{name}/__init__.py": f'__version__ = "{version}"\n',
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: specfleet-tests\n"
                                                  "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            data = text.encode()
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        record.append(f"{name}-{version}.dist-info/RECORD,,")
        z.writestr(f"{name}-{version}.dist-info/RECORD", "\n".join(record) + "\n")
