"""The container roles (nvidia_userspace, cuda_toolkit, flash_attn, sglang, model_weights) through the real
`ansible-playbook`, connection=local, on a temporary inventory.

What runs for real here and what is only rendered:
- sglang: the git part runs for real: a clone (ansible.builtin.git) of a real repository made in tmp_path at a
  pinned tag, real `git diff` patches applied, detected as already applied on the next run (changed=0), a
  conflicting patch failing with its name, a dropped patch resetting the tree, a prepared checkout, check mode on a
  fresh host, and (when the offline wheelhouse of `make wheelhouse` exists) a real venv with
  `pip install -e python` from that wheelhouse, repeated only when the applied set changes.
- nvidia_userspace: detection runs for real against a library folder in tmp_path (nvidia-smi is absent here: the
  command path given does not exist, which is what a container without the userspace looks like); the install is
  run with a stand-in runfile (a shell script that records its arguments and drops libnvidia-ml.so.<version>), not
  NVIDIA's installer; apt, NVIDIA's URL and a real GPU are not reachable here.
- cuda_toolkit: preflight checks run for real (they fail where they must); the install is check mode only
  (NVIDIA's repository is not reachable here); the profile script is rendered for real and sourced by sh.
- flash_attn: the cgroup probe and MAX_JOBS run for real on this machine; the kept-wheel path runs for real in a
  real venv with a real wheel file, but torch is only a dist-info stand-in and nvcc a stand-in that prints a
  version: no CUDA build happens here (a new key is only shown as "build" in check mode).
- model_weights: the stamp skip and the failed-download path run for real (huggingface_hub against an endpoint
  that refuses connections), checking the token never appears in -vvv output or the log; a real download from the
  Hub is not possible here.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import playbook
from tests.builders import SPEC_PY, git, make_sglang_source, make_wheel
from tests.conftest import ROOT

WHEELHOUSE = ROOT / ".cache/wheelhouse"
HOST = "ct"


class Run:
    """One ansible-playbook run: rc, the human output, and every task result (record_results callback)."""

    def __init__(self, proc: subprocess.CompletedProcess[str], record: Path) -> None:
        self.rc = proc.returncode
        self.out = proc.stdout + proc.stderr
        self.data: dict[str, Any] = json.loads(record.read_text()) if record.exists() else {}

    @property
    def stats(self) -> dict[str, int]:
        return self.data.get("stats", {}).get(HOST, {})

    def tasks(self, name: str) -> list[dict[str, Any]]:
        return [t for t in self.data.get("tasks", []) if t["task"] == name and t["host"] == HOST]

    def one(self, name: str) -> dict[str, Any]:
        found = self.tasks(name)
        assert len(found) == 1, (name, len(found), self.out[-3000:])
        return found[0]

    def ran(self, name: str) -> bool:
        return any(t["status"] != "skipped" for t in self.tasks(name))

    def changed(self) -> list[str]:
        return [t["task"] for t in self.data.get("tasks", []) if t["status"] == "changed"]


def play(tmp: Path, role: str, extra: dict[str, Any], *args: str, check: bool = False,
         env: dict[str, str] | None = None) -> Run:
    inventory = tmp / "inventory.ini"
    inventory.write_text(f"{HOST} ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    n = len(list(tmp.glob("vars-*.yml")))
    vars_file = tmp / f"vars-{n}.yml"
    vars_file.write_text(yaml.safe_dump(extra))
    record = tmp / f"results-{n}.json"
    played = playbook.play(["-i", str(inventory), f"tests/container_roles/{role}.yml", "-e", f"@{vars_file}", *args,
                            *(["--check"] if check else [])],
                           env={"ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "tests/container_roles/callback_plugins"),
                                "ANSIBLE_CALLBACKS_ENABLED": "record_results", "RECORD_RESULTS": str(record),
                                **(env or {})}, timeout=600)
    return Run(played.proc, record)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


ROLES = ["nvidia_userspace", "cuda_toolkit", "flash_attn", "sglang", "model_weights"]


@pytest.mark.parametrize("role", ROLES)
def test_syntax_check(role: str, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"{HOST} ansible_connection=local\n")
    proc = playbook.play(["-i", str(inventory), "--syntax-check", f"tests/container_roles/{role}.yml"],
                         timeout=120).proc
    assert proc.returncode == 0 and f"playbook: tests/container_roles/{role}.yml" in proc.stdout, proc.stderr


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_prefixed_and_documented(role: str) -> None:
    defaults = yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text())
    specs = yaml.safe_load((ROOT / f"roles/{role}/meta/argument_specs.yml").read_text())["argument_specs"]["main"]
    assert all(name.startswith(f"{role}_") for name in defaults)
    assert set(specs["options"]) == set(defaults)
    for name, option in specs["options"].items():
        assert option.get("description") and option.get("type"), name


# ---------------------------------------------------------------- sglang: patches on a real git repository

@pytest.fixture
def upstream(tmp_path: Path) -> dict[str, Path]:
    """A repository shaped like SGLang's (python/sglang/...) tagged v0.0.1, and patches made by git diff."""
    repo, patches = tmp_path / "upstream", tmp_path / "patches"
    make_sglang_source(repo, patches)
    # a conflicting patch: made against other content of the same line
    other = SPEC_PY.replace('["EAGLE", "DFLASH"]', '["EAGLE", "NGRAM"]')
    (repo / "python/sglang/srt/spec.py").write_text(other)
    git(repo, "commit", "-q", "-am", "other line")
    (repo / "python/sglang/srt/spec.py").write_text(other.replace('"NGRAM"]', '"NGRAM", "TREE"]'))
    conflict = tmp_path / "conflict.patch"
    conflict.write_text(git(repo, "diff"))
    git(repo, "checkout", "-q", "--", ".")
    git(repo, "reset", "-q", "--hard", "v0.0.1")
    return {"repo": repo, "patches": patches, "conflict": conflict}


