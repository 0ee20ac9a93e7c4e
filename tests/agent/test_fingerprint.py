"""The host fingerprint (agent/fingerprint.py, written to host.json) on this machine: the OS, CPU and memory
read for real, no GPUs where there is no nvidia-smi (and what a stand-in nvidia-smi reports), the model digest,
the engine's version read from its own Python (a stand-in script, a Python without the engine, one that does
not exist) and the whole record `collect` makes."""
from __future__ import annotations

import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from agent import fingerprint

HOST = "gpu-fp-1"


def executable(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def fake_engine_python(folder: Path, version: str = "0.9.9", commit: str = "abc123def") -> str:
    """A stand-in for the engine's Python: the version probe prints the first distribution it is asked
    about, with this version and commit; any other `-c` snippet runs in the real Python."""
    return executable(folder / "python", (
        f"#!{sys.executable}\n"
        "import sys\n"
        "if sys.argv[1] == '-c' and 'importlib.metadata' in sys.argv[2]:\n"
        f"    print(sys.argv[3], {version!r}, {commit!r})\n"
        "else:\n"
        "    exec(sys.argv[2])\n"))


@pytest.fixture()
def no_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


# -- OS, CPU, memory ----------------------------------------------------------------------------------
def test_os_release_is_the_pretty_name_of_this_system() -> None:
    name = fingerprint.os_release()
    assert isinstance(name, str) and name.strip() == name and name
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        assert name == platform.platform()
        return
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    assert name == (m.group(1) if m else platform.platform())
    assert '"' not in name


@pytest.mark.parametrize("text, expected", [
    ('NAME="Debian GNU/Linux"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n',
     "Debian GNU/Linux 12 (bookworm)"),
    ("ID=alpine\nPRETTY_NAME=Alpine\n", "Alpine"),
    ('ID=ubuntu\nPRETTY_NAME="Ubuntu 24.04.2 LTS"', "Ubuntu 24.04.2 LTS"),
])
def test_os_release_parses_quoted_and_bare_names(monkeypatch: pytest.MonkeyPatch, text: str, expected: str) -> None:
    monkeypatch.setattr(fingerprint, "_read", lambda path: text if path == "/etc/os-release" else "")
    assert fingerprint.os_release() == expected


def test_os_release_without_a_pretty_name_falls_back_to_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fingerprint, "_read", lambda path: "ID=mystery\n")
    assert fingerprint.os_release() == platform.platform()


def test_cpu_of_this_machine() -> None:
    info = fingerprint.cpu()
    assert set(info) == {"model", "count", "usable"}
    assert info["count"] == os.cpu_count() and info["count"] >= 1
    assert info["usable"] == len(os.sched_getaffinity(0))
    assert 1 <= info["usable"] <= info["count"]
    assert isinstance(info["model"], str)
    models = re.findall(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    if models:
        assert info["model"] == models[0].strip() and info["model"]


def test_memory_total_of_this_machine() -> None:
    mib = fingerprint.memory_total_mib()
    assert isinstance(mib, int) and mib >= 256
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    assert mib <= physical + 1
    m = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    assert m and mib == int(m.group(1)) // 1024


def test_memory_total_unknown_without_meminfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fingerprint, "_read", lambda path: "")
    assert fingerprint.memory_total_mib() is None


# -- GPUs ---------------------------------------------------------------------------------------------
def test_gpus_without_nvidia_smi_are_none(no_nvidia_smi: None) -> None:
    assert fingerprint.gpus() == {"count": 0, "devices": []}


SMI_CSV = ("index, name, uuid, driver_version, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
           "compute_cap\n"
           "0, NVIDIA H200, GPU-aaaa, 575.51.03, 143771 MiB, 1 MiB, 143770 MiB, 9.0\n"
           "1, NVIDIA H200, GPU-bbbb, 575.51.03, 143771 MiB, 512 MiB, 143259 MiB, 9.0\n")
SMI_XML = ('<?xml version="1.0" ?>\n<nvidia_smi_log><driver_version>575.51.03</driver_version>'
           "<cuda_version>12.9</cuda_version><attached_gpus>2</attached_gpus></nvidia_smi_log>\n")
SMI_TOPO = "\x1b[4mGPU0\tGPU1\x1b[0m\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"


