#!/usr/bin/env bash
# Multi-"machine" tests of the shmem transport on one box:
#
#   bash tests/multinode/run.sh [BUILD_DIR]        # default: build
#
# Each "machine" is a network namespace of this run (epx-<pid>-1, epx-<pid>-2; veths on a
# bridge epxb<pid> without an address; 10.200.0.1/.2 only inside the namespaces) whose
# ranks also get their own UTS, mount and IPC namespaces and a private tmpfs /dev/shm
# (tests/multinode/agent.sh, mpirun's rsh agent). Everything is removed in an EXIT trap;
# every run is under `timeout`. Prints SKIP and exits 0 when namespaces cannot be made
# (not root, no ip/unshare) or the build has no shmem transport.
#
# Checks (bit for bit against tests/reference inside epx_multinode_rank):
#   one machine, no namespace, 4 ranks, no Open MPI flags: every case (peers mapped by
#       shmem_ptr: copies, pull); epx set the heap and osc ucx
#   2 machines x 2 ranks, the network's flags only: every case; the bytes that crossed the
#       veth against epx's count; the hierarchical schedule, both combine orders, puts
#       across machines only to same-lane ranks, node-first no more than flat
#   2 machines x 4 ranks: a subset (both layouts, FP8 + worst, tail; flag runs at 2 x 2: a fence per 512-byte block)
#   epx replay --transport shmem: cases of tests/e2e/check_replay.py (numpy reference) in one
#       namespace and at 2 x 2 (one FP8 case at 2 + 1), errors naming the rank at fault; a
#       launcher whose P is not meta.json's refused on every rank
#   epx bench --transport shmem --baseline mpi, 2 x 2, network settings only: hierarchical +
#       node-first by default, epx's runtime settings, the baseline's report lines and ratios
#   BucketBuffer, 1 machine x 4 and 2 x 2: every bucket case bit for bit (two-level all_reduce
#       across machines); epx bench --op all_reduce --bytes 16M --baseline mpi at 2 x 2
#   PPBuffer / EngramBuffer, 2 x 2: random programs and fetches bit for bit; epx bench --op pp
#       and --op engram --transport shmem against MPI in the same job
#   faults, 2 x 2: SIGKILL of a rank on the other machine, SIGKILL of the other machine's
#       daemon (orted), the other machine's link cut mid-call (section 7 says what each
#       does): the job exits non-zero, every survivor names peer + phase (on a cut link by
#       its own timeout; after a SIGKILL in the line its SIGTERM from the launcher makes it
#       print), no epx rank is left in either namespace (so neither private /dev/shm
#       survives), nothing new in the host's /dev/shm.
#   healing, 2 x 2 (Open MPI told to let survivors live): SIGKILL of a rank on the other
#       machine, then of one on rank 0's machine; the survivors agree, rebuild the group
#       over the shmem transport and go on bit for bit on 3 ranks across both machines; the
#       job ends by itself, nothing left behind.
#   healing Engram and PP, 2 x 2: a rank SIGKILLed while the others fetch its Engram rows by
#       gets / wait for its PP message; each survivor's call fails naming it (kPeerFailed),
#       they heal and run every PP / Engram case bit for bit on 3 ranks.
#   joins, 2 machines, spare PEs (EPX_SHMEM_SPARES): a spare admitted after a heal (4 ranks
#       again), 2 -> 4 ranks without a loss (a third spare never admitted ends with the job),
#       a spare that dies while joining (admit null on every member within milliseconds: a
#       member of its machine sees it gone in the meeting and tells the others; they go on); every
#       case bit for bit on the grown group, each job ends by itself.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
bin="$build/tests/epx_multinode_rank"