def sglang_vars(tmp: Path, up: dict[str, Path], **over: Any) -> dict[str, Any]:
    return {"sglang_git_repo": str(up["repo"]), "sglang_git_ref": "v0.0.1", "sglang_src_dir": str(tmp / "src"),
            "sglang_patches_dir": str(up["patches"]), "sglang_install": False, "sglang_system_packages": [],
            "sglang_patch_record": str(tmp / "etc/engine-patches.json"), **over}


def states(run: Run) -> list[dict[str, str]]:
    shown = run.tasks("Show the patch set")
    assert shown, run.out[-3000:]
    return [json.loads(s) for s in shown[-1]["result"]["msg"]]


def test_sglang_patches_apply_once_then_nothing_changes(tmp_path: Path, upstream: dict[str, Path]) -> None:
    v = sglang_vars(tmp_path, upstream)
    first = play(tmp_path, "sglang", v)
    assert first.rc == 0, first.out[-4000:]
    assert states(first) == [{"name": "0001-ddtree.patch", "state": "apply"},
                             {"name": "0002-ddtree-budget.patch", "state": "apply"}]
    assert first.ran("Clone or check out the pinned ref") and first.stats["changed"] >= 3
    src = tmp_path / "src/python/sglang/srt"
    assert '"DDTREE"' in (src / "spec.py").read_text() and (src / "ddtree.py").read_text() == "BUDGET = 64\n"
    record = json.loads((tmp_path / "etc/engine-patches.json").read_text())
    assert record["commit"] == git(upstream["repo"], "rev-parse", "v0.0.1^{commit}").strip()
    assert record["patches"] == [{"name": p.name, "sha256": sha256(p)} for p in sorted(upstream["patches"].iterdir())]
    assert record["engine"] == "sglang" and record["ref"] == "v0.0.1"

    second = play(tmp_path, "sglang", v)
    assert second.rc == 0, second.out[-4000:]
    assert second.stats["changed"] == 0, second.out[-4000:]
    assert [s["state"] for s in states(second)] == ["applied", "applied"]
    assert not second.ran("Clone or check out the pinned ref")           # at the pinned commit: no git fetch
    checked = play(tmp_path, "sglang", v, check=True)
    assert checked.rc == 0 and checked.stats["changed"] == 0, checked.out[-4000:]
    assert [s["state"] for s in states(checked)] == ["applied", "applied"]


def test_sglang_conflicting_patch_fails_naming_it(tmp_path: Path, upstream: dict[str, Path]) -> None:
    v = sglang_vars(tmp_path, upstream)
    assert play(tmp_path, "sglang", v).rc == 0
    shutil.copy(upstream["conflict"], upstream["patches"] / "0003-tree-verify.patch")
    run = play(tmp_path, "sglang", v)
    assert run.rc != 0
    failed = [t for t in run.tasks("Fail when the patch neither applies nor is already applied")
              if t["status"] == "failed"]
    assert len(failed) == 1 and "patch 0003-tree-verify.patch neither applies" in failed[0]["result"]["msg"]
    assert "(v0.0.1)" in failed[0]["result"]["msg"]
    # The earlier patches were recognised as applied, not applied twice.
    assert [s["state"] for s in states_partial(run)] == ["applied", "applied", "conflict"]