def fake_nvidia_smi(folder: Path, fail: bool = False) -> None:
    """An nvidia-smi on PATH answering the three calls `gpus()` makes, with what a 2-GPU H200 host prints."""
    executable(folder / "nvidia-smi", (
        f"#!{sys.executable}\n"
        "import sys\n"
        f"if {fail!r}:\n"
        "    print('NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.')\n"
        "    sys.exit(9)\n"
        "a = sys.argv[1:]\n"
        f"if a[0].startswith('--query-gpu='): sys.stdout.write({SMI_CSV!r})\n"
        f"elif a == ['-q', '-x']: sys.stdout.write({SMI_XML!r})\n"
        f"elif a == ['topo', '-m']: sys.stdout.write({SMI_TOPO!r})\n"
        "else: sys.exit(2)\n"))


def test_gpus_as_a_stand_in_nvidia_smi_reports_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    info = fingerprint.gpus()
    assert info["count"] == 2 and info["driver_version"] == "575.51.03" and info["cuda_version"] == "12.9"
    assert [(d["index"], d["uuid"], d["memory.total"], d["memory.used"]) for d in info["devices"]] == [
        (0, "GPU-aaaa", 143771, 1), (1, "GPU-bbbb", 143771, 512)]
    assert info["topology"] == "GPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"  # colours stripped
    json.dumps(info)


def test_gpus_with_a_failing_nvidia_smi_are_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path / "bin", fail=True)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert fingerprint.gpus() == {"count": 0, "devices": []}


# -- model digest -------------------------------------------------------------------------------------
@pytest.fixture()
def model(tmp_path: Path) -> Path:
    m = tmp_path / "models" / "tiny"
    m.mkdir(parents=True)
    (m / "config.json").write_text('{"hidden_size": 64, "num_hidden_layers": 2}\n')
    (m / "model-00001-of-00002.safetensors").write_bytes(b"\x01" * 300)
    (m / "model-00002-of-00002.safetensors").write_bytes(b"\x02" * 200)
    (m / "README.md").write_text("a tiny model\n")
    return m


def test_model_digest_is_stable(model: Path, tmp_path: Path) -> None:
    digest = fingerprint.model_digest(str(model))
    assert isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{16}", digest)
    assert fingerprint.model_digest(str(model)) == digest
    assert fingerprint.model_digest(str(model) + "/") == digest
    # the same files elsewhere give the same digest
    twin = tmp_path / "elsewhere" / "tiny"
    twin.mkdir(parents=True)
    for p in model.iterdir():
        (twin / p.name).write_bytes(p.read_bytes())
    assert fingerprint.model_digest(str(twin)) == digest


def test_model_digest_changes_when_the_model_does(model: Path) -> None:
    digest = fingerprint.model_digest(str(model))
    seen = {digest}

    def changed() -> str:
        now = fingerprint.model_digest(str(model))
        assert now not in seen
        seen.add(now)
        return now

    (model / "config.json").write_text('{"hidden_size": 128, "num_hidden_layers": 2}\n')
    changed()
    (model / "model-00002-of-00002.safetensors").write_bytes(b"\x02" * 201)  # another weight file, by its size
    changed()
    (model / "model-00002-of-00002.safetensors").rename(model / "model-00002-of-00003.safetensors")
    changed()
    (model / "pytorch_model.bin").write_bytes(b"\x03" * 10)
    changed()
    (model / "config.json").unlink()
    changed()


def test_model_digest_ignores_what_is_not_config_or_weights(model: Path) -> None:
    digest = fingerprint.model_digest(str(model))
    (model / "README.md").write_text("edited\n")
    (model / "tokenizer.json").write_text("{}\n")
    assert fingerprint.model_digest(str(model)) == digest


def test_model_digest_of_what_is_not_a_folder_is_none(model: Path, tmp_path: Path) -> None:
    assert fingerprint.model_digest(str(tmp_path / "no-such-model")) is None
    assert fingerprint.model_digest(str(model / "config.json")) is None


# -- engine -------------------------------------------------------------------------------------------
def test_engine_read_from_the_engines_own_python(tmp_path: Path) -> None:
    python = fake_engine_python(tmp_path / "venv" / "bin")
    assert fingerprint.engine("vllm", python) == {"name": "vllm", "distribution": "vllm", "version": "0.9.9",
                                                  "commit": "abc123def", "python": platform.python_version()}
    # the probe is asked about the engine's own distributions
    assert fingerprint.engine("sglang", python)["distribution"] == "sglang"


def test_engine_installed_without_a_vcs_commit(tmp_path: Path) -> None:
    python = fake_engine_python(tmp_path / "bin", version="0.10.1", commit="-")
    info = fingerprint.engine("vllm", python)
    assert info["version"] == "0.10.1" and info["commit"] is None


