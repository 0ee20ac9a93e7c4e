"""The bounded server log: whole under the bound; past it the head and the tail kept and the drop said."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from agent.logbound import BoundedLog


def dropped(text: str) -> int:
    match = re.search(r"\[specfleet\] (\d+) bytes of the server's output dropped here", text)
    return int(match.group(1)) if match else 0


def test_under_the_bound_the_log_is_whole_and_on_disk_as_it_grows(tmp_path: Path) -> None:
    log = BoundedLog(tmp_path / "server.log", 1000)
    log.feed(b"a" * 600)
    assert (tmp_path / "server.log").read_bytes() == b"a" * 600
    log.feed(b"b" * 400)
    log.close()
    assert (tmp_path / "server.log").read_bytes() == b"a" * 600 + b"b" * 400


def test_past_the_bound_head_and_tail_are_kept_and_the_drop_counted(tmp_path: Path) -> None:
    log = BoundedLog(tmp_path / "server.log", 1000)
    chunks = [bytes([65 + i % 26]) * 97 for i in range(100)]   # 9700 bytes in odd-sized chunks
    for chunk in chunks:
        log.feed(chunk)
    data = b"".join(chunks)
    live = log.text()
    assert live.endswith(data[-500:].decode()) and live.startswith(data[:500].decode())
    log.close()
    text = (tmp_path / "server.log").read_text()
    assert text.startswith(data[:500].decode()) and text.endswith(data[-500:].decode())
    assert dropped(text) == len(data) - 1000 and text == live


def test_one_chunk_larger_than_the_bound(tmp_path: Path) -> None:
    log = BoundedLog(tmp_path / "server.log", 100)
    log.feed(b"0123456789" * 100)
    log.close()
    text = (tmp_path / "server.log").read_text()
    assert text.startswith("0123456789" * 5) and text.endswith("0123456789" * 5) and dropped(text) == 900


def test_pump_copies_a_real_process_output_until_its_end(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write('x' * 300000 + 'END')"],
                            stdout=subprocess.PIPE)
    log = BoundedLog(tmp_path / "server.log", 10000)
    assert proc.stdout is not None
    log.pump(proc.stdout)
    proc.wait(timeout=30)
    log.close()
    text = (tmp_path / "server.log").read_text()
    assert text.endswith("xEND") and dropped(text) == 300003 - 10000


def test_output_after_close_is_drained_not_kept_and_never_raises(tmp_path: Path) -> None:
    """A writer that outlives the server (one the leftover kill could not find) must neither block nor break the log."""
    log = BoundedLog(tmp_path / "server.log", 1000)
    log.feed(b"kept\n")
    log.close(wait_s=0)
    log.feed(b"late output\n")
    log.close(wait_s=0)
    assert (tmp_path / "server.log").read_bytes() == b"kept\n" and log.after_close == len(b"late output\n")
    assert log.text() == "kept\n"
