"""The peer sweep's pure parts: the matrix both ways, vLLM's metadata shim, the command lines, the arithmetic."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agent.workloads import PROMPTS
from benchmarks import peer_sweep as ps

LOCAL = """\
bench_host_dir: "{{ specfleet_root }}/.work/hosts/local"
bench_server_args: [--dtype, bfloat16, --max-model-len, "1024", --enforce-eager]
bench_env:
  VLLM_CPU_KVCACHE_SPACE: "1"
  TMPDIR: "{{ bench_host_dir }}/tmp"
"""


def test_sixteen_requests_are_every_workload_four_times():
    assert ps.request_plan(16) == (sorted(PROMPTS), 4)
    assert ps.request_plan(2) == (sorted(PROMPTS)[:2], 1)
    with pytest.raises(ValueError):
        ps.request_plan(6)
    with pytest.raises(ValueError):
        ps.request_plan(0)


def test_dataset_holds_specfleets_prompts_as_often_as_it_sends_them(tmp_path):
    rows = ps.dataset_rows(16, 128)
    assert len(rows) == 16
    assert all(r["output_tokens"] == 128 for r in rows)
    sent = [PROMPTS[w] for w in sorted(PROMPTS)] * 4
    assert [r["prompt"] for r in rows] == sent
    path = ps.write_dataset(tmp_path / "d" / "dataset.jsonl", rows)
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows  # JSONL, one request a line, as `--dataset-name custom` reads


def test_specfleet_vars_give_the_same_matrix():
    extra = ps.specfleet_vars(list(ps.DEFAULT_CONFIGS), 16, 128)
    [phase] = extra["bench_phases"]
    assert phase["name"] == "tp1" and phase["tp"] == 1
    assert phase["configs"] == [{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2},
                                {"method": "ngram", "num_speculative_tokens": 4}]
    [sweep] = phase["sweeps"]
    requests = len(sweep["workloads"]) * len(sweep["max_tokens"]) * len(sweep["context_tokens"]) \
        * extra["bench_repetitions"]
    assert requests == 16 and sweep["concurrency"] == [1] and sweep["context_tokens"] == [0]
    assert extra["bench_max_tokens"] == [128] == sweep["max_tokens"]
    assert extra["bench_sampling"] == {"temperature": 0.0, "ignore_eos": True}
    assert "bench_pack" not in extra and "bench_slots" not in extra
    packed = ps.specfleet_vars(["plain"], 16, 128, ["0", "1"])
    assert packed["bench_pack"] is True and packed["bench_slots"] == [{"cpus": "0"}, {"cpus": "1"}]


def test_specfleet_command():
    cmd = ps.specfleet_command("peer-x-0", {"bench_max_tokens": [128]})
    assert cmd[:6] == ["ansible-playbook", "bench.yml", "-l", "local", "-e", "run_id=peer-x-0"]
    assert cmd[6] == "-e" and json.loads(cmd[7]) == {"bench_max_tokens": [128]}


def test_local_profile_fills_its_templates(tmp_path):
    args, env = ps.local_profile(LOCAL, root=tmp_path)
    assert args == ["--dtype", "bfloat16", "--max-model-len", "1024", "--enforce-eager"]
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "1", "TMPDIR": f"{tmp_path}/.work/hosts/local/tmp"}
    with pytest.raises(ValueError):
        ps.local_profile(LOCAL + "  OTHER: '{{ unknown }}'\n", root=tmp_path)


def test_local_profile_reads_the_real_host_vars():
    args, env = ps.local_profile()
    assert "--max-model-len" in args and "VLLM_CPU_KVCACHE_SPACE" in env
    assert not any("{{" in v for v in [*args, *env.values()])


def test_serve_params_are_specfleets_launch_flags():
    params = ps.serve_params(list(ps.DEFAULT_CONFIGS))
    assert params[0] == {"_benchmark_name": "plain"}
    k2 = params[1]
    assert k2["_benchmark_name"] == "ngram-k2"
    assert k2["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
                                        "prompt_lookup_min": 2}
    assert k2["per_request_spec_decode_metrics"] == "summary"
    assert params[2]["speculative_config"]["num_speculative_tokens"] == 4
    assert params[2]["speculative_config"]["prompt_lookup_max"] == 4
    json.dumps(params)  # the sweep reads them from a JSON file


def test_sweep_command_line():
    vllm, model, data = Path("/e/bin/vllm"), Path("/m/target"), Path("/o/dataset.jsonl")
    serve = ps.serve_command(8123, ["--dtype", "bfloat16"], vllm, model)
    assert serve == ["/e/bin/vllm", "serve", "/m/target", "--host", "127.0.0.1", "--port", "8123",
                     "--tensor-parallel-size", "1", "--dtype", "bfloat16"]
    assert serve[0].endswith("vllm")  # so the sweep resets the server's caches after a run itself
    bench = ps.bench_command(8123, data, 16, 128, vllm, model)
    assert bench[:3] == ["/e/bin/vllm", "bench", "serve"]
    for flag, value in [("--port", "8123"), ("--dataset-name", "custom"), ("--dataset-path", str(data)),
                        ("--num-prompts", "16"), ("--custom-output-len", "128"), ("--temperature", "0"),
                        ("--max-concurrency", "1"), ("--model", "/m/target"), ("--backend", "vllm")]:
        assert bench[bench.index(flag) + 1] == value
    for flag in ("--ignore-eos", "--skip-chat-template", "--disable-shuffle"):
        assert flag in bench
    sweep = ps.sweep_command(serve, bench, Path("/o/sp.json"), Path("/o/vllm"), "pair3", vllm)
    assert sweep[:4] == ["/e/bin/vllm", "bench", "sweep", "serve"]
    assert shlex.split(sweep[sweep.index("--serve-cmd") + 1]) == serve
    assert shlex.split(sweep[sweep.index("--bench-cmd") + 1]) == bench
    assert sweep[sweep.index("--serve-params") + 1] == "/o/sp.json"
    assert sweep[sweep.index("--num-runs") + 1] == "1"
    assert sweep[sweep.index("-o") + 1] == "/o/vllm" and sweep[sweep.index("-e") + 1] == "pair3"


def test_shim_version_carries_cpu():
    assert ps.shim_version("0.32.0") == "0.32.0+cpu"
    assert ps.shim_version("0.32.0+cpu") == "0.32.0+cpu"
    assert ps.shim_version("0.32.0+cu128") == "0.32.0+cpu"
    with pytest.raises(ValueError):
        ps.write_shim(Path("/nonexistent"), "0.32.0")


def test_shim_is_read_by_importlib_metadata(tmp_path):
    shim = ps.write_shim(tmp_path / "shim", "0.32.0+cpu")
    ps.write_shim(shim, "0.33.1+cpu")  # written again: the older version is gone
    assert [p.name for p in shim.iterdir()] == ["vllm-0.33.1+cpu.dist-info"]
    code = "import importlib.metadata as m; d = m.distribution('vllm'); print(d.metadata['Name'], d.version)"
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(shim)}, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["vllm", "0.33.1+cpu"]


def test_environments(tmp_path):
    base = {"PATH": "/usr/bin", "VIRTUAL_ENV": "/x", "PYTHONPATH": "/y"}
    env = ps.vllm_env(base, {"TMPDIR": "/t"}, Path("/shim"), Path("/deps"))
    assert env["PYTHONPATH"] == "/shim:/deps" and env["TMPDIR"] == "/t" and env["PYTHONUNBUFFERED"] == "1"
    assert "VIRTUAL_ENV" not in env
    sf = ps.specfleet_env(base)
    assert sf["PATH"].split(":")[0] == str(ps.ROOT / ".venv" / "bin") and "PYTHONPATH" not in sf


def test_overhead_ratio_and_median():
    assert ps.overhead(60.0, 30.0, 20.0) == pytest.approx(10.0)
    assert ps.overhead(60.0, None, 20.0) is None
    assert ps.median_or_none([3.0, None, 1.0, 2.0]) == 2.0
    assert ps.median_or_none([4.0, 1.0]) == 2.5
    assert ps.median_or_none([None]) is None
    assert ps.ratio(40.0, 100.0) == pytest.approx(0.4)
    assert ps.ratio(1.0, 0.0) is None
    # overall: total specfleet over total vLLM, not the mean of the pair ratios
    assert ps.overall_ratio([(50.0, 100.0), (90.0, 100.0)]) == pytest.approx(0.7)
    assert ps.overall_ratio([(10.0, 100.0), (100.0, 100.0)]) == pytest.approx(0.55)
    assert ps.overall_ratio([]) is None
    assert ps.verdict(0.8, ps.TARGETS["serial"]) == "met"
    assert ps.verdict(0.51, ps.TARGETS["packed"]) == "missed"
    assert ps.verdict(None, 0.5) == "n/a"


def test_specfleet_configs_from_status(tmp_path):
    for name, (w, r, t) in {"tp1-autoregressive": (60.0, 30.0, 20.0), "tp1-ngram-k2": (70.0, 30.0, 25.0)}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "status.json").write_text(json.dumps({"wall_s": w, "ready_s": r, "timed_s": t,
                                                                 "outcome": "ok"}))
    got = ps.specfleet_configs(tmp_path)
    assert got["tp1-autoregressive"]["overhead"] == pytest.approx(10.0)
    assert got["tp1-ngram-k2"]["overhead"] == pytest.approx(15.0)
    assert ps.median_or_none(c["overhead"] for c in got.values()) == pytest.approx(12.5)


def test_busiest_slot_of_a_packed_run(tmp_path):
    runs = {"tp1-autoregressive": (40.6, 0), "tp1-ngram-k2": (38.0, 1), "tp1-ngram-k4": (35.6, 0)}
    for name, (wall, slot) in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "status.json").write_text(json.dumps({"wall_s": wall, "ready_s": 20.0, "timed_s": 10.0,
                                                                 "slot": {"index": slot, "cpus": str(slot)}}))
    got = ps.specfleet_configs(tmp_path)
    index, wall, names = ps.busiest_slot(got)
    assert (index, names) == (0, ["tp1-autoregressive", "tp1-ngram-k4"]) and wall == pytest.approx(76.2)
    (tmp_path / "tp1-ngram-k4" / "status.json").write_text(json.dumps({"wall_s": 35.6, "slot": {"index": 1}}))
    assert ps.busiest_slot(ps.specfleet_configs(tmp_path))[:2] == (1, pytest.approx(73.6))
    serial = {"a": {"wall": 40.0, "slot": None}}
    assert ps.busiest_slot(serial) is None  # not packed


def test_even_matrix_adds_ngram_k3():
    extra = ps.specfleet_vars(["plain", "ngram-k2", "ngram-k3", "ngram-k4"], 16, 128, ["0", "1"])
    assert [c.get("num_speculative_tokens") for c in extra["bench_phases"][0]["configs"]] == [None, 2, 3, 4]
    assert ps.serve_params(["ngram-k3"])[0]["speculative_config"]["prompt_lookup_max"] == 3


def test_vllm_configs_from_the_sweeps_markers(tmp_path):
    times = ps.SweepTimes()
    lines = [(0.0, "[BEGIN SERVER]"), (0.1, "Server overrides: {'_benchmark_name': 'plain'}"),
             (30.0, "[BEGIN BENCHMARK]"), (55.0, "[END BENCHMARK]"), (56.0, "[END SERVER]"),
             (56.5, "[BEGIN SERVER]"),
             (56.6, "Server overrides: {'_benchmark_name': 'ngram-k2', 'speculative_config': {'method': 'ngram'}}"),
             (90.0, "[BEGIN BENCHMARK]"), (120.0, "[END SERVER]")]
    for t, line in lines:
        times.feed(t, line + "\n")
    (tmp_path / "SERVE--plain").mkdir()
    (tmp_path / "SERVE--plain" / "run=0.json").write_text(json.dumps({"duration": 20.0,
                                                                       "total_output_tokens": 2048}))
    got = ps.vllm_configs(times, tmp_path)
    assert got["plain"] == {"wall": 56.0, "ready": 30.0, "timed": 20.0, "overhead": pytest.approx(6.0),
                            "tokens": 2048}
    assert got["ngram-k2"]["wall"] == pytest.approx(63.5) and got["ngram-k2"]["ready"] == pytest.approx(33.5)
    assert got["ngram-k2"]["overhead"] is None  # no result file: not derivable


def test_dry_run_prints_both_commands(capsys):
    ps.main(["--dry-run", "--configs", "plain,ngram-k4", "--slots", "0,1"])
    out = capsys.readouterr().out
    assert "bench sweep serve" in out and "ansible-playbook bench.yml -l local" in out
    assert '"bench_pack": true' in out and '"ngram-k4"' in out


@pytest.mark.parametrize("configs", ["eagle", "ngram-k4"])  # unknown; no baseline (specfleet always runs it)
def test_configs_refused(configs):
    with pytest.raises(SystemExit):
        ps.main(["--dry-run", "--configs", configs])
