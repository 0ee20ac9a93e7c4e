"""Running one role through the real `ansible-playbook` against this machine (connection local), for the role tests.

`run_role` writes a run folder with its own inventory (one host, this interpreter), a play with the role, the
variables as an extra-vars file, and a post task that keeps a fact of the role's for the test; it returns the
process, that fact and the host's recap counts; the run itself goes through `tests.playbook.play`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from tests import playbook
from tests.playbook import ROOT, ansible_env  # noqa: F401  (ansible_env: for the role tests)

BIN = playbook.BIN
# /etc/pve/lxc/200.conf of a container before any passthrough (the pct stand-in serves it)
PVE_CT200_CONF = """\
arch: amd64
cores: 32
hostname: ct200
memory: 262144
net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:5E:12:A0,ip=dhcp,type=veth
ostype: ubuntu
rootfs: local-lvm:vm-200-disk-0,size=200G
swap: 0
"""


@dataclass
class RoleRun:
    """One ansible-playbook run of a role: the process, its output, the kept fact and the host's recap."""

    proc: subprocess.CompletedProcess[str]
    result: dict[str, Any]
    recap: dict[str, int] = field(default_factory=dict)

    @property
    def out(self) -> str:
        return self.proc.stdout + self.proc.stderr

    @property
    def changed(self) -> int:
        return self.recap.get("changed", -1)

    @property
    def failed(self) -> int:
        return self.recap.get("failed", -1)


def run_role(run_dir: Path, role: str, host: str, variables: Mapping[str, Any], *args: str,
             result_var: str | None = None, env: Mapping[str, str] | None = None,
             path: Sequence[os.PathLike[str] | str] = (), timeout: float = 300) -> RoleRun:
    """ansible-playbook with `role` on `host` (this machine, connection local) and `variables` as extra vars.

    `result_var`, when the role sets it, is written to the run folder by a post task (also in check mode) and
    returned as `result` ({} when the role did not set it). `env` and `path` go to ansible_env.
    """
    run_dir.mkdir(parents=True)
    inventory, play_file, extra = run_dir / "inventory.yml", run_dir / "play.yml", run_dir / "vars.yml"
    result_file = run_dir / "result.json"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {host: {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    post_tasks = []
    if result_var:
        post_tasks.append({"name": "Keep the role's result for the test", "ansible.builtin.copy": {
            "content": f"{{{{ {result_var} | to_nice_json }}}}", "dest": str(result_file), "mode": "0644"},
            "check_mode": False, "changed_when": False, "when": f"{result_var} is defined"})
    play_file.write_text(yaml.safe_dump([{"name": f"Role {role}", "hosts": host, "gather_facts": False,
                                     "roles": [{"role": role}], "post_tasks": post_tasks}], sort_keys=False))
    extra.write_text(yaml.safe_dump(dict(variables)))
    run = playbook.play(["-i", str(inventory), str(play_file), "-e", f"@{extra}", *args],
                        env={"ANSIBLE_FILTER_PLUGINS": str(ROOT / "plugins" / "filter"),
                             "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_LOCAL_TEMP": str(run_dir / "tmp"),
                             **(env or {})}, path=path, timeout=timeout)
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    return RoleRun(run.proc, result, run.recap(host))
