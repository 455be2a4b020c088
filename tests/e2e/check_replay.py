#!/usr/bin/python3
"""End-to-end check of `epx replay` (docs/spec.md §7) against the numpy
reference epx_ref.py.

    /usr/bin/python3 tests/e2e/check_replay.py --epx build/src/tools/epx [--quick]
        [--keep] [--filter SUBSTRING] [--names N1,N2,...] [--timeout SECONDS] [--repeat N]
        [--launch 'oshrun ... -np {np}']

With --launch, every case runs as `LAUNCH epx replay ... --transport shmem` ({np} = the
case's number of ranks): one rank per process, started by that launcher (the
multi-"machine" tests, tests/multinode/run.sh, pass their oshrun line); the threads
cases run on shmem too.

Generates a matrix of random cases in a temporary directory, runs
`epx replay --in IN --out OUT [options]` on each (some with
`--transport threads`), and compares every output file of every rank with the
reference, bit for bit: the .npy dtype descr, the shape, C order and the raw
bytes (float arrays are compared by their bits).  Then runs invalid cases,
each of which must exit non-zero, print an error on stderr naming the rank at
fault ("rank <r>"), and leave no OUT/rank* directory behind.  After every run
no new /dev/shm entry whose name contains "epx" may be left.

Prints one line per case (PASS / FAIL + reason) and ends with a line
`N passed, M failed`; the exit status is non-zero if M > 0.
"""

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep tests/e2e free of __pycache__
sys.path.insert(0, HERE)
import epx_ref as ref  # noqa: E402
import gen_case  # noqa: E402

BF16_FILES = {"recv_x", "combined_x"}
F32_FILES = {"recv_x_scales", "recv_topk_weights", "recv_weights"}
ROW_PAYLOAD_FILES = {"recv_x", "recv_x_fp8", "recv_x_scales"}  # unspecified in padding rows

# ----------------------------------------------------------------------------
# Case matrix
# ----------------------------------------------------------------------------


def G(P, E, H, K, tokens, mask=0.0, zipf=0.0, fp8=False, seed=0, C=None, probes=6):
    """A generated case; `probes` tokens are replaced by order probes (see
    gen_case.py: they make a wrong combine order show in the bf16 result;
    they need P >= 3, K >= 3 and, unweighted expanded, L >= 9)."""
    if isinstance(tokens, int):
        tokens = [tokens] * P
    return dict(ranks=P, experts=E, hidden=H, topk=K, tokens=list(tokens), mask_prob=mask,
                zipf=zipf, fp8=fp8, seed=seed, max_tokens=C, probes=probes)


def O(layout, A=1, worst=None, det=False, zp=False, weighted=False, threads=False, dataplane=(), launched=False):
    """worst: None, an int, "exact" (= the largest need over the ranks) or
    ("extra", n) (= that + n). dataplane: extra epx flags (schedule, queues, protocol...),
    which must not change a single bit of the outputs. launched: only with --launch (ranks
    from a launcher over several machines: the node layout comes from the job)."""
    return dict(layout=layout, alignment=A, worst=worst, deterministic=det, zero_padding=zp,
                weighted=weighted, threads=threads, dataplane=list(dataplane), launched=launched)


