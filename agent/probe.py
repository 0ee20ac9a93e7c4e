"""What a host can do, read before any start: the installed engine's `--help` (its flags and the values a flag
accepts) and version, the model folders' `config.json` and weight sizes, and the GPUs' memory.

Standard library only and without package-relative imports: the plan sends this file's text to the host as
`python3 -c <text> <json>` (nothing is written there, so plan and check mode can use it) and reads back one
JSON object. The agent imports the help parser from here too, so flags are read one way.

Reading `--help` imports the whole engine (seconds). What it says is kept on the host, by the agent, in
`<host_dir>/cache/engine-help-<key>.json`, the key naming the engine's Python, module and version and its
package's Python files (how many, the newest modification): a rebuilt engine (a new commit checked out under the
same version) is read again; an unchanged one is not.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

try:  # imported as agent.probe (the agent's archive, the controller): the one reader of user-named files
    from . import bounded as _bounded
except ImportError:  # this text run alone (`python -c`, as the plan sends it): _read_bounded checks the same itself
    _bounded = None  # type: ignore[assignment]

FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*")
# argparse's rendering of `choices`: "--speculative-algorithm {EAGLE,EAGLE3,NGRAM}"
CHOICES = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)[ =]\{([^{}\s]+)\}")

# Run by the engine's Python: its distribution's version and what identifies the installed package's code
# (found without importing it).
IDENTITY = (
    "import importlib.metadata as m, importlib.util as u, json, os, sys\n"
    "out = {'version': None, 'package': None, 'py_files': 0, 'newest_ns': 0}\n"
    "for d in sys.argv[2:]:\n"
    "    try:\n"
    "        out['version'] = m.version(d); break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "spec = u.find_spec(sys.argv[1].split('.')[0])\n"
    "for top in (spec.submodule_search_locations or []) if spec else []:\n"
    "    out['package'] = top\n"
    "    for root, _, files in os.walk(top):\n"
    "        for f in files:\n"
    "            if f.endswith('.py'):\n"
    "                out['py_files'] += 1\n"
    "                out['newest_ns'] = max(out['newest_ns'], os.stat(os.path.join(root, f)).st_mtime_ns)\n"
    "print(json.dumps(out))\n"
)


def help_flags(text: str) -> Set[str]:
    """Every `--flag` a help text mentions."""
    return set(FLAG.findall(text))


# an option's line in argparse's help ("  --flag META, --alias META"), and the default argparse appends to its text
OPTION = re.compile(r"^  (--[A-Za-z0-9][^\n]*)$", re.M)
DEFAULT = re.compile(r"\(default: ([^()\n]*)\)")


def help_defaults(text: str) -> Dict[str, str]:
    """The default each flag's help states ("(default: 0.92)", as vLLM's `--help=all` prints them), under every
    spelling on the option's line; a flag whose default is None (computed when the engine starts) is left out."""
    out: Dict[str, str] = {}
    starts = list(OPTION.finditer(text))
    for i, m in enumerate(starts):
        block = text[m.start():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        found = DEFAULT.findall(" ".join(block.split()))
        if found and found[-1].strip() not in ("None", ""):
            for flag in FLAG.findall(m.group(1)):
                out.setdefault(flag, found[-1].strip())
    return out


# llama.cpp's rendering of a closed list: "--spec-type none,draft-simple,draft-eagle3,..." (common/arg.cpp)
LISTED = re.compile(r"^(?:-[\w-]+, +)?(--[A-Za-z0-9][\w-]*) ([a-z0-9][a-z0-9-]*(?:,[a-z0-9][a-z0-9-]*){2,})(?= |$)",
                    re.M)


def help_choices(text: str) -> Dict[str, List[str]]:
    """The values each flag accepts where the help lists them: argparse's choices, llama.cpp's value lists."""
    out: Dict[str, List[str]] = {}
    for flag, values in [*CHOICES.findall(text), *LISTED.findall(text)]:
        out.setdefault(flag, [v for v in values.split(",") if v])
    return out


# What an SGLang build can do, read from its own source (nothing imported): each marker is checked against
# SGLang's released wheels by tests/standin/test_sglang_source.py, which names the file and line that moved.
SGLANG_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DDTREE")  # the names the adapter renders
SGLANG_DFLASH_NO_OVERLAP = "when using DFLASH speculative decoding (spec v2 is not supported yet)"
SGLANG_VERIFY_COUNTER = "sglang:spec_verify_calls_total"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def sglang_source(package: Optional[str]) -> Dict[str, Any]:
    """From an installed SGLang package folder: the speculative algorithms it knows among those specfleet renders
    (its enum, or a name its argument handling compares against, as a pull request's DDTREE), whether DFLASH may
    run overlapped (up to 0.5.13 the server forces the overlap scheduler off for it), whether `/tokenize` takes
    `messages` (0.5.15 on) and whether it counts verify steps (`sglang:spec_verify_calls_total`, 0.5.15 on).
    {} when the source is not there."""
    if not package:
        return {}
    srt = Path(package) / "srt"
    registry = _read(srt / "speculative" / "spec_info.py")
    if not registry:
        return {}
    enum = re.search(r"class SpeculativeAlgorithm\b.*?:\n(.*?)(?:\n    (?:def|@)|\nclass )", registry, re.S)
    members = set(re.findall(r"^    ([A-Z][A-Z0-9_]*) = ", enum.group(1), re.M)) if enum else set()
    handling = "".join(_read(f) for f in [srt / "server_args.py", *sorted((srt / "arg_groups").glob("*.py")),
                                           *sorted((srt / "speculative").glob("*.py"))])
    algorithms = [a for a in SGLANG_ALGORITHMS if a in members or f'"{a}"' in handling]
    protocol = _read(srt / "entrypoints" / "openai" / "protocol.py")
    tokenize = re.search(r"class TokenizeRequest\b.*?:\n(.*?)(?:\nclass |\Z)", protocol, re.S)
    metrics = "".join(_read(f) for f in sorted(srt.glob("*/*collector*.py")))
    return {"algorithms": algorithms,
            "dflash_overlap": "DFLASH" in algorithms and SGLANG_DFLASH_NO_OVERLAP not in handling,
            "tokenize_messages": bool(tokenize and re.search(r"^\s+messages\s*:", tokenize.group(1), re.M)),
            "verify_counter": SGLANG_VERIFY_COUNTER in metrics}


CONTEXT_FLAGS = ("--max-model-len", "--context-length")  # vLLM's and SGLang's: the server's context, set by hand


def _window(model: Optional[Mapping[str, Any]], scaled: bool = False) -> Optional[int]:
    """A model's context from its config.json (`max_position_embeddings`); None where it was not read, or (unless
    `scaled`) where RoPE scaling lets the engine derive a longer one."""
    config = (model or {}).get("config") or {}
    window = config.get("max_position_embeddings")
    if not isinstance(window, int) or isinstance(window, bool) or (config.get("rope_scaling") and not scaled):
        return None
    return window


def build_limits(cfg: Mapping[str, Any], features: Mapping[str, Any],
                 drafter: Optional[Mapping[str, Any]] = None,
                 target: Optional[Mapping[str, Any]] = None) -> List[Tuple[str, str]]:
    """What a config asks that the installed engine or its models cannot give, one (what, why) each: chat workloads
    need `/tokenize` with `messages` (SGLang 0.5.15 on; judged where the build's source was read); a speculative
    config's longest request (context + output) must fit the drafter's context, and any config's the target
    model's own context where the matrix sets none (`max_model_len`, or the engine's flag in server_args): each
    its config.json `max_position_embeddings`, where it was read."""
    out = []
    longest = max((c["context_tokens"] + c["max_tokens"] for c in cfg.get("cells") or []), default=0)
    own = _window(target)
    set_by_hand = (cfg.get("model") or {}).get("max_model_len") or any(
        flag_name(str(a), True) in CONTEXT_FLAGS for a in cfg.get("server_args") or [])
    if own is not None and not set_by_hand and longest > own:
        out.append(("model", f"its longest request ({longest} tokens: context + max_tokens) is beyond the model's "
                             f"context ({own} tokens, max_position_embeddings in its config.json; no length is set by "
                             f"bench_model.max_model_len or {'/'.join(CONTEXT_FLAGS)})"))
    if features.get("tokenize_messages") is False:
        prompts = cfg.get("prompts") or {}
        chat = sorted({c["workload"] for c in cfg.get("cells") or [] if isinstance(prompts.get(c["workload"]), list)})
        out += [("prompt", f"chat workload {w!r}: this build's /tokenize takes no messages (SGLang takes them from "
                           f"0.5.15 on; llama.cpp's takes a text only)")
                for w in chat]
    window = _window(drafter, scaled=True)
    if cfg.get("draft_model") and window is not None and cfg.get("cells"):
        if longest > window:
            out.append(("drafter", f"its longest request ({longest} tokens: context + max_tokens) is beyond the "
                                   f"drafter's context ({window} tokens, max_position_embeddings in its config.json)"))
    return out


def same_servers(configs: Sequence[Mapping[str, Any]]) -> Dict[str, str]:
    """DFlash configs whose commands differ only by --disable-overlap-schedule, each mapped to the first of its
    kind: one server on a build that never overlaps DFlash."""
    seen: Dict[Tuple[str, ...], str] = {}
    out: Dict[str, str] = {}
    for cfg in configs:
        if cfg.get("method") != "dflash":
            continue
        key = (str(cfg.get("tp")), *(a for a in cfg["command"] if a != "--disable-overlap-schedule"),
               json.dumps(cfg.get("env") or {}, sort_keys=True), json.dumps(cfg.get("cells") or [], sort_keys=True))
        if key in seen:
            out[cfg["config_id"]] = seen[key]
        else:
            seen[key] = cfg["config_id"]
    return out


def with_source_choices(choices: Mapping[str, Sequence[str]], features: Mapping[str, Any]) -> Dict[str, List[str]]:
    """The help's choices, and where `--speculative-algorithm` is a free string (SGLang 0.5.14 on), the
    algorithms the build's source knows: a DDTREE config on a build without DDTree is refused either way."""
    out = {k: list(v) for k, v in choices.items()}
    if "--speculative-algorithm" not in out and features.get("algorithms"):
        out["--speculative-algorithm"] = list(features["algorithms"])
    return out


def flag_name(arg: str, flexible: bool = False) -> str:
    """The flag an argument sets, its `=value` left out; `flexible`: as vLLM's parser reads names (underscores as
    dashes, `--speculative-config.method` as a key of `--speculative-config`)."""
    name = arg.split("=", 1)[0]
    if flexible and name.startswith("--"):
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name


def unsupported(argv: Sequence[str], flags: Set[str], choices: Mapping[str, Sequence[str]],
                flexible: bool = False) -> List[str]:
    """The launch arguments the engine would refuse: flags its help does not know, and values outside a
    flag's listed choices (`--speculative-algorithm DDTREE`); `flexible`: names read as vLLM reads them."""
    out = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        _, eq, value = arg.partition("=")
        name = flag_name(arg, flexible)
        if name not in flags:
            out.append(name)
            continue
        if name in choices:
            given = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if given not in choices[name]:
                out.append(f"{name} {given}")
    return out


def entry(python: str, module: str) -> List[str]:
    """How the engine starts: `<python> -m <module>`, or (`module` empty) `python` names a program of its own."""
    return [python, "-m", module] if module else [python]


def help_text(python: str, module: str, env: Optional[Mapping[str, str]] = None, timeout: float = 600,
              arg: str = "--help") -> str:
    """What `<python> -m <module> <arg>` (or the program `python` itself, `module` empty) prints (`arg`: the engine's
    help switch, `--help=all` for vLLM, whose plain help leaves out some flags and every default); RuntimeError
    naming the command when it fails or names no flags, OSError when the interpreter is not there."""
    argv = [*entry(python, module), arg]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=None if env is None else dict(env))
    text = res.stdout + res.stderr
    flags = help_flags(text)
    if res.returncode != 0 or "--help" not in flags and len(flags) < 5:
        lines = (res.stderr or res.stdout).strip().splitlines()[-10:]
        raise RuntimeError(f"`{' '.join(argv)}` failed ({res.returncode}): " + "\n".join(lines))
    return text


