"""llama.cpp's server, for real, as the README runs it: `ansible-playbook bench.yml -l local-llamacpp` as typed, with
the llama-server `make llamacpp` built from the pinned source and the GGUF models of `make gguf-models`.

Its synthetic acceptance is the ground truth: a config told to accept drafts at a mean length L (`synth_len`, the
target's token included) must be reported at L, within the report's own interval, with the server's counters agreeing
with the request rows token for token; and the more it accepts, the faster it runs. DFlash and EAGLE-3 run too, their
drafters' hidden-state taps read by llama.cpp (random weights: nothing is accepted)."""
from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

from tests.readme import ROOT, typed

SERVER = ROOT / ".cache/llama.cpp/llama-server"
GGUF = ROOT / ".cache/models/gguf"
LENGTHS = (1.5, 2.5, 3.5)
CONFIGS = ("tp1-autoregressive", "tp1-ngram-k2", "tp1-draft_model-k3", "tp1-dflash-blk4", "tp1-eagle3-k3",
           *(f"tp1-draft_model-k3-synth{n:g}" for n in LENGTHS))
pytestmark = pytest.mark.engine


def test_the_llamacpp_profile_reports_synthetic_acceptance_as_set() -> None:
    built = typed("make llamacpp gguf-models", timeout=1800)  # built by `make test`'s deps: the role changes nothing
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-2000:]
    assert re.search(r"^local\s+: ok=\d+\s+changed=0\s", built.stdout, re.M), built.stdout[-2000:]
    assert SERVER.exists() and (GGUF / "target.gguf").exists()
    res = typed("ansible-playbook bench.yml -l local-llamacpp", timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    run = re.search(r"^local-llamacpp: suite (\S+): 8 configs", res.stdout, re.M)
    assert run, res.stdout[-3000:]
    folder = ROOT / "results" / run.group(1)
    host = folder / "local-llamacpp"
    status = {cid: json.loads((host / cid / "status.json").read_text()) for cid in CONFIGS}
    assert {c: s["status"] for c, s in status.items()} == dict.fromkeys(CONFIGS, "ok"), status
    schema = jsonschema.Draft202012Validator(json.loads((ROOT / "schemas/requests.jsonl.schema.json").read_text()))
    for cid in CONFIGS:  # llama.cpp's rows as the published contract has them
        for line in (host / cid / "requests.jsonl").read_text().splitlines():
            schema.validate(json.loads(line))
    info = json.loads((host / "host.json").read_text())["engine"]
    assert info["name"] == "llamacpp" and info["version"] and info["build"]["sha256"], info
    report = json.loads((folder / "report.json").read_text())
    accept = {r["config_id"]: r for r in report["acceptance_per_config"]}
    speed: dict[float, float] = {}
    for length in LENGTHS:
        cid = f"tp1-draft_model-k3-synth{length:g}"
        row = accept[cid]
        # the server's own counts agree with the rows, exactly: generated, drafted and accepted tokens
        counters = status[cid]["counters"]
        assert counters["verdict"] == "ok" and {"generation_tokens", "draft_tokens", "accepted_tokens"} <= set(
            counters), counters
        assert row["accept_length_ci_low"] <= length <= row["accept_length_ci_high"], (length, row)
        assert row["accept_length_ci_high"] - row["accept_length_ci_low"] < 0.5, row  # an interval that says something
        cells = [r["speedup"] for r in report["rows"] if r["config_id"] == cid]
        speed[length] = math.exp(sum(math.log(s) for s in cells) / len(cells))
    # a longer acceptance takes more tokens per verify step: the speedup grows with it
    assert speed[1.5] < speed[2.5] and speed[1.5] < speed[3.5], speed
    for cid, st in status.items():  # its startup read from its own log: weights loaded, then serving, before ready
        marks = st.get("startup") or {}
        assert 0 <= marks.get("weights", -1) <= marks.get("serving", -1) <= st["ready_s"], (cid, marks, st["ready_s"])
    for cid in ("tp1-dflash-blk4", "tp1-eagle3-k3"):
        assert status[cid]["counters"]["verdict"] == "ok", status[cid]["counters"]
        assert accept[cid]["requests_with_steps"] > 0, accept[cid]
    print(f"llama.cpp {info['version']} ({info['commit']}): " + "; ".join(
        f"L={n:g}: {accept[f'tp1-draft_model-k3-synth{n:g}']['accept_length']:.2f} "
        f"({accept[f'tp1-draft_model-k3-synth{n:g}']['accept_length_ci_low']:.2f}–"
        f"{accept[f'tp1-draft_model-k3-synth{n:g}']['accept_length_ci_high']:.2f}), speedup {speed[n]:.2f}x"
        for n in LENGTHS))