def success_cases():
    """(name, gen, opts, in_quick)"""
    g_p1 = G(1, 4, 256, 2, 17, mask=0.1, seed=1)
    g_p2 = G(2, 8, 128, 4, [13, 0], mask=0.2, seed=2)
    g_p3 = G(3, 12, 128, 3, [5, 0, 21], mask=0.3, seed=3)
    g_p4z = G(4, 16, 256, 6, [40, 3, 0, 25], mask=0.1, zipf=1.5, seed=4)
    g_p8l1 = G(8, 8, 128, 1, [7, 0, 3, 9, 0, 1, 12, 4], seed=5)
    g_p8 = G(8, 32, 128, 8, [20, 0, 15, 31, 2, 0, 9, 17], mask=0.2, zipf=0.8, seed=6)
    g_p4l1 = G(4, 4, 128, 3, [10, 6, 0, 8], mask=0.25, seed=7)
    g_k1 = G(4, 8, 128, 1, 12, seed=8)
    g_w = G(4, 8, 128, 2, [9, 0, 14, 6], mask=0.15, seed=9)
    g_wt = G(4, 16, 256, 4, [11, 7, 0, 13], mask=0.2, zipf=1.0, seed=10)
    g_f3 = G(3, 6, 256, 2, [6, 11, 0], mask=0.1, fp8=True, seed=11)
    g_f8 = G(8, 16, 512, 4, [5, 9, 0, 3, 12, 1, 7, 2], mask=0.2, zipf=1.2, fp8=True, seed=12)
    g_c = G(3, 6, 128, 2, [4, 9, 2], mask=0.1, seed=13, C=16)
    g_mask = G(2, 4, 128, 2, [5, 3], mask=1.0, seed=14)
    g_empty = G(2, 4, 128, 2, [0, 0], seed=15, C=4)
    g_h = G(2, 4, 1024, 2, [30, 20], mask=0.1, seed=16)
    g_p8t = G(8, 16, 256, 3, [6, 2, 8, 0, 5, 7, 3, 9], mask=0.1, zipf=1.0, seed=17)
    g_p2q = G(2, 4, 128, 2, [9, 4], mask=0.2, seed=18)
    # L >= 9: the order probes of the unweighted expanded combine fit
    g_o3 = G(3, 27, 128, 4, [8, 5, 9], mask=0.1, seed=19, probes=12)
    g_o4 = G(4, 48, 256, 6, [10, 0, 7, 12], mask=0.1, zipf=0.7, seed=20, probes=15)
    g_of = G(3, 27, 256, 4, [6, 11, 2], mask=0.1, fp8=True, seed=22, probes=12)
    # larger ones
    g_big = G(8, 64, 2048, 8, 300, mask=0.1, zipf=0.8, seed=31, probes=12)
    g_bigf = G(4, 16, 2048, 6, 400, mask=0.1, fp8=True, seed=32, probes=12)
    return [
        ("large_p8_H2048_expanded_a128", g_big, O("expanded", 128), False),
        ("large_fp8_p4_H2048_compact", g_bigf, O("compact", 1), False),
        ("order_p3_L9_expanded_det", g_o3, O("expanded", 1, det=True), True),
        ("order_p3_L9_compact", g_o3, O("compact", 1), True),
        ("order_p4_L12_expanded_a4", g_o4, O("expanded", 4), False),
        ("order_p4_L12_compact_threads", g_o4, O("compact", 1, threads=True), False),
        ("order_p4_L12_weighted_det", g_o4, O("expanded", 1, det=True, weighted=True), False),
        ("order_fp8_p3_L9_expanded_a4", g_of, O("expanded", 4), False),
        ("order_fp8_p3_L9_compact", g_of, O("compact", 1), False),
        ("p1_expanded_det", g_p1, O("expanded", 1, det=True), True),
        ("p1_compact", g_p1, O("compact", 1), False),
        ("p2_compact_a4", g_p2, O("compact", 4), True),
        ("p2_expanded_a4_det", g_p2, O("expanded", 4, det=True), False),
        ("p2_expanded_a4", g_p2, O("expanded", 4), True),
        ("p3_expanded_a128_det", g_p3, O("expanded", 128, det=True), False),
        ("p3_compact_a128", g_p3, O("compact", 128), False),
        ("p4_zipf_expanded_a4", g_p4z, O("expanded", 4), False),
        ("p4_zipf_compact", g_p4z, O("compact", 1), True),
        ("p4_zipf_expanded_det_threads", g_p4z, O("expanded", 1, det=True, threads=True), True),
        ("p8_L1_K1_expanded_det", g_p8l1, O("expanded", 1, det=True), False),
        ("p8_L1_K1_compact", g_p8l1, O("compact", 1), False),
        ("p8_K8_expanded_a4", g_p8, O("expanded", 4), True),
        ("p8_K8_compact_threads", g_p8, O("compact", 1, threads=True), False),
        ("p4_L1_expanded_det", g_p4l1, O("expanded", 1, det=True), False),
        ("p4_L1_compact_a4", g_p4l1, O("compact", 4), False),
        ("p4_K1_expanded_a128", g_k1, O("expanded", 128), False),
        ("p4_K1_compact", g_k1, O("compact", 1), False),
        ("worst_compact", g_w, O("compact", 1, worst=("extra", 5)), True),
        ("worst_compact_exact", g_w, O("compact", 1, worst="exact"), False),
        ("worst_expanded_a4_det", g_w, O("expanded", 4, worst=("extra", 7), det=True), False),
        ("worst_expanded_a128_exact", g_w, O("expanded", 128, worst="exact"), True),
        ("zeropad_expanded_a4_det", g_w, O("expanded", 4, det=True, zp=True), False),
        ("zeropad_expanded_a4_worst", g_w, O("expanded", 4, worst=("extra", 9), zp=True), True),
        ("zeropad_compact_worst", g_w, O("compact", 1, worst=("extra", 3), zp=True), False),
        ("weighted_expanded_det", g_wt, O("expanded", 1, det=True, weighted=True), True),
        ("weighted_expanded_a4", g_wt, O("expanded", 4, weighted=True), False),
        ("weighted_expanded_a128_worst_zp_threads", g_wt,
         O("expanded", 128, worst=("extra", 2), zp=True, weighted=True, threads=True), False),
        ("fp8_compact", g_f3, O("compact", 1), True),
        ("fp8_expanded_a4_det", g_f3, O("expanded", 4, det=True), True),
        ("fp8_expanded_a4_worst_zp", g_f3, O("expanded", 4, worst=("extra", 4), zp=True), False),
        ("fp8_compact_worst_threads", g_f3, O("compact", 1, worst=("extra", 1), threads=True), False),
        ("fp8_p8_expanded", g_f8, O("expanded", 1), False),
        ("fp8_p8_compact_weighted_free", g_f8, O("compact", 4), False),
        ("meta_max_tokens_expanded_det", g_c, O("expanded", 1, det=True), True),
        ("meta_max_tokens_compact", g_c, O("compact", 1), False),
        ("all_masked_compact", g_mask, O("compact", 1), False),
        ("all_masked_expanded_a4", g_mask, O("expanded", 4), True),
        ("all_empty_compact", g_empty, O("compact", 1), False),
        ("all_empty_expanded_worst", g_empty, O("expanded", 4, worst=3, zp=True), False),
        ("p2_H1024_expanded", g_h, O("expanded", 4), False),
        ("p8_expanded_a4_threads", g_p8t, O("expanded", 4, threads=True), False),
        ("p8_compact_worst_zp", g_p8t, O("compact", 1, worst=("extra", 0), zp=True), False),
        ("p2_weighted_expanded_threads", g_p2q, O("expanded", 1, weighted=True, threads=True), False),
        # The data-plane options change order, puts and synchronisation, never the bits.
        ("p8_grouped_2q_tail_noagg", g_p8t, O("expanded", 4, dataplane=(
            "--schedule", "grouped:4", "--queues", "2", "--queue-split", "3:1", "--protocol", "tail",
            "--aggregate", "0")), True),
        ("p8_flag_4q_bytes", g_p8t, O("compact", 1, dataplane=(
            "--protocol", "flag", "--queues", "4", "--queue-split", "bytes")), True),
        ("p8_hierarchical_servers4", g_p8t, O("expanded", 4, weighted=True, dataplane=(
            "--schedule", "hierarchical", "--topology", "builtin:servers:4")), True),
        # --schedule hierarchical without --topology: the job's real node layout (several machines).
        ("p4_hierarchical_job_nodes", g_wt, O("expanded", 4, weighted=True, dataplane=(
            "--schedule", "hierarchical"), launched=True), False),
        ("p8_ring2_flat", g_p8t, O("compact", 1, worst=("extra", 2), dataplane=(
            "--schedule", "flat", "--ring-rows", "2")), False),
    ]


