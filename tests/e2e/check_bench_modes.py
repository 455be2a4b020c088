#!/usr/bin/env python3
"""epx bench end to end in the modes its own checks cover: default (one-copy outputs in the
output pool; the combine exchanges first and pulls the identity expert's y, that recv_x, in
place; under --replies-first-max — 160K by default, these outputs are ~350 KB — it goes
replies first, pushing), the old
copying default (--output-pool 0: every call goes rows first — a dispatch right after a
combine, a combine right after a dispatch: the rows before the header exchange), --zero-copy
(combine pulls the experts' rows in place), --ring-rows (bounded dispatch rings and combine
rounds) and --cached. With views or the ring the header exchange comes first; with the
output pool it comes first for every dispatch and for the combines it does not let go first.
Each run must finish, report no warning (the bench cross-checks epx's byte counters against
an independent count of the routing, and the payload of every rank against the reference),
say which dispatch and combine paths ran and where recv_x came from.

    tests/e2e/check_bench_modes.py --epx build/src/tools/epx
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# name, extra options, combine pulled, dispatch data_first, combine data_first, recv_x (one_copy/copy/view)
CASES = [
    ("one copy (default): y in place, pull", [], True, False, False, "one_copy"),
    ("one copy: a combine under --replies-first-max, replies first", ["--replies-first-max", "16M"], False, False, True, "one_copy"),
    ("copy, push (fresh dispatch rows first into per-source stretches)", ["--output-pool", "0"], False, True, True, "copy"),
    ("zero-copy pull", ["--zero-copy"], True, False, False, "view"),
    ("bounded rings", ["--ring-rows", "8"], False, False, False, "copy"),
    ("zero-copy threads", ["--zero-copy", "--transport", "threads"], True, False, False, "view"),
    ("one copy threads, replies first", ["--transport", "threads", "--replies-first-max", "16M"], False, False, True, "one_copy"),
    ("one copy threads, pull", ["--transport", "threads"], True, False, False, "one_copy"),
    ("cached one copy", ["--cached"], True, False, False, "one_copy"),
    ("cached one copy, replies first", ["--cached", "--replies-first-max", "16M"], False, False, True, "one_copy"),
    ("cached copy, rows first", ["--cached", "--output-pool", "0"], False, True, True, "copy"),
    ("cached zero-copy (views held: header first)", ["--cached", "--zero-copy"], True, False, False, "view"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epx", required=True)
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra, pulled, dispatch_first, combine_first, output in CASES:
            out = Path(tmp) / "bench.json"
            cmd = [args.epx, "bench", "--ranks", "4", "--tokens", "96", "--hidden", "512", "--iters", "2",
                   "--warmup", "1", "--counters-overhead", "0", "--no-progress", "--json", str(out)] + extra
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            problems = []
            if run.returncode != 0:
                problems.append("exit %d: %s" % (run.returncode, run.stderr.strip()[-400:]))
            else:
                report = json.loads(out.read_text())
                if report.get("warnings"):
                    problems.append("warnings: %s" % report["warnings"])
                if report["combine"].get("pulled") != pulled:
                    problems.append("combine pulled = %s, expected %s" % (report["combine"].get("pulled"), pulled))
                kinds = report.get("output", {})
                calls = sum(kinds.get(k, 0) for k in ("one_copy", "copy", "view"))
                if calls == 0 or kinds.get(output) != calls:
                    problems.append("recv_x: %s, expected every dispatch %s" % (kinds, output))
                for op, want in (("dispatch", dispatch_first), ("combine", combine_first)):
                    if report[op].get("data_first") != want:
                        problems.append("%s data_first = %s, expected %s" % (op, report[op].get("data_first"), want))
            print("%s: %s %s" % ("FAIL" if problems else "PASS", name, "; ".join(problems)))
            failures += bool(problems)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
