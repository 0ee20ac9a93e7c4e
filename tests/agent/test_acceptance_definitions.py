"""One definition of the speculative figures, whatever the engine: the same verify steps, each accepting a_i of the
k tokens drafted, sent in each engine's own wire format, give the same row through both adapters and the same
verdict against each engine's own counters.

- verify steps N: vLLM's per-request `num_spec_steps` and its counter `spec_decode_num_drafts` (one draft per verify
  step), SGLang's `spec_verify_ct` and its counter `spec_verify_calls_total` (0.5.15 on);
- accepted drafts A = Σ a_i: vLLM's `num_accepted_draft_tokens`, SGLang's `spec_num_correct_drafts` (0.5.15 on;
  `spec_accepted_drafts` up to 0.5.15);
- acceptance length = 1 + A / N, the tokens of a verify step with its bonus token; the first token, prefill's, is
  no step's. vLLM's `mean_acceptance_length` is this; SGLang's `spec_accept_length` (completion_tokens / N) also
  counts the prefill's token, 1 / N more, so the adapter computes it from N and A;
- drafted tokens per verify step k: vLLM's `num_draft_tokens` / `num_spec_steps` (and its counters' ratio), SGLang's
  `spec_num_proposed_drafts` / `spec_verify_ct` (its server's `speculative_num_draft_tokens` - 1).

The wire objects are built as the engines build them: vLLM 0.32.0's `RequestSpecDecodeMetrics.to_dict`
(vllm/v1/metrics/stats.py) and SGLang's `TokenizerManager._calculate_spec_decoding_metrics` (0.5.11, 0.5.15,
0.5.23: the names of each). One family is the summary a real vLLM run gave (tests/agent/test_real_drafters.py's
DFlash drafter, block 8, 128 tokens).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

import pytest

from agent import counters
from agent.client import Measurement
from agent.engines import ENGINES

# (k tokens drafted per verify step, tokens accepted at each verify step)
EVENTS: Dict[str, Tuple[int, List[int]]] = {
    "mixed": (3, [3, 0, 2, 1, 3]),
    "none-accepted": (4, [0, 0, 0]),
    "all-accepted": (2, [2, 2, 2, 2]),
    "one-step": (7, [5]),
    # the summary of a real vLLM 0.32.0 run: DFlash block 8 on random weights, 128 tokens, nothing accepted
    "real-vllm-dflash-b8": (7, [0] * 127),
}
SGLANG = ("0.5.11", "0.5.15", "0.5.23")


def vllm_stream(k: int, accepted: List[int]) -> List[str]:
    """vLLM's /v1/completions stream: the prefill's token, one chunk per verify step (1 + its accepted tokens),
    then the usage with the per-request summary (`--per-request-spec-decode-metrics summary`)."""
    histogram = [0] * (k + 1)
    for a in accepted:
        histogram[a] += 1
    steps, total = sum(histogram), sum(j * n for j, n in enumerate(histogram))  # as to_dict counts them
    chunks, tid = [], 100
    for n in [1, *(1 + a for a in accepted)]:
        chunks.append(json.dumps({"choices": [{"index": 0, "text": "x" * n, "token_ids": list(range(tid, tid + n)),
                                               "finish_reason": None}]}))
        tid += n
    summary = {"mean_acceptance_length": 1.0 + total / steps if steps else 1.0,
               "draft_acceptance_rate": total / (k * steps) if steps else 0.0, "acceptance_histogram": histogram,
               "num_spec_steps": steps, "num_accepted_draft_tokens": total, "num_draft_tokens": k * steps,
               "num_spec_tokens": k}
    done = 1 + len(accepted) + sum(accepted)
    chunks.append(json.dumps({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": done,
                                                       "total_tokens": 12 + done},
                              "metrics": {"speculative_decoding": summary}}))
    return [*chunks, "[DONE]"]


def sglang_stream(k: int, accepted: List[int], version: str) -> List[str]:
    """SGLang's /generate stream: cumulative meta_info per chunk; the last one, finished, with the speculative
    fields its version writes (num_draft_tokens k + 1, so num_proposed_drafts = verify_ct x k)."""
    chunks, done = [], 0
    for i, n in enumerate([1, *(1 + a for a in accepted)]):
        done += n
        meta: Dict[str, Any] = {"id": "r", "prompt_tokens": 12, "completion_tokens": done, "cached_tokens": 0,
                                "finish_reason": None}
        if i == len(accepted):
            steps, correct = len(accepted), sum(accepted)
            meta.update(finish_reason={"type": "length", "length": done}, spec_verify_ct=steps,
                        spec_accept_rate=correct / (steps * k), spec_accept_length=done / steps)
            if version != "0.5.11":
                meta.update(spec_num_correct_drafts=correct, spec_num_proposed_drafts=steps * k)
            if version != "0.5.23":
                meta.update(spec_accepted_drafts=correct, spec_proposed_drafts=steps * k)
        chunks.append(json.dumps({"text": "x" * done, "meta_info": meta, "index": 0}))
    return [*chunks, "[DONE]"]


def row(engine: str, stream: List[str]) -> Dict[str, Any]:
    """The request's row as the agent's client measures it from the stream."""
    m = Measurement(ENGINES[engine], t_sent=0.0)
    for i, data in enumerate(stream):
        m.feed(0.01 * (i + 1), data)
    return m.result()


def metrics(engine: str, steps: int, drafted: int, accepted: int, tokens: int, requests: int) -> str:
    """The engine's /metrics text with these totals (its own counter names and labels)."""
    if engine == "vllm":
        lab = 'engine="0",model_name="m"'
        rows = [("vllm:generation_tokens_total", tokens), ("vllm:request_success_total", requests),
                ("vllm:spec_decode_num_drafts_total", steps), ("vllm:spec_decode_num_draft_tokens_total", drafted),
                ("vllm:spec_decode_num_accepted_tokens_total", accepted)]
    else:
        lab = 'model_name="m"'
        rows = [("sglang:generation_tokens_total", tokens), ("sglang:num_requests_total", requests),
                ("sglang:spec_verify_calls_total", steps)]
    return "".join(f"# TYPE {n} counter\n{n}{{{lab}}} {float(v)}\n" for n, v in rows)


