// claude-proxy dashboard: one SSE feed (/ui/feed), plain DOM, SVG charts. No build step.
"use strict";

const state = {
  rows: [],            // newest first
  rowsLimit: 1000,
  kept: new Set(),     // request ids whose bodies this worker still holds
  inspectLimit: 50,
  live: null,
  window: 15,
  scope: null,
  providers: new Set(),
  models: new Set(),
  open: null,          // request id shown in the inspector
};

const PALETTE = ["#2f81f7", "#e8834a", "#3fb950", "#a371f7", "#db61a2", "#d29922", "#56d4dd", "#f85149"];
const STATUS_COLORS = { 2: "var(--ok)", 4: "var(--warn)", 5: "var(--bad)" };
const TOKEN_COLORS = { input: "#2f81f7", output: "#3fb950", reasoning: "#a371f7", cached: "#56d4dd", cache_write: "#db61a2" };
const SVG = "http://www.w3.org/2000/svg";

// ------------------------------------------------------------------ small helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  return node;
}

const int = (n) => (n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US"));
function millis(n) {
  if (n === null || n === undefined) return "–";
  if (n >= 10000) return (n / 1000).toFixed(1) + " s";
  if (n >= 1000) return (n / 1000).toFixed(2) + " s";
  return Math.round(n) + " ms";
}
const clock = (epoch) => new Date(epoch * 1000).toLocaleTimeString("en-GB", { hour12: false });
const shortId = (id) => (id.length > 16 ? id.slice(0, 14) + "…" : id);
const pretty = (value) => JSON.stringify(value, null, 2);

// ------------------------------------------------------------------ theme and header

function initTheme() {
  const saved = localStorage.getItem("claude-proxy-theme");
  if (saved) document.documentElement.dataset.theme = saved;
  document.getElementById("theme").addEventListener("click", () => {
    const dark = getComputedStyle(document.documentElement).colorScheme.includes("dark");
    const next = dark ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    localStorage.setItem("claude-proxy-theme", next);
  });
  for (const button of document.querySelectorAll(".window button")) {
    button.addEventListener("click", () => {
      state.window = Number(button.dataset.window);
      for (const other of document.querySelectorAll(".window button")) {
        other.classList.toggle("on", other === button);
      }
      renderCharts();
    });
  }
}

function renderScope() {
  const scope = state.scope;
  const node = document.getElementById("scope");
  node.replaceChildren();
  if (!scope) return;
  if (scope.shared) {
    const processes = scope.processes || [];
    const hosts = new Set(processes.map((p) => p.split(":")[0]));
    node.append("all ", el("b", { text: `${processes.length} process${processes.length === 1 ? "" : "es"}` }),
      ` on ${hosts.size} host${hosts.size === 1 ? "" : "s"} through Redis (${processes.join(", ")})` +
      ` · in flight: this process (${scope.process}) only`);
  } else if (scope.backend && scope.backend.startsWith("degraded")) {
    node.append("this process ", el("b", { text: `(pid ${scope.pid})` }),
      " only — Redis is away (degraded: in-process); the fleet's view returns with it");
  } else if (scope.workers > 1) {
    node.append("this worker ", el("b", { text: `(pid ${scope.pid})` }),
      ` of ${scope.workers} — each worker shows only the requests it served`);
  } else {
    node.append("process ", el("b", { text: `pid ${scope.pid}` }), " · the only worker");
  }
}

function setConnection(text, kind) {
  const node = document.getElementById("conn");
  node.textContent = text;
  node.className = "conn " + kind;
}

// ------------------------------------------------------------------ requests table

function statusClass(status) {
  return "status s" + (status >= 200 && status < 600 ? Math.floor(status / 100) : 0);
}

function rowMatches(row) {
  const provider = document.getElementById("f-provider").value;
  const model = document.getElementById("f-model").value;
  const status = document.getElementById("f-status").value;
  if (provider && row.provider !== provider) return false;
  if (model && row.client_model !== model && row.model !== model) return false;
  if (status === "err" && row.status < 400 && !row.error) return false;
  if (status && status !== "err" && String(Math.floor(row.status / 100)) !== status) return false;
  return true;
}

function sessionTitle(row) {
  const agent = row.agent && row.agent !== "-" ? `subagent ${row.agent}` : "main loop (no agent id)";
  const hinted = row.request_class && row.request_class !== "-"
    ? ` · class ${row.request_class} · prompt ${row.prompt_id || "-"}` : "";
  return `session ${row.session || "-"} · ${agent}${hinted}`;
}

function rowElement(row) {
  const failover = row.failover && row.failover.length
    ? el("span", { class: "failover", title: "failover: " + [...row.failover, row.provider].join(" → "),
      text: "⤳" + row.failover.length }) : null;
  const retries = row.retries ? el("span", { class: "retries", title: `${row.retries} retries`, text: `↻${row.retries}` }) : null;
  const t = row.tokens || {};
  return el("tr", { "data-id": row.id, "data-status": row.status },
    el("td", { class: "c-time", text: clock(row.at) }),
    el("td", { class: "c-id mono", title: row.id, text: shortId(row.id) }),
    el("td", { class: "c-client", title: row.client_model, text: row.client_model }),
    el("td", { class: "c-provider", title: `${row.provider} · ${row.model}` },
      el("span", { class: "c-provider-name", text: row.provider }), " · ",
      el("span", { class: "c-model", text: row.model }), failover),
    el("td", { class: "c-route", text: row.route }),
    el("td", { class: "c-session mono", title: sessionTitle(row) }, (row.session || "-").slice(0, 8),
      row.agent && row.agent !== "-" ? el("span", { class: "agent", text: " · " + row.agent.slice(0, 6) }) : null,
      row.request_class && row.request_class !== "-" ? el("span", { class: "agent", text: " · " + row.request_class }) : null),
    el("td", {}, el("span", { class: "c-status " + statusClass(row.status), text: row.status }), retries),
    el("td", { class: "c-stream", text: row.stream ? "stream" : "json" }),
    el("td", { class: "num c-ttfb", text: millis(row.ttfb) }),
    el("td", { class: "num c-total", text: millis(row.total) }),
    el("td", { class: "num c-in", text: int(t.input) }),
    el("td", { class: "num c-out", text: int(t.output) }),
    el("td", { class: "num c-reason", text: int(t.reasoning) }),
    el("td", { class: "num c-cached", title: `read from the cache ${int(t.cached)} · written ${int(t.cache_write)}`, text: int(t.cached) }),
    el("td", { class: "c-key", title: row.key && row.key !== "-" ? `key ${row.key}` : "", text: row.key && row.key !== "-" ? row.key : "" }),
    el("td", { class: "num c-cost", text: dollars(row.cost) }),
    el("td", { class: "c-stop", text: row.stop || "–" }),
    el("td", { class: "c-error errtype", title: row.error || "", text: row.error || "" }));
}

function renderTable() {
  const body = document.querySelector("#requests tbody");
  const shown = state.rows.filter(rowMatches);
  body.replaceChildren(...shown.map(rowElement));
  updateCounts(shown.length);
}

function updateCounts(shownCount) {
  const shown = shownCount === undefined
    ? document.querySelectorAll("#requests tbody tr").length : shownCount;
  document.getElementById("req-count").textContent = state.rows.length;
  document.getElementById("req-empty").hidden = state.rows.length > 0;
  const note = state.rows.length !== shown ? `${shown} shown · ` : "";
  document.getElementById("req-note").textContent =
    `${note}last ${state.rowsLimit} kept, bodies of the last ${state.inspectLimit}`;
}

function addFilterOption(select, set, value) {
  if (!value || value === "-" || set.has(value)) return;
  set.add(value);
  select.append(el("option", { value, text: value }));
}

function learnFilters(row) {
  addFilterOption(document.getElementById("f-provider"), state.providers, row.provider);
  const models = document.getElementById("f-model");
  addFilterOption(models, state.models, row.client_model);
  addFilterOption(models, state.models, row.model);
}

function addRow(row) {
  state.rows.unshift(row);
  if (state.rows.length > state.rowsLimit) state.rows.pop();
  if (state.inspectLimit > 0) {
    state.kept.add(row.id);
    if (state.kept.size > state.inspectLimit) state.kept.delete(state.kept.values().next().value);
  }
  learnFilters(row);
  if (rowMatches(row)) {
    const wrap = document.getElementById("table-wrap");
    const body = document.querySelector("#requests tbody");
    const tr = rowElement(row);
    tr.classList.add("fresh");
    body.prepend(tr);
    while (body.children.length > state.rowsLimit) body.lastElementChild.remove();
    // Someone reading further down keeps seeing the same rows.
    if (wrap.scrollTop > 0) wrap.scrollTop += tr.getBoundingClientRect().height;
  }
  updateCounts();
}

// ------------------------------------------------------------------ now and providers

function phaseClass(phase) {
  if (phase.startsWith("tool")) return "phase tool";
  if (phase === "thinking" || phase === "text") return "phase " + phase;
  return "phase";
}

function renderNow() {
  const list = document.getElementById("now");
  const flights = (state.live && state.live.now) || [];
  document.getElementById("now-count").textContent = flights.length;
  if (!flights.length) {
    list.replaceChildren(el("div", { class: "placeholder", text: "Nothing in flight." }));
    return;
  }
  list.replaceChildren(...flights.map((f) => el("div", { class: "flight", "data-id": f.id, title: f.id },
    el("span", { title: f.client_model, text: f.client_model }),
    el("span", { title: `${f.provider} · ${f.model}`, text: `→ ${f.provider} · ${f.model}` }),
    el("span", { class: "muted", text: f.route }),
    el("span", {}, el("span", { class: phaseClass(f.phase), text: f.phase })),
    el("span", { class: "num", text: millis(f.elapsed) }),
    el("span", { class: "num muted", text: `~${int(f.tokens)} tok` }))));
}

function renderProviders() {
  const list = document.getElementById("providers");
  const providers = (state.live && state.live.providers) || [];
  list.replaceChildren(...providers.map((p) => {
    const cooling = p.state !== "healthy" && p.state !== "unknown";
    const until = p.until ? ` until ${clock(p.until)}` : "";
    const percent = (fraction) => `${(fraction * 100).toFixed(fraction === 1 || fraction === 0 ? 0 : 1)}%`;
    const recent = p.success_rate === null || p.success_rate === undefined
      ? "no requests in 15 min" : `${percent(p.success_rate)} ok of ${int(p.requests)} in 15 min`;
    const since = p.attempts ? `${percent(p.succeeded / p.attempts)} of ${int(p.attempts)} attempts since start` : "no attempts since start";
    return el("div", { class: "provider", "data-provider": p.name },
      el("div", {}, el("span", { class: "name", text: p.name }), " ",
        el("span", { class: "state " + (cooling ? "cooling" : p.state), text: p.state + until })),
      el("div", { class: "stats", text: recent }),
      el("div", { class: "stats", text: since }),
      el("div", { class: "stats", text: `first byte p50 ${millis(p.p50)} · p95 ${millis(p.p95)}` }),
      p.last_error ? el("div", { class: "err", title: p.last_error, text: p.last_error }) : null);
  }));
}

function renderTools() {
  const stats = (state.live && state.live.tools) || [];
  document.getElementById("tools-panel").hidden = stats.length === 0;
  const share = (fraction) => `${(fraction * 100).toFixed(fraction === 0 || fraction === 1 ? 0 : 1)}%`;
  document.querySelector("#tools tbody").replaceChildren(...stats.map((t) => {
    const others = Object.entries(t.outcomes).filter(([o]) => !["valid", "repaired", "repairable", "invalid"].includes(o))
      .map(([o, n]) => `${o} ${int(n)}`).join(" · ");
    return el("tr", { "data-model": t.model },
      el("td", { class: "name", title: t.model, text: t.model }),
      el("td", { class: "num", text: int(t.calls) }),
      el("td", { class: "num repaired", text: share(t.repaired) }),
      el("td", { class: "num invalid", text: share(t.invalid) }),
      el("td", {}, el("span", { class: "share-bar", title: others || "every call checked" },
        ...[["ok", 1 - t.repaired - t.invalid], ["repaired", t.repaired], ["invalid", t.invalid]]
          .map(([kind, fraction]) => {
            const part = el("span", { class: kind });
            part.style.width = `${(fraction * 100).toFixed(1)}%`;  // CSSOM: the CSP allows it
            return part;
          }))));
  }));
}

function guardView(calls) {
  return calls.map((call) => el("div", { class: "tool-call guard" },
    el("span", { class: "tag " + call.outcome, text: `${call.tool}${call.name ? " → " + call.name : ""} · ${call.outcome}` }),
    call.kinds.length ? el("span", { class: "muted", text: " " + call.kinds.join(", ") }) : null,
    call.detail || call.error ? el("div", { class: "err", text: call.detail || call.error }) : null,
    el("div", { class: "muted", text: "as the upstream sent it:" }), el("pre", { text: call.original }),
    ...call.sent.map((text) => el("pre", { class: "sent", text }))));
}

function dollars(value) {
  if (value === null || value === undefined) return "–";
  return "$" + value.toFixed(value >= 1 || value === 0 ? 2 : 4);
}

function renderKeys() {
  const keys = (state.live && state.live.keys) || [];
  document.getElementById("keys-panel").hidden = keys.length === 0;
  document.body.classList.toggle("with-keys", keys.length > 0);
  document.getElementById("keys").replaceChildren(...keys.map((k) => {
    const budget = k.budget === null || k.budget === undefined ? null : k.budget;
    const used = budget ? Math.min(k.spent / budget, 1) : 0;
    const spent = budget === null ? `${dollars(k.spent)} this ${k.period}`
      : `${dollars(k.spent)} of ${dollars(budget)} this ${k.period}`;
    return el("div", { class: "key" + (budget !== null && k.spent >= budget ? " spent" : ""), "data-key": k.name },
      el("span", { class: "name", text: k.name }),
      el("span", { class: "stats", text: spent }),
      el("progress", { class: "bar", max: 1, value: used.toFixed(3) }),
      el("span", { class: "stats", text: `today ${dollars(k.today)} · resets ${new Date(k.resets * 1000).toISOString().slice(0, 16).replace("T", " ")} UTC` }));
  }));
}

// ------------------------------------------------------------------ charts (SVG)

const W = 320, H = 110, LEFT = 34, BOTTOM = 14, TOP = 4;

function niceMax(value) {
  if (value <= 0) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

function initCharts() {
  for (const figure of document.querySelectorAll("figure.chart")) {
    figure.replaceChildren(el("figcaption", { text: figure.dataset.title }),
      svgEl("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" }),
      el("div", { class: "legend" }));
  }
}

function lineChart(id, lines, count, format) {
  const figure = document.getElementById(id);
  const svg = figure.querySelector("svg");
  const legend = figure.querySelector(".legend");
  svg.replaceChildren();
  legend.replaceChildren();
  const values = lines.flatMap((l) => l.values.filter((v) => v !== null && v !== undefined));
  const max = niceMax(Math.max(0, ...values));
  const x = (i) => LEFT + (i * (W - LEFT - 4)) / Math.max(1, count - 1);
  const y = (v) => TOP + (H - TOP - BOTTOM) * (1 - v / max);
  for (const fraction of [0, 0.5, 1]) {
    const at = y(max * fraction);
    svg.append(svgEl("line", { class: "grid", x1: LEFT, x2: W, y1: at, y2: at }));
    const label = svgEl("text", { class: "axis", x: LEFT - 4, y: at + 3, "text-anchor": "end" });
    label.textContent = format(max * fraction);
    svg.append(label);
  }
  for (const [i, text] of [[0, `-${count} min`], [count - 1, "now"]]) {
    const label = svgEl("text", { class: "axis", x: x(i), y: H - 2, "text-anchor": i ? "end" : "start" });
    label.textContent = text;
    svg.append(label);
  }
  let points = 0;
  for (const line of lines) {
    let segment = [];
    const flush = () => {
      if (segment.length > 1) {
        svg.append(svgEl("polyline", { class: "line" + (line.dashed ? " dashed" : ""), stroke: line.color,
          points: segment.join(" ") }));
      }
      segment = [];
    };
    line.values.forEach((v, i) => {
      if (v === null || v === undefined) { flush(); return; }
      segment.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`);
      if (v > 0) {
        const dot = svgEl("circle", { class: "pt", cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2.2, fill: line.color });
        const title = svgEl("title", {});
        title.textContent = `${line.name}: ${format(v)}`;
        dot.append(title);
        svg.append(dot);
        points += 1;
      }
    });
    flush();
    legend.append(el("span", {}, el("i", {}), line.name));
    legend.lastElementChild.firstElementChild.style.background = line.color;
  }
  if (!points) {
    const none = svgEl("text", { class: "none", x: (W + LEFT) / 2, y: H / 2, "text-anchor": "middle" });
    none.textContent = "no data in this window";
    svg.append(none);
  }
  figure.dataset.points = String(points);
}

function renderCharts() {
  const series = state.live && state.live.series;
  if (!series) return;
  const n = state.window;
  const tail = (values) => values.slice(-n);
  const compact = (v) => (v >= 10000 ? Math.round(v / 1000) + "k" : v >= 1000 ? (v / 1000).toFixed(1) + "k" : String(Math.round(v * 10) / 10));
  lineChart("chart-requests", Object.entries(series.requests).map(([status, values]) => ({
    name: status, values: tail(values),
    color: STATUS_COLORS[status[0]] || "var(--idle)" })), n, compact);
  const ttfb = [];
  Object.entries(series.ttfb).forEach(([provider, lines], i) => {
    const color = PALETTE[i % PALETTE.length];
    ttfb.push({ name: `${provider} p50`, values: tail(lines.p50), color });
    ttfb.push({ name: `${provider} p95`, values: tail(lines.p95), color, dashed: true });
  });
  lineChart("chart-ttfb", ttfb, n, compact);
  lineChart("chart-tokens", Object.entries(series.tokens).map(([kind, values]) => ({
    name: kind, values: tail(values), color: TOKEN_COLORS[kind] || "var(--idle)" })), n, compact);
  lineChart("chart-errors", Object.entries(series.errors).map(([type, values], i) => ({
    name: type, values: tail(values), color: type === "retry" ? "var(--warn)" : PALETTE[(i + 7) % PALETTE.length] })),
  n, compact);
}

// ------------------------------------------------------------------ the inspector

function section(title, ...children) {
  return el("section", {}, el("h3", { text: title }), ...children);
}

function fact(name, value, cls) {
  return el("div", {}, el("dt", { text: name }), el("dd", { class: cls || null, title: String(value), text: value }));
}

function blockView(block) {
  switch (block.type) {
    case "text": return el("pre", { text: block.text });
    case "thinking": return el("pre", { class: "thinking", text: block.text });
    case "tool_use": return el("div", {}, el("span", { class: "tag", text: `tool_use ${block.name}` }),
      el("pre", { text: pretty(block.input) }));
    case "tool_result": return el("div", {},
      el("span", { class: "tag", text: `tool_result ${block.tool_use_id}${block.is_error ? " (error)" : ""}` }),
      ...block.content.map(blockView));
    case "image": case "document": return el("div", { class: "placeholder-block", text: block.placeholder });
    default: return el("div", { class: "placeholder-block", text: `[${block.type}]` });
  }
}

function timelineView(timeline) {
  const end = timeline.length ? Math.max(...timeline.map((t) => t[0] || 0)) : 0;
  const bar = el("div", { class: "timeline" });
  const list = el("div", { class: "timeline-list" });
  for (const [at, event, detail] of timeline) {
    const tick = el("span", { class: "tick " + (event.startsWith("retry") ? "retry" : event.includes("failed") ? "fail" : event === "end" ? "end" : ""), title: `${event} ${millis(at)}` });
    tick.style.left = end ? `${(100 * at) / end}%` : "0";
    bar.append(tick);
    list.append(el("span", { class: "t", text: "+" + millis(at) }), el("span", { text: event }),
      el("span", { class: "muted", text: detail || "" }));
  }
  return el("div", {}, bar, list);
}

function clientView(client) {
  const parts = [el("pre", { text: pretty(client.settings) })];
  if (client.system.length) {
    parts.push(el("details", {}, el("summary", { text: `system prompt (${client.system.length} block${client.system.length > 1 ? "s" : ""})` }),
      ...client.system.map(blockView)));
  }
  parts.push(el("details", {}, el("summary", { text: `messages (${client.messages.length})` }),
    ...client.messages.map((m, i) => el("details", {},
      el("summary", {}, el("span", { class: "role", text: m.role }), `#${i + 1} · ${m.blocks.map((b) => b.type).join(", ")}`),
      ...m.blocks.map(blockView)))));
  parts.push(el("div", {}, el("span", { class: "muted", text: `tools (${client.tools.length}): ` }),
    ...client.tools.map((name) => el("span", { class: "tag", text: name }))));
  return parts;
}

