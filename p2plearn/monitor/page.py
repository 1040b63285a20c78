"""The dashboard's page: its HTML, script and style, shipped here whole (nothing from a CDN: it works offline).

The HTML carries the job's state as it was when served, so the page renders at once (and a
browser that runs no timers, such as ``chromium --dump-dom``, sees it); the script then polls
``api/state`` every ``POLL_MS`` and redraws: the peers' table, the plan as a graph (an SVG drawn
here: ranks on a circle, an arrow per reported flow, labelled with its measured rate), a loss
curve per peer, a timeline of each peer's last rounds (a compute bar, then a communication bar,
on the coordinator's clock: a round ends when its report arrives), the settings and the events.
The drawing functions (``DRAW_JS``) are the end-of-job report's too (``report_page``). While the coordinator is unreachable (a failover)
it says so and keeps polling: a successor serving on the same port brings the page back.

Elements carry ``data-*`` attributes (a peer row's rank and state, an edge's ends, a curve's
point count, a timeline bar's rank and round) for tests and scripts that read the page.
"""

from __future__ import annotations

import json
from typing import Any

POLL_MS = 1000
CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'"

HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>p2plearn job</title>
<link rel="stylesheet" href="page.css"></head>
<body>
<header><h1>p2plearn job <span id="job"></span></h1><p id="status">live</p><p id="summary"></p></header>
<section><h2>Peers</h2><table id="peers"><thead><tr><th>rank</th><th>host</th><th>state</th><th>clock</th>
<th>loss</th><th>uplink</th><th>downlink</th><th>compute</th><th>comm.</th><th>merge</th><th>backlog</th>
<th>message</th></tr></thead><tbody></tbody></table></section>
<div class="row">
<section><h2>Plan: last reported flows</h2><svg id="plan" width="420" height="420" viewBox="0 0 420 420"></svg></section>
<section><h2>Loss per peer</h2><svg id="curves" width="560" height="300" viewBox="0 0 560 300"></svg></section>
</div>
<section><h2>Last rounds: <span class="compute">compute</span>, then <span class="comm">communication</span></h2>
<svg id="timeline" width="980" height="40"></svg></section>
<div class="row">
<section><h2>Settings</h2><table id="settings"><tbody></tbody></table></section>
<section><h2>Events</h2><ol id="events"></ol></section>
</div>
<script type="application/json" id="initial">__STATE__</script>
<script src="page.js"></script>
</body></html>
"""

CSS = """body{font:13px system-ui,sans-serif;margin:1em 2em;color:#222}
h1{font-size:1.3em;margin:0}h2{font-size:1.05em;margin:.8em 0 .3em}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}
td:nth-child(2),th:nth-child(2),#settings td{text-align:left}
.row{display:flex;flex-wrap:wrap;gap:2em}
.alive{color:#2a9d3f}.suspected{color:#d08c00}.dead{color:#c0392b}.left{color:#888}
#status.down{color:#c0392b;font-weight:bold}
#events{max-height:300px;overflow:auto;padding-left:2.5em;margin:0}
svg{border:1px solid #ddd;background:#fcfcfc}
.edge{stroke:#4a6fa5;stroke-width:1.5}.edgelabel{font-size:9px;fill:#4a6fa5}
.node text{font-size:11px;text-anchor:middle;dominant-baseline:central;fill:#fff}
.axis{font-size:10px;fill:#555}.curve{fill:none;stroke-width:1.5}
rect.compute{fill:#9bbce0}rect.comm{fill:#e0a458}span.compute{color:#5b8cc2}span.comm{color:#c07a20}
"""

DRAW_JS = r"""'use strict';
const SVG = 'http://www.w3.org/2000/svg';

function node(tag, attrs, text, ns) {
  const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
const svg = (tag, attrs, text) => node(tag, attrs, text, SVG);
const hue = r => `hsl(${(r * 137.5) % 360},65%,42%)`;
function si(x, unit) {
  if (x === null || x === undefined) return '';
  const p = [[1e9, 'G'], [1e6, 'M'], [1e3, 'k']].find(([d]) => Math.abs(x) >= d);
  return p ? (x / p[0]).toFixed(1) + ' ' + p[1] + unit : x.toFixed(0) + ' ' + unit;
}
const secs = x => (x === null || x === undefined) ? '' : (x * 1000).toFixed(1) + ' ms';
const num = x => (x === null || x === undefined) ? '' : Number(x).toPrecision(4);
// The ACK-timed rate; a transfer too short to time has none: its pacing rate, if it was paced.
const flowRate = e => e.rate > 0 ? si(e.rate, 'B/s') : e.paced > 0 ? 'paced ' + si(e.paced, 'B/s') : '';

// A plan as a graph in `box` (an <svg> with width = height): `ranks` on a circle, an arrow per
// edge {src, dst, rate, paced}, labelled with its rate when there are few; color(rank) fills a node.
function drawPlan(box, ranks, edges, color) {
  const W = +box.getAttribute('width'), C = W / 2, n = Math.max(ranks.length, 1), dot = n > 32 ? 4 : 14;
  const R = C - dot - 8, at = {}, id = 'arrow-' + box.id;
  ranks.forEach((r, i) => {
    const a = 2 * Math.PI * i / n - Math.PI / 2;
    at[r] = [C + R * Math.cos(a), C + R * Math.sin(a)];
  });
  const defs = svg('defs');
  const marker = svg('marker', {id: id, viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 6,
                                markerHeight: 6, orient: 'auto-start-reverse'});
  marker.appendChild(svg('path', {d: 'M0,0 L10,5 L0,10 z', fill: '#4a6fa5'}));
  defs.appendChild(marker);
  const items = [defs];
  for (const e of edges) {
    const [a, b] = [at[e.src], at[e.dst]];
    if (!a || !b) continue;
    const [dx, dy] = [b[0] - a[0], b[1] - a[1]], len = Math.hypot(dx, dy) || 1, k = (dot + 2) / len;
    const line = svg('line', {class: 'edge', 'data-src': e.src, 'data-dst': e.dst, x1: a[0] + dx * k,
                              y1: a[1] + dy * k, x2: b[0] - dx * k, y2: b[1] - dy * k, 'marker-end': `url(#${id})`});
    line.appendChild(svg('title', {}, `${e.src} -> ${e.dst}: ${si(e.rate, 'B/s')} (paced ${si(e.paced, 'B/s')})`));
    items.push(line);
    if (edges.length <= 16 && W >= 300) {  // beyond, labels overlap: the rate is in each edge's tooltip
      items.push(svg('text', {class: 'edgelabel', x: a[0] + dx * 0.6, y: a[1] + dy * 0.6}, flowRate(e)));
    }
  }
  for (const r of ranks) {
    const g = svg('g', {class: 'node', 'data-rank': r});
    g.appendChild(svg('circle', {cx: at[r][0], cy: at[r][1], r: dot, fill: color(r)}));
    if (n <= 32) g.appendChild(svg('text', {x: at[r][0], y: at[r][1]}, String(r)));
    g.appendChild(svg('title', {}, 'rank ' + r));
    items.push(g);
  }
  box.replaceChildren(...items);
}

// A curve per rank in `box`: curves = {rank: [[round, loss], ...]}.
function drawCurves(box, curves) {
  const W = +box.getAttribute('width'), H = +box.getAttribute('height'), L = 50, B = 24;
  const all = Object.values(curves).flat();
  if (!all.length) { box.replaceChildren(svg('text', {class: 'axis', x: 20, y: 30}, 'no loss reported yet')); return; }
  const xs = all.map(p => p[0]), ys = all.map(p => p[1]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const X = x => L + (W - L - 10) * (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5);
  const Y = y => 10 + (H - B - 10) * (y1 > y0 ? (y1 - y) / (y1 - y0) : 0.5);
  const items = [svg('text', {class: 'axis', x: 2, y: 14}, num(y1)), svg('text', {class: 'axis', x: 2, y: H - B}, num(y0)),
                 svg('text', {class: 'axis', x: L, y: H - 6}, 'round ' + x0),
                 svg('text', {class: 'axis', x: W - 80, y: H - 6}, 'round ' + x1)];
  for (const [rank, pts] of Object.entries(curves)) {
    items.push(svg('polyline', {class: 'curve', 'data-rank': rank, 'data-points': pts.length, stroke: hue(+rank),
                                points: pts.map(p => X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)).join(' ')}));
  }
  box.replaceChildren(...items);
}
"""

JS = DRAW_JS + r"""
const token = new URLSearchParams(location.search).get('token');
const api = 'api/state' + (token ? '?token=' + encodeURIComponent(token) : '');
const STATE_COLOR = {alive: '#2a9d3f', suspected: '#d08c00', dead: '#c0392b', left: '#999'};

function renderPeers(s) {
  const body = document.querySelector('#peers tbody');
  body.replaceChildren(...s.peers.map(p => {
    const tr = node('tr', {'data-rank': p.rank, 'data-state': p.state});
    const cells = [p.rank, p.host, p.state, p.clock, num(p.loss), si(p.uplink, 'B/s'), si(p.downlink, 'B/s'),
                   secs(p.compute_s), secs(p.comm_s), secs(p.merge_s), p.backlog, si(p.message_bytes, 'B')];
    cells.forEach((c, i) => tr.appendChild(node('td', i === 2 ? {class: p.state} : {}, String(c))));
    return tr;
  }));
}

function renderPlan(s) {
  const live = s.peers.filter(p => p.state === 'alive' || p.state === 'suspected');
  const state = Object.fromEntries(live.map(p => [p.rank, p.state]));
  drawPlan(document.getElementById('plan'), live.map(p => p.rank), s.edges, r => STATE_COLOR[state[r]]);
}

// Each peer's last rounds on the coordinator's clock: a round's report ends it; before it, its
// communication (comm), and before that its compute. Rounds older than a minute are not drawn.
function renderTimeline(s) {
  const box = document.getElementById('timeline'), W = +box.getAttribute('width'), L = 60, ROW = 16;
  const rows = Object.entries(s.timeline || {});
  const ends = rows.flatMap(([, rounds]) => rounds.map(r => r[0]));
  if (!ends.length) { box.replaceChildren(svg('text', {class: 'axis', x: 20, y: 24}, 'no round reported yet')); return; }
  const t1 = Math.max(...ends), shown = rows.map(([rank, rounds]) => [rank, rounds.filter(r => r[0] > t1 - 60)]);
  const t0 = Math.min(...shown.flatMap(([, rounds]) => rounds.map(r => r[0] - r[3] - r[2])));
  const X = t => L + (W - L - 10) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  box.setAttribute('height', 24 + ROW * rows.length);
  const items = [svg('text', {class: 'axis', x: L, y: 20 + ROW * rows.length}, (t0 - t1).toFixed(1) + ' s'),
                 svg('text', {class: 'axis', x: W - 40, y: 20 + ROW * rows.length}, 'now')];
  shown.forEach(([rank, rounds], i) => {
    const y = 4 + ROW * i;
    items.push(svg('text', {class: 'axis', x: 2, y: y + 11}, 'rank ' + rank));
    for (const [end, round, compute, comm] of rounds) {
      const bar = (kind, from, to) => svg('rect', {class: kind, 'data-rank': rank, 'data-round': round, x: X(from).toFixed(1),
                                                    y: y, width: Math.max(1, X(to) - X(from)).toFixed(1), height: ROW - 3});
      items.push(bar('compute', end - comm - compute, end - comm), bar('comm', end - comm, end));
      items[items.length - 1].appendChild(svg('title', {}, `rank ${rank} round ${round}: compute ${secs(compute)}, ` +
                                                             `communication ${secs(comm)}`));
    }
  });
  box.replaceChildren(...items);
}

function render(s) {
  const pr = s.progress || {}, v = s.view || {};
  document.getElementById('job').textContent = s.settings.job_id || '';
  document.getElementById('summary').textContent =
    `term ${v.term} · rounds ${pr.min_clock}..${pr.max_clock} · ${pr.alive} alive · mean loss ${num(pr.loss)}` +
    ` · view version ${v.version} (from round ${v.from_round}) · updated ${new Date(s.time * 1000).toLocaleTimeString()}`;
  renderPeers(s);
  renderPlan(s);
  drawCurves(document.getElementById('curves'), s.curves);
  renderTimeline(s);
  document.querySelector('#settings tbody').replaceChildren(...Object.entries(s.settings).map(([k, v]) => {
    const tr = node('tr'); tr.appendChild(node('td', {}, k)); tr.appendChild(node('td', {}, String(v))); return tr;
  }));
  document.getElementById('events').replaceChildren(...s.events.map(([t, text]) =>
    node('li', {}, new Date(t * 1000).toLocaleTimeString() + '  ' + text)));
}

function poll() {
  const status = document.getElementById('status');
  fetch(api, {cache: 'no-store'})
    .then(r => { if (!r.ok) throw new Error(r.status); return r.json(); })
    .then(s => { render(s); status.textContent = 'live'; status.className = ''; })
    .catch(() => { status.textContent = 'coordinator unreachable: retrying (a successor takes over within seconds)';
                   status.className = 'down'; })
    .finally(() => setTimeout(poll, __POLL_MS__));
}

render(JSON.parse(document.getElementById('initial').textContent));
setTimeout(poll, __POLL_MS__);
""".replace("__POLL_MS__", str(POLL_MS))

STATIC = {  # path -> (content type, body)
    "/page.js": ("text/javascript; charset=utf-8", JS.encode()),
    "/page.css": ("text/css; charset=utf-8", CSS.encode()),
}


def html(state: dict[str, Any]) -> bytes:
    """The page, carrying ``state`` (``JobRecord.to_json``) so that it renders before its first poll."""
    return HTML.replace("__STATE__", script_json(state)).encode()


def script_json(data: Any) -> str:
    """``data`` as JSON that can sit in a <script> element: no "</script>" can end it early."""
    return json.dumps(data).replace("<", "\\u003c")
