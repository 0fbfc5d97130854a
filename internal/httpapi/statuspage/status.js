// couchrep status page: polls /_status/data and renders it. Every string
// from the server is user data (document ids, URLs, error texts): it goes
// into the page through textContent only, never as markup.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const refreshMs = Math.max(500, 1000 * (parseFloat(params.get("refresh")) || 2));
  const states = ["running", "pending", "crashing", "completed", "failed"];
  let filter = params.get("state") || "all";
  let generation = 0;
  const jobRows = new Map(); // job id -> {tr, cells}

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function setText(e, text) {
    const s = text === undefined || text === null ? "" : String(text);
    if (e.textContent !== s) e.textContent = s;
  }
  function num(n) { return n === undefined || n === null ? "–" : Number(n).toLocaleString("en-US"); }
  function rate(r) { return !r ? "0" : r >= 100 ? Math.round(r).toLocaleString("en-US") : r.toFixed(1); }
  function age(s) {
    if (s === undefined || s === null) return "–";
    if (s < 60) return Math.round(s) + "s ago";
    if (s < 3600) return Math.round(s / 60) + "m ago";
    return Math.round(s / 3600) + "h ago";
  }
  // lag: time without progress while changes are pending (0: caught up).
  function lag(s) {
    if (!s) return "0";
    if (s < 60) return Math.round(s) + "s";
    if (s < 3600) return Math.round(s / 60) + "m";
    return (s / 3600).toFixed(1) + "h";
  }
  function stateBadge(state, text) { return el("span", "state state-" + state, text || state); }

  const SVG = "http://www.w3.org/2000/svg";
  function spark(values) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 90 18");
    svg.setAttribute("preserveAspectRatio", "none");
    if (values.length > 1) {
      const maxV = Math.max(1, ...values);
      const step = 90 / (values.length - 1);
      const pts = values.map((v, i) => (i * step).toFixed(1) + "," + (17 - (16 * v) / maxV).toFixed(1));
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", pts.join(" "));
      svg.appendChild(line);
    }
    return svg;
  }

  function renderHeader(d) {
    setText(document.getElementById("node"), "node " + d.node);
    const cl = document.getElementById("cluster");
    setText(cl, d.cluster_unstable ? "cluster unstable" : "cluster stable");
    cl.className = "pill " + (d.cluster_unstable ? "warn" : "ok");
    setText(document.getElementById("updated"), "updated " + new Date(d.now).toLocaleTimeString());
    const sum = document.getElementById("summary");
    sum.replaceChildren(...states.flatMap((st) => {
      const s = el("span", "state-" + st, (d.counts[st] || 0) + " " + st);
      s.dataset.state = st;
      if (st !== "running") return [s];
      // Parked jobs are running ones whose feed is closed until their source changes.
      const p = el("span", "state-parked", "(" + (d.counts.parked || 0) + " parked)");
      p.dataset.state = "parked";
      return [s, p];
    }));
    const probs = document.getElementById("problems");
    probs.hidden = d.errors.length === 0;
    setText(probs, d.errors.join("; "));
  }

  function renderNodes(nodes) {
    const body = document.querySelector("#nodes tbody");
    body.replaceChildren(...nodes.map((n) => {
      const tr = el("tr");
      tr.dataset.node = n.name;
      tr.append(el("td", "mono", n.name), el("td", "", (n.types || []).join(", ")),
        el("td", n.alive ? "ok" : "bad", n.alive ? "alive" : "down"),
        el("td", "drain " + (n.draining ? "warn" : ""), n.draining ? "draining" : "accepting"),
        el("td", "num", n.running_jobs), el("td", "num", age(n.heartbeat_age_s)), el("td", "mono", n.http));
      return tr;
    }));
  }

  function renderFilters(d) {
    const box = document.getElementById("filters");
    box.replaceChildren(...["all"].concat(states).map((st) => {
      const n = st === "all" ? d.jobs.length : d.counts[st] || 0;
      const b = el("button", "", st + " (" + n + ")");
      b.type = "button";
      b.setAttribute("aria-pressed", String(filter === st));
      b.addEventListener("click", () => { filter = st; renderFilters(lastData || d); applyFilter(); });
      return b;
    }));
  }
  function applyFilter() {
    for (const r of jobRows.values()) r.tr.hidden = filter !== "all" && r.state !== filter;
  }

  function jobRow(j) {
    const tr = el("tr");
    tr.dataset.jobId = j.id;
    const c = {};
    for (const k of ["state", "id", "doc", "ends", "node", "read", "written", "pending", "lag", "rate", "spark", "refused", "errors", "error"]) c[k] = el("td");
    c.id.className = c.node.className = "mono";
    c.doc.className = "doc";
    c.ends.className = "url";
    for (const k of ["read", "written", "pending", "lag", "rate", "refused", "errors"]) c[k].className = "num";
    c.error.className = "err";
    tr.append(c.state, c.id, c.doc, c.ends, c.node, c.read, c.written, c.pending, c.lag, c.rate, c.spark, c.refused, c.errors, c.error);
    return { tr, cells: c, state: "", shown: "", spark: "" };
  }
  function renderJobs(jobs) {
    const body = document.querySelector("#jobs tbody");
    const seen = new Set();
    let prev = null;
    for (const j of jobs) {
      seen.add(j.id);
      let r = jobRows.get(j.id);
      if (!r) { r = jobRow(j); jobRows.set(j.id, r); }
      const c = r.cells;
      const shown = j.paused ? j.state + ", paused" : j.parked ? "running, parked" : j.state;
      if (r.shown !== shown) { c.state.replaceChildren(stateBadge(j.state, shown)); r.shown = shown; }
      if (r.state !== j.state) { r.state = j.state; r.tr.dataset.state = j.state; }
      setText(c.id, j.short_id); // couchrepctl job show accepts it; "+continuous" and the like stay whole
      c.id.title = j.rep_id ? "job " + j.id + "\nreplication " + j.rep_id : "job " + j.id;
      setText(c.doc, j.kind === "transient" ? "(transient)" : (j.server ? j.server + " " : "") + j.database + " / " + j.doc_id);
      setText(c.ends, j.source + " → " + j.target + (j.continuous ? " (continuous)" : ""));
      setText(c.node, j.node);
      setText(c.read, num(j.docs_read));
      setText(c.written, num(j.docs_written));
      setText(c.pending, j.changes_pending === null || j.changes_pending === undefined ? "–" : num(j.changes_pending));
      setText(c.lag, lag(j.lag_seconds));
      setText(c.rate, rate(j.docs_per_s));
      // Documents the target refused: the count, the last few in the tooltip.
      setText(c.refused, num(j.doc_write_failures));
      c.refused.title = (j.recent_failures || []).map((f) => f.id + " " + f.rev + ": " + f.status + " " + f.error + ": " + f.reason).join("\n");
      c.refused.classList.toggle("warn", j.doc_write_failures > 0);
      const sk = j.spark.join(",");
      if (sk !== r.spark) { c.spark.replaceChildren(spark(j.spark)); r.spark = sk; }
      setText(c.errors, j.error_count);
      setText(c.error, j.last_error);
      const want = prev ? prev.nextSibling : body.firstChild;
      if (want !== r.tr) body.insertBefore(r.tr, want);
      prev = r.tr;
    }
    for (const [id, r] of jobRows) if (!seen.has(id)) { r.tr.remove(); jobRows.delete(id); }
    applyFilter();
    setText(document.getElementById("jobcount"), jobs.length + " in the store");
  }

  function renderShares(shares) {
    const body = document.querySelector("#shares tbody");
    body.replaceChildren(...shares.map((s) => {
      const tr = el("tr");
      tr.dataset.database = s.database;
      const bar = el("div", "bar");
      const use = el("div", "use");
      use.style.width = (100 * s.usage).toFixed(1) + "%";
      const ent = el("div", "ent");
      ent.style.left = (100 * s.entitled).toFixed(1) + "%";
      bar.append(use, ent);
      bar.title = "running " + Math.round(100 * s.usage) + "% of the persistent jobs, entitled to " + Math.round(100 * s.entitled) + "%";
      const cell = el("td");
      cell.append(bar);
      tr.append(el("td", "mono", s.database), el("td", "url", (s.servers || []).join(", ")), el("td", "num", s.weight), el("td", "num", s.running), el("td", "num", s.waiting), cell);
      return tr;
    }));
  }

  function renderTree(root) {
    const rows = [];
    function walk(n, prefix, last, depth) {
      const tr = el("tr");
      tr.dataset.actor = n.name;
      tr.append(el("td", "mono", depth === 0 ? n.name : prefix + (last ? "└─ " : "├─ ") + n.name), el("td", "", n.kind),
        el("td", n.state === "running" ? "ok" : "warn", n.state), el("td", "num" + (n.restarts ? " warn" : ""), n.restarts),
        el("td", "num", n.incarnation));
      rows.push(tr);
      const kids = n.children || [];
      const next = depth === 0 ? "" : prefix + (last ? "   " : "│  ");
      kids.forEach((k, i) => walk(k, next, i === kids.length - 1, depth + 1));
    }
    if (root) walk(root, "", true, 0);
    document.querySelector("#tree tbody").replaceChildren(...rows);
  }

  let lastData = null;
  async function poll() {
    try {
      const resp = await fetch("/_status/data", { credentials: "same-origin", cache: "no-store" });
      if (!resp.ok) throw new Error("the node answered " + resp.status);
      const d = await resp.json();
      const t0 = performance.now();
      renderHeader(d);
      renderNodes(d.nodes);
      renderJobs(d.jobs);
      if (!lastData || lastData.jobs.length !== d.jobs.length || states.some((s) => lastData.counts[s] !== d.counts[s])) renderFilters(d);
      renderShares(d.shares);
      renderTree(d.tree);
      lastData = d;
      generation++;
      document.body.dataset.generation = String(generation);
      document.body.dataset.renderMs = (performance.now() - t0).toFixed(1);
      if (generation === 1) document.body.dataset.firstRenderMs = performance.now().toFixed(1);
    } catch (e) {
      const probs = document.getElementById("problems");
      probs.hidden = false;
      setText(probs, "cannot read the node's status: " + e.message);
    } finally {
      setTimeout(poll, refreshMs);
    }
  }
  poll();
})();
