// shardstock's dashboard: every SKU (AdminService.ListSkus, searched by
// prefix), the stock of the SKUs selling, per shard, charts of the
// selected SKU over the last minutes (sold per second, stock left,
// reservations held, in transit, projected sell-out), transfers in flight,
// the topology, recent ledger entries and the last reconciliation,
// refreshed every second while the tab is visible; and the actions of a
// sale (pause, resume, adjust, rebalance, set shards, create). It calls the
// public and admin APIs with @connectrpc/connect-web, the admin ones with
// the token entered once or given in the address (#token=..., as `make
// run` prints it), kept in sessionStorage.
import { createClient, ConnectError } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { InventoryService } from "../gen/shardstock/v1/inventory_pb.js";
import { AdminService } from "../gen/shardstock/v1/admin_pb.js";
import { SkuStatus, ShardState, TransferState } from "../gen/shardstock/v1/types_pb.js";

const refreshMs = 1000;
const ledgerRows = 15;
const transfersMax = 20;
// listEvery: the SKU list is read every this many refreshes (it pages the
// catalogue); listMax SKUs are listed, boxesMax shown with their shards.
const listEvery = 5;
const listMax = 50;
const boxesMax = 4;
// samplesMax: the charts keep one sample a refresh, for the last 5 minutes.
const samplesMax = 300;

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...children) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
};

// A token in the address (#token=...) is taken and removed from it.
const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromHash) {
  sessionStorage.setItem("shardstock-token", fromHash);
  history.replaceState(null, "", location.pathname + location.search);
}
let token = sessionStorage.getItem("shardstock-token") || "";
const bearer = (next) => async (req) => {
  if (token) req.header.set("Authorization", `Bearer ${token}`);
  return next(req);
};
const transport = createConnectTransport({ baseUrl: location.origin, interceptors: [bearer] });
const inv = createClient(InventoryService, transport);
const admin = createClient(AdminService, transport);

// listed: the last ListSkus page (by name, from the prefix searched);
// shown: the SKUs shown with their shards, the selected one first.
let listed = [];
let prefix = "";
let ticks = 0;
const shown = () => {
  const selling = listed.filter((s) => s.sku.status !== SkuStatus.PAUSED && (s.available > 0n || s.reserved > 0n)).map((s) => s.sku.sku);
  const names = [selected, ...selling, ...listed.map((s) => s.sku.sku)].filter(Boolean);
  return [...new Set(names)].slice(0, boxesMax);
};
// previous: the last snapshot per SKU, for the rates (units sold per
// second between two snapshots).
const previous = new Map();
let selected = "";

function showError(err) {
  const box = $("#error");
  if (!err) {
    box.hidden = true;
    return;
  }
  let text = String(err);
  if (err instanceof ConnectError) {
    const reason = err.details.map((d) => d.debug?.reason).find(Boolean);
    text = `${err.code !== undefined ? codeName(err.code) : ""}${reason ? " " + reason : ""}: ${err.rawMessage}`;
  }
  box.textContent = text;
  box.hidden = false;
}

const codeNames = ["ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found", "already_exists",
  "permission_denied", "resource_exhausted", "failed_precondition", "aborted", "out_of_range", "unimplemented",
  "internal", "unavailable", "data_loss", "unauthenticated"];
const codeName = (c) => codeNames[c] || String(c);

// act runs an action and shows its error, if any, then refreshes.
async function act(f) {
  try {
    await f();
    showError(null);
  } catch (err) {
    showError(err);
  }
  refresh();
}

