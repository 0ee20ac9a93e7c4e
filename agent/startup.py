"""Where a server's startup went, read from its own log after the config: the seconds from launch until the weights
were loaded, the KV cache allocated, the CUDA graphs captured (or the model compiled) and the server serving.

The engines stamp their lines in the host's local time (SGLang `[2026-12-05 17:02:39] ...`, with a rank or
milliseconds at times; vLLM `INFO 12-05 17:02:39 [file.py:12] ...`, without the year); under systemd the journal
adds its own prefix in front, so a stamp is looked for anywhere in the line. llama.cpp stamps the time since its
process started (`0.00.018.792`: minutes, seconds, milliseconds, microseconds), taken as time since launch. The
marks are the engines' own messages (SGLang's checked against its released source in
tests/standin/test_sglang_source.py). A phase whose mark never appears is left out: a CPU build captures no graphs,
an engine that died early loads no cache.
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Dict, Optional, Pattern, Tuple

# engine -> (phase, the mark of its end, whether the last mark counts (a drafter loads and captures after the
# target) or the first)
MARKS: Dict[str, Tuple[Tuple[str, Pattern[str], bool], ...]] = {
    "sglang": (("weights", re.compile(r"Load weight end"), True),
               ("kv_cache", re.compile(r"KV Cache is allocated"), True),
               ("graphs", re.compile(r"(?i)cuda graph end"), True),
               ("serving", re.compile(r"The server is fired up"), False)),
    "vllm": (("weights", re.compile(r"Loading weights took|Model loading took"), True),
             ("compile", re.compile(r"torch\.compile (?:took|takes) [\d.]+ s in total"), True),
             ("kv_cache", re.compile(r"KV cache size|init engine \(profile, create kv cache"), True),
             ("graphs", re.compile(r"Graph capturing finished"), True),
             ("serving", re.compile(r"Starting vLLM (?:API )?server on"), False)),
    # llama.cpp (common/log.cpp): its stamps count from the process's start, not the clock
    "llamacpp": (("weights", re.compile(r"llama_server: model loaded"), True),
                 ("serving", re.compile(r"llama_server: listening on"), False)),
}
# minutes.seconds.milliseconds.microseconds since the process started, then the level: "0.00.018.792 I srv ..."
LLAMACPP_STAMP = re.compile(r"(?<![\d.])(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) [DIWE] ")
SGLANG_STAMP = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(\.\d+)?[^\]]*\]")
VLLM_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d{2}-\d{2} \d{2}:\d{2}:\d{2})(\.\d+)? \[")


def stamp(line: str, year: int) -> Optional[datetime]:
    """The local time a line carries, as an aware datetime (the host's zone); None when it carries none."""
    m = SGLANG_STAMP.search(line)
    text = m.group(1) if m else None
    if m is None:
        v = VLLM_STAMP.search(line)
        if v is None:
            return None
        m, text = v, f"{year}-{v.group(1)}"
    try:
        naive = datetime.strptime(text, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    if m.group(2):
        naive = naive.replace(microsecond=int(float(m.group(2)) * 1e6))
    return naive.astimezone()  # the host's zone, as the engine's logging wrote it


def phases(log_text: str, engine: str, launched: float) -> Dict[str, float]:
    """{phase: seconds from launch} for the marks found in the log; `launched` is the launch's epoch time."""
    marks = MARKS.get(engine, ())
    if not marks:
        return {}
    year = datetime.fromtimestamp(launched).year
    out: Dict[str, float] = {}
    for line in log_text.splitlines():
        for name, mark, last in marks:
            if (last or name not in out) and mark.search(line):
                if engine == "llamacpp":
                    since = LLAMACPP_STAMP.search(line)
                    if since is not None:
                        m, s, ms, us = (int(g) for g in since.groups())
                        out[name] = round(m * 60 + s + ms / 1e3 + us / 1e6, 3)
                    continue
                when = stamp(line, year)
                if when is not None:  # whole seconds at worst: a mark in the launch's own second reads as 0
                    out[name] = round(max(0.0, when.timestamp() - launched), 1)
    return out