def read_help(python: str, module: str, env: Optional[Mapping[str, str]] = None, timeout: float = 600,
              arg: str = "--help") -> Tuple[Set[str], Dict[str, List[str]]]:
    """The flags and choices of the engine's help (`help_text`)."""
    text = help_text(python, module, env, timeout, arg)
    return help_flags(text), help_choices(text)


# llama_print_build_info's first line: "version: 0.5.0-dev (build 1, commit 0c1e570)" (older: "version: 4567 (0c1e570)")
LLAMACPP_VERSION = re.compile(r"^version: (\S+)(?: \((?:.*\bcommit )?([0-9a-f]{6,40}|unknown)\))?", re.M)


def program_identity(program: str, env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """A program engine's (llama-server) version and commit from its `--version`, and what identifies its build
    (path, size, modification time): `key`, as `identity`'s."""
    try:
        st = os.stat(program)
        res = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=120,
                             env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return {"version": None, "key": None}
    found = LLAMACPP_VERSION.search(res.stdout + res.stderr)
    out: Dict[str, Any] = {"version": found.group(1) if found else None,
                           "commit": found.group(2) if found and found.group(2) not in ("", "unknown") else None,
                           "package": program, "size": st.st_size, "newest_ns": st.st_mtime_ns}
    named = json.dumps({"program": program, **out}, sort_keys=True)
    out["key"] = hashlib.sha256(named.encode()).hexdigest()[:20]
    return out


def identity(python: str, module: str, dists: Sequence[str], env: Optional[Mapping[str, str]] = None
             ) -> Dict[str, Any]:
    """The engine's version and the identity of its code, with `key` (what its cached help is filed under)."""
    if not module:
        return program_identity(python, env)
    res = subprocess.run([python, "-c", IDENTITY, module, *dists], capture_output=True, text=True, timeout=120,
                         env=None if env is None else dict(env))
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"version": None, "key": None}
    named = json.dumps({"python": python, "module": module, **out}, sort_keys=True)
    out["key"] = hashlib.sha256(named.encode()).hexdigest()[:20] if out.get("package") else None
    return out


