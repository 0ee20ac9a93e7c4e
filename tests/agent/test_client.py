"""The client's metric math on recorded streams, multi-token chunks included."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.client import Measurement
from agent.engines import ENGINES

DATA = Path(__file__).parent / "data"


def replay(engine: str, lines: list[tuple[float, str]]) -> dict:
    m = Measurement(ENGINES[engine], t_sent=0.0)
    for t, data in lines:
        m.feed(t, data)
    return m.result()


def recorded_vllm() -> list[tuple[float, str]]:
    """A real vLLM 0.32 (CPU) stream: ngram speculation, return_token_ids, usage and per-request metrics."""
    out = []
    for line in (DATA / "vllm-ngram-stream.txt").read_text().splitlines():
        t, data = line.split("\t", 1)
        out.append((float(t), data[len("data:"):].strip()))
    return out


def test_vllm_tokens_come_from_usage_not_chunks() -> None:
    lines = recorded_vllm()
    res = replay("vllm", lines)
    usage = json.loads(lines[-2][1])["usage"]
    assert res["ok"] and res["error"] is None
    assert res["completion_tokens"] == usage["completion_tokens"] == 48
    assert res["prompt_tokens"] == usage["prompt_tokens"]
    # speculation packs several tokens into some chunks: fewer content chunks than tokens
    content_chunks = sum(1 for _, d in lines[:-2] if json.loads(d)["choices"][0]["token_ids"])
    assert content_chunks < res["completion_tokens"]
    assert res["e2e_s"] == pytest.approx(lines[-1][0])
    assert res["output_tok_s"] == pytest.approx(48 / lines[-1][0])
    spec = json.loads(lines[-2][1])["metrics"]["speculative_decoding"]
    assert res["accept_length"] == pytest.approx(spec["mean_acceptance_length"])


def test_vllm_ttft_is_first_chunk_carrying_tokens() -> None:
    lines = recorded_vllm()
    first = next(t for t, d in lines if json.loads(d).get("choices") and json.loads(d)["choices"][0]["token_ids"])
    res = replay("vllm", lines)
    assert res["ttft_s"] == pytest.approx(first)
    assert res["decode_tok_s"] == pytest.approx(47 / (lines[-1][0] - first))


def chunk(text: str, ids: list[int]) -> str:
    return json.dumps({"choices": [{"index": 0, "text": text, "token_ids": ids, "finish_reason": None}]})


def test_vllm_multi_token_chunks_spread_inter_token_latency() -> None:
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}})
    res = replay("vllm", [(0.5, chunk("a", [1])), (0.9, chunk("bcd", [2, 3, 4])), (0.9, usage), (1.0, "[DONE]")])
    assert res["ttft_s"] == 0.5 and res["e2e_s"] == 1.0
    assert res["completion_tokens"] == 4 and res["output_tok_s"] == pytest.approx(4.0)
    assert res["chunks"] == 3
    assert res["itl_mean_s"] == pytest.approx(0.4 / 3)
    assert res["accept_length"] is None
    # the gap between the two content chunks, whole (one step of 3 tokens), and time per output token
    assert res["chunk_gap_mean_s"] == pytest.approx(0.4) and res["chunk_tokens_mean"] == 3
    assert res["tpot_s"] == pytest.approx((1.0 - 0.5) / 3)


def test_vllm_empty_chunks_before_content_do_not_set_ttft() -> None:
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
    res = replay("vllm", [(0.1, chunk("", [])), (0.3, chunk("x", [7])), (0.3, usage), (0.4, "[DONE]")])
    assert res["ttft_s"] == 0.3


def test_stream_without_usage_is_not_ok() -> None:
    res = replay("vllm", [(0.2, chunk("a", [1])), (0.3, "[DONE]")])
    assert not res["ok"] and "usage" in res["error"]
    assert res["output_tok_s"] is None


def test_malformed_chunk_marks_request_failed() -> None:
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    res = replay("vllm", [(0.2, chunk("a", [1])), (0.25, '{"choices": [ broken'), (0.3, usage), (0.4, "[DONE]")])
    assert not res["ok"] and res["error"].startswith("malformed stream chunk")


def test_error_object_in_stream() -> None:
    res = replay("vllm", [(0.2, json.dumps({"error": {"message": "boom", "code": 500}}))])
    assert not res["ok"] and res["error"] == "boom"


def test_sglang_generate_stream_counts_from_meta_info() -> None:
    """SGLang /generate streams cumulative text and meta_info; spec_accept_length arrives at the end."""
    def sg(text: str, done: int, finish: dict | None = None, accept: float | None = None) -> str:
        meta = {"id": "r", "prompt_tokens": 12, "completion_tokens": done, "cached_tokens": 0, "finish_reason": finish}
        if accept is not None:
            meta.update(spec_verify_ct=3, spec_accept_length=accept)
        return json.dumps({"text": text, "meta_info": meta, "index": 0})

    res = replay("sglang", [(0.2, sg("def", 1)), (0.3, sg("def fib(n):", 5)),
                            (0.5, sg("def fib(n):\n  return", 9, {"type": "length", "length": 9}, 3.0)),
                            (0.5, "[DONE]")])
    assert res["ok"] and res["completion_tokens"] == 9 and res["prompt_tokens"] == 12
    assert res["ttft_s"] == 0.2 and res["output_tok_s"] == pytest.approx(18.0)
    assert res["accept_length"] == pytest.approx(1 + 5 / 3) and res["finish_reason"] == "length"
    assert res["itl_mean_s"] == pytest.approx((0.1 + 0.2) / 8)
    # spec_verify_ct 3 for 9 tokens and no count of accepted drafts: the first token is prefill's, each step gives
    # 1 + its accepted drafts: 9 - 1 - 3 = 5 (the server's accept_length, 9 / 3, counts the prefill token too)
    assert (res["spec_steps"], res["spec_accepted_tokens"]) == (3, 5)
    assert res["chunk_gap_mean_s"] == pytest.approx(0.15) and res["chunk_tokens_mean"] == 4


@pytest.mark.parametrize("fields, accepted", [
    ({"spec_accepted_drafts": 4}, 4),                                   # 0.5.11
    ({"spec_num_correct_drafts": 5, "spec_accepted_drafts": 5}, 5),     # 0.5.15: the new name and its alias
    ({"spec_num_correct_drafts": 3}, 3),                                # 0.5.23: the new name only
])
def test_sglang_accepted_drafts_are_the_servers_own_count(fields: dict[str, int], accepted: int) -> None:
    meta = {"prompt_tokens": 12, "completion_tokens": 9, "finish_reason": {"type": "length", "length": 9},
            "spec_verify_ct": 3, "spec_accept_length": 3.0, **fields}
    res = replay("sglang", [(0.2, json.dumps({"text": "a", "meta_info": {**meta, "completion_tokens": 1,
                                                                          "finish_reason": None}})),
                            (0.4, json.dumps({"text": "abc", "meta_info": meta})), (0.4, "[DONE]")])
    assert res["ok"] and (res["spec_steps"], res["spec_accepted_tokens"]) == (3, accepted)
