/* The MetaService console: a single page over the REST API (/api/v1).
 *
 * Views (by the URL's hash): #/ the topology graph, #/focus/<table> its neighbourhood,
 * #/tables every table, #/table/<table> a table's page (with its log, when it has one),
 * #/revisions the revisions.
 * Everything is re-read from the API every POLL_MS while "live" is ticked. A bearer token,
 * when the service requires one, is asked for on the first 401 and kept in sessionStorage.
 */
"use strict";

(function () {
  const API = new URL("../api/v1", location.href).pathname.replace(/\/$/, "");
  const POLL_MS = Number(new URLSearchParams(location.search).get("poll_ms")) || 5000;
  const DRAW_ALL_UP_TO = 300; // nodes; past this the graph shows one neighbourhood at a time
  const MAX_DRAWN = 1500; // a neighbourhood bigger than this is not laid out
  const PAGE = 1000; // the service's default max_page_size
  const TOKEN_KEY = "metaservice.token";

  cytoscape.use(cytoscapeDagre);

  // The Iceberg REST catalog is served beside the API: engines attach with uri=<this>.
  document.getElementById("catalog-uri").textContent =
    new URL("../iceberg", location.href).href.replace(/\/$/, "");

  // -- small helpers --------------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;

  function duration(ms) {
    if (ms === null || ms === undefined) return "–";
    const s = Math.abs(ms) / 1000;
    let text;
    if (s < 1) text = `${Math.round(Math.abs(ms))} ms`;
    else if (s < 90) text = `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
    else if (s < 5400) text = `${Math.round(s / 60)} min`;
    else if (s < 172800) text = `${(s / 3600).toFixed(1)} h`;
    else text = `${(s / 86400).toFixed(1)} d`;
    return ms < 0 ? `-${text}` : text;
  }
  const iso = (ms) => (ms === null || ms === undefined ? "–" : new Date(ms).toISOString().replace(".000Z", "Z"));
  function when(ms) {
    if (ms === null || ms === undefined) return "–";
    return h("span", { title: iso(ms) }, `${iso(ms)} (${duration(serverNow() - ms)} ago)`);
  }
  const clock = (ms) => `${new Date(ms).toISOString().slice(11, 19)}Z`;
  /** 512 B, 1.5 KiB, 256 MiB (as `metaservice log status` prints sizes). */
  function bytesText(n) {
    let size = n;
    for (const unit of ["B", "KiB", "MiB", "GiB"]) {
      if (size < 1024 || unit === "GiB") return unit === "B" || size >= 10 ? `${Math.round(size)} ${unit}` : `${size.toFixed(1)} ${unit}`;
      size /= 1024;
    }
    return `${n} B`;
  }
  function hasData(t) {
    return t.latest_barrier !== null && t.latest_barrier !== undefined;
  }
  function level(t) {
    if (!hasData(t) || t.delay_ms === null) return "nodata";
    if (t.delay_ms < 60000) return "ok";
    if (t.delay_ms < 600000) return "warn";
    return "late";
  }
  function delayBadge(t) {
    const lv = level(t);
    return h("span", { class: `badge ${lv}` }, lv === "nodata" ? "no data yet" : `delay ${duration(t.delay_ms)}`);
  }
  const tableLink = (name) => h("a", { href: `#/table/${enc(name)}`, "data-table-link": name }, name);
  const logBadge = (log) => h("span", { class: "badge log", "data-log": log.mode, title: `${log.mode} log at ${(log.addresses || [log.address]).join(", ")}` }, "log");

  // -- the API --------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body) {
      super((body && body.message) || `HTTP ${status}`);
      this.status = status;
      this.code = body && body.code;
    }
  }

  async function api(path, params) {
    const url = new URL(API + path, location.origin);
    for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null) url.searchParams.set(k, v);
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    const r = await fetch(url, { headers });
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    if (r.status === 401 || r.status === 403) askToken(body && body.message);
    if (!r.ok) throw new ApiError(r.status, body);
    return body;
  }

  async function all(path, params) {
    let items = [];
    for (let offset = 0; ; offset += PAGE) {
      const page = await api(path, { ...params, limit: PAGE, offset });
      items = items.concat(page.items);
      if (items.length >= page.total || page.items.length === 0) return items;
    }
  }

  function askToken(reason) {
    $("token-reason").textContent = reason || "This MetaService requires a bearer token.";
    $("token-bar").hidden = false;
    $("token-input").focus();
  }

  // -- state ----------------------------------------------------------------------------------

  const state = {
    jobs: new Map(), tables: new Map(), skew: 0, updated: null,
    focus: null, hops: "2", selected: null, critical: null, drawnKey: null,
  };
  const serverNow = () => Date.now() + state.skew;

  async function loadTopology() {
    const [jobs, tables] = await Promise.all([all("/jobs"), all("/tables")]);
    state.jobs = new Map(jobs.map((j) => [j.name, j]));
    state.tables = new Map(tables.map((t) => [t.name, t]));
    // The service's "now" is frontier + delay for any table with a writer: ages shown use
    // the service's clock, not the browser's.
    const t = tables.find((x) => x.frontier !== null && x.delay_ms !== null);
    if (t) state.skew = t.frontier + t.delay_ms - Date.now();
    state.updated = Date.now();
  }

  // -- the graph ------------------------------------------------------------------------------

  let cy = null;

  function graphStyle() {
    return [
      { selector: "node", style: {
        label: "data(label)", "text-wrap": "wrap", "text-valign": "center", "text-halign": "center",
        "font-size": 11, "font-family": "system-ui, DejaVu Sans, sans-serif", color: "#fff",
        width: "data(w)", height: "data(h)", "border-width": 0,
      } },
      { selector: "node.table", style: { shape: "round-rectangle", "background-color": "#9aa3ad" } },
      { selector: "node.table.ok", style: { "background-color": "#2e9d5b" } },
      { selector: "node.table.warn", style: { "background-color": "#d99a16" } },
      { selector: "node.table.late", style: { "background-color": "#cf3b3b" } },
      { selector: "node.job", style: {
        shape: "ellipse", "background-color": "#ece9fb", color: "#3a3191",
        "border-width": 1.5, "border-color": "#5b4fc7", "font-size": 10,
      } },
      { selector: "node.job.down", style: { "border-style": "dashed", color: "#8a86a8" } },
      { selector: "node.focus", style: { "border-width": 3, "border-color": "#1d2330" } },
      { selector: "node:selected", style: { "border-width": 4, "border-color": "#2457c5" } },
      { selector: "edge", style: {
        width: 1.5, "line-color": "#b6bfcc", "target-arrow-color": "#b6bfcc",
        "target-arrow-shape": "triangle", "curve-style": "bezier", "arrow-scale": 0.9,
      } },
      { selector: "edge.critical", style: { "line-color": "#e8590c", "target-arrow-color": "#e8590c", width: 4, "z-index": 9 } },
      { selector: "node.critical", style: { "border-width": 4, "border-color": "#e8590c" } },
      { selector: ".faded", style: { opacity: 0.35 } },
    ];
  }

  function tableLabel(t) {
    const second = hasData(t) ? `frontier ${clock(t.frontier)} (${duration(serverNow() - t.frontier)} ago)` : "no data yet";
    const third = hasData(t) ? `delay ${duration(t.delay_ms)}` : "";
    return [t.name, second, third].filter(Boolean).join("\n");
  }

  function nodeData(id) {
    const [kind, name] = [id.slice(0, id.indexOf(":")), id.slice(id.indexOf(":") + 1)];
    if (kind === "table") {
      const t = state.tables.get(name) || { name, latest_barrier: null, delay_ms: null };
      const label = tableLabel(t);
      const longest = Math.max(...label.split("\n").map((l) => l.length));
      return { data: { id, name, kind, label, w: Math.max(90, longest * 6.6 + 18), h: hasData(t) ? 50 : 36 },
               classes: `table ${level(t)}` };
    }
    const j = state.jobs.get(name);
    const down = j && ["terminated", "failed", "stale", "superseded"].includes(j.status);
    return { data: { id, name, kind, label: name, w: Math.max(70, name.length * 6.2 + 20), h: 30 },
             classes: `job${down ? " down" : ""}` };
  }

  /** Node ids within `hops` jobs of a table or job, upstream and downstream. */
  function neighbourhood(focus, hops) {
    const limit = hops === "all" ? Infinity : Number(hops);
    const nodes = new Set();
    const writerOf = (t) => state.tables.get(t) && state.tables.get(t).writer;
    const readersOf = (t) => (state.tables.get(t) && state.tables.get(t).readers) || [];
    const job = (n) => state.jobs.get(n) || { inputs: [], outputs: [] };
    let up = [], down = [];
    if (focus.kind === "table") {
      nodes.add(`table:${focus.name}`);
      up = [focus.name]; down = [focus.name];
    } else {
      const j = job(focus.name);
      nodes.add(`job:${focus.name}`);
      j.inputs.forEach((t) => nodes.add(`table:${t}`));
      j.outputs.forEach((t) => nodes.add(`table:${t}`));
      up = j.inputs.slice(); down = j.outputs.slice();
    }
    const seen = new Set();
    for (let d = focus.kind === "table" ? 1 : 2; d <= limit && up.length; d++) {
      const next = [];
      for (const t of up) {
        const w = writerOf(t);
        if (!w || seen.has(w)) continue;
        seen.add(w);
        nodes.add(`job:${w}`);
        for (const o of job(w).outputs) nodes.add(`table:${o}`);
        for (const i of job(w).inputs) { nodes.add(`table:${i}`); next.push(i); }
      }
      up = next;
    }
    for (let d = focus.kind === "table" ? 1 : 2; d <= limit && down.length; d++) {
      const next = [];
      for (const t of down) {
        for (const r of readersOf(t)) {
          if (seen.has(r)) continue;
          seen.add(r);
          nodes.add(`job:${r}`);
          for (const o of job(r).outputs) { nodes.add(`table:${o}`); next.push(o); }
        }
      }
      down = next;
    }
    return nodes;
  }

  function everything() {
    const nodes = new Set();
    for (const t of state.tables.keys()) nodes.add(`table:${t}`);
    for (const j of state.jobs.keys()) nodes.add(`job:${j}`);
    return nodes;
  }

  function edgesAmong(nodes) {
    const edges = [];
    for (const [name, j] of state.jobs) {
      const jid = `job:${name}`;
      if (!nodes.has(jid)) continue;
      for (const t of j.inputs) if (nodes.has(`table:${t}`)) edges.push({ data: { id: `e:${t}>${name}`, source: `table:${t}`, target: jid } });
      for (const t of j.outputs) if (nodes.has(`table:${t}`)) edges.push({ data: { id: `e:${name}>${t}`, source: jid, target: `table:${t}` } });
    }
    return edges;
  }

  /** Ids of the nodes and edges on the critical path of state.critical (a /delay answer). */
  function criticalIds(delay) {
    const ids = new Set();
    if (!delay) return ids;
    ids.add(`table:${delay.table}`);
    for (const lag of delay.critical_path) {
      ids.add(`job:${lag.job}`);
      ids.add(`table:${lag.output}`);
      ids.add(`e:${lag.job}>${lag.output}`);
      if (lag.slowest_input) {
        ids.add(`table:${lag.slowest_input}`);
        ids.add(`e:${lag.slowest_input}>${lag.job}`);
      }
    }
    return ids;
  }

  function visibleNodes() {
    if (state.focus) {
      const nodes = neighbourhood(state.focus, state.hops);
      // The critical path of the selected table is drawn even where it leaves the neighbourhood.
      for (const id of criticalIds(state.critical)) if (!id.startsWith("e:")) nodes.add(id);
      return nodes;
    }
    const total = state.tables.size + state.jobs.size;
    return total <= DRAW_ALL_UP_TO ? everything() : new Set();
  }

  function drawGraph() {
    const nodes = visibleNodes();
    const total = state.tables.size + state.jobs.size;
    const message = $("graph-message");
    $("focus-label").textContent = state.focus
      ? `Neighbourhood of ${state.focus.kind} ${state.focus.name}: ${countKind(nodes, "table")} tables, ${countKind(nodes, "job")} jobs`
      : `Whole topology: ${state.tables.size} tables, ${state.jobs.size} jobs`;
    if (nodes.size === 0 || nodes.size > MAX_DRAWN) {
      if (cy) cy.elements().remove();
      state.drawnKey = null;
      message.hidden = false;
      message.replaceChildren(...emptyGraphMessage(nodes.size, total));
      return;
    }
    message.hidden = true;
    const key = [...nodes].sort().join("|");
    if (!cy) {
      cy = cytoscape({ container: $("cy"), style: graphStyle(), minZoom: 0.05, maxZoom: 3 });
      cy.on("tap", "node", (ev) => selectNode(ev.target.id()));
      cy.on("dbltap", "node.table", (ev) => { location.hash = `#/table/${enc(ev.target.data("name"))}`; });
      cy.on("tap", (ev) => { if (ev.target === cy) selectNode(null); });
    }
    if (key !== state.drawnKey) {
      cy.batch(() => {
        cy.elements().remove();
        cy.add([...nodes].map(nodeData));
        cy.add(edgesAmong(nodes));
      });
      cy.layout({
        name: "dagre", rankDir: "LR", nodeSep: 14, rankSep: 60, edgeSep: 10, fit: true, padding: 24,
        animate: false, useDagreEdgeControlPoints: true, automaticDagreEdgeStyle: true,
      }).run();
      fitGraph();
      state.drawnKey = key;
    } else {
      cy.batch(() => {
        for (const id of nodes) {
          const d = nodeData(id);
          const n = cy.getElementById(id);
          n.data(d.data);
          n.classes(d.classes);
        }
      });
    }
    markGraph();
  }

  /** Fit the drawing in the box, but a small graph no bigger than 1.4 times its size. */
  function fitGraph() {
    if (!cy || cy.elements().empty()) return;
    cy.fit(undefined, 24);
    if (cy.zoom() > 1.4) { cy.zoom(1.4); cy.center(); }
  }

  function markGraph() {
    if (!cy) return;
    const crit = criticalIds(state.critical);
    cy.batch(() => {
      cy.elements().removeClass("critical focus");
      for (const id of crit) cy.getElementById(id).addClass("critical");
      if (state.focus) cy.getElementById(`${state.focus.kind}:${state.focus.name}`).addClass("focus");
      cy.elements().unselect();
      if (state.selected) cy.getElementById(state.selected).select();
    });
  }

  const countKind = (nodes, kind) => [...nodes].filter((id) => id.startsWith(`${kind}:`)).length;

  function emptyGraphMessage(size, total) {
    if (total === 0) {
      return [h("h3", {}, "No jobs yet"), h("p", {}, "Register a job (PUT /api/v1/jobs/{job}) and it appears here.")];
    }
    if (size > MAX_DRAWN) {
      return [h("p", {}, `${size} nodes are too many to draw; choose fewer jobs away.`)];
    }
    const worst = [...state.tables.values()].filter(hasData).sort((a, b) => b.delay_ms - a.delay_ms).slice(0, 12);
    return [
      h("h3", {}, `${state.tables.size} tables and ${state.jobs.size} jobs: too many to draw at once`),
      h("p", { class: "muted" }, `${[...state.tables.values()].filter((t) => !hasData(t)).length} of the tables have no data yet.`),
      h("p", {}, "Find a table or job in the search box to see its neighbourhood, or pick one of the most delayed tables:"),
      h("ul", {}, worst.map((t) => h("li", {}, h("a", { href: `#/focus/${enc(t.name)}` }, t.name), " ", delayBadge(t)))),
    ];
  }

  async function selectNode(id) {
    state.selected = id;
    state.critical = null;
    if (!id || !id.startsWith("table:")) {
      markGraph();
      renderSide();
      return;
    }
    const name = id.slice(6);
    renderSide();
    try {
      state.critical = await api("/delay", { table: name });
    } catch (e) {
      state.critical = null;
    }
    if (state.selected !== id) return;
    const before = state.drawnKey;
    drawGraph();
    if (state.drawnKey !== before) cy.getElementById(id).select();
    renderSide();
  }

  function renderSide() {
    const side = $("side");
    const id = state.selected;
    const wasHidden = side.hidden;
    side.hidden = !id;
    if (cy && wasHidden !== side.hidden) { cy.resize(); fitGraph(); }
    if (!id) return;
    const name = id.slice(id.indexOf(":") + 1);
    if (id.startsWith("job:")) {
      const j = state.jobs.get(name);
      if (!j) { side.hidden = true; return; }
      side.replaceChildren(
        h("h2", {}, `job ${j.name}`),
        h("dl", { class: "facts" },
          h("dt", {}, "kind"), h("dd", {}, j.kind),
          h("dt", {}, "status"), h("dd", {}, j.status),
          h("dt", {}, "frontier"), h("dd", {}, j.frontier ? when(j.frontier) : "no data yet"),
          h("dt", {}, "last batch"), h("dd", {}, j.last_batch_id ?? "–"),
          h("dt", {}, "last seen"), h("dd", {}, j.last_seen_ms ? when(j.last_seen_ms) : "–"),
          h("dt", {}, "inputs"), h("dd", {}, j.inputs.length ? j.inputs.map((t, i) => [i ? ", " : "", tableLink(t)]) : "none (source)"),
          h("dt", {}, "outputs"), h("dd", {}, j.outputs.map((t, i) => [i ? ", " : "", tableLink(t)]))),
        j.description ? h("p", { class: "muted" }, j.description) : null,
        h("p", {}, h("a", { href: `#/focus-job/${enc(j.name)}` }, "Focus on this job")));
      return;
    }
    const t = state.tables.get(name);
    if (!t) { side.hidden = true; return; }
    const d = state.critical && state.critical.table === name ? state.critical : null;
    side.replaceChildren(
      h("h2", { "data-side-table": name }, name),
      delayBadge(t),
      h("dl", { class: "facts" },
        h("dt", {}, "writer"), h("dd", {}, t.writer || "–"),
        h("dt", {}, "readers"), h("dd", {}, t.readers.length ? t.readers.join(", ") : "–"),
        h("dt", {}, "frontier"), h("dd", {}, hasData(t) ? when(t.frontier) : "no data yet"),
        h("dt", {}, "last commit"), h("dd", {}, hasData(t) ? when(t.latest_barrier) : "–"),
        h("dt", {}, "latest snapshot"), h("dd", {}, t.latest_snapshot ?? "–"),
        t.log ? [h("dt", {}, "log"), h("dd", {}, `${t.log.mode} at ${(t.log.addresses || [t.log.address]).join(", ")}`)] : null),
      h("p", {}, h("a", { href: `#/table/${enc(name)}`, id: "open-table" }, "Open the table's page →"),
        " · ", h("a", { href: `#/focus/${enc(name)}` }, "focus here")),
      h("h3", {}, "Critical path"),
      d ? criticalPath(d) : h("p", { class: "muted" }, hasData(t) ? "loading…" : "no data yet"));
  }

  function criticalPath(d) {
    if (!d.critical_path.length) return h("p", { class: "muted" }, "no upstream jobs");
    // A job that never committed has no contribution (null), nor its table a frontier.
    const share = (lag) => (lag.contribution_ms === null ? "no data yet" : `+${duration(lag.contribution_ms)}`);
    return h("div", {},
      h("p", { class: "muted" }, d.frontier === null
        ? "No data yet. The path to the first upstream job that has committed:"
        : `Delay ${duration(d.delay_ms)}; what each job on the path adds:`),
      h("ol", { class: "path" }, d.critical_path.map((lag) => h("li", {},
        h("b", {}, lag.job), ` → ${lag.output}: ${share(lag)}`,
        h("br"), h("span", { class: "muted" }, lag.slowest_input ? `held back by ${lag.slowest_input}` : "source: trails the clock")))));
  }

  // -- search ---------------------------------------------------------------------------------

  let matches = [];
  let active = 0;

  function search(text) {
    const q = text.trim().toLowerCase();
    const list = $("suggestions");
    if (!q) { list.hidden = true; matches = []; return; }
    matches = [];
    for (const name of state.tables.keys()) if (name.toLowerCase().includes(q)) matches.push({ kind: "table", name });
    for (const name of state.jobs.keys()) if (name.toLowerCase().includes(q)) matches.push({ kind: "job", name });
    // Exact and prefix matches first, then by name.
    const rank = (m) => (m.name.toLowerCase() === q ? 0 : m.name.toLowerCase().startsWith(q) ? 1 : 2);
    matches.sort((a, b) => rank(a) - rank(b) || a.name.localeCompare(b.name));
    const shown = matches.slice(0, 30);
    active = 0;
    list.replaceChildren(...shown.map((m, i) => h("li", {
      role: "option", class: i === 0 ? "active" : "", "data-kind": m.kind, "data-name": m.name,
      onmousedown: (ev) => { ev.preventDefault(); choose(m); },
    }, h("span", {}, m.name), h("span", { class: "kind" }, m.kind))));
    if (matches.length > shown.length) list.append(h("li", { class: "muted" }, `${matches.length - shown.length} more…`));
    if (!matches.length) list.append(h("li", { class: "muted" }, "nothing matches"));
    list.hidden = false;
  }

  function choose(m) {
    $("suggestions").hidden = true;
    $("search").value = m.name;
    $("search").blur();
    location.hash = m.kind === "table" ? `#/focus/${enc(m.name)}` : `#/focus-job/${enc(m.name)}`;
  }

  function setupSearch() {
    const input = $("search");
    input.addEventListener("input", () => search(input.value));
    input.addEventListener("focus", () => { if (input.value) search(input.value); });
    input.addEventListener("blur", () => { $("suggestions").hidden = true; });
    input.addEventListener("keydown", (ev) => {
      const items = [...$("suggestions").querySelectorAll("li[data-name]")];
      if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
        ev.preventDefault();
        if (!items.length) return;
        active = (active + (ev.key === "ArrowDown" ? 1 : items.length - 1)) % items.length;
        items.forEach((li, i) => li.classList.toggle("active", i === active));
      } else if (ev.key === "Enter" && matches.length) {
        ev.preventDefault();
        choose(matches[Math.min(active, matches.length - 1)]);
      } else if (ev.key === "Escape") {
        $("suggestions").hidden = true;
      }
    });
  }

  // -- the tables list ------------------------------------------------------------------------

  let tablesFilter = "";

  function renderTables() {
    const view = $("view-tables");
    const q = tablesFilter.toLowerCase();
    const rows = [...state.tables.values()].filter((t) => !q || t.name.toLowerCase().includes(q))
      .sort((a, b) => (b.delay_ms ?? -1) - (a.delay_ms ?? -1) || a.name.localeCompare(b.name));
    const filter = h("input", { class: "filter", type: "search", placeholder: "Filter tables…", value: tablesFilter, "aria-label": "Filter tables" });
    filter.addEventListener("input", () => { tablesFilter = filter.value; renderTables(); const f = view.querySelector(".filter"); f.focus(); f.setSelectionRange(f.value.length, f.value.length); });
    replaceView(view,
      h("h2", {}, `Tables (${rows.length} of ${state.tables.size})`), filter,
      h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["table", "delay", "frontier", "writer", "readers", "latest snapshot"].map((c) => h("th", {}, c)))),
        h("tbody", {}, rows.slice(0, 500).map((t) => h("tr", {},
          h("td", {}, tableLink(t.name), t.log ? [" ", logBadge(t.log)] : null), h("td", {}, delayBadge(t)),
          h("td", {}, hasData(t) ? when(t.frontier) : "no data yet"), h("td", {}, t.writer || "–"),
          h("td", {}, t.readers.join(", ") || "–"), h("td", { class: "num" }, t.latest_snapshot ?? "–"))))),
      rows.length > 500 ? h("p", { class: "muted" }, `${rows.length - 500} more: filter to narrow down.`) : null);
  }

  // -- a table's page -------------------------------------------------------------------------

  const tablePage = { name: null, lineageOf: null, consistentWith: null };

  async function optional(promise) {
    try { return { ok: await promise }; } catch (e) { return { error: e }; }
  }

  async function snapshotsNewestFirst(name, count) {
    const first = await api(`/tables/${enc(name)}/snapshots`, { limit: 1 });
    const offset = Math.max(0, first.total - count);
    const page = await api(`/tables/${enc(name)}/snapshots`, { limit: count, offset });
    return { total: first.total, items: page.items.slice().reverse() };
  }

  async function renderTablePage() {
    const name = tablePage.name;
    const view = $("view-table");
    const others = tablePage.consistentWith || [];
    // The log's status is asked only of a table that has a log (the MetaService asks its
    // log service); the list read last says which do.
    const logOf = () => optional(api(`/tables/${enc(name)}/log`));
    const listed = state.tables.get(name);
    const [table, delay, snaps, consistent, leases, tags, plan, revisions, listedLog] = await Promise.all([
      optional(api(`/tables/${enc(name)}`)),
      optional(api("/delay", { table: name })),
      optional(snapshotsNewestFirst(name, 100)),
      optional(api("/versions/consistent", { tables: [name, ...others].join(",") })),
      optional(api(`/tables/${enc(name)}/leases`)),
      optional(api("/versions/tags", { table: name })),
      optional(api(`/tables/${enc(name)}/expirable`)),
      optional(all("/revisions")),
      listed && listed.log ? logOf() : null,
    ]);
    const log = table.ok && table.ok.log ? listedLog || await logOf() : null;
    const lineage = tablePage.lineageOf === null ? null
      : await optional(api(`/lineage/snapshots/${enc(name)}/${tablePage.lineageOf}`));
    if (tablePage.name !== name) return;
    if (table.error) {
      view.replaceChildren(h("h2", {}, name), h("p", {}, table.error.message));
      return;
    }
    const t = table.ok;
    replaceView(view,
      h("p", {}, h("a", { href: `#/focus/${enc(name)}` }, "← its neighbourhood in the graph")),
      h("h2", { "data-table-title": name }, `table ${name} `, delayBadge(t)),
      h("div", { class: "cards" },
        card("Summary", h("dl", { class: "facts" },
          h("dt", {}, "writer"), h("dd", {}, t.writer || "–"),
          h("dt", {}, "readers"), h("dd", {}, t.readers.length ? t.readers.join(", ") : "–"),
          h("dt", {}, "frontier"), h("dd", {}, hasData(t) ? when(t.frontier) : "no data yet"),
          h("dt", {}, "delay"), h("dd", {}, hasData(t) ? duration(t.delay_ms) : "–"),
          h("dt", {}, "last commit"), h("dd", {}, hasData(t) ? when(t.latest_barrier) : "–"),
          h("dt", {}, "latest snapshot"), h("dd", {}, t.latest_snapshot ?? "–"))),
        log ? card("Log", logView(log), null, "log") : null,
        card("Critical path", delay.ok ? criticalPath(delay.ok) : failed(delay.error)),
        card(`Snapshots${snaps.ok ? ` (${snaps.ok.total}, newest first)` : ""}`, snaps.ok ? snapshotTable(snaps.ok) : failed(snaps.error), "wide", "snapshots"),
        card("Snapshot lineage", lineage ? (lineage.ok ? lineageView(lineage.ok) : failed(lineage.error))
          : h("p", { class: "muted" }, "Click a snapshot to see what its batch read."), null, "lineage"),
        card("Consistent version", consistentView(name, consistent), null, "consistent"),
        card(`Leases${leases.ok ? ` (${leases.ok.total})` : ""}`, leases.ok ? leaseTable(leases.ok.items) : failed(leases.error), null, "leases"),
        card(`Tags${tags.ok ? ` (${tags.ok.total})` : ""}`, tags.ok ? tagTable(tags.ok.items) : failed(tags.error), null, "tags"),
        card("Expiry plan", plan.ok ? planView(plan.ok) : failed(plan.error), "wide", "expiry"),
        card("Revisions of this table", revisions.ok ? revisionList(revisions.ok.filter((r) => r.tables.some((m) => m.table === name))) : failed(revisions.error), "wide")));
  }

  function card(title, body, extra, id) {
    return h("div", { class: `card${extra ? ` ${extra}` : ""}`, "data-card": id || null }, h("h3", {}, title), body);
  }
  const failed = (e) => h("p", { class: "muted" }, e.message);

  /** A table's log (a GET /tables/{table}/log answer): where it runs and what it holds now. */
  function logView(res) {
    if (res.error) return failed(res.error);
    const l = res.ok;
    const services = l.services && l.services.length ? l.services : [{ address: l.address, reachable: l.reachable, status: l.status, error: l.error }];
    if (services.length === 1) {
      return logServiceView(services[0], [
        h("dt", {}, "mode"), h("dd", {}, l.mode),
        h("dt", {}, "address"), h("dd", {}, h("code", {}, services[0].address)),
        h("dt", {}, "published"), h("dd", {}, when(l.updated_ms)),
      ]);
    }
    // A log spread over several services by partition: each one's own facts.
    return h("div", { "data-log-services": services.length },
      h("dl", { class: "facts" },
        h("dt", {}, "mode"), h("dd", {}, l.mode),
        h("dt", {}, "services"), h("dd", {}, `${services.length} (rows spread by partition)`),
        h("dt", {}, "published"), h("dd", {}, when(l.updated_ms))),
      services.map((svc) => h("div", { class: "log-service", "data-log-service": svc.address },
        h("h4", {}, h("code", {}, svc.address)), logServiceView(svc, []))));
  }

  function logServiceView(svc, where) {
    const s = svc.status;
    if (!s) {
      const problem = svc.reachable
        ? h("p", { class: "muted", "data-log-problem": "" }, svc.error)
        : h("p", { "data-log-unreachable": "" }, h("span", { class: "badge late" }, "unreachable"), " ", h("span", { class: "muted" }, svc.error));
      return h("div", {}, where.length ? h("dl", { class: "facts" }, where) : null, problem);
    }
    const offset = (o) => (o ? `batch ${o.batch_id}, seq ${o.seq} (barrier ${iso(o.barrier)})` : "–");
    const p = s.persisted;
    return h("div", {},
      s.over_bound ? h("p", { class: "note warn", "data-log-over-bound": "" }, h("span", { class: "badge warn" }, "over its memory bound"),
        " rows not yet committed hold more than the log's bound; they are kept, and the next commit frees them") : null,
      h("dl", { class: "facts", "data-log-status": "" }, where,
        h("dt", {}, "entries held"), h("dd", { "data-log-entries": s.entries }, s.entries ? `${s.entries}` : "none (empty)"),
        h("dt", {}, "memory"), h("dd", { title: `${s.bytes} bytes` }, bytesText(s.bytes)),
        h("dt", {}, "spilled"), h("dd", { "data-log-spilled": s.spilled_entries },
          s.spilled_entries ? `${s.spilled_entries} entries, ${bytesText(s.spilled_bytes)} in ${s.spill_folder}` : (s.spill_folder ? `nothing (spills to ${s.spill_folder})` : "nothing (no spill folder)")),
        h("dt", {}, "first offset"), h("dd", {}, offset(s.first)),
        h("dt", {}, "last offset"), h("dd", {}, offset(s.last)),
        h("dt", {}, "persisted through"), h("dd", {}, p ? `batch ${p.batch_id}, snapshot ${p.snapshot_id} (barrier ${iso(p.barrier)})` : "nothing committed yet"),
        h("dt", {}, "readers"), h("dd", {}, s.readers.length ? s.readers.join(", ") : "none in the last minute"),
        h("dt", {}, "epoch"), h("dd", {}, s.epoch)));
  }

  function snapshotTable(snaps) {
    if (!snaps.items.length) return h("p", { class: "muted" }, "no snapshots yet");
    return h("div", { class: "scroll" }, h("table", { class: "grid", "data-snapshots": "" },
      h("thead", {}, h("tr", {}, h("th", { class: "num" }, "snapshot"), h("th", {}, "barrier"), h("th", {}, "job"), h("th", { class: "num" }, "batch"), h("th", {}, "reported"))),
      h("tbody", {}, snaps.items.map((s) => h("tr", {
        class: `clickable${tablePage.lineageOf === s.snapshot_id && s.snapshot_id !== null ? " selected" : ""}`,
        "data-snapshot": s.snapshot_id ?? "none",
        onclick: () => { if (s.snapshot_id !== null) { tablePage.lineageOf = s.snapshot_id; renderTablePage(); } },
      }, h("td", { class: "num" }, s.snapshot_id ?? "(no rows)"), h("td", {}, when(s.barrier)), h("td", {}, s.job),
        h("td", { class: "num" }, s.batch_id), h("td", {}, iso(s.reported_ms)))))),
    snaps.total > snaps.items.length ? h("p", { class: "muted" }, `the newest ${snaps.items.length} of ${snaps.total}`) : null);
  }

  function lineageView(l) {
    return h("div", {},
      h("p", {}, `Snapshot ${l.snapshot_id}: batch ${l.batch_id} of ${l.job} at barrier ${iso(l.barrier)}`),
      l.inputs.length ? h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, h("th", {}, "input"), h("th", { class: "num" }, "after snapshot"), h("th", { class: "num" }, "up to snapshot"))),
        h("tbody", {}, l.inputs.map((r) => h("tr", {}, h("td", {}, tableLink(r.table)),
          h("td", { class: "num" }, r.from_snapshot ?? "start"), h("td", { class: "num" }, r.to_snapshot ?? "–")))))
        : h("p", { class: "muted" }, "a source job's snapshot: no table inputs"));
  }

  function consistentView(name, consistent) {
    const input = h("input", { type: "text", placeholder: "other tables, comma-separated", value: (tablePage.consistentWith || []).join(","), size: 34, "aria-label": "Other tables" });
    const form = h("form", { onsubmit: (ev) => {
      ev.preventDefault();
      tablePage.consistentWith = input.value.split(",").map((s) => s.trim()).filter(Boolean);
      renderTablePage();
    } }, "with ", input, " ", h("button", { type: "submit" }, "Ask"));
    let body;
    if (consistent.ok) {
      const v = consistent.ok;
      body = h("div", {},
        h("p", {}, `Barrier ${iso(v.barrier)} (${duration(serverNow() - v.barrier)} ago)`),
        h("table", { class: "grid" }, h("thead", {}, h("tr", {}, h("th", {}, "table"), h("th", { class: "num" }, "snapshot"))),
          h("tbody", {}, Object.entries(v.snapshots).map(([t, s]) => h("tr", {}, h("td", {}, tableLink(t)), h("td", { class: "num" }, s ?? "(empty)"))))));
    } else {
      body = failed(consistent.error);
    }
    return h("div", {}, body, form);
  }

  function leaseTable(items) {
    if (!items.length) return h("p", { class: "muted" }, "no live leases");
    return h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, h("th", {}, "lease"), h("th", { class: "num" }, "snapshot"), h("th", {}, "barrier"), h("th", {}, "ends"), h("th", { class: "num" }, "tables"))),
      h("tbody", {}, items.map((l) => h("tr", {}, h("td", {}, h("code", {}, l.lease_id)), h("td", { class: "num" }, l.snapshot_id ?? "(empty)"),
        h("td", {}, iso(l.barrier)), h("td", {}, `in ${duration(l.expires_ms - serverNow())}`), h("td", { class: "num" }, l.tables)))));
  }

  function tagTable(items) {
    if (!items.length) return h("p", { class: "muted" }, "no tags");
    return h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, h("th", {}, "tag"), h("th", {}, "state"), h("th", {}, "barrier"), h("th", {}, "tables"), h("th", {}, "ends"))),
      h("tbody", {}, items.map((t) => h("tr", {}, h("td", {}, t.name), h("td", {}, t.state), h("td", {}, iso(t.barrier)),
        h("td", {}, Object.keys(t.snapshots).join(", ")), h("td", {}, t.expires_ms ? iso(t.expires_ms) : "never")))));
  }

  function planView(p) {
    const rows = p.kept.slice().reverse();
    return h("div", {},
      h("p", {}, `${p.expirable.length} snapshot(s) may be expired; ${p.kept.length} kept.`,
        p.expiry_horizon ? ` Expiry horizon: ${iso(p.expiry_horizon)}.` : ""),
      rows.length ? h("div", { class: "scroll" }, h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, h("th", { class: "num" }, "snapshot"), h("th", {}, "barrier"), h("th", {}, "kept because"))),
        h("tbody", {}, rows.slice(0, 200).map((s) => h("tr", {}, h("td", { class: "num" }, s.snapshot_id), h("td", {}, iso(s.barrier)),
          h("td", {}, s.reasons.join("; ") || "newer than the oldest snapshot in use")))))) : null);
  }

  // -- revisions ------------------------------------------------------------------------------

  function progress(m, fromBarrier) {
    if (m.original_frontier === null || m.original_frontier === undefined) return h("span", { class: "muted" }, "original has no writer");
    const span = m.original_frontier - fromBarrier;
    const done = span <= 0 ? 1 : Math.max(0, Math.min(1, (m.frontier - fromBarrier) / span));
    return h("span", { title: `${Math.round(done * 100)} %` },
      h("div", { class: "bar" }, h("span", { style: `width:${(done * 100).toFixed(1)}%` })),
      h("small", { class: "muted" }, m.lag_ms === 0 ? "caught up" : `${duration(m.lag_ms)} behind`));
  }

  function revisionList(revs) {
    if (!revs.length) return h("p", { class: "muted" }, "no revisions");
    return h("div", {}, revs.slice().reverse().map((r) => h("div", { class: "card", "data-revision": r.id },
      h("h3", {}, `Revision ${r.id} of ${r.table} `, h("span", { class: "badge state" }, r.state)),
      h("p", { class: "muted" }, `from barrier ${iso(r.from_barrier)} · created ${iso(r.created_ms)} · updated ${iso(r.updated_ms)}`),
      h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["table", "mirror", "revision job", "mirror frontier", "progress"].map((c) => h("th", {}, c)))),
        h("tbody", {}, r.tables.map((m) => h("tr", {}, h("td", {}, tableLink(m.table)), h("td", {}, m.mirror), h("td", {}, m.revision_job),
          h("td", {}, iso(m.frontier)), h("td", {}, progress(m, r.from_barrier)))))))));
  }

  async function renderRevisions() {
    const view = $("view-revisions");
    const revs = await optional(all("/revisions"));
    view.replaceChildren(h("h2", {}, "Revisions"), revs.ok ? revisionList(revs.ok) : failed(revs.error));
  }

  // -- routing and polling --------------------------------------------------------------------

  function route() {
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    const arg = parts.length > 1 ? decodeURIComponent(parts.slice(1).join("/")) : null;
    return { view: parts[0] || "graph", arg };
  }

  function show(view) {
    for (const v of ["graph", "tables", "table", "revisions"]) $(`view-${v}`).hidden = v !== view;
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === view);
  }

  /** Replace a view's content (null children skipped), keeping the scroll position of its
   * scrolled boxes. */
  function replaceView(view, ...children) {
    const kept = [...view.querySelectorAll(".scroll")].map((el) => el.scrollTop);
    view.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
    view.querySelectorAll(".scroll").forEach((el, i) => { if (kept[i]) el.scrollTop = kept[i]; });
  }

  /** The user is typing in a view's field: a refresh now would wipe what they typed. */
  function typingIn(viewId) {
    const el = document.activeElement;
    return el && el.tagName === "INPUT" && el.closest(`#${viewId}`) !== null;
  }

  async function render(polled) {
    const { view, arg } = route();
    if (polled && (typingIn("view-table") || typingIn("view-tables"))) return;
    if (view === "table") {
      show("table");
      if (tablePage.name !== arg) Object.assign(tablePage, { name: arg, lineageOf: null, consistentWith: null });
      await renderTablePage();
    } else if (view === "tables") {
      show("tables");
      renderTables();
    } else if (view === "revisions") {
      show("revisions");
      await renderRevisions();
    } else {
      show("graph");
      const focus = view === "focus" && arg ? { kind: "table", name: arg }
        : view === "focus-job" && arg ? { kind: "job", name: arg } : null;
      const changed = JSON.stringify(focus) !== JSON.stringify(state.focus);
      state.focus = focus;
      if (changed) {
        state.critical = null;
        state.selected = focus ? `${focus.kind}:${focus.name}` : null;
      }
      drawGraph();
      renderSide();
      if (changed && focus && focus.kind === "table") await selectNode(state.selected);
      else if (!changed && state.selected && state.selected.startsWith("table:")) {
        state.critical = await api("/delay", { table: state.selected.slice(6) }).catch(() => null);
        drawGraph();
        renderSide();
      }
    }
  }

  let busy = false;
  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      await loadTopology();
      $("error").hidden = true;
      await render(true);
      $("updated").textContent = `updated ${clock(state.updated)}`;
      document.body.dataset.loaded = "true";
    } catch (e) {
      $("error").hidden = false;
      $("error").textContent = `Cannot read the MetaService API: ${e.message}`;
    } finally {
      busy = false;
    }
  }

  function setup() {
    setupSearch();
    $("hops").addEventListener("change", () => { state.hops = $("hops").value; drawGraph(); });
    $("show-all").addEventListener("click", () => { location.hash = "#/"; });
    $("fit").addEventListener("click", fitGraph);
    $("token-button").addEventListener("click", () => askToken("Enter a bearer token for this MetaService (or forget the one kept)."));
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const token = $("token-input").value.trim();
      if (token) sessionStorage.setItem(TOKEN_KEY, token);
      $("token-input").value = "";
      $("token-bar").hidden = true;
      refresh();
    });
    $("token-clear").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      $("token-bar").hidden = true;
      refresh();
    });
    window.addEventListener("hashchange", () => render().catch((e) => { $("error").hidden = false; $("error").textContent = e.message; }));
    setInterval(() => { if ($("live").checked && !document.hidden) refresh(); }, POLL_MS);
    refresh();
  }

  // For tests and the curious: what the graph shows, and where a node is on the page.
  window.metaConsole = {
    state,
    drawnNodes: () => (cy ? cy.nodes().map((n) => n.id()) : []),
    criticalNodes: () => (cy ? cy.nodes(".critical").map((n) => n.id()) : []),
    nodePosition: (id) => {
      const n = cy && cy.getElementById(id);
      if (!n || n.empty()) return null;
      const box = $("cy").getBoundingClientRect();
      const p = n.renderedPosition();
      return { x: box.left + p.x, y: box.top + p.y };
    },
  };

  setup();
})();
