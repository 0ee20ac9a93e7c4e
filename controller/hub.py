"""A model's config.json and the total size of its weights, read on the controller when its host cannot answer, so
that the plan still judges each config's memory fit off-site (`plan.build`, `hostcheck.assess`).

Where from, in this order: a copy in this machine's Hugging Face cache (the snapshot of the pinned revision; its
weights, or the safetensors index's total size when the weights are not there), else the Hub by the pinned revision
(the file list with sizes, then config.json: two small reads, never the weights), kept in specfleet's cache folder.
A revision that is a commit is kept for good; a branch or tag is read again after a day, the kept answer serving while
the Hub cannot be reached. The Hub is the one HF_ENDPOINT names (default huggingface.co), with HF_TOKEN for gated
repositories; HF_HUB_OFFLINE=1 leaves it out. The token goes into the request's header only.

Every file read here lies where the user points (HF_HOME, HF_HUB_CACHE, HF_TOKEN_PATH, XDG_CACHE_HOME) and is read
through agent.bounded (RECORD's limit: refs, tokens and configs are bytes to KiB, a safetensors index a few MiB): one
that is not a regular file within it is that model's error, one line naming it, never a blocked or endless read.
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Optional

from agent import bounded
from agent.store import write_json

WEIGHTS = ("safetensors", "bin", "pt")  # the suffixes agent.probe.model sums, in its order (top-level files only)
INDEX = "model.safetensors.index.json"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
FRESH_S = 24 * 3600
TIMEOUT_S = 10.0


def weights_bytes(sizes: Mapping[str, int]) -> Optional[int]:
    """The weights' bytes as agent.probe.model counts them on a host: the top-level files of the first suffix
    present."""
    for suffix in WEIGHTS:
        found = [n for name, n in sizes.items() if "/" not in name and name.endswith(f".{suffix}")]
        if found:
            return sum(found)
    return None


def _hf_home() -> Path:
    return Path(os.environ.get("HF_HOME")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")


def _hub_cache() -> Path:
    return Path(os.environ["HF_HUB_CACHE"]) if os.environ.get("HF_HUB_CACHE") else _hf_home() / "hub"


def _token() -> Optional[str]:
    """As huggingface_hub finds it: HF_TOKEN, else the file `huggingface-cli login` wrote."""
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token.strip()
    path = Path(os.environ.get("HF_TOKEN_PATH") or _hf_home() / "token")
    try:
        return _text(path).strip() or None
    except bounded.BoundError:
        raise
    except OSError:
        return None


def _text(path: Path) -> str:
    """A file of the Hugging Face cache or specfleet's, once it is a regular file within RECORD's limit
    (bounded.BoundError)."""
    return bounded.read_text(path, bounded.RECORD)


def local_copy(repo_id: str, revision: str) -> Optional[dict[str, Any]]:
    """config.json and the weights' size from the Hugging Face cache's snapshot of `revision`; None without one."""
    folder = _hub_cache() / f"models--{repo_id.replace('/', '--')}"
    commit = revision if COMMIT.match(revision) else None
    if commit is None:
        try:
            commit = _text(folder / "refs" / revision).strip()
        except bounded.BoundError:
            raise
        except OSError:
            return None
    snapshot = folder / "snapshots" / commit
    try:
        config = json.loads(_text(snapshot / "config.json"))
    except bounded.BoundError:
        raise
    except (OSError, ValueError):
        return None
    sizes = {p.name: p.stat().st_size for p in snapshot.iterdir() if p.is_file()}  # is_file: the blob is there
    size = weights_bytes(sizes)
    if size is None:
        try:
            size = int(json.loads(_text(snapshot / INDEX))["metadata"]["total_size"])
        except bounded.BoundError:
            raise
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return {"config": config, "weights_bytes": size, "commit": commit,
            "source": f"the Hugging Face cache on this machine, {repo_id}@{revision} ({commit[:12]})"}


def _get(url: str, token: Optional[str]) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 (https or the set endpoint)
        data = response.read(bounded.RECORD.limit + 1)  # an endpoint that answers without end is cut off
    if len(data) > bounded.RECORD.limit:
        raise ValueError(f"{url} answered more than {bounded.size_text(bounded.RECORD.limit)}")
    return json.loads(data)


def from_hub(repo_id: str, revision: str, endpoint: str, token: Optional[str]) -> dict[str, Any]:
    """The file list with sizes and config.json of `repo_id` at `revision`, from the Hub's API."""
    quoted = urllib.parse.quote(revision, safe="")
    info = _get(f"{endpoint}/api/models/{repo_id}/revision/{quoted}?blobs=true", token)
    commit = str(info.get("sha") or revision)
    sizes = {s["rfilename"]: int(s.get("size") or (s.get("lfs") or {}).get("size") or 0)
             for s in info.get("siblings") or [] if isinstance(s, dict) and s.get("rfilename")}
    config = _get(f"{endpoint}/{repo_id}/resolve/{urllib.parse.quote(commit, safe='')}/config.json", token)
    return {"config": config, "weights_bytes": weights_bytes(sizes), "commit": commit}


