#!/usr/bin/python3
"""Write a random `epx replay` input directory (docs/spec.md §7).

    /usr/bin/python3 gen_case.py --out DIR --ranks P --experts E --hidden H
        --topk K (--tokens S | --tokens-per-rank 5,0,12) [--mask-prob 0.2]
        [--zipf 1.2] [--fp8] [--seed N] [--max-tokens C] [--probes N]
        [--invalid KIND --bad-rank R]

Every token names distinct experts (unused slots are -1, placed anywhere);
weights are random float32 (including negatives); x is random finite bf16
(stored as '<u2' raw bits) with a few +-0 and subnormal values; FP8 data is
'|u1' raw e4m3 codes (never the NaN codes 0x7f / 0xff) with '<f4' scales.

--probes N replaces N random tokens by order probes: tokens whose routing and
x make a wrong float32 combine order show in the bf16 result (see below).
--invalid KIND breaks the case on rank --bad-rank (see INVALID_KINDS).
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep tests/e2e free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import epx_ref as ref  # noqa: E402

INVALID_KINDS = {
    "idx_out_of_range": "a topk_idx value == E on the bad rank",
    "idx_below_minus_one": "a topk_idx value == -2 on the bad rank",
    "dup_expert": "the same expert twice in one token on the bad rank",
    "e_mod_p": "(use --experts not divisible by --ranks; nothing else changes)",
    "s_gt_c": "num_max_tokens_per_rank = S_bad - 1 (other ranks must be <= that)",
    "weights_shape": "topk_weights [S, K+1] on the bad rank",
    "weights_rows": "topk_weights [S+1, K] on the bad rank",
    "idx_cols": "topk_idx [S, K+1] on the bad rank",
    "x_rows": "x (or x_fp8) [S+1, H] on the bad rank",
    "x_cols": "x [S, H+1] on the bad rank",
    "x_dtype": "x stored as <f4 on the bad rank",
    "idx_dtype": "topk_idx stored as <i4 on the bad rank",
    "weights_dtype": "topk_weights stored as <f8 on the bad rank",
    "scales_shape": "x_scales [S, H/128 + 1] on the bad rank (fp8)",
    "missing_file": "topk_weights.npy missing on the bad rank",
    "missing_x": "x.npy (x_fp8.npy) missing on the bad rank",
    "missing_rank_dir": "the whole rank<bad> directory missing",
    "meta_malformed": "meta.json is not valid JSON",
    "meta_missing_key": "meta.json lacks num_topk",
    "meta_string_value": "meta.json num_experts is a string",
}


def random_bf16(rng, shape):
    """Random finite bf16 bits: mostly normal values of both signs within
    [2^-20, 2^6), plus a sprinkling of +0, -0 and subnormals."""
    n = int(np.prod(shape)) if len(shape) else 1
    sign = rng.integers(0, 2, n).astype(np.uint16) << 15
    exp = rng.integers(127 - 20, 127 + 6, n).astype(np.uint16)
    man = rng.integers(0, 128, n).astype(np.uint16)
    bits = sign | (exp << 7) | man
    special = rng.random(n)
    bits = np.where(special < 0.01, sign, bits)                                # +-0
    sub = sign | rng.integers(1, 128, n).astype(np.uint16)                    # subnormal
    bits = np.where((special >= 0.01) & (special < 0.02), sub, bits)
    return bits.astype("<u2").reshape(shape)


def random_fp8(rng, shape):
    """Random e4m3fn codes, never NaN (0x7f, 0xff)."""
    n = int(np.prod(shape)) if len(shape) else 1
    codes = rng.integers(0, 254, n)          # 0..253, remap the two NaN codes
    codes = np.where(codes == 0x7F, 0xFE, codes)
    codes = codes.astype(np.uint8)
    assert not np.any((codes & 0x7F) == 0x7F)
    return codes.reshape(shape).astype("|u1")


def random_scales(rng, shape):
    """Positive float32 scales with full random mantissas, around 2^-12..2^0."""
    e = rng.uniform(-12.0, 0.0, shape)
    return (2.0 ** e).astype("<f4")


def random_weights(rng, shape):
    w = rng.uniform(-0.5, 1.5, shape).astype("<f4")
    return w


def routing(rng, S, E, K, mask_prob, popularity):
    """[S, K] int64: K distinct experts per token drawn with `popularity`,
    each slot then masked to -1 with probability mask_prob."""
    idx = np.empty((S, K), dtype="<i8")
    for t in range(S):
        idx[t] = rng.choice(E, size=K, replace=False, p=popularity)
    if mask_prob > 0:
        idx[rng.random((S, K)) < mask_prob] = -1
    return idx


# ----------------------------------------------------------------------------
# Order probes
#
# With random data the fixed combine order of docs/spec.md §4 almost never shows in the
# bf16 result: the terms of one token all have the sign of x, and an f32
# rounding difference only flips the bf16 result next to a bf16 tie.  An
# order probe is a token built so that it does show: its routing puts terms
# like A = x*c(3), B = x*c(7) = 2A (A + B can be an exact bf16 tie) and a
# small C = x*c(8) on different ranks / slots, or (weighted) two equal terms
# with opposite weights that cancel; then each column's x is picked among
# the values for which the order of docs/spec.md §4 gives another bf16 result than a wrong
# order (groups by destination, by smallest k, by largest k descending,
# descending k inside a group, one flat f32 sum, a weighted single slot not
# rounded; compact: destinations descending, by smallest k).
# The generator only picks inputs; the expected outputs come from epx_ref.
# ----------------------------------------------------------------------------

PROBE_KINDS = ("expanded", "compact", "weighted")


def _bf(v):
    return ref.bf16_to_f32(ref.f32_to_bf16(v))


def _groups(idx, L):
    groups = {}
    for k, e in enumerate(idx):
        if e >= 0:
            groups.setdefault(int(e) // L, []).append(k)
    return groups


def _combine_variant(v, idx, w, L, kind, variant):
    """bf16 result over candidate values v (f32 [M]) for one token."""
    groups = _groups(idx, L)
    acc = np.zeros_like(v)
    if kind == "compact":
        ds = sorted(groups)
        if variant == "dest_desc":
            ds = ds[::-1]
        elif variant == "min_k":
            ds = sorted(groups, key=lambda d: min(groups[d]))
        for d in ds:
            n = sum(int(idx[k]) - d * L for k in groups[d])
            acc = acc + _bf(v * ref.expert_factor(n))
        return ref.f32_to_bf16(acc)
    weighted = kind == "weighted"

    def term(k):
        d = int(idx[k]) // L
        y = _bf(v * ref.expert_factor(int(idx[k]) - d * L))
        return (y * np.float32(w[k])).astype(ref.F32) if weighted else y

    if variant == "flat":
        for k in range(len(idx)):
            if idx[k] >= 0:
                acc = acc + term(k)
        return ref.f32_to_bf16(acc)
    ds = sorted(groups, key=lambda d: max(groups[d]))
    if variant == "dest":
        ds = sorted(groups)
    elif variant == "min_k":
        ds = sorted(groups, key=lambda d: min(groups[d]))
    elif variant == "max_k_desc":
        ds = ds[::-1]
    for d in ds:
        ks = sorted(groups[d])
        if variant == "within_desc":
            ks = ks[::-1]
        if len(ks) == 1 and not weighted:
            p = term(ks[0])
        elif len(ks) == 1 and variant == "single_unrounded":
            p = term(ks[0])
        else:
            part = np.zeros_like(v)
            for k in ks:
                part = part + term(k)
            p = _bf(part)
        acc = acc + p
    return ref.f32_to_bf16(acc)


PROBE_VARIANTS = {  # in the order probes aim at them
    "expanded": ("within_desc", "min_k", "dest", "max_k_desc", "flat"),
    "weighted": ("within_desc", "min_k", "single_unrounded", "dest", "max_k_desc", "flat"),
    "compact": ("dest_desc", "min_k"),
}


def _split_locals(rng, n, L):
    """Distinct local experts < L whose sum is n (1 or 2 of them), or None."""
    opts = []
    if n < L:
        opts.append([n])
    for a in range(0, min(n, L)):
        b = n - a
        if a < b < L:
            opts.append([a, b])
    if not opts:
        return None
    return opts[rng.integers(len(opts))]


def _probe_routing(rng, P, L, K, kind, target):
    """A routing (and weights) for one order probe aimed at `target`, the
    wrong order it should expose; (None, None) when P, L or K are too small."""
    if P < 3 or K < 3:
        return None, None
    dests = [int(d) for d in rng.choice(P, 3, replace=False)]
    slots, w = [], []
    if kind == "compact":
        for d, n in zip(dests, (3, 7, int(rng.choice([8, 12])))):
            locs = _split_locals(rng, n, L)
            if locs is None:
                return None, None
            slots += [d * L + j for j in locs]
    elif kind == "weighted":
        # C tiny next to the cancelling pair: lost when added between them
        wc = np.float32(rng.uniform(0.5, 1.0) * 2.0 ** -int(rng.integers(8, 20)))
        wc = wc if rng.random() < 0.5 else -wc
        wa = np.float32(rng.uniform(0.25, 1.5))
        if target == "within_desc":
            # one group: y(j=1) = 512 * y(j=0) exactly, weights -wa/512 and wa cancel
            if L < 3:
                return None, None
            jc = int(rng.integers(2, L))
            slots = [dests[0] * L + 0, dests[0] * L + 1, dests[0] * L + jc]
            w = [wa, np.float32(-wa / np.float32(512.0)), np.float32(wc / ref.expert_factor(jc))]
            order = rng.permutation(3)
            slots = [slots[i] for i in order]
            w = [w[i] for i in order]
        else:
            big = [j for j in (3, 7, 11, 15, 2, 6, 1) if j < L] or [0]
            j = big[0] if rng.random() < 0.7 else int(rng.choice(big))
            small = [i for i in (0, 4, 8) if i < L]
            jc = int(rng.choice(small))
            slots = [dests[0] * L + j, dests[1] * L + j, dests[2] * L + jc]
            w = [wa, -wa, np.float32(wc / ref.expert_factor(jc))]
            if L > 1 and (target == "min_k" or rng.random() < 0.5):
                # a second slot in one group makes its min k != max k
                g = int(rng.integers(3))
                base = slots[g] % L
                j2 = (base + 1 + int(rng.integers(L - 1))) % L
                slots.append(dests[g] * L + j2)
                w.append(np.float32(rng.uniform(-0.5, 1.5)))
    else:
        pairs = [(a, b) for a, b in ((3, 7), (7, 15), (11, 23)) if b < L]
        smalls = [j for j in (8, 12, 16, 20) if j < L]
        if not pairs or not smalls:
            return None, None
        ja, jb = pairs[rng.integers(len(pairs))]
        jc = int(rng.choice(smalls))
        if target == "within_desc":
            dests = [dests[0]] * 3  # one group: the order inside it shows
        slots = [dests[0] * L + ja, dests[1] * L + jb, dests[2] * L + jc]
        if dests[2] != dests[0] and (target == "min_k" or rng.random() < 0.5):
            extra = [j for j in range(L) if j not in (ja, jb, jc)]
            slots.append(dests[2] * L + int(rng.choice(extra[:4])))
    if len(slots) > K or len(set(slots)) != len(slots):
        return None, None
    pos = rng.permutation(K)[: len(slots)]
    idx = np.full(K, -1, dtype="<i8")
    wt = random_weights(rng, (K,))
    for p, e in enumerate(slots):
        idx[pos[p]] = e
        if w:
            wt[pos[p]] = w[p]
    return idx, wt


_BF16_CANDIDATES = None


def _bf16_candidates():
    global _BF16_CANDIDATES
    if _BF16_CANDIDATES is None:
        bits = [(s << 15) | (e << 7) | m for s in (0, 1) for e in range(127 - 20, 127 + 6)
                for m in range(128)]
        _BF16_CANDIDATES = np.array(bits, dtype="<u2")
    return _BF16_CANDIDATES


def _fp8_candidates():
    codes = np.array([c for c in range(256) if (c & 0x7F) != 0x7F], dtype=np.uint8)
    return codes


def make_probe(rng, P, L, K, H, kind, target, fp8, scales=None, tries=12):
    """(idx [K], weights [K], row) for one order-probe token, or None.  Tries
    a few routings and keeps the first that exposes `target`, else the one
    that exposes the most wrong orders."""
    best, best_score = None, (False, 0)
    for _ in range(tries):
        idx, w = _probe_routing(rng, P, L, K, kind, target)
        if idx is None:
            return None
        blocks = [None] if not fp8 else list(range(H // 128))
        per_block = []
        covered = set()
        for b in blocks:
            if fp8:
                cand = _fp8_candidates()
                v = (ref.fp8_to_f32(cand) * np.float32(scales[b])).astype(ref.F32)
            else:
                cand = _bf16_candidates()
                v = ref.bf16_to_f32(cand)
            spec = _combine_variant(v, idx, w, L, kind, "spec")
            sets = []
            for variant in PROBE_VARIANTS[kind]:
                alt = _combine_variant(v, idx, w, L, kind, variant)
                hit = np.nonzero(alt != spec)[0]
                if len(hit):
                    sets.append(hit)
                    covered.add(variant)
            per_block.append((cand, sets))
        score = (target in covered, len(covered))
        if score > best_score:
            best, best_score = (idx, w, per_block), score
            if score[0]:
                break
    if best is None:
        return None
    idx, w, per_block = best
    width = H if not fp8 else 128
    row = []
    for cand, sets in per_block:
        if not sets:
            row.append(cand[rng.integers(len(cand), size=width)])
            continue
        cols = np.empty(width, dtype=cand.dtype)
        for c in range(width):
            hit = sets[c % len(sets)]
            cols[c] = cand[hit[rng.integers(len(hit))]]
        row.append(cols)
    return idx, w, np.concatenate(row)


def add_probes(rng, arrays, P, E, H, K, n_probes, fp8):
    """Replace n_probes random tokens (on ranks with tokens) by order probes,
    cycling through PROBE_KINDS.  Returns the number placed."""
    L = E // P if P and E % P == 0 else 0
    owners = [(r, t) for r in range(P) for t in range(arrays[r]["idx"].shape[0])]
    if not owners or L == 0:
        return 0
    picks = rng.permutation(len(owners))[:n_probes]
    placed = 0
    for i, p in enumerate(picks):
        r, t = owners[p]
        kind = PROBE_KINDS[i % len(PROBE_KINDS)]
        targets = PROBE_VARIANTS[kind]
        target = targets[(i // len(PROBE_KINDS)) % len(targets)]
        a = arrays[r]
        probe = make_probe(rng, P, L, K, H, kind, target, fp8, a["x_scales"][t] if fp8 else None)
        if probe is None:
            continue
        idx, w, row = probe
        a["idx"][t] = idx
        a["w"][t] = w
        if fp8:
            a["x_fp8"][t] = row
        else:
            a["x"][t] = row
        placed += 1
    return placed


def generate(out, ranks, experts, hidden, topk, tokens, mask_prob=0.0, zipf=0.0,
             fp8=False, seed=0, max_tokens=None, invalid=None, bad_rank=0, probes=0):
    P, E, H, K = ranks, experts, hidden, topk
    if len(tokens) != P:
        raise ValueError("need one token count per rank")
    if K > E:
        raise ValueError("topk > experts")
    rng = np.random.default_rng(seed)
    if zipf > 0:
        pop = 1.0 / np.arange(1, E + 1) ** zipf
        pop = pop[rng.permutation(E)]
    else:
        pop = np.ones(E)
    pop = pop / pop.sum()

    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    meta = {"num_ranks": P, "num_experts": E, "hidden": H, "num_topk": K}
    if max_tokens is not None:
        meta["num_max_tokens_per_rank"] = int(max_tokens)
    if invalid == "s_gt_c":
        meta["num_max_tokens_per_rank"] = int(tokens[bad_rank]) - 1

    arrays = []
    for r in range(P):
        S = int(tokens[r])
        a = {"idx": routing(rng, S, E, K, mask_prob, pop), "w": random_weights(rng, (S, K))}
        if fp8:
            nblk = H // 128 if H >= 128 else 1
            a["x_fp8"] = random_fp8(rng, (S, H))
            a["x_scales"] = random_scales(rng, (S, nblk))
        else:
            a["x"] = random_bf16(rng, (S, H))
        arrays.append(a)
    if probes and invalid is None and (not fp8 or H % 128 == 0):
        add_probes(rng, arrays, P, E, H, K, probes, fp8)

    for r in range(P):
        S = int(tokens[r])
        d = os.path.join(out, "rank%d" % r)
        os.makedirs(d)
        a = arrays[r]
        idx, w = a["idx"], a["w"]
        bad = invalid is not None and r == bad_rank
        if bad and invalid in ("idx_out_of_range", "idx_below_minus_one", "dup_expert"):
            if S == 0:
                raise ValueError("the bad rank needs tokens for %s" % invalid)
            t = S // 2
            if invalid == "idx_out_of_range":
                idx[t, K - 1] = E
            elif invalid == "idx_below_minus_one":
                idx[t, 0] = -2
            else:
                if K < 2:
                    raise ValueError("dup_expert needs K >= 2")
                idx[t, 0] = (E - 1) if idx[t, 1] < 0 else idx[t, 1]
                idx[t, 1] = idx[t, 0]
        if bad and invalid == "idx_cols":
            idx = np.concatenate([idx, np.full((S, 1), -1, dtype="<i8")], axis=1)
        if bad and invalid == "idx_dtype":
            idx = idx.astype("<i4")
        if bad and invalid == "weights_shape":
            w = random_weights(rng, (S, K + 1))
        if bad and invalid == "weights_rows":
            w = random_weights(rng, (S + 1, K))
        if bad and invalid == "weights_dtype":
            w = w.astype("<f8")
        np.save(os.path.join(d, "topk_idx.npy"), idx)
        np.save(os.path.join(d, "topk_weights.npy"), w)
        if fp8:
            xf, sc = a["x_fp8"], a["x_scales"]
            if bad and invalid == "x_rows":
                xf = np.concatenate([xf, random_fp8(rng, (1, H))])
                sc = np.concatenate([sc, random_scales(rng, (1, sc.shape[1]))])
            if bad and invalid == "scales_shape":
                sc = random_scales(rng, (S, sc.shape[1] + 1))
            np.save(os.path.join(d, "x_fp8.npy"), xf)
            np.save(os.path.join(d, "x_scales.npy"), sc)
        else:
            x = a["x"]
            if bad and invalid == "x_rows":
                x = np.concatenate([x, random_bf16(rng, (1, H))])
            if bad and invalid == "x_cols":
                x = random_bf16(rng, (S, H + 1))
            if bad and invalid == "x_dtype":
                x = (x.astype(np.uint32) << 16).view("<f4")
            np.save(os.path.join(d, "x.npy"), x)
        if bad and invalid == "missing_file":
            os.remove(os.path.join(d, "topk_weights.npy"))
        if bad and invalid == "missing_x":
            os.remove(os.path.join(d, "x_fp8.npy" if fp8 else "x.npy"))
        if bad and invalid == "missing_rank_dir":
            shutil.rmtree(d)

    text = json.dumps(meta)
    if invalid == "meta_malformed":
        text = text[: len(text) // 2]  # cut in the middle: not valid JSON
    elif invalid == "meta_missing_key":
        del meta["num_topk"]
        text = json.dumps(meta)
    elif invalid == "meta_string_value":
        meta["num_experts"] = "many"
        text = json.dumps(meta)
    with open(os.path.join(out, "meta.json"), "w") as f:
        f.write(text)
    return meta


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--experts", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--topk", type=int, required=True)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokens", type=int, help="S on every rank")
    g.add_argument("--tokens-per-rank", help="comma-separated S_r, e.g. 5,0,12")
    ap.add_argument("--mask-prob", type=float, default=0.0)
    ap.add_argument("--zipf", type=float, default=0.0, help="expert popularity exponent (0 = uniform)")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=None, help="num_max_tokens_per_rank in meta.json")
    ap.add_argument("--probes", type=int, default=0,
                    help="replace this many tokens by order probes (see PROBE_KINDS)")
    ap.add_argument("--invalid", choices=sorted(INVALID_KINDS), default=None)
    ap.add_argument("--bad-rank", type=int, default=0)
    a = ap.parse_args(argv)
    if a.tokens_per_rank is not None:
        tokens = [int(v) for v in a.tokens_per_rank.split(",")]
    else:
        tokens = [a.tokens] * a.ranks
    generate(a.out, a.ranks, a.experts, a.hidden, a.topk, tokens, a.mask_prob, a.zipf,
             a.fp8, a.seed, a.max_tokens, a.invalid, a.bad_rank, a.probes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
