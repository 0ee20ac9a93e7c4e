"""The pure parts of the systemd backend: instance names, the EnvironmentFile's encoding, unit names and `owns`.
(Starting and stopping real units is covered by the test-host integration tests.)"""
from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest

from agent import systemd
from agent.systemd import SystemdServer, decode_env_file, env_file_text, instance_name


@pytest.mark.parametrize(("text", "name"), [
    ("p1-eagle-tp1", "p1-eagle-tp1"),
    ("Phase_2.ngram-n4", "Phase_2.ngram-n4"),
    ("a/b c:d@e\\f", "a_b_c_d_e_f"),
    ("ë$%\n", "____"),
])
def test_instance_name_replaces_characters_outside_the_allowed_set(text: str, name: str) -> None:
    assert instance_name(text) == name


ARGV = ["/opt/specfleet/engine/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--chat-template",
        "{{ 'it''s' }} \"quoted\" $HOME ${X} %h %% `cmd` \\n", "--served-model-name", "modèle 名前 🚀",
        "--line", "one\ntwo\r\n\tthree", "", "=", "--api-key", "a=b=c"]
ENV = {"SPECFLEET_MARK": "run/1", "WEIRD": "$PATH %i 'x' \"y\" \\ \n end", "UNICODE": "ünï", "EMPTY": ""}


def test_env_file_round_trips_any_argument_and_value() -> None:
    text = env_file_text(ARGV, ENV)
    assert decode_env_file(text) == {"argv": ARGV, "env": ENV}
    assert decode_env_file(env_file_text([], {})) == {"argv": [], "env": {}}


def test_env_file_is_one_line_of_base64_that_systemd_cannot_reinterpret() -> None:
    text = env_file_text(ARGV, ENV)
    assert text.endswith("\n") and text.count("\n") == 1
    assert re.fullmatch(r"SPECFLEET_LAUNCH=[A-Za-z0-9+/]+=*\n", text)
    base64.b64decode(text.split("=", 1)[1].strip(), validate=True)


def test_unit_and_env_file_are_named_after_the_engine_and_the_instance(tmp_path: Path) -> None:
    server = SystemdServer("sglang", "p1/eagle tp2", ["x"], {}, tmp_path / "server.log", 8000, env_dir=tmp_path)
    assert server.unit == "specfleet-sglang@p1_eagle_tp2.service"
    assert server.env_path == tmp_path / "p1_eagle_tp2.env"
    assert server.pid is None and server.invocation is None and server.headers == {}
    assert SystemdServer("vllm", "c1", [], {}, tmp_path / "l", 1).env_path == Path("/etc/specfleet/units/c1.env")


def test_this_process_and_a_missing_pid_are_not_owned(tmp_path: Path) -> None:
    server = SystemdServer("vllm", "c1", [], {}, tmp_path / "server.log", 8000, env_dir=tmp_path)
    assert Path(f"/proc/{os.getpid()}/cgroup").read_text()  # the check reads a real file here
    assert not server.owns(os.getpid())
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert not Path(f"/proc/{pid_max + 1}").exists()
    assert not server.owns(pid_max + 1)


def test_a_pid_in_the_units_cgroup_is_owned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What /proc/<pid>/cgroup holds for a process of the instance (cgroup v2)."""
    cgroups = {1: "0::/system.slice/system-specfleet\\x2dvllm.slice/specfleet-vllm@c1.service\n",
               2: "0::/system.slice/system-specfleet\\x2dvllm.slice/specfleet-vllm@c12.service\n",
               3: "0::/user.slice/user-0.slice/session-1.scope\n"}
    monkeypatch.setattr(systemd, "_cgroup", lambda pid: cgroups.get(pid, ""))
    server = SystemdServer("vllm", "c1", [], {}, tmp_path / "server.log", 8000, env_dir=tmp_path)
    assert [pid for pid in (1, 2, 3, 4) if server.owns(pid)] == [1]
