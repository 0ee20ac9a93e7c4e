"""A real full filesystem for the tests: a small tmpfs mounted for the test, and every free byte of it taken."""
from __future__ import annotations

import errno
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def fill(folder: Path) -> Path:
    """Take every free byte of the filesystem holding `folder`: the filler file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


@contextmanager
def tmpfs(folder: Path, size: str = "16m") -> Iterator[Path]:
    """A tmpfs of `size` mounted on `folder`, unmounted at the end whatever happens."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "specfleet-test", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