function upstreamView(upstream) {
  const table = el("table", { class: "fields" }, el("tbody", {},
    ...upstream.fields.map((f) => el("tr", { class: f.added ? "added" : null, "data-field": f.name },
      el("td", {}, f.name, f.added ? el("span", { class: "why", text: f.added }) : null),
      el("td", {}, el("code", { text: JSON.stringify(f.value) }))))));
  const messages = el("details", { class: "upstream-messages" }, el("summary", { text: `messages (${upstream.messages.length})` }),
    ...upstream.messages.map((m, i) => {
      const extras = Object.entries(m.extra).map(([key, value]) => el("div", {
        class: m.added.includes(key) ? "extra added" : "extra", "data-field": key },
      el("span", { class: m.added.includes(key) ? "tag dropped-no why" : "tag", text: key + (m.added.includes(key) ? " (passed back by the proxy)" : "") }),
      el("pre", { class: key.startsWith("reasoning") ? "thinking" : null, text: typeof value === "string" ? value : pretty(value) })));
      return el("details", {}, el("summary", {}, el("span", { class: "role", text: m.role }),
        `#${i + 1}${m.tool_calls.length ? " · calls " + m.tool_calls.join(", ") : ""}${m.added.length ? " · " + m.added.join(", ") : ""}`),
      m.text ? el("pre", { text: m.text }) : null, ...extras);
    }));
  const tools = el("div", {}, el("span", { class: "muted", text: `tools sent (${upstream.tools.length}): ` }),
    ...upstream.tools.map((name) => el("span", { class: "tag", text: name })),
    ...upstream.dropped_tools.map((name) => el("span", { class: "tag dropped", title: "dropped by the proxy", text: name })));
  return [table, messages, tools];
}

