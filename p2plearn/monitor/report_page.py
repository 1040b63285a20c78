"""The report's HTML: one file with its data, script and style inline (it opens offline, from disk).

``render(data)`` puts ``report.report_data``'s object in a JSON <script> block; the script draws,
with the live page's own drawing functions (``page.DRAW_JS``): the loss curves, a table and
stacked bars of each rank's time split, the flows over time, the plans and the events. Elements
carry ``data-*`` attributes (a curve's rank and points, a split row's rank, a plan's edges) for
tests and scripts that read the page.
"""

from __future__ import annotations

from typing import Any

from .page import CSS, DRAW_JS, script_json

HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>__CSS__
.bar{height:12px;display:inline-block}.bar.compute{background:#9bbce0}.bar.send{background:#e0a458}
.bar.wait{background:#c9c9c9}span.send{color:#c07a20}span.wait{color:#888}
.plans{display:flex;flex-wrap:wrap;gap:1em}.plans figure{margin:0}figcaption{font-size:11px;color:#555}
</style></head>
<body>
<header><h1 id="title"></h1><p id="summary"></p></header>
<section><h2>Loss per rank</h2><svg id="curves" width="760" height="320"></svg></section>
<section><h2>Where each rank's time went: <span class="compute">compute</span>, <span class="send">its own
sends</span>, <span class="wait">waiting</span> (for its senders, the deadline, the merge)</h2>
<table id="split"><thead><tr><th>rank</th><th>rounds</th><th>compute</th><th>sends</th><th>waiting</th>
<th>split</th><th>sent</th><th>deadline hits</th><th>slow closes</th><th>last loss</th></tr></thead>
<tbody></tbody></table></section>
<section><h2>Flows over time (the plan as the senders reported it)</h2>
<svg id="flows" width="760" height="180"></svg></section>
<section><h2>The plan at <span id="plan-count"></span> moments</h2><div class="plans" id="plans"></div></section>
<section><h2>Events</h2><ol id="events"></ol></section>
<section><h2>Settings</h2><table id="settings"><tbody></tbody></table></section>
<script type="application/json" id="data">__DATA__</script>
<script>__JS__</script>
</body></html>
"""

JS = DRAW_JS + r"""
const data = JSON.parse(document.getElementById('data').textContent);
const unit = data.clock === 'virtual' ? ' s (virtual)' : ' s';
const seconds = x => x >= 100 ? x.toFixed(0) + ' s' : x.toFixed(2) + ' s';

function renderSplit() {
  const most = Math.max(...data.split.map(r => r.compute_s + r.send_s + r.wait_s), 1e-9);
  document.querySelector('#split tbody').replaceChildren(...data.split.map(r => {
    const tr = node('tr', {'data-rank': r.rank});
    const bars = node('td');
    for (const [kind, x] of [['compute', r.compute_s], ['send', r.send_s], ['wait', r.wait_s]]) {
      bars.appendChild(node('span', {class: 'bar ' + kind, style: `width:${(240 * x / most).toFixed(1)}px`,
                                     title: kind + ' ' + seconds(x)}));
    }
    [r.rank, r.rounds, seconds(r.compute_s), seconds(r.send_s), seconds(r.wait_s)].forEach(
      c => tr.appendChild(node('td', {}, String(c))));
    tr.appendChild(bars);
    [si(r.bytes_sent, 'B'), r.deadline_hits, r.slow_closes, num(r.last_loss)].forEach(
      c => tr.appendChild(node('td', {}, String(c))));
    return tr;
  }));
}

function renderFlows() {
  const box = document.getElementById('flows'), W = 760, H = 180, L = 50, B = 24;
  if (!data.flows.length) {
    box.replaceChildren(svg('text', {class: 'axis', x: 20, y: 30}, 'no plan in the log directory (the coordinator ' +
                                     'writes it when given --log-dir)'));
    return;
  }
  const t1 = Math.max(...data.flows.map(f => f[0]), 1e-9), most = Math.max(...data.flows.map(f => f[1]), 1);
  const X = t => L + (W - L - 10) * t / t1, Y = n => 10 + (H - B - 10) * (1 - n / most);
  box.replaceChildren(
    svg('text', {class: 'axis', x: 2, y: 14}, most + ' flows'), svg('text', {class: 'axis', x: 2, y: H - B}, '0'),
    svg('text', {class: 'axis', x: L, y: H - 6}, '0' + unit), svg('text', {class: 'axis', x: W - 90, y: H - 6}, seconds(t1)),
    svg('polyline', {class: 'curve', id: 'flow-count', 'data-points': data.flows.length, stroke: '#4a6fa5',
                     points: data.flows.map(f => X(f[0]).toFixed(1) + ',' + Y(f[1]).toFixed(1)).join(' ')}),
    ...data.flows.map(f => { const c = svg('circle', {cx: X(f[0]).toFixed(1), cy: Y(f[1]).toFixed(1), r: 2, fill: '#4a6fa5'});
                             c.appendChild(svg('title', {}, `${seconds(f[0])}: ${f[1]} flows, mean ${si(f[2], 'B/s')}`));
                             return c; }));
}

function renderPlans() {
  document.getElementById('plan-count').textContent = data.plans.length;
  document.getElementById('plans').replaceChildren(...data.plans.map((p, i) => {
    const fig = node('figure', {class: 'plan', 'data-edges': p.edges.length});
    const box = svg('svg', {id: 'plan-' + i, width: 240, height: 240});
    fig.appendChild(box);
    fig.appendChild(node('figcaption', {}, `${seconds(p.time)}: rounds ${p.min_clock}..${p.max_clock}, ` +
                                           `${p.edges.length} flows` + (p.view_version === null ? '' : ', view ' + p.view_version)));
    drawPlan(box, p.members, p.edges.map(([src, dst, rate]) => ({src, dst, rate, paced: 0})), hue);
    return fig;
  }));
}

document.getElementById('title').textContent = data.title;
document.getElementById('summary').textContent = `${data.ranks} ranks, ${data.rounds} rounds over ` +
  `${seconds(data.duration_s)}${data.clock === 'virtual' ? ' of virtual time' : ''} · from ${data.source}`;
drawCurves(document.getElementById('curves'), data.curves);
renderSplit();
renderFlows();
renderPlans();
document.getElementById('events').replaceChildren(...data.events.map(([t, text]) => node('li', {}, seconds(t) + '  ' + text)));
document.querySelector('#settings tbody').replaceChildren(...Object.entries(data.settings).map(([k, v]) => {
  const tr = node('tr'); tr.appendChild(node('td', {}, k)); tr.appendChild(node('td', {}, String(v))); return tr;
}));
"""


def render(data: dict[str, Any]) -> str:
    """The report's HTML, carrying ``data`` (``report.report_data``)."""
    title = str(data.get("title", "p2plearn job")).replace("&", "&amp;").replace("<", "&lt;")
    # The script is inline: "</" inside it would end the element early (none is there: checked here).
    assert "</" not in JS
    return (HTML.replace("__TITLE__", title).replace("__CSS__", CSS).replace("__JS__", JS)
            .replace("__DATA__", script_json(data)))
