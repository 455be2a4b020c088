#!/usr/bin/env bash
# Check baselines/epx_mpi_baseline (the plain-MPI Megatron-style dispatcher) against an
# independent numpy computation of docs/spec.md §3 and §4.
#
#   tests/e2e/check_mpi_baseline.sh [PATH/TO/epx_mpi_baseline]
#
# Without an argument it uses $EPX_MPI_BASELINE, else the first build*/baselines/epx_mpi_baseline
# of the repo.  Prints SKIP and exits 0 when mpirun or the binary is absent; prints PASS
# or FAIL per run and exits non-zero on any failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=/usr/bin/python3

bin=${1:-${EPX_MPI_BASELINE:-}}
if [ -z "$bin" ]; then
  for c in "$repo"/build/baselines/epx_mpi_baseline "$repo"/build*/baselines/epx_mpi_baseline; do
    if [ -x "$c" ]; then bin=$c; break; fi
  done
fi
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: Open MPI not installed (no mpirun; apt-get install libopenmpi-dev openmpi-bin)"
  exit 0
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "SKIP: Open MPI not installed or epx_mpi_baseline not built (no binary found)"
  exit 0
fi

mpirun_cmd=(mpirun --oversubscribe --mca btl self,vader --mca osc ^rdma)
if [ "$(id -u)" = 0 ]; then mpirun_cmd+=(--allow-run-as-root); fi

