"""Whether a run counts as a success, by `bench_fail_on`: the exit status of `bench.yml`.

- `none_ok` (the default): fail when a host finished no config ok; its table would hold no number.
- `any`: fail when any config failed or was skipped (for CI-style gates).
- `never`: the run's statuses never fail the play (the table still shows them).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .results import Run

FAIL_ON = ("none_ok", "any", "never")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    lines: list[str]


def judge(run: Run, hosts: list[str], fail_on: str) -> Verdict:
    """One line per host (`local: 4 configs: 3 ok, 1 failed (oom)`) and whether the run passes `fail_on`."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"bench_fail_on: {fail_on!r}; allowed: {', '.join(FAIL_ON)}")
    lines, passed = [], True
    for host in hosts or sorted({c.host for c in run.configs}):
        statuses = [c.status for c in run.configs if c.host == host]
        counts = Counter(s.get("status") for s in statuses)
        reasons = Counter(str(s.get("reason")) for s in statuses if s.get("status") != "ok")
        why = f" ({', '.join(f'{r} {n}' for r, n in sorted(reasons.items()))})" if reasons else ""
        line = (f"{host}: {len(statuses)} configs: {counts['ok']} ok, {counts['failed']} failed, "
                f"{counts['skipped']} skipped{why}")
        bad = (fail_on == "none_ok" and counts["ok"] == 0) or (fail_on == "any" and counts["ok"] < len(statuses))
        if bad:
            line += f"  <- fails the run (bench_fail_on: {fail_on})"
        passed = passed and not bad
        lines.append(line)
    return Verdict(passed, lines)