def cache_path(cache: str, key: str) -> Path:
    return Path(cache) / f"engine-help-{key}.json"


HELP_CACHE_BYTES = 16 << 20  # agent.bounded.HELP_CACHE's limit, for this text run alone
CONFIG_BYTES = 64 << 20  # agent.bounded.RECORD's: a model folder's config.json


def _within(path: Path, st: os.stat_result, limit: int, size: Optional[int] = None) -> None:
    """Raises OSError, one line naming the file and the limit, unless `st` is a regular file within it."""
    allowed = f"allowed: a regular file of at most {limit >> 20} MiB"
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path}: not a regular file; {allowed}")
    if max(st.st_size, size or 0) > limit:
        raise OSError(f"{path}: larger than {limit >> 20} MiB; {allowed}")


def _read_bounded(path: Path, bound: str, limit: int) -> str:
    """A user-named file's text (a kept help in the host folder, a model folder's config.json), once it is a regular
    file within its limit: a FIFO or a device there fails at once, naming the file and the limit, instead of being
    read without end; OSError otherwise. Through agent.bounded (`bound`: the name of its limit there) where it is
    importable, else with its checks here (`limit`, equal to it): judged before it is opened, opened without
    blocking, judged again, read to one byte past the limit."""
    if _bounded is not None:
        return _bounded.read_text(path, getattr(_bounded, bound))
    _within(path, os.stat(path), limit)
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY), "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        _within(path, st, limit)
        data = f.read(limit + 1)
    _within(path, st, limit, len(data))  # it grew while read
    return data.decode()


