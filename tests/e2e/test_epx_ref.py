#!/usr/bin/python3
"""Self-tests of the numpy reference epx_ref.py on hand-worked cases.

    /usr/bin/python3 tests/e2e/test_epx_ref.py

The expected numbers below are worked out by hand from docs/spec.md (the working
is in the comments); they do not come from running the reference.
"""

import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

sys.dont_write_bytecode = True  # keep tests/e2e free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import epx_ref as ref  # noqa: E402
import gen_case  # noqa: E402

# bf16 bit patterns used below
ONE = 0x3F80       # 1.0
TWO = 0x4000       # 2.0
M1_5 = 0xBFC0      # -1.5
HALF = 0x3F00      # 0.5
M3 = 0xC040        # -3.0


def write_case(root, P, E, H, K, ranks, C=None):
    """ranks: list of (topk_idx rows, topk_weights rows, x value per token
    (bf16 bits, the whole row) or ('fp8', codes[S,H], scales[S,H/128]))."""
    meta = {"num_ranks": P, "num_experts": E, "hidden": H, "num_topk": K}
    if C is not None:
        meta["num_max_tokens_per_rank"] = C
    os.makedirs(root)
    with open(os.path.join(root, "meta.json"), "w") as f:
        json.dump(meta, f)
    for r, (idx, w, x) in enumerate(ranks):
        d = os.path.join(root, "rank%d" % r)
        os.makedirs(d)
        np.save(os.path.join(d, "topk_idx.npy"), np.array(idx, dtype="<i8").reshape(-1, K))
        np.save(os.path.join(d, "topk_weights.npy"), np.array(w, dtype="<f4").reshape(-1, K))
        if isinstance(x, tuple) and x[0] == "fp8":
            np.save(os.path.join(d, "x_fp8.npy"), np.asarray(x[1], dtype="|u1"))
            np.save(os.path.join(d, "x_scales.npy"), np.asarray(x[2], dtype="<f4"))
        else:
            rows = np.array([[v] * H for v in x], dtype="<u2").reshape(-1, H)
            np.save(os.path.join(d, "x.npy"), rows)
    return ref.load_case(root)


def const_rows(values, H):
    return np.array([[v] * H for v in values], dtype="<u2").reshape(-1, H)


class Bf16(unittest.TestCase):
    def test_round_nearest_even(self):
        f = np.array([1.0, 513.0, 1026.0, 128.5, 129.5, -3072.0, 0.0, -0.0,
                      np.float32(1.0) + np.float32(2.0 ** -8),  # tie -> even (down)
                      np.float32(1.0) + np.float32(3 * 2.0 ** -8),  # tie -> even (up)
                      np.float32(1.0) + np.float32(2.0 ** -8) + np.float32(2.0 ** -20),
                      np.inf, -np.inf, 3.4028235e38], dtype="<f4")
        got = ref.f32_to_bf16(f).tolist()
        self.assertEqual(got, [0x3F80, 0x4400, 0x4480, 0x4300, 0x4302, 0xC540, 0x0000, 0x8000,
                               0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xFF80, 0x7F80])

    def test_nan_stays_nan(self):
        f = np.array([0x7F800001, 0xFFC00000, 0x7FFFFFFF], dtype=np.uint32).view("<f4")
        out = ref.bf16_to_f32(ref.f32_to_bf16(f))
        self.assertTrue(np.all(np.isnan(out)))

    def test_widen_exact(self):
        self.assertEqual(ref.bf16_to_f32(np.array([0x3F83], "<u2"))[0], np.float32(1.0234375))
        self.assertEqual(ref.bf16_to_f32(np.array([0x0001], "<u2")).view(np.uint32)[0], 0x00010000)

    def test_e4m3(self):
        t = ref.E4M3_TO_F32
        self.assertEqual(t[0x7E], 448.0)
        self.assertEqual(t[0xFE], -448.0)
        self.assertEqual(t[0x38], 1.0)
        self.assertEqual(t[0x40], 2.0)
        self.assertEqual(t[0xC4], -3.0)
        self.assertEqual(t[0x01], 2.0 ** -9)
        self.assertEqual(t[0x08], 2.0 ** -6)
        self.assertTrue(np.isnan(t[0x7F]) and np.isnan(t[0xFF]))
        self.assertEqual(np.float32(t[0x80]).view(np.uint32), 0x80000000)

    def test_expert_factor(self):
        self.assertEqual([float(ref.expert_factor(n)) for n in range(8)],
                         [1.0, 512.0, 196608.0, 67108864.0, 5.0, 1536.0, 458752.0, 134217728.0])


