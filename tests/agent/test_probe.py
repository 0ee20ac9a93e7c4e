"""agent.probe: an engine's flags and the values a flag accepts, read from a real argparse `--help`; the model
folders and the version read as on the host, and the whole probe run as the plan runs it (`python -c <source>`).

The engine here is a small module whose parser declares `--speculative-algorithm` with SGLang v0.5.10's choices
(its server_args.py: EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM; no DFLASH) or v0.5.11's (DFLASH added), and a
dist-info naming it `sglang` at that version; argparse renders the help exactly as SGLang's does.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import probe

V0510 = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
V0511 = ["DFLASH", *V0510]

# the flags of SGLang's ServerArgs that the ct200 profile uses, declared as SGLang declares them
ENGINE = '''import argparse
p = argparse.ArgumentParser(prog="sglang serve")
p.add_argument("--model-path")
p.add_argument("--tp-size", type=int)
p.add_argument("--speculative-algorithm", type=str, choices={choices!r}, help="Speculative algorithm.")
p.add_argument("--speculative-draft-model-path")
p.add_argument("--speculative-num-draft-tokens", type=int)
p.add_argument("--mem-fraction-static", type=float)
p.add_argument("--disable-overlap-schedule", action="store_true")
for flag in ("--served-model-name", "--host", "--port", "--context-length", "--attention-backend", "--page-size"):
    p.add_argument(flag)
for flag in ("--disable-radix-cache", "--trust-remote-code", "--enable-metrics"):
    p.add_argument(flag, action="store_true")
p.parse_args()
'''


def fake_sglang(root: Path, version: str, choices: list[str]) -> dict[str, str]:
    """A `fake_sglang.launch_server` module and an `sglang` dist-info at `version` under `root`; the env that
    finds them."""
    pkg = root / "fake_sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(ENGINE.format(choices=choices))
    info = root / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}


def launch(*spec: str) -> list[str]:
    return ["/py", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "1", *spec]


def test_argparse_help_gives_flags_and_choices(tmp_path: Path) -> None:
    env = fake_sglang(tmp_path, "0.5.10", V0510)
    flags, choices = probe.read_help(sys.executable, "fake_sglang.launch_server", env)
    assert {"--help", "--model-path", "--speculative-algorithm", "--disable-overlap-schedule"} <= flags
    assert choices == {"--speculative-algorithm": V0510}


def test_unknown_flags_and_values_outside_the_choices(tmp_path: Path) -> None:
    flags, choices = probe.read_help(sys.executable, "fake_sglang.launch_server",
                                     fake_sglang(tmp_path, "0.5.10", V0510))
    dflash = launch("--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/d")
    ddtree = launch("--speculative-algorithm=DDTREE", "--speculative-ddtree-budget", "16", "--page-size", "1",
                    "--ddtree-tree-mode")
    assert probe.unsupported(dflash, flags, choices) == ["--speculative-algorithm DFLASH"]
    assert probe.unsupported(ddtree, flags, choices) == ["--speculative-algorithm DDTREE",
                                                         "--speculative-ddtree-budget", "--ddtree-tree-mode"]
    assert probe.unsupported(launch("--speculative-algorithm", "EAGLE"), flags, choices) == []
    assert probe.unsupported(launch("--speculative-algorithm"), flags, choices) == ["--speculative-algorithm "]
    assert probe.unsupported(launch(), flags, choices) == []


def test_the_engine_answer_carries_the_version(tmp_path: Path) -> None:
    env = fake_sglang(tmp_path, "0.5.11", V0511)
    got = probe.engine(sys.executable, "fake_sglang.launch_server", ["sglang"], env)
    assert got["version"] == "0.5.11" and "error" not in got
    assert got["choices"]["--speculative-algorithm"] == V0511
    assert probe.unsupported(launch("--speculative-algorithm", "DFLASH"), set(got["flags"]), got["choices"]) == []


def test_a_failing_or_missing_engine_is_an_error_not_a_flag_list(tmp_path: Path) -> None:
    missing = probe.engine(str(tmp_path / "no-python"), "sglang.launch_server", ["sglang"])
    assert missing["version"] is None and "FileNotFoundError" in missing["error"] and "flags" not in missing
    broken = probe.engine(sys.executable, "no_such_engine_module", ["sglang"], {"PATH": "/usr/bin:/bin"})
    assert "failed (1)" in broken["error"] and "No module named no_such_engine_module" in broken["error"]
    with pytest.raises(RuntimeError, match="no_such_engine_module --help` failed"):
        probe.read_help(sys.executable, "no_such_engine_module", {"PATH": "/usr/bin:/bin"})


def test_model_folders_are_read_as_the_fit_needs_them(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"x" * 24)
    (folder / "pytorch_model.bin").write_bytes(b"x" * 5000)            # safetensors win, as the engines load them
    assert probe.model(str(folder)) == {"path": str(folder), "config": {"num_hidden_layers": 2}, "weights_bytes": 1024}
    assert probe.model(str(tmp_path / "absent")) == {"path": str(tmp_path / "absent"), "config": None,
                                                     "weights_bytes": None}


def test_the_source_runs_as_the_plan_sends_it(tmp_path: Path) -> None:
    """`python3 -c <agent/probe.py> <request>`: one JSON object back, nothing written."""
    env = fake_sglang(tmp_path / "eng", "0.5.10", V0510)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "w.safetensors").write_bytes(b"x" * 10)
    request = {"engine": {"python": sys.executable, "module": "fake_sglang.launch_server", "dists": ["sglang"],
                          "env": env}, "models": {"model": str(folder), "draft_model": str(tmp_path / "none")}}
    before = sorted(p.name for p in tmp_path.rglob("*"))
    res = subprocess.run([sys.executable, "-c", Path(probe.__file__).read_text(), json.dumps(request)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    answer = json.loads(res.stdout)
    assert answer["engine"]["version"] == "0.5.10" and answer["engine"]["choices"] == {"--speculative-algorithm": V0510}
    assert answer["models"]["model"]["weights_bytes"] == 10 and answer["models"]["draft_model"]["config"] is None
    assert answer["gpu_memory_mib"] is None                              # no nvidia-smi on this machine
    assert sorted(p.name for p in tmp_path.rglob("*") if "__pycache__" not in p.parts) == [
        n for n in before if n != "__pycache__"]


def test_the_help_is_kept_per_engine_build_and_read_again_when_the_code_changes(tmp_path: Path) -> None:
    """The agent keeps what --help said (Suite.keep_help); the next probe reads it instead of importing the
    engine, until a file of the engine's package changes (a rebuild under the same version)."""
    from agent.engines import ENGINES
    from agent.suite import Suite

    env = fake_sglang(tmp_path / "engine", "0.5.11", V0511)
    cache = tmp_path / "cache"
    first = probe.engine(sys.executable, "fake_sglang.launch_server", ["sglang"], env, cache=str(cache))
    assert first["version"] == "0.5.11" and first["key"] and "cached" not in first
    assert "--speculative-algorithm" in first["flags"]
    plan = {"suite": {"engine": "sglang", "engine_python": sys.executable, "env": {}}, "host": "h",
            "engine_help": {**first, "module": ENGINES["sglang"].module}}
    suite = Suite(plan, tmp_path / "results" / "r1", cache=cache)
    assert suite.help_key == first["key"]
    suite.keep_help()
    [kept] = cache.iterdir()
    assert kept.name == f"engine-help-{first['key']}.json"
    again = probe.engine(sys.executable, "fake_sglang.launch_server", ["sglang"], env, cache=str(cache))
    assert again["cached"] == str(kept) and again["flags"] == first["flags"] and again["choices"] == first["choices"]
    assert again["defaults"] == first["defaults"] == {}  # SGLang's help states no defaults
    # a help an earlier specfleet kept, without the defaults: read again (the run after keeps them)
    older = {k: v for k, v in json.loads(kept.read_text()).items() if k != "defaults"}
    kept.write_text(json.dumps(older))
    assert "cached" not in probe.engine(sys.executable, "fake_sglang.launch_server", ["sglang"], env, cache=str(cache))
    kept.write_text(json.dumps({**older, "defaults": {}}))
    # the same version rebuilt: one of its files is newer, so its help is read again
    source = tmp_path / "engine" / "fake_sglang" / "launch_server.py"
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    rebuilt = probe.engine(sys.executable, "fake_sglang.launch_server", ["sglang"], env, cache=str(cache))
    assert rebuilt["key"] != first["key"] and "cached" not in rebuilt and rebuilt["flags"] == first["flags"]
    # a damaged file is no help: read again
    kept.write_text('{"flags": ')
    assert "cached" not in probe.engine(sys.executable, "fake_sglang.launch_server", ["sglang"], env, cache=str(cache))


