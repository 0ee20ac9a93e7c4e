"""The ct200 plan off-site (controller/hub.py through plan.build): the host cannot be reached and no earlier run
recorded it, so each config's memory fit is judged from the models read on the controller — the Hub by the revision
the provisioning downloads (model_weights_models), here a local HTTP server speaking the Hub's two endpoints
(`/api/models/<id>/revision/<rev>?blobs=true`, `/<id>/resolve/<commit>/config.json`) — or a copy in the Hugging Face
cache, and the GPU memory from bench_gpu_memory_mib. The arithmetic is the one a probed host gets."""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from controller import plan
from tests.agent.test_fit import CARD_MIB, GB, QWEN36
from tests.controller.test_matrix import suite_from_host_vars

TARGET, DRAFTER = "Qwen/Qwen3.6-27B", "z-lab/Qwen3.6-27B-DFlash"
SHA = {TARGET: "1" * 40, DRAFTER: "2" * 40}
TOKEN = "hf_planted_offsite_token"
# the target's weights in 11 shards (52 GB in all), the drafter's in one file; other files that are not weights
FILES = {TARGET: {**{f"model-{i:05d}-of-00011.safetensors": 52 * GB // 11 for i in range(1, 11)},
                  "model-00011-of-00011.safetensors": 52 * GB - 10 * (52 * GB // 11), "config.json": 1500,
                  "model.safetensors.index.json": 90000, "tokenizer.json": 7000000, "original/extra.safetensors": 5},
         DRAFTER: {"model.safetensors": int(3.3 * GB), "config.json": 900}}
CONFIGS = {TARGET: QWEN36, DRAFTER: {"num_hidden_layers": 5}}
UNREACHABLE = {"unreachable": True, "msg": "ssh: Could not resolve hostname ct200"}


class Hub(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []
    gated = False

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/v1/models":  # a suite's foreign-load probe on this machine (agent.foreign), not the fit
            return self._send(404, {"error": "not found"})
        Hub.seen.append((self.path, self.headers.get("Authorization")))
        if Hub.gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._send(401, {"error": "Access to model is restricted"})
        for repo in FILES:
            if self.path == f"/api/models/{repo}/revision/main?blobs=true":
                siblings = [{"rfilename": n, "size": s} for n, s in FILES[repo].items()]
                return self._send(200, {"id": repo, "sha": SHA[repo], "siblings": siblings})
            if self.path == f"/{repo}/resolve/{SHA[repo]}/config.json":
                return self._send(200, CONFIGS[repo])
        self._send(404, {"error": "Entry not found"})

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Hub.seen, Hub.gated = [], False
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))          # empty: no copy on this machine
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))              # specfleet's cache folder
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()


def ct200(gpu_memory_mib: int = CARD_MIB) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """ct200's matrix and the provisioning's downloads, as inventory/host_vars/ct200.yml has them."""
    suite = {**suite_from_host_vars("ct200"), "gpu_memory_mib": gpu_memory_mib}
    downloads = [{"repo_id": TARGET, "revision": "main", "dest": suite["model"]["path"]},
                 {"repo_id": DRAFTER, "revision": "main", "dest": suite["draft_model"]["path"]}]
    return suite, downloads


def plan_text(suite: dict[str, Any], downloads: Any, **extra: Any) -> str:
    args = {"suite": suite, "run_id": "r1", "host_dir": "/var/lib/specfleet", "agent_python": "/usr/bin/python3",
            "limits": {}, "hub_models": downloads, "phases": "tp1", **extra}
    res = plan.build(args, {"inventory_hostname": "ct200"}, lambda python, request: UNREACHABLE)
    assert not res.get("failed"), res.get("msg")
    return "\n".join(res["plan_lines"])


def memory_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("memory:")]