def states_partial(run: Run) -> list[dict[str, str]]:
    """Patch states from the Classify tasks (the summary is not shown after a failure)."""
    return [t["result"]["ansible_facts"]["__sglang_patch_states"][-1] for t in run.tasks("Classify the patch")]


def test_sglang_dropped_patch_resets_the_tree_and_reapplies(tmp_path: Path, upstream: dict[str, Path]) -> None:
    v = sglang_vars(tmp_path, upstream)
    assert play(tmp_path, "sglang", v).rc == 0
    (upstream["patches"] / "0002-ddtree-budget.patch").unlink()
    run = play(tmp_path, "sglang", v)
    assert run.rc == 0, run.out[-4000:]
    assert run.ran("Reset the working tree so the set can be applied again")
    assert states(run) == [{"name": "0001-ddtree.patch", "state": "apply"}]
    src = tmp_path / "src/python/sglang/srt"
    assert not (src / "ddtree.py").exists() and '"DDTREE"' in (src / "spec.py").read_text()
    record = json.loads((tmp_path / "etc/engine-patches.json").read_text())
    assert [p["name"] for p in record["patches"]] == ["0001-ddtree.patch"]
    again = play(tmp_path, "sglang", v)
    assert again.rc == 0 and again.stats["changed"] == 0, again.out[-4000:]


def test_sglang_check_mode_on_a_fresh_host_changes_nothing(tmp_path: Path, upstream: dict[str, Path]) -> None:
    v = sglang_vars(tmp_path, upstream)
    del v["sglang_system_packages"]                                  # the default, [git]: installed here
    run = play(tmp_path, "sglang", v, check=True)
    assert run.rc == 0, run.out[-4000:]
    missing = run.one("Find the system packages that are missing")["result"]["ansible_facts"]
    assert missing["__sglang_missing_packages"] == [] and not run.ran("Install the role's missing system packages")
    assert run.one("Clone or check out the pinned ref")["status"] == "changed"     # would clone
    assert [s["state"] for s in states(run)] == ["unknown", "unknown"]
    assert not (tmp_path / "src").exists() and not (tmp_path / "etc").exists()


def test_sglang_prepared_checkout_without_clone(tmp_path: Path, upstream: dict[str, Path]) -> None:
    prepared = tmp_path / "prepared"
    git(tmp_path, "clone", "-q", str(upstream["repo"]), str(prepared))
    v = sglang_vars(tmp_path, upstream, sglang_src_dir=str(prepared), sglang_git_checkout=False,
                    sglang_git_repo="https://invalid.example/never-contacted.git")
    first = play(tmp_path, "sglang", v)
    assert first.rc == 0, first.out[-4000:]
    assert not first.ran("Clone or check out the pinned ref")
    assert [s["state"] for s in states(first)] == ["apply", "apply"]
    assert json.loads((tmp_path / "etc/engine-patches.json").read_text())["ref"] is None
    second = play(tmp_path, "sglang", v)
    assert second.rc == 0 and second.stats["changed"] == 0, second.out[-4000:]
    # A prepared checkout is never reset by the role: a dropped patch is a clear failure instead.
    (upstream["patches"] / "0002-ddtree-budget.patch").unlink()
    third = play(tmp_path, "sglang", v)
    assert third.rc != 0 and "0002-ddtree-budget.patch applied earlier" in third.out
    assert (prepared / "python/sglang/srt/ddtree.py").exists()



def _pull_request(repo: Path, number: int, algorithms: str) -> str:
    """Push a commit that is on no branch and no tag to refs/pull/<number>/head, as GitHub keeps a pull request's
    head; returns its commit."""
    git(repo, "checkout", "-q", "--detach", "v0.0.1")
    (repo / "python/sglang/srt/spec.py").write_text(SPEC_PY.replace('["EAGLE", "DFLASH"]', algorithms))
    git(repo, "commit", "-q", "-am", f"pull request {number}")
    commit = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "update-ref", f"refs/pull/{number}/head", commit)
    git(repo, "checkout", "-q", "main")
    return commit


