// gpudra fleet view: renders the snapshot, then patches the nodes each
// "delta" event names; the status event drives the banners.
"use strict";

const state = {
  nodes: new Map(),   // name -> node
  status: null,
  query: "",
  stream: "connecting", // connecting | open | lost
};
window.fleetView = { loadedMs: null, version: 0, deltas: 0 };

const $ = (id) => document.getElementById(id);

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// gpuClass is the GPU's colour: unhealthy wins, then what holds it.
function gpuClass(g) {
  if (g.health !== "ok") return "unhealthy";
  if ((g.holders || []).length > 1 || (g.holders || []).some((h) => h.shareID)) return "shared";
  if ((g.holders || []).length === 1 || (g.vfio && (g.vfio.holders || []).length)) return "held";
  if ((g.mig || []).some((m) => (m.holders || []).length)) return "mig";
  return "free";
}

function taintText(t) {
  return esc(t.key + (t.value ? "=" + t.value : "") + ":" + t.effect + (t.rule ? " (rule " + t.rule + ")" : ""));
}

function holderHTML(h) {
  const share = h.consumed ? " " + Object.entries(h.consumed).map(([k, v]) => esc(k + " " + v)).join(", ") : "";
  const groups = (h.podGroups || []).map((g) => `<span class="pod">&rArr; PodGroup ${esc(g)}</span>`).join(" ");
  const pods = (h.pods || []).map((p) => `<span class="pod">&rarr; ${esc(p.name)} <span class="phase-${esc(p.phase)}">${esc(p.phase || "?")}</span></span>`).join(" ");
  return `<div class="holder" data-claim="${esc(h.claim)}">${esc(h.claim)}${share} ${groups} ${pods}</div>`;
}

function deviceHTML(d) {
  const holders = (d.holders || []).map(holderHTML).join("");
  const label = d.type === "vfio" ? "VFIO " + d.name : d.name + (d.profile ? " (" + d.profile + ")" : "");
  return `<div class="dev" data-device="${esc(d.name)}">${esc(label)}${holders}</div>`;
}

function gpuHTML(g) {
  const parts = [`<div class="gpu ${gpuClass(g)}" data-gpu="${esc(g.name)}" title="${esc(g.uuid || "")} ${esc(g.pciBusID || "")}">`,
    `<div class="head"><b>${esc(g.name)}</b><span class="prod">${esc((g.product || "").replace(/^NVIDIA /, ""))} ${esc(g.memory)}</span>`];
  if (g.sharing && g.sharing !== "none") parts.push(`<span class="chip">${esc(g.sharing)}</span>`);
  if (g.health !== "ok") parts.push(`<span class="chip bad">${esc(g.health)}</span>`);
  parts.push("</div>");
  for (const t of g.taints || []) parts.push(`<div class="chip taint">${taintText(t)}</div>`);
  for (const h of g.holders || []) parts.push(holderHTML(h));
  for (const m of g.mig || []) parts.push(deviceHTML(m));
  if (g.vfio && (g.vfio.holders || []).length) parts.push(deviceHTML(g.vfio));
  if (g.migFree) parts.push(`<div class="note">${g.migFree} MIG placements free</div>`);
  parts.push("</div>");
  return parts.join("");
}

function nodeHTML(n) {
  const ready = n.ready === "True" ? `<span class="chip ok">Ready</span>` : n.ready ? `<span class="chip bad">Ready=${esc(n.ready)}</span>` : "";
  const taints = (n.taints || []).map((t) => `<span class="chip taint">${taintText(t)}</span>`).join("");
  const cordon = n.unschedulable ? `<span class="chip bad">cordoned</span>` : "";
  const gpus = (n.gpus || []).length ? `<div class="gpus">${n.gpus.map(gpuHTML).join("")}</div>` : `<div class="note">no devices of this driver</div>`;
  return `<section class="node" id="node-${esc(n.name)}" data-node="${esc(n.name)}"><header><span class="name">${esc(n.name)}</span>${ready}${cordon}${taints}</header>${gpus}</section>`;
}

// Nodes with GPUs first; nodes without are summed up, not drawn, so that
// a cluster of many CPU nodes stays readable.
function shown(n) { return (n.gpus || []).length > 0; }