function renderSKU(stock) {
  const name = stock.sku;
  const paused = stock.status === SkuStatus.PAUSED;
  const max = Math.max(1, ...stock.shards.map((s) => Number(s.available + s.reserved + s.sold)));
  const prev = previous.get(name);
  const now = performance.now();
  let rate = "";
  if (prev) {
    const sold = Number(stock.sold - prev.sold);
    const secs = (now - prev.at) / 1000;
    if (secs > 0) {
      rate = `${(sold / secs).toFixed(1)} sold/s`;
      if (name === selected) sample(stock, sold / secs);
    }
  }
  previous.set(name, { sold: stock.sold, at: now });
  const shards = stock.shards.map((s) => {
    const state = s.state === ShardState.RETIRING ? "retiring" : s.haltedReason ? "halted" : "";
    const w = (n) => `${(100 * Number(n)) / max}%`;
    return el("div", { class: `shard ${state}`, "data-shard": String(s.index), title: s.haltedReason || "" },
      el("span", {}, `#${s.index}`),
      el("div", { class: "bar" },
        el("div", { class: "available", style: `width:${w(s.available)}`, "data-width": w(s.available) }),
        el("div", { class: "reserved", style: `width:${w(s.reserved)}` }),
        el("div", { class: "sold", style: `width:${w(s.sold)}` })),
      el("span", {}, `${s.available} / ${s.reserved} / ${s.sold}${state ? " " + state : ""}`));
  });
  const num = (ph) => el("input", { type: "number", placeholder: ph });
  const delta = num("delta"), reason = el("input", { placeholder: "reason" }), approver = el("input", { placeholder: "approver" });
  const shardsIn = num("shards");
  const dry = el("input", { type: "checkbox" });
  return el("div", { class: "sku", "data-sku": name },
    el("h3", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); selected = name; refresh(); } }, name),
      el("span", { class: `status ${paused ? "paused" : "active"}`, "data-field": "status" }, paused ? "paused" : "active"),
      el("span", { class: "rate" }, rate)),
    el("div", { class: "totals" },
      "available ", el("b", { "data-field": "available" }, String(stock.available)),
      ", reserved ", el("b", { "data-field": "reserved" }, String(stock.reserved)),
      ", sold ", el("b", { "data-field": "sold" }, String(stock.sold)),
      `, in transit ${stock.inTransit}, ${stock.shardsInService} shards in service`),
    ...shards,
    el("div", { class: "actions" },
      el("button", { "data-action": paused ? "resume" : "pause", onclick: () => act(() => admin.updateSku({ sku: name, paused: !paused })) },
        paused ? "Resume" : "Pause"),
      delta, reason, approver,
      el("button", { "data-action": "adjust", onclick: () => act(() => admin.adjustStock({
        sku: name, delta: BigInt(delta.value || 0), reason: reason.value, approver: approver.value,
        idempotencyKey: `dashboard-${Date.now()}-${Math.random().toString(36).slice(2)}` })) }, "Adjust"),
      el("label", {}, dry, "dry run"),
      el("button", { "data-action": "rebalance", onclick: () => act(async () => {
        const r = await admin.rebalance({ sku: name, dryRun: dry.checked });
        showError(null);
        $("#reconcile").textContent = `rebalance of ${name}: ${r.transfers.length} moves${dry.checked ? " planned" : ""}`;
      }) }, "Rebalance"),
      shardsIn,
      el("button", { "data-action": "set-shards", onclick: () => act(() => admin.setShards({ sku: name, shards: Number(shardsIn.value) })) }, "Set shards"),
      el("button", { "data-action": "reconcile", onclick: () => act(async () => {
        const r = await admin.reconcile({ sku: name });
        $("#reconcile").textContent = `${name} at ${new Date().toLocaleTimeString()}: ` +
          (r.balanced ? "balanced" : `${r.discrepancies.length} discrepancies: ` + r.discrepancies.map((d) => `${d.check} (shard ${d.shard})`).join(", "));
      }) }, "Reconcile"),
      el("button", { "data-action": "select", onclick: () => { selected = name; refresh(); } }, "Chart")));
}

// The charts of the selected SKU: one sample a refresh, drawn into SVGs
// made once and updated in place.
const series = [
  { key: "soldPerSec", title: "sold per second" },
  { key: "available", title: "stock left" },
  { key: "reserved", title: "reservations held" },
  { key: "inTransit", title: "in transit" },
  { key: "sellOut", title: "projected sell-out (s)" },
];
let samples = [];
let charted = "";
const chartW = 300, chartH = 60;

