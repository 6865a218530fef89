/**
 * The dashboard's stylesheet and script, served as files (/assets/app.css,
 * /assets/app.js) so the Content-Security-Policy can forbid every inline
 * script and style. They ship in the package as these strings: no build step,
 * no download.
 *
 * app.js does four things: (1) every refresh interval it re-fetches the page
 * and swaps only the `[data-region]` elements whose markup changed, keeping
 * ticked boxes ticked; (2) it asks confirm() before a button with
 * `data-confirm` submits, and marks the form confirmed; (3) it draws the live
 * queue-size chart as SVG from /api/overview; (4) it remembers the refresh
 * interval the user picked. It writes text with textContent only.
 */
import { createHash } from 'node:crypto';

export const CSS = `
:root{--bg:#f6f7f9;--card:#fff;--fg:#1d2330;--muted:#6b7385;--line:#e3e6ec;--accent:#3b5bdb;--accent-fg:#fff;--ok:#2f9e44;--warn:#e67700;--bad:#e03131;--chip:#eef1f6;--code:#f1f3f7;
--s0:#3b5bdb;--s1:#2f9e44;--s2:#e67700;--s3:#ae3ec9;--s4:#1098ad;--s5:#e03131;--s6:#f08c00;--s7:#5c7cfa;color-scheme:light dark}
@media (prefers-color-scheme:dark){:root{--bg:#14171c;--card:#1c2028;--fg:#e5e8ee;--muted:#98a0b3;--line:#2c323d;--accent:#748ffc;--accent-fg:#0b0d12;--chip:#262b35;--code:#232833;--ok:#51cf66;--warn:#ffa94d;--bad:#ff6b6b}}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
code,pre,.preview{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
h1{font-size:22px;margin:4px 0 14px;font-weight:650;word-break:break-all}h1 code{font-size:19px}h2{font-size:15px;margin:0 0 10px;font-weight:600}h3{font-size:13px;margin:14px 0 6px;color:var(--muted);font-weight:600;text-transform:uppercase;letter-spacing:.04em}
.top{position:sticky;top:0;z-index:5;display:flex;flex-wrap:wrap;align-items:center;gap:8px 20px;padding:10px 24px;background:var(--card);border-bottom:1px solid var(--line)}
.brand{font-weight:750;font-size:16px;color:var(--fg);letter-spacing:.01em}
.main-nav{display:flex;gap:4px;flex-wrap:wrap}.main-nav a{padding:6px 10px;border-radius:6px;color:var(--fg)}.main-nav a[aria-current=page]{background:var(--chip);font-weight:600}
.tools{margin-left:auto;display:flex;align-items:center;gap:10px;font-size:13px}
.refresh select,#live-metric{font:inherit;padding:3px 6px;border:1px solid var(--line);border-radius:6px;background:var(--card);color:var(--fg)}
main{max-width:1440px;margin:0 auto;padding:18px 24px 40px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 16px;margin:0 0 16px;min-width:0}
.card-head{display:flex;flex-wrap:wrap;align-items:baseline;justify-content:space-between;gap:6px 12px;margin-bottom:8px}.card-head h2{margin:0}
.grid2{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:16px}.grid2{margin:0 0 16px}.grid2>.card{margin:0}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(128px,1fr));gap:10px;margin:0 0 16px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:10px 12px}
.tile-value{font-size:20px;font-weight:650;font-variant-numeric:tabular-nums}.tile-label{color:var(--muted);font-size:12px}
.tile-warn .tile-value{color:var(--warn)}.tile-bad .tile-value{color:var(--bad)}
.table-wrap{overflow-x:auto;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;width:100%}
th,td{padding:7px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top;white-space:nowrap}
thead th{font-size:12px;color:var(--muted);font-weight:600;text-transform:lowercase}
tbody tr:hover{background:color-mix(in srgb,var(--chip) 60%,transparent)}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.muted a,.muted{color:var(--muted)}.small{font-size:12px;font-weight:400}
td.bad,.bad{color:var(--bad)}td.warn-retry a{color:var(--warn)}td.warn-archived a{color:var(--bad)}
td.type{max-width:260px;overflow:hidden;text-overflow:ellipsis}
td.payload{max-width:340px;overflow:hidden;text-overflow:ellipsis}
td.id code{display:inline-block;max-width:210px;overflow:hidden;text-overflow:ellipsis;vertical-align:bottom}
td.error-text{max-width:320px;overflow:hidden;text-overflow:ellipsis;color:var(--bad)}
td.deps{max-width:340px;overflow:hidden;text-overflow:ellipsis}
td.actions{text-align:right}td.check,th.check{width:28px}
.badge{display:inline-block;padding:1px 8px;border-radius:999px;font-size:12px;font-weight:600;background:var(--chip);color:var(--muted);vertical-align:middle}
.badge-warn,.badge-retry,.badge-scheduled{background:color-mix(in srgb,var(--warn) 18%,transparent);color:var(--warn)}
.badge-bad,.badge-archived{background:color-mix(in srgb,var(--bad) 16%,transparent);color:var(--bad)}
.badge-ok,.badge-active,.badge-completed{background:color-mix(in srgb,var(--ok) 16%,transparent);color:var(--ok)}
.badge-pending,.badge-aggregating,.badge-waiting{background:color-mix(in srgb,var(--accent) 16%,transparent);color:var(--accent)}
.btn{font:inherit;font-size:13px;padding:4px 10px;border:1px solid var(--line);border-radius:6px;background:var(--card);color:var(--fg);cursor:pointer;white-space:nowrap}
.btn:hover{border-color:var(--muted)}.btn-primary{background:var(--accent);border-color:var(--accent);color:var(--accent-fg)}
.btn-danger{color:var(--bad);border-color:color-mix(in srgb,var(--bad) 45%,var(--line))}
form.inline{display:inline}form .btn+.btn{margin-left:6px}td.actions .btn{margin-left:4px;padding:2px 8px;font-size:12px}
.head-actions{display:flex;gap:8px;flex-wrap:wrap}.head-actions form{display:inline}
.page-head{display:flex;flex-wrap:wrap;align-items:center;justify-content:space-between;gap:8px 16px}
.crumbs{font-size:13px;color:var(--muted);margin-bottom:4px;word-break:break-all}
.tabs{display:flex;flex-wrap:wrap;gap:4px;border-bottom:1px solid var(--line);margin:-4px 0 12px;padding-bottom:8px}
.tab{padding:6px 10px;border-radius:6px;color:var(--fg)}.tab.current{background:var(--accent);color:var(--accent-fg);font-weight:600}
.count{display:inline-block;min-width:20px;padding:0 6px;margin-left:2px;border-radius:999px;background:var(--chip);color:var(--muted);font-size:12px;text-align:center;font-variant-numeric:tabular-nums}
.tab.current .count{background:color-mix(in srgb,var(--accent-fg) 25%,transparent);color:var(--accent-fg)}
.search{display:flex;gap:8px;margin:0 0 12px;max-width:520px}
.search input[type=search]{flex:1;min-width:0;font:inherit;padding:5px 10px;border:1px solid var(--line);border-radius:6px;background:var(--card);color:var(--fg)}
.bulk{display:flex;flex-wrap:wrap;gap:8px 20px;align-items:center;margin:0 0 8px;font-size:13px}.bulk-group{display:flex;flex-wrap:wrap;gap:6px;align-items:center}
.groups{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin:0 0 10px}
.seg{display:inline-block;padding:3px 9px;border:1px solid var(--line);border-radius:6px;color:var(--fg);font-size:13px}.seg.current{background:var(--chip);font-weight:600}
.segs{display:flex;gap:4px}
.chip{display:inline-block;padding:1px 8px;margin:0 4px 4px 0;border-radius:999px;background:var(--chip);color:var(--fg);font-size:12px}
.list-foot{display:flex;flex-wrap:wrap;justify-content:space-between;align-items:center;gap:8px;margin-top:10px}
.pager{display:flex;flex-wrap:wrap;gap:4px}.page{padding:3px 9px;border:1px solid var(--line);border-radius:6px;color:var(--fg);font-size:13px}.page.current{background:var(--accent);color:var(--accent-fg);border-color:var(--accent)}.page.gap{border:0}
.page-sizes{display:flex;gap:4px;align-items:center;font-size:13px}
.empty{color:var(--muted);margin:8px 0}.note{color:var(--muted);margin:0 0 10px}
.flash{padding:10px 14px;border-radius:8px;margin:0 0 14px;border:1px solid var(--line);background:var(--card)}
.flash-ok{border-color:color-mix(in srgb,var(--ok) 45%,var(--line))}.flash-err{border-color:color-mix(in srgb,var(--bad) 55%,var(--line));color:var(--bad)}
.facts{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:6px 16px;margin:0}.facts dt{color:var(--muted)}.facts dd{margin:0;word-break:break-word}
pre.code{margin:0;padding:12px;background:var(--code);border-radius:8px;overflow:auto;max-height:480px;white-space:pre}
pre.error-text{white-space:pre-wrap;color:var(--bad)}
.timeline{list-style:none;margin:0;padding:0}.timeline li{padding:4px 0 4px 14px;border-left:2px solid var(--line);margin-left:4px}.timeline li.future{border-left-style:dashed;opacity:.8}
.timeline pre.attempt-error{margin:6px 0 2px;padding:8px 10px;max-height:160px;font-size:12px}
.progress-row{display:flex;align-items:center;gap:12px}.progress{flex:1;min-width:0}.progress-svg{width:100%;height:12px;display:block;border-radius:6px;overflow:hidden}.progress-value{font-weight:600;font-variant-numeric:tabular-nums;white-space:nowrap}
pre.progress-json{margin-top:10px;max-height:240px}
.log-wrap{max-height:480px;overflow:auto}table.logs td{padding:3px 8px;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}table.logs td.log-msg{width:100%;white-space:pre-wrap;word-break:break-word}
table.kv th{width:1%;color:var(--muted);font-weight:500}table.kv td{white-space:pre-wrap;word-break:break-all}
.chart-svg{width:100%;height:auto;display:block}
.live-chart{min-height:120px}.live-chart svg{width:100%;height:auto;display:block}
.grid{stroke:var(--line);stroke-width:1}.axis{fill:var(--muted);font-size:11px}
.bar-ok{fill:color-mix(in srgb,var(--ok) 75%,transparent)}.bar-fail{fill:var(--bad)}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:6px 0 0;font-size:12px;color:var(--muted);align-items:center}
.key{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:middle}
.key-ok{background:color-mix(in srgb,var(--ok) 75%,transparent)}.key-fail{background:var(--bad)}
.line{fill:none;stroke-width:2}.dot{stroke:none}
.s0{stroke:var(--s0);fill:var(--s0)}.s1{stroke:var(--s1);fill:var(--s1)}.s2{stroke:var(--s2);fill:var(--s2)}.s3{stroke:var(--s3);fill:var(--s3)}.s4{stroke:var(--s4);fill:var(--s4)}.s5{stroke:var(--s5);fill:var(--s5)}.s6{stroke:var(--s6);fill:var(--s6)}.s7{stroke:var(--s7);fill:var(--s7)}
path.line.s0,path.line.s1,path.line.s2,path.line.s3,path.line.s4,path.line.s5,path.line.s6,path.line.s7{fill:none}
.key.s0{background:var(--s0)}.key.s1{background:var(--s1)}.key.s2{background:var(--s2)}.key.s3{background:var(--s3)}.key.s4{background:var(--s4)}.key.s5{background:var(--s5)}.key.s6{background:var(--s6)}.key.s7{background:var(--s7)}
.meter{margin:8px 0 0}.meter-svg{width:100%;height:6px;display:block}.meter-bg{fill:var(--chip)}.meter-fg{fill:var(--accent)}
.inline-facts{grid-template-columns:max-content minmax(0,1fr) max-content minmax(0,1fr)}
.error-page{max-width:640px}
@media (max-width:900px){.grid2{grid-template-columns:minmax(0,1fr)}.inline-facts{grid-template-columns:max-content minmax(0,1fr)}}
@media (max-width:600px){.top{padding:6px 10px;gap:2px 8px}.main-nav a{padding:5px 7px}.tools{margin-left:0;width:100%;font-size:12px}main{padding:10px 8px 32px}h1{font-size:19px}h1 code{font-size:15px}
.tiles{grid-template-columns:repeat(3,minmax(0,1fr));gap:6px}.tile{padding:7px 8px}.tile-value{font-size:16px}.tile-label{font-size:11px}.card{padding:12px 10px}
th,td{padding:6px 6px}td.payload,td.type{max-width:160px}td.id code{max-width:120px}.search{max-width:none}}
`;