@pytest.mark.parametrize("version", SGLANG)
@pytest.mark.parametrize("events", sorted(EVENTS))
def test_both_adapters_give_the_same_figures_from_the_same_steps(events: str, version: str) -> None:
    k, accepted = EVENTS[events]
    steps, total, tokens = len(accepted), sum(accepted), 1 + len(accepted) + sum(accepted)
    vllm, sglang = row("vllm", vllm_stream(k, accepted)), row("sglang", sglang_stream(k, accepted, version))
    for r in (vllm, sglang):
        assert r["ok"] and r["completion_tokens"] == tokens, r
        assert (r["spec_steps"], r["spec_accepted_tokens"]) == (steps, total), r
        assert r["accept_length"] == pytest.approx(1 + total / steps), r
    assert vllm["accept_length"] == pytest.approx(sglang["accept_length"], abs=1e-12)
    # SGLang's own figure is another definition: the prefill's token counted too
    own = json.loads(sglang_stream(k, accepted, version)[-2])["meta_info"]["spec_accept_length"]
    assert own == pytest.approx(sglang["accept_length"] + 1 / steps)


@pytest.mark.parametrize("events", sorted(EVENTS))
def test_each_engines_counters_agree_with_its_rows_by_the_same_definition(events: str) -> None:
    """Two requests of the same steps, between two readings of each engine's counters: vLLM's drafts (one per
    verify step) and SGLang's verify calls are the rows' steps; vLLM's acceptance length, 1 + accepted / drafts, is
    the rows'; vLLM's draft tokens per draft are the k its summary names."""
    k, accepted = EVENTS[events]
    steps, total, tokens = len(accepted), sum(accepted), 1 + len(accepted) + sum(accepted)
    for engine, stream in (("vllm", vllm_stream(k, accepted)), ("sglang", sglang_stream(k, accepted, "0.5.15"))):
        names = ENGINES[engine].counters or {}
        before = counters.parse(metrics(engine, 0, 0, 0, 0, 0), names)
        after = counters.parse(metrics(engine, 2 * steps, 2 * k * steps, 2 * total, 2 * tokens, 2), names)
        rows = [row(engine, stream), row(engine, stream)]
        check = counters.check(before, after, rows, speculative=True)
        assert check["verdict"] == "ok", check
        if engine == "vllm":
            assert check["accept_length"]["server"] == check["accept_length"]["rows"] == round(1 + total / steps, 4)
            assert (after["draft_tokens"] - before["draft_tokens"]) / (after["drafts"] - before["drafts"]) == k
            summary = json.loads(stream[-2])["metrics"]["speculative_decoding"]
            assert summary["num_draft_tokens"] / summary["num_spec_steps"] == k
        else:
            assert check["verify_steps"] == {"server": 2 * steps, "rows": 2 * steps, "ok": True}
            meta = json.loads(stream[-2])["meta_info"]
            assert meta["spec_num_proposed_drafts"] / meta["spec_verify_ct"] == k