function sample(stock, soldPerSec) {
  if (charted !== stock.sku) {
    charted = stock.sku;
    samples = [];
  }
  const available = Number(stock.available);
  // Recent rate: the average over the last 10 samples, so that one
  // quiet second does not send the projection to infinity.
  const recent = samples.slice(-9).map((x) => x.soldPerSec).concat([soldPerSec]);
  const rate = recent.reduce((a, b) => a + b, 0) / recent.length;
  samples.push({ at: Date.now(), soldPerSec, available, reserved: Number(stock.reserved), inTransit: Number(stock.inTransit),
    sellOut: rate > 0 ? available / rate : NaN });
  if (samples.length > samplesMax) samples.shift();
  drawCharts();
}

function drawCharts() {
  $("#charts-sku").textContent = charted ? `of ${charted}, last ${Math.round(samples.length * refreshMs / 1000)} s` : "";
  for (const s of series) {
    const svg = $(`#charts svg[data-series="${s.key}"]`);
    const vals = samples.map((x) => x[s.key]);
    // Scaled from the series' lowest to its highest, so that the stock of
    // a big SKU is seen moving.
    const finite = vals.filter(Number.isFinite);
    const lo = finite.length ? Math.min(...finite) : 0;
    const hi = Math.max(lo + 1, ...finite);
    const pts = vals.map((v, i) => Number.isFinite(v)
      ? `${((i * chartW) / Math.max(1, samplesMax - 1)).toFixed(1)},${(chartH - ((v - lo) * chartH) / (hi - lo)).toFixed(1)}` : null).filter(Boolean);
    svg.querySelector("polyline").setAttribute("points", pts.join(" "));
    svg.dataset.points = String(pts.length);
    const last = vals.length ? vals[vals.length - 1] : NaN;
    svg.parentElement.querySelector(".value").textContent = Number.isFinite(last) ? (Number.isInteger(last) ? String(last) : last.toFixed(1)) : "-";
  }
}

