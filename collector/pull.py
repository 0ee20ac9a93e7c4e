"""`python -m collector pull -l HOSTS [RUN_ID]`: fetch a run's results through ansible-runner.

Runs playbooks/pull.yml (pack on each host, fetch, unpack under results/<run_id>/, report) and
shows progress from the runner's events as they arrive.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parents[1]  # the project itself when installed from its folder (-e)


def project(given: str | None = None) -> Path:
    """The specfleet project (ansible.cfg, playbooks/, inventory/): `--project`, else the current folder when it is
    one, else the folder the package was installed from in place."""
    for candidate in ([Path(given)] if given else []) + [Path.cwd(), SOURCE]:
        if (candidate / "playbooks/pull.yml").is_file() and (candidate / "ansible.cfg").is_file():
            return candidate.resolve()
    raise SystemExit(f"no specfleet project at {given or Path.cwd()}: run from the project folder or pass "
                     "--project")


def _show(event: dict[str, Any]) -> bool:
    data = event.get("event_data") or {}
    kind = event.get("event", "")
    host, task = data.get("host"), data.get("task")
    if kind == "runner_on_ok":
        print(f"  {host}: {task}: ok", flush=True)
    elif kind == "runner_on_failed":
        msg = (data.get("res") or {}).get("msg", "")
        print(f"  {host}: {task}: FAILED {msg}", flush=True)
    elif kind == "runner_on_unreachable":
        print(f"  {host}: unreachable: {(data.get('res') or {}).get('msg', '')}", flush=True)
    elif kind == "playbook_on_task_start":
        print(f"- {data.get('task')}", flush=True)
    return True


def pull(limit: str, run_id: str | None, inventory: list[str], results: str | None = None,
         project_dir: str | None = None) -> int:
    import ansible_runner

    root = project(project_dir)
    bin_dir = str(Path(sys.executable).parent)
    env = {"ANSIBLE_CONFIG": str(root / "ansible.cfg"), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
           "ANSIBLE_NOCOLOR": "1"}
    os.environ["PATH"] = env["PATH"]
    with tempfile.TemporaryDirectory(prefix="specfleet-pull-") as tmp:
        r = ansible_runner.run(
            private_data_dir=tmp, project_dir=str(root), playbook=str(root / "playbooks/pull.yml"),
            inventory=[str(Path(i).resolve()) for i in inventory] or [str(root / "inventory/hosts.yml")],
            limit=limit, extravars={**({"run_id": run_id} if run_id else {}),
                                    **({"bench_controller_results": str(Path(results).resolve())} if results else {})},
            envvars=env, quiet=True,
            event_handler=_show)
    print(f"pull {r.status} (rc {r.rc})")
    return int(r.rc or 0)