def test_sglang_pull_request_head_is_fetched_resolved_and_kept(tmp_path: Path, upstream: dict[str, Path]) -> None:
    """`sglang_git_refspec: pull/7/head` builds the pull request's head (a ref no clone brings), records repo,
    refspec and commit, keeps that commit when the pull request moves, and moves only to a pinned commit."""
    repo = upstream["repo"]
    first_head = _pull_request(repo, 7, '["EAGLE", "DFLASH", "DDTREE"]')
    assert git(repo, "branch", "--contains", first_head) == "" and git(repo, "tag", "--contains", first_head) == ""
    (upstream["patches"] / "0001-ddtree.patch").unlink()          # the pull request carries DDTREE itself
    v = sglang_vars(tmp_path, upstream, sglang_git_refspec="pull/7/head")
    spec = tmp_path / "src/python/sglang/srt/spec.py"

    checked = play(tmp_path, "sglang", v, check=True)                 # a fresh host: says what it would fetch
    assert checked.rc == 0 and checked.ran("Say what the refspec route would fetch"), checked.out[-4000:]
    assert not (tmp_path / "src").exists()

    first = play(tmp_path, "sglang", v)
    assert first.rc == 0, first.out[-4000:]
    assert git(tmp_path / "src", "rev-parse", "HEAD").strip() == first_head
    assert '"DDTREE"' in spec.read_text() and (spec.parent / "ddtree.py").exists()   # + the remaining patch
    record = json.loads((tmp_path / "etc/engine-patches.json").read_text())
    assert {k: record[k] for k in ("repo", "ref", "refspec", "commit")} == {
        "repo": str(repo), "ref": None, "refspec": "refs/pull/7/head", "commit": first_head}
    assert [p["name"] for p in record["patches"]] == ["0002-ddtree-budget.patch"]

    again = play(tmp_path, "sglang", v)
    assert again.rc == 0 and again.stats["changed"] == 0, again.out[-4000:]
    assert not again.ran("Fetch the refspec")

    moved = _pull_request(repo, 7, '["EAGLE", "DFLASH", "DDTREE", "DDTREE_V2"]')     # the author pushes again
    kept = play(tmp_path, "sglang", v)
    assert kept.rc == 0 and kept.stats["changed"] == 0, kept.out[-4000:]
    assert git(tmp_path / "src", "rev-parse", "HEAD").strip() == first_head

    pinned = play(tmp_path, "sglang", {**v, "sglang_git_ref": moved})   # pin the new head: fetched and built
    assert pinned.rc == 0 and pinned.ran("Fetch the refspec"), pinned.out[-4000:]
    assert git(tmp_path / "src", "rev-parse", "HEAD").strip() == moved and "DDTREE_V2" in spec.read_text()
    record = json.loads((tmp_path / "etc/engine-patches.json").read_text())
    assert (record["ref"], record["refspec"], record["commit"]) == (moved, "refs/pull/7/head", moved)

    back = play(tmp_path, "sglang", {**v, "sglang_git_refspec": "", "sglang_git_ref": "v0.0.1"})  # the tag route
    assert back.rc == 0, back.out[-4000:]
    record = json.loads((tmp_path / "etc/engine-patches.json").read_text())
    assert (record["ref"], record["refspec"]) == ("v0.0.1", None)
    assert record["commit"] == git(repo, "rev-parse", "v0.0.1^{commit}").strip()


def test_sglang_fork_branch_replaces_the_origin(tmp_path: Path, upstream: dict[str, Path]) -> None:
    """A fork (another repository URL) with its branch: origin is switched and the fork's commit recorded."""
    assert play(tmp_path, "sglang", sglang_vars(tmp_path, upstream)).rc == 0
    fork = tmp_path / "fork"
    git(tmp_path, "clone", "-q", str(upstream["repo"]), str(fork))
    git(fork, "checkout", "-q", "-b", "ddtree")
    (fork / "python/sglang/srt/spec.py").write_text(SPEC_PY.replace('"DFLASH"]', '"DFLASH", "DDTREE"]'))
    git(fork, "commit", "-q", "-am", "ddtree on a fork")
    head = git(fork, "rev-parse", "HEAD").strip()
    (upstream["patches"] / "0001-ddtree.patch").unlink()
    v = sglang_vars(tmp_path, upstream, sglang_git_repo=str(fork), sglang_git_refspec="refs/heads/ddtree")
    run = play(tmp_path, "sglang", v)
    assert run.rc == 0 and run.ran("Point origin at the repository"), run.out[-4000:]
    assert git(tmp_path / "src", "remote", "get-url", "origin").strip() == str(fork)
    record = json.loads((tmp_path / "etc/engine-patches.json").read_text())
    assert (record["repo"], record["refspec"], record["commit"]) == (str(fork), "refs/heads/ddtree", head)
    assert play(tmp_path, "sglang", v).stats["changed"] == 0


