#!/usr/bin/env python3
"""The HTML reports opened as a person would: `epx bench --html`, `epx html` (a saved bench
JSON with diagnose matrices added, as `epx bench --diagnose --json` writes them) and
`epx sim --html` (and the same page with a second hardware profile), each loaded in headless Chromium over the DevTools protocol (cdp.py).

A page fails on any console error or uncaught exception, on any request for something other
than the page itself (it must be self-contained), when its charts are not the ones its data
calls for, or when a chart drew another number of marks (bars, dots, cells) than its data
has. A full-page screenshot of each page is kept (PNG, path printed) as the run's artefact.

  /usr/bin/python3 tests/html/check_pages.py --epx build/src/tools/epx --out build/html
Prints SKIP and exits 0 when no Chromium is installed (scripts/run.sh installs Debian's).
"""
import argparse
import base64
import copy
import html.parser
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cdp  # noqa: E402

OPS = ("dispatch", "combine")


# ---- what each page must draw, from its data alone ------------------------------------

def bench_expected(d):
    """{chart id: number of marks} for a bench page's data."""
    P = d["ranks"] if isinstance(d["ranks"], int) else len(d["ranks"])
    peers = 3 + (1 if d.get("baseline", {}).get("available") else 0)
    e = {"versus-latency": 2 * peers, "versus-bandwidth": 2 * 3}
    for op in OPS:
        e["latency-" + op] = sum(len(x) for x in d[op]["iterations"]["rank_us"])
    n = len(d["dispatch"]["iterations"]["max_rank_us"])
    e["latency-iterations"] = 2 * n if n <= 400 else 2
    for op in OPS:
        if d[op]["counters"] and d[op]["phases_us"]:
            e["phases-" + op] = P * len(d[op]["phases_us"])
    if "rows_matrix" in d["route"]:
        e["bytes-dispatch"] = e["bytes-combine"] = P * P
    for op in OPS:
        e["payload-" + op] = 2 * P
    diag = d.get("diagnose") or {}
    for op in OPS:
        if diag.get(op, {}).get("matrix_us"):
            m = diag[op]["matrix_us"]
            e["diagnose-" + op] = len(m) * len(m[0])
    e["route-histogram"] = len(d["route"]["unique_dest_hist"])
    e["route-rows"] = 2 * P
    e["route-experts"] = len(d["route"]["rows_per_expert"])
    if d.get("eplb"):
        e["eplb-rows"] = 2 * P
    return e


def sim_expected(d):
    e = {}
    for p in d["profiles"]:
        h, X = p["hardware"], len(p["points"])
        pub = p.get("published", [])
        e["sim-gbps-" + h] = 4 * X + 2 * len(pub)
        e["sim-latency-" + h] = 2 * X
        for op in OPS:
            e["sim-split-%s-%s" % (op, h)] = 4 * X
        without = p["points"][0].get("combine_gbps_without") or {}
        if without:
            e["sim-attribution-" + h] = (1 + len(without)) * X
    if len(d["profiles"]) > 1:
        for op in OPS:
            e["sim-profiles-" + op] = sum(len(p["points"]) for p in d["profiles"])
    return e


class DataScript(html.parser.HTMLParser):
    """The JSON of <script id="epx-data"> (what the page draws)."""

    def __init__(self):
        super().__init__()
        self.inside = False
        self.text = ""

    def handle_starttag(self, tag, attrs):
        self.inside = tag == "script" and ("id", "epx-data") in attrs

    def handle_endtag(self, tag):
        self.inside = False

    def handle_data(self, data):
        if self.inside:
            self.text += data


def page_data(path):
    p = DataScript()
    with open(path, encoding="utf-8") as f:
        p.feed(f.read())
    return json.loads(p.text)


# ---- opening a page -------------------------------------------------------------------

CHARTS_JS = """JSON.stringify({
  drawn: document.body.dataset.drawn || null,
  draw_ms: +document.body.dataset.drawMs,
  error: (document.getElementById('page-error') || {}).textContent || null,
  text_report: !!document.querySelector('#text-report pre'),
  charts: [...document.querySelectorAll('figure.chart')].map(f => {
    const svg = f.querySelector('svg'), box = svg.getBoundingClientRect();
    const marks = [...svg.querySelectorAll('.mark')];
    const inside = marks.filter(m => { const r = m.getBoundingClientRect();
      return (r.width > 0 || r.height > 0) && r.right >= box.left - 1 && r.left <= box.right + 1 &&
             r.bottom >= box.top - 1 && r.top <= box.bottom + 1; }).length;
    return {id: f.id.replace(/^chart-/, ''), marks: marks.length, declared: +f.dataset.marks, inside,
            width: box.width, height: box.height};
  })
})"""


