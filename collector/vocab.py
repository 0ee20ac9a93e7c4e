"""Cells and figures in words, the same in every output, in `compare`, in `history` and in the controller's plan: the
cell's key (agent.records.CELL), a cell and its load in words, a config's method parameters in words, and numbers
that may be missing (None, NaN, pandas' NA) as floats or text. The standard library and agent.records only: the plan
imports it without pandas or numpy."""
from __future__ import annotations

import json
import math
import numbers
from typing import Any, Mapping

from agent import records

CELL = records.CELL  # a cell of a config: workload, max_tokens, context_tokens, concurrency, request_rate
LOAD = ("concurrency", "request_rate")  # a cell's load: closed loop (concurrency) or open loop (request rate)
UNKNOWN_CELL = "(unknown cell)"  # a cell whose workload is not known (a failed config whose config.json is lost)


def na(v: Any) -> bool:
    """An empty value: None, NaN (Python's or numpy's) or pandas' NA."""
    if v is None:
        return True
    try:
        return bool(v != v)  # NaN alone differs from itself
    except TypeError:  # pandas' NA: comparing with it gives NA, which has no truth value
        return True


def number(v: Any) -> float:
    """A value as a float: NaN when it is empty or no number (text, a bool)."""
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else math.nan


def finite(v: Any) -> bool:
    """Whether a value is a number, neither empty nor infinite."""
    return math.isfinite(number(v))


def fixed(v: Any, digits: int = 2) -> str:
    """A float with `digits` decimals, any other value as its text; empty when it is empty."""
    if na(v):
        return ""
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def seconds_words(v: Any) -> str:
    """`12.5 s`; `? s` for what is no number."""
    return f"{v:.1f} s" if isinstance(v, (int, float)) and not isinstance(v, bool) else "? s"


def load_words(cell: Mapping[str, Any]) -> str:
    """A cell's load: `c4` (closed loop; nothing at concurrency 1), `2 req/s` or `all at once` (open loop)."""
    rate = cell.get("request_rate")
    if not na(rate):
        rate = records.rate(rate)
        return "all at once" if rate == math.inf else f"{rate:g} req/s"
    c = cell.get("concurrency")
    return "" if na(c) or c == 1 else f"c{c}"


def cell_words(cell: Mapping[str, Any], leave_out: str = "") -> str:
    """`fib, 128 tok, ctx 512, c4`: a cell in words, without the field `leave_out` (either field of LOAD leaves out
    the load)."""
    workload = cell.get("workload")
    parts = [workload if isinstance(workload, str) else UNKNOWN_CELL]
    if leave_out != "max_tokens" and not na(cell.get("max_tokens")):
        parts.append(f"{cell['max_tokens']} tok")
    context = cell.get("context_tokens")
    if leave_out != "context_tokens" and not na(context) and context:
        parts.append(f"ctx {context}")
    load = "" if leave_out in LOAD else load_words(cell)
    if load:
        parts.append(load)
    return ", ".join(parts)


def params_words(method_params: Any) -> str:
    """`num_speculative_tokens 3, synth_len 2.5`: a config's method parameters (an object, as config.json holds them,
    or its JSON text, as the table does) by name, floats as `:g` writes them, a list's items joined by `/`; empty
    for none."""
    if isinstance(method_params, str):
        try:
            method_params = json.loads(method_params)
        except ValueError:
            return method_params
    if not isinstance(method_params, Mapping):
        return ""

    def value(v: Any) -> str:
        if isinstance(v, list):
            return "/".join(map(value, v))
        return format(v, "g") if isinstance(v, float) else str(v)

    return ", ".join(f"{k} {value(v)}" for k, v in method_params.items())


def tok_words(mean: Any, std: Any, n: Any, unit: str = "") -> str:
    """`26.4 ± 0.3 tok/s (n=5)`: a mean with its sample std and size; empty without a mean."""
    if na(mean):
        return ""
    return f"{mean:.1f}{'' if na(std) else f' ± {std:.1f}'}{unit} (n={n})"


def ratio_words(ratio: Any, lo: Any, hi: Any) -> str:
    """`1.52 [1.48, 1.57]`: a ratio with its 95% interval; empty without a ratio."""
    if na(ratio):
        return ""
    return f"{ratio:.2f}" + ("" if na(lo) or na(hi) else f" [{lo:.2f}, {hi:.2f}]")