class HandWorked(unittest.TestCase):
    """P=2, E=4 (L=2), H=128, K=2.

    rank 0: t0 experts [0, 3] w [0.5, 0.25]  x = 1.0
            t1 experts [1, 0] w [2.0, 1.0]   x = 2.0
            t2 experts [-1,-1] w [7, 7]      x = -1.5
    rank 1: t0 experts [2, -1] w [1.5, 9]    x = 0.5
            t1 experts [3, 1] w [0.75, -1.0] x = -3.0
    """

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="epx_ref_test_")
        self.case = write_case(os.path.join(self.tmp, "in"), 2, 4, 128, 2, [
            ([[0, 3], [1, 0], [-1, -1]], [[0.5, 0.25], [2.0, 1.0], [7, 7]], [ONE, TWO, M1_5]),
            ([[2, -1], [3, 1]], [[1.5, 9], [0.75, -1.0]], [HALF, M3]),
        ])

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_layout(self):
        res = ref.compute(self.case, "compact")
        r0, r1 = res.ranks
        self.assertEqual(r0["num_tokens_per_rank"].tolist(), [2, 1])
        self.assertEqual(r0["num_tokens_per_expert"].tolist(), [2, 1, 0, 1])
        self.assertEqual(r0["is_token_in_rank"].tolist(), [[1, 1], [1, 0], [0, 0]])
        self.assertEqual(r1["num_tokens_per_rank"].tolist(), [1, 2])
        self.assertEqual(r1["num_tokens_per_expert"].tolist(), [0, 1, 1, 1])
        self.assertEqual(r1["is_token_in_rank"].tolist(), [[0, 1], [1, 1]])
        self.assertEqual(r0["is_token_in_rank"].dtype.str, "|u1")
        self.assertEqual(r0["num_tokens_per_rank"].dtype.str, "<i8")

    def test_expanded(self):
        res = ref.compute(self.case, "expanded", alignment=1, deterministic=True)
        r0, r1 = res.ranks
        # dest 0: j0 (e0) <- (0,0,0), (0,1,1); j1 (e1) <- (0,1,0), (1,1,1)
        self.assertEqual(r0["recv_src"].tolist(), [[0, 0, 0], [0, 1, 1], [0, 1, 0], [1, 1, 1]])
        self.assertEqual(r0["expert_offsets"].tolist(), [0, 2, 4])
        self.assertEqual(r0["num_recv_tokens_per_expert"].tolist(), [2, 2])
        self.assertEqual(r0["recv_weights"].tolist(), [0.5, 1.0, 2.0, -1.0])
        self.assertEqual(r0["recv_x"][:, 0].tolist(), [ONE, TWO, TWO, M3])
        # dest 1: j0 (e2) <- (1,0,0); j1 (e3) <- (0,0,1), (1,1,0)
        self.assertEqual(r1["recv_src"].tolist(), [[1, 0, 0], [0, 0, 1], [1, 1, 0]])
        self.assertEqual(r1["expert_offsets"].tolist(), [0, 1, 3])
        self.assertEqual(r1["num_recv_tokens_per_expert"].tolist(), [1, 2])
        self.assertEqual(r1["recv_weights"].tolist(), [1.5, 0.25, 0.75])
        self.assertEqual(r1["recv_x"][:, 0].tolist(), [HALF, ONE, M3])
        # expert: c(j0)=1, c(j1)=512.  y dest0 = [1, 2, 1024, -1536], dest1 = [0.5, 512, -1536]
        # r0 t0: groups d0{k0}:1, d1{k1}:512 -> 0+1+512 = 513 -> bf16 512 (ulp 4) = 0x4400
        # r0 t1: d0{k0,k1}: bf16(0+1024+2 = 1026) = 1024 (ulp 8) -> 0x4480
        # r0 t2: no slot -> 0
        # r1 t0: 0.5 -> 0x3F00;  r1 t1: d1{k0} -1536, d0{k1} -1536 -> -3072 = 0xC540
        self.assertEqual(r0["combined_x"].tolist(), const_rows([0x4400, 0x4480, 0x0000], 128).tolist())
        self.assertEqual(r1["combined_x"].tolist(), const_rows([0x3F00, 0xC540], 128).tolist())
        self.assertEqual(r0["combined_x"].dtype.str, "<u2")

    def test_expanded_aligned_worst(self):
        res = ref.compute(self.case, "expanded", alignment=4, worst=10)
        r0, r1 = res.ranks
        self.assertEqual(r0["expert_offsets"].tolist(), [0, 4, 8])
        self.assertEqual(r0["recv_src"].tolist(),
                         [[0, 0, 0], [0, 1, 1], [-1, -1, -1], [-1, -1, -1],
                          [0, 1, 0], [1, 1, 1]] + [[-1, -1, -1]] * 4)
        self.assertEqual(r0["recv_weights"].tolist(), [0.5, 1.0, 0, 0, 2.0, -1.0, 0, 0, 0, 0])
        self.assertEqual(res.unspecified_rows[0].tolist(),
                         [False, False, True, True, False, False, True, True, True, True])
        self.assertEqual(r1["expert_offsets"].tolist(), [0, 4, 8])
        self.assertEqual(r1["recv_x"].shape, (10, 128))
        self.assertEqual(res.needed_rows, [8, 8])
        # combine does not depend on the placement
        self.assertEqual(r0["combined_x"].tolist(), const_rows([0x4400, 0x4480, 0x0000], 128).tolist())
        zp = ref.compute(self.case, "expanded", alignment=4, worst=10, zero_padding=True)
        self.assertFalse(np.any(zp.unspecified_rows[0]))
        self.assertFalse(np.any(zp.ranks[0]["recv_x"][2:4]))

    def test_worst_too_small(self):
        with self.assertRaises(ref.RefError) as cm:
            ref.compute(self.case, "expanded", alignment=4, worst=7)
        self.assertEqual(cm.exception.rank, 0)
        ref.compute(self.case, "expanded", alignment=4, worst=8)  # exactly enough
        with self.assertRaises(ref.RefError):
            ref.compute(self.case, "compact", worst=2)
        ref.compute(self.case, "compact", worst=3)

    def test_weighted(self):
        res = ref.compute(self.case, "expanded", weighted=True)
        r0, r1 = res.ranks
        # r0 t0: d0 bf16(0 + 1*0.5) = 0.5, d1 bf16(512*0.25) = 128 -> 128.5 tie -> 128 = 0x4300
        # r0 t1: d0 bf16(0 + 1024*2 + 2*1) = bf16(2050) = 2048 (ulp 16) = 0x4500
        # r1 t0: 0.5*1.5 = 0.75 = 0x3F40
        # r1 t1: groups by largest k: d1{k0} -1536*0.75 = -1152, d0{k1} -1536*-1 = 1536
        #        0 + -1152 + 1536 = 384 = 0x43C0
        self.assertEqual(r0["combined_x"].tolist(), const_rows([0x4300, 0x4500, 0x0000], 128).tolist())
        self.assertEqual(r1["combined_x"].tolist(), const_rows([0x3F40, 0x43C0], 128).tolist())
        with self.assertRaises(ref.RefError):
            ref.compute(self.case, "compact", weighted=True)

    def test_compact(self):
        res = ref.compute(self.case, "compact")
        r0, r1 = res.ranks
        self.assertEqual(r0["recv_src"].tolist(), [[0, 0], [0, 1], [1, 1]])
        self.assertEqual(r0["recv_topk_idx"].tolist(), [[0, -1], [1, 0], [-1, 1]])
        self.assertEqual(r0["recv_topk_weights"].tolist(), [[0.5, 0], [2.0, 1.0], [0, -1.0]])
        self.assertEqual(r0["num_recv_tokens_per_expert"].tolist(), [2, 2])
        self.assertEqual(r0["recv_x"][:, 0].tolist(), [ONE, TWO, M3])
        self.assertEqual(r1["recv_src"].tolist(), [[0, 0], [1, 0], [1, 1]])
        self.assertEqual(r1["recv_topk_idx"].tolist(), [[-1, 1], [0, -1], [1, -1]])
        self.assertEqual(r1["recv_topk_weights"].tolist(), [[0, 0.25], [1.5, 0], [0.75, 0]])
        self.assertEqual(r1["num_recv_tokens_per_expert"].tolist(), [1, 2])
        self.assertNotIn("recv_weights", r0)
        self.assertNotIn("expert_offsets", r0)
        # n per row: dest0 [0, 1, 1] -> y [1, 1024, -1536]; dest1 [1, 0, 1] -> [512, 0.5, -1536]
        # r0 t0: 1 + 512 = 513 -> 512;  r0 t1: 1024;  r1 t0: 0.5;  r1 t1: -1536 + -1536
        self.assertEqual(r0["combined_x"].tolist(), const_rows([0x4400, 0x4480, 0x0000], 128).tolist())
        self.assertEqual(r1["combined_x"].tolist(), const_rows([0x3F00, 0xC540], 128).tolist())

    def test_compact_worst(self):
        res = ref.compute(self.case, "compact", worst=5)
        r0 = res.ranks[0]
        self.assertEqual(r0["recv_src"].tolist(), [[0, 0], [0, 1], [1, 1], [-1, -1], [-1, -1]])
        self.assertEqual(r0["recv_topk_idx"][3:].tolist(), [[-1, -1], [-1, -1]])
        self.assertEqual(r0["recv_topk_weights"][3:].tolist(), [[0, 0], [0, 0]])
        self.assertEqual(res.unspecified_rows[0].tolist(), [False, False, False, True, True])