def model(repo_id: str, revision: Optional[str], cache: Path) -> dict[str, Any]:
    """{config, weights_bytes, source} of a model by its Hub id and pinned revision, or {error} saying why not (a
    file on the way that is not a regular file within its limit: naming it)."""
    revision = revision or "main"
    try:
        return _model(repo_id, revision, cache)
    except bounded.BoundError as exc:
        return {"error": f"{repo_id}@{revision}: {exc}"}


def _model(repo_id: str, revision: str, cache: Path) -> dict[str, Any]:
    found = local_copy(repo_id, revision)
    if found:
        return found
    kept_path = cache / "hub" / f"{repo_id.replace('/', '--')}@{urllib.parse.quote(revision, safe='')}.json"
    try:
        kept: Optional[dict[str, Any]] = json.loads(_text(kept_path))
    except bounded.BoundError:
        raise
    except (OSError, ValueError):
        kept = None
    if kept and (COMMIT.match(revision) or time.time() - float(kept.get("read_at") or 0) < FRESH_S):
        return {**kept, "source": _said(repo_id, revision, kept)}
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        why = "HF_HUB_OFFLINE is set on the controller"
    else:
        try:
            read = {**from_hub(repo_id, revision, endpoint, _token()), "read_at": time.time(), "endpoint": endpoint}
        except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError) as exc:
            why = f"{endpoint} answered no ({_reason(exc)})"
        else:
            if read["weights_bytes"] is None or not isinstance(read["config"], dict):
                why = f"{endpoint} lists no weights or no config.json for {repo_id}@{revision}"
            else:
                try:
                    write_json(kept_path, read)
                except OSError:
                    pass  # not kept: the next plan asks the Hub again
                return {**read, "source": _said(repo_id, revision, read)}
    if kept:
        return {**kept, "source": _said(repo_id, revision, kept) + f"; not read again: {why}"}
    return {"error": f"{repo_id}@{revision} not in this machine's Hugging Face cache and not read from the Hub: {why}"}


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}" + (": gated or private, set HF_TOKEN" if exc.code in (401, 403) else "")
    return str(getattr(exc, "reason", None) or exc)[:160]


def _said(repo_id: str, revision: str, read: Mapping[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d", time.gmtime(float(read.get("read_at") or 0)))
    return f"the Hub, {repo_id}@{revision} ({str(read.get('commit'))[:12]}, read {when})"


def repo_of(model_spec: Mapping[str, Any], downloads: Any) -> tuple[Optional[str], Optional[str]]:
    """The Hub id and revision of a matrix model: the entry of the provisioning's downloads (model_weights_models)
    whose dest is the model's path."""
    for entry in downloads if isinstance(downloads, list) else []:
        if isinstance(entry, Mapping) and entry.get("repo_id") and entry.get("dest") == model_spec.get("path"):
            return str(entry["repo_id"]), str(entry.get("revision") or model_spec.get("revision") or "main")
    return None, None


def offsite(suite: Mapping[str, Any], downloads: Any, cache: Path) -> Optional[tuple[dict[str, Any], list[str]]]:
    """The probe-shaped `models` of the suite's model and drafter read off-site, and one line per model read or
    not; None when the provisioning downloads neither (nothing to read them by)."""
    specs = {k: suite[k] for k in ("model", "draft_model") if isinstance(suite.get(k), Mapping)}
    if not any(repo_of(spec, downloads)[0] for spec in specs.values()):
        return None
    models: dict[str, Any] = {}
    said = []
    for key, spec in specs.items():
        repo_id, revision = repo_of(spec, downloads)
        if repo_id is None:
            said.append(f"{spec.get('path')}: no Hub id (no model_weights_models entry has it as dest)")
            continue
        got = model(repo_id, revision, cache)
        if "error" in got:
            said.append(got["error"])
            continue
        models[key] = {"path": spec.get("path"), "config": got["config"], "weights_bytes": got["weights_bytes"]}
        said.append(f"{spec.get('path')}: {got['source']}")
    return models, said