function renderAll() {
  const names = [...state.nodes.keys()].sort();
  const html = names.map((n) => state.nodes.get(n)).filter(shown).map(nodeHTML).join("");
  $("nodes").innerHTML = html || `<p class="empty">No GPUs to show.</p>`;
}

// patch redraws only the named nodes, in name order.
function patch(changed, removed) {
  const main = $("nodes");
  if (!main.querySelector(".node")) { renderAll(); return; }
  for (const name of removed) {
    const el = document.getElementById("node-" + name);
    if (el) el.remove();
  }
  for (const n of changed) {
    const el = document.getElementById("node-" + n.name);
    if (!shown(n)) { if (el) el.remove(); continue; }
    const tpl = document.createElement("template");
    tpl.innerHTML = nodeHTML(n);
    const fresh = tpl.content.firstElementChild;
    if (el) { el.replaceWith(fresh); continue; }
    let before = null;
    for (const other of main.children) {
      if (other.dataset.node && other.dataset.node > n.name) { before = other; break; }
    }
    main.insertBefore(fresh, before);
  }
}

function renderSummary() {
  let gpus = 0, held = 0, bad = 0, nodes = 0;
  for (const n of state.nodes.values()) {
    if (!shown(n)) continue;
    nodes++;
    for (const g of n.gpus) {
      gpus++;
      if (g.health !== "ok") bad++;
      if (gpuClass(g) !== "free" && gpuClass(g) !== "unhealthy") held++;
    }
  }
  const other = state.nodes.size - nodes;
  $("summary").textContent = `${nodes} nodes, ${gpus} GPUs, ${held} in use, ${bad} unhealthy` + (other ? `, ${other} node${other === 1 ? "" : "s"} without GPUs` : "");
}

// search lists every device whose claim or pod matches the query, and the
// nodes whose name does.
function search() {
  const q = state.query.trim().toLowerCase();
  const box = $("results");
  for (const el of document.querySelectorAll(".node.match")) el.classList.remove("match");
  if (!q) { box.hidden = true; box.innerHTML = ""; return; }
  const rows = [];
  const nodes = [];
  const visit = (node, gpu, dev, holders) => {
    for (const h of holders || []) {
      const pods = h.pods || [];
      if (h.claim.toLowerCase().includes(q) || pods.some((p) => p.name.toLowerCase().includes(q)) || (h.podGroups || []).some((g) => g.toLowerCase().includes(q))) {
        rows.push({ node: node.name, gpu: gpu.name, device: dev, h });
      }
    }
  };
  for (const n of [...state.nodes.values()].sort((a, b) => (a.name < b.name ? -1 : 1))) {
    if (n.name.toLowerCase().includes(q)) nodes.push(n.name);
    for (const g of n.gpus || []) {
      visit(n, g, g.name, g.holders);
      for (const m of g.mig || []) visit(n, g, m.name, m.holders);
      if (g.vfio) visit(n, g, g.vfio.name, g.vfio.holders);
    }
  }
  const parts = [];
  if (rows.length) {
    parts.push(`<h2>${rows.length} device${rows.length === 1 ? "" : "s"} held by a matching claim or pod</h2><table><thead><tr><th>node</th><th>GPU</th><th>device</th><th>claim</th><th>share</th><th>pods</th></tr></thead><tbody>`);
    for (const r of rows) {
      const share = r.h.consumed ? Object.entries(r.h.consumed).map(([k, v]) => k + " " + v).join(", ") : "";
      const pods = (r.h.podGroups || []).map((g) => `PodGroup ${esc(g)}`).concat((r.h.pods || []).map((p) => `${esc(p.name)} <span class="phase-${esc(p.phase)}">${esc(p.phase || "?")}</span>`)).join("<br>");
      parts.push(`<tr class="result" data-node="${esc(r.node)}" data-device="${esc(r.device)}"><td>${esc(r.node)}</td><td>${esc(r.gpu)}</td><td>${esc(r.device)}</td><td>${esc(r.h.claim)}</td><td>${esc(share)}</td><td>${pods}</td></tr>`);
    }
    parts.push("</tbody></table>");
  }
  if (nodes.length) {
    parts.push(`<h2>${nodes.length} matching node${nodes.length === 1 ? "" : "s"}</h2><div>${nodes.map((n) => `<a href="#node-${esc(n)}" class="node-result">${esc(n)}</a>`).join(" ")}</div>`);
  }
  if (!parts.length) parts.push(`<h2>Nothing matches &ldquo;${esc(state.query)}&rdquo;</h2>`);
  box.innerHTML = parts.join("");
  box.hidden = false;
  for (const name of new Set([...rows.map((r) => r.node), ...nodes])) {
    const el = document.getElementById("node-" + name);
    if (el) el.classList.add("match");
  }
}

