#!/usr/bin/python3
"""The front-door documents run as printed, and the tree has no stale references.

    /usr/bin/python3 tests/docs/check_docs.py --build build            # both checks
    /usr/bin/python3 tests/docs/check_docs.py --build build --only blocks
    /usr/bin/python3 tests/docs/check_docs.py --only lint               # needs no build
    /usr/bin/python3 tests/docs/check_docs.py --only headline           # needs no build

`blocks`: every fenced code block of README.md and docs/getting-started.md, in order, one
work directory per document:

  ```cpp     compiled with g++ -std=c++20 against a `cmake --install` of BUILD into a temporary
             prefix (a generated CMake project: find_package(epx), linking every exported target),
             then run; its output must pass the check in CPP_CHECKS whose key the block
             contains (a block without one fails).
  ```python  run as a script, as printed (/usr/bin/python3, PYTHONPATH=BUILD/python); then its
             rank function (a name in PY_CHECKS) is loaded from the file and run again under
             epx.launch, and what every rank returns is checked against an independent dense
             torch computation of the same result (a block without such a function fails).
  ```bash    run by bash -e -o pipefail, the block's lines as one script; commands matching
             SKIPPED (the two top-level commands, installs) are not run, see there.
  ```cmake   not code by itself: written to the file its marker names.
  ```text    output, not code. When it follows a block that ran (with only prose between),
             each of its lines must be a line of that block's output: numbers, runs of blanks
             and the few words a run picks (VARIES) may differ, "..." lines stand for
             omitted ones.

A block directly after an HTML comment `<!-- file: PATH -->` is also written to PATH in the
work directory, where later blocks of the document find it (a C++ project, a script that a
bash block runs). The work directory holds a symlink to each top-level entry of the
checkout, so the documents' relative paths (build/src/tools/epx, tests/e2e/...) resolve
while whatever a block writes lands in the temporary directory; HOME points into it as well.
`cmake --install build` writes build/install_manifest.txt: restored afterwards.

`headline`: the README's headline figures are the current ones of BENCHMARKS.md: each row
names its figure's id in docs/img/benchmarks.json (an HTML comment) and shows that ratio.

`lint`: no file tracked by git mentions the old contract's location ("..\u002fshared",
"shared\u002fSPEC") or a section of it as "SPEC \u00a7N" (it is docs/spec.md now: "docs/spec.md
\u00a7N", "spec.md \u00a7N" inside docs/), or an issue number ("issue #N", "Issue #N §M", "issues #N, #M",
"(#N)") — a comment or a document says why, not which ticket asked.

Prints PASS / FAIL / SKIP per check and ends with "N passed, N failed"; exits non-zero if
any check failed. Everything happens in a temporary directory, removed at the end.
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DOCS = ["README.md", "docs/getting-started.md"]
PY = "/usr/bin/python3"

# Bash commands that are not run, each with the reason (a line that starts with the pattern;
# a comment after it does not matter). The substitute, if any, runs in its place: the same
# program without the install and build around it, whose output the text block after the
# block is checked against.
SKIPPED = [
    (r"bash scripts/run\.sh bench\b",
     "the main job installs packages and builds build/ first; its epx bench runs instead, on the existing build",
     "build/src/tools/epx bench --iters 3 --warmup 1 --tokens 128 --no-progress"),
    (r"bash scripts/run\.sh test\b", "runs every test, this one included", None),
    (r"bash scripts/run\.sh build\b", "builds build/, which this check is given", None),
    (r"(sudo )?apt(-get)? ", "installs Debian packages", None),
    (r"/usr/bin/python3 -m venv ", "install step: tests/packaging/check_install.sh makes fresh venvs", None),
    (r"\S*pip install ", "install step: tests/packaging/check_install.sh runs pip install . in a fresh venv", None),
    (r"~/epx-venv/bin/", "uses the venv the skipped install step makes", None),
]

# Words a run of the tools chooses, so that an output excerpt in a document may show another.
VARIES = [
    r"plan|notify|put_issue|wait_data|barrier|epilogue|other",  # a bench's dominant phase
    r"the streaming copy|streaming copy|memcpy",                 # the faster of the two copies
    r"workers|worker",                                           # workers per rank: the machine's cores
]

BLOCK_TIMEOUT = 600  # seconds, any one block
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


# ---------------------------------------------------------------------------------------
# Results


class Report:
    def __init__(self):
        self.passed = self.failed = 0

    def ok(self, name, note=""):
        self.passed += 1
        print(f"PASS {name}" + (f" ({note})" if note else ""), flush=True)

    def fail(self, name, why):
        self.failed += 1
        print(f"FAIL {name}: {why}", flush=True)

    def skip(self, name, why):
        print(f"SKIP {name}: {why}", flush=True)


def run(cmd, cwd, env, timeout=BLOCK_TIMEOUT, shell=False):
    """(exit code, stdout + stderr); the whole process group is killed on a timeout."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, shell=shell, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True, text=True, errors="replace")
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return -1, out + f"\n[timed out after {timeout} s]"


