// The page's inline stylesheet and its one small script (timeline drawing, zoom, rank selector,
// hover tips). Kept apart from the C++ that writes the sections.
#include "src/report/page_assets.hpp"

namespace stratagem::report {

const char* const kPageCss = R"CSS(
:root{--fg:#1d2330;--muted:#5b6472;--line:#d9dde3;--bg:#fff;
--k0:#4e79a7;--k1:#f28e2b;--k2:#edc948;--k3:#b07aa1;--k4:#e15759;--k5:#59a14f;--k6:#76b7b2;--k7:#9c755f;--k8:#bab0ac;--k9:#ff9da7;--k10:#86bcb6;--k11:#8f2d56}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);background:var(--bg);margin:0 24px 40px}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:16px 0 4px}code{font-size:12px;background:#f3f4f6;padding:0 3px}
.note,.small{color:var(--muted);max-width:1100px}.small{font-size:12px;margin:2px 0}
table.header td{padding:1px 14px 1px 0;vertical-align:top}table.header td:first-child{color:var(--muted)}
nav a{margin-right:14px}
.legend{margin:6px 0}.key{display:inline-flex;align-items:center;gap:4px;margin-right:14px;font-size:12px}
.controls{margin:6px 0}.controls select,.controls button{font:inherit}
.scroll{overflow-x:auto;border:1px solid var(--line);max-width:100%}
.grid-charts{display:flex;flex-wrap:wrap;gap:8px 18px}figure.mem{margin:0;width:420px}figure.mem figcaption{font-size:12px;font-weight:600}
.k0{fill:var(--k0)}.k1{fill:var(--k1)}.k2{fill:var(--k2)}.k3{fill:var(--k3)}.k4{fill:var(--k4)}
.k5{fill:var(--k5)}.k6{fill:var(--k6)}.k7{fill:var(--k7)}.k8{fill:var(--k8)}.k9{fill:var(--k9)}
.k10{fill:var(--k10)}.k11{fill:var(--k11)}
.m0{fill:#4e79a7}.m1{fill:#f28e2b}.m2{fill:#9c755f}.m3{fill:#59a14f}.m4{fill:#b07aa1}.m5{fill:#c9c4c0}
.b-compute{fill:#4e79a7}.b-comm{fill:#e15759}.b-bubble{fill:#d5d9df}.b-memory{fill:#59a14f}
.grid{stroke:#eceef1}.tick{font-size:10px;fill:var(--muted)}.lbl{font-size:11px;fill:var(--fg)}
.axis-title{font-size:12px;fill:var(--muted)}
.capacity,.budget{stroke:#c0392b;stroke-width:1.2;stroke-dasharray:5 3}.budget-label{font-size:11px;fill:#c0392b}
.peak{fill:#c0392b}.peak-label{font-size:10px;fill:#c0392b}
.mb{font-size:9px;fill:#fff;pointer-events:none}
.cand{fill-opacity:.55;stroke-width:1}.cand.over{fill-opacity:0;stroke-opacity:.7}
.o-dp{fill:#4e79a7;stroke:#4e79a7}.o-megatron{fill:#f28e2b;stroke:#f28e2b}.o-zero{fill:#59a14f;stroke:#59a14f}
.pareto{fill:none;stroke:#1d2330;stroke-width:1.5}
.mark{stroke:#1d2330;stroke-width:1.2}.mark.chosen,.chosen{fill:#f1c40f}.mark.megatron{fill:#f28e2b}.mark.zero{fill:#59a14f}
.mark-label{font-size:11px;font-weight:600}
table.cmp{border-collapse:collapse;margin:6px 0 12px}table.cmp th,table.cmp td{padding:2px 10px;border-bottom:1px solid #eef0f2;text-align:left}
table.cmp td.n{text-align:right;font-variant-numeric:tabular-nums}.err{text-align:right}.err.ok{color:#1e8449}.err.bad{color:#c0392b}
.predicted{fill:#4e79a7}.measured{fill:#f28e2b}svg.pair{display:block}
#tip{position:fixed;pointer-events:none;background:#1d2330;color:#fff;font-size:12px;padding:4px 7px;border-radius:3px;max-width:520px;white-space:pre-wrap;display:none;z-index:9}
)CSS";

// Draws the timeline from #timeline-data: per view, one <g class="rank-row"> per rank with one
// row per stream; blocks are [gap, length, class, micro-batch, ops] in time units.
const char* const kPageScript = R"JS(
(function () {
  'use strict';
  var tip = document.getElementById('tip');
  function showTip(e, text) {
    tip.textContent = text; tip.style.display = 'block';
    tip.style.left = Math.min(e.clientX + 12, window.innerWidth - 540) + 'px';
    tip.style.top = (e.clientY + 14) + 'px';
  }
  var tips = [];
  document.addEventListener('mousemove', function (e) {
    var t = e.target, k = t.getAttribute && t.getAttribute('data-k');
    if (k !== null && k !== undefined) return showTip(e, tips[+k]);
    tip.style.display = 'none';
  });
  var dataEl = document.getElementById('timeline-data');
  if (dataEl) {
    var D = JSON.parse(dataEl.textContent), host = document.getElementById('timeline-host');
    var sel = document.getElementById('timeline-view'), zoom = 1, view = 0;
    D.views.forEach(function (v, i) {
      var o = document.createElement('option'); o.value = i; o.textContent = v.name; sel.appendChild(o);
    });
    function fmt(ns) {
      var s = ns * 1e-9;
      if (ns === 0) return '0';
      return s >= 1 ? s.toFixed(3) + ' s' : s >= 1e-3 ? (s * 1e3).toFixed(2) + ' ms' : (s * 1e6).toFixed(1) + ' us';
    }
    function draw() {
      var LW = 210, RH = 14, W = Math.max(600, host.clientWidth - LW - 20) * zoom;
      var px = W / D.span_units, out = [], labels = [], y = 22;
      tips = [];
      var span = D.span_units * D.unit_ns, seen = span / zoom;  // ns across one screen width
      var step = Math.pow(10, Math.floor(Math.log10(seen / 8)));
      if (seen / step > 16) step *= seen / step > 40 ? 5 : 2;
      for (var t = 0; t <= span; t += step) {
        var x = (LW + t / D.unit_ns * px).toFixed(1);
        out.push('<line class="grid" x1="' + x + '" x2="' + x + '" y1="14" y2="100%"/><text class="tick" x="' + x + '" y="11">' + fmt(t) + '</text>');
      }
      D.views[view].ranks.forEach(function (ri) {
        var R = D.ranks[ri];
        out.push('<g class="rank-row" data-rank="' + R[0] + '" data-stage="' + R[1] + '">');
        R[2].forEach(function (row) {
          var b = row[1], at = 0, stream = D.streams[row[0]];
          labels.push('<text class="lbl" x="4" y="' + (y + 11) + '">stage ' + R[1] + ' \u00b7 rank ' + R[0] + ' \u00b7 ' + stream + '</text>');
          // Blocks of one class closer than half a pixel are drawn as one rect (the tip counts
          // them): at 1x a 1,024-rank iteration would otherwise be ~10^5 sub-pixel rects.
          var cur = null;
          function flush() {
            if (!cur) return;
            var w = Math.max(0.4, cur.x1 - cur.x0);
            tips.push(D.classes[cur.c].replace('_', ' ') + (cur.n > 1 ? ', ' + cur.n + ' blocks' :
              (cur.mb >= 0 ? ', micro-batch ' + cur.mb : '')) + ', ' + cur.ops + ' op' +
              (cur.ops > 1 ? 's' : '') + '\n' + fmt(cur.s * D.unit_ns) + ' + ' +
              fmt((cur.e - cur.s) * D.unit_ns) + ' (rank ' + R[0] + ', ' + stream + ')');
            out.push('<rect class="k' + cur.c + '" x="' + cur.x0.toFixed(1) + '" y="' + y + '" width="' + w.toFixed(1) + '" height="' + RH + '" data-k="' + (tips.length - 1) + '"/>');
            if (cur.n === 1 && cur.mb >= 0 && w >= 6 * String(cur.mb).length + 4)
              out.push('<text class="mb" x="' + (cur.x0 + w / 2).toFixed(1) + '" y="' + (y + 10) + '" text-anchor="middle">' + cur.mb + '</text>');
            cur = null;
          }
          for (var i = 0; i < b.length; i += 5) {
            var s = at + b[i], e = s + b[i + 1], x0 = LW + s * px, x1 = LW + e * px;
            at = e;
            if (cur && cur.c === b[i + 2] && x0 - cur.x1 < 0.5 && x1 - cur.x0 < 3) {
              cur.x1 = x1; cur.e = e; cur.n++; cur.ops += b[i + 4];
              continue;
            }
            flush();
            cur = {c: b[i + 2], x0: x0, x1: x1, s: s, e: e, mb: b[i + 3], n: 1, ops: b[i + 4]};
          }
          flush();
          y += RH + 2;
        });
        out.push('</g>');
        y += 6;
      });
      // Row labels stay in view while the chart scrolls (see the scroll handler).
      out.push('<g id="timeline-labels" transform="translate(' + host.scrollLeft + ' 0)"><rect x="0" y="0" width="' + (LW - 6) + '" height="100%" fill="#fff"/>' + labels.join('') + '</g>');
      host.innerHTML = '<svg id="timeline-svg" width="' + (LW + W + 10).toFixed(0) + '" height="' + (y + 4) + '">' + out.join('') + '</svg>';
      document.getElementById('zoom-label').textContent = zoom + 'x';
    }
    sel.onchange = function () { view = +sel.value; draw(); };
    host.addEventListener('scroll', function () {
      var g = document.getElementById('timeline-labels');
      if (g) g.setAttribute('transform', 'translate(' + host.scrollLeft + ' 0)');
    });
    function rezoom(z) {  // keeps the centre of the view in place
      var c = (host.scrollLeft + host.clientWidth / 2) / host.scrollWidth;
      zoom = z; draw(); host.scrollLeft = c * host.scrollWidth - host.clientWidth / 2;
    }
    document.getElementById('zoom-in').onclick = function () { rezoom(Math.min(256, zoom * 2)); };
    document.getElementById('zoom-out').onclick = function () { rezoom(Math.max(1, zoom / 2)); };
    draw();
  }
  var ok = document.createElement('div');
  ok.id = 'report-ready'; ok.hidden = true;
  ok.setAttribute('data-ms', Math.round(performance.now()));  // navigation start to drawn
  document.body.appendChild(ok);
})();
)JS";

}  // namespace stratagem::report