class SummationOrder(unittest.TestCase):
    """x = 0x3F83 = 1.0234375 everywhere.  Three terms:
        A = bf16(x * c(3)) = x * 2^26         = 68681728
        B = bf16(x * c(7)) = x * 2^27 = 2A    = 137363456
        C = bf16(x * c(8)) = bf16(9.2109375)  = 9.1875
    3A = 206045184 lies exactly half-way between two bf16 values (196.5 * 2^20).
      (A + B) + C: f32 ulp at 2^27 is 16, 9.1875 > 8 -> 3A + 16 -> bf16 rounds up
                   to 197 * 2^20 = 206569472 = 0x4D45
      (A + C) + B: f32 ulp at 2^26 is 8, A + 9.1875 -> A + 8; + B -> 3A + 8, a f32
                   tie -> even -> 3A; bf16 tie -> even -> 196 * 2^20 = 0x4D44
    """

    X = 0x3F83

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="epx_ref_order_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_terms(self):
        x = ref.bf16_to_f32(np.array([self.X], "<u2"))
        A = ref.bf16_to_f32(ref.f32_to_bf16(x * ref.expert_factor(3)))[0]
        B = ref.bf16_to_f32(ref.f32_to_bf16(x * ref.expert_factor(7)))[0]
        C = ref.bf16_to_f32(ref.f32_to_bf16(x * ref.expert_factor(8)))[0]
        self.assertEqual((A, B, C), (68681728.0, 137363456.0, 9.1875))

    def test_partial_ascending_k(self):
        # P=1, E=L=9, slots k0 -> j3 (A), k1 -> j8 (C), k2 -> j7 (B): one group,
        # summed in ascending k: ((0 + A) + C) + B -> 0x4D44 (descending k would give 0x4D45)
        case = write_case(os.path.join(self.tmp, "in"), 1, 9, 128, 3,
                          [([[3, 8, 7]], [[1, 1, 1]], [self.X])])
        res = ref.compute(case, "expanded")
        self.assertEqual(res.ranks[0]["combined_x"].tolist(), const_rows([0x4D44], 128).tolist())
        case2 = write_case(os.path.join(self.tmp, "in2"), 1, 9, 128, 3,
                           [([[7, 8, 3]], [[1, 1, 1]], [self.X])])
        res2 = ref.compute(case2, "expanded")
        self.assertEqual(res2.ranks[0]["combined_x"].tolist(), const_rows([0x4D45], 128).tolist())

    def test_groups_by_largest_k(self):
        # P=3, L=9 (E=27).  k0 -> e 9+8 (d1, j8: C), k1 -> e 3 (d0, j3: A),
        # k2 -> e 18+7 (d2, j7: B), k3 -> e 9+0 (d1, j0: x).
        # d1 partial = bf16(0 + 9.1875 + 1.0234375 = 10.2109375) = 10.1875 (ulp 1/16): C'
        # groups by largest k: d0 (max 1) A, d2 (max 2) B, d1 (max 3) C'
        #   (A + B) + C' = 3A + 16 -> 0x4D45
        # (smallest-k order C', A, B or destination order A, C', B give 3A -> 0x4D44)
        ranks = [([[17, 3, 25, 9]], [[1, 1, 1, 1]], [self.X]), ([], [], []), ([], [], [])]
        case = write_case(os.path.join(self.tmp, "in"), 3, 27, 128, 4, ranks)
        res = ref.compute(case, "expanded")
        self.assertEqual(res.ranks[0]["combined_x"].tolist(), const_rows([0x4D45], 128).tolist())
        self.assertEqual(res.ranks[1]["combined_x"].shape, (0, 128))

    def test_compact_destination_order(self):
        # P=3, L=9 (E=27), compact.  k0 -> e 18+7 (d2: n=7, B), k1 -> e 3 (d0: n=3, A),
        # k2 -> e 9+3, k3 -> e 9+5 (d1: n = 3+5 = 8, C).
        # destinations ascending: (A + C) + B -> 0x4D44 (first-k order B, A, C -> 0x4D45)
        ranks = [([[25, 3, 12, 14]], [[1, 1, 1, 1]], [self.X]), ([], [], []), ([], [], [])]
        case = write_case(os.path.join(self.tmp, "in"), 3, 27, 128, 4, ranks)
        res = ref.compute(case, "compact")
        self.assertEqual(res.ranks[1]["recv_topk_idx"].tolist(), [[-1, -1, 3, 5]])
        self.assertEqual(res.ranks[0]["combined_x"].tolist(), const_rows([0x4D44], 128).tolist())


