// The ps dashboard: polls the scheduler's api/state about once a second and shows the job,
// its nodes, two charts drawn on <canvas>, the current stalls and the recent events.
// Plain JS, no library, no build step. Everything that comes from the network goes into the
// page through textContent (never innerHTML): node names and reasons are not to be trusted.
// Nothing is written to the console: a failed poll shows a banner and keeps the last data.
"use strict";

(function () {
  const POLL_MS = 1000;            // between the end of one poll and the start of the next
  const FETCH_TIMEOUT_MS = 5000;   // a poll that hangs longer counts as lost contact
  const MIN_SPAN_S = 60;           // the charts show at least this much time
  const STATE_CLASSES = ["alive", "silent", "dead", "closed", "ended"];
  const ROLE_ORDER = { scheduler: 0, worker: 1, server: 2 };

  const $ = (id) => document.getElementById(id);

  // ---------- small helpers ----------

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function isNum(x) {
    return typeof x === "number" && isFinite(x);
  }

  // a string safe to use as (part of) a class name
  function token(s) {
    return String(s === null || s === undefined ? "unknown" : s).toLowerCase().replace(/[^a-z0-9_-]/g, "_");
  }

  function pad2(n) {
    return (n < 10 ? "0" : "") + n;
  }

  function clock(unixSeconds) {
    if (!isNum(unixSeconds)) return "--:--:--";
    const d = new Date(unixSeconds * 1000);
    return pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds());
  }

  function fullTime(unixSeconds) {
    if (!isNum(unixSeconds)) return "";
    const d = new Date(unixSeconds * 1000);
    return d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate()) + " " + clock(unixSeconds);
  }

  function duration(s) {
    if (!isNum(s)) return "\u2014";
    if (s < 0) s = 0;
    if (s < 10) return s.toFixed(1) + " s";
    if (s < 60) return Math.floor(s) + " s";
    const t = Math.floor(s);
    if (t < 3600) return Math.floor(t / 60) + "m " + pad2(t % 60) + "s";
    if (t < 86400) return Math.floor(t / 3600) + "h " + pad2(Math.floor(t / 60) % 60) + "m";
    return Math.floor(t / 86400) + "d " + pad2(Math.floor(t / 3600) % 24) + "h";
  }

  function ago(s) {
    if (!isNum(s)) return "never";
    return duration(s) + " ago";
  }

  // SI units, 3 significant digits: 950 B/s, 1.20 kB/s, 12.3 MB/s, 123 MB/s
  function si(x, unit) {
    if (!isNum(x)) return "\u2014";
    const prefixes = ["", "k", "M", "G", "T", "P"];
    let i = 0;
    let v = Math.abs(x);
    while (v >= 999.5 && i < prefixes.length - 1) {
      v /= 1000;
      i += 1;
    }
    const sign = x < 0 ? "-" : "";
    const digits = i === 0 ? 0 : v < 9.995 ? 2 : v < 99.95 ? 1 : 0;
    return sign + v.toFixed(digits) + " " + prefixes[i] + unit;
  }

  function rate(bps) {
    return si(bps, "B/s");
  }

  // short axis labels: 0, 500k, 1.5M
  function shortSI(x) {
    if (!isNum(x)) return "";
    if (x === 0) return "0";
    const prefixes = ["", "k", "M", "G", "T", "P"];
    let i = 0;
    let v = Math.abs(x);
    while (v >= 1000 && i < prefixes.length - 1) {
      v /= 1000;
      i += 1;
    }
    return (x < 0 ? "-" : "") + trimNum(v) + prefixes[i];
  }

  function trimNum(v) {
    return String(parseFloat(v.toPrecision(3)));
  }

  function fixed(x, digits) {
    return isNum(x) ? x.toFixed(digits) : "\u2014";
  }

  function integer(x) {
    return isNum(x) ? String(Math.round(x)) : "\u2014";
  }

  function setText(node, text) {
    const s = String(text);
    if (node.textContent !== s) node.textContent = s;
  }

  function setTitle(node, text) {
    const s = text ? String(text) : "";
    if (node.title !== s) node.title = s;
  }

  // replaces the classes of `node` that start with `prefix` by prefix + value
  function setPrefixed(node, prefix, value) {
    for (const c of Array.from(node.classList)) {
      if (c.startsWith(prefix)) node.classList.remove(c);
    }
    node.classList.add(prefix + token(value));
  }

  // ---------- header ----------

  function renderJob(job) {
    job = job || {};
    const stateNode = $("job-state");
    const state = job.state || "unknown";
    const ended = job.ended && typeof job.ended === "object" ? job.ended : null;
    let label = state;
    let cls = state;
    if (state === "ended" && ended) {
      if (isNum(ended.code) && ended.code !== 0) {
        label = "ended (exit " + ended.code + ")";
        cls = "failed";
      } else {
        label = "ended";
      }
    }
    setText(stateNode, label);
    setPrefixed(stateNode, "job-", cls);

    const reason = $("job-reason");
    const reasonText = ended && ended.reason ? String(ended.reason) : "";
    setText(reason, reasonText);
    reason.hidden = !reasonText;
    setTitle(reason, reasonText);

    setText($("job-kvstore"), job.kvstore || "\u2014");
    const w = isNum(job.workers) ? job.workers : "?";
    const s = isNum(job.servers) ? job.servers : "?";
    setText($("job-size"), w + " workers \u00d7 " + s + " servers");
    setText($("job-uptime"), duration(job.uptime));
    setText($("job-sps"), fixed(job.steps_per_second, 1));
    setText($("job-step"), integer(job.step));
    setText($("job-restarts"), integer(job.restarts));
    $("job-restarts").classList.toggle("warn", isNum(job.restarts) && job.restarts > 0);

    let title = "ps \u00b7 " + label;
    if (isNum(job.step)) title += " \u00b7 step " + Math.round(job.step);
    if (document.title !== title) document.title = title;
  }

  // ---------- nodes table ----------

  const COLUMNS = ["role", "rank", "host", "pid", "state", "last-heard", "restarts", "cpu", "rss",
    "in", "out", "in-flight", "step"];
  const NUMERIC = new Set(["rank", "pid", "last-heard", "restarts", "cpu", "rss", "in", "out", "in-flight", "step"]);
  const rows = new Map();          // key -> {tr, cells}

  function nodeName(n) {
    const rank = isNum(n.rank) ? n.rank : "?";
    return token(n.role || "node") + "-" + rank;
  }

  function nodeKey(n) {
    return nodeName(n) + "#" + (n.id === undefined || n.id === null ? "" : String(n.id));
  }

  function compareNodes(a, b) {
    const ra = ROLE_ORDER[a.role] === undefined ? 9 : ROLE_ORDER[a.role];
    const rb = ROLE_ORDER[b.role] === undefined ? 9 : ROLE_ORDER[b.role];
    if (ra !== rb) return ra - rb;
    const ka = isNum(a.rank) ? a.rank : 1e9;
    const kb = isNum(b.rank) ? b.rank : 1e9;
    if (ka !== kb) return ka - kb;
    return (isNum(a.id) ? a.id : 0) - (isNum(b.id) ? b.id : 0);
  }

  function makeRow(n) {
    const tr = el("tr", "node");
    const cells = {};
    for (const c of COLUMNS) {
      const td = el("td", "col-" + c + (NUMERIC.has(c) ? " num" : ""));
      tr.appendChild(td);
      cells[c] = td;
    }
    cells.stateBadge = el("span", "state");
    cells.state.appendChild(cells.stateBadge);
    return { tr: tr, cells: cells };
  }

  function renderNodes(nodes) {
    nodes = Array.isArray(nodes) ? nodes.slice() : [];
    nodes.sort(compareNodes);
    const body = $("nodes-body");
    const seen = new Set();
    if (nodes.length === 0) {
      for (const r of rows.values()) r.tr.remove();
      rows.clear();
      if (!body.querySelector("tr.empty")) {
        const tr = el("tr", "empty");
        const td = el("td", null, "no nodes yet");
        td.colSpan = COLUMNS.length;
        tr.appendChild(td);
        body.appendChild(tr);
      }
      setText($("nodes-count"), "");
      return;
    }
    const empty = body.querySelector("tr.empty");
    if (empty) empty.remove();

    const counts = {};
    for (const n of nodes) {
      const key = nodeKey(n);
      seen.add(key);
      let row = rows.get(key);
      if (!row) {
        row = makeRow(n);
        rows.set(key, row);
      }
      fillRow(row, n);
      body.appendChild(row.tr);     // moves an existing row into sorted order
      const st = n.state || "unknown";
      counts[st] = (counts[st] || 0) + 1;
    }
    for (const [key, row] of rows) {
      if (!seen.has(key)) {
        row.tr.remove();
        rows.delete(key);
      }
    }
    const parts = [];
    for (const st of STATE_CLASSES) if (counts[st]) parts.push(counts[st] + " " + st);
    for (const st of Object.keys(counts)) if (STATE_CLASSES.indexOf(st) < 0) parts.push(counts[st] + " " + st);
    setText($("nodes-count"), parts.join(" \u00b7 "));
  }

  function fillRow(row, n) {
    const c = row.cells;
    const tr = row.tr;
    const name = nodeName(n);
    if (tr.dataset.node !== name) tr.dataset.node = name;
    const state = n.state || "unknown";
    setPrefixed(tr, "state-", state);

    setText(c.role, n.role || "?");
    setText(c.rank, isNum(n.rank) ? n.rank : "?");
    setText(c.host, n.hostname || n.host || "\u2014");
    const hostTitle = [n.name ? "node " + n.name : "", n.host ? "address " + n.host : "",
      isNum(n.since) ? "registered " + fullTime(n.since) : ""].filter(Boolean).join(", ");
    setTitle(c.host, hostTitle);
    setText(c.pid, integer(n.pid));
    setText(c.stateBadge, state);
    setPrefixed(c.stateBadge, "state-", state);
    setText(c["last-heard"], ago(n.last_heard));
    setText(c.restarts, integer(n.restarts));
    c.restarts.classList.toggle("warn", isNum(n.restarts) && n.restarts > 0);
    setText(c.cpu, fixed(n.cpu_percent, 1));
    setText(c.rss, isNum(n.rss_bytes) ? (n.rss_bytes / 1048576).toFixed(1) : "\u2014");
    setText(c.in, rate(n.bytes_in_per_s));
    setText(c.out, rate(n.bytes_out_per_s));
    setText(c["in-flight"], integer(n.in_flight));
    let progress = "\u2014";
    let progressTitle = "";
    if (isNum(n.step)) {
      progress = String(Math.round(n.step));
      progressTitle = "step (pushes of its most-pushed key)";
    } else if (isNum(n.rounds_closed)) {
      progress = String(Math.round(n.rounds_closed));
      progressTitle = "sync rounds closed";
    }
    setText(c.step, progress);
    setTitle(c.step, progressTitle);
  }

  // ---------- stalls ----------

  function renderStalls(stalls) {
    stalls = Array.isArray(stalls) ? stalls : [];
    const box = $("stalls");
    const frag = document.createDocumentFragment();
    if (stalls.length === 0) {
      frag.appendChild(el("p", "empty", "no stalls"));
    } else {
      const ul = el("ul", "stall-list");
      for (const s of stalls) {
        const li = el("li", "stall");
        if (s.text) li.title = String(s.text);
        const head = el("div", "stall-head");
        head.appendChild(el("span", "stall-by", s.by || "?"));
        head.appendChild(el("span", "stall-what", s.what || ""));
        head.appendChild(el("span", "stall-seconds num", duration(s.seconds)));
        li.appendChild(head);
        li.appendChild(listLine("stall-waiting-for", "waiting for", s.waiting_for));
        li.appendChild(listLine("stall-waiting", "waiting", s.waiting));
        if (s.text) li.appendChild(el("div", "stall-text", s.text));
        ul.appendChild(li);
      }
      frag.appendChild(ul);
    }
    box.replaceChildren(frag);
    setText($("stalls-count"), stalls.length ? String(stalls.length) : "");
    $("stalls-card").classList.toggle("has-stalls", stalls.length > 0);
  }

  function listLine(cls, label, items) {
    const div = el("div", cls);
    div.appendChild(el("span", "label", label + ": "));
    const list = Array.isArray(items) ? items.map(String) : [];
    div.appendChild(el("span", "value", list.length ? list.join(", ") : "\u2014"));
    return div;
  }

  // ---------- events ----------

  let eventsSignature = null;

  function renderEvents(events) {
    events = Array.isArray(events) ? events : [];
    const last = events.length ? events[events.length - 1] : null;
    const signature = events.length + "|" + (last ? last.t + "|" + last.kind + "|" + last.text : "");
    if (signature === eventsSignature) return;
    eventsSignature = signature;
    const list = $("events");
    const frag = document.createDocumentFragment();
    if (events.length === 0) {
      frag.appendChild(el("li", "empty", "no events yet"));
    }
    for (let i = events.length - 1; i >= 0; i -= 1) {
      const e = events[i] || {};
      const li = el("li", "event kind-" + token(e.kind));
      const time = el("time", "ev-time num", clock(e.t));
      if (isNum(e.t)) time.title = fullTime(e.t);
      li.appendChild(time);
      li.appendChild(el("span", "ev-kind", String(e.kind || "?").replace(/_/g, " ")));
      li.appendChild(el("span", "ev-text", e.text || ""));
      frag.appendChild(li);
    }
    list.replaceChildren(frag);
    setText($("events-count"), events.length ? String(events.length) : "");
  }

  // ---------- charts ----------

  const COLORS = {
    steps: "#2563eb",
    bytes: "#ea8a0c",
    p50: "#0d9488",
    p95: "#c2410c",
    grid: "#e6e9ee",
    axis: "#9aa3af",
    text: "#4b5563",
    muted: "#9aa3af",
  };
  const TICK_FONT = "11px ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace";
  const LABEL_FONT = "12px system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif";

  function niceStep(raw) {
    if (!(raw > 0) || !isFinite(raw)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / p;
    const nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10;
    return nice * p;
  }

  function maxOf(values) {
    let m = 0;
    for (const v of values || []) if (isNum(v) && v > m) m = v;
    return m;
  }

  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];

  // opts: {t, series: [{label, color, values, axis: "left"|"right", format, dash}],
  //        left: {title, format}, right: {title, format} | null}
  function drawChart(canvas, opts) {
    const rect = canvas.getBoundingClientRect();
    const cssW = Math.max(50, Math.round(rect.width));
    const cssH = Math.max(50, Math.round(rect.height));
    const dpr = window.devicePixelRatio || 1;
    const pw = Math.round(cssW * dpr);
    const ph = Math.round(cssH * dpr);
    if (canvas.width !== pw) canvas.width = pw;
    if (canvas.height !== ph) canvas.height = ph;
    const ctx = canvas.getContext("2d");
    if (!ctx) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cssW, cssH);

    const hasRight = !!opts.right;
    const pad = { left: 48, right: hasRight ? 56 : 30, top: 30, bottom: 22 };
    const x0 = pad.left;
    const x1 = cssW - pad.right;
    const y0 = cssH - pad.bottom;          // bottom of the plot
    const y1 = pad.top;                    // top of the plot
    const plotW = Math.max(1, x1 - x0);
    const plotH = Math.max(1, y0 - y1);

    const t = Array.isArray(opts.t) ? opts.t : [];
    let tMax = null;
    let tMin = null;
    for (const v of t) {
      if (!isNum(v)) continue;
      if (tMin === null || v < tMin) tMin = v;
      if (tMax === null || v > tMax) tMax = v;
    }
    const empty = tMax === null;
    if (empty) {
      tMax = Date.now() / 1000;
      tMin = tMax - MIN_SPAN_S;
    } else if (tMax - tMin < MIN_SPAN_S) {
      tMin = tMax - MIN_SPAN_S;
    }
    const span = tMax - tMin;
    const xOf = (tt) => x0 + ((tt - tMin) / span) * plotW;

    // y axes: the same number of divisions on both, so they share the grid lines
    const leftSeries = opts.series.filter((s) => s.axis !== "right");
    const rightSeries = opts.series.filter((s) => s.axis === "right");
    let leftMax = 0;
    for (const s of leftSeries) leftMax = Math.max(leftMax, maxOf(s.values));
    let rightMax = 0;
    for (const s of rightSeries) rightMax = Math.max(rightMax, maxOf(s.values));
    const divisions = Math.max(2, Math.min(5, Math.floor(plotH / 28)));
    const leftStep = niceStep((leftMax || 1) / divisions);
    const leftDiv = Math.max(1, Math.ceil(((leftMax || 1) / leftStep) - 1e-9));
    const leftTop = leftStep * leftDiv;
    const rightStep = niceStep((rightMax || 1) / leftDiv);
    const rightTop = rightStep * leftDiv;
    const yLeft = (v) => y0 - (v / leftTop) * plotH;
    const yRight = (v) => y0 - (v / rightTop) * plotH;

    // grid and y tick labels
    ctx.lineWidth = 1;
    ctx.font = TICK_FONT;
    ctx.textBaseline = "middle";
    for (let i = 0; i <= leftDiv; i += 1) {
      const y = Math.round(y0 - (i / leftDiv) * plotH) + 0.5;
      ctx.strokeStyle = i === 0 ? COLORS.axis : COLORS.grid;
      ctx.beginPath();
      ctx.moveTo(x0, y);
      ctx.lineTo(x1, y);
      ctx.stroke();
      ctx.fillStyle = COLORS.text;
      ctx.textAlign = "right";
      ctx.fillText(opts.left.format(leftStep * i), x0 - 6, y);
      if (hasRight) {
        ctx.textAlign = "left";
        ctx.fillText(opts.right.format(rightStep * i), x1 + 6, y);
      }
    }

    // time ticks
    let tStep = TIME_STEPS[TIME_STEPS.length - 1];
    const maxTicks = Math.max(2, Math.floor(plotW / 80));
    for (const st of TIME_STEPS) {
      if (span / st <= maxTicks) {
        tStep = st;
        break;
      }
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    ctx.fillStyle = COLORS.text;
    for (let tt = Math.ceil(tMin / tStep) * tStep; tt <= tMax + 1e-6; tt += tStep) {
      const x = Math.round(xOf(tt)) + 0.5;
      ctx.strokeStyle = COLORS.grid;
      ctx.beginPath();
      ctx.moveTo(x, y1);
      ctx.lineTo(x, y0);
      ctx.stroke();
      ctx.strokeStyle = COLORS.axis;
      ctx.beginPath();
      ctx.moveTo(x, y0);
      ctx.lineTo(x, y0 + 4);
      ctx.stroke();
      const label = tStep >= 60 ? clock(tt).slice(0, 5) : clock(tt);
      const half = ctx.measureText(label).width / 2;
      ctx.fillText(label, Math.min(Math.max(x, half + 2), cssW - half - 2), y0 + 6);   // kept inside
    }

    // axis titles
    ctx.font = LABEL_FONT;
    ctx.textBaseline = "alphabetic";
    ctx.fillStyle = COLORS.text;
    ctx.textAlign = "left";
    ctx.fillText(opts.left.title, 4, 13);
    if (hasRight) {
      ctx.textAlign = "right";
      ctx.fillText(opts.right.title, cssW - 4, 13);
    }

    // legend, centred in the top strip: a swatch, the label and the latest value
    const entries = opts.series.map((s) => {
      let latest = null;
      for (let i = (s.values || []).length - 1; i >= 0; i -= 1) {
        if (isNum(s.values[i])) {
          latest = s.values[i];
          break;
        }
      }
      return { s: s, text: s.label + "  " + (latest === null ? "\u2014" : s.format(latest)) };
    });
    ctx.font = LABEL_FONT;
    const widths = entries.map((e) => 22 + ctx.measureText(e.text).width);
    const total = widths.reduce((a, b) => a + b, 0) + 16 * (entries.length - 1);
    let lx = Math.max(x0, (x0 + x1) / 2 - total / 2);
    ctx.textAlign = "left";
    entries.forEach((e, i) => {
      ctx.strokeStyle = e.s.color;
      ctx.lineWidth = 2.5;
      ctx.setLineDash(e.s.dash || []);
      ctx.beginPath();
      ctx.moveTo(lx, 9);
      ctx.lineTo(lx + 16, 9);
      ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = COLORS.text;
      ctx.fillText(e.text, lx + 22, 13);
      lx += widths[i] + 16;
    });

    if (empty) {
      ctx.fillStyle = COLORS.muted;
      ctx.font = LABEL_FONT;
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillText("no data yet", (x0 + x1) / 2, (y0 + y1) / 2);
      return;
    }

    // the series: a gap wherever a value (or its time) is null
    ctx.save();
    ctx.beginPath();
    ctx.rect(x0, y1 - 2, plotW, plotH + 3);
    ctx.clip();
    for (const s of opts.series) {
      const yOf = s.axis === "right" ? yRight : yLeft;
      const vals = s.values || [];
      const n = Math.min(vals.length, t.length);
      ctx.strokeStyle = s.color;
      ctx.fillStyle = s.color;
      ctx.lineWidth = 1.75;
      ctx.lineJoin = "round";
      ctx.setLineDash(s.dash || []);
      ctx.beginPath();
      let penDown = false;
      const dots = [];
      for (let i = 0; i < n; i += 1) {
        const v = vals[i];
        const tt = t[i];
        if (!isNum(v) || !isNum(tt)) {
          penDown = false;
          continue;
        }
        const x = xOf(tt);
        const y = yOf(v);
        if (penDown) {
          ctx.lineTo(x, y);
        } else {
          ctx.moveTo(x, y);
          const next = i + 1 < n ? vals[i + 1] : null;
          if (!isNum(next) || !isNum(t[i + 1])) dots.push([x, y]);   // a lone point
          penDown = true;
        }
      }
      ctx.stroke();
      ctx.setLineDash([]);
      for (const [x, y] of dots) {
        ctx.beginPath();
        ctx.arc(x, y, 2, 0, Math.PI * 2);
        ctx.fill();
      }
    }
    ctx.restore();
  }

  let lastHistory = null;

  function renderCharts(history) {
    lastHistory = history && typeof history === "object" ? history : {};
    drawCharts();
  }

  function drawCharts() {
    if (lastHistory === null) return;
    const h = lastHistory;
    const t = Array.isArray(h.t) ? h.t : [];
    const arr = (a) => (Array.isArray(a) ? a : []);
    const ms = (a) => arr(a).map((v) => (isNum(v) ? v * 1000 : null));
    const stepsFmt = (v) => trimNum(v);
    const msFmt = (v) => (v >= 100 ? String(Math.round(v)) : trimNum(v));
    drawChart($("chart-throughput"), {
      t: t,
      left: { title: "steps/s", format: stepsFmt },
      right: { title: "bytes/s", format: shortSI },
      series: [
        { label: "steps/s", color: COLORS.steps, values: arr(h.steps_per_second), axis: "left", format: (v) => v.toFixed(1) },
        { label: "sent", color: COLORS.bytes, values: arr(h.bytes_per_second), axis: "right", format: rate },
      ],
    });
    drawChart($("chart-latency"), {
      t: t,
      left: { title: "ms", format: msFmt },
      right: null,
      series: [
        { label: "p50", color: COLORS.p50, values: ms(h.latency_p50), axis: "left", format: (v) => trimNum(v) + " ms" },
        { label: "p95", color: COLORS.p95, values: ms(h.latency_p95), axis: "left", format: (v) => trimNum(v) + " ms", dash: [5, 3] },
      ],
    });
  }

  // ---------- contact ----------

  let lastGood = null;     // browser time (ms) of the last answer shown
  let lostAt = null;       // browser time (ms) of the first failed poll since the last good one

  function showContact(ok, detail, reached) {
    const banner = $("banner");
    const updated = $("updated");
    if (ok) {
      lostAt = null;
      banner.hidden = true;
      document.body.classList.remove("lost");
      setText(updated, "updated " + clock(lastGood / 1000));
      return;
    }
    if (lostAt === null) lostAt = Date.now();
    let text = reached
      ? "the scheduler's answers cannot be shown since " + clock(lostAt / 1000) + "."
      : "lost contact with the scheduler at " + clock(lostAt / 1000) + " \u2014 the job may have ended.";
    text += lastGood === null ? " No data received yet." : " Showing the data of " + clock(lastGood / 1000) + ".";
    if (detail) text += " (" + detail + ")";
    setText(banner, text);
    banner.hidden = false;
    document.body.classList.add("lost");
    setText(updated, lastGood === null ? "no contact" : "last data " + clock(lastGood / 1000));
  }

  function render(state) {
    if (!state || typeof state !== "object") throw new Error("the answer is not a JSON object");
    renderJob(state.job);
    renderNodes(state.nodes);
    renderStalls(state.stalls);
    renderEvents(state.events);
    renderCharts(state.history);
  }

  async function poll() {
    let ok = false;
    let reached = false;     // the scheduler answered (so the contact is not what failed)
    let detail = "";
    const controller = typeof AbortController === "function" ? new AbortController() : null;
    const timer = controller ? setTimeout(() => controller.abort(), FETCH_TIMEOUT_MS) : null;
    try {
      const response = await fetch("api/state", {
        credentials: "same-origin",
        cache: "no-store",
        headers: { Accept: "application/json" },
        signal: controller ? controller.signal : undefined,
      });
      reached = true;
      if (!response.ok) {
        detail = "HTTP " + response.status;
        if (response.status === 401 || response.status === 403) {
          detail += ": not authorised \u2014 open the dashboard with the link that carries its token";
        }
      } else {
        const state = await response.json();
        try {
          render(state);
          lastGood = Date.now();
          ok = true;
        } catch (err) {
          detail = "could not show the answer: " + (err && err.message ? err.message : String(err));
        }
      }
    } catch (err) {
      if (err && err.name === "AbortError") detail = "no answer within " + FETCH_TIMEOUT_MS / 1000 + " s";
      else if (err && err.name === "SyntaxError") detail = "the answer is not JSON";
      // anything else is the network's failure: fetch says no more than "Failed to fetch"
    } finally {
      if (timer !== null) clearTimeout(timer);
    }
    try {
      showContact(ok, detail, reached);
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    if (resizeTimer !== null) clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      resizeTimer = null;
      try {
        drawCharts();
      } catch (err) {
        // a failed redraw leaves the previous picture; the next poll draws again
      }
    }, 100);
  });

  function start() {
    drawCharts();
    renderCharts({});
    poll();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