@pytest.mark.parametrize("bad", ["pull/7/../head", "-upload-pack=x", "pull/7/head/", "refs//x", "pull 7"])
def test_sglang_refspec_that_is_not_one_ref_fails_before_git(tmp_path: Path, upstream: dict[str, Path],
                                                            bad: str) -> None:
    run = play(tmp_path, "sglang", sglang_vars(tmp_path, upstream, sglang_git_refspec=bad))
    assert run.rc != 0 and "is not one ref name" in run.out, run.out[-3000:]
    assert not (tmp_path / "src").exists()

@pytest.mark.skipif(not (WHEELHOUSE / ".complete").exists(), reason="no offline wheelhouse: run `make wheelhouse`")
def test_sglang_editable_install_runs_only_when_the_applied_set_changes(tmp_path: Path,
                                                                       upstream: dict[str, Path]) -> None:
    """A real venv and `pip install -e python` from the offline wheelhouse (no index)."""
    (upstream["patches"] / "0002-ddtree-budget.patch").unlink()
    venv = tmp_path / "venv"
    v = sglang_vars(tmp_path, upstream, sglang_install=True, sglang_venv=str(venv), sglang_python=sys.executable,
                    sglang_extras=[], sglang_pip_wheelhouse=str(WHEELHOUSE))
    install = "Install SGLang from the checkout (pip install -e python)"
    first = play(tmp_path, "sglang", v)
    assert first.rc == 0, first.out[-4000:]
    assert first.ran(install)
    probe = [str(venv / "bin/python"), "-c", "import sglang.srt.spec as s; print(s.ALGORITHMS)"]
    assert "DDTREE" in subprocess.run(probe, capture_output=True, text=True, check=True).stdout
    second = play(tmp_path, "sglang", v)
    assert second.rc == 0 and second.stats["changed"] == 0 and not second.ran(install), second.out[-4000:]
    # A patch joins the set: the checkout is unchanged, the applied set is not -> install again.
    (upstream["patches"] / "0002-ddtree-budget.patch").write_text(
        _new_file_patch("python/sglang/srt/ddtree.py", "BUDGET = 64\n"))
    third = play(tmp_path, "sglang", v)
    assert third.rc == 0 and third.ran(install), third.out[-4000:]
    probe[2] = "import sglang.srt.ddtree as d; print(d.BUDGET)"
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "64"


def _new_file_patch(path: str, text: str) -> str:
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}")


# ---------------------------------------------------------------- nvidia_userspace

HOST_DRIVER = "580.159.04"      # the driver of the real H200 capture (tests/fixtures/nvidia-h200)
OLD_DRIVER = "570.133.20"

STAND_IN_RUNFILE = """#!/bin/sh
# Stand-in for NVIDIA-Linux-x86_64-{version}.run (not NVIDIA's installer): records its arguments and, like the
# real installer replacing an earlier runfile install, leaves libnvidia-ml.so.{version} as the only NVML library.
printf '%s\\n' "$@" > {args}
rm -f {libdir}/libnvidia-ml.so.*
: > {libdir}/libnvidia-ml.so.{version}
ln -s libnvidia-ml.so.{version} {libdir}/libnvidia-ml.so.1
"""