def test_engine_on_a_python_without_the_engine(tmp_path: Path) -> None:
    info = fingerprint.engine("vllm", sys.executable)  # this Python has no vllm distribution
    assert info == {"name": "vllm", "distribution": None, "version": None, "commit": None,
                    "python": platform.python_version()}


def test_engine_on_a_python_that_does_not_exist_says_so(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-engine" / "bin" / "python")
    info = fingerprint.engine("vllm", missing)
    assert set(info) == {"name", "error"} and info["name"] == "vllm"
    assert missing in info["error"] and "No such file" in info["error"]


def test_engine_on_a_python_that_cannot_be_run_says_so(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("not a program\n")
    python.chmod(0o644)
    info = fingerprint.engine("vllm", str(python))
    assert set(info) == {"name", "error"} and "Permission denied" in info["error"]


def test_engine_build_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "engine-patches.json"
    monkeypatch.setattr(fingerprint, "ENGINE_BUILD_RECORD", record)
    assert fingerprint.engine_build() is None
    build = {"source": "https://github.com/sgl-project/sglang", "ref": "v0.0.1", "commit": "0" * 40,
             "patches": ["0001-ddtree.patch"]}
    record.write_text(json.dumps(build))
    assert fingerprint.engine_build() == build
    record.write_text('{"source": ')
    assert fingerprint.engine_build() is None


# -- collect ------------------------------------------------------------------------------------------
def plan_for(python: str, model: Path, **suite: Any) -> Dict[str, Any]:
    return {"run_id": "run-1", "host": HOST, "configs": [],
            "suite": {"engine": "vllm", "engine_python": python, "model": {"name": "tiny", "path": str(model)},
                      **suite}}


def test_collect_gives_what_host_json_needs(tmp_path: Path, model: Path, no_nvidia_smi: None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fingerprint, "ENGINE_BUILD_RECORD", tmp_path / "no-record.json")
    draft = tmp_path / "models" / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}\n")
    python = fake_engine_python(tmp_path / "venv" / "bin")
    plan = plan_for(python, model, draft_model={"name": "draft", "path": str(draft), "revision": "main"},
                    engine_patches=["0001-a.patch"])
    info = fingerprint.collect(plan)
    assert set(info) == {"host", "hostname", "os", "kernel", "arch", "cpu", "memory_total_mib", "gpus", "engine",
                         "agent_python", "model", "draft_model"}
    assert info["host"] == HOST and info["hostname"] == platform.node()
    assert info["os"] == fingerprint.os_release() and info["kernel"] == platform.release()
    assert info["arch"] == platform.machine() and info["agent_python"] == platform.python_version()
    assert info["cpu"] == fingerprint.cpu() and info["memory_total_mib"] == fingerprint.memory_total_mib()
    assert info["gpus"] == {"count": 0, "devices": []}
    assert info["engine"] == {"name": "vllm", "distribution": "vllm", "version": "0.9.9", "commit": "abc123def",
                              "python": platform.python_version(), "patches": ["0001-a.patch"], "build": None}
    # config.json and weight bytes as read on the host: what a later plan's memory fit uses when it cannot ask
    assert info["model"] == {"name": "tiny", "path": str(model), "digest": fingerprint.model_digest(str(model)),
                             "config": json.loads((model / "config.json").read_text()),
                             "weights_bytes": sum(p.stat().st_size for p in model.glob("*.safetensors"))}
    assert info["model"]["digest"] is not None and info["model"]["weights_bytes"] > 0
    assert info["draft_model"] == {"name": "draft", "path": str(draft), "revision": "main",
                                   "digest": fingerprint.model_digest(str(draft)), "config": {},
                                   "weights_bytes": None}
    assert json.loads(json.dumps(info)) == info  # written as host.json
    assert "digest" not in plan["suite"]["model"]  # the plan is not changed


def test_collect_on_a_host_without_the_engine_or_the_model(tmp_path: Path, no_nvidia_smi: None) -> None:
    missing = str(tmp_path / "no-engine" / "python")
    info = fingerprint.collect(plan_for(missing, tmp_path / "no-model"))
    assert "draft_model" not in info
    assert info["model"]["digest"] is None
    assert info["engine"]["name"] == "vllm" and missing in info["engine"]["error"]
    assert info["engine"]["patches"] == []
    assert info["gpus"]["count"] == 0
