// sentinel status page. Plain JavaScript, no build step, no dependencies.
//
// Polls the aggregator's JSON API (contract section 5) and redraws. Sized for a 49,152-GPU fleet: the
// hosts × GPUs grid is drawn on one canvas per group (one pixel block per GPU, no DOM node per GPU), only
// problem GPUs get table rows, every table is capped, and the slow /api/v1/hosts poll backs off when it
// gets expensive. Everything from the API is put in the page as text (textContent), never as HTML.
"use strict";

const STATES = ["faulty", "stuck", "silent", "degraded", "straggler", "ok", "unknown"];
const RANK = Object.fromEntries(STATES.map((s, i) => [s, i]));
const VERDICT_CELL = { faulty: "faulty", stuck: "stuck", host_silent: "silent", degraded: "degraded",
  straggler: "straggler" };
const MAX_ROWS = 500;
const FAST_POLL_MS = 2000;

const $ = (id) => document.getElementById(id);
const css = getComputedStyle(document.documentElement);
const COLOR = Object.fromEntries(STATES.map((s) => [s, css.getPropertyValue("--" + s).trim() || "#888"]));

const model = {
  hosts: [],          // [{name, cluster, connected, gpus: [{index, state, job, rank}]}]
  jobs: [],           // [{id, state, ranks, hosts, hostNames}]
  verdicts: [],       // open verdicts
  incidents: [],
  cells: new Map(),   // "host/gpu" -> {state, verdicts: []}
  hostIndex: new Map(),
  selectedIncident: null,
  lastOk: 0,
  runbooks: null,     // ui/runbooks.json: {base, reason_prefixes: [[prefix, file]], kinds: {kind: file}, general}
};

// The runbook of a verdict (same rules as sentinel/web/runbooks.py): a reason prefix, else the kind, else
// the runbooks' index. The base comes from the configuration; a scheme other than http(s) gets no link.
function runbookHref(v) {
  const rb = model.runbooks;
  if (!rb || typeof rb.base !== "string") return null;
  if (/^[a-z][a-z0-9+.-]*:/i.test(rb.base) && !/^https?:/i.test(rb.base)) return null;
  const reason = String(v.reason ?? "");
  const hit = (rb.reason_prefixes ?? []).find((p) => reason.startsWith(String(p[0])));
  const file = hit ? hit[1] : (rb.kinds ?? {})[v.kind] ?? rb.general;
  return file ? rb.base + encodeURIComponent(String(file)) : null;
}

function runbookCell(v) {
  const td = el("td", null);
  const href = runbookHref(v);
  if (href) {
    const a = el("a", "runbook");
    a.href = href;
    a.rel = "noopener";
    td.appendChild(a);
  }
  return td;
}

// ---------- API access, tolerant of list-or-envelope shapes ----------

function asList(payload, key) {
  if (Array.isArray(payload)) return payload;
  if (payload && typeof payload === "object") {
    for (const k of [key, "items", "data"]) if (Array.isArray(payload[k])) return payload[k];
  }
  return [];
}

// A read token (server.api_token_file) is given once as #token=... in the address and kept for the tab.
function apiHeaders() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromHash) {
    sessionStorage.setItem("sentinel-token", fromHash);
    history.replaceState(null, "", location.pathname + location.search);
  }
  const token = sessionStorage.getItem("sentinel-token");
  return token ? { Authorization: "Bearer " + token } : {};
}

// Every page of a paginated list answer ({key: [...], next_offset}), at most 100 pages.
async function getAll(path, key, timeoutMs = 10000) {
  let items = [];
  let offset = 0;
  for (let page = 0; page < 100; page++) {
    const sep = path.includes("?") ? "&" : "?";
    const doc = await getJSON(offset ? `${path}${sep}offset=${offset}` : path, timeoutMs);
    items = items.concat(asList(doc, key));
    if (!doc || typeof doc !== "object" || doc.next_offset === null || doc.next_offset === undefined) break;
    offset = doc.next_offset;
  }
  return { [key]: items };
}

async function getJSON(path, timeoutMs = 10000) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  try {
    const resp = await fetch(path, { signal: ctl.signal, cache: "no-store", headers: apiHeaders() });
    if (!resp.ok) throw new Error(path + ": HTTP " + resp.status);
    return await resp.json();
  } finally {
    clearTimeout(timer);
  }
}

function toMillis(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === "number") return value > 1e12 ? value : value * 1000;
  const ms = Date.parse(value);
  return Number.isNaN(ms) ? null : ms;
}