def tail(text, n=25):
    lines = text.rstrip("\n").split("\n")
    return "\n    " + "\n    ".join(lines[-n:])


# ---------------------------------------------------------------------------------------
# Parsing the documents


class Block:
    def __init__(self, doc, line, lang, text, file, prose_before):
        self.doc, self.line, self.lang, self.text, self.file = doc, line, lang, text, file
        self.prose_before = prose_before  # lines between the previous block and this one

    @property
    def name(self):
        return f"{self.doc}:{self.line} ```{self.lang}" + (f" ({self.file})" if self.file else "")


FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
FILE_MARK = re.compile(r"^<!--\s*file:\s*(\S+)\s*-->\s*$")


def parse(doc):
    lines = open(os.path.join(REPO, doc), encoding="utf-8").read().split("\n")
    blocks, i, prose = [], 0, []
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        said = [p.strip() for p in prose if p.strip()]
        mark = FILE_MARK.match(said[-1]) if said else None
        file = mark.group(1) if mark else None
        blocks.append(Block(doc, start + 1, lang, "\n".join(body) + "\n", file, prose))
        prose = []
    return blocks


# ---------------------------------------------------------------------------------------
# Output excerpts (```text after a block that ran)


def _literal(text):
    """A regex for literal text in which any run of blanks matches any run of blanks."""
    return r"\s+".join(re.escape(tok) for tok in re.split(r"\s+", text))


VARIES_WORDS = re.compile(r"\b(?:" + "|".join(sorted((w for alt in VARIES for w in alt.split("|")), key=len, reverse=True))
                          + r")\b")


