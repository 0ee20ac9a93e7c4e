#!/usr/bin/env bash
# Captures for the GPU-state sampler (agent.gpusample), on a real NVIDIA host, into $OUT (default ./captures):
# the driver's field list, the sampler's query one-shot (both reason prefixes, and a field the driver rejects),
# nvidia-smi's own -lms stream, and the sampler itself for ~14 s around a ~10 s matrix-multiply load.
# Reads only; changes no GPU setting. tests/fixtures/nvidia-h200/README.md lists what each file is.
set -u
OUT=$(realpath -m "${OUT:-captures}")
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
EVENT=$(python3 -c 'from agent import gpu; print(gpu.sample_fields("clocks_event_reasons"))')
THROTTLE=$(python3 -c 'from agent import gpu; print(gpu.sample_fields("clocks_throttle_reasons"))')
{
  nvidia-smi --version
  echo "== one-shot, clocks_event_reasons, csv (header, units)"
  nvidia-smi --query-gpu="$EVENT" --format=csv; echo "rc=$?"
  for i in 1 2 3; do
    echo "== one-shot $i, clocks_event_reasons, csv,noheader,nounits"
    nvidia-smi --query-gpu="$EVENT" --format=csv,noheader,nounits; echo "rc=$?"
  done
  echo "== one-shot, clocks_throttle_reasons, csv,noheader,nounits"
  nvidia-smi --query-gpu="$THROTTLE" --format=csv,noheader,nounits; echo "rc=$?"
  echo "== a field the driver does not know (stdout)"
  nvidia-smi --query-gpu=index,no_such.field --format=csv,noheader,nounits 2>/dev/null; echo "rc=$?"
  echo "== the same (stderr)"
  nvidia-smi --query-gpu=index,no_such.field --format=csv,noheader,nounits 2>&1 >/dev/null; echo "rc=$?"
  echo "== -lms 1000 for 3.5 s, idle, lines stamped on arrival"
  timeout 3.5 nvidia-smi --query-gpu="$EVENT" --format=csv,noheader,nounits -lms 1000 \
    | python3 -u -c 'import sys, time; t = time.monotonic(); [print(f"{time.monotonic() - t:.3f} {l}", end="") for l in sys.stdin]'
  echo "rc=${PIPESTATUS[0]}"
} > "$OUT/query-gpu-sample.log" 2>&1
nvidia-smi --help-query-gpu > "$OUT/help-query-gpu.txt" 2>&1

LOAD='
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
torch.cuda.synchronize(); end = time.monotonic() + float(sys.argv[1]); n = 0
while time.monotonic() < end:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize(); n += 20
print(f"load: {n} bf16 8192^3 matmuls, {n * 2 * 8192**3 / float(sys.argv[1]) / 1e12:.0f} TFLOP/s", flush=True)
'
python3 - "$OUT" "$LOAD" <<'PY' > "$OUT/sampler-run.log" 2>&1
import json, subprocess, sys, time
from pathlib import Path
from agent import gpusample
out, load = Path(sys.argv[1]), sys.argv[2]
with gpusample.Sampler(out / "sampler-run.jsonl") as s:
    time.sleep(2)
    t0 = time.monotonic()
    job = subprocess.Popen([sys.executable, "-c", load, "10"])
    time.sleep(6)
    perf = subprocess.run(["nvidia-smi", "-q", "-d", "PERFORMANCE"], capture_output=True, text=True).stdout
    job.wait()
    t1 = time.monotonic()
    time.sleep(2)
print("prefix", s.prefix, "lines", s.samples, "note", s.note, "window", round(t1 - t0, 3))
print(json.dumps(s.summary(t0, t1), indent=1))
left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and (p / "comm").exists()
        and (p / "comm").read_text().strip() == "nvidia-smi"]
print("nvidia-smi processes left:", left or "none")
print("== nvidia-smi -q -d PERFORMANCE, 6 s into the load")
print(perf)
PY
