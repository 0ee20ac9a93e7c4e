"""The environment header (collector/environment.py) from host.json files written by the agent's own fingerprint:
GPUs, driver and CUDA from the nvidia-smi stand-in answering with a real H200's captures, the engine's version and
commit read by the agent's probe from a real distribution's metadata, the build record as the sglang role writes
it, model digests of real folders, and run.json from `collector stamp`. Then what differs between two such runs."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from agent import fingerprint
from agent.store import write_json
from collector.__main__ import main as collector_main
from collector.environment import differences, environment, gpus_text
from collector.load import load_run

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PATCH = b"--- a/python/sglang/srt/server_args.py\n+++ b/python/sglang/srt/server_args.py\n"


def distribution(site: Path, name: str, version: str, commit: Optional[str]) -> None:
    """An installed distribution's metadata, as pip leaves it (with direct_url.json for a git install)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if commit:
        (info / "direct_url.json").write_text(json.dumps(
            {"url": "https://github.com/sgl-project/sglang", "vcs_info": {"vcs": "git", "commit_id": commit}}))


def model_folder(root: Path, name: str) -> dict[str, Any]:
    folder = root / "models" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": 64, "name": name}))
    (folder / "model.safetensors").write_bytes(b"\x01" * 256)
    return {"name": name, "path": str(folder), "revision": "main"}


def write_host(run_dir: Path, host: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, *, gpu: bool,
               build: Optional[dict[str, Any]] = None, **suite: Any) -> None:
    """<run>/<host>/host.json as the agent writes it: fingerprint.collect on this machine, with the nvidia-smi
    stand-in on PATH for a GPU host (none for a CPU host) and `build` as the engine build record."""
    with monkeypatch.context() as m:
        bin_dir = tmp / f"bin-{host}"
        bin_dir.mkdir()
        if gpu:
            (bin_dir / "nvidia-smi").symlink_to(REPO / "tests" / "fakes" / "nvidia-smi")
            (bin_dir / "python3").symlink_to(sys.executable)  # the stand-in's interpreter
            m.setenv("NVIDIA_SMI_CAPTURES", str(REPO / "tests" / "fixtures" / "nvidia-h200"))
        m.setenv("PATH", str(bin_dir))
        record = tmp / f"record-{host}.json"
        if build is not None:
            record.write_text(json.dumps(build))
        m.setattr(fingerprint, "ENGINE_BUILD_RECORD", record)
        plan = {"run_id": run_dir.name, "host": host, "configs": [],
                "suite": {"engine_python": sys.executable, **suite}}
        info = fingerprint.collect(plan)
    write_json(run_dir / host / "host.json", info)


def sglang_build(commit: str = COMMIT, patch: bytes = PATCH) -> dict[str, Any]:
    """/etc/specfleet/engine-patches.json as roles/sglang/tasks/record.yml writes it for a pull request's head."""
    return {"engine": "sglang", "source": "git", "repo": "https://github.com/sgl-project/sglang.git", "ref": None,
            "refspec": "pull/29907/head", "commit": commit, "src_dir": "/opt/specfleet/sglang-src",
            "patches": [{"name": "0001-ddtree-page-size.patch", "sha256": hashlib.sha256(patch).hexdigest()}]}