skip() { echo "SKIP: multinode: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null && command -v unshare >/dev/null || skip "no ip/unshare (apt-get install iproute2 util-linux)"
command -v oshrun >/dev/null || skip "no oshrun (apt-get install openmpi-bin libopenmpi-dev)"
[ -x "$bin" ] || skip "$bin not built (the build has no OpenSHMEM transport)"

id=$$
ns1=epx-$id-1 ns2=epx-$id-2 br=epxb$id
work=$(mktemp -d /tmp/epx_multinode.XXXXXX)
shm_before=$(ls -A /dev/shm | sort)
failures=0

cleanup() {
  local ns p
  for ns in "$ns1" "$ns2"; do
    # Only processes inside this run's namespaces (all started by this script).
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  for ns in "$ns1" "$ns2"; do ip netns del "$ns" 2>/dev/null; done
  ip link del "$br" 2>/dev/null
  if [ -n "${EPX_MN_KEEP:-}" ]; then echo "multinode: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip link add "$br" type bridge 2>/dev/null && ip link set "$br" up || skip "cannot create a bridge (no CAP_NET_ADMIN?)"
for i in 1 2; do
  ns=epx-$id-$i
  ip netns add "$ns" || skip "cannot create network namespace $ns"
  ip link add "epxv${id}x$i" type veth peer name "epxt${id}x$i" &&
    ip link set "epxt${id}x$i" netns "$ns" &&
    ip -n "$ns" link set "epxt${id}x$i" name eth1 &&
    ip link set "epxv${id}x$i" master "$br" up &&
    ip -n "$ns" addr add "10.200.0.$i/24" dev eth1 &&
    ip -n "$ns" link set eth1 up && ip -n "$ns" link set lo up || skip "cannot set up the veth of $ns"
done
export EPX_MN_LOG=$work
printf '%s slots=2\n%s slots=2\n' "$ns1" "$ns2" >"$work/hosts2"
printf '%s slots=4\n%s slots=4\n' "$ns1" "$ns2" >"$work/hosts4"

common=(--allow-run-as-root --oversubscribe --mca spml ucx --mca osc ucx --mca pml ucx
        --mca opal_common_ucx_tls any --mca opal_common_ucx_devices any)
# Across namespaces with only the network's settings (epx sets the rest: osc ucx, the heap,
# UCX's TCP segments; src/transport/shmem/shmem_settings.cpp).
net=(--allow-run-as-root --oversubscribe --mca plm_rsh_agent "$here/agent.sh" --mca oob_tcp_if_include 10.200.0.0/24
     --mca btl self,tcp --mca btl_tcp_if_include 10.200.0.0/24 -x UCX_TLS=tcp,sysv,posix,self -x UCX_NET_DEVICES=eth1 -x EPX_MN_LOG)
# Across namespaces (the fault sections' settings, as measured there): TCP on eth1 only; the
# daemons notice a dead link within ~5 s.
across=("${common[@]}" --mca plm_rsh_agent "$here/agent.sh" --mca oob_tcp_if_include 10.200.0.0/24
        --mca btl self,tcp --mca btl_tcp_if_include 10.200.0.0/24
        --mca oob_tcp_keepalive_time 3 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 2
        -x UCX_TLS=tcp,sysv,posix,self -x UCX_NET_DEVICES=eth1 -x EPX_MN_LOG
        -x UCX_KEEPALIVE_INTERVAL=1s -x UCX_TCP_KEEPIDLE=1s -x UCX_TCP_KEEPINTVL=1s -x UCX_TCP_KEEPCNT=2
        ${EPX_MN_MCA:-})  # EPX_MN_MCA: more launcher options, for experiments

quiet_noise() { grep -v -e 'setpgid' -e 'rdma_create_event_channel' -e '^$' "$1" || true; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# left_behind NAME COMM: a second after a job on the two machines ended, fails NAME for each
# machine's /dev/shm entry it kept (the shm-* lists its ranks wrote) and for its ranks (process
# name COMM) still in the namespaces; returns 1 if any.
left_behind() {
  local name=$1 comm=$2 f p left="" bad=0
  for f in "$work"/shm-*; do
    [ -e "$f" ] && [ -s "$f" ] && { fail "$name: /dev/shm of $(basename "$f") kept: $(tr '\n' ' ' <"$f")"; bad=1; }
  done
  sleep 1
  for p in $( (ip netns pids "$ns1"; ip netns pids "$ns2") 2>/dev/null); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = "$comm" ] && left="$left $p"
  done
  [ -z "$left" ] || { fail "$name: epx ranks left in the namespaces:$left"; bad=1; }
  return $bad
}
# Every process still in the two machines (a failed job's ranks, Open MPI's daemons).
kill_in_machines() {
  local p
  for p in $( (ip netns pids "$ns1"; ip netns pids "$ns2") 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
}

# across_run NAME NP HOSTFILE TIMEOUT_S PROGRAM [args...]: one job over the two namespaces
# (launcher settings: the array named by $flags, default across).
across_run() {
  local name=$1 np=$2 hosts=$3 limit=$4; shift 4
  local -n launch_flags=${flags:-across}
  rm -f "$work"/shm-*
  timeout "$limit" ip netns exec "$ns1" oshrun "${launch_flags[@]}" --hostfile "$work/$hosts" -np "$np" "$@" \
    >"$work/$name.out" 2>"$work/$name.err"
}
# across NAME NP HOSTFILE TIMEOUT_S [rank args...]: the test rank program over the two namespaces.
across() { local name=$1 np=$2 hosts=$3 limit=$4; shift 4; across_run "$name" "$np" "$hosts" "$limit" "$bin" "$@"; }

# check_pass NAME RC WANT: rc 0, WANT PASS lines in NAME.out, nothing left in any machine's /dev/shm.
check_pass() {
  local name=$1 rc=$2 want=$3
  local got
  got=$(grep -c '^PASS ' "$work/$name.out" 2>/dev/null)
  if [ "$rc" -ne 0 ] || [ "${got:-0}" -lt "$want" ]; then
    fail "$name: exit $rc, $got of $want cases passed"; quiet_noise "$work/$name.err" | tail -20; return
  fi
  local f
  for f in "$work"/shm-*; do
    [ -e "$f" ] || continue
    if [ -s "$f" ]; then fail "$name: /dev/shm of $(basename "$f") kept: $(tr '\n' ' ' <"$f")"; return; fi
  done
  echo "PASS: $name ($got cases; $(grep -h ' paths:' "$work/$name.out" | head -1))"
}

all_cases=16
t0=$(date +%s)
only=${EPX_MN_ONLY:-.}  # a regex over the section names below, for debugging one of them
want() { [[ $1 =~ $only ]]; }

# 1. One machine, no namespace, no Open MPI flags at all (epx sets osc ucx and the heap):
# every peer mapped (copies, pull mode).
if want one; then
timeout 120 oshrun --allow-run-as-root --oversubscribe -np 4 "$bin" --timeout-ms 20000 >"$work/one-machine.out" 2>"$work/one-machine.err"
check_pass one-machine $? $all_cases
grep -q '0=mapped 1=mapped 2=mapped 3=mapped' "$work/one-machine.out" || fail "one-machine: peers not mapped"
grep '^RUNTIME ' "$work/one-machine.out" | grep -q 'epx default: .*; set: SMA_SYMMETRIC_SIZE=[0-9]*M OMPI_MCA_osc=ucx' ||
  fail "one-machine: epx did not set the heap and osc: $(grep '^RUNTIME' "$work/one-machine.out")"
fi

# 2. Two machines x 2 ranks, only the network's launcher settings: every case.
if want x2; then
flags=net across two-machines-x2 4 hosts2 150 --timeout-ms 20000
check_pass two-machines-x2 $? $all_cases
grep -q 'rank 0 node 0 paths: 0=mapped 1=mapped 2=shmem 3=shmem' "$work/two-machines-x2.out" ||
  fail "two-machines-x2: unexpected paths: $(grep -h paths: "$work/two-machines-x2.out" | head -1)"
fi

# 3. Bytes across the veth against epx's count; the hierarchical schedule's cross-machine puts
# in both combine orders (node first: no more bytes across than flat).
if want bytes; then
flags=net across bytes 4 hosts2 90 --timeout-ms 20000 --bytes --hierarchical-count
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "bytes/hierarchical: exit $rc"; quiet_noise "$work/bytes.err" | tail -10
else
  while read -r _ _ node _ tx _ epx; do
    # UCX over TCP frames every put as an active message (+ TCP/IP/Ethernet headers).
    if [ "$tx" -lt "$epx" ] || [ "$tx" -gt $((epx + epx / 4 + 262144)) ]; then
      fail "bytes: node $node sent $tx bytes on its veth, epx counted $epx to the other machine"
    else
      echo "PASS: bytes node $node: veth tx $tx B, epx payload to the other machine $epx B (+$(( (tx - epx) * 1000 / epx / 10 ))% framing and setup)"
    fi
  done < <(grep '^BYTES ' "$work/bytes.out")
  [ "$(grep -c '^BYTES ' "$work/bytes.out")" = 2 ] || fail "bytes: expected one BYTES line per machine"
  [ "$(grep -c '^HIER ' "$work/bytes.out")" = 8 ] && echo "PASS: hierarchical: cross-machine puts only to same-lane ranks ($(grep -h '^HIER rank 0 compact' "$work/bytes.out"))" ||
    fail "hierarchical: $(grep -c '^HIER ' "$work/bytes.out") of 8 HIER lines"
fi
fi

# 4. Two machines x 4 ranks: a subset (CI budget).
if want x4; then
across two-machines-x4 8 hosts4 150 --timeout-ms 30000 --cases compact,expanded_a4,fp8_expanded_worst,tail_q2_compact
check_pass two-machines-x4 $? 4
fi

# 5. epx replay --transport shmem (ranks from oshrun) against the numpy reference, bit for bit
# (tests/e2e/check_replay.py --launch: its cases, run under this launcher line): one "machine"
# (a namespace with its private /dev/shm: every peer mapped) and 2 machines x 2 ranks.
replay_check() {
  local name=$1 hosts=$2 limit=$3 names=$4
  local launch
  launch="ip netns exec $ns1 oshrun $(printf '%q ' "${across[@]}") --hostfile $work/$hosts -np {np}"
  rm -f "$work"/shm-*
  timeout "$limit" /usr/bin/python3 "$repo/tests/e2e/check_replay.py" --epx "$build/src/tools/epx" --timeout 60 \
    --launch "$launch" --names "$names" >"$work/$name.out" 2>&1
  local rc=$? f
  for f in "$work"/shm-*; do
    [ -e "$f" ] && [ -s "$f" ] && { fail "$name: /dev/shm of $(basename "$f") kept: $(tr '\n' ' ' <"$f")"; rc=1; }
  done
  if [ "$rc" -ne 0 ]; then fail "$name: exit $rc"; grep -v '^PASS' "$work/$name.out" | tail -20
  else echo "PASS: $name ($(grep -c '^PASS' "$work/$name.out") cases, $(tail -2 "$work/$name.out" | head -1))"; fi
}
printf '%s slots=4\n' "$ns1" >"$work/hosts1"
if want replay-one; then
  replay_check replay-one-machine hosts1 150 \
    order_p4_L12_expanded_a4,order_p3_L9_compact,p4_zipf_expanded_det_threads,worst_expanded_a128_exact,weighted_expanded_det,fp8_expanded_a4_worst_zp,zeropad_expanded_a4_worst,p8_flag_4q_bytes,err_idx_out_of_range_rank3,err_x_rows_rank2
fi
if want replay-np; then  # P from the launcher must be meta.json's num_ranks: refused on every rank, no OUT
  /usr/bin/python3 "$repo/tests/e2e/gen_case.py" --out "$work/np-case" --ranks 4 --experts 8 --hidden 128 --topk 2 \
    --tokens 6 --seed 1 >/dev/null
  across_run replay-np-mismatch 2 hosts1 60 "$build/src/tools/epx" replay --transport shmem --in "$work/np-case" \
    --out "$work/np-out"
  rc=$?
  n=$(grep -c 'num_ranks is 4 but the launcher started 2 ranks' "$work/replay-np-mismatch.err")
  if [ "$rc" -ne 0 ] && [ "$n" = 2 ] && [ ! -e "$work/np-out/rank0" ]; then echo "PASS: replay-np-mismatch (exit $rc, both ranks said why)"
  else fail "replay-np-mismatch: exit $rc, $n of 2 ranks named the mismatch"; quiet_noise "$work/replay-np-mismatch.err" | tail -5; fi
fi
if want replay-x2; then
  replay_check replay-two-machines-x2 hosts2 200 \
    order_p4_L12_expanded_a4,p4_zipf_compact,order_p4_L12_weighted_det,worst_compact,large_fp8_p4_H2048_compact,fp8_expanded_a4_det,p4_hierarchical_job_nodes,err_idx_out_of_range_rank3,err_weights_shape_rank2
fi

# 6. epx bench --transport shmem --baseline mpi --routing CASE at 2 x 2: the MPI_Alltoallv
# baseline in the same job (the same ranks, layout and routing); the report's lines exist, the baseline
# produced the same rows, and the ratios are positive numbers (no speed threshold).
if want baseline; then
  /usr/bin/python3 "$repo/tests/e2e/gen_case.py" --out "$work/bench-case" --ranks 4 --experts 16 --hidden 1024 --topk 4 \
    --tokens 128 --seed 3 >/dev/null || fail "bench-baseline-x2: gen_case.py failed"
  # Only the network's launcher settings, no schedule: across nodes the bench runs the
  # hierarchical schedule with the node-first combine, and the baseline adds in that order.
  flags=net across_run bench-baseline-x2 4 hosts2 120 "$build/src/tools/epx" bench --transport shmem --baseline mpi \
    --routing "$work/bench-case" --iters 5 --warmup 1 --timeout-ms 20000
  rc=$?
  out=$work/bench-baseline-x2.out ok=1
  [ "$rc" -eq 0 ] || { fail "bench-baseline-x2: exit $rc"; quiet_noise "$work/bench-baseline-x2.err" | tail -10; ok=0; }
  grep -q '^transport shmem (ranks from the launcher): 2 nodes; ' "$out" || { fail "bench-baseline-x2: no node layout line"; ok=0; }
  grep -q '^shmem runtime: .*epx set SMA_SYMMETRIC_SIZE=.*OMPI_MCA_osc=ucx' "$out" ||
    { fail "bench-baseline-x2: no shmem runtime line with epx's settings: $(grep '^shmem runtime' "$out")"; ok=0; }
  grep -q 'schedule hierarchical, .*combine order node-first' "$out" ||
    { fail "bench-baseline-x2: not hierarchical + node-first by default: $(grep -m1 'data plane' "$out")"; ok=0; }
  grep -q '^MPI BASELINE' "$out" || { fail "bench-baseline-x2: no MPI BASELINE section"; ok=0; }
  grep -q '^  verified: same dispatch rows and combine output on all 4 ranks' "$out" ||
    { fail "bench-baseline-x2: baseline not verified: $(grep -E 'verified|MISMATCH|unavailable' "$out")"; ok=0; }
  # positive RATIO: a number > 0 (the report prints 2 decimals)
  positive() { [ -n "$1" ] && awk -v r="$1" 'BEGIN { exit !(r + 0 > 0) }'; }
  for op in dispatch combine 'round trip'; do
    r=$(grep -m1 "^  $op  " "$out" | grep -Eo '[0-9]+\.[0-9]+x \((epx|mpi) faster\)' | grep -Eo '^[0-9.]+')
    positive "$r" || { fail "bench-baseline-x2: no positive '$op' ratio: $(grep -m1 "^  $op  " "$out")"; ok=0; }
  done
  for op in dispatch combine; do
    r=$(grep -m1 "^  $op .* GB/s" "$out" | grep -Eo "[0-9]+\.[0-9]+x the MPI baseline's speed" | grep -Eo '^[0-9.]+')
    positive "$r" || { fail "bench-baseline-x2: SUMMARY $op lacks a positive baseline ratio"; ok=0; }
  done
  [ "$ok" = 1 ] && echo "PASS: bench-baseline-x2 ($(grep -m1 '^  round trip' "$out" | sed 's/  */ /g'))"
fi

# 6b. BucketBuffer (all_gather / reduce_scatter / all_reduce, tests/multinode/bucket_rank.cpp):
# the multirank cases (every group, 1-8 tensors, scales, guards) bit for bit, in one namespace
# (4 ranks, every peer mapped) and at 2 x 2 with the job's node layout as the topology: the
# world group's all_reduce must run two-level, reduce_scatter pipelined (puts only).
bucket_bin="$build/tests/epx_multinode_bucket"
if want bucket && [ -x "$bucket_bin" ]; then
  across_run bucket-one-machine 4 hosts1 150 "$bucket_bin" --timeout-ms 20000
  check_pass bucket-one-machine $? 1
  across_run bucket-two-machines-x2 4 hosts2 200 "$bucket_bin" --timeout-ms 20000 --chunk-bytes 8192
  check_pass bucket-two-machines-x2 $? 1
  grep -q '^ALGORITHMS all_reduce world: .*two-level' "$work/bucket-two-machines-x2.out" ||
    fail "bucket-two-machines-x2: the world all_reduce did not run two-level: $(grep -h '^ALGORITHMS' "$work/bucket-two-machines-x2.out" | tr '\n' ';')"
  grep -q '^ALGORITHMS reduce_scatter world: .*pipelined' "$work/bucket-two-machines-x2.out" ||
    fail "bucket-two-machines-x2: the world reduce_scatter did not run pipelined"
fi

# 6c. epx bench --transport shmem --op all_reduce --bytes 16M --baseline mpi at 2 x 2 (the
# cross-machine target: reported against Open MPI's MPI_Allreduce in the same job).
# EPX_MN_BUCKET_BENCH: more epx bench options (--chunk-bytes, --algorithm), for experiments.
if want bucket-bench; then
  across_run bucket-bench-x2 4 hosts2 200 "$build/src/tools/epx" bench --transport shmem --op all_reduce --bytes 16M \
    --iters 5 --warmup 1 --baseline mpi --timeout-ms 60000 --json "$work/bucket-bench-x2.json" ${EPX_MN_BUCKET_BENCH:-}
  rc=$?
  out=$work/bucket-bench-x2.out
  if [ "$rc" -ne 0 ]; then fail "bucket-bench-x2: exit $rc"; quiet_noise "$work/bucket-bench-x2.err" | tail -10
  elif ! grep -q 'algorithm two-level' "$out"; then fail "bucket-bench-x2: not two-level: $(head -1 "$out")"
  elif ! grep -q 'results match' "$out"; then fail "bucket-bench-x2: baseline not checked: $(grep baseline "$out")"
  else echo "PASS: bucket-bench-x2 ($(grep -m1 'baseline mpi' "$out" | sed 's/  */ /g'))"; fi
fi

# 6d. PPBuffer / EngramBuffer across machines (2 x 2): tests/multinode/pp_engram_rank.cpp's
# cases bit for bit (random send/recv programs over every pair and the ring, Engram bf16 and
# FP8 fetches, both next to an EP buffer), then epx bench --op pp / engram --transport shmem
# --peers mpi: epx and MPI on the same ranks of one job (the ring crosses the machines: 1 -> 2,
# 3 -> 0), checked to deliver the same bytes; the figures go to the log (no speed threshold).
if want pp-engram; then
  across_run pp-engram-x2 4 hosts2 150 "$build/tests/epx_multinode_pp_engram_rank" --timeout-ms 20000
  check_pass pp-engram-x2 $? 5
  grep -h '^engram path:' "$work/pp-engram-x2.out" | head -1
  # Rows of the other machine arrive by one-sided gets (shmem_getmem_nbi), not served.
  grep -q '^engram path: get' "$work/pp-engram-x2.out" || fail "pp-engram-x2: engram rows across machines not read by gets"
  for op in pp engram; do
    if [ "$op" = pp ]; then args=(--pp-pattern ring --pp-sizes 16384,1048576 --pp-inflight 1,2); else
      args=(--engram-rows 16384 --tokens 128); fi
    across_run "bench-$op-x2" 4 hosts2 180 "$build/src/tools/epx" bench --op "$op" --transport shmem --peers mpi \
      --iters 5 --warmup 1 --timeout-ms 30000 "${args[@]}"
    rc=$? out=$work/bench-$op-x2.out
    if [ "$rc" -ne 0 ] || ! grep -q '^  mpi: checked' "$out" || ! grep -q '^check: epx \(delivered\|fetched\)' "$out"; then
      fail "bench-$op-x2: exit $rc, $(grep -E '^check|^  mpi' "$out" | tr '\n' ' ')"; quiet_noise "$work/bench-$op-x2.err" | tail -10
    else
      echo "PASS: bench-$op-x2 (epx and MPI deliver the same bytes):"; grep -v -e '^  *'"'" -e '^wall' "$out" | sed 's/^/    /'
    fi
  done
fi

# 7. Faults (2 x 2). What Open MPI 4.1 does, as measured here (docs/transport.md, "Faults
# across machines"): a rank or daemon that dies is seen by the runtime itself, which ends
# every other rank within ~1-5 s (rc 137 / 205), before or as epx's timeout ends their
# waits: each daemon sends its ranks SIGTERM, then SIGKILL after odls_base_sigkill_timeout
# (1 s). The shmem transport's SIGTERM handler (liboshmem's own ignores SIGTERM) makes each
# such rank say where it was: "epx: rank R (node N) ended by the launcher (SIGTERM) in
# phase '...' while waiting for rank P (...)" (or in which shmem_quiet / shmem_fence, to
# which peers). The test asserts: the job exits non-zero within seconds, mpirun names the
# dead rank or daemon, every survivor printed that line or its own epx timeout (each names
# a phase and a peer), at least one of them names the dead rank / a rank of the lost
# machine (a survivor may be waiting for a same-machine survivor that itself waits for the
# lost machine), no rank is left and no /dev/shm (the host's or a machine's) keeps a
# segment. Letting the survivors run on to their own epx error (mpirun --mca
# orte_enable_recovery 1, or --mca orte_abort_on_non_zero_status 0, or both) works for the
# ranks, but then mpirun and its daemons never end (EPX_MN_MCA="--mca
# orte_enable_recovery 1" EPX_MN_ONLY=fault-rank shows it). A cut link is seen by nobody
# but epx: its waits time out, and a put that shmem_quiet / shmem_fence can never complete
# is caught by the transport's watchdog; each survivor the launcher can still hear names
# peer + phase and exits 1; mpirun then hangs in its abort (it cannot reach the cut
# machine's daemon) until `timeout` ends it.
fault_ms=2000
# fault_check NAME RC SECONDS_AFTER_FAULT ALLOW_124 MAX_SECONDS LAUNCHER_SAYS HOW NAMED SURVIVORS...:
# a non-zero exit within MAX_SECONDS of the fault, the launcher's stderr matching
# LAUNCHER_SAYS (an ERE naming the dead rank or daemon; "" = not checked), each listed
# survivor said "timed out after 2000 ms in phase '...' waiting for rank N" or, with HOW =
# term, that or "ended by the launcher (SIGTERM) in phase '...' ... rank N (node M...)";
# one of those lines names NAMED (an ERE, "" = not checked); no epx rank is left in either
# namespace (so neither private /dev/shm survives) and the machines' /dev/shm listings
# taken when their daemons ended are empty.
fault_check() {
  local name=$1 rc=$2 took=$3 allow124=$4 max=$5 says=$6 how=$7 named=$8; shift 8
  local ok=1 r f
  [ "$rc" -ne 0 ] || { fail "$name: the job exited 0"; ok=0; }
  [ "$rc" -ne 124 ] || [ "$allow124" = 1 ] || { fail "$name: the job did not end (timeout)"; ok=0; }
  [ "$took" -le "$max" ] || { fail "$name: the job ended ${took}s after the fault (more than ${max}s)"; ok=0; }
  [ -z "$says" ] || grep -Eq "$says" "$work/$name.err" || { fail "$name: the launcher did not say /$says/"; ok=0; }
  local said_by=$work/$name.said
  : >"$said_by"
  for r in "$@"; do
    local timed="rank $r: timed out after $fault_ms ms in phase '[^']*' waiting for rank [0-9]"
    local termed="^epx: rank $r \(node [0-9]+\) ended by the launcher \(SIGTERM\) in phase '[^']+'.* rank [0-9]+ \(node [0-9]+, (this node|another machine)\)"
    if grep -q "$timed" "$work/$name.err"; then grep -m1 "$timed" "$work/$name.err" >>"$said_by"
    elif [ "$how" = term ] && grep -Eq "$termed" "$work/$name.err"; then grep -E -m1 "$termed" "$work/$name.err" >>"$said_by"
    else fail "$name: rank $r did not name peer and phase"; ok=0; fi
  done
  [ -z "$named" ] || grep -Eq "$named" "$said_by" || { fail "$name: no survivor named /$named/"; ok=0; }
  left_behind "$name" epx_multinode_r || ok=0
  if [ "$ok" = 1 ]; then
    local said
    said=$(grep -m1 -E "${named:-.}" "$said_by" | sed 's/^epx: //; s/^epx_multinode_rank: //')
    [ -n "$says" ] && said="${said:+$said; }the launcher: $(grep -Eo "$says" "$work/$name.err" | head -1)"
    echo "PASS: $name (exit $rc, ${took}s after the fault; $# survivors named peer + phase, e.g. ${said})"
  else
    sed 's/^/    said: /' "$said_by"
    quiet_noise "$work/$name.err" | grep -v 'Internal error\|flush.c' | tail -8
  fi
  # Open MPI's own daemons/agents left behind (the cut machine's orted): this run's only.
  kill_in_machines
}

# SIGKILL of rank 3 (machine 2) between a dispatch and its combine; ranks 0-2 survive it.
if want fault-rank; then
  s=$(date +%s)
  across fault-sigkill-remote-rank 4 hosts2 60 --timeout-ms $fault_ms --fault kill-rank:3
  rc=$?
  fault_check fault-sigkill-remote-rank $rc $(( $(date +%s) - s )) 0 10 \
    "process rank 3 with PID [0-9]+ on node $ns2 exited on signal 9" term "rank 3 \(node 1," 0 1 2
fi

# fault_async NAME LIMIT ALLOW_124 MAX_SECONDS LAUNCHER_SAYS ACTION HOW NAMED SURVIVORS...: start the
# loop, wait for its marker, then ACTION; fault_check the rest.
fault_async() {
  local name=$1 limit=$2 allow124=$3 max=$4 says=$5 action=$6; shift 6
  rm -f "$work/marker"
  across "$name" 4 hosts2 "$limit" --timeout-ms $fault_ms --fault "loop:$work/marker" &
  local job=$!
  for _ in $(seq 300); do [ -e "$work/marker" ] && break; kill -0 $job 2>/dev/null || break; sleep 0.1; done
  local s
  s=$(date +%s)
  eval "$action"
  wait $job
  local rc=$?
  fault_check "$name" $rc $(( $(date +%s) - s )) "$allow124" "$max" "$says" "$@"
}
# signal_in_ns2 SIG COMM: SIG to this run's processes in ns2 named COMM.
signal_in_ns2() {
  local p
  for p in $(ip netns pids "$ns2"); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = "$2" ] && kill "-$1" "$p"
  done
}
# The daemon of machine 2 (the orted among this run's processes in ns2) dies while machine 2
# is stalled: its ranks are stopped first, so the survivors are surely waiting on machine 2
# when the launcher's SIGTERM comes (killing the daemon alone let ranks 2 and 3 run on for a
# moment, and a survivor the SIGTERM found between waits named only itself: failed CI once);
# they stay stopped until the survivors have been ended or timed out, then resume and end on
# their own as before (nobody reports for them).
kill_orted() {
  signal_in_ns2 STOP epx_multinode_r
  sleep 0.5
  signal_in_ns2 KILL orted
  sleep 1.5
  signal_in_ns2 CONT epx_multinode_r
}
# Ranks 2 and 3 lose their daemon with it (nobody reports for them); ranks 0 and 1 survive.
want fault-daemon && fault_async fault-sigkill-remote-daemon 60 0 10 "Remote daemon: \[\[[0-9]+,0\],2\] on node $ns2" kill_orted \
  term "rank [23] \(node 1," 0 1
if want fault-link; then
  fault_async fault-link-cut 25 1 25 "" "ip -n $ns2 link set eth1 down" timeout "" 0 1
  ip -n "$ns2" link set eth1 up
fi

# 8. Healing across machines (2 x 2; src/transport/shmem/shmem_elastic.cpp): with Open MPI
# told to let the survivors live (--mca orte_abort_on_non_zero_status 0; the ranks see it
# as OMPI_MCA_orte_abort_on_non_zero_status) a rank SIGKILLs itself between a dispatch and
# its combine (epx_multinode_rank --fault heal:R). Each survivor's call fails naming a peer
# and phase (a peer loss: the dead rank, or one it waited for), they agree on who is left (R), rebuild the group over the
# shmem transport (ranks renumbered densely, the same symmetric heap: the old group's blocks
# and the reserve EPX_SHMEM_ELASTIC_RESERVE) and go on bit for bit on 3 ranks across both
# machines: a replica plan's routing masked to the live replicas (dropped counts summed by
# sum_over_group) and the cases. Each survivor's call fails within milliseconds of the
# death (a PE of the dead one's machine sees its process gone and tells every member; else
# after the timeout), the agreement takes milliseconds for the same reason. At exit the
# survivors meet and rank 0 ends the job
# (shmem_global_exit): the job ends by itself (mpirun exits non-zero: a rank was killed),
# no epx rank is left in either namespace, neither machine's /dev/shm keeps an entry. The
# timeout (6 s) stays above UCX's keepalive (1 s: a shmem_quiet with puts to the dead PE
# returns once UCX declares its endpoint dead; under the watchdog a 3 s timeout was seen
# to end survivors at load ~25).
heal_ms=6000
heal_flags=("${across[@]}" --mca orte_abort_on_non_zero_status 0 -x EPX_SHMEM_ELASTIC_RESERVE=4M)
# heal_case NAME VICTIM WANT_PASS LIMIT [rank args...]
heal_case() {
  local name=$1 victim=$2 want_pass=$3 limit=$4; shift 4
  local s rc took ok=1 r
  s=$(date +%s)
  flags=heal_flags across "$name" 4 hosts2 "$limit" --timeout-ms $heal_ms --fault "heal:$victim" "$@"
  rc=$? took=$(( $(date +%s) - s ))
  local out=$work/$name.out
  [ "$rc" -ne 124 ] || { fail "$name: the job did not end by itself (timeout after ${limit}s)"; ok=0; }
  for r in 0 1 2 3; do
    [ "$r" = "$victim" ] && continue
    grep -Eq "^LOSS rank $r: rank $r: (timed out after $heal_ms ms in phase '[^']*' waiting for rank [0-9]|rank [0-9] \(node [01], (this node|another machine)\) died \(its process is gone, seen on its machine\) while this rank waited in phase '[^']*')" "$out" ||
      { fail "$name: rank $r did not name a peer and phase"; ok=0; }
    grep -q "^HEAL rank $r (node [01]) -> rank $(( r < victim ? r : r - 1 )) of 3: lost rank $victim;" "$out" ||
      { fail "$name: rank $r did not heal into rank $(( r < victim ? r : r - 1 )) of 3"; ok=0; }
    grep -q "^DONE rank $r\$" "$out" || { fail "$name: rank $r did not finish"; ok=0; }
  done
  grep -Eq "^LOSS rank [0-9]: .*(waiting for rank $victim \(|: rank $victim \(node [01], [a-z ]*\) died)" "$out" ||
    { fail "$name: no survivor named rank $victim"; ok=0; }
  local got
  got=$(grep -c '^PASS heal:' "$out")
  [ "$got" = "$want_pass" ] || { fail "$name: $got of $want_pass cases passed on the survivors"; ok=0; }
  left_behind "$name" epx_multinode_r || ok=0
  if [ "$ok" = 1 ]; then
    echo "PASS: $name (exit $rc after ${took}s; $got cases on the 3 survivors; $(grep -m1 "^HEAL rank 0 " "$out" | sed 's/^HEAL //'))"
  else
    quiet_noise "$work/$name.err" | grep -v 'Internal error\|flush.c' | tail -8
  fi
  kill_in_machines
}
if want fault-heal; then
  heal_case heal-remote-rank 3 17 240            # the other machine's rank: every case after the heal
  heal_case heal-local-rank 1 4 180 --cases compact,flag_q2_expanded,ring4_compact  # a rank of rank 0's machine
  # A survivor that ends on an error of its own (no peer loss seen) after a PE of its machine
  # died: its teardown skips the collective free (it saw the PE's process gone) instead of
  # waiting there for the dead PE, and the job ends by itself (one machine: every PE sees it).
  s=$(date +%s)
  timeout 60 oshrun --allow-run-as-root --oversubscribe --mca orte_abort_on_non_zero_status 0 -np 3 \
    "$bin" --timeout-ms 20000 --fault own-error:2 >"$work/own-error.out" 2>"$work/own-error.err"
  rc=$? took=$(( $(date +%s) - s ))
  if [ "$rc" != 124 ] && [ "$(grep -Ec "^epx_multinode_rank: rank [01]: an error of this rank's own, after rank 2 died$" "$work/own-error.err")" = 2 ]; then
    echo "PASS: own-error-after-loss (both survivors ended on their error, the job in ${took}s, exit $rc)"
  else
    fail "own-error-after-loss: exit $rc after ${took}s (124: a survivor hung in its teardown)"; quiet_noise "$work/own-error.err" | tail -8
  fi
fi

# 9. Joins from spare PEs (src/transport/shmem/shmem_join.cpp): oshrun starts the members
# and S spare PEs (EPX_SHMEM_SPARES=S: the last S), which wait inside connect until the
# members admit them (epx::admit; the spares' connect then returns the grown group, and
# epx::joined_admission() says how). epx_multinode_rank --join: (a) heal:3, 2 x 2 members +
# 1 spare on the other machine: rank 3 SIGKILLs itself, the 3 survivors heal, then admit
# the spare: 4 ranks again, every case bit for bit; (b) grow:2, 2 members on machine 1 and 3
# spares on machine 2: 2 -> 4 without a loss, the third spare never runs the program and
# ends with the job (exit 0); (c) abandon, 2 x 2 members + 1 spare that
# SIGKILLs itself when invited (EPX_FAULT_INJECT): admit returns null on every member after
# the timeout, and they go on as they were. Each job ends by itself (a spare never admitted
# ends too), nothing left behind; a job without a death exits 0.
join_flags=("${heal_flags[@]}")
printf '%s slots=2\n%s slots=3\n' "$ns1" "$ns2" >"$work/hosts23"
# join_case NAME NP HOSTS SPARES LIMIT WANT_RC WANT_PASS "REGEX..." -- [rank args...]: the job
# exits WANT_RC (any non-zero: x), WANT_PASS "PASS join:" lines, each REGEX a line of the output.
join_case() {
  local name=$1 np=$2 hosts=$3 spares=$4 limit=$5 want_rc=$6 want_pass=$7; shift 7
  local regexes=() s rc took ok=1 got x
  while [ "$1" != -- ]; do regexes+=("$1"); shift; done
  shift
  s=$(date +%s)
  flags=join_flags across_run "$name" "$np" "$hosts" "$limit" -x EPX_SHMEM_SPARES="$spares" "$bin" --timeout-ms $heal_ms "$@"
  rc=$? took=$(( $(date +%s) - s ))
  local out=$work/$name.out
  [ "$rc" -ne 124 ] || { fail "$name: the job did not end by itself (timeout after ${limit}s)"; ok=0; }
  if [ "$want_rc" = x ]; then [ "$rc" -ne 0 ] || { fail "$name: exit 0, want non-zero (a PE died)"; ok=0; }
  else [ "$rc" = "$want_rc" ] || { fail "$name: exit $rc, want $want_rc"; ok=0; }; fi
  for x in "${regexes[@]}"; do grep -Eq "$x" "$out" || { fail "$name: no line /$x/"; ok=0; }; done
  got=$(grep -c '^PASS join:' "$out")
  [ "$got" = "$want_pass" ] || { fail "$name: $got of $want_pass cases passed"; ok=0; }
  left_behind "$name" epx_multinode_r || ok=0
  if [ "$ok" = 1 ]; then
    echo "PASS: $name (exit $rc after ${took}s; $got cases on the grown group; $(grep -m1 '^ADMIT rank 0 ' "$out" | sed 's/^ADMIT //'))"
  else
    quiet_noise "$work/$name.err" | grep -v 'Internal error\|flush.c' | tail -8
  fi
  kill_in_machines
}
if want fault-join; then
  join_cases=compact,fp8_expanded_worst,flag_q2_expanded,ring4_compact
  join_case join-after-heal 5 hosts23 1 180 x 4 \
    '^HEAL rank 0 \(node 0\) -> rank 0 of 3: lost rank 3;' '^HEAL rank 2 \(node 1\) -> rank 2 of 3: lost rank 3;' \
    '^ADMIT rank 0 -> rank 0 of 4: 1 joined in [0-9]+ ms$' '^ADMIT rank 2 -> rank 2 of 4: 1 joined' \
    '^JOINED rank 3 of 4 \(round 1, 1 joined to 3, tag 7\)$' '^DONE rank 0$' '^DONE rank 1$' '^DONE rank 2$' '^DONE rank 3$' \
    -- --join heal:3 --cases "$join_cases"
  join_case join-grow 5 hosts23 3 180 0 4 \
    '^PASS before:compact \(P=2\)$' '^ADMIT rank 0 -> rank 0 of 4: 2 joined in [0-9]+ ms$' '^ADMIT rank 1 -> rank 1 of 4: 2 joined' \
    '^JOINED rank 2 of 4 \(round 1, 2 joined to 2, tag 7\)$' '^JOINED rank 3 of 4 \(round 1, 2 joined to 2, tag 7\)$' \
    '^DONE rank 0$' '^DONE rank 1$' '^DONE rank 2$' '^DONE rank 3$' \
    -- --join grow:2 --cases "$join_cases"
  [ "$(grep -c '^JOINED' "$work/join-grow.out")" = 2 ] || fail "join-grow: not 2 spares ran the program"
  join_flags=("${heal_flags[@]}" -x "EPX_FAULT_INJECT=4:elastic admit:KILL")
  join_case join-spare-dies 5 hosts23 1 180 x 4 \
    '^ADMIT rank 0 -> abandoned, still rank 0 of 4, in [0-9]+ ms$' '^ADMIT rank 3 -> abandoned, still rank 3 of 4' \
    '^DONE rank 0$' '^DONE rank 1$' '^DONE rank 2$' '^DONE rank 3$' \
    -- --join abandon --cases "$join_cases"
  grep -q '^JOINED' "$work/join-spare-dies.out" && fail "join-spare-dies: the killed spare ran the program"
  # Its death is seen, not waited out: every member's admit ends before the timeout.
  for r in 0 1 2 3; do
    ms=$(sed -n "s/^ADMIT rank $r -> abandoned, still rank $r of 4, in \([0-9]*\) ms\$/\1/p" "$work/join-spare-dies.out")
    [ -n "$ms" ] && [ "$ms" -lt "$heal_ms" ] ||
      fail "join-spare-dies: rank $r's admit took ${ms:-?} ms, not less than the timeout ($heal_ms ms)"
  done
  join_flags=("${heal_flags[@]}")
  # One machine (every peer mapped): 2 -> 4; and spares without a reserve, refused on every PE.
  timeout 120 oshrun --allow-run-as-root --oversubscribe -np 4 -x EPX_SHMEM_SPARES=2 -x EPX_SHMEM_ELASTIC_RESERVE=4M \
    "$bin" --timeout-ms 20000 --join grow:2 --cases compact,ring4_compact >"$work/join-one.out" 2>"$work/join-one.err"
  rc=$?
  if [ "$rc" = 0 ] && [ "$(grep -c '^PASS join:' "$work/join-one.out")" = 2 ] &&
     grep -q '^JOINED rank 3 of 4 (round 1, 2 joined to 2, tag 7)$' "$work/join-one.out"; then
    echo "PASS: join-one-machine ($(grep -m1 '^ADMIT rank 0 ' "$work/join-one.out" | sed 's/^ADMIT //'))"
  else
    fail "join-one-machine: exit $rc, $(grep -c '^PASS join:' "$work/join-one.out") of 2 cases"; quiet_noise "$work/join-one.err" | tail -8
  fi
  timeout 60 oshrun --allow-run-as-root --oversubscribe -np 2 -x EPX_SHMEM_SPARES=1 "$bin" >"$work/join-bad.out" 2>"$work/join-bad.err"
  rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 124 ] &&
     [ "$(grep -c 'rank [01]: shmem: EPX_SHMEM_SPARES needs EPX_SHMEM_ELASTIC_RESERVE=SIZE on every rank' "$work/join-bad.err")" = 2 ]; then
    echo "PASS: join-no-reserve (refused on both PEs, exit $rc)"
  else
    fail "join-no-reserve: exit $rc"; quiet_noise "$work/join-bad.err" | tail -8
  fi
fi

# 10. Engram and PP across a loss (2 x 2, heal_flags; tests/multinode/pp_engram_rank.cpp
# --fault engram:R | pp:R): rank R SIGKILLs itself while the others fetch Engram rows from it
# (gets across machines, copies from the mapped heap on its own machine) or wait for its PP
# message in a ring (the recv fails once a PE of the dead one's machine announced it). Each
# survivor fails in that round with a peer loss naming R (kPeerFailed: "died ..."; not a
# timeout, not the watchdog), they agree, rebuild and run every PP / Engram case bit for bit
# on 3 ranks; the job ends by itself, nothing left behind.
# pe_heal_case NAME FAULT VICTIM LIMIT
pe_heal_case() {
  local name=$1 fault=$2 victim=$3 limit=$4
  local s rc took ok=1 r got out=$work/$1.out
  s=$(date +%s)
  flags=heal_flags across_run "$name" 4 hosts2 "$limit" "$build/tests/epx_multinode_pp_engram_rank" --timeout-ms $heal_ms --fault "$fault:$victim"
  rc=$? took=$(( $(date +%s) - s ))
  [ "$rc" -ne 124 ] || { fail "$name: the job did not end by itself (timeout after ${limit}s)"; ok=0; }
  for r in 0 1 2 3; do
    [ "$r" = "$victim" ] && continue
    grep -Eq "^LOSS rank $r: round 3: rank $r: rank $victim \(node [01], (this node|another machine)\) died \(its process is gone, seen on its machine\) while this rank waited in phase '[^']*'" "$out" ||
      { fail "$name: rank $r did not fail in round 3 naming rank $victim as dead"; ok=0; }
    grep -q "^HEAL rank $r -> rank $(( r < victim ? r : r - 1 )) of 3: lost rank $victim\$" "$out" ||
      { fail "$name: rank $r did not heal into rank $(( r < victim ? r : r - 1 )) of 3"; ok=0; }
    grep -q "^DONE rank $r\$" "$out" || { fail "$name: rank $r did not finish"; ok=0; }
  done
  # Engram: the other machine's survivors fail in the fetch's gets (refused before they are
  # issued, or their quiet's probe stops at the announced death), not in a later barrier.
  # PP: the rank after the victim in the ring fails in its recv of the victim's message.
  [ "$fault" = pp ] && ! grep -Eq "^LOSS rank $(( (victim + 1) % 4 )): .* phase 'pp recv \(waiting for a message\)'" "$out" &&
    { fail "$name: rank $(( (victim + 1) % 4 )) did not fail in its recv from rank $victim"; ok=0; }
  if [ "$fault" = engram ]; then
    for r in 0 1; do
      grep -Eq "^LOSS rank $r: .* phase '(get \(a row from a peer\)|shmem_quiet \(gets outstanding\))'" "$out" ||
        { fail "$name: rank $r did not fail in the fetch's gets"; ok=0; }
    done
  fi
  grep -q 'blocks in the OpenSHMEM runtime' "$work/$name.err" && { fail "$name: the watchdog ended a survivor"; ok=0; }
  got=$(grep -c '^PASS heal:' "$out")
  [ "$got" = 5 ] || { fail "$name: $got of 5 cases passed on the survivors"; ok=0; }
  left_behind "$name" epx_multinode_p || ok=0
  if [ "$ok" = 1 ]; then
    echo "PASS: $name (exit $rc after ${took}s; $got cases on the 3 survivors; $(grep -m1 "^LOSS rank 0:" "$out" | sed 's/^LOSS //'))"
  else
    quiet_noise "$work/$name.err" | grep -v 'Internal error\|flush.c' | tail -8
  fi
  kill_in_machines
}
if want fault-heal-engram; then
  pe_heal_case heal-engram-remote engram 3 90  # rank 0 and 1 fetch its rows by gets
  pe_heal_case heal-pp-across pp 3 90          # rank 0 (the other machine) waits for its message
fi

shm_after=$(ls -A /dev/shm | sort)
new=$(comm -13 <(echo "$shm_before") <(echo "$shm_after") | grep -E 'ucx|ompi|vader|oshmem|shmem|sm_segment' || true)
[ -z "$new" ] || fail "new entries in /dev/shm: $new"

echo "multinode: $(( $(date +%s) - t0 ))s"
if [ "$failures" -ne 0 ]; then echo "FAIL: multinode: $failures check(s) failed"; exit 1; fi
echo "PASS: multinode (shmem transport across network namespaces)"
