// The Pollux dashboard: a small hash-routed page over the scheduler's JSON API (/api/v1/).
//
//   #/            the cluster: GPUs per node and per job, utilisation over time
//   #/jobs        jobs, newest first, filtered by state, name prefix and owner
//   #/jobs/<id>   one job: its timeline plotted (GPUs, batch size, throughput, efficiency,
//                 goodput, progress against the model's prediction, restarts marked), its
//                 explain record and its history
//
// Read-only. Every value from the API is put into the page as text (never as HTML), and the
// page has no inline script or style, so its Content-Security-Policy is default-src 'self'.
// With TLS on, the API wants the person's API token: it is asked for when the API answers
// 401 and kept in this tab's sessionStorage, or taken once from the address (#token=...,
// optionally &next=/jobs/<id>) and then removed from it.
"use strict";

// "1 node", "2 nodes": counts read by people get the right number.
function plural(n, noun) {
  return n + " " + noun + (n === 1 ? "" : "s");
}

(function () {
  const TOKEN_KEY = "pollux-dashboard-token";
  const REFRESH_MS = 10000;
  const COLORS = ["#2463b4", "#2b8a3e", "#ae3ec9", "#c77c02", "#0c8599", "#e64980",
    "#5f3dc4", "#868e96", "#74b816", "#1098ad"];
  const RESTART = "#d9480f";
  const STATES = ["PENDING", "ALLOCATED", "RUNNING", "RESCALING", "SUCCEEDED", "FAILED",
    "CANCELLED"];
  const ACTIVE = "PENDING,ALLOCATED,RUNNING,RESCALING";

  let charts = [];
  let refreshTimer = null;
  let renderCount = 0;

  // -- the token ---------------------------------------------------------------------------

  function takeTokenFromAddress() {
    const hash = location.hash || "";
    if (!hash.startsWith("#token=")) return;
    const params = new URLSearchParams(hash.slice(1));
    const token = (params.get("token") || "").trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    let next = params.get("next") || "/";
    if (!next.startsWith("/")) next = "/";
    // Out of the address bar and the history: the token must not be bookmarked or shared.
    history.replaceState(null, "", location.pathname + location.search + "#" + next);
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  // -- the API -----------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path) {
    const headers = { Accept: "application/json" };
    if (token()) headers.Authorization = "Bearer " + token();
    let response;
    try {
      response = await fetch("/api/v1/" + path, { headers, cache: "no-store", credentials: "omit" });
    } catch (error) {
      throw new ApiError(0, "the scheduler did not answer (" + error.message + ")");
    }
    let body = null;
    try {
      body = await response.json();
    } catch (error) {
      body = null;
    }
    if (!response.ok) {
      throw new ApiError(response.status, (body && body.error) || response.statusText);
    }
    return body;
  }

  // -- DOM helpers (text only) -------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") el.className = value;
      else if (name === "text") el.textContent = value;
      else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function jobLink(id, text) {
    return h("a", { href: "#/jobs/" + encodeURIComponent(id), class: "mono" }, text || id);
  }

  function stateBadge(state) {
    const name = String(state || "").replace(/^JOB_STATE_/, "");
    return h("span", { class: "state " + name }, name || "?");
  }

  function kv(pairs) {
    const dl = h("dl", { class: "kv" });
    for (const [key, value] of pairs) {
      if (value === null || value === undefined || value === "") continue;
      dl.append(h("dt", {}, key), h("dd", {}, value));
    }
    return dl;
  }

  function table(columns, rows, empty) {
    if (!rows.length) return h("p", { class: "muted" }, empty || "None.");
    const head = h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : null }, c.title)));
    const body = rows.map((row) =>
      h("tr", {}, columns.map((c) => h("td", { class: c.num ? "num" : null }, c.cell(row)))));
    return h("table", { class: "data" }, h("thead", {}, head), h("tbody", {}, body));
  }

  function card(title, ...children) {
    return h("section", { class: "card" }, title ? h("h2", {}, title) : null, ...children);
  }

  function stat(value, label) {
    return h("div", { class: "stat" }, h("div", { class: "value" }, value), h("div", { class: "label" }, label));
  }

  function bar(fraction) {
    const inner = h("span");
    inner.style.width = Math.max(0, Math.min(1, fraction || 0)) * 100 + "%";
    return h("div", { class: "bar", title: Math.round((fraction || 0) * 100) + " %" }, inner);
  }

  // -- formatting --------------------------------------------------------------------------

  function pad(n) {
    return String(n).padStart(2, "0");
  }

  function fmtTime(value) {
    if (!value) return "";
    const d = typeof value === "number" ? new Date(value * 1000) : new Date(value);
    if (isNaN(d.getTime()) || d.getTime() <= 0) return "";
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function fmtClock(seconds) {
    const d = new Date(seconds * 1000);
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function fmtNum(x, digits) {
    if (x === null || x === undefined || x === "" || !isFinite(Number(x))) return "";
    const n = Number(x);
    if (digits === undefined) digits = Math.abs(n) >= 100 ? 0 : Math.abs(n) >= 10 ? 1 : 3;
    return n.toLocaleString(undefined, { maximumFractionDigits: digits });
  }

  function stateName(state) {
    return String(state || "").replace(/^JOB_STATE_/, "");
  }

  // -- charts ------------------------------------------------------------------------------

  // Vertical dashed lines (with their generation) where the job restarted.
  function restartMarkers(restarts) {
    return {
      hooks: {
        draw: [(u) => {
          if (!restarts.length) return;
          const ratio = window.devicePixelRatio || 1;
          const ctx = u.ctx;
          const { left, top, width, height } = u.bbox;
          ctx.save();
          ctx.strokeStyle = RESTART;
          ctx.fillStyle = RESTART;
          ctx.lineWidth = 2 * ratio;
          ctx.setLineDash([6 * ratio, 4 * ratio]);
          ctx.font = 11 * ratio + "px sans-serif";
          ctx.textAlign = "left"; // uPlot leaves its axes' alignment on the context
          ctx.textBaseline = "alphabetic";
          let labelEnd = -Infinity;
          let row = 0;
          for (const r of restarts) {
            const x = Math.round(u.valToPos(r.time_s, "x", true));
            if (x < left || x > left + width) continue;
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, top + height);
            ctx.stroke();
            // Labels of close restarts go one under the other instead of over each other.
            const label = "gen " + r.generation;
            row = x + 4 * ratio < labelEnd ? (row + 1) % 4 : 0;
            ctx.fillText(label, x + 4 * ratio, top + (12 + 13 * row) * ratio);
            labelEnd = Math.max(labelEnd, x + 8 * ratio + ctx.measureText(label).width);
          }
          ctx.restore();
        }],
      },
    };
  }

  // A chart to draw once its element is in the page (uPlot needs its width).
  function chartCard(title, note, build) {
    const target = h("div", { class: "chart" });
    const section = h("section", { class: "card" },
      h("div", { class: "chart-title" }, h("h3", {}, title), h("span", { class: "chart-note" }, note || "")),
      target);
    section.draw = () => {
      const made = build(Math.max(320, target.clientWidth || 600));
      if (!made) {
        target.append(h("p", { class: "muted" }, "Nothing to plot yet."));
        return;
      }
      const chart = new uPlot(made.opts, made.data, target);
      chart.height = made.opts.height;
      chart.target = target;
      charts.push(chart);
      if (made.restarts) section.setAttribute("data-restarts", String(made.restarts));
    };
    return section;
  }

  // Axis ticks at whole numbers only (GPUs, jobs).
  const COUNT_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000];

  function series(label, color, extra) {
    return Object.assign({ label, stroke: color, width: 2, spanGaps: false }, extra || {});
  }

  function stepped() {
    return uPlot.paths && uPlot.paths.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined;
  }

  function baseOptions(width, height, seriesList, axes, restarts, scales) {
    return {
      width,
      height: height || 230,
      series: [{ label: "time", value: (u, v) => (v === null ? "" : fmtTime(v)) }, ...seriesList],
      // Time labels at least 110 px apart, so that they never run into each other.
      axes: [Object.assign({ space: 110 }, axes[0] || {}), ...axes.slice(1)],
      scales: Object.assign({ x: { time: true } }, scales || {}),
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      plugins: [restartMarkers(restarts || [])],
    };
  }

  function resizeCharts() {
    for (const chart of charts) {
      const width = Math.max(320, chart.target.clientWidth || 600);
      chart.setSize({ width, height: chart.height });
    }
  }

  function destroyCharts() {
    for (const chart of charts) chart.destroy();
    charts = [];
  }

  // -- pages -------------------------------------------------------------------------------

  async function clusterPage() {
    const [cluster, util, holding] = await Promise.all([
      api("cluster"),
      api("utilisation"),
      api("jobs?state=" + "ALLOCATED,RUNNING,RESCALING" + "&limit=1000").catch(() => ({ jobs: [] })),
    ]);
    const names = {};
    for (const job of holding.jobs || []) names[job.id] = job;
    const total = cluster.total_gpus || 0;
    const allocated = cluster.allocated_gpus || 0;
    const byState = cluster.jobs_by_state || {};
    const page = [h("h1", {}, "Cluster")];
    const stats = h("div", { class: "stats" },
      stat(allocated + " / " + total, "GPUs allocated" + (total ? " (" + Math.round(100 * allocated / total) + " %)" : "")),
      stat(String((cluster.nodes || []).length), "nodes"),
      stat(String((cluster.agents || []).length), "agents"),
      stat(String(byState.RUNNING || 0), "jobs running"),
      stat(String(byState.PENDING || 0), "jobs pending"),
      stat(cluster.leader_id || "none", "leader"),
      stat(String(cluster.last_round || 0), "last round"));
    page.push(stats);
    if ((cluster.warnings || []).length) {
      page.push(h("section", { class: "card warnings" }, h("h2", {}, "Warnings"),
        h("ul", {}, cluster.warnings.map((w) => h("li", {}, w)))));
    }
    const times = util.times || [];
    const grid = h("div", { class: "grid" });
    grid.append(chartCard("GPUs allocated", "every " + fmtNum(util.interval_s) + " s, this replica", (width) => {
      if (!times.length) return null;
      return {
        opts: baseOptions(width, 240, [
          series("allocated GPUs", COLORS[0], { fill: "rgba(36,99,180,0.15)", paths: stepped() }),
          series("total GPUs", "#1d2430", { dash: [4, 3], paths: stepped() }),
        ], [{}, { label: "GPUs", incrs: COUNT_INCRS }], [],
        { y: { range: (u, min, max) => [0, Math.max(1, max)] } }),
        data: [times, util.allocated_gpus, util.total_gpus],
      };
    }));
    grid.append(chartCard("Jobs running and pending", "", (width) => {
      if (!times.length) return null;
      return {
        opts: baseOptions(width, 240, [
          series("running jobs", COLORS[1], { paths: stepped() }),
          series("pending jobs", COLORS[3], { paths: stepped() }),
        ], [{}, { label: "jobs", incrs: COUNT_INCRS }], [],
        { y: { range: (u, min, max) => [0, Math.max(1, max)] } }),
        data: [times, util.running_jobs, util.pending_jobs],
      };
    }));
    grid.append(chartCard("Allocated GPUs per node", util.nodes_truncated ? "first nodes by name" : "", (width) => {
      if (!times.length || !(util.nodes || []).length) return null;
      return {
        opts: baseOptions(width, 240,
          util.nodes.map((n, i) => series(n.name, COLORS[i % COLORS.length], { paths: stepped() })),
          [{}, { label: "GPUs", incrs: COUNT_INCRS }], [], { y: { range: (u, min, max) => [0, Math.max(1, max)] } }),
        data: [times, ...util.nodes.map((n) => n.allocated)],
      };
    }));
    page.push(grid);

    const nodes = cluster.nodes || [];
    page.push(card("Nodes", table([
      { title: "node", cell: (n) => h("span", { class: "mono" }, n.node.name) },
      { title: "GPUs", num: true, cell: (n) => String(n.node.gpus) },
      { title: "allocated", num: true, cell: (n) => String(n.allocated_gpus) },
      { title: "", cell: (n) => bar(n.node.gpus ? n.allocated_gpus / n.node.gpus : 0) },
      { title: "jobs (GPUs)", cell: (n) => jobsOnNode(n.jobs || [], names) },
      { title: "type", cell: (n) => n.node.gpu_type || "" },
      { title: "address", cell: (n) => h("span", { class: "mono" }, n.node.address) },
    ], nodes, "No node has registered.")));

    const perJob = Object.entries(cluster.job_gpus || {});
    page.push(card("GPUs per job", table([
      { title: "job", cell: ([id]) => jobLink(id) },
      { title: "name", cell: ([id]) => (names[id] ? names[id].spec.name : "") },
      { title: "owner", cell: ([id]) => (names[id] ? names[id].owner : "") },
      { title: "state", cell: ([id]) => (names[id] ? stateBadge(names[id].state) : "") },
      { title: "GPUs", num: true, cell: ([, gpus]) => String(gpus) },
      { title: "share", cell: ([, gpus]) => bar(total ? gpus / total : 0) },
    ], perJob, "No job holds GPUs.")));
    page.push(h("p", { class: "muted" }, "Answered by replica " + (cluster.answered_by || "?") + "."));
    return page;
  }

  // The jobs on a node by name (the id where the name is not known), with their GPUs there.
  function jobsOnNode(ids, names) {
    const counts = new Map();
    for (const id of ids) counts.set(id, (counts.get(id) || 0) + 1);
    const out = h("span");
    for (const [id, n] of counts) {
      if (!id) {  // held by jobs you may not see: the server names none of them
        out.append("other users' ×" + n + "  ");
        continue;
      }
      const job = names[id];
      out.append(jobLink(id, job ? job.spec.name : id), " ×" + n + "  ");
    }
    return out;
  }

  // Control characters of a job's output shown as text (\x1b), never acted on.
  function visible(line) {
    return String(line).replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g,
      (c) => {
        const code = c.charCodeAt(0);
        return code < 0x100 ? "\\x" + code.toString(16).padStart(2, "0") : "\\u" + code.toString(16).padStart(4, "0");
      });
  }

  function logsCard(logs) {
    const where = logs.generation ? "rank " + logs.rank + ", generation " + logs.generation : "rank " + logs.rank;
    const body = logs.lines.length
      ? h("pre", { class: "log", id: "log" }, logs.lines.map(visible).join("\n"))
      : h("p", { class: "muted", id: "log" }, logs.note || "The log is empty so far.");
    return h("section", { class: "card" },
      h("div", { class: "chart-title" }, h("h2", {}, "Log"),
        h("span", { class: "chart-note" }, where + " · last " + logs.lines.length + " lines · pollux-cli logs -f " + logs.job_id)),
      body);
  }

  async function jobsPage(query) {
    const params = new URLSearchParams();
    for (const key of ["state", "name_prefix", "owner", "limit", "page_token"]) {
      const value = query.get(key);
      if (value) params.set(key, value);
    }
    const answer = await api("jobs" + (params.toString() ? "?" + params.toString() : ""));
    const jobs = answer.jobs || [];
    const stateSelect = h("select", { name: "state" },
      h("option", { value: "" }, "any"),
      h("option", { value: ACTIVE }, "active"),
      STATES.map((s) => h("option", { value: s }, s.toLowerCase())));
    stateSelect.value = query.get("state") || "";
    const nameInput = h("input", { name: "name_prefix", placeholder: "prefix", value: query.get("name_prefix") || "" });
    const ownerInput = h("input", { name: "owner", placeholder: "user", value: query.get("owner") || "" });
    const form = h("form", {
      class: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        const next = new URLSearchParams();
        if (stateSelect.value) next.set("state", stateSelect.value);
        if (nameInput.value.trim()) next.set("name_prefix", nameInput.value.trim());
        if (ownerInput.value.trim()) next.set("owner", ownerInput.value.trim());
        location.hash = "#/jobs" + (next.toString() ? "?" + next.toString() : "");
      },
    },
    h("label", {}, "state", stateSelect),
    h("label", {}, "name", nameInput),
    h("label", {}, "owner", ownerInput),
    h("button", { type: "submit" }, "Filter"));
    const rows = table([
      { title: "job", cell: (j) => jobLink(j.id) },
      { title: "name", cell: (j) => j.spec.name },
      { title: "owner", cell: (j) => j.owner },
      { title: "tenant", cell: (j) => j.tenant },
      { title: "state", cell: (j) => stateBadge(j.state) },
      { title: "GPUs", num: true, cell: (j) => String(((j.allocation || {}).nodes || []).length) },
      { title: "restarts", num: true, cell: (j) => String(j.restarts || 0) },
      { title: "submitted", cell: (j) => fmtTime(j.create_time) },
      { title: "expected end", cell: (j) => fmtTime(j.estimated_completion) },
    ], jobs, "No job matches.");
    const pager = h("div", { class: "pager" });
    if (query.get("page_token")) {
      const first = new URLSearchParams(params);
      first.delete("page_token");
      pager.append(h("a", { href: "#/jobs" + (first.toString() ? "?" + first.toString() : "") }, "« newest"));
    }
    if (answer.next_page_token) {
      const next = new URLSearchParams(params);
      next.set("page_token", answer.next_page_token);
      pager.append(h("a", { href: "#/jobs?" + next.toString() }, "older »"));
    }
    return [h("h1", {}, "Jobs"), card(null, form, rows, pager)];
  }

  async function jobPage(id) {
    const ref = encodeURIComponent(id);
    const [answer, timeline, explain, logs] = await Promise.all([
      api("jobs/" + ref),
      api("jobs/" + ref + "/timeline"),
      api("jobs/" + ref + "/explain").catch((error) => ({ error: error.message })),
      api("jobs/" + ref + "/logs").catch((error) => ({ job_id: id, rank: 0, generation: 0, lines: [], note: error.message })),
    ]);
    const job = answer.job;
    const alloc = job.allocation || {};
    const gpus = (alloc.nodes || []).length;
    const page = [h("h1", {}, job.spec.name + " ", h("span", { class: "muted mono" }, job.id), " ", stateBadge(job.state))];
    page.push(h("div", { class: "stats" },
      stat(String(gpus), (gpus === 1 ? "GPU" : "GPUs") + " on " + plural(new Set(alloc.nodes || []).size, "node")),
      stat(String(job.restarts || 0), job.restarts === 1 ? "restart" : "restarts"),
      stat(String(alloc.generation || 0), "generation"),
      stat(job.owner || "-", "owner" + (job.tenant ? " (tenant " + job.tenant + ")" : "")),
      stat(fmtTime(job.create_time) || "-", "submitted"),
      stat(fmtTime(job.estimated_completion) || "-", "expected end")));

    const points = (timeline.timeline || {}).points || [];
    const times = timeline.times || [];
    const restarts = timeline.restarts || [];
    page.push(card("Restarts (allocation generation changes)",
      restarts.length
        ? h("ul", { class: "restarts", id: "restarts" }, restarts.map((r) =>
          h("li", { "data-generation": r.generation },
            h("span", { class: "restart-swatch" }),
            "generation " + r.from_generation + " → " + r.generation + " at " + fmtTime(r.time_s) +
            ": " + r.gpus_before + " → " + r.gpus_after + " GPUs, batch " + r.batch_before + " → " + r.batch_after)))
        : h("p", { class: "muted", id: "restarts" }, points.length
          ? "None while the timeline was recorded (generation " + points[0].generation + ")."
          : "No timeline yet: the job's agent records a point from its rank-0 reports.")));

    const grid = h("div", { class: "grid", id: "timeline" });
    const col = (name) => points.map((p) => (p[name] === undefined ? null : Number(p[name])));
    const logged = (name) => points.map((p) => {
      const value = (p.user_metrics || {})[name];
      return value === undefined ? null : Number(value);
    });
    const noPoints = () => !points.length;
    grid.append(chartCard("GPUs and batch size", "", (width) => noPoints() ? null : {
      opts: baseOptions(width, 230, [
        series("GPUs", COLORS[0], { paths: stepped(), fill: "rgba(36,99,180,0.12)" }),
        series("batch size", COLORS[2], { scale: "batch", paths: stepped() }),
      ], [{}, { label: "GPUs", incrs: COUNT_INCRS },
        { side: 1, scale: "batch", label: "batch size", size: 60, grid: { show: false } }],
      restarts, { y: { range: (u, min, max) => [0, Math.max(1, max)] }, batch: { range: (u, min, max) => [0, Math.max(1, max) * 1.1] } }),
      data: [times, col("gpus"), col("batch_size")],
      restarts: restarts.length,
    }));
    grid.append(chartCard("Throughput and goodput", "samples/s; goodput in M0-equivalent samples/s", (width) => noPoints() ? null : {
      opts: baseOptions(width, 230, [
        series("throughput", COLORS[4]),
        series("goodput", COLORS[0]),
        series("predicted goodput", COLORS[3], { dash: [6, 4] }),
      ], [{}, { label: "samples/s", size: 60 }], restarts, { y: { range: (u, min, max) => [0, Math.max(1, max) * 1.05] } }),
      data: [times, col("throughput"), col("goodput"), points.map((p) => (p.predicted_goodput > 0 ? p.predicted_goodput : null))],
      restarts: restarts.length,
    }));
    grid.append(chartCard("Statistical efficiency", "progress per sample relative to batch size M0 = " + timeline.m0, (width) => noPoints() ? null : {
      opts: baseOptions(width, 230, [series("efficiency", COLORS[1])], [{}, { label: "efficiency" }],
        restarts, { y: { range: [0, 1.05] } }),
      data: [times, col("efficiency")],
      restarts: restarts.length,
    }));
    const completion = timeline.completion;
    const progressNote = completion ? "expected end " + fmtTime(completion.time_s) : "M0-steps";
    grid.append(chartCard("Progress: actual and predicted", progressNote, (width) => {
      if (noPoints()) return null;
      const xs = times.slice();
      const actual = col("progress");
      const predicted = (timeline.predicted_progress || []).slice();
      const forecast = times.map(() => null);
      const span = times[times.length - 1] - times[0];
      let forecastShown = false;
      // Drawn when it is near enough not to squash the recorded part (else the note says it).
      if (completion && completion.progress !== null && completion.time_s > times[times.length - 1] &&
        completion.time_s - times[times.length - 1] <= span) {
        forecast[forecast.length - 1] = actual[actual.length - 1];
        xs.push(completion.time_s);
        actual.push(null);
        predicted.push(null);
        forecast.push(completion.progress);
        forecastShown = true;
      }
      const lines = [
        series("progress", COLORS[0]),
        series("predicted from each generation's start", COLORS[3], { dash: [6, 4] }),
      ];
      const data = [xs, actual, predicted];
      if (forecastShown) {
        lines.push(series("forecast to the expected end", COLORS[7], { dash: [2, 4], points: { show: true } }));
        data.push(forecast);
      }
      return {
        opts: baseOptions(width, 230, lines, [{}, { label: "M0-steps", size: 60 }], restarts,
          { y: { range: (u, min, max) => [0, Math.max(1, max) * 1.05] } }),
        data,
        restarts: restarts.length,
      };
    }));
    // The values the job logged (trainer.log), one chart each: they have their own scales.
    for (const [i, name] of (timeline.metric_names || []).slice(0, 8).entries()) {
      grid.append(chartCard(name, "logged by the job", (width) => noPoints() ? null : {
        opts: baseOptions(width, 230, [series(name, COLORS[(i + 5) % COLORS.length], { spanGaps: true })],
          [{}, { label: name, size: 60 }], restarts),
        data: [times, logged(name)],
        restarts: restarts.length,
      }));
    }
    if (points.length) {
      page.push(grid);
    } else {
      // One line, not a "nothing to plot" per chart.
      const ended = ["SUCCEEDED", "FAILED", "CANCELLED"].includes(String(job.state).replace(/^JOB_STATE_/, ""));
      page.push(card("Timeline", h("p", { class: "muted", id: "timeline" }, ended
        ? "Nothing was recorded: the job ended before its first report to its agent (a job that does not use pollux.train never reports). Its history and log below say what happened."
        : "Nothing to plot yet: the first point comes with the job's first report to its agent.")));
    }
    page.push(logsCard(logs));
    page.push(explainCard(explain, gpus));
    page.push(card("Spec", kv([
      ["command", h("code", {}, (job.spec.command || []).join(" "))],
      ["working dir", job.spec.working_dir],
      ["image", job.spec.image],
      ["initial batch size (M0)", String(job.spec.batch.initial_batch_size)],
      ["max batch size", String(job.spec.batch.max_batch_size)],
      ["local batch size", job.spec.batch.min_local_batch_size + " – " + job.spec.batch.max_local_batch_size],
      ["max replicas", String(job.spec.max_replicas || "no limit")],
      ["scaling rule", String(job.spec.scaling_rule || "").replace(/^SCALING_RULE_/, "").toLowerCase()],
      ["labels", Object.entries(job.spec.labels || {}).map(([k, v]) => k + "=" + v).join(", ")],
    ])));
    page.push(card("History", table([
      { title: "time", cell: (t) => fmtTime(t.time) },
      { title: "state", cell: (t) => stateBadge(t.state) },
      { title: "reason", cell: (t) => t.reason },
    ], job.history || [], "No transitions.")));
    return page;
  }

  function explainCard(explain, gpus) {
    if (explain.error) return card("Explain", h("p", { class: "error" }, explain.error));
    const parts = [];
    const d = explain.decision;
    const r = explain.round;
    if (d || r) {
      parts.push(h("h3", {}, "Last decision"), kv([
        ["reason", d && d.reason],
        ["speedup", d && fmtNum(d.speedup)],
        ["restart penalty", d && fmtNum(d.restart_penalty)],
        ["changed", d ? (d.changed ? "yes" : "no") : ""],
        ["round", r && r.round + " at " + fmtTime(r.time) + " by " + r.scheduler_id + " (" + r.policy + ")"],
        ["objective", r && fmtNum(r.objective)],
      ]));
    }
    if (explain.last_change) {
      const c = explain.last_change;
      parts.push(h("h3", {}, "Last GPU change"), kv([
        ["when", fmtTime(c.time)], ["state", stateName(c.state)], ["why", c.reason]]));
    }
    if (explain.batch) {
      const b = explain.batch;
      parts.push(h("h3", {}, "Agent's batch configuration"), kv([
        ["total batch", String(b.total_batch_size)],
        ["per GPU × accumulation", b.local_batch_size + " × " + b.accum_steps],
        ["predicted speedup", fmtNum(b.predicted_speedup)]]));
    }
    if (explain.batch_choice) {
      const b = explain.batch_choice;
      parts.push(h("h3", {}, "Model's batch choice"), kv([
        ["batch size", b.batch_size + " (" + b.local_batch_size + " per GPU, " +
          (b.accum_steps ? plural(b.accum_steps, "extra accumulation step") : "no accumulation") + ")"],
        ["throughput × efficiency = goodput", fmtNum(b.throughput) + " × " + fmtNum(b.efficiency, 3) + " = " + fmtNum(b.goodput) + " samples/s"]]));
    }
    if ((explain.alternatives || []).length) {
      parts.push(h("h3", {}, "One GPU fewer, as now, one more"), table([
        { title: "GPUs", num: true, cell: (a) => String(a.gpus) + (a.gpus === gpus ? " (now)" : "") },
        { title: "nodes", num: true, cell: (a) => String(a.nodes) },
        { title: "speedup", num: true, cell: (a) => fmtNum(a.speedup) },
        { title: "goodput", num: true, cell: (a) => fmtNum(a.goodput) },
      ], explain.alternatives));
    }
    if ((explain.holders || []).length) {
      parts.push(h("h3", {}, "Where a GPU would come from"), table([
        { title: "job", cell: (x) => jobLink(x.job_id, x.name ? x.name + " (" + x.job_id + ")" : x.job_id) },
        { title: "GPUs", num: true, cell: (x) => String(x.gpus) },
        { title: "speedup", num: true, cell: (x) => fmtNum(x.speedup) },
        { title: "without one", num: true, cell: (x) => fmtNum(x.speedup_without_one) },
      ], explain.holders));
    }
    if (explain.queue_position) {
      parts.push(kv([["queue", "position " + explain.queue_position + " of " + explain.pending_jobs + " pending"]]));
    }
    if (explain.model) {
      const m = explain.model;
      const work = m.work || {};
      parts.push(h("h3", {}, "Model"), kv([
        ["observations", String(m.observations)],
        ["updated", fmtTime(m.update_time) + (m.agent_id ? " by " + m.agent_id : "")],
        ["gradient noise", "sqr " + fmtNum(m.grad_sqr) + ", var " + fmtNum(m.grad_var)],
        ["progress", fmtNum(work.progress) + (work.remaining !== undefined ? " of " + fmtNum(work.progress + work.remaining) + " M0-steps" : " M0-steps")],
        ["throughput parameters", Object.entries(m.throughput || {})
          .map(([k, v]) => k + "=" + (typeof v === "number" ? fmtNum(v, 4) : String(v).replace(/^SYNC_MODEL_/, "").toLowerCase()))
          .join(", ")],
      ]));
    }
    if (!parts.length) parts.push(h("p", { class: "muted" }, "No scheduling decision includes this job yet."));
    return card("Explain", ...parts);
  }

  // -- routing and refresh -----------------------------------------------------------------

  function parseRoute() {
    const hash = (location.hash || "#/").slice(1) || "/";
    const [path, search] = hash.split("?", 2);
    const query = new URLSearchParams(search || "");
    const parts = path.split("/").filter(Boolean);
    if (parts[0] === "jobs" && parts.length >= 2) {
      return { page: "job", id: decodeURIComponent(parts.slice(1).join("/")), query };
    }
    if (parts[0] === "jobs") return { page: "jobs", query };
    return { page: "cluster", query };
  }

  function showLogin(message) {
    document.getElementById("login").hidden = false;
    document.getElementById("login-error").textContent = message || "";
    document.getElementById("token-input").focus();
  }

  async function render() {
    clearTimeout(refreshTimer);
    const mine = ++renderCount;
    const route = parseRoute();
    document.getElementById("nav-cluster").classList.toggle("active", route.page === "cluster");
    document.getElementById("nav-jobs").classList.toggle("active", route.page !== "cluster");
    document.getElementById("forget-token").hidden = !token();
    let content;
    try {
      content = route.page === "job" ? await jobPage(route.id)
        : route.page === "jobs" ? await jobsPage(route.query) : await clusterPage();
      document.getElementById("login").hidden = true;
      document.getElementById("status").textContent = "updated " + fmtClock(Date.now() / 1000);
    } catch (error) {
      if (mine !== renderCount) return;
      if (error.status === 401) {
        showLogin(token() ? "The token was refused: " + error.message : "");
        content = [h("p", { class: "muted" }, "Sign in to see the cluster.")];
      } else {
        content = [card("Error", h("p", { class: "error" }, (error.status ? error.status + ": " : "") + error.message))];
      }
    }
    if (mine !== renderCount) return; // a newer render started meanwhile
    destroyCharts();
    const view = document.getElementById("view");
    view.replaceChildren(...content);
    for (const el of view.querySelectorAll("section.card")) if (el.draw) el.draw();
    scheduleRefresh();
  }

  // Re-render every REFRESH_MS, but not while the tab is hidden or someone is typing.
  function scheduleRefresh() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(() => {
      const typing = document.activeElement && ["INPUT", "SELECT"].includes(document.activeElement.tagName);
      if (document.hidden || typing) scheduleRefresh();
      else render();
    }, REFRESH_MS);
  }

  function start() {
    takeTokenFromAddress();
    document.getElementById("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = document.getElementById("token-input");
      const value = input.value.trim();
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      input.value = "";
      render();
    });
    document.getElementById("forget-token").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      render();
    });
    window.addEventListener("hashchange", () => {
      takeTokenFromAddress();
      render();
    });
    let resizing = null;
    window.addEventListener("resize", () => {
      clearTimeout(resizing);
      resizing = setTimeout(resizeCharts, 150);
    });
    render();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