def error_cases():
    """(name, gen (+ invalid, bad_rank), opts, bad rank or None, in_quick)"""
    base4 = dict(ranks=4, experts=8, hidden=128, topk=2, tokens=[6, 5, 7, 4], mask_prob=0.1, seed=21)

    def E_(name, invalid=None, bad=None, opts=None, quick=False, **kw):
        g = dict(base4)
        g.update(kw)
        if invalid is not None:
            g["invalid"] = invalid
            g["bad_rank"] = bad if bad is not None else 0
        return (name, g, opts or O("compact", 1), bad, quick)

    return [
        E_("err_idx_out_of_range_rank0", "idx_out_of_range", 0, quick=True),
        E_("err_idx_out_of_range_rank3", "idx_out_of_range", 3, O("expanded", 4), quick=True),
        E_("err_idx_out_of_range_p8_rank7", "idx_out_of_range", 7, ranks=8, experts=16,
           tokens=[3, 4, 0, 2, 5, 1, 2, 6]),
        E_("err_idx_out_of_range_p8_rank0_threads", "idx_out_of_range", 0,
           O("expanded", 1, threads=True), ranks=8, experts=16, tokens=[3, 4, 0, 2, 5, 1, 2, 6]),
        E_("err_idx_minus2_rank1", "idx_below_minus_one", 1, O("expanded", 1)),
        E_("err_dup_expert_rank0", "dup_expert", 0, O("expanded", 1), quick=True),
        E_("err_dup_expert_rank3", "dup_expert", 3),
        E_("err_e_mod_p", None, None, experts=6, quick=True),
        E_("err_s_gt_c_rank1", "s_gt_c", 1, tokens=[6, 9, 7, 4], quick=True),
        E_("err_weights_shape_rank2", "weights_shape", 2, quick=True),
        E_("err_weights_rows_rank0", "weights_rows", 0, O("expanded", 1)),
        E_("err_idx_cols_rank1", "idx_cols", 1),
        E_("err_x_rows_rank2", "x_rows", 2, O("expanded", 1), quick=True),
        E_("err_x_cols_rank0", "x_cols", 0),
        E_("err_x_dtype_f4_rank1", "x_dtype", 1, quick=True),
        E_("err_x_dtype_f4_rank3_threads", "x_dtype", 3, O("expanded", 1, threads=True)),
        E_("err_idx_dtype_i4_rank2", "idx_dtype", 2),
        E_("err_weights_dtype_f8_rank0", "weights_dtype", 0),
        E_("err_fp8_h64", None, None, hidden=64, fp8=True, quick=True),
        E_("err_fp8_scales_shape_rank1", "scales_shape", 1, fp8=True, hidden=256),
        E_("err_weighted_compact", None, None, O("compact", 1, weighted=True), quick=True),
        E_("err_missing_topk_weights_rank2", "missing_file", 2, quick=True),
        E_("err_missing_x_rank0", "missing_x", 0),
        E_("err_missing_rank_dir_rank3", "missing_rank_dir", 3),
        E_("err_meta_malformed", "meta_malformed", None, quick=True),
        E_("err_meta_missing_key", "meta_missing_key", None),
        E_("err_meta_string_value", "meta_string_value", None),
        E_("err_alignment_0", None, None, O("expanded", 0)),
        E_("err_layout_unknown", None, None, O("grouped", 1)),
        E_("err_worst_negative", None, None, O("compact", 1, worst=-5)),
    ]


