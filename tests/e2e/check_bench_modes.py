#!/usr/bin/env python3
"""epx bench end to end in the modes its own checks cover: default (push), --zero-copy
(combine pulls the experts' rows in place), --ring-rows (bounded dispatch rings and
combine rounds) and --cached. Without zero-copy views every call goes rows first (a
dispatch right after a combine, a combine right after a dispatch: the rows before the
header exchange); with views, or the ring, the header exchange comes first.
Each run must finish, report no warning (the bench cross-checks epx's byte counters against
an independent count of the routing, and the payload of every rank against the reference),
and say which dispatch and combine paths ran.

    tests/e2e/check_bench_modes.py --epx build/src/tools/epx
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# name, extra options, combine pulled, dispatch data_first, combine data_first
CASES = [
    ("push (fresh dispatch rows first into per-source stretches)", [], False, True, True),
    ("zero-copy pull", ["--zero-copy"], True, False, False),
    ("bounded rings", ["--ring-rows", "8"], False, False, False),
    ("zero-copy threads", ["--zero-copy", "--transport", "threads"], True, False, False),
    ("cached, rows first", ["--cached"], False, True, True),
    ("cached zero-copy (views held: header first)", ["--cached", "--zero-copy"], True, False, False),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epx", required=True)
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra, pulled, dispatch_first, combine_first in CASES:
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
                for op, want in (("dispatch", dispatch_first), ("combine", combine_first)):
                    if report[op].get("data_first") != want:
                        problems.append("%s data_first = %s, expected %s" % (op, report[op].get("data_first"), want))
            print("%s: %s %s" % ("FAIL" if problems else "PASS", name, "; ".join(problems)))
            failures += bool(problems)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