function ago(value) {
  const ms = toMillis(value);
  if (ms === null) return "";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 90) return s.toFixed(0) + " s ago";
  if (s < 5400) return (s / 60).toFixed(0) + " min ago";
  return (s / 3600).toFixed(1) + " h ago";
}

function clockTime(value) {
  const ms = toMillis(value);
  if (ms === null) return String(value ?? "");
  return new Date(ms).toISOString().slice(11, 23);
}

function normHost(h) {
  const name = String(h.host ?? h.name ?? h.id ?? "?");
  let gpus = [];
  if (Array.isArray(h.gpus)) {
    gpus = h.gpus.map((g, i) => (g && typeof g === "object")
      ? { index: Number(g.index ?? g.gpu ?? i), state: String(g.state ?? "ok"),
          job: g.job ?? g.job_id ?? null, rank: g.rank ?? null }
      : { index: i, state: "ok", job: null, rank: null });
  } else {
    const n = Number(h.gpus ?? h.gpu_count ?? h.gpus_per_host ?? 0);
    for (let i = 0; i < n; i++) gpus.push({ index: i, state: "ok", job: null, rank: null });
  }
  let connected = true;
  if (typeof h.connected === "boolean") connected = h.connected;
  else if (typeof h.alive === "boolean") connected = h.alive;
  else if (typeof h.state === "string") connected = !["silent", "down", "disconnected", "offline"].includes(h.state);
  return { name, cluster: String(h.cluster ?? "default"), connected, gpus };
}

function normJob(j) {
  const id = String(j.id ?? j.job ?? j.job_id ?? "?");
  const hostNames = Array.isArray(j.host_names) ? j.host_names.map(String)
    : Array.isArray(j.hosts) ? j.hosts.map(String) : null;
  const ranks = Array.isArray(j.ranks) ? j.ranks.length : (j.ranks ?? j.world_size ?? null);
  const hosts = hostNames ? hostNames.length : (j.hosts ?? j.host_count ?? null);
  let state = String(j.state ?? j.status ?? "");
  if (!state) state = j.stalled ? "stalled" : (Number(j.open_verdicts ?? 0) > 0 ? "degraded" : "running");
  const d = j.debug_readiness;
  const debug = d == null ? "" : d.ready ? "ready" : "missing: " + (d.missing ?? []).join(", ");
  return { id, state, ranks, hosts, hostNames, debug };
}

// ---------- derived state ----------

function cellKey(host, gpu) { return host + "/" + gpu; }

function rebuildCells() {
  const cells = new Map();
  model.hostIndex = new Map();
  for (const host of model.hosts) {
    model.hostIndex.set(host.name, host);
    for (const g of host.gpus) {
      let state = g.state === "lost" || g.state === "unresponsive" ? "faulty" : "ok";
      if (!host.connected) state = "silent";
      cells.set(cellKey(host.name, g.index), { state, verdicts: [], raw: g.state });
    }
  }
  const jobOfHost = new Map();
  for (const job of model.jobs) for (const h of job.hostNames ?? []) jobOfHost.set(h, job.id);
  for (const host of model.hosts) {  // the API's GPUs say which job runs on them
    if (jobOfHost.has(host.name)) continue;
    const g = host.gpus.find((x) => x.job);
    if (g) jobOfHost.set(host.name, String(g.job));
  }
  model.jobOfHost = jobOfHost;
  for (const v of model.verdicts) {
    const named = verdictHosts(v);
    const state = VERDICT_CELL[v.kind] ?? "degraded";
    for (const name of named) {
      const host = model.hostIndex.get(String(name));
      const gpus = v.gpu === null || v.gpu === undefined
        ? (host ? host.gpus.map((g) => g.index) : [])
        : [Number(v.gpu)];
      for (const gpu of gpus) {
        const key = cellKey(String(name), gpu);
        let cell = cells.get(key);
        if (!cell) { cell = { state: "unknown", verdicts: [], raw: null }; cells.set(key, cell); }
        cell.verdicts.push(v);
        if (RANK[state] < RANK[cell.state]) cell.state = state;
      }
    }
  }
  model.cells = cells;
}

// ---------- search ----------