# ----------------------------------------------------------------------------
# .npy reading and comparison
# ----------------------------------------------------------------------------


def read_npy(path):
    """(array, problems): parses the header itself so that the descr, the
    order and the data length are checked, not normalised away."""
    problems = []
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
        except ValueError as e:
            return None, ["not a .npy file (%s)" % e]
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            return None, ["unsupported .npy version %s" % (version,)]
        data = f.read()
    if fortran:
        problems.append("fortran_order is True (must be C order)")
    if dtype.hasobject:
        return None, ["object dtype"]
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) < nbytes:
        return None, problems + ["data is %d bytes, shape %s needs %d" % (len(data), shape, nbytes)]
    if len(data) > nbytes:
        problems.append("%d trailing bytes after the data" % (len(data) - nbytes))
    arr = np.frombuffer(data[:nbytes], dtype=dtype).reshape(shape)
    return arr, problems


def fmt_value(name, arr_dtype, v):
    if name in BF16_FILES and arr_dtype.str == "<u2":
        f = float(ref.bf16_to_f32(np.array([v], "<u2"))[0])
        return "0x%04x (%r)" % (int(v), f)
    if arr_dtype.str == "<f4":
        bits = int(np.array([v], "<f4").view("<u4")[0])
        return "0x%08x (%r)" % (bits, float(v))
    if arr_dtype.str == "|u1" and name == "recv_x_fp8":
        return "0x%02x" % int(v)
    return repr(v.item() if hasattr(v, "item") else v)


def first_diff(name, exp, got, skip_rows=None, nan_any=False):
    """None if equal, else a message with the first differing index."""
    if exp.dtype.str != got.dtype.str:
        return "dtype %s, expected %s" % (got.dtype.str, exp.dtype.str)
    if exp.shape != got.shape:
        return "shape %s, expected %s" % (got.shape, exp.shape)
    if exp.size == 0:
        return None
    ub = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}[exp.dtype.itemsize]
    eb = np.ascontiguousarray(exp).view(ub)
    gb = np.ascontiguousarray(got).view(ub)
    diff = eb != gb
    if nan_any and name in BF16_FILES:
        en = np.isnan(ref.bf16_to_f32(eb))
        gn = np.isnan(ref.bf16_to_f32(gb))
        diff &= ~(en & gn)
    if skip_rows is not None and np.any(skip_rows):
        diff[skip_rows] = False
    if not np.any(diff):
        return None
    pos = tuple(int(i) for i in np.argwhere(diff)[0])
    return "first difference at %s: expected %s, got %s (%d of %d elements differ)" % (
        list(pos), fmt_value(name, exp.dtype, exp[pos]), fmt_value(name, got.dtype, got[pos]),
        int(diff.sum()), diff.size)