work=$(mktemp -d /tmp/epx_mpi_check.XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0

# verify CASE_DIR JSON LAYOUT ALIGNMENT EXPERT: recompute the hashes with numpy and compare.
# EXPERT identity: y = the dispatch output; replay: y = bf16(f32(row) * g(n)) (docs/spec.md §7).
verify() {
  "$py" - "$@" <<'PYEOF'
import json, os, sys
import numpy as np

case, out_json, layout, A, expert = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
meta = json.load(open(os.path.join(case, "meta.json")))
P, E, H, K = meta["num_ranks"], meta["num_experts"], meta["hidden"], meta["num_topk"]
L = E // P
idx = [np.load(os.path.join(case, "rank%d" % r, "topk_idx.npy")) for r in range(P)]
x = [np.load(os.path.join(case, "rank%d" % r, "x.npy")) for r in range(P)]

def f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)

def bf16(v):  # round to nearest even (inputs are finite)
    u = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

def fnv(a):
    h = 0xCBF29CE484222325
    for b in np.ascontiguousarray(a).astype("<u2", copy=False).tobytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "0x%016x" % h

def g(n):
    return np.float32(float((n + 1) * 256 ** (n % 4)))

# Dispatch (docs/spec.md §3): rows per destination, and where each (s,t[,k]) landed; y = expert output.
recv, place, yall = [], [], []
for d in range(P):
    rows, pl, ns = [], {}, []  # ns: the expert's n per row, None = padding
    if layout == "compact":
        for s in range(P):
            for t in range(idx[s].shape[0]):
                local = [int(e) - d * L for e in idx[s][t] if e >= 0 and e // L == d]
                if local:
                    pl[(s, t)] = len(rows); rows.append(x[s][t]); ns.append(sum(local))
    else:
        for j in range(L):
            n = 0
            for s in range(P):
                for t in range(idx[s].shape[0]):
                    for k in range(K):
                        if idx[s][t, k] == d * L + j:
                            pl[(s, t, k)] = len(rows); rows.append(x[s][t]); ns.append(j); n += 1
            rows += [np.zeros(H, np.uint16)] * ((-n) % A)
            ns += [None] * ((-n) % A)
    r = np.array(rows, dtype=np.uint16).reshape(len(rows), H)
    recv.append(r)
    place.append(pl)
    if expert == "identity":
        yall.append(r)
    else:
        y = np.zeros_like(r)
        for i, n in enumerate(ns):
            if n is not None:
                y[i] = bf16(f32(r[i]) * g(n))
        yall.append(y)

# Combine (docs/spec.md §4) with y = the dispatch output.
out = []
for s in range(P):
    S = idx[s].shape[0]
    o = np.zeros((S, H), np.uint16)
    for t in range(S):
        acc = np.zeros(H, np.float32)
        groups = {}
        for k in range(K):
            e = int(idx[s][t, k])
            if e >= 0:
                groups.setdefault(e // L, []).append(k)
        if layout == "compact":
            for d in sorted(groups):
                acc = acc + f32(yall[d][place[d][(s, t)]])
        else:
            for d, ks in sorted(groups.items(), key=lambda it: max(it[1])):
                if len(ks) == 1:
                    p = yall[d][place[d][(s, t, ks[0])]]
                else:
                    part = np.zeros(H, np.float32)
                    for k in sorted(ks):
                        part = part + f32(yall[d][place[d][(s, t, k)]])
                    p = bf16(part)
                acc = acc + f32(p)
        o[t] = bf16(acc)
    out.append(o)

got = json.load(open(out_json))
want = {
    "ranks": P, "hidden": H, "topk": K, "experts": E, "layout": layout, "verify_expert": expert,
    "tokens_per_rank": [int(a.shape[0]) for a in idx],
    "recv_rows": [int(r.shape[0]) for r in recv],
    "dispatch_hash": [fnv(r) for r in recv],
    "combine_hash": [fnv(o) for o in out],
    "payload_bytes_per_rank": [
        int(sum(1 for t in range(idx[s].shape[0]) for d in range(P)
                if any(e >= 0 and e // L == d for e in idx[s][t]))) * H * 2
        for s in range(P)],
}
bad = [k for k in want if got.get(k) != want[k]]
for k in ("dispatch", "combine"):
    st = got.get(k, {}).get("max_rank_us", {})
    if not all(isinstance(st.get(q), (int, float)) and st[q] >= 0 for q in ("avg", "p50", "p95", "max")) \
            or len(got.get(k, {}).get("rank_us", [])) != P:
        bad.append(k + ".timings")
for k in bad:
    print("  mismatch %s: got %s, expected %s" % (k, got.get(k), want.get(k)))
sys.exit(1 if bad else 0)
PYEOF
}

# run NAME CASE_DIR NP LAYOUT ALIGNMENT [EXPERT]
run() {
  local name=$1 case_dir=$2 np=$3 layout=$4 align=$5 expert=${6:-identity}
  local json="$work/$name.json"
  if ! timeout 300 "${mpirun_cmd[@]}" -np "$np" "$bin" --routing "$case_dir" --iters 3 \
      --warmup 1 --json "$json" --layout "$layout" --alignment "$align" --verify-expert "$expert" \
      >"$work/$name.out" 2>"$work/$name.err"; then
    echo "FAIL: $name: epx_mpi_baseline exited non-zero"; cat "$work/$name.err"; failures=$((failures + 1)); return
  fi
  if [ ! -s "$json" ]; then
    echo "FAIL: $name: no JSON written"; failures=$((failures + 1)); return
  fi
  if verify "$case_dir" "$json" "$layout" "$align" "$expert"; then
    echo "PASS: $name"
  else
    echo "FAIL: $name: output differs from the numpy reference"; failures=$((failures + 1))
  fi
}

# expect_error NAME CASE_DIR NP PATTERN: the run must fail with PATTERN on stderr.
expect_error() {
  local name=$1 case_dir=$2 np=$3 pattern=$4
  if timeout 120 "${mpirun_cmd[@]}" -np "$np" "$bin" --routing "$case_dir" --iters 1 \
      --warmup 0 --json "$work/$name.json" >"$work/$name.out" 2>"$work/$name.err"; then
    echo "FAIL: $name: exit status 0 on a bad input"; failures=$((failures + 1))
  elif ! grep -q -- "$pattern" "$work/$name.err"; then
    echo "FAIL: $name: stderr lacks '$pattern':"; cat "$work/$name.err"; failures=$((failures + 1))
  else
    echo "PASS: $name"
  fi
}

gen() { "$py" "$here/gen_case.py" "$@" >/dev/null; }

gen --out "$work/basic" --ranks 4 --experts 16 --hidden 256 --topk 4 --tokens 64 --seed 5 || {
  echo "FAIL: gen_case.py failed"; exit 1; }
run basic-compact "$work/basic" 4 compact 1
run basic-expanded "$work/basic" 4 expanded 1
run basic-expanded-a8 "$work/basic" 4 expanded 8

# Uneven and empty ranks, masked slots, order probes.
gen --out "$work/edge" --ranks 4 --experts 8 --hidden 128 --topk 3 --tokens-per-rank 5,0,12,9 \
    --mask-prob 0.3 --probes 3 --seed 7 || { echo "FAIL: gen_case.py failed (edge)"; exit 1; }
run edge-compact "$work/edge" 4 compact 1
run edge-expanded-a4 "$work/edge" 4 expanded 4

# With the replay expert function the float32 addition order shows on the order probes.
gen --out "$work/probes" --ranks 4 --experts 64 --hidden 256 --topk 8 --tokens 24 \
    --mask-prob 0.1 --probes 30 --seed 11 || { echo "FAIL: gen_case.py failed (probes)"; exit 1; }
run probes-compact-replay "$work/probes" 4 compact 1 replay
run probes-expanded-replay "$work/probes" 4 expanded 2 replay
run edge-expanded-replay "$work/edge" 4 expanded 1 replay

# Bad inputs fail cleanly on every rank.
gen --out "$work/bad" --ranks 4 --experts 16 --hidden 256 --topk 4 --tokens 8 --seed 1 \
    --invalid missing_file --bad-rank 2 || { echo "FAIL: gen_case.py failed (bad)"; exit 1; }
expect_error bad-missing-file "$work/bad" 4 "rank 2"
expect_error bad-np "$work/basic" 2 "num_ranks is 4"

if [ "$failures" -ne 0 ]; then
  echo "FAIL: $failures check(s) failed"
  exit 1
fi
echo "PASS: epx_mpi_baseline matches the numpy reference"
