"""Results on disk: atomic writes leave the old file or the new one, secrets are redacted and scrubbed, and
events are appended as whole JSON lines."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.records import Event
from agent.store import (
    REDACTED,
    HostStore,
    read_json,
    redact_argv,
    redact_env,
    scrub,
    secret_values,
    write_atomic,
    write_json,
    write_jsonl,
)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- write_atomic -------------------------------------------------------------------------------------


def test_write_atomic_creates_the_parents_and_writes_the_bytes_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "status.json"
    write_atomic(path, b"first\x00\xff")
    assert path.read_bytes() == b"first\x00\xff"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_atomic(path, b"second")
    assert path.read_bytes() == b"second" and leftovers(path.parent) == []


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    """The write itself fails (a file size limit, which root does not bypass) after part of the data is out."""
    path = tmp_path / "status.json"
    path.write_bytes(b"old")
    script = ("import resource, signal, sys\nfrom pathlib import Path\nfrom agent.store import write_atomic\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
              "try:\n    write_atomic(Path(sys.argv[1]), b'x' * 100000)\n"
              "except OSError as exc:\n    print(type(exc).__name__, exc.errno)\n    sys.exit(3)\n")
    res = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3, res.stderr
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_data_that_cannot_be_written_keeps_the_old_file(tmp_path: Path) -> None:
    class Unwritable:
        """Not bytes: the file's write raises TypeError."""

    path = tmp_path / "status.json"
    path.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomic(path, Unwritable())  # type: ignore[arg-type]
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_an_interrupted_fsync_or_a_failed_rename_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     step: str) -> None:
    def fail(*args: object) -> None:
        raise KeyboardInterrupt if step == "fsync" else OSError(28, "No space left on device")

    path = tmp_path / "status.json"
    path.write_bytes(b"old")
    monkeypatch.setattr(os, step, fail)
    with pytest.raises(KeyboardInterrupt if step == "fsync" else OSError):
        write_atomic(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []


# -- JSON ---------------------------------------------------------------------------------------------


def test_write_json_is_sorted_indented_with_a_final_newline_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "x" / "config.json"
    obj = {"b": [1, 2.5, None], "a": {"d": True, "c": "é"}}
    write_json(path, obj)
    assert path.read_text() == json.dumps(obj, indent=2, sort_keys=True) + "\n"
    assert path.read_text().index('"a"') < path.read_text().index('"b"')
    assert read_json(path) == obj


def test_write_jsonl_writes_one_sorted_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    rows = [{"rep": 0, "ok": True}, {"rep": 1, "ok": False, "error": "line\nbreak"}]
    write_jsonl(path, iter(rows))
    lines = path.read_text().splitlines()
    assert lines == ['{"ok": true, "rep": 0}', '{"error": "line\\nbreak", "ok": false, "rep": 1}']
    assert [json.loads(line) for line in lines] == rows
    write_jsonl(path, [])
    assert path.read_bytes() == b""


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} trailing', "\x00\x00\x00\x00"])
def test_read_json_of_a_malformed_file_is_none(tmp_path: Path, text: str) -> None:
    (tmp_path / "status.json").write_text(text)
    assert read_json(tmp_path / "status.json") is None


def test_read_json_of_a_missing_file_is_none(tmp_path: Path) -> None:
    assert read_json(tmp_path / "nope" / "status.json") is None


def test_read_json_of_a_file_that_is_not_utf8_is_none(tmp_path: Path) -> None:
    (tmp_path / "status.json").write_bytes(b'{"a": "\xff\xfe"}')
    assert read_json(tmp_path / "status.json") is None


# -- redaction ----------------------------------------------------------------------------------------


def test_redact_env_hides_secret_looking_keys_in_any_case() -> None:
    env = {"HF_TOKEN": "hf_abc", "my_secret": "s", "DB_Password": "p", "OPENAI_API_KEY": "k", "apikey": "k2",
           "AWS_CREDENTIALS": "c", "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1", "KEYBOARD": "us"}
    assert redact_env(env) == {**{k: REDACTED for k in list(env)[:6]},
                               "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1", "KEYBOARD": "us"}
    assert env["HF_TOKEN"] == "hf_abc"  # a copy; the input is left alone


