"""The ct200 plan against what a host answers (controller/hostcheck.py via plan.build): each config's engine line
(supported, or unsupported_flag with the flag and the engine version), its memory-fit line, the fit table per TP,
`-e configs=`/`-e sweeps=` selection, and what the plan says when the host cannot be asked.

The host's answer is produced by the real probe (`agent.probe.probe`) on this machine: the engine is a module
whose argparse declares SGLang v0.5.11's `--speculative-algorithm` choices (DFLASH, no DDTREE) or a DDTree build's,
the model folders hold a Qwen3.6-27B-shaped config.json (tests/agent/test_fit.py) and sparse weight files of the
hand-run's sizes (52 GB, drafter 3.3 GB), and the GPU memory is the 96 GB card of ct200 (bench_gpu_memory_mib).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agent import probe
from controller import plan
from tests.agent.test_fit import CARD_MIB, GB, QWEN36
from tests.agent.test_probe import V0511, fake_sglang
from tests.controller.test_matrix import suite_from_host_vars

DDTREE_BUILD = [*V0511, "DDTREE"]


def model_folder(path: Path, config: dict[str, Any] | None, weights: int) -> None:
    path.mkdir(parents=True)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    with open(path / "model.safetensors", "wb") as f:  # sparse: the size without the disk
        f.truncate(weights)


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Any]:
    model_folder(tmp_path / "target", QWEN36, 52 * GB)
    model_folder(tmp_path / "draft", {"num_hidden_layers": 5}, int(3.3 * GB))
    suite = suite_from_host_vars("ct200")
    suite.update(model={**suite["model"], "path": str(tmp_path / "target")},
                 draft_model={**suite["draft_model"], "path": str(tmp_path / "draft")},
                 engine_python=sys.executable, gpu_memory_mib=CARD_MIB)
    return {"suite": suite, "root": tmp_path}


def asker(root: Path, choices: list[str], module: str = "fake_sglang.launch_server") -> Any:
    """`ask` as the action plugin does it, answered by the real probe (the engine module swapped for the fake)."""
    folder = root / f"engine-{len(choices)}"
    env = fake_sglang(folder, "0.5.11", choices) if not folder.exists() else {"PYTHONPATH": str(folder),
                                                                              "PATH": "/usr/bin:/bin"}

    def ask(python: str, request: dict[str, Any]) -> dict[str, Any]:
        assert request["engine"]["module"] == "sglang.launch_server" and request["engine"]["dists"] == ["sglang"]
        request = {**request, "engine": {**request["engine"], "module": module, "env": env}}
        return {"rc": 0, "stdout": json.dumps(probe.probe(request)), "stderr": ""}
    return ask


def build(suite: dict[str, Any], ask: Any = None, **extra: Any) -> dict[str, Any]:
    args = {"suite": suite, "run_id": "r1", "host_dir": "/var/lib/specfleet", "agent_python": "/usr/bin/python3",
            "limits": {}, **extra}
    return plan.build(args, {"inventory_hostname": "ct200"}, ask)


def block(text: str, config_id: str) -> str:
    start = text.index(f"] {config_id}  (")
    return text[start:text.index("\n[", start) if "\n[" in text[start:] else len(text)]


def test_a_stock_build_marks_every_ddtree_config_with_its_flags(host: dict[str, Any]) -> None:
    res = build(host["suite"], asker(host["root"], V0511), phases="tp1")
    assert not res.get("failed"), res.get("msg")
    text = "\n".join(res["plan_lines"])
    assert set(res["unsupported"]) == {f"tp1-ddtree-b{b}" for b in (8, 12, 15, 16, 32, 64)}
    assert res["unsupported"]["tp1-ddtree-b16"] == ["--speculative-algorithm DDTREE", "--speculative-ddtree-budget"]
    assert ("engine: unsupported_flag: --speculative-algorithm DDTREE, --speculative-ddtree-budget not known to "
            "sglang 0.5.11") in block(text, "tp1-ddtree-b8")
    assert "engine: supported by sglang 0.5.11" in block(text, "tp1-dflash-nooverlap")
    assert "6 configs use flags the installed engine does not know" in text and "-e skip_unsupported=true" in text
    assert "unit: specfleet-sglang@tp1-dflash.service" in block(text, "tp1-dflash")
    assert res["engine_help"]["version"] == "0.5.11" and "--help" in res["engine_help"]["flags"]


def test_a_ddtree_build_supports_them_and_skip_unsupported_is_said(host: dict[str, Any]) -> None:
    module = "ddtree_sglang.launch_server"
    root = host["root"] / "dd"
    env = fake_sglang(root, "0.5.11", DDTREE_BUILD)
    pkg = root / "ddtree_sglang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text((root / "fake_sglang/launch_server.py").read_text().replace(
        "p.parse_args()", 'p.add_argument("--speculative-ddtree-budget", type=int)\np.parse_args()'))

    def ask(python: str, request: dict[str, Any]) -> dict[str, Any]:
        request = {**request, "engine": {**request["engine"], "module": module, "env": env}}
        return {"rc": 0, "stdout": json.dumps(probe.probe(request))}
    res = build(host["suite"], ask, phases="tp1", skip_unsupported=True)
    assert res["unsupported"] == {} and res["skip_unsupported"] is True
    assert "engine: supported by sglang 0.5.11" in block("\n".join(res["plan_lines"]), "tp1-ddtree-b64")


def test_memory_fit_lines_and_the_table_per_tp(host: dict[str, Any]) -> None:
    res = build(host["suite"], asker(host["root"], V0511))
    text = "\n".join(res["plan_lines"])
    # tp1: 96 GB card (89.4 GiB) × 0.80 = 71.5 GiB; 52 GB + 3.3 GB = 51.5 GiB held; the 100k-token context cell:
    # 16 attention layers × 4 KV heads × 256 × 2 B × 2 = 64 KiB/token × 100256 tokens = 6.12 GiB of 20.0 GiB left
    line = [ln for ln in block(text, "tp1-dflash").splitlines() if "memory:" in ln][0]
    assert line.strip() == ("memory: fits: budget 89.4 GiB × 0.80 = 71.5 GiB per GPU; weights 48.4 GiB + drafter "
                            "3.1 GiB over tp 1 = 51.5 GiB; KV 64 KiB/token (16 attention layers × 4 KV heads × 256 × "
                            "2 B × 2) × 100256 tokens = 6.12 GiB of 20.0 GiB left")
    # tp8: 4 KV heads replicated (1 per GPU): 16 KiB/token
    assert "KV 16 KiB/token (16 attention layers × 1 KV heads" in block(text, "tp8-dflash")
    table = text[text.index("Memory fit per tp"):].splitlines()
    assert [ln.split(":")[0].strip() for ln in table[1:]] == ["tp 1", "tp 4", "tp 8"]
    assert table[1].startswith("    tp 1: 9/9 fit; largest tp1-autoregressive: budget 89.4 GiB")


def test_a_config_that_does_not_fit_says_so_with_its_arithmetic(host: dict[str, Any]) -> None:
    suite = {**host["suite"], "gpu_memory_mib": 48 * 1024}          # a 48 GiB card: the weights alone do not fit
    res = build(suite, asker(host["root"], V0511), phases="tp1")
    text = "\n".join(res["plan_lines"])
    assert ("memory: does_not_fit: budget 48.0 GiB × 0.80 = 38.4 GiB per GPU; weights 48.4 GiB + drafter 3.1 GiB "
            "over tp 1 = 51.5 GiB; no room left for the KV cache (-13.1 GiB)") in block(text, "tp1-dflash")
    assert "    tp 1: 0/9 fit; does_not_fit: tp1-autoregressive, tp1-dflash," in text


def test_an_unreachable_host_is_planned_without_the_checks(host: dict[str, Any]) -> None:
    def ask(python: str, request: dict[str, Any]) -> dict[str, Any]:
        return {"unreachable": True, "msg": "Failed to connect to the host via ssh: ssh: Could not resolve hostname "
                                            "ct200: Name or service not known"}
    res = build(host["suite"], ask, phases="tp1")
    text = "\n".join(res["plan_lines"])
    assert text.count("not probed") == 1                               # said once, above the configs
    assert "    host checks: not probed: host unreachable (Failed to connect to the host via ssh" in text
    assert "engine:" not in block(text, "tp1-dflash") and "memory:" not in block(text, "tp1-dflash")
    assert "Memory fit per tp" not in text and res["engine_help"] is None and res["unsupported"] == {}


def test_a_failed_probe_or_a_missing_model_is_said(host: dict[str, Any]) -> None:
    res = build(host["suite"], lambda p, r: {"rc": 1, "stdout": "", "stderr": "python3: not found"}, phases="tp1")
    assert "host checks: not probed: the probe failed (python3: not found)" in "\n".join(res["plan_lines"])
    suite = {**host["suite"], "model": {**host["suite"]["model"], "path": str(host["root"] / "absent")}}
    res = build(suite, asker(host["root"], V0511), phases="tp1")
    assert f"host checks: not checked: no config.json or weights in {host['root'] / 'absent'} on the host" in \
        "\n".join(res["plan_lines"])
    off = build(host["suite"], asker(host["root"], V0511), phases="tp1", probe=False)
    assert "host checks: not probed (bench_probe is false)" in "\n".join(off["plan_lines"])


def test_configs_and_sweeps_select_parts_of_a_phase(host: dict[str, Any]) -> None:
    res = build(host["suite"], configs="ddtree-b16,tp4-dflash", sweeps="context")
    assert not res.get("failed"), res.get("msg")
    ids = [c["config_id"] for c in res["configs"]]
    assert ids == ["tp1-autoregressive", "tp1-ddtree-b16", "tp4-autoregressive", "tp4-dflash", "tp4-ddtree-b16",
                   "tp8-autoregressive", "tp8-ddtree-b16"]
    base = res["configs"][0]
    assert {(c["workload"], c["context_tokens"]) for c in base["cells"]} == {("arith", 3000), ("arith", 30000),
                                                                             ("arith", 100000)}
    assert base["requests"] == 9 and set(base["prompts"]) == {"arith"}
    only = build(host["suite"], configs="autoregressive", sweeps="short", phases="tp1")
    assert [c["config_id"] for c in only["configs"]] == ["tp1-autoregressive"]
    assert {c["workload"] for c in only["configs"][0]["cells"]} == {"fib", "qsort", "arith", "json"}


@pytest.mark.parametrize("extra, message", [
    ({"configs": "ddtree-b17"}, "configs: unknown config 'ddtree-b17'; allowed: autoregressive, ddtree-b12,"),
    ({"sweeps": "shrt"}, "sweeps: unknown sweep 'shrt'; allowed: concurrency, context, long_output, rate, short"),
    ({"configs": {"a": 1}}, "configs: a mapping is not a list of config names; allowed: names separated by commas"),
])
def test_unknown_selections_are_rejected_naming_what_exists(host: dict[str, Any], extra: dict[str, Any],
                                                            message: str) -> None:
    res = build(host["suite"], **extra)
    assert res["failed"] and message in res["msg"], res.get("msg")


def test_an_unreachable_host_is_judged_by_what_its_last_run_recorded(host: dict[str, Any]) -> None:
    """host.json of an earlier run (the agent records the engine's flags, the models' config.json and weight bytes,
    the GPUs): the plan judges each config by it and says which run and build it comes from."""
    env = fake_sglang(host["root"] / "eng", "0.5.11", V0511)
    flags, choices = probe.read_help(sys.executable, "fake_sglang.launch_server", env)
    folder = host["root"] / "results" / "20261101T000000Z" / "ct200"
    folder.mkdir(parents=True)
    suite = host["suite"]
    (folder / "host.json").write_text(json.dumps({
        "host": "ct200", "gpus": {"count": 8, "devices": [{"index": i, "memory.total": CARD_MIB} for i in range(8)]},
        "engine": {"name": "sglang", "version": "0.5.11", "help": {"flags": sorted(flags), "choices": choices},
                   "build": {"source": "git", "refspec": "refs/pull/29907/head", "ref": None, "commit": "a" * 40}},
        "model": {**suite["model"], **probe.model(suite["model"]["path"])},
        "draft_model": {**suite["draft_model"], **probe.model(suite["draft_model"]["path"])}}))

    def unreachable(python: str, request: dict[str, Any]) -> dict[str, Any]:
        return {"unreachable": True, "msg": "ssh: Could not resolve hostname ct200"}
    res = build({**suite, "gpu_memory_mib": 0}, unreachable, phases="tp1", results=str(host["root"] / "results"))
    text = "\n".join(res["plan_lines"])
    src = ("(as recorded in run 20261101T000000Z (refs/pull/29907/head @ aaaaaaaaaaaa); the host: not probed: host "
           "unreachable (ssh: Could not resolve hostname ct200))")
    assert f"engine: unsupported_flag: --speculative-algorithm DDTREE, --speculative-ddtree-budget not known to " \
           f"sglang 0.5.11 {src}" in block(text, "tp1-ddtree-b8")
    assert f"engine: supported by sglang 0.5.11 {src}" in block(text, "tp1-dflash")
    assert "memory: fits: budget 89.4 GiB × 0.80" in block(text, "tp1-dflash") and text.count(src) == 18
    assert res["engine_help"] is None        # only a live answer is handed to the agent


def with_features(host: dict[str, Any], features: dict[str, Any]) -> Any:
    """`asker`, its answer carrying these build facts (what agent.probe.sglang_source reads from the source)."""
    inner = asker(host["root"], V0511)

    def ask(python: str, request: dict[str, Any]) -> dict[str, Any]:
        answer = inner(python, request)
        out = json.loads(answer["stdout"])
        out["engine"]["features"] = features
        return {**answer, "stdout": json.dumps(out)}
    return ask


@pytest.mark.parametrize("overlap", [False, True])
def test_dflash_twins_are_one_server_on_a_build_that_never_overlaps_dflash(host: dict[str, Any],
                                                                          overlap: bool) -> None:
    """Up to SGLang 0.5.13 the server forces DFlash off overlap scheduling (the build's source says so:
    probe.sglang_source): `dflash` and `dflash-nooverlap` then run the same server, and the plan says so."""
    res = build(host["suite"], with_features(host, {"algorithms": ["DFLASH"], "dflash_overlap": overlap}))
    text = "\n".join(res["plan_lines"])
    for tp in (1, 4, 8):
        said = "the same server as " + f"tp{tp}-dflash on this build" in block(text, f"tp{tp}-dflash-nooverlap")
        assert said is not overlap, block(text, f"tp{tp}-dflash-nooverlap")
        assert "the same server" not in block(text, f"tp{tp}-dflash")


@pytest.mark.parametrize("messages", [False, True])
def test_chat_workloads_on_a_build_whose_tokenize_takes_no_messages_fail_the_plan(host: dict[str, Any],
                                                                                 messages: bool) -> None:
    """Chat prompts are built by the server's /tokenize with `messages` (SGLang 0.5.15 on; 0.5.11 answers 422):
    on a build without it the plan fails naming each config and workload, before anything starts."""
    chat = [{"role": "user", "content": "Write a prime sieve in Python."}]
    workloads = host["root"] / "workloads.jsonl"
    workloads.write_text(json.dumps({"name": "primes", "messages": chat}) + "\n")
    suite = {**host["suite"], "workloads_file": str(workloads)}
    suite["phases"] = [{**p, "sweeps": [*p["sweeps"], {"name": "chat", "workloads": ["primes"], "max_tokens": [64],
                                                        "methods": ["dflash"]}]} for p in suite["phases"]]
    res = build(suite, with_features(host, {"algorithms": ["DFLASH"], "tokenize_messages": messages}), phases="tp1")
    if messages:
        assert not res.get("failed"), res.get("msg")
        return
    assert res["failed"] and "nothing was started" in res["msg"]
    lines = [line.strip() for line in res["msg"].splitlines()[1:]]
    # the baseline measures every cell its phase's configs measure: it has the chat cells too
    assert lines == [f"{cid}: chat workload 'primes': this build's /tokenize takes no messages (SGLang takes "
                     f"them from 0.5.15 on; llama.cpp's takes a text only)"
                     for cid in ("tp1-autoregressive", "tp1-dflash")], lines


@pytest.mark.parametrize("window, fails", [(4096, True), (131072, False), (None, False)])
def test_a_drafter_shorter_than_the_longest_request_fails_the_plan(host: dict[str, Any], window: int | None,
                                                                  fails: bool) -> None:
    """The drafter's config.json (read on the host) bounds the context a speculative config can use: ct200's
    100k-token context cells on a drafter of 4096 positions are refused by the plan, naming each config."""
    draft = host["root"] / "draft" / "config.json"
    config = {"num_hidden_layers": 5, **({"max_position_embeddings": window} if window else {})}
    draft.write_text(json.dumps(config))
    res = build(host["suite"], asker(host["root"], [*V0511, "DDTREE"]), phases="tp1")
    if not fails:
        assert not res.get("failed"), res.get("msg")
        return
    lines = [line.strip() for line in res["msg"].splitlines()[1:]]
    assert "tp1-dflash: its longest request (100256 tokens: context + max_tokens) is beyond the drafter's context " \
           "(4096 tokens, max_position_embeddings in its config.json)" in lines, lines
    assert not any(line.startswith("tp1-autoregressive") for line in lines)  # no drafter, no such limit


@pytest.mark.parametrize("extra, by_hand, fails", [
    ({"max_position_embeddings": 65536}, None, True),                                   # shorter than 100k + 256
    ({"max_position_embeddings": 262144}, None, False),
    ({"max_position_embeddings": 65536, "rope_scaling": {"type": "yarn", "factor": 4}}, None, False),  # derived
    ({"max_position_embeddings": 65536}, "max_model_len", False),                       # the matrix's own length
    ({"max_position_embeddings": 65536}, "flag", False),                                # --context-length, as ct200
    ({}, None, False),                                                                  # not read: not judged
])
def test_a_model_shorter_than_the_longest_request_fails_the_plan_where_no_length_is_set(
        host: dict[str, Any], extra: dict[str, Any], by_hand: str | None, fails: bool) -> None:
    """Without a context length set by hand (bench_model.max_model_len, or the engine's flag in server_args as
    ct200 has it), the engine serves the model's own context (its config.json, read on the host): ct200's 100k-token
    cells on a model of 65536 positions are refused by the plan, every config named."""
    target = host["root"] / "target" / "config.json"
    target.write_text(json.dumps({**json.loads(target.read_text()), **extra}))
    suite = host["suite"]
    i = suite["server_args"].index("--context-length")
    suite["server_args"] = suite["server_args"][:i] + suite["server_args"][i + 2:] + (
        ["--context-length=131072"] if by_hand == "flag" else [])
    model = {k: v for k, v in suite["model"].items() if k != "max_model_len"}
    suite["model"] = {**model, **({"max_model_len": 131072} if by_hand == "max_model_len" else {})}
    res = build(suite, asker(host["root"], [*V0511, "DDTREE"]), phases="tp1")
    if not fails:
        assert not res.get("failed"), res.get("msg")
        return
    lines = [line.strip() for line in res["msg"].splitlines()[1:]]
    want = ("its longest request (100256 tokens: context + max_tokens) is beyond the model's context (65536 tokens, "
            "max_position_embeddings in its config.json; no length is set by bench_model.max_model_len or "
            "--max-model-len/--context-length)")
    assert lines and all(want in line for line in lines) and any(line.startswith("tp1-autoregressive:")
                                                                  for line in lines), lines


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_drafter_not_on_the_host_yet_is_listed_in_check_mode_and_refused_by_a_run(
        host: dict[str, Any], check_mode: bool) -> None:
    absent = str(host["root"] / "not-built-yet")  # e.g. `make models` has not run on a clean clone
    suite = {**host["suite"], "draft_model": {**host["suite"]["draft_model"], "path": absent}}
    args = {"suite": suite, "run_id": "r1", "host_dir": "/var/lib/specfleet", "agent_python": "/usr/bin/python3",
            "limits": {}, "phases": "tp1"}
    res = plan.build(args, {"inventory_hostname": "ct200", "ansible_check_mode": check_mode},
                     asker(host["root"], V0511))
    dflash = [c["config_id"] for c in res.get("configs") or [] if c["method"] in ("dflash", "ddtree")]
    line = f"drafter {absent}: no model there on the host"
    if check_mode:  # nothing fails: the plan names each config a real run would refuse now
        assert not res.get("failed"), res.get("msg")
        text = "\n".join(res["plan_lines"])
        assert "ct200: a run now would refuse these configs, their drafters not on the host yet:" in text
        assert dflash and all(f"  {cid}: {line}" in text for cid in dflash), text[-3000:]
    else:  # a real run refuses them before anything starts
        assert res["failed"] and "(nothing was started)" in res["msg"] and line in res["msg"], res.get("msg")


def test_check_mode_still_fails_a_drafter_problem_that_no_build_step_cures(host: dict[str, Any]) -> None:
    # a drafter that is there but cannot serve its target (here: it taps a target layer that is not there) fails in
    # check mode too: no `make models` will change it
    (host["root"] / "draft" / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 5, "dflash_config": {"target_layer_ids": [1, 999]}}))
    args = {"suite": host["suite"], "run_id": "r1", "host_dir": "/var/lib/specfleet",
            "agent_python": "/usr/bin/python3", "limits": {}, "phases": "tp1"}
    res = plan.build(args, {"inventory_hostname": "ct200", "ansible_check_mode": True}, asker(host["root"], V0511))
    assert res.get("failed") and "(nothing was started)" in res["msg"], res.get("msg") or res["plan_lines"][-5:]
