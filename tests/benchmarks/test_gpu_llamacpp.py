"""The llama.cpp GPU benchmark's pure parts: the role's cmake arguments read without YAML, the CUDA arguments and the
build key as the role makes them, finding llama.cpp's tree, the plan, and the memory windows per config."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from benchmarks import gpu_llamacpp as gl


def test_role_flags_read_without_yaml_are_yamls() -> None:
    yaml = pytest.importorskip("yaml")
    text = (gl.ROLE / "vars" / "main.yml").read_text()
    assert gl.yaml_list(text, gl.ROLE_FLAGS_KEY) == [str(x) for x in yaml.safe_load(text)[gl.ROLE_FLAGS_KEY]]
    flags = gl.role_cmake_flags()
    assert flags[:2] == ["-G", "Ninja"] and "-DBUILD_SHARED_LIBS=OFF" in flags


def test_yaml_list_forms() -> None:
    text = "a: [x, \"y z\"]  # c\nb:\n  - one\n  # note\n  - 'two'\n  - three  # why\nc: 1\n- stray\n"
    assert gl.yaml_list(text, "a") == ["x", "y z"]
    assert gl.yaml_list(text, "b") == ["one", "two", "three"]
    assert gl.yaml_list(text, "missing") is None
    assert gl.yaml_scalar("k: /usr/local/cuda/bin/nvcc   # used\n", "k") == "/usr/local/cuda/bin/nvcc"


def test_cuda_args_and_key_as_the_role_makes_them() -> None:
    assert gl.cuda_archs(["9.0", "9.0", "12.0", "[N/A]"]) == "90;120"
    assert gl.cuda_args("90", True, "/x/nvcc") == ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
                                                  "-DGGML_CUDA_NCCL=OFF", "-DGGML_CUDA_FA_ALL_QUANTS=OFF"]
    assert gl.cuda_args("90", False, "/x/nvcc")[-1] == "-DCMAKE_CUDA_COMPILER=/x/nvcc"
    assert gl.build_key("sha256:ab", ["-G", "Ninja"]) == hashlib.sha256(b"sha256:ab\n-G\nNinja\n").hexdigest()[:16]


def test_find_tree_takes_the_shallowest_llamacpp(tmp_path: Path) -> None:
    tree = tmp_path / "pkg" / "vendor" / "llama.cpp"
    for d in (tree / "ggml", tree / "tools" / "server", tmp_path / "pkg"):
        d.mkdir(parents=True, exist_ok=True)
    for f in (tree / "CMakeLists.txt", tree / "ggml" / "CMakeLists.txt", tmp_path / "pkg" / "CMakeLists.txt"):
        f.write_text("")
    assert gl.find_tree(tmp_path) == tree
    assert gl.find_tree(tree / "ggml") is None


def test_plan_has_every_config_with_the_gpu_server_args(tmp_path: Path) -> None:
    plan = gl.build_plan("/opt/llama-server", tmp_path, 1, 3, "r1")
    ids = [c["config_id"] for c in plan["configs"]]
    assert ids == ["tp1-autoregressive", "tp1-ngram-k2", "tp1-draft_model-k3", "tp1-dflash-blk4", "tp1-eagle3-k3",
                   "tp1-draft_model-k3-synth2.5", "tp1-draft_model-k3-synth3.5"]
    loads = {c["config_id"]: sorted({x["concurrency"] for x in c["cells"]}) for c in plan["configs"]}
    assert loads["tp1-autoregressive"] == loads["tp1-draft_model-k3"] == [1, 2, 4, 8]
    assert loads["tp1-ngram-k2"] == [1]
    for c in plan["configs"]:
        assert c["command"][0] == "/opt/llama-server" and "--n-gpu-layers" in c["command"]
        assert " ".join(gl.SERVER_ARGS) in " ".join(c["command"])
    assert plan["suite"]["gpu_count"] == 1 and plan["host"] == gl.HOST


def test_memory_windows_serving_and_after() -> None:
    span = {"a": {"t_start": 0.0, "t_ready": 1.0, "ready_s": 0.5, "t_end": 5.0},
            "b": {"t_start": 5.0, "t_ready": 7.0, "ready_s": 1.0, "t_end": 9.0}}
    # a holds 900 MiB until 4.9, b holds from 6.2 on and never lets go
    samples = [(t / 10, 0, 1000 if 9 <= t <= 49 or t >= 62 else 100) for t in range(0, 120, 2)]
    got = gl.memory_windows(span, samples, {0: 100}, 12.0)
    assert got["a"]["seen"] and got["a"]["released"] and got["a"]["gpus"][0]["serving_max_mib"] == 1000
    assert got["a"]["gpus"][0]["after_min_mib"] == 100 and got["a"]["gpus"][0]["back_after_end_s"] == 0.0
    assert got["b"]["seen"] and not got["b"]["released"]
