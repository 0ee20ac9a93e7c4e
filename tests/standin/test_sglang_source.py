"""SGLang's side of the contract, read from SGLang's released code: for each version of the supported window (the
sglang role's pin, the DDTree pull request's base, the newest release checked) the wheel is downloaded by version
from the package index into `.cache/sglang-wheels` (never installed) and its Python files are read.

Checked against each: every flag the adapter and ct200's profile render (and, for its own version, every flag the
stand-in's SGLang dialect offers: 0.5.23 renamed two of them), the `meta_info` keys the stream client reads, the
stream's end, the health path, `/tokenize`'s request field, the counter names, the log messages that mark the ends
of the startup phases (agent.startup), every `SGLANG_*` variable the profile sets, and the build facts
`agent.probe.sglang_source` reads (DFlash's overlap, `/tokenize` with `messages`, the verify-step counter, the
algorithm registry). A changed assumption fails naming the file it was looked for in, or the file and line where it
moved. A planted change in a copy of a release shows that the checks can fail.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent import probe, startup
from agent.engines import ENGINES, SGLANG_ACCEPTED
from controller import matrix
from tests.conftest import ROOT
from tests.controller.test_matrix import suite_from_host_vars
from tests.standin.engine import SGLANG as STANDIN

pytestmark = pytest.mark.slow

# version -> what its source says (agent.probe.sglang_source)
WINDOW = {
    "0.5.11": {"dflash_overlap": False, "tokenize_messages": False, "verify_counter": False},  # the role's pin
    "0.5.15": {"dflash_overlap": True, "tokenize_messages": True, "verify_counter": True},  # DDTree PR's base
    "0.5.23": {"dflash_overlap": True, "tokenize_messages": True, "verify_counter": True},  # the newest checked
}
CACHE = ROOT / ".cache"
# the meta_info keys the client reads from every chunk, and from the finished chunk of a speculative request
META = ("completion_tokens", "prompt_tokens", "finish_reason", "spec_verify_ct", "spec_accept_length")


def source(version: str) -> Path:
    """The release's `sglang` package folder (its .py files only), extracted from the wheel in the cache."""
    out = CACHE / "sglang-src" / version / "sglang"
    if (out / "srt" / "server_args.py").is_file():
        return out
    wheels = CACHE / "sglang-wheels"
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                              "--python-version", "3.11", f"sglang=={version}", "-d", str(wheels), "-q"],
                             capture_output=True, text=True, timeout=600)
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
        if not found:
            pytest.skip(f"sglang {version}'s wheel cannot be downloaded here: {res.stderr.strip()[-300:]}")
    tmp = out.parent.with_name(version + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(found[0]) as whl:
        for name in whl.namelist():
            if name.startswith("sglang/") and name.endswith(".py"):
                whl.extract(name, tmp)
    shutil.rmtree(out.parent, ignore_errors=True)
    tmp.rename(out.parent)
    return out


def where(pkg: Path, pattern: str, files: list[str]) -> str | None:
    """`file:line` of the first match of `pattern` in `files` (globs under the package), None when none."""
    rx = re.compile(pattern, re.M)
    for glob in files:
        for path in sorted(pkg.glob(glob)):
            text = path.read_text(errors="replace")
            m = rx.search(text)
            if m:
                return f"{path.relative_to(pkg.parent)}:{text.count(chr(10), 0, m.start()) + 1}"
    return None


ARGS = ["srt/server_args.py", "srt/arg_groups/*.py", "srt/arg_groups/fields/*.py"]


def flag_defined(pkg: Path, flag: str) -> str | None:
    """Where the release defines `flag`: an `add_argument("--flag"` (0.5.11), or a field of the dataclasses its
    arguments are derived from (0.5.14 on: `speculative_num_steps: ...` gives `--speculative-num-steps`)."""
    field = flag[2:].replace("-", "_")
    return where(pkg, rf'"{re.escape(flag)}"', ARGS) or where(pkg, rf"^\s+{field}\s*:", ARGS)


def rendered_flags() -> set[str]:
    """Every flag the adapter renders for ct200's configs, with the profile's server arguments, and the key flag."""
    flags = {a for cfg in matrix.expand(suite_from_host_vars("ct200")) for a in cfg["command"] if a.startswith("--")}
    return flags | {a for a in ENGINES["sglang"].auth("k")[0] if a.startswith("--")}


def assumptions(pkg: Path, version: str) -> list[str]:
    """Every assumption specfleet makes about this release that its source does not bear out, one line each."""
    bad = []
    rendered = rendered_flags()
    offered = set(STANDIN.flags) | set(STANDIN.switches) if version == STANDIN.version else set()
    for flag in sorted(rendered | offered):
        if flag == "--speculative-ddtree-budget":
            continue  # the pull request's flag: no release has it (checked below)
        if flag_defined(pkg, flag) is None:
            who = "rendered by the adapter or ct200's profile" if flag in rendered else "offered by the stand-in"
            bad.append(f"{flag} ({who}): not defined in {', '.join(ARGS)}")
    ddtree = flag_defined(pkg, "--speculative-ddtree-budget")
    if ddtree is not None:
        bad.append(f"--speculative-ddtree-budget is in a release now: {ddtree}")
    managers = ["srt/managers/tokenizer_manager.py", "srt/managers/*.py"]
    for key in META:
        if where(pkg, rf'meta_info\["{key}"\]|^\s+"{key}"\s*:', managers) is None:
            bad.append(f"meta_info key {key!r} (read by agent.engines): not in {managers[1]}")
    if not any(where(pkg, rf'meta_info\["{k}"\]', managers) for k in SGLANG_ACCEPTED):
        bad.append(f"meta_info has none of {SGLANG_ACCEPTED} (the server's count of accepted drafts) in {managers[1]}")
    http = ["srt/entrypoints/http_server.py"]
    if where(pkg, r'data: \[DONE\]', http) is None:
        bad.append(f"the stream's end `data: [DONE]`: not in {http[0]}")
    if where(pkg, rf'"{re.escape(ENGINES["sglang"].health_path)}"', http) is None:
        bad.append(f"the health path {ENGINES['sglang'].health_path}: not routed in {http[0]}")
    if where(pkg, rf'"{re.escape(ENGINES["sglang"].generate_path)}"', http) is None:
        bad.append(f"the generate path {ENGINES['sglang'].generate_path}: not routed in {http[0]}")
    protocol = ["srt/entrypoints/openai/protocol.py"]
    if where(pkg, r"class TokenizeRequest\b[^\n]*\n(?:(?!\nclass )[\s\S])*?^\s+prompt\s*:", protocol) is None:
        bad.append(f"/tokenize's `prompt` field: not in TokenizeRequest in {protocol[0]}")
    metrics = ["srt/*/*collector*.py"]
    for key, name in (ENGINES["sglang"].counters or {}).items():
        if key == "verify_steps":
            continue  # from 0.5.15 only: judged with the build facts
        if where(pkg, rf'"{re.escape(name)}"', metrics) is None:
            bad.append(f"counter {name}: not in {metrics[0]}")
    environ = ["srt/environ.py"]
    suite = suite_from_host_vars("ct200")
    env_vars = set(suite.get("env") or {})
    env_vars |= {k for phase in suite["phases"] for c in phase["configs"] for k in c.get("env", {})}
    for var in sorted(v for v in env_vars if v.startswith("SGLANG_")):
        if where(pkg, rf"^\s+{var}\s*=", environ) is None:
            bad.append(f"ct200's profile sets {var}: not defined in {environ[0]}")
    logs = ["srt/model_executor/*.py", "srt/entrypoints/*.py", "srt/**/*.py"]
    for phase, mark, _last in startup.MARKS["sglang"]:
        if where(pkg, mark.pattern, logs) is None:
            bad.append(f"the startup mark of {phase} ({mark.pattern!r}, read by agent.startup): not logged in srt/")
    facts = probe.sglang_source(str(pkg))
    want = WINDOW.get(version)
    if want is not None:
        for key, value in want.items():
            if facts.get(key) != value:
                bad.append(f"build fact {key}: the source says {facts.get(key)}, {version} is known as {value} "
                           f"(agent.probe.sglang_source's markers moved)")
    if "DDTREE" in facts.get("algorithms", []):
        bad.append("DDTREE is in a release's registry now: the plan's support check must say so")
    if not {"DFLASH", "NGRAM", "EAGLE"} <= set(facts.get("algorithms", [])):
        bad.append(f"the registry in srt/speculative/spec_info.py reads as {facts.get('algorithms')}")
    return bad


@pytest.mark.parametrize("version", list(WINDOW))
def test_every_assumption_holds_in_the_release(version: str) -> None:
    assert assumptions(source(version), version) == []


def test_the_stand_in_answers_as_its_version_does() -> None:
    """The stand-in's SGLang dialect is the DDTree pull request's base: the names of its finished chunk and of its
    verify counter are that release's."""
    pkg = source(STANDIN.version)
    managers = ["srt/managers/*.py"]
    for key in ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_num_proposed_drafts"):
        assert where(pkg, rf'meta_info\["{key}"\]', managers), key
    assert where(pkg, r'"sglang:spec_verify_calls_total"', ["srt/*/*collector*.py"])


def test_a_planted_change_fails_naming_the_file(tmp_path: Path) -> None:
    """A copy of the pull request's base with a renamed meta_info key, a flag gone, DFlash forced off overlap again
    and the KV cache's startup message reworded: each is reported."""
    pkg = tmp_path / "sglang"
    shutil.copytree(source("0.5.15"), pkg)
    tm = pkg / "srt/managers/tokenizer_manager.py"
    tm.write_text(tm.read_text().replace('"spec_verify_ct"', '"spec_verify_count"'))
    for path in (pkg / "srt").rglob("*.py"):
        text = path.read_text(errors="replace")
        if "page_size" in text:
            path.write_text(re.sub(r"\bpage_size\b", "page_len", text).replace('"--page-size"', '"--page-len"'))
    for path in (pkg / "srt").rglob("*.py"):
        text = path.read_text(errors="replace")
        if "KV Cache is allocated" in text:
            path.write_text(text.replace("KV Cache is allocated", "KV cache allocated"))
    hook = pkg / "srt/arg_groups/speculative_hook.py"
    hook.write_text(hook.read_text() + f'\n# "{probe.SGLANG_DFLASH_NO_OVERLAP}"\n')
    bad = assumptions(pkg, "0.5.15")
    assert any(line.startswith("meta_info key 'spec_verify_ct'") for line in bad), bad
    assert any(line.startswith("--page-size (rendered by the adapter") for line in bad), bad
    assert any(line.startswith("build fact dflash_overlap: the source says False") for line in bad), bad
    assert any(line.startswith("the startup mark of kv_cache") for line in bad), bad
