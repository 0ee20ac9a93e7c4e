"""Prompts of the suite and the filler text used to build long-context prompts. Other workloads come in the plan
(`bench_workloads`, `bench_workloads_file`): text, or chat messages that the server's chat template turns into
the prompt."""
from __future__ import annotations

PROMPTS: dict[str, str] = {
    "fib": (
        "Write a Python function `fib(n)` that returns the n-th Fibonacci number iteratively, "
        "with a docstring and a short example of its use.\n\n```python\n"
    ),
    "qsort": (
        "Implement quicksort in Python as a function `quicksort(xs: list[int]) -> list[int]` that "
        "returns a new sorted list. Explain the choice of pivot in a comment.\n\n```python\n"
    ),
    "arith": (
        "A bakery sells muffins for $3 each and cookies for $1.25 each. On Monday it sold 48 muffins "
        "and 130 cookies; on Tuesday it sold 20% more muffins and 15% fewer cookies. How much money did "
        "the bakery take in over the two days? Work through it step by step.\n\nAnswer:"
    ),
    "json": (
        "Produce a JSON object describing a fictional book with the keys \"title\", \"author\", "
        "\"year\" (an integer), \"genres\" (a list of strings) and \"chapters\" (a list of objects with "
        "\"number\" and \"title\"). Output only the JSON.\n\n"
    ),
}

# Neutral prose used to pad a prompt up to a target token count; the workload's own question
# always comes last so the model answers it.
FILLER = (
    "The following is background material from a technical report on distributed systems. "
    "Replication protocols trade latency for durability: a write acknowledged by a quorum survives "
    "the loss of a minority of replicas, while a write acknowledged by the leader alone may be lost. "
    "Clock skew between machines complicates ordering, so many systems rely on logical clocks or "
    "hybrid logical clocks to order events. Caches in front of storage reduce read latency but "
    "introduce staleness; invalidation messages and leases bound it. Batching amortises per-request "
    "overhead at the price of tail latency, and back-pressure keeps queues from growing without bound. "
)


def known() -> list[str]:
    """Names of the built-in workloads."""
    return sorted(PROMPTS)