class Fp8(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="epx_ref_fp8_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_fp8(self):
        # P=1, E=2, H=256, K=1, one token on expert 1 (j=1, c=512).
        # block 0: code 0x40 (2.0) * scale 0.25 = 0.5 -> y = 256 = 0x4380
        # block 1: code 0xC4 (-3.0) * scale 3.0 = -9 -> y = -4608 = 0xC590
        # column 5: code 0x01 (2^-9) * 0.25 = 2^-11 -> y = 2^-2 = 0x3E80
        codes = np.zeros((1, 256), dtype=np.uint8)
        codes[0, :128] = 0x40
        codes[0, 128:] = 0xC4
        codes[0, 5] = 0x01
        scales = np.array([[0.25, 3.0]], dtype="<f4")
        case = write_case(os.path.join(self.tmp, "in"), 1, 2, 256, 1,
                          [([[1]], [[0.5]], ("fp8", codes, scales))])
        for layout in ("expanded", "compact"):
            res = ref.compute(case, layout)
            r0 = res.ranks[0]
            self.assertNotIn("recv_x", r0)
            self.assertEqual(r0["recv_x_fp8"].tolist(), codes.tolist())
            self.assertEqual(r0["recv_x_fp8"].dtype.str, "|u1")
            self.assertEqual(r0["recv_x_scales"].tolist(), scales.tolist())
            want = [0x4380] * 128 + [0xC590] * 128
            want[5] = 0x3E80
            self.assertEqual(r0["combined_x"].tolist(), [want], layout)

    def test_fp8_compact_n(self):
        # P=1, E=4, K=2, compact: local experts {1, 2} -> n = 3 -> c = 2^26
        # code 0x38 (1.0) * scale 2^-20 -> v = 2^-20 -> y = 2^6 = 0x4280
        codes = np.full((1, 128), 0x38, dtype=np.uint8)
        scales = np.array([[2.0 ** -20]], dtype="<f4")
        case = write_case(os.path.join(self.tmp, "in"), 1, 4, 128, 2,
                          [([[2, 1]], [[1, 1]], ("fp8", codes, scales))])
        res = ref.compute(case, "compact")
        self.assertEqual(res.ranks[0]["combined_x"].tolist(), [[0x4280] * 128])
        # expanded: j1 -> 2^-20*512 = 2^-11, j2 -> 2^-20 * 3*2^16 = 0.1875;
        # one group, ascending k: k0 (j2) then k1 (j1): 0.1875 + 2^-11 = 0.18798828125
        # -> bf16 (ulp 2^-10 in [0.125,0.25)): 192.5 ulps -> tie -> even 192 -> 0.1875 = 0x3E40
        res = ref.compute(case, "expanded")
        self.assertEqual(res.ranks[0]["combined_x"].tolist(), [[0x3E40] * 128])


class Validation(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="epx_ref_val_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def gen(self, name, **kw):
        args = dict(ranks=3, experts=6, hidden=128, topk=2, tokens=[4, 0, 5], seed=3)
        args.update(kw)
        out = os.path.join(self.tmp, name)
        gen_case.generate(out, **args)
        return out

    def test_gen_valid(self):
        for fp8 in (False, True):
            case = ref.load_case(self.gen("ok%d" % fp8, fp8=fp8, mask_prob=0.3, zipf=1.1,
                                          tokens=[40, 0, 17]))
            for r in range(3):
                idx = case.topk_idx[r]
                for t in range(idx.shape[0]):
                    v = idx[t][idx[t] >= 0]
                    self.assertEqual(len(set(v.tolist())), len(v))
                if fp8:
                    self.assertFalse(np.any((case.x_fp8[r] & 0x7F) == 0x7F))
                else:
                    self.assertTrue(np.all(np.isfinite(ref.bf16_to_f32(case.x[r]))))

    def test_gen_invalid(self):
        cases = {
            "idx_out_of_range": 2, "idx_below_minus_one": 0, "dup_expert": 2,
            "s_gt_c": 2, "weights_shape": 0, "x_rows": 2, "x_dtype": 2, "idx_cols": 0,
        }
        for kind, bad in cases.items():
            with self.assertRaises(ref.RefError, msg=kind) as cm:
                ref.load_case(self.gen(kind, invalid=kind, bad_rank=bad))
            self.assertEqual(cm.exception.rank, bad, kind)
        with self.assertRaises(ref.RefError):
            ref.load_case(self.gen("emodp", experts=8))
        with self.assertRaises(ref.RefError):
            ref.load_case(self.gen("fp8h", hidden=64, fp8=True))
        with self.assertRaises(ValueError):
            ref.load_case(self.gen("meta", invalid="meta_malformed"))


class CrossCheck(unittest.TestCase):
    """The combine of epx_ref against the second, vectorised implementation
    gen_case uses to build its order probes, token by token; and the probes
    really make the wrong orders show."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="epx_ref_cross_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def check(self, name, kinds, **g):
        out = os.path.join(self.tmp, name)
        gen_case.generate(out, **g)
        case = ref.load_case(out)
        L = case.L
        shown = {}
        for kind in kinds:
            layout = "compact" if kind == "compact" else "expanded"
            res = ref.compute(case, layout, 4, 0, False, False, kind == "weighted")
            for r in range(case.P):
                for t in range(case.S[r]):
                    if case.fp8:
                        v = (ref.fp8_to_f32(case.x_fp8[r][t]).reshape(-1, 128)
                             * case.x_scales[r][t][:, None]).astype(ref.F32).reshape(-1)
                    else:
                        v = ref.bf16_to_f32(case.x[r][t])
                    idx, w = case.topk_idx[r][t], case.topk_weights[r][t]
                    spec = gen_case._combine_variant(v, idx, w, L, kind, "spec")
                    self.assertEqual(res.ranks[r]["combined_x"][t].tolist(), spec.tolist(),
                                     "%s %s rank %d token %d" % (name, kind, r, t))
                    for variant in gen_case.PROBE_VARIANTS[kind]:
                        alt = gen_case._combine_variant(v, idx, w, L, kind, variant)
                        shown[(kind, variant)] = shown.get((kind, variant), 0) + int((alt != spec).sum())
        return shown

    def test_bf16_probes(self):
        shown = self.check("a", ("expanded", "compact", "weighted"), ranks=4, experts=48, hidden=128,
                           topk=6, tokens=[10, 0, 7, 12], mask_prob=0.1, seed=20, probes=15)
        for key, n in shown.items():
            self.assertGreater(n, 0, "no column shows the wrong order %s" % (key,))

    def test_fp8_probes(self):
        shown = self.check("b", ("expanded", "compact", "weighted"), ranks=3, experts=27, hidden=256,
                           topk=4, tokens=[6, 11, 2], mask_prob=0.1, fp8=True, seed=22, probes=12)
        for key in (("expanded", "dest"), ("expanded", "max_k_desc"), ("compact", "dest_desc"),
                    ("compact", "min_k"), ("weighted", "dest"), ("weighted", "flat")):
            self.assertGreater(shown[key], 0, "no column shows the wrong order %s" % (key,))

    def test_random_small_L(self):
        self.check("c", ("expanded", "compact", "weighted"), ranks=8, experts=16, hidden=128,
                   topk=4, tokens=[5, 0, 3, 9, 1, 0, 2, 4], mask_prob=0.3, zipf=1.0, seed=5, probes=6)


if __name__ == "__main__":
    unittest.main(verbosity=1)