def test_redact_argv_hides_values_of_secret_flags_in_both_forms() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "sk-1", "--hf-token=hf_2", "--token", "t3", "--port", "8000",
            "--api-key-file", "/k", "--tokenizer", "tok"]
    assert redact_argv(argv) == ["vllm", "serve", "m", "--api-key", REDACTED, f"--hf-token={REDACTED}", "--token",
                                 REDACTED, "--port", "8000", "--api-key-file", "/k", "--tokenizer", "tok"]


def test_a_secret_flag_at_the_end_hides_nothing_after_it() -> None:
    assert redact_argv(["serve", "--api-key"]) == ["serve", "--api-key"]


def test_secret_values_are_what_redaction_hides() -> None:
    env = {"HF_TOKEN": "hf_env", "EMPTY_SECRET": "", "PATH": "/usr/bin"}
    argv = ["serve", "--api-key", "sk-arg", "--token=tok-eq", "--port", "1", "--hf-token"]
    assert sorted(secret_values(env, argv)) == ["hf_env", "sk-arg", "tok-eq"]
    assert secret_values({"PATH": "/x"}, ["serve", "--port", "1"]) == []


def test_scrub_replaces_every_occurrence_of_secrets_of_four_characters_or_more() -> None:
    text = "key=sk-1234 again sk-1234; abcd and abc"
    assert scrub(text, ["sk-1234", "abcd", "abc", ""]) == f"key={REDACTED} again {REDACTED}; {REDACTED} and abc"
    assert scrub("short xyz", ["xyz"]) == "short xyz"


def test_scrub_removes_a_secret_whole_when_another_secret_is_part_of_it() -> None:
    assert scrub("token sk-1234-rest-of-it", ["sk-1234", "sk-1234-rest-of-it"]) == f"token {REDACTED}"


# -- HostStore ----------------------------------------------------------------------------------------


def test_host_store_lays_out_one_folder_per_host_and_config(tmp_path: Path) -> None:
    store = HostStore(tmp_path / "results", "gpu-1", invocation="inv1")
    assert store.dir == tmp_path / "results" / "gpu-1" and store.dir.is_dir()
    assert store.config_dir("base-tp1") == store.dir / "base-tp1"
    assert store.status("base-tp1") is None
    write_json(store.config_dir("base-tp1") / "status.json", {"status": "ok"})
    assert store.status("base-tp1") == {"status": "ok"}


def test_events_are_appended_as_json_lines_with_time_name_and_invocation(tmp_path: Path) -> None:
    store = HostStore(tmp_path, "h", invocation="abc")
    store.event(Event.CONFIG_START, config_id="c1", port=8000)
    HostStore(tmp_path, "h", invocation="def").event(Event.SUITE_END)
    first, second = [json.loads(line) for line in (tmp_path / "h" / "events.jsonl").read_text().splitlines()]
    assert {k: v for k, v in first.items() if k != "t"} == {"event": "config_start", "invocation": "abc",
                                                            "config_id": "c1", "port": 8000}
    assert first["t"].endswith("+00:00") and second["event"] == "suite_end" and second["invocation"] == "def"


def test_an_unknown_event_is_refused_and_nothing_written(tmp_path: Path) -> None:
    store = HostStore(tmp_path, "h")
    with pytest.raises(ValueError):
        store.event("config_started")  # type: ignore[arg-type]
    assert not (tmp_path / "h" / "events.jsonl").exists()


def test_concurrent_writers_give_only_whole_lines(tmp_path: Path) -> None:
    store = HostStore(tmp_path, "h", invocation="i")
    threads, per_thread = 8, 50

    def writer(n: int) -> None:
        for i in range(per_thread):
            store.event(Event.CONFIG_END, writer=n, i=i, pad=str(n) * 5000)

    workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    lines = (tmp_path / "h" / "events.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == threads * per_thread
    assert sorted((r["writer"], r["i"]) for r in rows) == [(n, i) for n in range(threads) for i in range(per_thread)]
    assert all(r["pad"] == str(r["writer"]) * 5000 for r in rows)


def test_tokenizer_settings_are_not_secrets() -> None:
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_TOKEN": "hf_abcdefgh"}
    assert redact_env(env) == {"TOKENIZERS_PARALLELISM": "false", "HF_TOKEN": "<redacted>"}
    assert secret_values(env, []) == ["hf_abcdefgh"]
