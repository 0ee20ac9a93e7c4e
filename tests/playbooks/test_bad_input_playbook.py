"""Bad extra vars, inventories and matrices through the real `ansible-playbook bench.yml`: each run fails
before anything reaches the host (no agent, no events, no engine process), exits non-zero and prints a
message naming the field. Cases the validator reports together share one run."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests import playbook

from .conftest import ROOT, Bench

PLANTED = "hf_PlantedInBadInput0123456789abcdef"


def processes_under(marker: str) -> list[int]:
    """Processes (other than this one) whose command line or environment mentions `marker`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


def assert_nothing_started(bench: Bench, res: subprocess.CompletedProcess[str]) -> str:
    """Non-zero exit, nothing on the host or the controller, no process left; returns all output."""
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert not bench.host_dir.exists(), "the host was touched: " + str(list(bench.host_dir.rglob("*"))[:10])
    assert not list(bench.tmp.rglob("events.jsonl"))
    assert not bench.results.exists()
    assert processes_under(str(bench.host_dir)) == []
    return out


def inventory(bench: Bench, host_vars: str) -> Path:
    """A one-host inventory (`badhost`, this machine) whose host_vars file holds `host_vars` verbatim."""
    inv = bench.tmp / "inventory"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"badhost": {
        "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "bench_host_dir": str(bench.host_dir), "bench_agent_python": "{{ ansible_playbook_python }}"}}}}))
    (inv / "host_vars" / "badhost.yml").write_text(host_vars)
    return inv / "hosts.yml"


def run_badhost(bench: Bench, host_vars: str) -> subprocess.CompletedProcess[str]:
    inv = inventory(bench, host_vars)
    return playbook.play(bench.args({}, "-i", str(inv), limit="badhost"), timeout=120).proc


GOOD_HOST_VARS = {
    "bench_engine": "vllm", "bench_engine_python": "/nonexistent/python", "bench_gpu_count": 0,
    "bench_model": {"name": "m", "path": "/nonexistent/model", "max_model_len": 1024},
    "bench_phases": [{"name": "tp1", "configs": [{"method": "autoregressive"}], "sweeps": [{"workloads": ["fib"]}]}],
}


def test_the_test_inventory_is_valid_as_written(bench: Bench) -> None:
    """The control for the inventory cases below: unchanged, its host plans fine (plan mode touches no host)."""
    inv = inventory(bench, yaml.safe_dump(GOOD_HOST_VARS))
    res = playbook.play(bench.args({"plan": True}, "-i", str(inv), limit="badhost"), timeout=120).proc
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "Plan for badhost: 1 configs" in res.stdout
    assert not bench.host_dir.exists()


def test_bad_yaml_in_an_extra_vars_file(bench: Bench) -> None:
    bad = bench.tmp / "bad.yml"
    bad.write_text("bench_repetitions: 2\nbench_phases: [\n  - {name: tp1\n")
    out = assert_nothing_started(bench, bench.run({}, "-e", f"@{bad}", timeout=120))
    assert "YAML parsing failed" in out
    assert f"{bad}:3:" in out  # the file and the line


def test_extra_vars_of_the_wrong_type_fail_the_role_argument_spec(bench: Bench) -> None:
    """`-e name=value` strings and JSON extra vars checked by meta/argument_specs.yml, all reported at once."""
    res = bench.run({}, "-e", "bench_repetitions=abc", "-e", '{"bench_phases": "x"}', "-e", "bench_engine=tgi",
                    "-e", "bench_gpu_count=[2]", timeout=120)
    out = assert_nothing_started(bench, res)
    assert "Validation of arguments failed" in out
    assert "argument 'bench_repetitions' is of type str and we were unable to convert to int" in out
    assert "option 'bench_phases' is of type str and we were unable to convert to dict" in out
    assert "value of bench_engine must be one of: vllm, sglang, llamacpp, got: tgi" in out
    assert "argument 'bench_gpu_count' is of type str and we were unable to convert to int" in out


def test_malformed_matrix_reports_every_field_at_once_and_no_secret(bench: Bench) -> None:
    """Types the argument spec cannot see (inside bench_phases, bench_sampling, bench_env): one run, one line
    per field with what is allowed; the planted token of a wrongly typed secret env value is printed nowhere."""
    bad: dict[str, Any] = {
        "bench_phases": [{"name": "tp1", "tp": "1", "configs": [{"method": "autoregressive"},
                                                                {"method": "medusa"},
                                                                {"method": "ngram", "num_speculative_tokens": 0},
                                                                {"method": "ddtree"}],
                          "sweeps": [{"workloads": [], "max_tokens": [-1], "concurrency": [0], "speed": 2}]},
                         {"name": "tp2", "configs": [], "sweeps": []}],
        "bench_sampling": {"temperature": 0.0, "top_p": 0.9},
        "bench_timeouts": {"health_s": 0, "request_s": 60, "stop_s": 30, "release_s": 30},
        "bench_env": {"HF_HUB_OFFLINE": "1", "HF_TOKEN": [PLANTED]},
    }
    out = assert_nothing_started(bench, bench.run(bad, timeout=120))
    expected = [
        "bench_env.HF_TOKEN: a list (value not shown: may be a secret) is not of type 'string', 'number' or "
        "'boolean'; allowed: a string, a number or a boolean",
        "bench_phases[0].configs[1].method: 'medusa' is not one of autoregressive, ngram, draft_model, eagle, "
        "eagle3, mtp, dflash, ddtree",
        "bench_phases[0].configs[2].num_speculative_tokens: 0 is less than the minimum of 1; "
        "allowed: an integer from 1 to 64",
        "bench_phases[0].configs[3].budget: is required for method ddtree; allowed: an integer from 1 to 1024",
        "bench_phases[0].sweeps[0].concurrency[0]: 0 is less than the minimum of 1; allowed: an integer from 1 to 4096",
        "bench_phases[0].sweeps[0].max_tokens[0]: -1 is less than the minimum of 1; allowed: an integer from 1 to "
        "1048576",
        "bench_phases[0].sweeps[0].speed: unknown key; allowed keys: arrival, concurrency, context_tokens, "
        "duration_s, max_tokens",
        "bench_phases[0].sweeps[0].workloads: [] should be non-empty (at least 1 item)",
        "bench_phases[0].tp: '1' is not of type 'integer'; allowed: an integer >= 1",
        "bench_phases[1].configs: [] should be non-empty (at least 1 item)",
        "bench_phases[1].sweeps: [] should be non-empty (at least 1 item)",
        "bench_sampling.top_p: unknown key; allowed keys: ignore_eos, temperature",
        "bench_timeouts.health_s: 0 is less than or equal to the minimum of 0; allowed: a number > 0",
    ]
    missing = [e for e in expected if e not in out]
    assert not missing, f"missing {missing} in:\n{out[-6000:]}"
    assert "invalid benchmark matrix for local" in out
    assert PLANTED not in out


def test_unknown_phase_selected(bench: Bench) -> None:
    out = assert_nothing_started(bench, bench.run({"phases": "tp9"}, timeout=120))
    assert "phases: unknown phase 'tp9'; allowed: tp1" in out


def test_bad_run_id(bench: Bench) -> None:
    out = assert_nothing_started(bench, bench.run({"run_id": "../escape"}, timeout=120))
    assert "run_id: '../escape' is not a valid run id; allowed: letters, digits, '.', '_' and '-'" in out


def test_switches_ids_paths_and_run_limits_are_checked_before_any_host(bench: Bench) -> None:
    """A typo in a switch does not mean false (plan mode would silently become the real suite); a run id with a
    trailing newline or of 300 characters, a relative host folder, negative run-only limits: all in one run."""
    res = bench.run({"bench_host_dir": "relative/specfleet"}, "-e", "plan=ture", "-e", "force=maybe",
                    "-e", '{"run_id": "r1\\n"}', "-e", "bench_async_s=-5", "-e", "bench_follow_timeout_s=-1",
                    timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and not (ROOT / "playbooks/relative").exists()
    for line in ["plan: 'ture' is not a boolean; allowed: true, false, yes, no, 1, 0 (e.g. -e plan=true)",
                 "force: 'maybe' is not a boolean; allowed: true, false, yes, no, 1, 0",
                 "run_id: 'r1\\n' is not a valid run id; allowed: letters, digits",
                 "bench_host_dir: 'relative/specfleet' is not an absolute path; allowed: an absolute path",
                 "bench_async_s: '-5' is not a positive whole number of seconds; allowed: an integer >= 1",
                 "bench_follow_timeout_s: '-1' is not a positive whole number of seconds"]:
        assert line in out, f"{line!r} not in:\n{out[-4000:]}"
    assert "Traceback" not in out and "Plan for local" not in out
    out = assert_nothing_started(bench, bench.run({"run_id": "r" * 300}, timeout=120))
    assert "is not a valid run id; allowed: letters, digits, '.', '_' and '-', starting with a letter or digit, at " \
           "most 64 characters" in out


def test_phases_as_a_number_is_an_unknown_phase_not_a_crash(bench: Bench) -> None:
    out = assert_nothing_started(bench, bench.run({"phases": 5}, timeout=120))
    assert "phases: unknown phase '5'; allowed: tp1" in out
    assert "Tagged" not in out and "not iterable" not in out and "Traceback" not in out


def test_numbers_names_environment_and_limits_in_one_run(bench: Bench) -> None:
    """Non-finite and whole-float numbers, control characters in names, bad environment names and a NUL byte:
    every field named at once (the schema's classes); then the cross-field limits, which follow it."""
    bad: dict[str, Any] = {
        "bench_sampling": {"temperature": float("nan")},
        "bench_timeouts": {"health_s": float("inf")},
        "bench_env": {"1BAD": "x", "MY VAR": "y", "A=B": "z", "OK": "nul\x00here"},
        "bench_phases": [{"name": "tp1\n", "tp": 1.0, "configs": [
            {"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 3.0, "id": "k3\x07"}],
            "sweeps": [{"workloads": ["fib"]}]}],
    }
    out = assert_nothing_started(bench, bench.run(bad, timeout=120))
    for line in ["bench_sampling.temperature: .nan (not a number) is not a finite number; allowed: a number >= 0 (a "
                 "finite number)",
                 "bench_timeouts.health_s: .inf (infinity) is not a finite number; allowed: a number > 0 and <= 604800 "
                 "(a finite number)",
                 "bench_env: '1BAD' is not a valid environment variable name",
                 "bench_env: 'MY VAR' is not a valid environment variable name",
                 "bench_env: 'A=B' is not a valid environment variable name",
                 "bench_env.OK: contains a NUL byte",
                 "bench_phases[0].name: 'tp1\\n' is not a valid name",
                 "bench_phases[0].tp: 1.0 is not of type 'integer'; allowed: an integer >= 1 (a whole number "
                 "written as 1.0: write 1)",
                 "bench_phases[0].configs[1].num_speculative_tokens: 3.0 is not of type 'integer'",
                 "bench_phases[0].configs[1].id: 'k3\\x07' is not a valid name"]:
        assert line in out, f"{line!r} not in:\n{out[-5000:]}"
    limits = {"bench_warmup_max_tokens": 2048, "bench_phases": [{"name": "tp1", "configs": [
        {"method": "autoregressive"},
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}],
        "sweeps": [{"workloads": ["fib"], "max_tokens": [32]}]}]}
    out = assert_nothing_started(bench, bench.run(limits, timeout=120))
    assert "bench_warmup_max_tokens: 2048 tokens after the warmup prompt" in out
    assert "exceed the model's max_model_len 1024; allowed: at most 1024" in out
    assert "bench_phases[0].configs[1].prompt_lookup_min: prompt_lookup_min 4 is above prompt_lookup_max 2;" in out


def test_exposed_servers_need_a_real_key_and_an_address(bench: Bench) -> None:
    """A placeholder-shaped key (which would skip the length rule) or one of 16 spaces does not expose a server;
    neither does an address that is not one."""
    out = assert_nothing_started(bench, bench.run({"bench_bind_host": "0.0.0.0", "bench_api_key": "<secret:0>"},
                                                  timeout=120))
    assert "bench_api_key: holds text of the form <secret:N>" in out
    out = assert_nothing_started(bench, bench.run({"bench_bind_host": "0.0.0.0", "bench_api_key": " " * 16},
                                                  timeout=120))
    assert "bench_api_key: holds spaces or control characters (value not shown)" in out
    out = assert_nothing_started(bench, bench.run({"bench_bind_host": "0.0.0.0 --x"}, timeout=120))
    assert "bench_bind_host: '0.0.0.0 --x' is not an address; allowed: an IPv4 or IPv6 address or a host name" in out


def test_inventory_host_name_unfit_for_a_folder(bench: Bench) -> None:
    inv = bench.tmp / "inventory-names"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"up..and/over": {
        "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "bench_host_dir": str(bench.host_dir), "bench_agent_python": "{{ ansible_playbook_python }}",
        **GOOD_HOST_VARS}}}}))
    res = playbook.play(bench.args({}, "-i", str(inv / "hosts.yml"), limit="all"), timeout=120).proc
    out = assert_nothing_started(bench, res)
    assert "inventory host 'up..and/over': not usable as a results folder name" in out