@pytest.fixture
def container_libs(tmp_path: Path) -> Path:
    """A library folder holding an older userspace than the host's: what a container looks like after the host's
    driver was upgraded."""
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / f"libnvidia-ml.so.{OLD_DRIVER}").write_bytes(b"")
    (libdir / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{OLD_DRIVER}")
    return libdir


def nvidia_vars(tmp: Path, libdir: Path, **over: Any) -> dict[str, Any]:
    runfile = tmp / f"NVIDIA-Linux-x86_64-{HOST_DRIVER}.run"
    runfile.write_text(STAND_IN_RUNFILE.format(version=HOST_DRIVER, args=tmp / "runfile-args", libdir=libdir))
    return {"nvidia_userspace_version": HOST_DRIVER, "nvidia_userspace_runfile_path": str(runfile),
            "nvidia_userspace_libdirs": [str(libdir)], "nvidia_userspace_smi": str(tmp / "no-nvidia-smi"),
            "nvidia_userspace_system_packages": [], **over}


def nvidia_state(run: Run, task: str = "Work out what is installed and what to do") -> dict[str, Any]:
    return run.one(task)["result"]["ansible_facts"]["nvidia_userspace_state"]


def test_nvidia_userspace_mismatch_is_detected_and_fixed_then_unchanged(tmp_path: Path,
                                                                         container_libs: Path) -> None:
    v = nvidia_vars(tmp_path, container_libs)
    first = play(tmp_path, "nvidia_userspace", v)
    assert first.rc == 0, first.out[-4000:]
    before = nvidia_state(first)
    assert (before["version"], before["source"], before["action"]) == (OLD_DRIVER, "libnvidia-ml", "install")
    assert (tmp_path / "runfile-args").read_text().split() == ["--no-kernel-module", "--silent"]
    after = nvidia_state(first, "Record the state after the install")
    assert after["version"] == HOST_DRIVER and after["libraries"] == [HOST_DRIVER]
    (tmp_path / "runfile-args").unlink()
    second = play(tmp_path, "nvidia_userspace", v)
    assert second.rc == 0 and second.stats["changed"] == 0, second.out[-4000:]
    assert nvidia_state(second)["action"] == "none" and not (tmp_path / "runfile-args").exists()


def test_nvidia_userspace_check_mode_reports_the_mismatch_and_changes_nothing(tmp_path: Path,
                                                                              container_libs: Path) -> None:
    run = play(tmp_path, "nvidia_userspace", nvidia_vars(tmp_path, container_libs), check=True)
    assert run.rc == 0, run.out[-4000:]
    shown = run.one("Show the driver userspace state")["result"]["msg"]
    assert f"wanted {HOST_DRIVER}, installed {OLD_DRIVER} (from libnvidia-ml)" in shown
    assert f"install {HOST_DRIVER} by runfile" in shown
    assert not (tmp_path / "runfile-args").exists()
    assert sorted(p.name for p in container_libs.iterdir()) == ["libnvidia-ml.so.1", f"libnvidia-ml.so.{OLD_DRIVER}"]


@pytest.mark.parametrize("over,message", [
    ({"nvidia_userspace_method": "apt", "nvidia_userspace_apt_packages": ["libnvidia-compute-580", "cuda-drivers"]},
     "nvidia_userspace_apt_packages holds cuda-drivers"),
    ({"nvidia_userspace_apt_packages": ["nvidia-driver-580-open", "cuda"]},
     "nvidia_userspace_apt_packages holds cuda, nvidia-driver-580-open"),
    ({"nvidia_userspace_version": "580"}, 'nvidia_userspace_version "580" is not a driver version'),
])
def test_nvidia_userspace_refuses(tmp_path: Path, container_libs: Path, over: dict[str, Any], message: str) -> None:
    run = play(tmp_path, "nvidia_userspace", nvidia_vars(tmp_path, container_libs, **over), check=True)
    assert run.rc != 0 and message in run.out, run.out[-3000:]
    assert not run.tasks("Ask nvidia-smi for the driver version")     # refused before looking at the container


# ---------------------------------------------------------------- cuda_toolkit

def test_cuda_toolkit_check_mode_plan_for_blackwell(tmp_path: Path) -> None:
    profile = tmp_path / "cuda.sh"
    run = play(tmp_path, "cuda_toolkit", {"cuda_toolkit_gpu_archs": ["12.0"], "cuda_toolkit_version": "12.8",
                                          "cuda_toolkit_driver_version": HOST_DRIVER,
                                          "cuda_toolkit_profile_path": str(profile)}, check=True)
    assert run.rc == 0, run.out[-4000:]
    plan = run.one("Show the plan")["result"]["msg"]
    assert "/x86_64/cuda-keyring_1.1-1_all.deb" in plan and "missing packages: cuda-toolkit-12-8" in plan
    os_release = Path("/etc/os-release").read_text()
    if 'ID=debian' in os_release and 'VERSION_ID="12"' in os_release:
        assert "/compute/cuda/repos/debian12/x86_64/" in plan
    assert run.one("Write PATH, LD_LIBRARY_PATH and CUDA_HOME for login shells")["status"] == "changed"
    assert not profile.exists()                                   # check mode wrote nothing


@pytest.mark.parametrize("extra,message", [
    ({"cuda_toolkit_version": "12.6", "cuda_toolkit_gpu_archs": ["12.0"]},
     "compute capability 12.0 needs CUDA >= 12.8; cuda_toolkit_version is 12.6"),
    ({"cuda_toolkit_version": "12.4", "cuda_toolkit_gpu_archs": ["9.0", "sm_120"]},
     "compute capability 12.0 needs CUDA >= 12.8"),
    ({"cuda_toolkit_packages": ["cuda-toolkit-12-8", "cuda-drivers"]}, "cuda_toolkit_packages holds cuda-drivers"),
    ({"cuda_toolkit_packages": ["cuda-12-8"]}, "cuda_toolkit_packages holds cuda-12-8"),
    ({"cuda_toolkit_version": "13.0", "cuda_toolkit_driver_version": "575.51.03"},
     "CUDA 13.0 needs driver >= 580.65.06; the host has 575.51.03"),
    ({"cuda_toolkit_version": "12"}, 'cuda_toolkit_version "12" is not X.Y'),
])
def test_cuda_toolkit_preflight_refuses(tmp_path: Path, extra: dict[str, Any], message: str) -> None:
    run = play(tmp_path, "cuda_toolkit", extra, "--tags", "cuda_toolkit_preflight", check=True)
    assert run.rc != 0 and message in run.out, run.out[-3000:]


def test_cuda_toolkit_preflight_passes_hopper_and_blackwell_on_12_8(tmp_path: Path) -> None:
    run = play(tmp_path, "cuda_toolkit", {"cuda_toolkit_gpu_archs": ["9.0", "120"],
                                          "cuda_toolkit_driver_version": HOST_DRIVER},
               "--tags", "cuda_toolkit_preflight", check=True)
    assert run.rc == 0, run.out[-3000:]


def test_cuda_toolkit_profile_script_rendered_and_sourced(tmp_path: Path) -> None:
    profile = tmp_path / "profile.d/cuda.sh"
    profile.parent.mkdir()
    v = {"cuda_toolkit_profile_path": str(profile), "cuda_toolkit_version": "12.8"}
    first = play(tmp_path, "cuda_toolkit", v, "--tags", "cuda_toolkit_configure")
    assert first.rc == 0 and first.stats["changed"] == 1, first.out[-3000:]
    text = profile.read_text()
    assert text.startswith("#") and "# Ansible managed" in text.splitlines()[:3]
    script = f". {profile}; . {profile}; printf '%s\\n' \"$CUDA_HOME\" \"$PATH\" \"$LD_LIBRARY_PATH\""
    out = subprocess.run(["sh", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["/usr/local/cuda-12.8", "/usr/local/cuda-12.8/bin:/usr/bin:/bin", "/usr/local/cuda-12.8/lib64"]
    second = play(tmp_path, "cuda_toolkit", v, "--tags", "cuda_toolkit_configure")
    assert second.rc == 0 and second.stats["changed"] == 0, second.out[-3000:]


# ---------------------------------------------------------------- flash_attn

def _expected_jobs() -> int:
    import importlib.util

    spec = importlib.util.spec_from_file_location("fj", ROOT / "roles/flash_attn/filter_plugins/flash_attn_jobs.py")
    assert spec and spec.loader
    fj = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fj)
    probe = yaml.safe_load((ROOT / "roles/flash_attn/vars/main.yml").read_text())["_flash_attn_limits_probe"]
    out = subprocess.run(["/bin/sh", "-c", probe], capture_output=True, text=True, check=True).stdout
    return fj.flash_attn_max_jobs(fj.flash_attn_limits(out), 4, 5)


def test_flash_attn_installs_the_kept_wheel_of_its_key_and_never_rebuilds(tmp_path: Path) -> None:
    """Real venv, real wheel, real pip; torch (a dist-info) and nvcc (prints its version) are stand-ins."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    pyver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    site = venv / f"lib/python{pyver}/site-packages"
    torch_info = site / "torch-2.9.1+cu128.dist-info"
    torch_info.mkdir()
    (torch_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1+cu128\n")
    (torch_info / "RECORD").write_text("")
    nvcc = tmp_path / "cuda/bin/nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    "echo 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    cache = tmp_path / "wheels"
    key = f"fa2.8.3-torch2.9.1+cu128-cuda12.8-sm120-py{pyver}"
    (cache / key).mkdir(parents=True)
    make_wheel(cache / key / "flash_attn-2.8.3-py3-none-any.whl", "flash_attn", "2.8.3")
    v = {"flash_attn_enabled": True, "flash_attn_python": str(venv / "bin/python"), "flash_attn_gpu_archs": ["12.0"],
         "flash_attn_cuda_home": str(tmp_path / "cuda"), "flash_attn_cache_dir": str(cache)}

    first = play(tmp_path, "flash_attn", v)
    assert first.rc == 0, first.out[-4000:]
    assert f"MAX_JOBS={_expected_jobs()} NVCC_THREADS=4 FLASH_ATTN_CUDA_ARCHS=120" in \
        first.one("Show the build's parallelism")["result"]["msg"]
    assert "reuse the kept wheel" in first.one("Show the plan")["result"]["msg"]
    assert not first.ran("Build flash-attn (pip wheel --no-build-isolation; long)")
    assert first.ran("Install the kept wheel when the virtualenv does not hold this key's build")
    version = subprocess.run([str(venv / "bin/python"), "-c", "import flash_attn; print(flash_attn.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == "2.8.3" and (venv / ".specfleet-flash-attn-key").read_text().strip() == key

    second = play(tmp_path, "flash_attn", v)
    assert second.rc == 0 and second.stats["changed"] == 0, second.out[-4000:]

    # Another arch list is another key: no kept wheel, so a real run would build (check mode only here).
    other = play(tmp_path, "flash_attn", {**v, "flash_attn_gpu_archs": ["9.0", "12.0"]}, check=True)
    assert other.rc == 0, other.out[-4000:]
    assert "build the wheel, then install it" in other.one("Show the plan")["result"]["msg"]
    assert other.one("Build flash-attn (pip wheel --no-build-isolation; long)")["status"] == "skipped"
    assert sorted(p.name for p in cache.iterdir()) == [key]


def test_flash_attn_is_off_by_default(tmp_path: Path) -> None:
    run = play(tmp_path, "flash_attn", {}, check=True)
    assert run.rc == 0 and run.stats["changed"] == 0, run.out[-3000:]
    assert all(t["status"] == "skipped" for t in run.data["tasks"] if not t["task"].startswith("Validating arguments"))


# ---------------------------------------------------------------- model_weights

def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_model_weights_complete_stamp_skips_the_download(tmp_path: Path) -> None:
    dest = tmp_path / "models/target"
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}\n")
    manifest = [{"path": "config.json", "size": 3, "sha256": sha256(dest / "config.json")}]
    stamp = {"repo_id": "org/model", "revision": "0123456789abcdef0123456789abcdef01234567", "repo_type": "model",
             "allow_patterns": [], "ignore_patterns": [],
             "manifest_sha256": hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()}
    v = {"model_weights_python": sys.executable, "model_weights_hf_token": "",
         "model_weights_env": {"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"},
         "model_weights_models": [{"repo_id": "org/model", "revision": stamp["revision"], "dest": str(dest),
                                   "manifest": manifest}]}
    # The role writes the stamp; the test first learns the role's digest of the manifest from a check-mode run.
    probe = play(tmp_path, "model_weights", v, check=True)
    assert probe.rc == 0, probe.out[-3000:]
    stamp["manifest_sha256"] = probe.one("Describe the complete state of this model")["result"]["ansible_facts"][
        "__model_weights_want"]["manifest_sha256"]
    (dest / ".specfleet-complete.json").write_text(json.dumps(stamp))
    run = play(tmp_path, "model_weights", v)
    assert run.rc == 0 and run.stats["changed"] == 0, run.out[-3000:]
    assert "complete" in run.one("Show the plan")["result"]["msg"]
    assert not run.ran("Download the revision (token on the module's stdin, output hidden)")
    # Forced verification of the complete model: the manifest is checked for real and a changed file fails.
    (dest / "config.json").write_text("{ }\n")
    bad = play(tmp_path, "model_weights", {**v, "model_weights_force_verify": True})
    assert bad.rc != 0 and "config.json: size 4, expected 3" in bad.out, bad.out[-3000:]


def test_model_weights_failed_download_is_reported_without_the_token(tmp_path: Path) -> None:
    token = "hf_" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:30]
    dest = tmp_path / "models/draft"
    v = {"model_weights_python": sys.executable, "model_weights_hf_token": token,
         "model_weights_env": {"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "HF_HUB_ETAG_TIMEOUT": "2",
                               "HF_HUB_DOWNLOAD_TIMEOUT": "2"},
         "model_weights_models": [{"repo_id": "org/gated-model", "revision": "main", "dest": str(dest)}]}
    run = play(tmp_path, "model_weights", v, "-vvv")
    assert run.rc != 0
    assert "downloading org/gated-model@main failed" in run.out and ".specfleet-download.log ends with" in run.out
    assert "Connection refused" in run.out                               # the log's traceback is shown
    assert token not in run.out                                          # not in -vvv output (EXEC lines included)
    assert token not in json.dumps(run.data)                             # nor in any task result
    log = dest / ".specfleet-download.log"
    assert log.exists() and token not in log.read_text()
    assert not (dest / ".specfleet-complete.json").exists()