def compare_outputs(case, res, out_dir, opts):
    failures, warnings = [], []
    names = ref.expected_files(case, opts["layout"])
    unordered = opts["layout"] == "expanded" and not opts["deterministic"]
    for r in range(case.P):
        d = os.path.join(out_dir, "rank%d" % r)
        if not os.path.isdir(d):
            failures.append("rank%d: no output directory" % r)
            continue
        present = {os.path.splitext(n)[0] for n in os.listdir(d)}
        extra = sorted(present - set(names))
        if extra:
            warnings.append("rank%d: extra files %s" % (r, extra))
        got = {}
        for name in names:
            path = os.path.join(d, name + ".npy")
            if not os.path.exists(path):
                failures.append("rank%d/%s.npy: missing" % (r, name))
                continue
            arr, problems = read_npy(path)
            for p in problems:
                failures.append("rank%d/%s.npy: %s" % (r, name, p))
            if arr is not None:
                got[name] = arr
        exp = res.ranks[r]
        if unordered and "recv_src" in got:
            got = canonicalize_expanded(got, exp, res.segments[r])
        skip = res.unspecified_rows[r]
        for name in names:
            if name not in got:
                continue
            skip_rows = skip if name in ROW_PAYLOAD_FILES else None
            msg = first_diff(name, exp[name], got[name], skip_rows, nan_any=True)
            if msg and name == "combined_x" and got[name].shape == exp[name].shape:
                msg += diagnose_combine(case, r, exp[name], got[name], opts)
            if msg:
                note = " (rows compared as a multiset per expert)" if unordered and name in (
                    "recv_src", "recv_x", "recv_x_fp8", "recv_x_scales", "recv_weights") else ""
                failures.append("rank%d/%s.npy: %s%s" % (r, name, msg, note))
    if os.path.isdir(out_dir):
        for entry in sorted(os.listdir(out_dir)):
            m = re.fullmatch(r"rank(\d+)", entry)
            if m and int(m.group(1)) >= case.P:
                warnings.append("unexpected %s in OUT" % entry)
    return failures, warnings


def diagnose_combine(case, r, exp, got, opts):
    """For the first token whose combined row differs: which wrong summation
    order (gen_case.PROBE_VARIANTS) reproduces the engine's row, if any."""
    rows = np.nonzero(np.any(exp != got, axis=1))[0]
    if not len(rows):
        return ""
    t = int(rows[0])
    kind = "compact" if opts["layout"] == "compact" else ("weighted" if opts["weighted"] else "expanded")
    if case.fp8:
        v = (ref.fp8_to_f32(case.x_fp8[r][t]).reshape(-1, ref.FP8_BLOCK)
             * case.x_scales[r][t][:, None]).astype(ref.F32).reshape(-1)
    else:
        v = ref.bf16_to_f32(case.x[r][t])
    idx, w = case.topk_idx[r][t], case.topk_weights[r][t]
    match = [var for var in gen_case.PROBE_VARIANTS[kind]
             if np.array_equal(gen_case._combine_variant(v, idx, w, case.L, kind, var), got[t])]
    groups = {d: ks for d, ks in sorted(gen_case._groups(idx, case.L).items())}
    return "; token %d topk_idx %s (slots per destination rank %s): the engine's row %s" % (
        t, idx.tolist(), groups,
        ("matches the wrong order(s) %s" % match) if match else "matches none of the known wrong orders")


def canonicalize_expanded(got, exp, segments):
    """Sort the real rows of each expert by recv_src (= (s,t) order, the
    deterministic order) so that an unspecified within-expert order compares
    equal.  Only done when the shapes allow it; otherwise the plain
    comparison reports the problem."""
    src = got["recv_src"]
    if src.shape != exp["recv_src"].shape or src.ndim != 2 or src.shape[1] != 3:
        return got
    perm = np.arange(src.shape[0])
    for o, n in segments:
        if n <= 1:
            continue
        sub = src[o:o + n]
        order = np.lexsort((sub[:, 2], sub[:, 1], sub[:, 0]))
        perm[o:o + n] = o + order
    out = dict(got)
    for name in ("recv_src", "recv_x", "recv_x_fp8", "recv_x_scales", "recv_weights"):
        if name in got and got[name].ndim >= 1 and got[name].shape[0] == src.shape[0]:
            out[name] = got[name][perm]
    return out


# ----------------------------------------------------------------------------
# /dev/shm
# ----------------------------------------------------------------------------


def shm_entries():
    try:
        return {n for n in os.listdir("/dev/shm") if "epx" in n}
    except OSError:
        return set()


