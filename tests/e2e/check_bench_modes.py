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
say which dispatch and combine paths ran and where recv_x came from. Then an elastic run with a
fault schedule (--elastic --kill --join) must report the loss and the admission it caused.

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
    problems = check_elastic(args.epx)
    print("%s: %s %s" % ("FAIL" if problems else "PASS", "elastic: a rank killed, a rank admitted", "; ".join(problems)))
    failures += bool(problems)
    sys.exit(1 if failures else 0)


def check_elastic(epx):
    """--elastic with a fault schedule: the table has the loss (4 -> 3 ranks at iteration 3,
    with its detect / agree / rebuild times) and the join (3 -> 4 at iteration 7, with its
    admission time), three stretches with the rank counts between the events, and the lost
    rank named."""
    cmd = [epx, "bench", "--elastic", "--ranks", "4", "--tokens", "64", "--hidden", "256", "--topk", "2",
           "--experts", "8", "--iters", "12", "--kill", "2@3", "--join", "@7", "--timeout-ms", "10000"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        return ["exit %d: %s" % (run.returncode, run.stderr.strip()[-400:])]
    rows = [line.split() for line in run.stdout.splitlines()]
    problems = []
    lost = [r for r in rows if r[:2] == ["rank", "lost"]]
    joined = [r for r in rows if r[:1] == ["join"]]
    if len(lost) != 1 or lost[0][2:4] != ["3", "4->3"] or not all(float(x) >= 0 for x in lost[0][4:8]):
        problems.append("loss row: %s, expected 'rank lost 3 4->3' and four times" % lost)
    if len(joined) != 1 or joined[0][1:3] != ["7", "3->4"] or float(joined[0][-1]) <= 0:
        problems.append("join row: %s, expected 'join 7 3->4' and an admission time" % joined)
    stretches = [r[:3] for r in rows if r and "-" in r[0] and r[0].replace("-", "").isdigit()]
    if stretches != [["0-2", "3", "4"], ["4-6", "3", "3"], ["7-11", "5", "4"]]:
        problems.append("stretches: %s, expected 0-2 at 4 ranks, 4-6 at 3, 7-11 at 4" % stretches)
    if "lost ranks: 2" not in run.stdout:
        problems.append("the lost rank (2) is not named")
    return problems


if __name__ == "__main__":
    main()
