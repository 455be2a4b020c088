#!/usr/bin/python3
"""Writes the fuzz targets' seed corpus (fuzz/corpus/<target>/): small valid inputs of
every kind plus a few near-misses. Deterministic; run it again after changing a format:
    /usr/bin/python3 fuzz/make_corpus.py"""
import json
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")
SEP = b"EPX|"
rng = random.Random(17)


def npy(descr, shape, payload):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else ""))
    pad = (64 - (10 + len(d) + 1) % 64) % 64
    header = d + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


def input_set(P, E, H, K, S, with_c=False, fp8=False):
    meta = {"num_ranks": P, "num_experts": E, "hidden": H, "num_topk": K}
    if with_c:
        meta["num_max_tokens_per_rank"] = S
    chunks = [json.dumps(meta).encode()]
    for r in range(P):
        idx = []
        for t in range(S):
            experts = rng.sample(range(E), K)
            idx += [e if rng.random() > 0.1 else -1 for e in experts]
        chunks.append(npy("<i8", (S, K), struct.pack("<%dq" % len(idx), *idx)))
        chunks.append(npy("<f4", (S, K), struct.pack("<%df" % (S * K), *[rng.random() for _ in range(S * K)])))
        chunks.append(npy("<u2", (S, H), bytes(rng.getrandbits(8) & 0x3f for _ in range(2 * S * H))))
    return SEP.join(chunks)


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    # .npy files: every dtype the reader accepts, 0-d, 1-d, 2-d, v2 header, near-misses.
    for i, (descr, size) in enumerate([("<u2", 2), ("|u1", 1), ("<f4", 4), ("<f8", 8), ("<i8", 8), ("<i4", 4),
                                       ("|b1", 1), ("<u8", 8), ("<i2", 2), ("|i1", 1)]):
        write("fuzz_npy", "dtype_%d" % i, npy(descr, (3, 2), bytes(6 * size)))
    write("fuzz_npy", "scalar", npy("<f4", (), bytes(4)))
    write("fuzz_npy", "vector", npy("<i8", (5,), bytes(40)))
    write("fuzz_npy", "empty", npy("<f4", (0, 7), b""))
    write("fuzz_npy", "truncated", npy("<f4", (4, 4), bytes(10)))
    write("fuzz_npy", "bigendian", npy(">f4", (2,), bytes(8)))
    v2 = npy("<f4", (2,), bytes(8)).replace(b"\x01\x00", b"\x02\x00", 1)
    write("fuzz_npy", "v2_header", v2[:8] + struct.pack("<I", struct.unpack("<H", v2[8:10])[0]) + v2[10:])
    # meta.json
    for i, m in enumerate([{"num_ranks": 2, "num_experts": 4, "hidden": 128, "num_topk": 2},
                           {"num_ranks": 1, "num_experts": 1, "hidden": 1, "num_topk": 1, "num_max_tokens_per_rank": 0},
                           {"num_ranks": 8, "num_experts": 256, "hidden": 7168, "num_topk": 8, "num_max_tokens_per_rank": 4096}]):
        write("fuzz_meta", "meta_%d" % i, json.dumps(m).encode())
    write("fuzz_meta", "trailing", b'{"num_ranks": 2, "num_experts": 4, "hidden": 128, "num_topk": 2} x')
    # topology: byte 0 = rank count - 1, then the JSON (or a spec)
    ranks = [{"rank": r, "server": r // 4, "lane": r % 4} for r in range(8)]
    write("fuzz_topology", "servers", bytes([7]) + json.dumps({"name": "two servers", "ranks": ranks}).encode())
    write("fuzz_topology", "flat", bytes([3]) + json.dumps({"ranks": [{"rank": r} for r in range(4)]}).encode())
    write("fuzz_topology", "spec", bytes([15]) + b"builtin:servers:4")
    write("fuzz_topology", "spec128", bytes([127]) + b"builtin:supernode128")
    # input sets (replay and bench routing share the format)
    sets = [input_set(2, 4, 128, 2, 3), input_set(1, 2, 64, 1, 4, with_c=True), input_set(3, 6, 32, 3, 5),
            input_set(4, 8, 16, 2, 2, with_c=True)]
    for target in ("fuzz_replay", "fuzz_bench_routing"):
        for i, s in enumerate(sets):
            write(target, "set_%d" % i, s)


if __name__ == "__main__":
    sys.exit(main())