def line_pattern(line):
    """A regex for one excerpt line: numbers, blank runs and the VARIES words may differ."""
    out, pos = [], 0
    tokens = sorted([(m.start(), m.end(), "num") for m in NUMBER.finditer(line)] +
                    [(m.start(), m.end(), m.group(0)) for m in VARIES_WORDS.finditer(line)])
    for start, end, kind in tokens:
        if start < pos:
            continue
        out.append(_literal(line[pos:start]))
        if kind == "num":
            out.append(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
        else:
            out.append("(?:" + next(alt for alt in VARIES if kind in alt.split("|")) + ")")
        pos = end
    out.append(_literal(line[pos:]))
    return re.compile("".join(out))


def check_excerpt(excerpt, output):
    """None if every line of the excerpt is a line of the output, else what is missing."""
    got = [ln.rstrip() for ln in output.split("\n")]
    missing = []
    for ln in excerpt.split("\n"):
        if not ln.strip() or ln.strip() in ("...", "…"):
            continue
        pat = line_pattern(ln.strip())
        if not any(pat.fullmatch(g.strip()) for g in got):
            missing.append(ln.strip())
    return None if not missing else "not in the output: " + " | ".join(missing[:3]) + (
        f" (+{len(missing) - 3} more)" if len(missing) > 3 else "")


# ---------------------------------------------------------------------------------------
# ```cpp: compiled against an installed epx, run, output checked

# key (a string the block contains) -> (what it must print, checker(output) -> None | why)
def _all_ranks(pattern, ranks):
    def check(out):
        seen = sorted(int(r) for r in re.findall(pattern, out, re.M))
        return None if seen == list(range(ranks)) else f"expected one line /{pattern}/ per rank 0..{ranks - 1}, got ranks {seen}"
    return check


CPP_CHECKS = {
    # README: combine(dispatch(x)) == x on each of 4 ranks (expanded, identity experts, weights 0.5)
    'combine(dispatch(x)) %s x': _all_ranks(r"^rank (\d+): combine\(dispatch\(x\)\) == x$", 4),
    # getting-started: the same on 2 thread ranks, compact layout, experts applying their weights
    'combine(dispatch(x)) == x: %s': _all_ranks(r"^rank (\d+): \d+ rows received, combine\(dispatch\(x\)\) == x: yes$", 2),
}


def cpp_prefix(ctx):
    """`cmake --install BUILD` into a temporary prefix, once."""
    if "prefix" not in ctx:
        prefix = os.path.join(ctx["tmp"], "prefix")
        code, out = run(["cmake", "--install", ctx["build"], "--prefix", prefix], REPO, ctx["env"], timeout=300)
        ctx["prefix"] = prefix if code == 0 else None
        ctx["prefix_error"] = out
    return ctx["prefix"]


def installed_targets(prefix):
    """Every library target the installed package exports (epx::engine, epx::bucket, ...)."""
    names = set()
    for f in glob.glob(os.path.join(prefix, "lib*", "cmake", "epx", "epxTargets.cmake")):
        names.update(re.findall(r"add_library\((epx::\w+) ", open(f).read()))
    return sorted(names) or ["epx::engine"]


def run_cpp(block, work, ctx, rep):
    key = next((k for k in CPP_CHECKS if k in block.text), None)
    if key is None:
        rep.fail(block.name, "no output check for this block: add one to CPP_CHECKS")
        return None
    prefix = cpp_prefix(ctx)
    if prefix is None:
        rep.fail(block.name, "cmake --install failed:" + tail(ctx["prefix_error"]))
        return None
    proj = tempfile.mkdtemp(prefix="cpp-", dir=ctx["tmp"])
    with open(os.path.join(proj, "main.cpp"), "w") as f:
        f.write(block.text)
    with open(os.path.join(proj, "CMakeLists.txt"), "w") as f:
        f.write("cmake_minimum_required(VERSION 3.25)\nproject(doc_block LANGUAGES CXX)\n"
                "set(CMAKE_CXX_STANDARD 20)\nset(CMAKE_CXX_STANDARD_REQUIRED ON)\nset(CMAKE_CXX_EXTENSIONS OFF)\n"
                "find_package(epx REQUIRED)\nadd_executable(doc_block main.cpp)\n"
                "target_compile_options(doc_block PRIVATE -Wall -Werror)\n"
                f"target_link_libraries(doc_block PRIVATE {' '.join(installed_targets(prefix))})\n")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    code, out = run(["cmake", "-S", proj, "-B", os.path.join(proj, "b"), *gen, "-DCMAKE_CXX_COMPILER=g++",
                     f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], proj, ctx["env"], timeout=300)
    if code == 0:
        code, out = run(["cmake", "--build", os.path.join(proj, "b")], proj, ctx["env"], timeout=600)
    if code != 0:
        rep.fail(block.name, "does not compile (g++ -std=c++20 -Wall -Werror):" + tail(out))
        return None
    code, out = run([os.path.join(proj, "b", "doc_block")], work, ctx["env"], timeout=300)
    if code != 0:
        rep.fail(block.name, f"exit {code}:" + tail(out))
        return out
    why = CPP_CHECKS[key](out)
    if why:
        rep.fail(block.name, why + tail(out, 8))
    else:
        rep.ok(block.name, "compiled, ran, output checked")
    return out


# ---------------------------------------------------------------------------------------
# ```python: run as printed, then its rank function under epx.launch against a dense reference

# Rank functions the documents define -> the check of what every rank returns. Each runs in a
# child process (`check_docs.py --check-python FILE FUNC P`), which imports torch and epx.
PY_CHECKS = {
    "moe_step": "moe",      # README: expanded layout, weighted combine, expert e multiplies by e + 1
    "first_moe": "moe",     # getting-started: compact layout, the experts apply their weights
    "mean_grads": "mean",   # README: BucketBuffer all_reduce with scale 1 / P
}


def check_moe(results):
    """Every rank returned (x, topk_idx, topk_weights, combined_x); expert e computes (e + 1) * row and
    the combine sums weight * output over the token's K experts, so combined_x must be
    sum_k w[t, k] * (topk_idx[t, k] + 1) * x[t] — computed here densely in float64. On the way
    there are at most three bf16 roundings (the expert's output row, a rank's partial sum
    (docs/spec.md §4), the result), each within 2^-8 of its value, and every term has the sign
    of x[t] (nothing cancels): so at most 3 * 2^-8 relative apart."""
    import torch
    for r, (x, idx, w, combined) in enumerate(results):
        if combined.dtype != torch.bfloat16 or tuple(combined.shape) != tuple(x.shape):
            return f"rank {r}: combined_x is {combined.dtype} {tuple(combined.shape)}, expected bf16 {tuple(x.shape)}"
        valid = idx >= 0
        factor = (w.double() * torch.where(valid, idx + 1, torch.zeros_like(idx)).double()).sum(1, keepdim=True)
        want = factor * x.double()
        err = (combined.double() - want).abs()
        bound = want.abs() * 3 * 2 ** -8 + 1e-6
        if bool((err > bound).any()):
            t, h = (int(v) for v in (err > bound).nonzero()[0])
            return (f"rank {r}: combined_x[{t}, {h}] = {float(combined[t, h])!r}, the dense sum_k w (e + 1) x = "
                    f"{float(want[t, h])!r}: {float(err[t, h]):.4g} apart, allowed {float(bound[t, h]):.4g}")
        if not bool(valid.any()):
            return f"rank {r}: no token was routed"
    return None


def check_mean(results):
    """Every rank returned (its input, the all_reduce result); docs/spec.md §8: acc = x_0 + x_1 + ...
    in float32, member order, then times the scale — the same bits on every rank."""
    import torch
    n = len(results)
    acc = results[0][0].clone()
    for mine, _ in results[1:]:
        acc = acc + mine
    want = acc * torch.tensor(1.0 / n, dtype=torch.float32)
    for r, (_, got) in enumerate(results):
        if not torch.equal(got, want):
            bad = int((got != want).nonzero()[0][0])
            return f"rank {r}: element {bad}: {float(got[bad])!r}, expected {float(want[bad])!r} (docs/spec.md §8)"
    return None


def rank_function(text):
    """(name, ranks) of the checked rank function a Python block defines and launches, or None."""
    funcs = [f for f in PY_CHECKS if re.search(rf"^def {f}\(", text, re.M)]
    if not funcs:
        return None
    m = re.search(rf"epx\.launch\(\s*{funcs[0]}\s*,\s*(\d+)", text)
    return funcs[0], int(m.group(1)) if m else 4


def check_results(func, results):
    """None if what the ranks of `func` returned is right, else why not."""
    return {"moe": check_moe, "mean": check_mean}[PY_CHECKS[func]](results)


def check_python_child(path, func, ranks):
    """In the child: load the block, run `func` on `ranks` ranks, check what they return."""
    import importlib.util
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location("doc_block_under_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # defines the functions; the block's __main__ part does not run
    import epx
    results = epx.launch(getattr(mod, func), ranks, start_method="fork")
    why = check_results(func, results)
    if why:
        print(why)
        return 1
    print(f"{func} on {ranks} ranks: every rank's result matches the dense reference")
    return 0


def run_python(block, work, ctx, rep):
    found = rank_function(block.text)
    if found is None:
        rep.fail(block.name, "defines no rank function with a check: add one to PY_CHECKS")
        return None
    func, ranks = found
    path = os.path.join(work, block.file or f"doc_block_{block.line}.py")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(block.text)
    code, out = run([PY, path], work, ctx["env"], timeout=BLOCK_TIMEOUT)
    if code != 0:
        rep.fail(block.name, f"as printed: exit {code}:" + tail(out))
        return out
    code2, out2 = run([PY, os.path.abspath(__file__), "--check-python", path, func, str(ranks)], work, ctx["env"],
                      timeout=BLOCK_TIMEOUT)
    if code2 != 0:
        rep.fail(block.name, f"{func} under epx.launch:" + tail(out2))
    else:
        rep.ok(block.name, out2.strip().split("\n")[-1])
    return out


# ---------------------------------------------------------------------------------------
# ```bash


def split_commands(text):
    """The block's commands: lines joined at a trailing backslash, with their source lines."""
    cmds, cur = [], ""
    for ln in text.split("\n"):
        cur = cur + ln
        if cur.endswith("\\"):
            cur = cur[:-1] + "\n"
            continue
        cmds.append(cur)
        cur = ""
    if cur:
        cmds.append(cur)
    return cmds


def skipped(cmd):
    s = cmd.strip()
    for pat, why, sub in SKIPPED:
        if re.match(pat, s):
            return why, sub
    return None


def run_bash(block, work, ctx, rep):
    script, notes = ["set -eo pipefail"], []
    for cmd in split_commands(block.text):
        hit = skipped(cmd)
        if hit is None:
            script.append(cmd)
            continue
        why, sub = hit
        first = cmd.strip().split("#")[0].strip()
        notes.append(f"not run: `{first}` ({why})" + (f"; runs `{sub}`" if sub else ""))
        script.append(sub if sub else ":")
    if all(ln.strip() in (":", "") or ln.startswith("set -eo") for ln in script):
        for n in notes:
            rep.skip(block.name, n)
        return None
    code, out = run(["bash", "-c", "\n".join(script)], work, ctx["env"], timeout=BLOCK_TIMEOUT)
    if code != 0:
        rep.fail(block.name, f"exit {code}:" + tail(out))
    else:
        rep.ok(block.name, "; ".join(notes))
    return out if code == 0 else None


# ---------------------------------------------------------------------------------------
# The documents


def make_work(tmp, doc, build):
    """A directory that looks like the checkout (a symlink per top-level entry, `build` the
    given build tree) and keeps whatever the blocks write."""
    work = os.path.join(tmp, "work-" + re.sub(r"\W", "_", doc))
    os.makedirs(work)
    for entry in os.listdir(REPO):
        if entry not in (".git", "build"):
            os.symlink(os.path.join(REPO, entry), os.path.join(work, entry))
    os.symlink(build, os.path.join(work, "build"))
    return work


def check_blocks(build, rep, docs=DOCS):
    build = os.path.abspath(build)
    for need in (os.path.join(build, "src", "tools", "epx"), os.path.join(build, "python", "epx")):
        if not os.path.exists(need):
            rep.fail("blocks", f"{need} missing: build first (bash scripts/run.sh build)")
            return
    tmp = tempfile.mkdtemp(prefix="epx-check-docs-")
    manifest = os.path.join(build, "install_manifest.txt")
    saved = open(manifest, "rb").read() if os.path.exists(manifest) else None
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    env = dict(os.environ, HOME=home, PYTHONPATH=os.path.join(build, "python"), PYTHONDONTWRITEBYTECODE="1",
               TMPDIR=tmp, CCACHE_DISABLE="1")
    env.pop("PYTHONSTARTUP", None)
    ctx = {"tmp": tmp, "build": build, "env": env}
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    try:
        for doc in docs:
            work = make_work(tmp, doc, build)
            last_out, last_ran = None, False
            for b in parse(doc):
                if b.file:
                    path = os.path.join(work, b.file)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "w") as f:
                        f.write(b.text)
                if b.lang == "text":
                    if last_ran and last_out is not None:
                        why = check_excerpt(b.text, last_out)
                        (rep.fail(b.name, why) if why else rep.ok(b.name, "the output of the block above"))
                    last_ran = False
                    continue
                t0 = time.time()
                if b.lang == "cpp":
                    last_out = run_cpp(b, work, ctx, rep)
                elif b.lang == "python":
                    last_out = run_python(b, work, ctx, rep)
                elif b.lang == "bash":
                    last_out = run_bash(b, work, ctx, rep)
                elif b.lang == "cmake" and b.file:
                    last_out = None
                else:
                    rep.fail(b.name, f"unknown block kind '{b.lang}' (cpp, python, bash, cmake with a file marker, text)")
                    last_out = None
                last_ran = last_out is not None
                if time.time() - t0 > 60:
                    print(f"     ({time.time() - t0:.0f} s)", flush=True)
    finally:
        # cmake --install into our prefixes rewrote it: back as it was (a manifest another job
        # wrote meanwhile, naming none of our paths, stays)
        if os.path.exists(manifest) and tmp.encode() in open(manifest, "rb").read():
            if saved is None:
                os.remove(manifest)
            else:
                with open(manifest, "wb") as f:
                    f.write(saved)
        shutil.rmtree(tmp, ignore_errors=True)
    left = leaked_segments(shm_before)
    if left:
        rep.fail("blocks: /dev/shm", f"epx segments left behind (mapped by no process): {left[:5]}")


def leaked_segments(before):
    """/dev/shm entries named epx that appeared since `before` and no process maps (another
    job's live windows are not ours to judge)."""
    if not os.path.isdir("/dev/shm"):
        return []
    new = {e for e in set(os.listdir("/dev/shm")) - before if "epx" in e}
    if not new:
        return []
    time.sleep(1)
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            mapped.update(re.findall(r"/dev/shm/(\S+)", open(maps).read()))
        except OSError:
            pass
    return sorted(e for e in new if e not in mapped and os.path.exists(os.path.join("/dev/shm", e)))


# ---------------------------------------------------------------------------------------
# The README's headline figures are BENCHMARKS.md's current ones


def fmt_ratio(x):
    """As scripts/benchmarks.py writes a ratio."""
    return "%.2fx" % x if x < 10 else "%.1fx" % x


def check_headline(rep):
    """Each row of the README's "Headline figures" table names a figure of docs/img/benchmarks.json
    (the JSON scripts/benchmarks.sh writes with BENCHMARKS.md's tables) by its id, in an HTML
    comment, and shows its ratio as BENCHMARKS.md does ("not measured" while it has none)."""
    import json
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    m = re.search(r"^## Headline figures\n(.*?)(?=^## )", text, re.S | re.M)
    rows = re.findall(r"^\|(.*?)<!--\s*(\w+)\s*-->(.*?)\|(.*?)\|\s*$", m.group(1), re.M) if m else []
    if not rows:
        rep.fail("headline", "README.md has no '## Headline figures' table with <!-- figure id --> rows")
        return
    try:
        figures = {r["id"]: r for r in json.load(open(os.path.join(REPO, "docs", "img", "benchmarks.json")))["rows"]}
    except (OSError, ValueError, KeyError) as e:
        rep.fail("headline", f"docs/img/benchmarks.json: {e}")
        return
    bad = []
    for _, fid, _, cell in rows:
        f = figures.get(fid)
        if f is None:
            bad.append(f"{fid}: no such figure in docs/img/benchmarks.json")
            continue
        want = fmt_ratio(f["ratio"]) if f.get("status") == "ok" and f.get("ratio") else "not measured"
        got = cell.strip().strip("*").strip()
        if got != want:
            bad.append(f"{fid}: README says '{got}', BENCHMARKS.md '{want}' ({f.get('date', '?')}, {f.get('commit', '?')})")
    if bad:
        rep.fail("headline", "README.md's headline figures are not BENCHMARKS.md's current ones: " + "; ".join(bad))
    else:
        rep.ok("headline", f"{len(rows)} figures, as in docs/img/benchmarks.json")


# ---------------------------------------------------------------------------------------
# The lint (run it last: other files are still being fixed)

# Built from pieces so that this file does not match itself.
STALE = [
    (re.compile(re.escape("..") + "/shared"), "the old contract's location: the contract is docs/spec.md"),
    (re.compile("shared/" + "SPEC"), "the old contract's location: the contract is docs/spec.md"),
    (re.compile(r"\bSPEC" + " \u00a7"),
     "a contract section as SPEC \u00a7N: write docs/spec.md \u00a7N (spec.md \u00a7N inside docs/)"),
    (re.compile(r"(?i)\bissues?(?:\s|/{2,3}|#(?=\s)|\*)*#?\d+(?:\s*§\s*\d+)?"), "an issue number"),
    (re.compile(r"(?<![\w&/#-])#\d+\s*§"), "an issue number"),
    (re.compile(r"\(#\d+\)"), "an issue number"),
]


def tracked_files():
    out = subprocess.run(["git", "-C", REPO, "ls-files", "-z"], capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def lint_tree(rep):
    """No tracked text file names the old contract location, a section of it, or an issue number."""
    hits = []
    for rel in tracked_files():
        path = os.path.join(REPO, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        data = open(path, "rb").read()
        if b"\0" in data[:8192]:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        seen = set()
        for pat, why in STALE:
            for m in pat.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                if (line, why) not in seen:  # one report per line and kind
                    seen.add((line, why))
                    hits.append(f"{rel}:{line}: {m.group(0).strip()!r}: {why}")
    if hits:
        rep.fail("lint", f"{len(hits)} stale references:\n    " + "\n    ".join(hits[:60]) +
                 (f"\n    ... and {len(hits) - 60} more" if len(hits) > 60 else ""))
    else:
        rep.ok("lint", f"{len(tracked_files())} tracked files: no stale contract references, no issue numbers")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="the build tree (default: build)")
    ap.add_argument("--only", choices=["blocks", "headline", "lint"], help="one of the checks")
    ap.add_argument("--doc", action="append", help="only this document (repeatable; default: " + ", ".join(DOCS) + ")")
    ap.add_argument("--check-python", nargs=3, metavar=("FILE", "FUNC", "RANKS"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.check_python:
        path, func, ranks = a.check_python
        return check_python_child(path, func, int(ranks))
    rep = Report()
    if a.only in (None, "blocks"):
        check_blocks(os.path.abspath(a.build), rep, a.doc or DOCS)
    if a.only in (None, "headline"):
        check_headline(rep)
    if a.only in (None, "lint"):
        lint_tree(rep)
    print(f"{rep.passed} passed, {rep.failed} failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