def test_inventory_with_a_malformed_host_vars_file(bench: Bench) -> None:
    good = yaml.safe_dump(GOOD_HOST_VARS)
    res = run_badhost(bench, good + "bench_max_tokens: [256\n")
    out = assert_nothing_started(bench, res)
    assert "YAML parsing failed" in out


def test_inventory_host_vars_of_the_wrong_type(bench: Bench) -> None:
    """Types the argument spec catches (all at once), from an inventory's host_vars."""
    host_vars = {**GOOD_HOST_VARS, "bench_model": "tiny-llama", "bench_gpu_count": "eight",
                 "bench_phases": {"name": "tp1"}}
    out = assert_nothing_started(bench, run_badhost(bench, yaml.safe_dump(host_vars)))
    assert "fatal: [badhost]: FAILED!" in out and "Validation of arguments failed" in out
    assert "argument 'bench_model' is of type str and we were unable to convert to dict" in out
    assert "argument 'bench_gpu_count' is of type str and we were unable to convert to int" in out
    assert "argument 'bench_phases' is of type dict and we were unable to convert to list" in out


def test_inventory_host_vars_with_a_malformed_matrix(bench: Bench) -> None:
    """Structure the argument spec cannot see, from an inventory's host_vars: named by the bench_plan action."""
    host_vars = {**GOOD_HOST_VARS, "bench_model": {"name": "m", "max_model_len": 1024},
                 "bench_max_tokens": [0], "bench_draft_model": {"name": "d", "path": "/d", "revison": "x"}}
    out = assert_nothing_started(bench, run_badhost(bench, yaml.safe_dump(host_vars)))
    assert "invalid benchmark matrix for badhost" in out
    assert "bench_model.path: is required; allowed: a non-empty string" in out
    assert "bench_max_tokens[0]: 0 is less than the minimum of 1; allowed: an integer from 1 to 1048576" in out
    assert "bench_draft_model.revison: unknown key; allowed keys: max_model_len, name, path, revision" in out


def test_inventory_host_vars_with_a_misspelled_variable(bench: Bench) -> None:
    """A misspelled bench_* variable would otherwise be silently ignored (the default used instead)."""
    host_vars = {**GOOD_HOST_VARS, "bench_repetitons": 5, "bench_phses": []}
    out = assert_nothing_started(bench, run_badhost(bench, yaml.safe_dump(host_vars)))
    assert "bench_repetitons: unknown variable; did you mean bench_repetitions?" in out
    assert "bench_phses: unknown variable; did you mean bench_phases?" in out