function banner(kind, text) {
  return `<div class="banner ${kind}">${text}</div>`;
}

function renderBanners() {
  const out = [];
  const st = state.status;
  if (st) $("driver").textContent = "driver " + st.driver;
  if (state.stream === "lost") out.push(banner("error", "Lost the connection to the fleet view server; reconnecting&hellip; The page shows the last state it received."));
  if (st) {
    if (st.apiServer) {
      out.push(banner("error", `Disconnected: the API server has not answered since ${esc(st.apiServerDownSince)} (${esc(st.apiServer)}). The page shows the last state it saw and updates again when the API server is back.`));
    }
    for (const r of st.resources || []) {
      if (r.state === "forbidden") {
        out.push(banner("warn", `Not allowed to ${esc(r.verb)} ${esc(r.resource)}: the page shows the rest without them. (${esc(r.message)})`));
      } else if (r.state === "error" && !st.apiServer) {
        out.push(banner("warn", `Reading ${esc(r.resource)} failed (${esc(r.verb)}): ${esc(r.message)}`));
      }
    }
    const slices = (st.resources || []).find((r) => r.resource.startsWith("resourceslices"));
    const waiting = (st.resources || []).filter((r) => r.state === "waiting").map((r) => r.resource);
    if (slices && slices.state === "synced" && st.slices === 0) {
      out.push(banner("info", `No ResourceSlices of driver ${esc(st.driver)} in this cluster: gpudra's kubelet plugin does not run here, or runs under another --driver-name. The summary counts the nodes.`));
    }
    if (waiting.length && !st.apiServer) out.push(banner("info", `Waiting for the API server's lists of ${esc(waiting.join(", "))}&hellip;`));
  }
  $("banners").innerHTML = out.join("");
}

function onSnapshot(doc) {
  state.nodes = new Map(doc.nodes.map((n) => [n.name, n]));
  state.status = doc.status && doc.status.resources ? doc.status : state.status;
  window.fleetView.version = doc.version;
  renderAll();
  renderSummary();
  renderBanners();
  search();
  // Loaded means drawn: the timeout queued in the next animation frame
  // runs after that frame's paint.
  if (window.fleetView.loadedMs === null) {
    requestAnimationFrame(() => setTimeout(() => { window.fleetView.loadedMs ??= performance.now(); }, 0));
  }
}

function onDelta(d) {
  for (const name of d.removed) state.nodes.delete(name);
  for (const n of d.nodes) state.nodes.set(n.name, n);
  window.fleetView.version = d.version;
  window.fleetView.deltas++;
  patch(d.nodes, d.removed);
  renderSummary();
  if (state.query) search();
}

function connect() {
  const es = new EventSource("api/events");
  es.addEventListener("snapshot", (e) => { state.stream = "open"; onSnapshot(JSON.parse(e.data)); });
  es.addEventListener("delta", (e) => onDelta(JSON.parse(e.data)));
  es.addEventListener("status", (e) => { state.status = JSON.parse(e.data); renderBanners(); });
  es.onerror = () => {
    state.stream = "lost";
    renderBanners();
    // EventSource retries by itself unless the server answered with an
    // error; then start over after a pause.
    if (es.readyState === EventSource.CLOSED) setTimeout(connect, 2000);
  };
}

function init() {
  const params = new URLSearchParams(location.search);
  state.query = params.get("q") || "";
  const input = $("search");
  input.value = state.query;
  let timer = null;
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      state.query = input.value;
      const url = new URL(location.href);
      if (state.query) url.searchParams.set("q", state.query); else url.searchParams.delete("q");
      history.replaceState(null, "", url);
      search();
    }, 120);
  });
  connect();
}

init();