def shm_in_use():
    """/dev/shm paths some live process has open or mapped."""
    used = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                try:
                    t = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                except OSError:
                    continue
                if t.startswith("/dev/shm/"):
                    used.add(t[len("/dev/shm/"):].split(" ")[0])
        except OSError:
            pass
        try:
            with open("/proc/%s/maps" % pid) as f:
                for line in f:
                    i = line.find("/dev/shm/")
                    if i >= 0:
                        used.add(line[i + len("/dev/shm/"):].strip().split(" ")[0])
        except OSError:
            pass
    return used


def shm_leaks(before):
    """New epx entries in /dev/shm that no live process holds (a concurrent
    test of someone else keeps its segments open, a leak does not)."""
    new = shm_entries() - before
    if not new:
        return []
    time.sleep(0.2)
    new = shm_entries() - before
    if not new:
        return []
    used = shm_in_use()
    return sorted(n for n in new if n not in used)


# ----------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------


LAUNCH = None  # --launch: the launcher's command line, "{np}" = the case's ranks


def replay_cmd(epx, in_dir, out_dir, opts, worst, ranks):
    cmd = [epx, "replay", "--in", in_dir, "--out", out_dir,
           "--layout", opts["layout"], "--alignment", str(opts["alignment"])]
    if worst:
        cmd += ["--worst", str(worst)]
    if opts["deterministic"]:
        cmd.append("--deterministic")
    if opts["zero_padding"]:
        cmd.append("--zero-padding")
    if opts["weighted"]:
        cmd.append("--weighted")
    if LAUNCH is not None:
        cmd = [a.replace("{np}", str(ranks)) for a in shlex.split(LAUNCH)] + cmd + ["--transport", "shmem"]
    elif opts.get("threads"):
        cmd += ["--transport", "threads"]
    return cmd + opts.get("dataplane", [])


def run(cmd, timeout):
    before = shm_entries()
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
        rc, out, err = p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, (e.stdout or b"").decode(errors="replace"), (e.stderr or b"").decode(errors="replace")
    leaks = shm_leaks(before)
    return rc, out, err, time.time() - t0, leaks


def tail(text, n=400):
    text = text.strip().replace("\n", " | ")
    return text if len(text) <= n else "..." + text[-n:]


def resolve_worst(spec, res_plain):
    if spec is None:
        return 0
    if isinstance(spec, int):
        return spec
    top = max(res_plain.needed_rows) if res_plain.needed_rows else 0
    if spec == "exact":
        return max(top, 1)
    if isinstance(spec, tuple) and spec[0] == "extra":
        return max(top + spec[1], 1)
    raise ValueError(spec)


def check_success(name, g, opts, epx, tmp, timeout, mutate=None, either_bad_rank=None):
    """Run one valid case and compare.  `mutate(in_dir)` rewrites input files
    after the reference has read them (same values, another encoding).  With
    `either_bad_rank` set, a clean error naming that rank is accepted too."""
    in_dir = os.path.join(tmp, name, "in")
    out_dir = os.path.join(tmp, name, "out")
    gen_case.generate(in_dir, **g)
    case = ref.load_case(in_dir)
    plain = ref.compute(case, opts["layout"], opts["alignment"], 0, opts["deterministic"],
                        opts["zero_padding"], opts["weighted"])
    worst = resolve_worst(opts["worst"], plain)
    res = ref.compute(case, opts["layout"], opts["alignment"], worst, opts["deterministic"],
                      opts["zero_padding"], opts["weighted"]) if worst else plain
    if mutate is not None:
        mutate(in_dir)
    cmd = replay_cmd(epx, in_dir, out_dir, opts, worst, case.P)
    if either_bad_rank is not None:
        rc, out, err, secs, leaks = run(cmd, timeout)
        if rc not in (0, None):
            fails, secs2, cmd_s, _ = run_error(name, cmd, out_dir, either_bad_rank, [], timeout)
            return fails, secs, " ".join(cmd[1:]) + "  [rejected; accepted as an error]"
    else:
        rc, out, err, secs, leaks = run(cmd, timeout)
    fails = []
    if rc is None:
        fails.append("timed out after %ds" % timeout)
    elif rc != 0:
        fails.append("exit status %d, stderr: %s" % (rc, tail(err)))
    else:
        f, w = compare_outputs(case, res, out_dir, opts)
        fails += f
        if w:
            print("  note: %s: %s" % (name, "; ".join(w)))
    if leaks:
        fails.append("/dev/shm entries left: %s" % leaks)
    return fails, secs, " ".join(cmd[1:])


def _resave(path, transform, version=None):
    arr = np.load(path)
    arr = transform(arr)
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, version=version)