# Options as an engine's argparse declares them, rendered with argparse's own "(default: ...)" (vLLM's
# `--help=all` appends them the same way): (add_argument's args, its keywords, what help_defaults must read)
DEFAULTS = [
    (("--gpu-memory-utilization", "--device-memory-utilization"), {"type": float, "default": 0.92,
     "help": "The fraction of GPU memory to be used for the model executor, which can range from 0 to 1. "
             "See --max-num-seqs for the batch."}, "0.92"),
    (("--max-num-seqs",), {"type": int, "default": None, "help": "Maximum number of sequences."}, None),
    (("--seed",), {"type": int, "default": 0, "help": "Random seed."}, "0"),
    (("--dtype",), {"choices": ["auto", "bfloat16", "float16"], "default": "auto", "help": "Data type."}, "auto"),
    (("--enforce-eager",), {"action": "store_true", "help": "Always use eager-mode PyTorch."}, "False"),
    (("--chat-template-content-format",), {"default": "string, then openai", "help": "Format."},
     "string, then openai"),
    (("--no-help-text",), {"default": 7}, None),   # argparse states a default only after a help text
]


def test_help_defaults_read_every_spelling_and_leave_out_none(tmp_path: Path) -> None:
    """Each option's stated default under each spelling on its own line, whatever its help wraps to or mentions
    (a flag named in another option's text gets nothing from it); None (decided when the engine starts) is not a
    default, nor is one the help does not state; a section header between options changes nothing."""
    import argparse
    import io

    parser = argparse.ArgumentParser(prog="api_server.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    group = None
    for k, (flags, kwargs, _) in enumerate(DEFAULTS):
        if k == 3:
            group = parser.add_argument_group("ModelConfig", "Configuration for the model.")
        (group or parser).add_argument(*flags, **kwargs)
    out = io.StringIO()
    parser.print_help(out)
    got = probe.help_defaults(out.getvalue())
    want = {flag: value for flags, _, value in DEFAULTS if value is not None for flag in flags}
    assert got == want
    assert probe.help_defaults("usage: x [-h]\n\noptions:\n  -h, --help  show this help\n  --port PORT\n") == {}


@pytest.mark.parametrize("arg, flexible, name", [
    ("--max-num-seqs", False, "--max-num-seqs"), ("--max_num_seqs=4", False, "--max_num_seqs"),
    ("--max_num_seqs=4", True, "--max-num-seqs"), ("--speculative-config.method=ngram", True, "--speculative-config"),
    ("--speculative_config.num_speculative_tokens", True, "--speculative-config"), ("-tp", True, "-tp"),
])
def test_flag_names_as_the_engines_parser_reads_them(arg: str, flexible: bool, name: str) -> None:
    assert probe.flag_name(arg, flexible) == name


def test_a_vllm_spelling_of_a_known_flag_is_not_unsupported() -> None:
    flags = {"--max-num-seqs", "--speculative-config", "--dtype"}
    choices = {"--dtype": ["auto", "bfloat16"]}
    argv = ["/py", "-m", "m", "--max_num_seqs", "4", "--speculative-config.method=ngram", "--dtype=bfloat16"]
    assert probe.unsupported(argv, flags, choices, flexible=True) == []
    assert probe.unsupported(argv, flags, choices) == ["--max_num_seqs", "--speculative-config.method"]
    wrong = probe.unsupported(["--dtype_x", "--dtype=half"], flags, choices, flexible=True)
    assert wrong == ["--dtype-x", "--dtype half"]   # named as the engine reads them
