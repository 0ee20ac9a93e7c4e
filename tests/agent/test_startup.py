"""agent.startup: the phases of a server's startup from its log lines, in both engines' stamps, plain or behind
the journal's prefix. The real vLLM log is read by the demo's test (tests/playbooks/test_readme_local.py)."""
from __future__ import annotations

from datetime import datetime

from agent import startup

LAUNCH = datetime(2026, 12, 5, 17, 2, 10, 500000).astimezone().timestamp()  # the host's local time, as logged

VLLM_LOG = """Triton is installed, but doesn't include CPU backend. Disabling Triton.
(APIServer pid=17487) INFO 12-05 17:02:20 [api_utils.py:286] non-default args: {'host': '127.0.0.1'}
(Worker pid=17581) INFO 12-05 17:02:39 [default_loader.py:501] Loading weights took 0.01 seconds
(Worker pid=17581) INFO 12-05 17:02:40 [default_loader.py:501] Loading weights took 0.01 seconds
(EngineCore pid=17534) INFO 12-05 17:02:40 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens
(EngineCore pid=17534) INFO 12-05 17:02:44 [core.py:402] init engine (profile, create kv cache, warmup model) took 1 s
(APIServer pid=17487) INFO 12-05 17:02:45 [entry.py:140] Starting vLLM server on http://127.0.0.1:51933
(APIServer pid=17487) INFO 12-05 17:02:45 [launcher.py:195] Route: /v1/completions, Methods: POST
INFO:     Application startup complete.
"""

# SGLang's format `[%(asctime)s{ms}{ rank}] %(message)s`, behind the journal's prefix (the systemd backend)
SGLANG_LOG = """Dec 05 17:02:10 ct200 systemd[1]: Started specfleet-sglang@tp1-dflash.service.
Dec 05 17:02:30 ct200 python[900]: [2026-12-05 17:02:30 TP0] Load weight begin. avail mem=94.00 GB
Dec 05 17:03:10 ct200 python[900]: [2026-12-05 17:03:10 TP0] Load weight end. type=Qwen3ForCausalLM, mem usage=51.2 GB.
Dec 05 17:03:20 ct200 python[900]: [2026-12-05 17:03:20.250 TP0] Load weight end. type=DFlashDraft, mem=3.1 GB.
Dec 05 17:03:25 ct200 python[900]: [2026-12-05 17:03:25 TP0] KV Cache is allocated. #tokens: 400000, KV size: 20.0 GB
Dec 05 17:05:00 ct200 python[900]: [2026-12-05 17:05:00 TP0] Capture cuda graph end. Time elapsed: 80.0 s.
Dec 05 17:05:40 ct200 python[900]: [2026-12-05 17:05:40 TP0] Capture draft cuda graph end. Time elapsed: 30.0 s.
Dec 05 17:05:45 ct200 python[900]: [2026-12-05 17:05:45] The server is fired up and ready to roll!
Dec 05 17:05:46 ct200 python[900]: [2026-12-05 17:05:46] The server is fired up and ready to roll!
"""


def test_vllm_phases_from_its_stamps_the_last_load_and_the_first_serving() -> None:
    got = startup.phases(VLLM_LOG, "vllm", LAUNCH)
    # the drafter's load is the last; the KV cache's last mark is init engine's; uvicorn's own line has no stamp
    assert got == {"weights": 29.5, "kv_cache": 33.5, "serving": 34.5}


def test_sglang_phases_behind_the_journals_prefix_with_ranks_and_milliseconds() -> None:
    got = startup.phases(SGLANG_LOG, "sglang", LAUNCH)
    assert got == {"weights": 69.8, "kv_cache": 74.5, "graphs": 209.5, "serving": 214.5}


def test_nothing_found_nothing_said() -> None:
    assert startup.phases("", "sglang", LAUNCH) == {}
    assert startup.phases(SGLANG_LOG, "other", LAUNCH) == {}
    assert startup.phases("[2026-13-45 99:99:99] Load weight end.\nLoad weight end. (no stamp)\n", "sglang",
                          LAUNCH) == {}
    # a mark stamped before the launch (a clock step, a line of an earlier start) reads as 0, never below
    assert startup.phases("INFO 12-05 17:02:01 [x.py:1] Loading weights took 1 s\n", "vllm", LAUNCH) == {"weights": 0.0}