def mutate_npy_v2(in_dir):
    """Every input .npy rewritten in format version 2.0 (same data)."""
    for path in glob.glob(os.path.join(in_dir, "rank*", "*.npy")):
        _resave(path, lambda a: a, version=(2, 0))


def mutate_big_endian_idx(rank):
    def f(in_dir):
        _resave(os.path.join(in_dir, "rank%d" % rank, "topk_idx.npy"), lambda a: a.astype(">i8"))
    return f


def mutate_fortran_x(rank):
    def f(in_dir):
        d = os.path.join(in_dir, "rank%d" % rank)
        name = "x_fp8.npy" if os.path.exists(os.path.join(d, "x_fp8.npy")) else "x.npy"
        _resave(os.path.join(d, name), np.asfortranarray)
    return f


def encoding_cases():
    """(name, gen, opts, mutate, either_bad_rank, in_quick).  Format 2.0 must
    be read; big-endian or Fortran-order input (docs/spec.md §7 says little-endian, C
    order) must be either read correctly or refused with an error naming the
    rank - never misread."""
    g = G(3, 6, 256, 2, [7, 0, 9], mask=0.1, seed=41)
    gf = G(3, 6, 256, 2, [7, 0, 9], mask=0.1, fp8=True, seed=42)
    return [
        ("npy_v2_inputs_expanded", g, O("expanded", 4), mutate_npy_v2, None, True),
        ("npy_v2_inputs_fp8_compact", gf, O("compact", 1), mutate_npy_v2, None, False),
        ("big_endian_topk_idx_rank2", g, O("compact", 1), mutate_big_endian_idx(2), 2, False),
        ("fortran_order_x_rank0", g, O("expanded", 1), mutate_fortran_x(0), 0, False),
        ("fortran_order_x_fp8_rank2", gf, O("compact", 1), mutate_fortran_x(2), 2, False),
    ]


RANK_RE = r"\brank\s*[#:=]?\s*%d\b"


def check_error(name, g, opts, bad, epx, tmp, timeout):
    in_dir = os.path.join(tmp, name, "in")
    out_dir = os.path.join(tmp, name, "out")
    gen_case.generate(in_dir, **g)
    worst = opts["worst"] if isinstance(opts["worst"], int) else 0
    cmd = replay_cmd(epx, in_dir, out_dir, opts, worst, g["ranks"])
    return run_error(name, cmd, out_dir, bad, [], timeout)


def run_error(name, cmd, out_dir, bad, numbers, timeout):
    rc, out, err, secs, leaks = run(cmd, timeout)
    fails = []
    if rc is None:
        fails.append("timed out after %ds (hang on invalid input)" % timeout)
    elif rc == 0:
        fails.append("exit status 0 on invalid input")
    elif rc < 0:
        fails.append("killed by signal %d (crash) stderr: %s" % (-rc, tail(err)))
    if rc is not None and rc != 0:
        if not err.strip():
            fails.append("nothing on stderr")
        if bad is not None and not re.search(RANK_RE % bad, err, re.IGNORECASE):
            fails.append("stderr does not name rank %d: %s" % (bad, tail(err)))
        for n in numbers:
            if not re.search(r"(?<!\d)%d(?!\d)" % n, err):
                fails.append("stderr does not contain the number %d: %s" % (n, tail(err)))
    left = sorted(glob.glob(os.path.join(out_dir, "rank*")))
    if left:
        fails.append("left behind: %s" % [os.path.relpath(p, os.path.dirname(out_dir)) for p in left])
    if leaks:
        fails.append("/dev/shm entries left: %s" % leaks)
    return fails, secs, " ".join(cmd[1:]), err


def worst_too_small_cases(quick):
    """W one below the need of exactly one rank (the others fit): that rank
    must be named with both numbers."""
    out = []
    specs = [("err_worst_too_small_compact", "compact", True),
             ("err_worst_too_small_expanded", "expanded", True),
             ("err_worst_too_small_expanded_threads", "expanded", False)]
    for name, layout, q in specs:
        if quick and not q:
            continue
        out.append((name, layout, name.endswith("threads")))
    return out