export const JS = `'use strict';
(function () {
  var body = document.body;
  var KEY = 'pgasynq.refresh';
  var timer = null;
  var chart = null;

  function interval() {
    var saved = null;
    try { saved = localStorage.getItem(KEY); } catch (e) {}
    var v = saved !== null ? Number(saved) : Number(body.getAttribute('data-refresh'));
    return isFinite(v) && v >= 0 ? v : 5000;
  }

  function stamp(text) {
    var el = document.getElementById('updated');
    if (el) el.textContent = text;
  }

  function checkedIds(root) {
    var out = {};
    root.querySelectorAll('input[type=checkbox][name=id]').forEach(function (c) { if (c.checked) out[c.value] = true; });
    return out;
  }

  function swap(doc) {
    document.querySelectorAll('[data-region]').forEach(function (old) {
      if (!old.id) return;
      var fresh = doc.getElementById(old.id);
      if (!fresh || fresh.outerHTML === old.outerHTML) return;
      var ticked = checkedIds(old);
      var focused = old.contains(document.activeElement);
      if (focused && document.activeElement.tagName !== 'A' && document.activeElement.tagName !== 'BUTTON') return;
      var node = document.importNode(fresh, true);
      old.replaceWith(node);
      node.querySelectorAll('input[type=checkbox][name=id]').forEach(function (c) { if (ticked[c.value]) c.checked = true; });
    });
    if (doc.title) document.title = doc.title;
  }

  function refresh() {
    if (document.visibilityState !== 'visible') return Promise.resolve();
    var url = new URL(location.href);
    url.searchParams.delete('flash');
    var page = fetch(url.href, { credentials: 'same-origin', cache: 'no-store' })
      .then(function (r) {
        if (!r.ok || r.redirected) throw new Error('HTTP ' + r.status);
        return r.text();
      })
      .then(function (text) {
        swap(new DOMParser().parseFromString(text, 'text/html'));
        stamp('updated ' + new Date().toLocaleTimeString());
      });
    var all = chart ? Promise.all([page, chart.poll()]) : page;
    return all.catch(function (e) { stamp('not updated: ' + e.message); });
  }

  function schedule() {
    if (timer) clearTimeout(timer);
    timer = null;
    var ms = interval();
    if (ms > 0) timer = setTimeout(function () { refresh().then(schedule); }, ms);
  }

  // Confirmation: a button with data-confirm asks first; the form then says it was confirmed.
  document.addEventListener('submit', function (e) {
    var b = e.submitter;
    var form = e.target;
    var msg = b && b.getAttribute('data-confirm');
    if (b && b.getAttribute('data-scope') === 'selected' && !form.querySelector('input[type=checkbox][name=id]:checked')) {
      e.preventDefault();
      alert('Select one or more tasks first.');
      return;
    }
    if (!msg) return;
    if (!confirm(msg)) { e.preventDefault(); return; }
    var c = document.createElement('input');
    c.type = 'hidden'; c.name = 'confirmed'; c.value = '1';
    form.appendChild(c);
  });

  // Select all on this page.
  document.addEventListener('change', function (e) {
    var t = e.target;
    if (!t.hasAttribute || !t.hasAttribute('data-select-all')) return;
    var form = t.closest('form') || document;
    form.querySelectorAll('input[type=checkbox][name=id]').forEach(function (c) { c.checked = t.checked; });
  });

  // ---- live chart
  var SVGNS = 'http://www.w3.org/2000/svg';
  function el(name, attrs, parent) {
    var n = document.createElementNS(SVGNS, name);
    for (var k in attrs) n.setAttribute(k, String(attrs[k]));
    if (parent) parent.appendChild(n);
    return n;
  }
  function nice(v) {
    if (v <= 0) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var ms = [1, 2, 5, 10];
    for (var i = 0; i < ms.length; i++) if (ms[i] * p >= v) return ms[i] * p;
    return 10 * p;
  }
  function fmt(n) { return Math.round(n).toLocaleString('en-US'); }

  function Chart(box, select) {
    var self = this;
    var data = { samples: [] };
    try { data = JSON.parse(document.getElementById('live-data').textContent || '{}'); } catch (e) {}
    self.samples = data.samples || [];
    self.poll = function () {
      return fetch(box.getAttribute('data-src'), { credentials: 'same-origin', cache: 'no-store' })
        .then(function (r) { if (!r.ok) throw new Error('HTTP ' + r.status); return r.json(); })
        .then(function (j) { self.samples = j.samples || []; self.draw(); });
    };
    self.draw = function () {
      var metric = select ? select.value : 'size';
      var W = 720, H = 200, L = 56, R = 10, T = 10, B = 24;
      var now = self.samples.length ? self.samples[self.samples.length - 1].t : Date.now();
      // The window grows with the samples kept: at least 2 minutes, at most 10.
      var first = self.samples.length ? self.samples[0].t : now;
      var from = Math.max(now - 10 * 60 * 1000, Math.min(first, now - 2 * 60 * 1000));
      var names = {};
      self.samples.forEach(function (s) { for (var q in s.queues) names[q] = true; });
      var queues = Object.keys(names).sort();
      var max = 0;
      self.samples.forEach(function (s) { queues.forEach(function (q) { var c = s.queues[q]; if (c && c[metric] > max) max = c[metric]; }); });
      max = nice(max);
      var x = function (t) { return L + ((t - from) / (now - from || 1)) * (W - L - R); };
      var y = function (v) { return T + (H - T - B) - (v / max) * (H - T - B); };
      var svg = el('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': 'queue ' + metric + ' over the last 10 minutes' });
      [0, 0.5, 1].forEach(function (f) {
        el('line', { 'class': 'grid', x1: L, x2: W - R, y1: y(max * f), y2: y(max * f) }, svg);
        var t = el('text', { 'class': 'axis', x: L - 6, y: y(max * f) + 4, 'text-anchor': 'end' }, svg);
        t.textContent = (Number.isInteger(max * f) ? fmt(max * f) : (max * f).toFixed(1));
      });
      var span = now - from;
      [1, 0.5, 0].forEach(function (f) {
        var t = el('text', { 'class': 'axis', x: x(now - f * span), y: H - 6, 'text-anchor': f === 1 ? 'start' : f === 0 ? 'end' : 'middle' }, svg);
        var s = Math.round((f * span) / 1000);
        t.textContent = f === 0 ? 'now' : s >= 120 ? '-' + Math.round(s / 60) + ' min' : '-' + s + ' s';
      });
      queues.forEach(function (q, i) {
        var cls = 's' + (i % 8);
        var d = '', prev = null;
        self.samples.forEach(function (s) {
          if (s.t < from) return;
          var c = s.queues[q];
          if (!c) { prev = null; return; }
          var gap = prev !== null && s.t - prev > Math.max(15000, 3 * interval());
          d += (d === '' || gap ? 'M' : 'L') + x(s.t).toFixed(1) + ' ' + y(c[metric]).toFixed(1) + ' ';
          prev = s.t;
        });
        if (d) el('path', { 'class': 'line ' + cls, d: d }, svg);
        var last = self.samples.length ? self.samples[self.samples.length - 1].queues[q] : null;
        if (last) el('circle', { 'class': 'dot ' + cls, cx: x(now), cy: y(last[metric]), r: 3 }, svg);
      });
      var legend = document.createElement('p');
      legend.className = 'legend';
      queues.forEach(function (q, i) {
        var k = document.createElement('span');
        k.className = 'key s' + (i % 8);
        legend.appendChild(k);
        var last = self.samples[self.samples.length - 1].queues[q];
        legend.appendChild(document.createTextNode(q + (last ? ' ' + fmt(last[metric]) : '') + '  '));
      });
      while (box.firstChild) box.removeChild(box.firstChild);
      if (!self.samples.length) {
        var p = document.createElement('p'); p.className = 'empty'; p.textContent = 'Collecting samples…'; box.appendChild(p);
        return;
      }
      box.appendChild(svg);
      box.appendChild(legend);
    };
    if (select) select.addEventListener('change', self.draw);
    self.draw();
  }

  document.addEventListener('DOMContentLoaded', function () {
    var sel = document.getElementById('refresh-select');
    if (sel) {
      sel.value = String(interval());
      if (sel.value === '') { var o = document.createElement('option'); o.value = String(interval()); o.textContent = interval() / 1000 + ' s'; sel.appendChild(o); sel.value = o.value; }
      sel.addEventListener('change', function () {
        try { localStorage.setItem(KEY, sel.value); } catch (e) {}
        schedule();
      });
    }
    var box = document.getElementById('live-chart');
    if (box) chart = new Chart(box, document.getElementById('live-metric'));
    var url = new URL(location.href);
    if (url.searchParams.has('flash')) { url.searchParams.delete('flash'); history.replaceState(null, '', url.pathname + url.search + url.hash); }
    schedule();
  });
})();
`;

/** An ETag for a static body. */
export function etagOf(text: string): string {
  return `"${createHash('sha256').update(text).digest('base64url').slice(0, 16)}"`;
}