@pytest.fixture()
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the engines' distributions are installed, on the engine Python's path."""
    site = tmp_path / "site"
    distribution(site, "sglang", "0.5.11", COMMIT)
    distribution(site, "vllm", "0.32.0", None)
    monkeypatch.setenv("PYTHONPATH", str(site))
    return site


def two_host_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str = "run-a",
                 build: Optional[dict[str, Any]] = None) -> Path:
    """gpu1: an H200 host with SGLang built from a pull request with one patch, a model and its drafter.
    cpu1: a host without GPUs running vLLM from PyPI, no drafter."""
    run_dir = tmp_path / "results" / name
    models = tmp_path / name
    write_host(run_dir, "gpu1", tmp_path / name, monkeypatch, gpu=True, build=build or sglang_build(),
               engine="sglang", model=model_folder(models, "Qwen3.6-27B"),
               draft_model=model_folder(models, "Qwen3.6-27B-DFlash"))
    write_host(run_dir, "cpu1", tmp_path / name, monkeypatch, gpu=False, engine="vllm",
               model=model_folder(models, "tiny"))
    assert collector_main(["stamp", str(run_dir), "start", "--suite", "env", "--hosts", "gpu1", "cpu1"]) == 0
    return run_dir


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO,
                          check=True).stdout.strip()


def test_each_host_says_what_it_was_measured_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, site: Path) -> None:
    run_dir = two_host_run(tmp_path, monkeypatch)
    env = environment(load_run(run_dir))
    assert list(env) == ["cpu1", "gpu1"]
    gpu = dict(env["gpu1"])
    info = json.loads((run_dir / "gpu1" / "host.json").read_text())
    digest = info["model"]["digest"][:8]
    assert [label for label, _ in env["gpu1"]] == ["GPUs", "driver", "CUDA", "engine", "engine commit", "patches",
                                                   "model", "drafter", "specfleet", "CPU", "OS"]
    assert gpu["GPUs"] == "1x NVIDIA H200 (140 GiB)"  # 143771 MiB, from the captured query
    assert (gpu["driver"], gpu["CUDA"]) == ("580.159.04", "13.0")  # the captured nvidia-smi -q -x
    assert gpu["engine"] == "sglang 0.5.11"
    assert gpu["engine commit"] == "0123456789ab (pull/29907/head)"
    assert gpu["patches"] == f"0001-ddtree-page-size.patch@{hashlib.sha256(PATCH).hexdigest()[:8]}"
    assert gpu["model"] == f"Qwen3.6-27B (revision main, digest {digest})"
    assert gpu["drafter"].startswith("Qwen3.6-27B-DFlash (revision main, digest ")
    assert gpu["specfleet"] == head_commit()
    assert fingerprint.cpu()["model"] in gpu["CPU"] and gpu["OS"].startswith(fingerprint.os_release())
    # no GPUs, vLLM from an index (no commit, no build record, no patches), no drafter: only what is known
    cpu = dict(env["cpu1"])
    assert [label for label, _ in env["cpu1"]] == ["GPUs", "engine", "model", "specfleet", "CPU", "OS"]
    assert (cpu["GPUs"], cpu["engine"]) == ("none", "vllm 0.32.0")
    assert all(len(value) < 120 for pairs in env.values() for _, value in pairs)


def test_what_a_damaged_or_missing_host_json_leaves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    site: Path) -> None:
    run_dir = two_host_run(tmp_path, monkeypatch)
    (run_dir / "cpu1" / "host.json").write_text('{"gpus": {"count": 2, "devices": [{"name": "NVIDIA H200"}, 7]}, '
                                                 '"engine": "sglang", "model": {"revision": "main"}}')
    (run_dir / "lost" / "tp1-autoregressive").mkdir(parents=True)  # a host folder whose host.json is gone
    env = environment(load_run(run_dir))
    assert env["cpu1"] == [("GPUs", "1x NVIDIA H200"), ("specfleet", head_commit())]
    assert env["lost"] == [("specfleet", head_commit())]


@pytest.mark.parametrize("gpus, text", [
    ({"count": 8, "devices": [{"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory.total": 97887}] * 8},
     "8x NVIDIA RTX PRO 6000 Blackwell Server Edition (96 GiB)"),
    ({"count": 3, "devices": [{"name": "NVIDIA H200", "memory.total": 143771}] * 2
      + [{"name": "NVIDIA L4", "memory_total_mib": 23034}]}, "2x NVIDIA H200 (140 GiB), 1x NVIDIA L4 (22 GiB)"),
    ({"count": 0, "devices": []}, "none"),
    ({}, ""),
])
def test_gpus_by_model_and_memory(gpus: dict[str, Any], text: str) -> None:
    assert gpus_text(gpus) == text


def test_differences_between_two_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, site: Path) -> None:
    """Run b: SGLang rebuilt at another commit with a changed patch, the drafter gone, cpu1 not measured and a new
    host; every other label is the same (the models' folders are alike) and is not listed."""
    a = two_host_run(tmp_path, monkeypatch, "run-a")
    b = two_host_run(tmp_path, monkeypatch, "run-b", build=sglang_build("fedcba9876543210" * 2 + "fedcba98",
                                                                        PATCH + b"+# budget\n"))
    shutil.rmtree(b / "cpu1")
    info = json.loads((b / "gpu1" / "host.json").read_text())
    del info["draft_model"]
    write_json(b / "gpu1" / "host.json", info)
    write_json(b / "cpu2" / "host.json", {"host": "cpu2", "gpus": {"count": 0, "devices": []}})
    run_a, run_b = load_run(a), load_run(b)
    got = differences(run_a, run_b)
    old_patch, new_patch = (hashlib.sha256(p).hexdigest()[:8] for p in (PATCH, PATCH + b"+# budget\n"))
    drafter = dict(environment(run_a)["gpu1"])["drafter"]
    assert got == [
        ("cpu1", "host", "present", "-"),
        ("gpu1", "engine commit", "0123456789ab (pull/29907/head)", "fedcba987654 (pull/29907/head)"),
        ("gpu1", "patches", f"0001-ddtree-page-size.patch@{old_patch}", f"0001-ddtree-page-size.patch@{new_patch}"),
        ("gpu1", "drafter", drafter, "-"),
        ("cpu2", "host", "-", "present"),
    ]
    assert differences(run_a, run_a) == []
    assert sorted((h, label, y, x) for h, label, x, y in differences(run_b, run_a)) == sorted(got)
