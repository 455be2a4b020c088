// epx report page: draws the report's data (the JSON in #epx-data, the object `epx bench
// --json` writes, or `epx sim`'s profiles) as inline SVG. Written for epx: no third-party
// code, no network. Every chart is a <figure class="chart"> whose data marks (bars, dots,
// cells, points) carry the class "mark"; figure.dataset.marks is their number, which the
// page test (tests/html/check_pages.py) checks against the data. document.body.dataset.drawn
// becomes "yes" once every chart is drawn.
(function () {
  'use strict';

  const SVG_NS = 'http://www.w3.org/2000/svg';
  const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];
  const MAX_RANK_LABELS = 32;

  // ---- DOM and number helpers ---------------------------------------------------------

  function html(tag, attrs, parent, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function svg(tag, attrs, parent, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function num(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    if (digits !== undefined) return Number(v).toFixed(digits);
    if (Number.isInteger(v)) return String(v);
    const a = Math.abs(v);
    if (a >= 10000) return v.toFixed(0);
    if (a >= 100) return v.toFixed(1);
    if (a >= 1) return v.toFixed(2);
    if (a === 0) return '0';
    return v.toPrecision(2);
  }

  function bytes(b) {
    const a = Math.abs(b);
    if (a >= 1e9) return num(b / 1e9) + ' GB';
    if (a >= 1e6) return num(b / 1e6) + ' MB';
    if (a >= 1e3) return num(b / 1e3) + ' KB';
    return num(b, 0) + ' B';
  }

  // An axis tick: as few digits as the step needs (5000, 2.5, 0.25).
  function tick(v) { return String(Number(v.toPrecision(6))); }

  function bytesTick(b) {
    const a = Math.abs(b);
    if (a >= 1e9) return tick(b / 1e9) + ' GB';
    if (a >= 1e6) return tick(b / 1e6) + ' MB';
    if (a >= 1e3) return tick(b / 1e3) + ' KB';
    return tick(b) + ' B';
  }

  function arr(v) { return Array.isArray(v) ? v : []; }
  function sum(v) { return arr(v).reduce((a, b) => a + (Number(b) || 0), 0); }
  function maxOf(v) { return arr(v).reduce((a, b) => (isFinite(b) && b > a ? b : a), 0); }
  function range(n) { return Array.from({ length: n }, (_, i) => i); }

  // The smallest of 1, 2, 2.5, 5 x 10^k at or above v: the top of an axis.
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v * (1 - 1e-9)) return m * p;
    return 10 * p;
  }

  function ticks(top, n) {
    const step = niceCeil(top / (n || 5));
    const out = [];
    for (let v = 0; v <= top * (1 + 1e-9); v += step) out.push(v);
    return out;
  }

  // Every how many of n labels to print so that labels of up to `chars` characters fit in `span` px.
  function labelEvery(n, span, chars) {
    const fit = Math.max(1, Math.floor(span / (6.5 * Math.max(1, chars) + 8)));
    return Math.max(1, Math.ceil(n / Math.min(fit, MAX_RANK_LABELS)));
  }
  function longest(labels) { return labels.reduce((a, l) => Math.max(a, String(l).length), 1); }

  // ---- chart frame ----------------------------------------------------------------------

  function chart(parent, id, title, opt) {
    opt = opt || {};
    const fig = html('figure', { class: 'chart', id: 'chart-' + id }, parent);
    html('figcaption', {}, fig, title);
    const W = opt.width || 640, H = opt.height || 300;
    const root = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, width: W, height: H, role: 'img', 'aria-label': title }, fig);
    const m = Object.assign({ l: 60, r: 16, t: 14, b: 42 }, opt.margin || {});
    const c = { fig, root, W, H, m, x0: m.l, x1: W - m.r, y0: H - m.b, y1: m.t };
    if (opt.legend) legend(fig, opt.legend);
    if (opt.note) html('p', { class: 'note' }, fig, opt.note);
    return c;
  }

  function legend(fig, items) {
    const box = html('div', { class: 'legend' }, fig);
    for (const it of items) {
      const span = html('span', {}, box);
      html('span', { class: 'sw' + (it.dash ? ' dash' : ''), style: 'background:' + it.color }, span);
      span.appendChild(document.createTextNode(it.name));
    }
  }

  function mark(node, tip) {
    node.setAttribute('class', ((node.getAttribute('class') || '') + ' mark').trim());
    if (tip) svg('title', {}, node, tip);
    return node;
  }

  function finish(c) {
    c.fig.dataset.marks = String(c.root.querySelectorAll('.mark').length);
    return c;
  }

  // A y axis from 0 to `top` with grid lines; returns the scale.
  function yAxis(c, top, title, fmt) {
    const y = (v) => c.y0 - (v / top) * (c.y0 - c.y1);
    const g = svg('g', { class: 'axis' }, c.root);
    const grid = svg('g', { class: 'grid' }, c.root);
    for (const v of ticks(top)) {
      svg('line', { x1: c.x0, x2: c.x1, y1: y(v), y2: y(v) }, grid);
      svg('text', { x: c.x0 - 6, y: y(v) + 4, 'text-anchor': 'end' }, g, (fmt || tick)(v));
    }
    svg('line', { x1: c.x0, x2: c.x0, y1: c.y1, y2: c.y0 }, g);
    svg('line', { x1: c.x0, x2: c.x1, y1: c.y0, y2: c.y0 }, g);
    if (title) {
      const ty = (c.y0 + c.y1) / 2;
      svg('text', { class: 'axis-title', x: 14, y: ty, transform: 'rotate(-90 14 ' + ty + ')', 'text-anchor': 'middle' }, g, title);
    }
    return y;
  }

  function xTitle(c, title) {
    if (title) svg('text', { class: 'axis-title', x: (c.x0 + c.x1) / 2, y: c.H - 6, 'text-anchor': 'middle' }, c.root, title);
  }

  // Category x axis: n bands, a label under every k-th.
  function xBands(c, labels, title) {
    const n = labels.length, band = (c.x1 - c.x0) / Math.max(1, n), every = labelEvery(n, c.x1 - c.x0, longest(labels));
    const g = svg('g', { class: 'axis' }, c.root);
    labels.forEach((lab, i) => {
      if (i % every === 0) svg('text', { x: c.x0 + band * (i + 0.5), y: c.y0 + 14, 'text-anchor': 'middle' }, g, lab);
    });
    xTitle(c, title);
    return { band, at: (i) => c.x0 + band * i };
  }

  // ---- chart kinds ----------------------------------------------------------------------

  // Vertical bars: categories x series, grouped side by side or stacked.
  // spec: {categories, series: [{name, values, color}], stacked, yTitle, xTitle, fmt, values: true to print them,
  //        highlight: category index to mark}
  function bars(parent, id, title, spec) {
    const series = spec.series.map((s, k) => Object.assign({ color: PALETTE[k % PALETTE.length] }, s));
    const n = spec.categories.length;
    const c = chart(parent, id, title, { legend: series.length > 1 ? series : null, note: spec.note, height: spec.height,
      margin: spec.fmt === bytes ? { l: 74 } : {} });
    let top = 0;
    for (let i = 0; i < n; ++i) {
      if (spec.stacked) top = Math.max(top, series.reduce((a, s) => a + (Number(s.values[i]) || 0), 0));
      else for (const s of series) top = Math.max(top, Number(s.values[i]) || 0);
    }
    top = niceCeil(top * 1.05);
    const y = yAxis(c, top, spec.yTitle, spec.fmt === bytes ? bytesTick : tick);
    const x = xBands(c, spec.categories.map(String), spec.xTitle);
    const pad = Math.min(8, x.band * 0.15);
    const fmt = spec.fmt || num;
    for (let i = 0; i < n; ++i) {
      let base = 0;
      const inner = x.band - 2 * pad, w = spec.stacked ? inner : inner / series.length;
      series.forEach((s, k) => {
        const v = Number(s.values[i]) || 0;
        const left = x.at(i) + pad + (spec.stacked ? 0 : k * w);
        const yTop = y(base + v), yBottom = y(base);
        mark(svg('rect', { x: left, y: yTop, width: Math.max(0.5, w - (spec.stacked ? 0 : 1)), height: Math.max(0, yBottom - yTop), fill: s.color }, c.root),
          spec.categories[i] + ' · ' + s.name + ': ' + fmt(v) + (spec.unit ? ' ' + spec.unit : ''));
        if (spec.values && !spec.stacked && w >= 22)
          svg('text', { class: 'value', x: left + w / 2, y: yTop - 3, 'text-anchor': 'middle' }, c.root, fmt(v));
        if (spec.stacked) base += v;
      });
      if (spec.highlight === i)
        svg('text', { class: 'value', x: x.at(i) + x.band / 2, y: y(spec.stacked ? base : top) - 3, 'text-anchor': 'middle', fill: '#c0392b' }, c.root, '▼');
    }
    return finish(c);
  }

  // Every sample of each group as a dot (the distribution), with ticks at the group's p50 and p95.
  // spec: {groups: [{name, samples, p50, p95, avg}], yTitle, xTitle, highlight}
  function strips(parent, id, title, spec) {
    const c = chart(parent, id, title, {
      legend: [{ name: 'iterations', color: PALETTE[0] }, { name: 'p50', color: '#1d2330' }, { name: 'p95', color: '#e15759' }],
      note: spec.note,
    });
    let top = 0;
    for (const g of spec.groups) top = Math.max(top, maxOf(g.samples), g.p95 || 0);
    top = niceCeil(top * 1.05);
    const y = yAxis(c, top, spec.yTitle);
    const x = xBands(c, spec.groups.map((g) => g.name), spec.xTitle);
    spec.groups.forEach((g, i) => {
      const cx = x.at(i) + x.band / 2, spread = Math.min(14, x.band * 0.3);
      const n = g.samples.length;
      g.samples.forEach((v, j) => {
        const dx = n > 1 ? ((j * 0.618034) % 1 - 0.5) * 2 * spread : 0;  // spread evenly, deterministic
        mark(svg('circle', { cx: cx + dx, cy: y(v), r: 2.2, fill: i === spec.highlight ? '#e15759' : PALETTE[0], 'fill-opacity': 0.55 }, c.root),
          g.name + ', iteration ' + j + ': ' + num(v) + ' us');
      });
      const half = Math.min(16, x.band * 0.4);
      if (g.p50 !== undefined) svg('line', { x1: cx - half, x2: cx + half, y1: y(g.p50), y2: y(g.p50), stroke: '#1d2330', 'stroke-width': 2 }, c.root);
      if (g.p95 !== undefined) svg('line', { x1: cx - half, x2: cx + half, y1: y(g.p95), y2: y(g.p95), stroke: '#e15759', 'stroke-width': 2 }, c.root);
    });
    return finish(c);
  }

  // Lines over x (numbers; log2-spaced when spec.log2), with optional ranges (a vertical bar
  // from lo to hi at an x) and a horizontal band.
  // spec: {x, series: [{name, values, color, dash}], ranges: [{name, color, items: [{x, lo, hi}]}], band: {lo, hi, name}, yTitle, xTitle, xLabel}
  function lines(parent, id, title, spec) {
    const series = spec.series.map((s, k) => Object.assign({ color: PALETTE[k % PALETTE.length] }, s));
    const ranges = (spec.ranges || []).filter((r) => r.items.length > 0);
    const items = series.concat(ranges.map((r) => ({ name: r.name, color: r.color }))).concat(spec.band ? [{ name: spec.band.name, color: '#dcdfe5' }] : []);
    const c = chart(parent, id, title, { legend: items, note: spec.note });
    const xs = spec.x.slice();
    for (const r of ranges) for (const it of r.items) if (xs.indexOf(it.x) < 0) xs.push(it.x);
    xs.sort((a, b) => a - b);
    const pos = spec.log2 ? (v) => Math.log2(v) : (v) => v;
    const lo = pos(xs[0]), hi = pos(xs[xs.length - 1]);
    const inset = 18;
    const x = (v) => (hi === lo ? (c.x0 + c.x1) / 2 : c.x0 + inset + ((pos(v) - lo) / (hi - lo)) * (c.x1 - c.x0 - 2 * inset));
    let top = spec.band ? spec.band.hi : 0;
    for (const s of series) top = Math.max(top, maxOf(s.values));
    for (const r of ranges) for (const it of r.items) top = Math.max(top, it.hi);
    top = niceCeil(top * 1.08);
    const y = yAxis(c, top, spec.yTitle);
    if (spec.band) {
      svg('rect', { x: c.x0, width: c.x1 - c.x0, y: y(spec.band.hi), height: y(spec.band.lo) - y(spec.band.hi), fill: '#dcdfe5', 'fill-opacity': 0.7 }, c.root);
    }
    const g = svg('g', { class: 'axis' }, c.root), every = labelEvery(xs.length, c.x1 - c.x0, longest(xs.map(spec.xLabel || String)));
    xs.forEach((v, i) => {
      if (i % every === 0) svg('text', { x: x(v), y: c.y0 + 14, 'text-anchor': 'middle' }, g, (spec.xLabel || String)(v));
    });
    xTitle(c, spec.xTitle);
    ranges.forEach((r, k) => {
      for (const it of r.items) {
        const dx = (k - (ranges.length - 1) / 2) * 7;
        const h = Math.max(4, y(it.lo) - y(it.hi)), top = (y(it.lo) + y(it.hi)) / 2 - h / 2;
        mark(svg('rect', { x: x(it.x) + dx * 1.6 - 5, width: 10, y: top, height: h, fill: r.color, 'fill-opacity': 0.5, stroke: r.color, 'stroke-width': 1.5 }, c.root),
          r.name + ' at ' + (spec.xLabel || String)(it.x) + ': ' + num(it.lo) + '–' + num(it.hi));
      }
    });
    for (const s of series) {
      const pts = [];
      spec.x.forEach((v, i) => { if (isFinite(s.values[i])) pts.push([x(v), y(s.values[i]), v, s.values[i]]); });
      if (pts.length > 1)
        svg('polyline', { points: pts.map((p) => p[0] + ',' + p[1]).join(' '), fill: 'none', stroke: s.color, 'stroke-width': 2, 'stroke-dasharray': s.dash ? '5 4' : 'none' }, c.root);
      if (pts.length <= 400)
        for (const p of pts) mark(svg('circle', { cx: p[0], cy: p[1], r: 3, fill: s.color }, c.root), s.name + ' at ' + (spec.xLabel || String)(p[2]) + ': ' + num(p[3]));
      else mark(svg('circle', { cx: pts[pts.length - 1][0], cy: pts[pts.length - 1][1], r: 3, fill: s.color }, c.root), s.name);
    }
    return finish(c);
  }

  // Sequential colour from light (0) to dark (1).
  function shade(t) {
    const stops = [[247, 251, 255], [158, 202, 225], [49, 130, 189], [8, 48, 107]];
    t = Math.max(0, Math.min(1, t)) * (stops.length - 1);
    const i = Math.min(stops.length - 2, Math.floor(t)), f = t - i;
    const ch = (k) => Math.round(stops[i][k] + (stops[i + 1][k] - stops[i][k]) * f);
    return 'rgb(' + ch(0) + ',' + ch(1) + ',' + ch(2) + ')';
  }

  // A [rows][cols] matrix as coloured cells; flagged rows, columns and cells outlined.
  // spec: {matrix, rowLabels, colLabels, rowTitle, colTitle, fmt, flags: {rows, cols, points: [[r, c]]}}
  function heatmap(parent, id, title, spec) {
    const R = spec.matrix.length, C = R > 0 ? spec.matrix[0].length : 0;
    const cell = Math.max(3, Math.min(44, Math.floor(440 / Math.max(R, C, 1))));
    const m = { l: 30 + 6.5 * longest(spec.rowLabels), r: 90, t: 14, b: 46 };
    const c = chart(parent, id, title, { width: m.l + m.r + cell * C, height: m.t + m.b + cell * R, margin: m, note: spec.note });
    let top = 0;
    for (const row of spec.matrix) top = Math.max(top, maxOf(row));
    const fmt = spec.fmt || num;
    const g = svg('g', { class: 'axis' }, c.root);
    for (let r = 0; r < R; ++r) {
      for (let k = 0; k < C; ++k) {
        const v = Number(spec.matrix[r][k]) || 0;
        mark(svg('rect', { x: m.l + k * cell, y: m.t + r * cell, width: cell, height: cell, fill: shade(top > 0 ? v / top : 0), stroke: cell >= 8 ? '#fff' : 'none', 'stroke-width': 0.5 }, c.root),
          (spec.rowTitle || '') + ' ' + spec.rowLabels[r] + ' → ' + (spec.colTitle || '') + ' ' + spec.colLabels[k] + ': ' + fmt(v));
      }
    }
    const every = Math.max(labelEvery(C, C * cell, longest(spec.colLabels)), Math.ceil(13 / cell));  // rows need ~13 px
    for (let r = 0; r < R; r += every) svg('text', { x: m.l - 4, y: m.t + (r + 0.5) * cell + 4, 'text-anchor': 'end' }, g, spec.rowLabels[r]);
    for (let k = 0; k < C; k += every) svg('text', { x: m.l + (k + 0.5) * cell, y: m.t + R * cell + 13, 'text-anchor': 'middle' }, g, spec.colLabels[k]);
    svg('text', { class: 'axis-title', x: m.l + (C * cell) / 2, y: c.H - 6, 'text-anchor': 'middle' }, g, spec.colTitle);
    const ty = m.t + (R * cell) / 2;
    svg('text', { class: 'axis-title', x: 12, y: ty, transform: 'rotate(-90 12 ' + ty + ')', 'text-anchor': 'middle' }, g, spec.rowTitle);
    const flags = spec.flags || {};
    for (const r of arr(flags.rows)) if (r >= 0 && r < R) svg('rect', { class: 'flag', x: m.l, y: m.t + r * cell, width: C * cell, height: cell }, c.root);
    for (const k of arr(flags.cols)) if (k >= 0 && k < C) svg('rect', { class: 'flag', x: m.l + k * cell, y: m.t, width: cell, height: R * cell }, c.root);
    for (const p of arr(flags.points)) if (p[0] < R && p[1] < C) svg('rect', { class: 'flag', x: m.l + p[1] * cell, y: m.t + p[0] * cell, width: cell, height: cell }, c.root);
    // Colour scale.
    const gx = m.l + C * cell + 16, gh = Math.max(40, R * cell);
    for (let i = 0; i < 20; ++i) svg('rect', { x: gx, y: m.t + gh - ((i + 1) * gh) / 20, width: 12, height: gh / 20 + 0.5, fill: shade((i + 0.5) / 20) }, c.root);
    svg('text', { x: gx + 16, y: m.t + 10 }, g, fmt(top));
    svg('text', { x: gx + 16, y: m.t + gh }, g, fmt(0));
    return finish(c);
  }

  // ---- page parts -----------------------------------------------------------------------

  function section(title, lead) {
    const root = document.getElementById('report');
    html('h2', {}, root, title);
    if (lead) html('p', { class: 'lead' }, root, lead);
    return html('div', { class: 'grid' }, root);
  }

  function configList(items) {
    const ul = html('ul', { class: 'config' }, document.getElementById('report'));
    for (const [k, v] of items) {
      if (v === undefined || v === null || v === '') continue;
      const li = html('li', {}, ul, k + ' ');
      html('b', {}, li, typeof v === 'object' ? JSON.stringify(v) : String(v));
    }
  }

  function warnings(list) {
    const root = document.getElementById('report');
    for (const w of arr(list)) html('p', { class: 'warning' }, root, 'WARNING: ' + w);
  }

  function rankLabels(n, prefix) { return range(n).map((r) => (prefix || '') + r); }

  // ---- epx bench ----------------------------------------------------------------------

  const OPS = ['dispatch', 'combine'];

  function benchHeader(d) {
    const dp = d.dataplane || {};
    const dpText = Object.keys(dp).map((k) => k + '=' + (typeof dp[k] === 'object' ? JSON.stringify(dp[k]) : dp[k])).join(', ');
    configList([
      ['ranks', d.ranks_count], ['transport', d.transport], ['workers/rank', d.workers], ['cores', d.cores],
      ['tokens/rank', d.tokens], ['hidden', d.hidden], ['topk', d.topk], ['experts', d.experts],
      ['dtype', d.fp8 ? 'fp8 e4m3 + f32 scales' : 'bf16'], ['layout', d.layout], ['cached', d.cached], ['zero copy', d.zero_copy],
      ['routing', d.routing && d.routing.source], ['iters', d.iters], ['warmup', d.warmup], ['counters', d.counters],
      ['wall', d.wall_s !== undefined ? num(d.wall_s) + ' s' : null], ['data plane', dpText],
    ]);
    warnings(d.warnings);
  }

  function benchSummary(d) {
    const root = document.getElementById('report');
    html('h2', {}, root, 'Summary');
    const cards = html('div', { class: 'cards' }, root);
    for (const op of OPS) {
      const o = d[op];
      if (!o) continue;
      const card = html('div', { class: 'card' }, cards);
      html('div', {}, card, op);
      html('div', { class: 'big' }, card, num(o.algbw_gbps) + ' GB/s = ' + num(o.ratio_vs_limit) + '× the limit');
      const ul = html('ul', {}, card);
      html('li', {}, ul, 'limit: ' + o.limit + ', ' + num(o.limit_gbps) + ' GB/s; ' + num(o.ratio_vs_memcpy) + '× memcpy');
      html('li', {}, ul, 'max-rank latency avg ' + num(o.max_rank_us.avg) + ' us, p50 ' + num(o.max_rank_us.p50) + ', p95 ' + num(o.max_rank_us.p95));
      html('li', {}, ul, 'slowest rank ' + o.slowest_rank + (o.dominant_phase ? '; dominant phase ' + o.dominant_phase : ''));
      const b = d.baseline;
      if (b && b.available && b.speedup_epx_vs_mpi) html('li', {}, ul, num(b.speedup_epx_vs_mpi[op]) + '× the MPI baseline\'s speed');
    }
  }

  // epx, the two copies of the same bytes (the faster is the limit) and the MPI baseline, side by side.
  function benchVersus(d) {
    const grid = section('epx against the limit and the peers',
      'Max-rank latency per call, averaged over the timed iterations (lower is better). memcpy and the streaming copy move the same bytes on the same ranks at once; the faster of the two is the limit.');
    const series = [
      { name: 'epx', values: OPS.map((op) => d[op].max_rank_us.avg), color: PALETTE[0] },
      { name: 'memcpy', values: OPS.map((op) => d[op].memcpy_max_rank_us.avg), color: PALETTE[1] },
      { name: 'streaming copy', values: OPS.map((op) => d[op].stream_max_rank_us.avg), color: PALETTE[4] },
    ];
    const b = d.baseline;
    if (b && b.available) series.push({ name: 'MPI baseline', values: OPS.map((op) => b[op].max_rank_us.avg), color: PALETTE[3] });
    const note = OPS.map((op) => op + ': epx = ' + num(d[op].ratio_vs_limit) + '× the limit (' + d[op].limit + ')' +
      (b && b.available ? ', ' + num(b.speedup_epx_vs_mpi[op]) + '× MPI' : '')).join('; ') +
      (b && !b.available ? '. MPI baseline unavailable: ' + b.why_unavailable : '');
    bars(grid, 'versus-latency', 'Latency per call (us)', { categories: OPS, series, yTitle: 'us', values: true, unit: 'us', note });
    bars(grid, 'versus-bandwidth', 'Bandwidth (GB/s, payload / max-rank latency)', {
      categories: OPS, yTitle: 'GB/s', values: true, unit: 'GB/s',
      series: [
        { name: 'epx', values: OPS.map((op) => d[op].algbw_gbps), color: PALETTE[0] },
        { name: 'memcpy', values: OPS.map((op) => d[op].memcpy_gbps), color: PALETTE[1] },
        { name: 'streaming copy', values: OPS.map((op) => d[op].stream_gbps), color: PALETTE[4] },
      ],
    });
  }

  function benchLatency(d, P) {
    const grid = section('Latency per rank', 'Every timed iteration of each rank (dots), its p50 and p95; the slowest rank (highest average) in red.');
    for (const op of OPS) {
      const o = d[op];
      const per = arr(o.iterations && o.iterations.rank_us), stats = arr(o.rank_latency_us);
      strips(grid, 'latency-' + op, op + ': latency per rank (us)', {
        groups: range(P).map((r) => ({ name: String(r), samples: arr(per[r]), p50: (stats[r] || {}).p50, p95: (stats[r] || {}).p95 })),
        yTitle: 'us', xTitle: 'rank', highlight: o.slowest_rank,
      });
    }
    const it = arr(d.dispatch.iterations && d.dispatch.iterations.max_rank_us);
    lines(grid, 'latency-iterations', 'Max-rank latency per iteration (us)', {
      x: range(it.length), xTitle: 'timed iteration', yTitle: 'us',
      series: OPS.map((op, k) => ({ name: op, values: arr(d[op].iterations && d[op].iterations.max_rank_us), color: PALETTE[k] })),
    });
  }

  function benchPhases(d, P) {
    if (!OPS.some((op) => d[op].counters)) return;
    const grid = section('Where the time goes', 'Average time per call in each phase of the engine, per rank (max over the rank\'s workers); "other" is latency no phase covers.');
    for (const op of OPS) {
      const ph = d[op].phases_us || {};
      const names = Object.keys(ph);
      if (names.length === 0) continue;
      bars(grid, 'phases-' + op, op + ': phases per rank (us per call)', {
        categories: rankLabels(P), stacked: true, yTitle: 'us', xTitle: 'rank', unit: 'us', highlight: d[op].slowest_rank,
        series: names.map((n) => ({ name: n, values: ph[n] })),
        note: 'dominant phase: ' + d[op].dominant_phase,
      });
    }
  }

  function benchBytes(d, P) {
    const grid = section('Bytes', 'What the routing moves (counted from topk_idx alone, independent of the engine): per source and destination rank, and per rank remote vs local.');
    const m = d.route && d.route.rows_matrix;
    if (Array.isArray(m) && m.length === P) {
      const labels = rankLabels(P);
      heatmap(grid, 'bytes-dispatch', 'dispatch: bytes from source rank to destination rank', {
        matrix: m.map((row) => row.map((v) => v * d.x_row_bytes)), rowLabels: labels, colLabels: labels,
        rowTitle: 'source rank', colTitle: 'destination rank', fmt: bytes, note: 'the diagonal is local (the rank\'s own window)',
      });
      heatmap(grid, 'bytes-combine', 'combine: bytes from expert rank back to source rank', {
        matrix: range(P).map((e) => range(P).map((s) => m[s][e] * d.y_row_bytes)), rowLabels: labels, colLabels: labels,
        rowTitle: 'expert rank', colTitle: 'source rank', fmt: bytes,
      });
    }
    for (const op of OPS) {
      const o = d[op];
      bars(grid, 'payload-' + op, op + ': payload per rank', {
        categories: rankLabels(P), stacked: true, yTitle: 'bytes', xTitle: 'rank', fmt: bytes,
        series: [{ name: 'remote', values: o.remote_bytes_per_rank }, { name: 'local', values: o.local_bytes_per_rank, color: PALETTE[2] }],
      });
    }
  }

  function diagnoseRankLabel(ranks, r) {
    const info = ranks && ranks[r];
    return info && info.node !== undefined && info.node !== null && info.node !== '' ? r + ' (' + info.node + ')' : String(r);
  }

  function benchDiagnose(d, P) {
    const diag = d.diagnose;
    if (!diag || typeof diag !== 'object') return;
    const ranks = Array.isArray(d.ranks) ? d.ranks : arr(diag.ranks);
    const grid = section('Diagnose', 'Average time each destination rank waited for each source rank\'s rows; abnormal rows (a slow source), columns (a slow destination) and points (a slow link) outlined in red.');
    for (const op of OPS) {
      const g = diag[op];
      if (!g || !Array.isArray(g.matrix_us) || g.matrix_us.length === 0) continue;
      const n = g.matrix_us.length;
      const labels = range(n).map((r) => diagnoseRankLabel(ranks, r));
      const t = g.thresholds || {};
      const c = heatmap(grid, 'diagnose-' + op, op + ': wait per source × destination (us)', {
        matrix: g.matrix_us, rowLabels: labels, colLabels: rankLabels(n), rowTitle: 'source rank', colTitle: 'destination rank',
        flags: { rows: arr(g.abnormal_rows), cols: arr(g.abnormal_cols), points: arr(g.abnormal_points) },
        note: 'thresholds: ' + (Object.keys(t).map((k) => k + ' ' + t[k]).join(', ') || 'the defaults'),
      });
      const ul = html('ul', { class: 'verdict' }, c.fig);
      const list = (v) => (arr(v).length ? arr(v).map((r) => diagnoseRankLabel(ranks, r)).join(', ') : 'none');
      html('li', {}, ul, 'abnormal rows (slow source): ' + list(g.abnormal_rows));
      html('li', {}, ul, 'abnormal columns (slow destination): ' + list(g.abnormal_cols));
      html('li', {}, ul, 'abnormal points (slow link): ' + (arr(g.abnormal_points).length
        ? arr(g.abnormal_points).map((p) => diagnoseRankLabel(ranks, p[0]) + '→' + diagnoseRankLabel(ranks, p[1]) + ' ' + num(p[2]) + ' us (' + num(p[3]) + '× mean)').join('; ')
        : 'none'));
    }
    if (P && ranks.length && ranks[0] && ranks[0].pid !== undefined)
      html('p', { class: 'note' }, grid, 'ranks: ' + ranks.map((r) => r.rank + ' pid ' + r.pid + (r.node !== undefined ? ' on ' + r.node : '')).join(', '));
  }

  function benchRouting(d, P) {
    const r = d.route;
    if (!r) return;
    const grid = section('Routing', 'Unique destination ranks per token (a token goes to each destination once), rows per rank and per expert.');
    const hist = arr(r.unique_dest_hist);
    bars(grid, 'route-histogram', 'Tokens by their number of unique destination ranks', {
      categories: hist.map((_, i) => String(i)), xTitle: 'unique destination ranks', yTitle: 'tokens', values: true,
      series: [{ name: 'tokens', values: hist }], note: 'average ' + num(r.avg_unique_dest) + ' destinations per token',
    });
    bars(grid, 'route-rows', 'Rows per rank', {
      categories: rankLabels(P), xTitle: 'rank', yTitle: 'rows', highlight: r.slowest_rank,
      series: [{ name: 'sent', values: r.sent_rows_per_rank }, { name: 'received', values: r.recv_rows_per_rank }],
      note: 'received max/avg ' + num(r.rank_recv && r.rank_recv.imbalance, 3) + '; slowest rank (dispatch + combine) ' + r.slowest_rank,
    });
    const e = arr(r.rows_per_expert);
    bars(grid, 'route-experts', 'Slots per expert', {
      categories: e.map((_, i) => String(i)), xTitle: 'expert', yTitle: 'slots', series: [{ name: 'slots', values: e, color: PALETTE[6] }],
      note: 'max/avg ' + num(r.expert_rows && r.expert_rows.imbalance, 3),
    });
  }

  function benchEplb(d, P) {
    const e = d.eplb;
    if (!e || !e.without || !e.with) return;
    const grid = section('EPLB', 'Rows received per rank without and with the replicas (' + e.choice + ' choice, ' + e.replicas + ' physical experts).');
    bars(grid, 'eplb-rows', 'Rows received per rank: without vs with replicas', {
      categories: rankLabels(P), xTitle: 'rank', yTitle: 'rows',
      series: [{ name: 'without (logical)', values: e.without.recv_rows_per_rank, color: PALETTE[9] }, { name: 'with replicas', values: e.with.recv_rows_per_rank }],
      note: 'max/avg ' + num(e.without.rows_imbalance, 3) + ' → ' + num(e.with.rows_imbalance, 3),
    });
  }

  function benchPage(d) {
    // "ranks" is the count; a diagnose run may put each rank's {rank, pid, node} there instead.
    d.ranks_count = typeof d.ranks === 'number' ? d.ranks : arr(d.ranks).length;
    const P = d.ranks_count;
    benchHeader(d);
    benchSummary(d);
    benchVersus(d);
    benchLatency(d, P);
    benchPhases(d, P);
    benchBytes(d, P);
    benchDiagnose(d, P);
    benchRouting(d, P);
    benchEplb(d, P);
  }

  // ---- epx sim ------------------------------------------------------------------------

  function simProfile(p, o, multi) {
    const pts = arr(p.points);
    const ep = pts.map((q) => q.ep);
    const pub = arr(p.published);
    const grid = section('Predictions: ' + p.hardware,
      'The real engine on simulated ranks, times from the hardware model of ' + p.hardware + (pub.length ? '; the published measurements as ranges' : '') + '.');
    const lim = p.payload_limit_gbps;
    lines(grid, 'sim-gbps-' + p.hardware, p.hardware + ': GB/s per rank (avg over ranks; dashed: the slowest rank)', {
      x: ep, log2: true, xLabel: (v) => 'EP' + v, xTitle: 'EP size', yTitle: 'GB/s per rank',
      series: [
        { name: 'dispatch', values: pts.map((q) => q.dispatch_gbps), color: PALETTE[0] },
        { name: 'combine', values: pts.map((q) => q.combine_gbps), color: PALETTE[3] },
        { name: 'dispatch, slowest rank', values: pts.map((q) => q.dispatch_gbps_slowest), color: PALETTE[0], dash: true },
        { name: 'combine, slowest rank', values: pts.map((q) => q.combine_gbps_slowest), color: PALETTE[3], dash: true },
      ],
      ranges: [
        { name: 'published dispatch', color: '#1f4e79', items: pub.filter((q) => q.dispatch_gbps).map((q) => ({ x: q.ep, lo: q.dispatch_gbps.low, hi: q.dispatch_gbps.high })) },
        { name: 'published combine', color: '#8e1b1b', items: pub.filter((q) => q.combine_gbps).map((q) => ({ x: q.ep, lo: q.combine_gbps.low, hi: q.combine_gbps.high })) },
      ],
      band: lim ? { lo: lim.low, hi: lim.high, name: 'physical payload limit' } : null,
      note: p.published_note || null,
    });
    lines(grid, 'sim-latency-' + p.hardware, p.hardware + ': max-rank latency (us)', {
      x: ep, log2: true, xLabel: (v) => 'EP' + v, xTitle: 'EP size', yTitle: 'us',
      series: [{ name: 'dispatch', values: pts.map((q) => q.dispatch_us), color: PALETTE[0] }, { name: 'combine', values: pts.map((q) => q.combine_us), color: PALETTE[3] }],
    });
    const parts = [['data plane', 'data_us'], ['control plane', 'control_us'], ['sync', 'sync_us'], ['tail', 'tail_us']];
    for (const op of OPS) {
      bars(grid, 'sim-split-' + op + '-' + p.hardware, p.hardware + ': ' + op + ' time split (us, avg over ranks)', {
        categories: ep.map((v) => 'EP' + v), stacked: true, yTitle: 'us', xTitle: 'EP size', unit: 'us',
        series: parts.map(([name, key]) => ({ name, values: pts.map((q) => q[op + '_split'][key]) })),
      });
    }
    const without = pts.length && pts[0].combine_gbps_without ? Object.keys(pts[0].combine_gbps_without) : [];
    if (without.length) {
      bars(grid, 'sim-attribution-' + p.hardware, p.hardware + ': combine GB/s with one mechanism of the model removed', {
        categories: ep.map((v) => 'EP' + v), yTitle: 'GB/s',
        series: [{ name: 'full model', values: pts.map((q) => q.combine_gbps) }].concat(
          without.map((w) => ({ name: 'without ' + w, values: pts.map((q) => q.combine_gbps_without[w]) }))),
      });
    }
  }

  function simPage(d) {
    const o = d.options || {};
    configList(Object.keys(o).map((k) => [k, o[k]]));
    const profiles = arr(d.profiles);
    profiles.forEach((p) => simProfile(p, o, profiles.length > 1));
    if (profiles.length > 1) {
      const grid = section('Profiles side by side', 'Each hardware profile\'s predicted GB/s per rank (average over ranks).');
      for (const op of OPS) {
        const eps = Array.from(new Set([].concat(...profiles.map((p) => arr(p.points).map((q) => q.ep))))).sort((a, b) => a - b);
        lines(grid, 'sim-profiles-' + op, op + ': GB/s per rank by profile', {
          x: eps, log2: true, xLabel: (v) => 'EP' + v, xTitle: 'EP size', yTitle: 'GB/s per rank',
          series: profiles.map((p) => ({ name: p.hardware, values: eps.map((e) => { const q = arr(p.points).find((x) => x.ep === e); return q ? q[op + '_gbps'] : NaN; }) })),
        });
      }
    }
  }

  // ---- main -----------------------------------------------------------------------------

  function fail(e) {
    const root = document.getElementById('report');
    html('p', { id: 'page-error' }, root, 'This page could not draw its report: ' + (e && e.message ? e.message : e));
    document.body.dataset.drawn = 'failed';
    throw e;
  }

  try {
    const t0 = performance.now();
    const data = JSON.parse(document.getElementById('epx-data').textContent);
    if (document.body.dataset.kind === 'sim') simPage(data);
    else benchPage(data);
    document.body.dataset.charts = String(document.querySelectorAll('figure.chart').length);
    document.body.dataset.drawMs = (performance.now() - t0).toFixed(0);
    document.body.dataset.drawn = 'yes';
  } catch (e) {
    fail(e);
  }
})();
