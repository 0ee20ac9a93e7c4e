"""GPU state while a config's timed requests run: one long-lived `nvidia-smi` sampling at an interval
(1 s by default) into `gpu.jsonl`, and the summary of the timed window that goes in `status.json`
(`gpu_state`): per GPU the range and mean of clocks, power, temperature, utilisation and memory, and
the throttle reasons (thermal, power cap, HW slowdown) seen during the timed requests.

    with Sampler(folder / "gpu.jsonl") as gpus:   # before the warmup: nvidia-smi takes a moment to start
        ...                                      # the warmup (gpus.wait_first(5.0) if there is none)
        t0 = time.monotonic()                    # right before the first timed request
        ...                                      # the timed requests
        t1 = time.monotonic()                    # after the last
    status["gpu_state"] = gpus.summary(t0, t1)  # None on a host without nvidia-smi: leave the field out

One `nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms <ms>` runs for the whole block; a
reader thread parses each line as it arrives (`agent.gpu.parse_sample`) and appends one JSON line per
GPU per sample, stamped with this host's monotonic clock (`mono_s`, the clock the caller's window is
in) and UTC time. The block never waits on nvidia-smi and never fails because of it: a sampler that
cannot sample says why in `note`. Leaving the block stops the process (terminate, then kill), also
when the block raises.

Without nvidia-smi on PATH nothing is started and no `gpu.jsonl` is written (`note` says so). Where
nvidia-smi exists the file is created on entry, so an empty `gpu.jsonl` means nvidia-smi gave no
sample (`note` says why).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Dict, Iterable, List, Mapping, Optional, Sequence

from . import gpu

STOP_WAIT_S = 2.0
# the readings summarised per GPU: nvidia-smi's field names (MHz, MHz, W, °C, %, %, MiB)
SUMMARISED = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu", "utilization.memory",
              "memory.used")
_INVALID_FIELD = "is not a valid field to query"


def _utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Sampler:
    """Samples the GPUs with one `nvidia-smi -lms` process while the `with` block runs; `indices` limits it
    to those GPUs (nvidia-smi's `-i`), None samples all. After the block: `samples` (lines written),
    `prefix` (which reason names the driver answered), `note` (why nothing or not everything was
    sampled, else None)."""

    def __init__(self, path: Path | str, interval_s: float = 1.0, indices: Optional[Sequence[int]] = None) -> None:
        self.path = Path(path)
        self.interval_s = float(interval_s)
        self.indices = list(indices) if indices is not None else None
        self.samples = 0
        self.prefix: Optional[str] = None
        self.note: Optional[str] = None
        self.available = False
        self._proc: Optional[subprocess.Popen[str]] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._out: Optional[IO[str]] = None
        self._first = threading.Event()

    def argv(self, exe: str, prefix: str) -> List[str]:
        """The nvidia-smi command line of one sampling process."""
        cmd = [exe, f"--query-gpu={gpu.sample_fields(prefix)}", "--format=csv,noheader,nounits",
               "-lms", str(max(1, round(self.interval_s * 1000)))]
        if self.indices is not None:
            cmd += ["-i", ",".join(str(i) for i in self.indices)]
        return cmd

    def __enter__(self) -> Sampler:
        exe = shutil.which("nvidia-smi")
        if not exe:
            self.note = "no nvidia-smi on PATH: GPU state not sampled"
            return self
        self.available = True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._out = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            self.note = f"cannot write {self.path.name}: {exc}"
            return self
        self._thread = threading.Thread(target=self._run, args=(exe,), name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop sampling: end nvidia-smi and the reader; safe to call twice."""
        self._stopping.set()
        with self._lock:
            proc = self._proc
        if proc is not None:
            _end(proc)
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S * 3)
        if self._out is not None and not self._out.closed and (self._thread is None or not self._thread.is_alive()):
            self._out.close()

    def _run(self, exe: str) -> None:
        try:
            for prefix in gpu.REASON_PREFIXES:
                rejected = self._sample(exe, prefix)
                if not rejected:
                    return
            self.note = f"nvidia-smi knows none of the reason fields {', '.join(gpu.REASON_PREFIXES)}.*"
        except Exception as exc:  # the sampler must never take the measurement down  # noqa: BLE001
            self.note = f"sampler stopped: {type(exc).__name__}: {exc}"

    def _sample(self, exe: str, prefix: str) -> bool:
        """Run one nvidia-smi until it ends or the block does; True when it rejected the field names."""
        fields = gpu.sample_fields(prefix)
        with self._lock:
            if self._stopping.is_set():
                return False
            try:
                proc = subprocess.Popen(self.argv(exe, prefix), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True, bufsize=1)
            except OSError as exc:
                self.note = f"nvidia-smi did not start: {exc}"
                return False
            self._proc = proc
        assert proc.stdout is not None
        other: List[str] = []
        parsed = 0
        seen: set = set()
        seq = 0
        for line in iter(proc.stdout.readline, ""):
            mono, utc = time.monotonic(), _utc()
            rows = gpu.parse_sample(line, fields)
            if not rows:
                if line.strip() and len(other) < 5:
                    other.append(line.strip())
                continue
            if parsed == 0:
                self.prefix = prefix
            parsed += 1
            row = rows[0]
            if row["index"] in seen:  # the next sample begins when a GPU comes round again
                seq, seen = seq + 1, set()
            seen.add(row["index"])
            self._write({"mono_s": round(mono, 3), "utc": utc, "sample": seq, **row})
        rc = _end(proc)
        if parsed == 0 and any(_INVALID_FIELD in o for o in other):
            return True
        if not self._stopping.is_set():
            self.note = (f"nvidia-smi exited (rc {rc}) after {self.samples} lines"
                         + (f": {' | '.join(other)}"[:400] if other else ""))
        elif parsed == 0:
            self.note = "no sample before the block ended" + (f": {' | '.join(other)}"[:400] if other else "")
        return False

    def _write(self, record: Mapping[str, Any]) -> None:
        if self._out is None or self._out.closed:
            return
        self._out.write(json.dumps(record, sort_keys=True) + "\n")
        self._out.flush()
        self.samples += 1
        self._first.set()

    def wait_first(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the first sample (nvidia-smi's start takes from a tenth of a second to
        seconds without persistence mode); True once there is one. Optional: sampling goes on either way."""
        return self._thread is not None and self._first.wait(timeout_s)

    def summary(self, start: float, end: float) -> Optional[Dict[str, Any]]:
        """`gpu_state` of the window [start, end] (time.monotonic() before the first timed request and after
        the last); None where there is no nvidia-smi (leave the field out)."""
        if not self.available:
            return None
        out = summarize(read(self.path), start, end, self.interval_s)
        if self.note:
            out["note"] = self.note
        return out


def _end(proc: subprocess.Popen[str]) -> Optional[int]:
    """Terminate, then kill; the exit status."""
    if proc.poll() is None:
        try:
            proc.terminate()
            return proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
        except OSError:
            pass
    try:
        return proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        return None


def read(path: Path | str) -> List[Dict[str, Any]]:
    """The records of a gpu.jsonl; [] when it does not exist; lines that are not JSON objects are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _stats(values: List[float]) -> Optional[Dict[str, float]]:
    if not values:
        return None
    return {"min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 2)}


def summarize(records: Iterable[Mapping[str, Any]], start: float, end: float,
              interval_s: float = 1.0) -> Dict[str, Any]:
    """The `gpu_state` of a config from its gpu.jsonl records within [start, end] (monotonic seconds):
    `samples` (sampling instants in the window), per GPU (`gpus`, by index) its sample count and
    min/max/mean of each reading in SUMMARISED, the throttle reasons and how many of its samples
    had each; `throttled` lists every (GPU, reason) seen, so it is empty when nothing throttled."""
    inside = [r for r in records if isinstance(r.get("mono_s"), (int, float)) and start <= r["mono_s"] <= end]
    per: Dict[int, List[Mapping[str, Any]]] = {}
    for r in inside:
        if isinstance(r.get("index"), int):
            per.setdefault(r["index"], []).append(r)
    gpus, throttled = [], []
    for index in sorted(per):
        rows = per[index]
        g: Dict[str, Any] = {"index": index, "uuid": rows[0].get("uuid"), "samples": len(rows)}
        for name in SUMMARISED:
            g[name] = _stats([r[name] for r in rows if isinstance(r.get(name), (int, float))])
        counts = {reason: sum(1 for r in rows if r.get(reason) is True) for reason in gpu.THROTTLE_KINDS}
        g["throttle"] = {k: n for k, n in counts.items() if n}
        for reason, n in g["throttle"].items():
            throttled.append({"gpu": index, "reason": reason, "kind": gpu.THROTTLE_KINDS[reason], "samples": n,
                              "of": len(rows)})
        gpus.append(g)
    out: Dict[str, Any] = {"window_s": round(end - start, 3), "interval_s": interval_s,
                           "samples": len({r.get("sample") for r in inside}), "gpus": gpus, "throttled": throttled}
    if not inside:
        out["note"] = "no GPU sample within the timed window"
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m agent.gpusample gpu.jsonl [seconds] [interval_s]`: sample for a while, print the summary."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(main.__doc__)
        return 2
    seconds = float(args[1]) if len(args) > 1 else 10.0
    with Sampler(args[0], float(args[2]) if len(args) > 2 else 1.0) as s:
        t0 = time.monotonic()
        time.sleep(seconds)
        t1 = time.monotonic()
    print(json.dumps(s.summary(t0, t1), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