function parseQuery(text) {
  const q = { host: null, gpu: null, words: [] };
  for (const raw of text.trim().toLowerCase().split(/\s+/).filter(Boolean)) {
    let m = raw.match(/^([^/\s]+)\/(\d+)$/);
    if (m) { q.host = m[1]; q.gpu = Number(m[2]); continue; }
    m = raw.match(/^gpu[:#]?(\d+)$/);
    if (m) { q.gpu = Number(m[1]); continue; }
    q.words.push(raw);
  }
  // "gpu 5": a bare number after the word gpu
  const idx = q.words.indexOf("gpu");
  if (idx >= 0 && idx + 1 < q.words.length && /^\d+$/.test(q.words[idx + 1])) {
    q.gpu = Number(q.words[idx + 1]);
    q.words.splice(idx, 2);
  }
  return q;
}

function matches(q, host, gpu, job, extra) {
  if (q.host !== null && !host.toLowerCase().includes(q.host)) return false;
  if (q.gpu !== null && gpu !== null && gpu !== q.gpu) return false;
  for (const w of q.words) {
    const hay = (host + " " + (job ?? "") + " " + (extra ?? "")).toLowerCase();
    if (!hay.includes(w)) return false;
  }
  return true;
}

function query() { return parseQuery($("search").value); }

// ---------- rendering helpers ----------

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  for (const [k, v] of Object.entries(attrs ?? {})) if (v !== null && v !== undefined) tr.dataset[k] = String(v);
  return tr;
}

function stateCell(state) { return el("td", state, "state " + state); }

function fillBody(table, rows, total) {
  const body = table.tBodies[0];
  body.replaceChildren(...rows);
  if (total > rows.length) {
    const tr = document.createElement("tr");
    const td = el("td", `… ${total - rows.length} more (refine the search)`, "muted");
    td.colSpan = table.tHead.rows[0].cells.length;
    tr.appendChild(td);
    body.appendChild(tr);
  }
}

// ---------- sections ----------

function renderSummary() {
  const gpus = model.cells.size;
  const counts = Object.fromEntries(STATES.map((s) => [s, 0]));
  for (const cell of model.cells.values()) counts[cell.state]++;
  const problems = gpus - counts.ok - counts.unknown;
  const stalled = model.jobs.filter((j) => j.state === "stalled" || j.state === "stuck").length;
  $("summary").textContent = `${model.hosts.length.toLocaleString()} hosts · ${gpus.toLocaleString()} GPUs · ` +
    `${problems} with problems · ${model.jobs.length} jobs (${stalled} stalled) · ` +
    `${model.verdicts.length} open verdicts`;
  return counts;
}

// the hosts a verdict names: its host, or (an NVLink domain's verdict) every host of the domain in `hosts`
function verdictHosts(v) {
  if (v.host !== null && v.host !== undefined) return [String(v.host)];
  return Array.isArray(v.hosts) ? v.hosts.map(String) : [];
}

function renderVerdicts() {
  const q = query();
  const list = model.verdicts
    .filter((v) => {
      const text = `${v.kind} ${v.reason} ${v.action} ${v.rank ?? ""}`;
      const named = verdictHosts(v);
      return named.length ? named.some((h) => matches(q, h, v.gpu ?? null, v.job, text))
        : matches(q, "", v.gpu ?? null, v.job, text);
    })
    .sort((a, b) => (toMillis(b.opened_at) ?? 0) - (toMillis(a.opened_at) ?? 0));
  const hostText = (v) => {
    const named = verdictHosts(v);
    if (v.host !== null && v.host !== undefined) return String(v.host);
    if (!named.length) return "";
    return `${named.length} hosts: ${named.slice(0, 3).join(", ")}${named.length > 3 ? ", …" : ""}`;
  };
  const rows = list.slice(0, MAX_ROWS).map((v) => row([
    el("td", ago(v.opened_at)), stateCell(v.kind), hostText(v), v.gpu ?? "", v.job ?? "", v.rank ?? "",
    v.reason ?? "", el("td", v.action ?? "", "state"), el("td", (v.evidence ?? []).join("; "), "evidence"),
    runbookCell(v),
  ], { kind: v.kind, host: v.host, gpu: v.gpu, job: v.job, reason: v.reason, id: v.id }));
  rows.forEach((r) => r.classList.add("verdict"));
  fillBody($("verdicts"), rows, list.length);
  $("verdict-count").textContent = `(${model.verdicts.length})`;
  $("verdicts-empty").hidden = model.verdicts.length > 0;
}

function renderJobs() {
  const q = query();
  const open = new Map();
  for (const v of model.verdicts) if (v.job) open.set(v.job, (open.get(v.job) ?? 0) + 1);
  // hosts of each job: from the job answer, else from the GPUs' job labels in the host list
  const hostsOf = new Map();
  for (const h of model.hosts) for (const g of h.gpus) if (g.job) {
    if (!hostsOf.has(g.job)) hostsOf.set(g.job, new Set());
    hostsOf.get(g.job).add(h.name);
  }
  const namesOf = (j) => j.hostNames ?? [...(hostsOf.get(j.id) ?? [])];
  const list = model.jobs.filter((j) => q.host === null && q.gpu === null
    ? matches(q, "", null, j.id, j.state) || namesOf(j).some((h) => matches(q, h, null, j.id, j.state))
    : namesOf(j).some((h) => matches(q, h, null, j.id, j.state)));
  const rows = list.slice(0, MAX_ROWS).map((j) => row(
    [j.id, stateCell(j.state), j.ranks ?? "", j.hosts ?? "", open.get(j.id) ?? 0, j.debug ?? ""],
    { job: j.id, state: j.state }));
  rows.forEach((r) => r.classList.add("job"));
  fillBody($("jobs"), rows, list.length);
  $("job-count").textContent = `(${model.jobs.length})`;
}

function renderLegend(counts) {
  const legend = $("legend");
  legend.replaceChildren(...STATES.map((s) => {
    const span = el("span", null);
    const sw = el("span", null, "swatch");
    sw.style.background = COLOR[s];
    span.append(sw, `${s === "unknown" ? "no data" : s} ${counts[s].toLocaleString()}`);
    return span;
  }));
}

function renderTiles(counts) {
  const tiles = $("tiles");
  if ($("groupby").value !== "state") { tiles.replaceChildren(); return; }
  tiles.replaceChildren(...STATES.filter((s) => counts[s] > 0).map((s) => {
    const t = el("div", null, "tile");
    const b = el("b", counts[s].toLocaleString());
    b.style.color = COLOR[s];
    t.append(b, " " + s);
    t.dataset.state = s;
    t.addEventListener("click", () => { $("search").value = s === "ok" ? "" : s; refreshView(); });
    return t;
  }));
}

function groupsOf(mode) {
  const groups = new Map();
  const add = (key, host) => { if (!groups.has(key)) groups.set(key, []); groups.get(key).push(host); };
  for (const host of model.hosts) {
    if (mode === "job") add(model.jobOfHost.get(host.name) ?? "(no job)", host);
    else if (mode === "state") {
      let worst = "ok";
      for (const g of host.gpus) {
        const s = model.cells.get(cellKey(host.name, g.index))?.state ?? "unknown";
        if (RANK[s] < RANK[worst]) worst = s;
      }
      add(worst, host);
    } else add(host.cluster, host);
  }
  if (mode === "state") {  // worst first, and named in words
    return [...groups.entries()].sort((a, b) => RANK[a[0]] - RANK[b[0]])
      .map(([worst, hosts]) => [worst === "ok" ? "healthy hosts" : `hosts with ${worst} GPUs`, hosts]);
  }
  return [...groups.entries()].sort((a, b) => a[0].localeCompare(b[0]));
}

function cellSize(totalGpus) {
  if (totalGpus > 16384) return 3;
  if (totalGpus > 4096) return 4;
  if (totalGpus > 1024) return 7;
  return 12;
}

function renderGrid() {
  const container = $("groups");
  const q = query();
  const filtering = q.host !== null || q.gpu !== null || q.words.length > 0;
  const problemsOnly = $("problems-only").checked;
  const total = model.cells.size;
  const width = Math.max(200, container.clientWidth || 1000);
  const canvases = [];
  for (const [name, hosts] of groupsOf($("groupby").value)) {
    const shown = problemsOnly
      ? hosts.filter((h) => h.gpus.some((g) => (model.cells.get(cellKey(h.name, g.index))?.state ?? "ok") !== "ok"))
      : hosts;
    if (shown.length === 0) continue;
    const perHost = shown.reduce((m, h) => Math.max(m, h.gpus.length), 1);
    // cells as big as the group allows: a handful of problem hosts get big, named blocks
    const c = cellSize(shown.length * perHost);
    const gap = c >= 7 ? 2 : 1;
    const blockW = perHost * c + (perHost - 1) * (c >= 7 ? 1 : 0) + gap * 3;
    const labels = c >= 12 && shown.length <= 1024;  // small fleets: each host block is named
    const perRow = Math.max(1, Math.floor(width / blockW));
    const rows = Math.ceil(shown.length / perRow);
    const rowH = c + gap + (labels ? 13 : 0);
    const canvas = document.createElement("canvas");
    canvas.width = perRow * blockW;
    canvas.height = rows * rowH;
    const ctx = canvas.getContext("2d");
    const inner = c >= 7 ? 1 : 0;
    if (labels) ctx.font = "10px sans-serif";
    shown.forEach((h, i) => {
      const x0 = (i % perRow) * blockW;
      const y0 = Math.floor(i / perRow) * rowH;
      if (labels) {
        ctx.globalAlpha = 1;
        ctx.fillStyle = css.getPropertyValue("--muted").trim() || "#888";
        ctx.fillText(h.name, x0, y0 + 10, blockW - gap * 3);
      }
      const yc = y0 + (labels ? 13 : 0);
      const job = model.jobOfHost.get(h.name);
      for (const g of h.gpus) {
        const cell = model.cells.get(cellKey(h.name, g.index));
        const state = cell?.state ?? "unknown";
        const hit = !filtering || matches(q, h.name, g.index, job ?? g.job,
          state + " " + (cell?.verdicts ?? []).map((v) => v.reason).join(" "));
        ctx.globalAlpha = hit ? 1 : 0.18;
        ctx.fillStyle = COLOR[state];
        ctx.fillRect(x0 + g.index * (c + inner), yc, c, c);
      }
    });
    canvas.dataset.group = name;
    const layout = { hosts: shown, perRow, blockW, c, gap, inner, rowH };
    canvas.addEventListener("mousemove", (ev) => hover(ev, layout));
    canvas.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
    canvas.addEventListener("click", (ev) => {
      const hit = locate(ev, layout);
      if (hit) { $("search").value = hit.host.name + "/" + hit.gpu; refreshView(); }
    });
    const wrap = el("div", null, "group");
    const gpuCount = shown.reduce((n, h) => n + h.gpus.length, 0);
    const plural = (n, word) => `${n.toLocaleString()} ${word}${n === 1 ? "" : "s"}`;
    wrap.append(el("h3", `${name} — ${plural(shown.length, "host")}, ${plural(gpuCount, "GPU")}`), canvas);
    canvases.push(wrap);
  }
  container.replaceChildren(...canvases);
  $("gpu-count").textContent = `(${total.toLocaleString()})`;
}

function locate(ev, layout) {
  const rect = ev.target.getBoundingClientRect();
  const x = ev.clientX - rect.left;
  const y = ev.clientY - rect.top;
  const col = Math.floor(x / layout.blockW);
  const rowIdx = Math.floor(y / layout.rowH);
  const host = layout.hosts[rowIdx * layout.perRow + col];
  if (!host) return null;
  const gpu = Math.floor((x - col * layout.blockW) / (layout.c + layout.inner));
  if (gpu < 0 || gpu >= host.gpus.length) return null;
  return { host, gpu: host.gpus[gpu].index };
}

function hover(ev, layout) {
  const tip = $("tooltip");
  const hit = locate(ev, layout);
  if (!hit) { tip.hidden = true; return; }
  const cell = model.cells.get(cellKey(hit.host.name, hit.gpu));
  const lines = [`${hit.host.name} gpu ${hit.gpu}: ${cell?.state ?? "unknown"}`];
  const job = model.jobOfHost.get(hit.host.name);
  if (job) lines.push(`job ${job}`);
  for (const v of cell?.verdicts ?? []) lines.push(`${v.kind} ${v.reason} → ${v.action}`);
  tip.textContent = lines.join("\n");
  tip.style.whiteSpace = "pre";
  tip.style.left = ev.clientX + 12 + "px";
  tip.style.top = ev.clientY + 12 + "px";
  tip.hidden = false;
}

function renderProblems() {
  const q = query();
  const list = [];
  for (const host of model.hosts) {
    const job = model.jobOfHost.get(host.name);
    const cellsOf = host.gpus.map((g) => model.cells.get(cellKey(host.name, g.index)));
    if (!host.connected && cellsOf.every((c) => c && c.state === "silent" && c.verdicts.length === 0)) {
      // a silent host is one problem, not one per GPU
      if (matches(q, host.name, null, job, "silent host not reporting")) {
        list.push({ host, gpu: "all", state: "silent", job: job ?? "", why: "host not reporting" });
      }
      continue;
    }
    for (const g of host.gpus) {
      const cell = model.cells.get(cellKey(host.name, g.index));
      if (!cell || cell.state === "ok" || cell.state === "unknown") continue;
      const why = cell.verdicts.map((v) => `${v.kind} ${v.reason} → ${v.action}`).join("; ")
        || (cell.state === "silent" ? "host not reporting" : `GPU ${cell.raw}`);
      if (!matches(q, host.name, g.index, job ?? g.job, cell.state + " " + why)) continue;
      list.push({ host, gpu: g.index, state: cell.state, job: job ?? g.job ?? "", why });
    }
  }
  list.sort((a, b) => RANK[a.state] - RANK[b.state] || a.host.name.localeCompare(b.host.name) ||
    String(a.gpu).localeCompare(String(b.gpu), undefined, { numeric: true }));
  const rows = list.slice(0, MAX_ROWS).map((p) => row(
    [p.host.name, p.gpu, stateCell(p.state), p.host.cluster, p.job, p.why],
    { host: p.host.name, gpu: p.gpu, state: p.state }));
  rows.forEach((r) => r.classList.add("problem"));
  fillBody($("problems"), rows, list.length);
  $("problem-count").textContent = `(${list.length.toLocaleString()})`;
}

function incidentId(inc) { return String(inc.id ?? inc.incident_id ?? ""); }

function renderIncidents() {
  const q = query();
  const list = model.incidents
    .filter((i) => matches(q, String(i.host ?? (Array.isArray(i.hosts) ? i.hosts.join(" ") : "")), null, i.job ?? i.job_id,
      `${i.kind ?? ""} ${i.reason ?? ""} ${i.title ?? ""}`))
    .sort((a, b) => (toMillis(b.opened_at ?? b.created_at ?? b.t) ?? 0) - (toMillis(a.opened_at ?? a.created_at ?? a.t) ?? 0))
    .slice(0, 50);
  $("incident-count").textContent = `(${model.incidents.length})`;
  const items = list.map((inc) => {
    const id = incidentId(inc);
    const when = inc.opened_at ?? inc.created_at ?? inc.t;
    const what = [inc.title, inc.kind, inc.reason, inc.job ?? inc.job_id, inc.host,
      inc.gpu !== undefined && inc.gpu !== null ? "gpu " + inc.gpu : null].filter(Boolean).join(" · ");
    const li = el("li", `${id} — ${what} ${when !== undefined ? "(" + ago(when) + ")" : ""}`);
    li.dataset.id = id;
    if (id === model.selectedIncident) li.classList.add("selected");
    li.addEventListener("click", () => { model.selectedIncident = id; loadTimeline(); renderIncidents(); });
    return li;
  });
  $("incidents").replaceChildren(...items);
  if (model.selectedIncident === null && list.length > 0) {
    model.selectedIncident = incidentId(list[0]);
    loadTimeline();
  }
}

function describeEntry(e) {
  const d = (e.data && typeof e.data === "object") ? e.data : {};
  const type = String(e.type ?? e.kind ?? "");
  const gpu = d.gpu ?? e.gpu;
  const where = [e.host, gpu !== undefined && gpu !== null ? "gpu " + gpu : null].filter(Boolean).join(" ");
  let what;
  if (type === "verdict") {
    what = `VERDICT ${d.kind} ${d.reason} → ${d.action}` + (d.evidence?.length ? ` (${d.evidence[0]})` : "");
  } else if (type === "event") {
    const xid = d.record?.xid ?? d.xid;
    what = [d.kind, d.line_kind, xid ? "Xid " + xid : null, d.severity, d.text].filter(Boolean).join(" ");
  } else if (type === "sample") {
    const num = (v, unit) => (v === undefined || v === null ? null : Math.round(v) + unit);
    what = [d.state && d.state !== "ok" ? d.state.toUpperCase() : null, num(d.util_gpu_pct, "%"), num(d.temp_c, "°C"),
      num(d.power_w, " W"), num(d.sm_clock_mhz, " MHz"), (d.throttle ?? []).join(",")].filter(Boolean).join(" ");
  } else if (type === "heads") {
    const pgs = (d.pgs ?? []).map((pg) => {
      // "?": an unconfirmed send/recv (maybe a completed one-op batch's member; never counted as a wait)
      const inflight = (pg.in_flight ?? []).map((f) => `${f.op}#${f.seq}${f.unconfirmed ? "?" : ""}`).join(",");
      return `${pg.pg_name} done ${pg.last_completed_seq}` + (inflight ? ` in ${inflight}` : "");
    });
    what = `rank ${d.rank}: ${pgs.join("; ")}`;
  } else if (type === "procs") {
    what = `${(d.procs ?? []).length} GPU processes`;
  } else {
    what = e.text ?? e.message ?? JSON.stringify(d);
  }
  return `${clockTime(e.t ?? e.time)}  ${where.padEnd(16)} ${type.padEnd(8)} ${what}`;
}

const BULK_TYPES = new Set(["sample", "heads"]);
const PHASES = [["fault_at", "fault"], ["detected_at", "detected"], ["named_at", "named"],
  ["drained_at", "drained"], ["requeued_at", "requeued"], ["resumed_at", "resumed"]];

// One line: each phase the incident went through, timed from the one before, and the GPU time it cost.
function describePhases(inc) {
  const phases = inc.phases;
  if (!phases) return "";
  const parts = [];
  let previous = null;
  for (const [key, name] of PHASES) {
    const t = phases[key];
    if (t === null || t === undefined) continue;
    parts.push(previous === null ? `${name} ${new Date(t * 1000).toISOString().slice(11, 19)}`
      : `${name} +${(t - previous).toFixed(1)} s`);
    previous = t;
  }
  const open = phases.resumed_at === null || phases.resumed_at === undefined;
  const lost = Number(inc.gpu_seconds_lost ?? 0);
  return `phases: ${parts.join(" → ")}${open ? " (not resumed)" : ""}; ` +
    `${(lost / 3600).toFixed(2)} GPU-hours lost`;
}

// The incident's evidence as text: per host, each rank's Python stacks (innermost frames of the threads that
// have any), the kernel lines around the fault and the GPU snapshots (nvidia-smi XML) it holds.
function describeEvidence(ev) {
  if (!ev) return "evidence before action: none requested";
  const missing = ev.missing_hosts ?? [];
  const lines = [`evidence before action: ${ev.state}` + (missing.length ? `; no answer from ${missing.join(", ")}` : "") +
    (ev.finished_at ? ` (attached ${clockTime(ev.finished_at)})` : "")];
  for (const p of ev.problems ?? []) lines.push(`  problem: ${p}`);
  for (const [host, ans] of Object.entries(ev.hosts ?? {})) {
    lines.push(`${host}: ${(ans.stacks ?? []).length} rank stacks, ${(ans.kernel ?? []).length} kernel lines, ` +
      `${(ans.gpus ?? []).length} GPU snapshots` + (ans.error ? ` — ${ans.error}` : ""));
    for (const [rank, why] of Object.entries(ans.refused ?? {})) lines.push(`  rank ${rank} refused: ${why}`);
    for (const st of ans.stacks ?? []) {
      const head = `  rank ${st.rank ?? "?"} pid ${st.pid} gpu ${st.gpu}`;
      if (st.error) { lines.push(`${head}: ${st.error}`); continue; }
      lines.push(head);
      for (const th of st.threads ?? []) {
        const frames = th.frames ?? [];
        if (!frames.length) continue;
        lines.push(`    thread ${th.name || (th.thread_id ?? 0)}${th.active ? " (active)" : ""}`);
        for (const f of frames.slice(0, 8)) lines.push(`      ${f.name} (${f.file}:${f.line ?? "?"})`);
        if (frames.length > 8) lines.push(`      … ${frames.length - 8} outer frames`);
      }
    }
    for (const k of (ans.kernel ?? []).slice(-20)) lines.push(`  ${clockTime(k.t)} kernel ${k.text}`);
    for (const g of ans.gpus ?? []) {
      lines.push(`  GPU ${g.gpu}: ` + (g.error ? g.error : `nvidia-smi snapshot, ${(g.xml ?? "").length} chars`) +
        (g.read_at ? `, read ${clockTime(g.read_at)}` : ""));
    }
    for (const c of ans.cut ?? []) lines.push(`  cut: ${c}`);
  }
  return lines.join("\n");
}

async function loadTimeline() {
  const id = model.selectedIncident;
  if (!id) return;
  try {
    const inc = await getJSON("api/v1/incidents/" + encodeURIComponent(id), 30000);
    if (id !== model.selectedIncident) return;
    const entries = asList(inc.timeline ?? inc.events ?? inc.entries ?? [], "timeline");
    const all = $("timeline-all").checked;
    // Samples and heads are nearly all of a timeline. By default show every event, verdict and process
    // change, and samples/heads only of the GPUs and ranks the incident's verdicts name.
    const named = new Set();
    const ranks = new Set();
    for (const v of inc.verdicts ?? []) {
      if (v.host) named.add(v.gpu === null || v.gpu === undefined ? String(v.host) : cellKey(v.host, v.gpu));
      if (v.rank !== null && v.rank !== undefined) ranks.add(Number(v.rank));
    }
    const relevant = (e) => {
      const d = e.data ?? {};
      if (e.type === "heads") return ranks.has(Number(d.rank));
      return named.has(String(e.host)) || named.has(cellKey(e.host, d.gpu));
    };
    const shown = entries.filter((e) => all || !BULK_TYPES.has(String(e.type)) || relevant(e)).slice(-2000);
    const verdicts = (inc.verdicts ?? []).map((v) => `${v.kind} ${v.reason} on ${v.host ?? ""}` +
      (v.gpu !== null && v.gpu !== undefined ? ` gpu ${v.gpu}` : "")).join(", ");
    const lines = [`incident ${id}` + (inc.job ? ` — job ${inc.job}` : "") + (verdicts ? ` — ${verdicts}` : ""),
      `${entries.length} entries from ${(inc.hosts ?? []).length} hosts` +
      ((inc.missing_hosts ?? []).length ? `, no snapshot from ${inc.missing_hosts.join(", ")}` : "") +
      (shown.length < entries.length ? ` (showing ${shown.length}: ` +
        (all ? "the last ones)" : "events, verdicts, and readings of the GPUs and ranks named)") : "")];
    const phaseLine = describePhases(inc);
    if (phaseLine) lines.splice(1, 0, phaseLine);
    for (const e of shown) lines.push(describeEntry(e));
    $("timeline").textContent = lines.join("\n");
    $("timeline").scrollTop = $("timeline").scrollHeight;  // the verdict is at the end
    $("evidence").textContent = describeEvidence(inc.evidence);
  } catch (err) {
    $("timeline").textContent = `incident ${id}: ${err.message}`;
  }
}

function refreshView() {
  const t0 = performance.now();
  rebuildCells();
  const counts = renderSummary();
  renderVerdicts();
  renderJobs();
  renderLegend(counts);
  renderTiles(counts);
  renderGrid();
  renderProblems();
  renderIncidents();
  // for tests and the curious: how long one redraw took, and how many polls have rendered
  document.body.dataset.renderMs = (performance.now() - t0).toFixed(1);
  document.body.dataset.renders = String(Number(document.body.dataset.renders ?? 0) + 1);
}

// ---------- polling ----------

let hostsDueAt = 0;
let hostsCostMs = 0;

async function poll() {
  const started = performance.now();
  const wantHosts = Date.now() >= hostsDueAt;
  try {
    const [verdicts, jobs, incidents, hosts] = await Promise.all([
      getAll("api/v1/verdicts?state=open", "verdicts"),
      getAll("api/v1/jobs", "jobs"),
      getJSON("api/v1/incidents").catch(() => null),
      wantHosts ? getAll("api/v1/hosts", "hosts", 30000) : Promise.resolve(null),
    ]);
    model.verdicts = asList(verdicts, "verdicts").filter((v) => (v.state ?? "open") === "open");
    model.jobs = asList(jobs, "jobs").map(normJob).sort((a, b) => a.id.localeCompare(b.id));
    if (incidents !== null) model.incidents = asList(incidents, "incidents");
    if (hosts !== null) {
      model.hosts = asList(hosts, "hosts").map(normHost)
        .sort((a, b) => a.cluster.localeCompare(b.cluster) || a.name.localeCompare(b.name));
      hostsCostMs = performance.now() - started;
      // A big fleet's host list is the expensive call: poll it at most every ~10x its cost.
      hostsDueAt = Date.now() + Math.min(30000, Math.max(FAST_POLL_MS, hostsCostMs * 10));
    }
    model.lastOk = Date.now();
    refreshView();
    $("conn").dataset.state = "ok";
    $("conn").textContent = "live";
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    const stale = model.lastOk ? ` (data from ${ago(model.lastOk / 1000)})` : "";
    $("conn").dataset.state = model.lastOk ? "stale" : "down";
    $("conn").textContent = "aggregator not answering" + stale;
  }
  const spent = performance.now() - started;
  setTimeout(poll, Math.max(FAST_POLL_MS, spent * 2));
}

function init() {
  const params = new URLSearchParams(location.search);
  if (params.get("q")) $("search").value = params.get("q");
  if (params.get("group")) $("groupby").value = params.get("group");
  let pending = null;
  $("search").addEventListener("input", () => {
    clearTimeout(pending);
    pending = setTimeout(refreshView, 150);
  });
  $("groupby").addEventListener("change", refreshView);
  $("problems-only").addEventListener("change", refreshView);
  $("timeline-all").addEventListener("change", loadTimeline);
  getJSON("ui/runbooks.json").then((rb) => { model.runbooks = rb; refreshView(); }).catch(() => {});
  window.addEventListener("resize", () => { clearTimeout(pending); pending = setTimeout(renderGrid, 200); });
  poll();
}

init();
