"""Inventory plugin `specfleet_guard`: what Ansible reads before the play, judged first (agent.bounded)."""
from __future__ import annotations

import os
import sys
from typing import Any, Iterable, Iterator, Mapping, Optional

from ansible import context
from ansible.errors import AnsibleError, ExitCode
from ansible.parsing.quoting import unquote
from ansible.plugins.inventory import BaseInventoryPlugin
from ansible.utils.context_objects import GlobalCLIArgs
from ansible.utils.path import unfrackpath

try:
    from agent import bounded
except ImportError as exc:  # ansible from another Python than the project's
    raise AnsibleError(f"specfleet's agent package is not importable ({exc}): run `make venv` in the project") from None

DOCUMENTATION = r"""
name: specfleet_guard
short_description: Refuses a file Ansible would read without end, before it reads it
description:
  - Enabled first, it judges each file Ansible reads in its main process before the play (-e @file, inventory files,
    the host_vars/ and group_vars/ files beside the inventory and the playbooks) before Ansible reads it. One that is
    not a regular file of at most 64 MiB (or /dev/null) ends the command, exit status 1, in one line naming it, what
    it is and the limit, where a FIFO would block and /dev/zero be read until memory ends. It parses nothing, reads
    no file, and does nothing outside an Ansible command (a program on Ansible's API).
"""


def vars_files(folder: str, top: bool = True) -> Iterator[str]:
    """What the vars loader may read in host_vars/ or group_vars/ (DataLoader.find_vars_files), for any name."""
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) and os.access(folder, os.R_OK) else ():
        path, ext, hidden = os.path.join(folder, name), os.path.splitext(name)[1], name[0] == "." or name[-1] == "~"
        if not hidden and os.path.isdir(path) and (top or not ext):
            yield from vars_files(path, top=False)
        elif not hidden and (top or os.path.isfile(path) and ext in ("", ".yml", ".yaml", ".json")):
            yield path


def named(args: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(how the command names it, path) of the files Ansible reads before the play by a command's arguments, but for
    the inventory sources (each judged as it comes)."""
    base = args.get("basedir") or "."  # as DataLoader.path_dwim finds -e @file: from --playbook-dir, else here
    for opt in (str(o)[1:] for o in args.get("extra_vars") or () if str(o).startswith("@")):
        yield "-e @file", unfrackpath(os.path.join(base, os.path.expanduser(unquote(opt))), follow=False)
    places = [args.get("basedir"), *(os.path.dirname(os.path.abspath(p)) for p in args.get("args") or ()
                                     if "listtasks" in args and os.path.isfile(p)),  # ansible-playbook's playbooks
              *(s if os.path.isdir(s) else os.path.dirname(s) for s in args.get("inventory") or ())]  # as Ansible
    for place in dict.fromkeys(os.path.realpath(p) for p in places if p):
        for kind in ("host_vars", "group_vars"):
            yield from ((f"{kind} file", path) for path in vars_files(os.path.join(place, kind)))


def refused(files: Iterable[tuple[str, str]]) -> Optional[str]:
    """The one line for the first file that is not a regular file within its limit; None when all are."""
    for how, path in ((how, path) for how, path in files if os.path.realpath(path) != os.devnull):
        try:
            bounded.check(path, bounded.ANSIBLE_FILE)
        except bounded.BoundError as exc:
            return f"{how}: {exc}"
        except OSError:
            continue  # not there or not readable: Ansible says so itself
    return None


class InventoryModule(BaseInventoryPlugin):
    NAME = "specfleet_guard"
    first = True  # the command's own files are judged at the first source, before any is read

    def verify_file(self, path: str) -> bool:
        """Parses nothing (False); ends the command when a file it is about to read is refused."""
        if isinstance(context.CLIARGS, GlobalCLIArgs):  # an Ansible command, not a program of its own
            line = refused([*(named(context.CLIARGS) if InventoryModule.first else ()), ("inventory source", path)])
            InventoryModule.first = False
            if line:
                self.display.error(line)
                sys.exit(ExitCode.GENERIC_ERROR)
        return False