def open_page(browser, path, png):
    """Loads `path`, returns (report dict, problems list); writes the screenshot to `png`."""
    url = "file://" + os.path.abspath(path)
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Runtime", "Log", "Page", "Network"):
        browser.send(domain + ".enable", session=session)
    browser.send("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                 session=session)
    browser.events.clear()
    browser.send("Page.navigate", {"url": url}, session=session)
    browser.wait_event("Page.loadEventFired", session, browser.timeout)
    browser.drain(0.3)
    report = json.loads(browser.send("Runtime.evaluate", {"expression": CHARTS_JS, "returnByValue": True},
                                     session=session)["result"]["value"])
    problems = []
    for e in browser.events:
        if e.get("sessionId") != session:
            continue
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            problems.append("console %s: %s" % (p["type"], " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", []))))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            problems.append("uncaught exception: %s" % (d.get("exception", {}).get("description") or d.get("text")))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            problems.append("console error (%s): %s" % (p["entry"].get("source"), p["entry"].get("text")))
        elif m == "Network.requestWillBeSent":
            req = p.get("request", {}).get("url", "")
            if req != url and not req.startswith("data:"):
                problems.append("the page requested " + req + " (it must need nothing but itself)")
    height = json.loads(browser.send("Runtime.evaluate", {"expression": "JSON.stringify(document.documentElement.scrollHeight)",
                                                          "returnByValue": True}, session=session)["result"]["value"])
    browser.send("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": min(int(height), 16000), "deviceScaleFactor": 1,
                                                        "mobile": False}, session=session)
    shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=session)
    with open(png, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    browser.send("Target.closeTarget", {"targetId": target})
    return report, problems


def check_page(browser, path, expected, png, want_text):
    report, problems = open_page(browser, path, png)
    if report["drawn"] != "yes":
        problems.append("the page did not finish drawing (body data-drawn = %r; %s)" % (report["drawn"], report["error"]))
    got = {c["id"]: c for c in report["charts"]}
    for cid in sorted(set(expected) - set(got)):
        problems.append("chart %s missing" % cid)
    for cid in sorted(set(got) - set(expected)):
        problems.append("chart %s drawn but the data does not call for it" % cid)
    for cid, want in sorted(expected.items()):
        c = got.get(cid)
        if not c:
            continue
        if c["marks"] != want or c["declared"] != want:
            problems.append("chart %s: %d marks drawn (page says %d), the data has %d" % (cid, c["marks"], c["declared"], want))
        if c["inside"] != c["marks"]:
            problems.append("chart %s: %d of %d marks are empty or outside the chart" % (cid, c["marks"] - c["inside"], c["marks"]))
        if c["width"] < 100 or c["height"] < 60:
            problems.append("chart %s: %dx%d px, too small to read" % (cid, c["width"], c["height"]))
    if want_text and not report["text_report"]:
        problems.append("no text report under the charts")
    marks = sum(c["marks"] for c in report["charts"])
    print("%s: %d charts, %d marks drawn in %d ms, %s" % (path, len(report["charts"]), marks, report["draw_ms"] or 0,
                                                          "OK" if not problems else "FAILED"))
    print("  screenshot: %s" % os.path.abspath(png))
    for p in sorted(set(problems), key=problems.index):
        n = problems.count(p)
        print("  " + p + (" (x%d)" % n if n > 1 else ""))
    return not problems


# ---- the fixtures ---------------------------------------------------------------------

def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=300, **kw)