function renderInspector(id, view) {
  const body = document.getElementById("i-body");
  document.getElementById("i-id").textContent = id;
  document.getElementById("i-permalink").href = `/ui/requests/${encodeURIComponent(id)}`;
  if (!view) {
    const scope = state.scope || {};
    body.replaceChildren(el("p", { class: "note", text: scope.shared
      ? `Request ${id} is not among the fleet's last requests.`
      : `Request ${id} is not in this worker's memory (pid ${scope.pid}).` +
        (scope.workers > 1 ? " With several workers, another worker may have served it." : "") }));
    return;
  }
  const parts = [];
  const row = view.row;
  if (row) {
    const t = row.tokens;
    parts.push(section("Summary", el("dl", { class: "facts" },
      fact("client model", row.client_model), fact("provider · model", `${row.provider} · ${row.model}`),
      fact("route", row.route + (row.failover.length ? ` (failover ${[...row.failover, row.provider].join(" → ")})` : "")),
      fact("session · agent", sessionTitle(row)),
      fact("trace id", row.trace || "– (OpenTelemetry off)", "mono"),
      fact("status", row.status, statusClass(row.status)),
      fact("kind", row.stream ? "stream" : "json"), fact("first byte", millis(row.ttfb)), fact("total", millis(row.total)),
      fact("stop reason", row.stop || "–"),
      fact("input tokens", int(t.input)), fact("output tokens", int(t.output)),
      fact("reasoning tokens", int(t.reasoning)), fact("cache read / written", `${int(t.cached)} / ${int(t.cache_write)}`))));
    parts.push(section("Timeline", timelineView(row.timeline)));
  }
  if (view.error) parts.push(section("Error", el("pre", { class: "error", text: `${view.error.type}: ${view.error.message}` })));
  if (!view.kept) {
    parts.push(el("p", { class: "note", text: view.inspect_requests
      ? `Bodies are kept for the last ${view.inspect_requests} requests only${view.inspect_bytes ? `, within ${Math.round(view.inspect_bytes / 1048576)} MiB together` : ""}; this one's are gone.`
      : "INSPECT_REQUESTS=0: only metadata is kept." }));
  } else {
    const answer = view.answer;
    if (answer.thinking.length) parts.push(section("Thinking", ...answer.thinking.map((text) => el("pre", { class: "thinking", text }))));
    if (answer.text) parts.push(section("Answer", el("pre", { class: "answer", text: answer.text })));
    if (answer.tool_calls.length) {
      parts.push(section("Tool calls", ...answer.tool_calls.map((call) => el("div", { class: "tool-call" },
        el("span", { class: "tag", text: `${call.name} · ${call.id}` }), el("pre", { text: pretty(call.input) })))));
    }
    if (view.tool_guard && view.tool_guard.length) parts.push(section("Tool-call guard (calls that were not valid as sent)", ...guardView(view.tool_guard)));
    if (answer.usage) parts.push(section("Usage", el("pre", { class: "usage", text: pretty(answer.usage) })));
    if (view.upstream) parts.push(section("Upstream request (as sent; highlighted: what the proxy added or changed)", ...upstreamView(view.upstream)));
    if (view.client) parts.push(section("Client request (as received)", ...clientView(view.client)));
  }
  body.replaceChildren(...parts);
  body.scrollTop = 0;
}