def find_single_overflow(tmp, name, layout):
    """Generate cases until one rank needs strictly more rows than every other
    one; returns (in_dir, case, rank, need, W)."""
    for seed in range(100, 200):
        g = dict(ranks=4, experts=8, hidden=128, topk=2, tokens=[8, 3, 10, 5], mask_prob=0.1,
                 zipf=1.3, fp8=False, seed=seed, max_tokens=None)  # no probes
        in_dir = os.path.join(tmp, name, "in")
        gen_case.generate(in_dir, **g)
        case = ref.load_case(in_dir)
        need = ref.compute(case, layout, 1).needed_rows
        top = max(need)
        rest = sorted(need)[-2]
        if top - 1 > rest:
            return in_dir, need.index(top), top, top - 1
    raise RuntimeError("no case with a single largest need")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epx", required=True, help="path to the epx binary")
    ap.add_argument("--quick", action="store_true", help="smaller matrix (< 60 s)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--filter", default=None, help="only cases whose name contains this")
    ap.add_argument("--names", default=None, help="only these cases (comma-separated names)")
    ap.add_argument("--launch", default=None,
                    help="run each case under this launcher with --transport shmem ({np} = its ranks)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per epx run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every valid case this many times (races show as flaky cases)")
    a = ap.parse_args(argv)
    global LAUNCH
    LAUNCH = a.launch
    names = set(a.names.split(",")) if a.names else None
    seen = set()
    epx = os.path.abspath(a.epx)
    if not (os.path.isfile(epx) and os.access(epx, os.X_OK)):
        print("FAIL setup: %s is not an executable" % epx)
        print("0 passed, 1 failed")
        return 1

    tmp = tempfile.mkdtemp(prefix="epx_e2e_")
    passed = failed = 0
    t_start = time.time()

    def report(name, fails, secs, cmd):
        nonlocal passed, failed
        if fails:
            failed += 1
            print("FAIL %s (%.1fs): %s" % (name, secs, fails[0]))
            for f in fails[1:8]:
                print("     %s" % f)
            if len(fails) > 8:
                print("     ... %d more" % (len(fails) - 8))
            print("     cmd: epx %s" % cmd)
        else:
            passed += 1
            print("PASS %s (%.1fs)" % (name, secs))
        sys.stdout.flush()

    def wanted(name, in_quick):
        if a.quick and not in_quick:
            return False
        if names is not None and name.split("#")[0] not in names:
            return False
        seen.add(name.split("#")[0])
        return a.filter is None or a.filter in name

    try:
        matrix = success_cases()
        if a.repeat > 1:
            matrix = [("%s#%d" % (n, i + 1), g, o, q) for i in range(a.repeat) for n, g, o, q in matrix]
        for name, g, opts, q in matrix:
            if not wanted(name, q) or (opts["launched"] and LAUNCH is None):
                continue
            try:
                fails, secs, cmd = check_success(name, g, opts, epx, tmp, a.timeout)
            except OSError as e:
                fails, secs, cmd = ["OS error (could not run epx?): %s" % e], 0.0, ""
            except Exception as e:  # a bug of the checker itself must show, not hide
                fails, secs, cmd = ["checker error: %r" % e], 0.0, ""
            report(name, fails, secs, cmd)

        for name, g, opts, mutate, either, q in encoding_cases():
            if not wanted(name, q):
                continue
            try:
                fails, secs, cmd = check_success(name, g, opts, epx, tmp, a.timeout, mutate, either)
            except OSError as e:
                fails, secs, cmd = ["OS error (could not run epx?): %s" % e], 0.0, ""
            except Exception as e:
                fails, secs, cmd = ["checker error: %r" % e], 0.0, ""
            report(name, fails, secs, cmd)

        for name, g, opts, bad, q in error_cases():
            if not wanted(name, q):
                continue
            try:
                fails, secs, cmd, _ = check_error(name, g, opts, bad, epx, tmp, a.timeout)
            except OSError as e:
                fails, secs, cmd = ["OS error (could not run epx?): %s" % e], 0.0, ""
            except Exception as e:
                fails, secs, cmd = ["checker error: %r" % e], 0.0, ""
            report(name, fails, secs, cmd)

        for name, layout, threads in worst_too_small_cases(a.quick):
            if not wanted(name, True):
                continue
            try:
                in_dir, bad, need, W = find_single_overflow(tmp, name, layout)
                out_dir = os.path.join(tmp, name, "out")
                cmd = replay_cmd(epx, in_dir, out_dir, O(layout, 1, threads=threads), W, 4)
                fails, secs, cmd, _ = run_error(name, cmd, out_dir, bad, [need, W], a.timeout)
            except OSError as e:
                fails, secs, cmd = ["OS error (could not run epx?): %s" % e], 0.0, ""
            except Exception as e:
                fails, secs, cmd = ["checker error: %r" % e], 0.0, ""
            report(name, fails, secs, cmd)
    finally:
        if a.keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    for n in sorted((names or set()) - seen):
        failed += 1
        print("FAIL %s: no such case (--names)" % n)
    print("total %.1fs" % (time.time() - t_start))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