def with_diagnose(bench):
    """The bench JSON plus diagnose matrices in the layout `epx bench --diagnose --json` writes:
    rank 2 a slow source (its row), rank 1 a slow destination (its column), 3 -> 0 a slow link."""
    d = copy.deepcopy(bench)
    P = d["num_ranks"] if "num_ranks" in d else d["ranks"]  # "ranks": the per-rank list since --diagnose
    diag = {}
    for k, op in enumerate(OPS):
        m = [[10.0 + k + (s + 2 * t) % 3 for t in range(P)] for s in range(P)]
        for t in range(P):
            m[2][t] *= 4
            m[t][1] *= 3.5
        m[3][0] = 90.0
        diag[op] = {"matrix_us": m, "abnormal_rows": [2], "abnormal_cols": [1], "abnormal_points": [[3, 0, 90.0, 6.1]],
                    "thresholds": {"row": 3.0, "col": 3.0, "point": 5.0}}
    d["diagnose"] = diag
    d["ranks"] = [{"rank": r, "pid": 1000 + r, "node": "node%d" % (r // 2)} for r in range(P)]
    return d


def two_profiles(sim):
    """The sim page's data with a second hardware profile (its points scaled, no published
    points), as the runner gives when it predicts for several profiles: drawn side by side."""
    d = copy.deepcopy(sim)
    other = copy.deepcopy(d["profiles"][0])
    other["hardware"] = "second-profile"
    other["published"] = []
    other.pop("published_note", None)
    for q in other["points"]:
        for k in ("dispatch_gbps", "combine_gbps", "dispatch_gbps_slowest", "combine_gbps_slowest"):
            q[k] *= 0.6
    d["profiles"].append(other)
    return d


def rewrite_data(page, data, out):
    """`page` with its data script holding `data` instead (the drawing script unchanged)."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    open_tag = '<script id="epx-data" type="application/json">'
    a = text.index(open_tag) + len(open_tag)
    b = text.index("</script>", a)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text[:a] + json.dumps(data).replace("<", "\\u003c") + text[b:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epx", required=True, help="the epx tool")
    ap.add_argument("--out", required=True, help="directory for the pages and screenshots (kept)")
    ap.add_argument("--chromium", default=None, help="Chromium executable (default: chromium on PATH)")
    args = ap.parse_args()
    chromium = args.chromium or cdp.find_chromium()
    if not chromium:
        print("SKIP: no chromium (scripts/run.sh installs Debian's chromium)")
        return 0
    start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731
    shape = ["--transport", "threads", "--ranks", "4", "--tokens", "64", "--hidden", "256", "--topk", "4", "--experts", "16",
             "--warmup", "1", "--counters-overhead", "0", "--no-progress"]
    baseline = ["--baseline", "mpi"] if shutil.which("mpirun") else []
    run([args.epx, "bench"] + shape + ["--iters", "8", "--json", out("bench.json"), "--html", out("bench.html")] + baseline)
    run([args.epx, "bench"] + shape + ["--iters", "3", "--eplb", "--no-counters", "--json", out("bench_eplb.json")])
    with open(out("bench_eplb.json")) as f:
        fixture = with_diagnose(json.load(f))
    with open(out("bench_diagnose.json"), "w") as f:
        json.dump(fixture, f)
    run([args.epx, "html", out("bench_diagnose.json"), "--out", out("bench_diagnose.html")])
    run([args.epx, "sim", "--ep", "8,16,32", "--tokens", "512", "--attribution", "--no-progress", "--html", out("sim.html")])

    with open(out("bench.json")) as f:
        bench = json.load(f)
    ok = True
    if page_data(out("bench.html")) != bench:
        print("bench.html: the page's data is not the object --json wrote")
        ok = False
    if page_data(out("bench_diagnose.html")) != fixture:
        print("bench_diagnose.html: the page's data is not the JSON it was drawn from")
        ok = False
    sim = page_data(out("sim.html"))
    if not any(p["published"] for p in sim["profiles"]):
        print("sim.html: no published points for the builtin profile")
        ok = False
    sim2 = two_profiles(sim)
    rewrite_data(out("sim.html"), sim2, out("sim_profiles.html"))
    browser = cdp.Browser(chromium)
    try:
        ok &= check_page(browser, out("bench.html"), bench_expected(bench), out("bench.png"), True)
        ok &= check_page(browser, out("bench_diagnose.html"), bench_expected(fixture), out("bench_diagnose.png"), False)
        ok &= check_page(browser, out("sim.html"), sim_expected(sim), out("sim.png"), True)
        ok &= check_page(browser, out("sim_profiles.html"), sim_expected(sim2), out("sim_profiles.png"), True)
    finally:
        browser.close()
    print("html pages: %s in %.1f s" % ("OK" if ok else "FAILED", time.monotonic() - start))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