async function openInspector(id, push) {
  state.open = id;
  if (push) history.pushState({ id }, "", `/ui/requests/${encodeURIComponent(id)}`);
  const drawer = document.getElementById("inspector");
  drawer.hidden = false;
  document.getElementById("i-body").replaceChildren(el("p", { class: "note", text: "loading…" }));
  let view = null;
  try {
    const response = await fetch(`/ui/api/requests/${encodeURIComponent(id)}`, { credentials: "same-origin" });
    if (response.ok) view = await response.json();
  } catch (error) {
    view = null;
  }
  if (state.open === id) renderInspector(id, view);
}

function closeInspector(push) {
  state.open = null;
  document.getElementById("inspector").hidden = true;
  if (push) history.pushState({}, "", "/ui");
}

function routeFromLocation() {
  const match = location.pathname.match(/^\/ui\/requests\/([^/]+)$/);
  if (match) openInspector(decodeURIComponent(match[1]), false);
  else closeInspector(false);
}

// ------------------------------------------------------------------ the feed

function onHello(data) {
  state.scope = data.scope;
  state.rowsLimit = data.rows_limit;
  state.inspectLimit = data.inspect_requests;
  state.kept = new Set(data.kept);
  state.rows = data.requests.slice().reverse();
  state.rows.forEach(learnFilters);
  state.live = data;
  renderScope();
  renderTable();
  renderNow();
  renderProviders();
  renderKeys();
  renderTools();
  renderCharts();
  document.body.dataset.ready = "true";
}

function onLive(data) {
  state.live = data;
  renderNow();
  renderProviders();
  renderKeys();
  renderTools();
  renderCharts();
}

function connect() {
  const source = new EventSource("/ui/feed");
  source.addEventListener("open", () => setConnection("live", "live"));
  source.addEventListener("error", () => setConnection("reconnecting…", "down"));
  source.addEventListener("hello", (event) => onHello(JSON.parse(event.data)));
  source.addEventListener("live", (event) => onLive(JSON.parse(event.data)));
  source.addEventListener("request", (event) => addRow(JSON.parse(event.data)));
}

function init() {
  initTheme();
  initCharts();
  for (const id of ["f-provider", "f-model", "f-status"]) {
    document.getElementById(id).addEventListener("change", renderTable);
  }
  document.querySelector("#requests tbody").addEventListener("click", (event) => {
    const tr = event.target.closest("tr[data-id]");
    if (tr) openInspector(tr.dataset.id, true);
  });
  document.getElementById("i-close").addEventListener("click", () => closeInspector(true));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.open) closeInspector(true);
  });
  window.addEventListener("popstate", routeFromLocation);
  routeFromLocation();
  connect();
}

document.addEventListener("DOMContentLoaded", init);