def cached(cache: Optional[str], key: Optional[str], problems: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    """The help kept under `key`, when there is one and it holds flags. A kept file that is not a regular file
    within its limit is said in `problems`, one line naming it and the limit."""
    if not cache or not key:
        return None
    try:
        data = json.loads(_read_bounded(cache_path(cache, key), "HELP_CACHE", HELP_CACHE_BYTES))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if problems is not None:
            problems.append(f"{exc}; --help read again")
        return None
    except ValueError:
        return None
    # a help kept by an earlier specfleet, without the defaults, is read again (once)
    return data if isinstance(data, dict) and data.get("flags") and "defaults" in data else None


def engine(python: str, module: str, dists: Sequence[str], env: Optional[Mapping[str, str]] = None,
           timeout: float = 600, cache: Optional[str] = None, arg: str = "--help") -> Dict[str, Any]:
    """The engine's version and help (`arg`) as flags, choices and stated defaults (from the host's cache when this
    very engine was read before: `cached` names the file), or why they could not be read."""
    out: Dict[str, Any] = {"python": python, "module": module, "version": None, "key": None}
    try:
        ident = identity(python, module, dists, env)
        out.update(version=ident.get("version"), key=ident.get("key"))
        skipped: List[str] = []
        kept = cached(cache, out["key"], skipped)
        if skipped:
            out["cache_problem"] = skipped[0]
        if kept:
            out.update(flags=kept["flags"], choices=kept.get("choices") or {}, features=kept.get("features") or {},
                       defaults=kept.get("defaults") or {}, cached=str(cache_path(str(cache), out["key"])))
            return out
        text = help_text(python, module, env, timeout, arg)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        out["error"] = str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"
        return out
    # llama.cpp's /tokenize takes a text (`content`), never chat messages
    features = sglang_source(ident.get("package")) if module.startswith("sglang") else (
        {} if module else {"tokenize_messages": False})
    out.update(flags=sorted(help_flags(text)), choices=with_source_choices(help_choices(text), features),
               features=features, defaults=help_defaults(text))
    return out


def model(path: str) -> Dict[str, Any]:
    """A model folder's config.json and the bytes of its weights (safetensors, else PyTorch files; a `.gguf` file:
    its size, no config). A config.json
    that is there but cannot be read (not a regular file within its limit, unreadable) is said in `config_problem`,
    one line naming it."""
    folder = Path(path)
    out: Dict[str, Any] = {"path": path, "config": None, "weights_bytes": None}
    if folder.suffix == ".gguf":  # one file (llama.cpp): its metadata is inside, its size the weights'
        if folder.is_file():
            out["weights_bytes"] = folder.stat().st_size
        return out
    try:
        out["config"] = json.loads(_read_bounded(folder / "config.json", "RECORD", CONFIG_BYTES))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        pass
    except OSError as exc:
        out["config_problem"] = str(exc)
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        files = [p for p in folder.glob(pattern) if p.is_file()]
        if files:
            out["weights_bytes"] = sum(p.stat().st_size for p in files)
            break
    return out


def gpu_memory_mib() -> Optional[int]:
    """The smallest GPU's total memory by nvidia-smi; None without GPUs or driver."""
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    totals = [int(v) for v in res.stdout.split() if v.strip().isdigit()] if res.returncode == 0 else []
    return min(totals) if totals else None


def probe(request: Mapping[str, Any]) -> Dict[str, Any]:
    """{engine: {python, module, dists, env, help_arg}, models: {key: path}, cache: folder} → what the host says
    about each."""
    e = request["engine"]
    return {"engine": engine(e["python"], e["module"], e.get("dists", []), e.get("env"),
                             cache=request.get("cache"), arg=e.get("help_arg") or "--help"),
            "models": {k: model(p) for k, p in (request.get("models") or {}).items() if p},
            "gpu_memory_mib": gpu_memory_mib()}


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))