function makeCharts() {
  const svgNS = "http://www.w3.org/2000/svg";
  $("#charts").replaceChildren(...series.map((s) => {
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("class", "chart");
    svg.setAttribute("viewBox", `0 0 ${chartW} ${chartH}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.dataset.series = s.key;
    svg.dataset.points = "0";
    const line = document.createElementNS(svgNS, "polyline");
    svg.append(line);
    return el("div", { class: "chart-box" }, el("div", {}, s.title, " ", el("b", { class: "value" }, "-")), svg);
  }));
}

// refreshList reads the SKU list (the admin API): the SKUs whose names
// start with the prefix searched, by name.
async function refreshList() {
  if (!token) {
    $("#sku-list tbody").replaceChildren(el("tr", {}, el("td", { colspan: "6" }, "enter the admin token to list SKUs")));
    return;
  }
  const { skus } = await admin.listSkus({ prefix, pageSize: listMax });
  listed = skus;
  if (!selected && skus.length) selected = shown()[0] || "";
  $("#sku-list tbody").replaceChildren(...skus.map((s) => el("tr", { "data-sku": s.sku.sku, class: s.sku.sku === selected ? "selected" : "" },
    el("td", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); selected = s.sku.sku; refresh(); } }, s.sku.sku)),
    el("td", {}, s.sku.status === SkuStatus.PAUSED ? "paused" : "active"),
    el("td", {}, String(s.available)), el("td", {}, String(s.reserved)), el("td", {}, String(s.sold)),
    el("td", {}, saleWindow(s.sku)))));
}

function saleWindow(cfg) {
  const at = (t) => (t ? new Date(Number(t.seconds) * 1000).toLocaleString() : "");
  return cfg.saleStart || cfg.saleEnd ? `${at(cfg.saleStart)} .. ${at(cfg.saleEnd)}` : "";
}

async function refreshSKUs() {
  if (ticks++ % listEvery === 0 || !listed.length) await refreshList();
  const boxes = [];
  for (const name of shown()) {
    try {
      const { stock } = await inv.getStock({ sku: name });
      boxes.push(renderSKU(stock));
    } catch (err) {
      boxes.push(el("div", { class: "sku", "data-sku": name }, el("h3", {}, name), String(err.rawMessage || err)));
    }
  }
  $("#skus").replaceChildren(...boxes);
}

async function refreshSide() {
  if (!token) return;
  const rows = [];
  for (const state of [TransferState.PENDING, TransferState.DEBITED]) {
    const { transfers } = await admin.listTransfers({ state, pageSize: transfersMax });
    for (const t of transfers) {
      rows.push(el("tr", {}, el("td", {}, t.sku), el("td", {}, String(t.fromShard)), el("td", {}, String(t.toShard)),
        el("td", {}, String(t.quantity)), el("td", {}, TransferState[t.state].toLowerCase())));
    }
  }
  $("#transfers tbody").replaceChildren(...rows);

  const topo = await admin.getTopology({});
  const epochs = new Map();
  for (const o of topo.owners) {
    const e = epochs.get(o.serverId) || [];
    e.push(o.epoch);
    epochs.set(o.serverId, e);
  }
  const servers = topo.servers.map((s) => {
    const e = epochs.get(s.serverId) || [];
    const lo = e.length ? e.reduce((a, b) => (a < b ? a : b)) : "-";
    const hi = e.length ? e.reduce((a, b) => (a > b ? a : b)) : "-";
    return el("tr", {}, el("td", {}, s.serverId), el("td", {}, s.address), el("td", {}, String(s.partitions.length)), el("td", {}, `${lo}..${hi}`));
  });
  const dbs = (topo.placement?.databases || []).map((d) => `${d.name} (${d.slots} slots${d.configured ? "" : ", not configured"})`).join(", ");
  $("#topology").replaceChildren(
    el("div", {}, `${topo.owners.length} of ${topo.partitions} partitions owned; databases: ${dbs || "-"}; placement v${topo.placement?.version ?? "-"}`),
    el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "server"), el("th", {}, "address"), el("th", {}, "partitions"), el("th", {}, "epochs"))),
      el("tbody", {}, ...servers)),
    el("div", {}, topo.moveLeases.length ? "moving: " + topo.moveLeases.map((l) => `${l.sku} by ${l.holder}`).join(", ") : "no SKU being moved"));

  if (selected) {
    $("#ledger-sku").textContent = `of ${selected}`;
    // The ledger pages oldest first: page on to the end, keep the last rows.
    let tail = [], pageToken = "";
    for (let i = 0; i < 20; i++) {
      const r = await admin.listLedger({ sku: selected, pageToken, pageSize: 1000 });
      tail = tail.concat(r.entries).slice(-ledgerRows);
      if (!r.nextPageToken) break;
      pageToken = r.nextPageToken;
    }
    $("#ledger tbody").replaceChildren(...tail.reverse().map((e) => el("tr", {},
      el("td", {}, String(e.id)), el("td", {}, String(e.shard)), el("td", {}, e.kind), el("td", {}, String(e.quantity)),
      el("td", {}, e.source), el("td", {}, e.createdAt ? new Date(Number(e.createdAt.seconds) * 1000).toLocaleTimeString() : ""))));
  }
}

let running = false;
async function refresh() {
  if (running) return;
  running = true;
  try {
    await refreshSKUs();
    await refreshSide();
  } catch (err) {
    showError(err);
  } finally {
    running = false;
  }
}

$("#token").value = token;
$("#token-state").textContent = token ? "set" : "not set";
$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  token = $("#token").value.trim();
  sessionStorage.setItem("shardstock-token", token);
  $("#token-state").textContent = token ? "set" : "not set";
  ticks = 0;
  refresh();
});
$("#search-form").addEventListener("submit", (e) => {
  e.preventDefault();
  prefix = $("#search-prefix").value.trim();
  selected = "";
  ticks = 0;
  refresh();
});
$("#create-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const sku = $("#create-sku").value.trim();
  act(async () => {
    await admin.createSku({ sku, initialStock: BigInt($("#create-stock").value || 0), shards: Number($("#create-shards").value || 1) });
    selected = sku;
    ticks = 0;
  });
});

makeCharts();
refresh();
setInterval(() => {
  if (!document.hidden) refresh();
}, refreshMs);
