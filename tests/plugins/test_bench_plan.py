"""The `bench_plan` action under the real ansible-playbook: a valid suite gives its configs (the plan printed in plan
mode and check mode, never a secret), an invalid one fails the task naming the field."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import playbook

pytestmark = pytest.mark.playbook

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PYTHON = str(BIN / "python")
API_KEY = "sk-live-0123456789abcdefghij"
HF_TOKEN = "hf_QWERTYUIOPasdfghjkl0987"
PLAN_HEAD = re.compile(r"^Plan for localhost: 2 configs, 18 timed requests, estimated \d+:\d\d:\d\d$", re.M)

# The action as roles/bench/tasks/plan.yml calls it, its switches from extra vars (strings, as `-e plan=true`).
PLAY = [{
    "hosts": "all", "gather_facts": False,
    "tasks": [
        {"name": "bench_plan", "register": "planned", "bench_plan": {
            "suite": "{{ suite }}",
            "phases": "{{ phases | default('') }}",
            "plan": "{{ plan | default(false) }}",
            "force": "{{ force | default(false) }}",
            "run_id": "{{ run_id | default('20250101T000000Z') }}",
            "host_dir": "{{ host_dir | default('/var/lib/specfleet') }}",
            "limits": {"bench_async_s": "{{ async_s | default(3600) | int }}", "bench_follow_interval_s": 2}}},
        {"name": "keep the result", "delegate_to": "localhost", "ansible.builtin.copy": {
            "content": "{{ planned | to_json }}", "dest": "{{ result_file }}", "mode": "0600"}},
    ]}]


def suite(**extra: Any) -> dict[str, Any]:
    s = {"engine": "vllm", "engine_python": "/py", "model": {"name": "m", "path": "/m"},
         "api_key": API_KEY, "env": {"HF_TOKEN": HF_TOKEN},
         "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                                 {"method": "ngram", "num_speculative_tokens": 2}],
                     "sweeps": [{"workloads": ["fib"], "max_tokens": [64], "concurrency": [1, 2]}]}]}
    s.update(extra)
    return s


def run_play(tmp: Path, the_suite: dict[str, Any], *extra: str) -> tuple[subprocess.CompletedProcess[str],
                                                                         dict[str, Any] | None]:
    """ansible-playbook -v on the play with `the_suite` (from a vars file) and extra `-e` args; (the run, the
    registered result when the task passed)."""
    (tmp / "play.yml").write_text(yaml.safe_dump(PLAY, sort_keys=False))
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": PYTHON}}}}))
    result_file = tmp / "planned.json"
    (tmp / "vars.json").write_text(json.dumps({"suite": the_suite, "result_file": str(result_file)}))
    res = playbook.play(["-v", "-i", str(tmp / "inventory.yml"), "-e", f"@{tmp / 'vars.json'}", *extra,
                         str(tmp / "play.yml")], env={"ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-local"),
                                                      "ANSIBLE_REMOTE_TMP": str(tmp / "ansible-remote")},
                        timeout=180).proc
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    return res, result


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert API_KEY not in text and HF_TOKEN not in text


def test_a_valid_suite_gives_its_configs_without_printing_the_plan(tmp_path: Path) -> None:
    res, result = run_play(tmp_path, suite(), "-e", "run_id=r-42", "-e", "force=yes")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert result is not None and not result.get("failed")
    assert [c["config_id"] for c in result["configs"]] == ["tp1-autoregressive", "tp1-ngram-k2"]
    assert result["requests"] == 18 and result["estimate_s"] > 0
    assert result["run_id"] == "r-42" and result["force"] is True and result["plan_only"] is False
    assert result["suite"]["api_key"] == "<secret:0>" and result["suite"]["env"]["HF_TOKEN"] == "<secret:1>"
    assert not PLAN_HEAD.search(res.stdout)  # not plan mode, not check mode: nothing printed
    # -v shows the task's result: placeholders only
    assert "<secret:0>" in res.stdout
    assert_no_secret(res.stdout, res.stderr, json.dumps(result))


def test_plan_mode_prints_the_plan(tmp_path: Path) -> None:
    res, result = run_play(tmp_path, suite(), "-e", "plan=true")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert result is not None and result["plan_only"] is True
    head = PLAN_HEAD.search(res.stdout)
    assert head is not None, res.stdout[-4000:]
    plan_text = res.stdout[head.start():]
    assert plan_text.splitlines()[: len(result["plan_lines"])] == result["plan_lines"]
    assert "[1/2] tp1-autoregressive  (vllm, autoregressive" in plan_text
    assert "[2/2] tp1-ngram-k2  (vllm, ngram" in plan_text
    assert "HF_TOKEN='<redacted>'" in plan_text
    assert_no_secret(res.stdout, res.stderr)


def test_check_mode_prints_the_plan_too(tmp_path: Path) -> None:
    res, result = run_play(tmp_path, suite(), "--check", "-e", "phases=tp1")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert PLAN_HEAD.search(res.stdout), res.stdout[-4000:]
    assert result is None  # copy in check mode writes nothing
    assert_no_secret(res.stdout, res.stderr)


def test_an_invalid_suite_fails_naming_the_field(tmp_path: Path) -> None:
    bad = suite()
    bad["phases"][0]["tp"] = 8
    bad["phases"][0]["sweeps"][0]["workloads"] = ["fib", "poem"]
    res, result = run_play(tmp_path, bad, "-e", "plan=true")
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "invalid benchmark matrix for localhost:" in out
    assert "bench_phases[0].tp: 8 is above the host's GPU count (0)" in out
    assert "bench_phases[0].sweeps[0].workloads[1]: unknown workload 'poem'" in out
    assert not PLAN_HEAD.search(res.stdout)
    assert result is None
    assert_no_secret(out)


def test_bad_switches_and_unknown_variables_fail_naming_them(tmp_path: Path) -> None:
    res, result = run_play(tmp_path, suite(), "-e", "plan=ture", "-e", "bench_repetiton=2",
                           "-e", "run_id=bad/id", "-e", "async_s=0")
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "bench_repetiton: unknown variable; did you mean bench_repetitions?" in out
    assert "plan: 'ture' is not a boolean; allowed: true, false, yes, no, 1, 0 (e.g. -e plan=true)" in out
    assert "run_id: 'bad/id' is not a valid run id" in out
    assert "bench_async_s: 0 is not a positive whole number of seconds" in out
    assert result is None
