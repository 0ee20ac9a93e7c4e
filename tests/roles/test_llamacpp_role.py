"""The llamacpp role: its inputs are declared, and through the real `ansible-playbook` (playbooks/llamacpp.yml on the
inventory's `local` host):

- check mode on a fresh cache names the build key a real run would build and creates nothing (the sdist is a small
  stand-in file on the host whose sha256 is given as the pin, so nothing is downloaded);
- a git source runs the whole role for real, cmake and ninja included, on a repository made here whose CMake
  project's `llama-server` target is a shell script (no compiler runs: `make llamacpp` builds llama.cpp for real):
  the tree is exported, built under its key, recorded and linked, and a second run changes nothing.

CUDA is off, so the flags are the role's own on any machine.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests import playbook
from tests.conftest import ROOT

ROLE = ROOT / "roles/llamacpp"


def build_key(digest: str, cmake_args: list[str]) -> str:
    """The role's key: sha256 of the source digest and every cmake argument, one a line, first 16 hex digits."""
    return hashlib.sha256(("\n".join([digest, *cmake_args]) + "\n").encode()).hexdigest()[:16]


def check_run(tmp_path: Path, pinned_sha256: str, *args: str) -> playbook.Played:
    archive = tmp_path / "llama_cpp_python-0.0.0.tar.gz"
    archive.write_bytes(b"not really an sdist\n")
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({
        "llamacpp_cache_dir": str(tmp_path / "cache"), "llamacpp_link_dir": str(tmp_path / "links"),
        "llamacpp_source_archive": str(archive), "llamacpp_sdist_sha256": pinned_sha256, "llamacpp_cuda": "false",
        "llamacpp_install_system_packages": False}))
    return playbook.play(["playbooks/llamacpp.yml", "-l", "local", "-e", f"@{extra}", *args], timeout=120)


def test_every_input_is_prefixed_and_declared() -> None:
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    options = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert all(name.startswith("llamacpp_") for name in defaults)
    assert set(options) == set(defaults)
    for name, option in options.items():
        assert option.get("description") and option.get("type"), name
        if option["type"] != "raw":
            assert option.get("default") == defaults[name], name


@pytest.mark.playbook
@pytest.mark.slow
def test_check_mode_on_a_fresh_cache_names_the_key_and_creates_nothing(tmp_path: Path) -> None:
    pinned = hashlib.sha256(b"not really an sdist\n").hexdigest()
    run = check_run(tmp_path, pinned, "--check")
    assert run.rc == 0, playbook.why(run.out)
    base = yaml.safe_load((ROLE / "vars/main.yml").read_text())["_llamacpp_cmake_base"]
    key = build_key(f"sha256:{pinned}", base)
    assert f"llama-server key {key}: check mode, nothing is built" in run.out, run.out[-3000:]
    assert run.recap("local")["failed"] == 0
    assert not (tmp_path / "cache").exists() and not (tmp_path / "links").exists()


STANDIN_CMAKE = """\
cmake_minimum_required(VERSION 3.14)
project(standin NONE)
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/bin/llama-server
  COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_SOURCE_DIR}/server.sh ${CMAKE_BINARY_DIR}/bin/llama-server
  DEPENDS ${CMAKE_SOURCE_DIR}/server.sh)
add_custom_target(llama-server DEPENDS ${CMAKE_BINARY_DIR}/bin/llama-server)
"""
# llama-server --version writes to stderr, a CUDA build its devices first: the record keeps the version lines.
STANDIN_SERVER = ('#!/bin/sh\necho "ggml_cuda_init: no devices" >&2\n'
                  'echo "version: 7 (standin)" >&2\necho "built with sh" >&2\n')


@pytest.mark.playbook
@pytest.mark.slow
@pytest.mark.skipif(not all(shutil.which(t) for t in ("cmake", "ninja", "git")), reason="needs cmake, ninja and git")
def test_a_git_source_is_built_once_recorded_and_linked(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "CMakeLists.txt").write_text(STANDIN_CMAKE)
    (repo / "server.sh").write_text(STANDIN_SERVER)
    (repo / "server.sh").chmod(0o755)
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one"],
                 ["tag", "v1"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    cache, links = tmp_path / "cache", tmp_path / "links"
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({
        "llamacpp_source": "git", "llamacpp_git_repo": f"file://{repo}", "llamacpp_git_version": "v1",
        "llamacpp_cache_dir": str(cache), "llamacpp_link_dir": str(links), "llamacpp_cuda": "false",
        "llamacpp_install_system_packages": False, "llamacpp_build_poll": 1}))

    def play() -> playbook.Played:
        return playbook.play(["playbooks/llamacpp.yml", "-l", "local", "-e", f"@{extra}"], timeout=120)

    first = play()
    assert first.rc == 0, playbook.why(first.out)
    base = yaml.safe_load((ROLE / "vars/main.yml").read_text())["_llamacpp_cmake_base"]
    args = [*base, f"-DLLAMA_BUILD_COMMIT={commit[:7]}"]
    key = build_key(f"git:{commit}", args)
    assert f"llama-server key {key} built in " in first.out
    record = json.loads((cache / "build" / key / "specfleet-build.json").read_text())
    assert record["commit"] == commit and record["ref"] == "v1" and record["cmake_args"] == args
    assert record["key"] == key and record["build_seconds"] >= 0
    assert record["server_version"] == "version: 7 (standin)\nbuilt with sh"
    tree = (cache / "src" / f"git-{commit[:16]}").resolve()
    assert (links / "src").resolve() == tree and (tree / "CMakeLists.txt").is_file()
    for link in (links / "llama-server", cache / "llama-server"):
        assert link.resolve() == (cache / "build" / key / "bin/llama-server").resolve()

    second = play()
    assert second.rc == 0 and second.recap("local")["changed"] == 0, playbook.why(second.out)
    assert f"llama-server key {key}: kept build of {record['built_at']}" in second.out