def test_the_fit_of_every_config_from_the_hub_then_from_the_kept_answer(hub: str, monkeypatch: pytest.MonkeyPatch
                                                                         ) -> None:
    suite, downloads = ct200()
    text = plan_text(suite, downloads)
    lines = memory_lines(text)
    assert len(lines) == 9 and "host checks: not probed: host unreachable (ssh: Could not resolve" in text
    # the arithmetic a probed host gets (tests/controller/test_hostcheck.py): weights and drafter sized by the Hub
    assert all(line.startswith("memory: fits: budget 89.4 GiB × 0.80 = 71.5 GiB per GPU; weights 48.4 GiB") for
               line in lines), lines
    dflash = next(line for line in lines if "drafter 3.1 GiB" in line)
    assert dflash.endswith("× 100256 tokens = 6.12 GiB of 20.0 GiB left (off-site)")
    source = next(line for line in text.splitlines() if line.startswith("    memory fit off-site, the models read "))
    assert f"from {suite['model']['path']}: the Hub, {TARGET}@main (111111111111, read " in source
    assert f"; {suite['draft_model']['path']}: the Hub, {DRAFTER}@main (222222222222, read " in source
    assert "Memory fit per tp" in text and "    tp 1: 9/9 fit" in text
    assert {path.split("?")[0] for path, _ in Hub.seen} == {
        f"/api/models/{TARGET}/revision/main", f"/{TARGET}/resolve/{SHA[TARGET]}/config.json",
        f"/api/models/{DRAFTER}/revision/main", f"/{DRAFTER}/resolve/{SHA[DRAFTER]}/config.json"}
    assert not any("resolve" in path and "safetensors" in path for path, _ in Hub.seen)   # never the weights

    # the next plan within a day does not ask the Hub: the kept answer, the same lines
    Hub.seen = []
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")                  # nothing listens there
    assert memory_lines(plan_text(suite, downloads)) == lines and Hub.seen == []


def test_a_gated_model_needs_the_token_and_the_token_is_only_in_the_header(hub: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    Hub.gated = True
    suite, downloads = ct200()
    text = plan_text(suite, downloads)
    assert "memory:" not in text and "host checks: not checked off-site: " in text
    assert f"{TARGET}@main not in this machine's Hugging Face cache and not read from the Hub: {hub} answered no " \
           "(HTTP 401: gated or private, set HF_TOKEN)" in text
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    text = plan_text(suite, downloads)
    assert len(memory_lines(text)) == 9 and TOKEN not in text
    assert {auth for _, auth in Hub.seen[-4:]} == {f"Bearer {TOKEN}"}


def test_a_copy_in_the_hugging_face_cache_needs_no_hub(hub: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot of the revision with config.json and the safetensors index only (no weights downloaded): the
    index's total_size stands for them."""
    for repo in FILES:
        folder = tmp_path / "hf-cache" / f"models--{repo.replace('/', '--')}"
        snapshot = folder / "snapshots" / SHA[repo]
        snapshot.mkdir(parents=True)
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(SHA[repo])
        (snapshot / "config.json").write_text(json.dumps(CONFIGS[repo]))
        weights = sum(n for name, n in FILES[repo].items() if name.endswith(".safetensors") and "/" not in name)
        (snapshot / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": weights}}))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    suite, downloads = ct200()
    text = plan_text(suite, downloads)
    lines = memory_lines(text)
    assert len(lines) == 9 and all("weights 48.4 GiB" in line for line in lines)
    assert f"the Hugging Face cache on this machine, {TARGET}@main (111111111111)" in text
    assert Hub.seen == []


@pytest.mark.parametrize("case", ["no_gpu_memory", "hub_down", "offline", "no_hub_id"])
def test_what_the_plan_says_when_the_fit_cannot_be_judged_off_site(hub: str, case: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    suite, downloads = ct200(gpu_memory_mib=0 if case == "no_gpu_memory" else CARD_MIB)
    if case == "hub_down":
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    if case == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if case == "no_hub_id":
        downloads = []
    text = plan_text(suite, downloads)
    assert "memory:" not in text and "Memory fit per tp" not in text
    said = [line.strip() for line in text.splitlines() if line.startswith("    host checks:")]
    want = {
        "no_gpu_memory": "not checked off-site: no GPU memory known (set bench_gpu_memory_mib to nvidia-smi's "
                         "memory.total in MiB; after one run the host's host.json gives it)",
        "hub_down": f"{TARGET}@main not in this machine's Hugging Face cache and not read from the Hub: "
                    "http://127.0.0.1:9 answered no (",
        "offline": "not read from the Hub: HF_HUB_OFFLINE is set on the controller",
        "no_hub_id": None,
    }[case]
    assert any("not probed: host unreachable" in line for line in said), said
    if want is None:
        assert not any("off-site" in line for line in said) and Hub.seen == []
    else:
        assert any(want in line for line in said), said
