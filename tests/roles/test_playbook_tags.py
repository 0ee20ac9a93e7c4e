"""Tags reach the roles from every playbook: `--list-tags` lists each role's phases (`<role>_<phase>`), every task
of a role carries one phase of its own role, and `--tags <role>_<phase>` selects exactly the tasks that carry it.

Listing only (`--list-tags`, `--list-tasks`): nothing connects to a host. A phase entered through a dynamic include
(`include_tasks`) is listed as that include, which carries the phase and applies it to what it includes (checked
in the role's YAML below).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests import playbook
from tests.conftest import ROOT
from tests.readme import resolves, typed

# playbook -> a host of the shipped inventory it applies to, and the phase whose selection is run
PLAYBOOKS = {
    "playbooks/provision.yml": ("ct200", "sglang_patches"),
    "playbooks/recover.yml": ("ct200", "nvidia_userspace_detect"),
    "bench.yml": ("local", "bench_report"),
    "playbooks/pull.yml": ("local", "bench_pull"),
    "playbooks/engine.yml": ("local", "engine_venv_install"),
    "playbooks/llamacpp.yml": ("local", "llamacpp_build"),
}
ALWAYS = "always"
TASK = re.compile(r"^ {6}(?:(?P<role>\w+) : )?(?P<name>.+?)\tTAGS: \[(?P<tags>[^\]]*)\]$", re.M)


def listed(path: str, host: str, *args: str) -> list[tuple[str | None, str, set[str]]]:
    """(role, task name, tags) of every task `--list-tasks` shows."""
    run = playbook.play([path, "-l", host, "--list-tasks", *args], timeout=120)
    assert run.rc == 0, run.out[-3000:]
    return [(m["role"], m["name"], {t.strip() for t in m["tags"].split(",") if t.strip()})
            for m in TASK.finditer(run.proc.stdout)]


@pytest.mark.parametrize("path", list(PLAYBOOKS))
def test_tags_reach_every_task_of_every_role(path: str) -> None:
    host, phase = PLAYBOOKS[path]
    tasks = listed(path, host)
    assert tasks, path
    run = playbook.play([path, "-l", host, "--list-tags"], timeout=120)
    listed_tags = set(re.findall(r"TASK TAGS: \[([^\]]*)\]", run.proc.stdout)[0].replace(" ", "").split(","))
    phases: set[str] = set()
    for role, name, tags in tasks:
        if role is None:                      # the playbook's own tasks: run whatever is selected
            assert tags == {ALWAYS}, (path, name, tags)
            continue
        own = {t for t in tags if t.startswith(f"{role}_")}
        assert len(own) == 1 and tags - own <= {ALWAYS} or name.startswith("Validating arguments"), \
            (path, role, name, tags)
        phases |= own
    assert listed_tags == phases | {ALWAYS}, (path, listed_tags ^ (phases | {ALWAYS}))

    selected = listed(path, host, "--tags", phase)
    expected = [(r, n) for r, n, tags in tasks if phase in tags or ALWAYS in tags]
    assert [(r, n) for r, n, _ in selected] == expected, path
    assert any(phase in tags for _, _, tags in selected), path


def test_each_dynamic_include_applies_its_phase() -> None:
    """An include_tasks in a role's main.yml carries its phase and applies it to the tasks it includes."""
    for main in sorted(ROOT.glob("roles/*/tasks/main.yml")):
        role = main.parent.parent.name
        for task in yaml.safe_load(main.read_text()):
            include = task.get("ansible.builtin.include_tasks")
            if include is None:
                assert task.get("tags"), (role, task["name"])
                continue
            assert isinstance(include, dict), (role, task["name"], "apply the phase: file + apply.tags")
            tags = task.get("tags")
            assert tags and len(tags) == 1 and tags[0].startswith(f"{role}_"), (role, task["name"], tags)
            assert include.get("apply", {}).get("tags") == tags, (role, task["name"])


def test_the_roles_phases_are_named_after_the_role() -> None:
    for main in sorted(ROOT.glob("roles/*/tasks/main.yml")):
        role = main.parent.parent.name
        for task in yaml.safe_load(main.read_text()):
            for tag in task.get("tags", []):
                assert tag.startswith(f"{role}_"), (str(Path(main).relative_to(ROOT)), tag)


ct200_unreachable = pytest.mark.skipif(resolves("ct200") or resolves("pve1"),
                                       reason="ct200 or pve1 resolves here: as typed, this would work on them")


def test_list_tags_as_typed_lists_every_phase_of_provisioning() -> None:
    res = typed("ansible-playbook playbooks/provision.yml -l ct200 --list-tags", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    tags = set(re.findall(r"TASK TAGS: \[([^\]]*)\]", res.stdout)[0].replace(" ", "").split(","))
    for role in ("pve_gpu_passthrough", "nvidia_userspace", "cuda_toolkit", "sglang", "flash_attn", "model_weights",
                 "gpu_smoke"):
        assert any(t.startswith(f"{role}_") for t in tags), (role, tags)


@ct200_unreachable
def test_one_phase_as_typed_on_unreachable_ct200_stops_at_once() -> None:
    """The phase's own tasks are selected (above); as typed here, with ct200 out of reach, the facts that every
    phase needs cannot be gathered and nothing else is tried."""
    res = typed("ansible-playbook playbooks/provision.yml -l ct200 --tags sglang_patches", timeout=120)
    assert res.returncode == 4 and "Could not resolve hostname ct200" in res.stdout, res.stdout[-3000:]
    assert "Traceback" not in res.stdout + res.stderr and "TASK [sglang" not in res.stdout
