// shardstock's dashboard for a sale. It lists every SKU
// (AdminService.ListSkus, searched by prefix) and shows the SKUs selling
// live: their stock per shard from InventoryService.WatchStock, the
// selected SKU's ledger from AdminService.WatchLedger (from now on, not
// the whole ledger), and, once a second, the allocator's own metrics
// (AdminService.ReadMetrics, what its operator listener's /metrics
// exposes, and the selected SKU's own call figures, which it keeps for
// the SKUs called most recently) for the charts of calls refused and
// rejected, latency percentiles and the alerts. The charts keep the
// last samplesMax seconds in the page. Only what has no stream is read
// again now and then (the SKU list, transfers, topology). It calls the
// public and admin APIs with @connectrpc/connect-web, the admin ones with
// the token entered once or given in the address (#token=..., as `make
// run` prints it), kept in sessionStorage.
import { createClient, ConnectError } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { InventoryService, DrawState } from "../gen/shardstock/v1/inventory_pb.js";
import { AdminService } from "../gen/shardstock/v1/admin_pb.js";
import { AdmissionMode, SkuStatus, ShardState, TransferState } from "../gen/shardstock/v1/types_pb.js";

// tickMs: the charts take one sample a tick, and the metrics are read
// once a tick (as a scrape would).
const tickMs = 1000;
// slowEvery: the SKU list, transfers and topology, which have no stream,
// are read every this many ticks.
const slowEvery = 5;
const ledgerRows = 15;
const transfersMax = 20;
// listMax SKUs are listed, boxesMax shown with their shards (and watched).
const listMax = 50;
const boxesMax = 4;
// samplesMax: the charts keep one sample a tick, for the last 5 minutes.
const samplesMax = 300;
// rateWindow: the samples the sell-out projection averages the sales
// rate over, so that one quiet second does not send it to infinity;
// latencyWindow: the ticks the latency percentiles are computed over.
const rateWindow = 10;
const latencyWindow = 10;
// A broken stream is opened again after retryMs, doubling to retryMsMax.
const retryMs = 500;
const retryMsMax = 8000;
// renderMs: stream messages are drawn at most this often.
const renderMs = 200;

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
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

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
// stocks: the last stock each watched SKU's stream sent; selected: the
// SKU charted.
let listed = [];
let prefix = "";
let selected = "";
const stocks = new Map();
const shown = () => {
  const selling = listed.filter((s) => s.sku.status !== SkuStatus.PAUSED && (s.available > 0n || s.reserved > 0n)).map((s) => s.sku.sku);
  const names = [selected, ...selling, ...listed.map((s) => s.sku.sku)].filter(Boolean);
  return [...new Set(names)].slice(0, boxesMax);
};

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

// act runs an action and shows its error, if any; then the SKU's stock is
// read once, so that a change no ledger entry says (a pause) shows at
// once rather than at the stream's next recheck.
async function act(f, sku) {
  try {
    await f();
    showError(null);
  } catch (err) {
    showError(err);
  }
  if (sku) {
    try {
      const { stock } = await inv.getStock({ sku });
      stocks.set(sku, stock);
    } catch { /* the stream will tell */ }
  }
  slowTicks = 0;
  await slow();
  render();
}

// ---- Streams -------------------------------------------------------------

// follow keeps a server stream open while key stays the same: open(signal)
// returns the stream, each message goes to onMessage; a broken stream is
// opened again after a backoff. A new key closes the old stream.
function follower(name) {
  let current = { key: null, abort: new AbortController() };
  return (key, open, onMessage) => {
    if (current.key === key) return;
    current.abort.abort();
    const abort = new AbortController();
    current = { key, abort };
    if (key === "") return;
    (async () => {
      for (let wait = retryMs; !abort.signal.aborted; wait = Math.min(retryMsMax, wait * 2)) {
        try {
          for await (const m of open(abort.signal)) {
            wait = retryMs;
            onMessage(m);
          }
        } catch (err) {
          if (abort.signal.aborted) return;
          console.warn(`${name} stream:`, err);
        }
        await sleep(wait);
      }
    })();
  };
}
const followStock = follower("WatchStock");
const followLedger = follower("WatchLedger");

// ledgerTail: the selected SKU's last ledger entries, newest last;
// ledgerCursor: where its stream is to resume after a break (the cursor of
// the last message; empty: from now).
let ledgerTail = [];
let ledgerOf = "";
let ledgerCursor = "";

function follow() {
  const names = shown();
  followStock(names.join("\n"), (signal) => inv.watchStock({ skus: names }, { signal }), (m) => {
    if (m.stock) stocks.set(m.stock.sku, m.stock);
    scheduleRender();
  });
  const sku = token ? selected : "";
  if (sku !== ledgerOf) {
    ledgerOf = sku;
    ledgerTail = [];
    ledgerCursor = "";
  }
  // From now (fromNow), not the whole of a long ledger; after a break,
  // from the last cursor received. Delivery is at least once, so an entry
  // seen again is dropped by its (database, id).
  followLedger(sku, (signal) => admin.watchLedger(ledgerCursor ? { cursor: ledgerCursor, skus: [sku], consumer: "dashboard" }
    : { fromNow: true, skus: [sku], consumer: "dashboard" }, { signal }), (m) => {
    if (m.cursor && sku === ledgerOf) ledgerCursor = m.cursor;
    if (!m.entry || m.entry.sku !== ledgerOf) return;
    const key = `${m.database}/${m.entry.id}`;
    if (ledgerTail.some((e) => e.key === key)) return;
    ledgerTail.push({ key, entry: m.entry });
    if (ledgerTail.length > ledgerRows) ledgerTail.shift();
    scheduleRender();
  });
}

let renderTimer = 0;
function scheduleRender() {
  if (!renderTimer) renderTimer = setTimeout(() => { renderTimer = 0; render(); }, renderMs);
}

// ---- SKU boxes -------------------------------------------------------------

// boxes: the box of each SKU shown, made once and updated in place, so
// that what is typed into its inputs survives the stream's updates.
const boxes = new Map();

function makeBox(name) {
  const num = (ph) => el("input", { type: "number", placeholder: ph });
  const delta = num("delta"), reason = el("input", { placeholder: "reason" }), approver = el("input", { placeholder: "approver" });
  const shardsIn = num("shards");
  const dry = el("input", { type: "checkbox" });
  const pause = el("button", { "data-action": "pause" }, "Pause");
  pause.addEventListener("click", () => {
    const paused = pause.dataset.action === "resume";
    act(() => admin.updateSku({ sku: name, paused: !paused }), name);
  });
  const field = (f) => el("b", { "data-field": f }, "-");
  const root = el("div", { class: "sku", "data-sku": name },
    el("h3", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); select(name); } }, name),
      el("span", { class: "status", "data-field": "status" }, "-"),
      el("span", { class: "rate" }, "")),
    el("div", { class: "totals" },
      "available ", field("available"), ", reserved ", field("reserved"), ", sold ", field("sold"),
      ", in transit ", field("inTransit"), ", ", field("shardsInService"), " shards in service"),
    el("div", { class: "shards" }),
    el("div", { class: "actions" },
      pause, delta, reason, approver,
      el("button", { "data-action": "adjust", onclick: () => act(() => admin.adjustStock({
        sku: name, delta: BigInt(delta.value || 0), reason: reason.value, approver: approver.value,
        idempotencyKey: `dashboard-${Date.now()}-${Math.random().toString(36).slice(2)}` }), name) }, "Adjust"),
      el("label", {}, dry, "dry run"),
      el("button", { "data-action": "rebalance", onclick: () => act(async () => {
        const r = await admin.rebalance({ sku: name, dryRun: dry.checked });
        $("#reconcile").textContent = `rebalance of ${name}: ${r.transfers.length} moves${dry.checked ? " planned" : ""}`;
      }, name) }, "Rebalance"),
      shardsIn,
      el("button", { "data-action": "set-shards", onclick: () => act(() => admin.setShards({ sku: name, shards: Number(shardsIn.value) }), name) }, "Set shards"),
      el("button", { "data-action": "reconcile", onclick: () => act(async () => {
        const r = await admin.reconcile({ sku: name });
        $("#reconcile").textContent = `${name} at ${new Date().toLocaleTimeString()}: ` +
          (r.balanced ? "balanced" : `${r.discrepancies.length} discrepancies: ` + r.discrepancies.map((d) => `${d.check} (shard ${d.shard})`).join(", "));
      }) }, "Reconcile"),
      el("button", { "data-action": "select", onclick: () => select(name) }, "Chart")));
  return { root, pause };
}

function updateBox(box, stock) {
  const paused = stock.status === SkuStatus.PAUSED;
  const set = (f, v) => { box.root.querySelector(`[data-field=${f}]`).textContent = String(v); };
  set("status", paused ? "paused" : "active");
  box.root.querySelector("[data-field=status]").className = `status ${paused ? "paused" : "active"}`;
  set("available", stock.available);
  set("reserved", stock.reserved);
  set("sold", stock.sold);
  set("inTransit", stock.inTransit);
  set("shardsInService", stock.shardsInService);
  box.pause.dataset.action = paused ? "resume" : "pause";
  box.pause.textContent = paused ? "Resume" : "Pause";
  const rate = rates.get(stock.sku);
  box.root.querySelector(".rate").textContent = rate === undefined ? "" : `${rate.toFixed(1)} sold/s`;
  const max = Math.max(1, ...stock.shards.map((s) => Number(s.available + s.reserved + s.sold)));
  box.root.querySelector(".shards").replaceChildren(...stock.shards.map((s) => {
    const state = s.state === ShardState.RETIRING ? "retiring" : s.haltedReason ? "halted" : "";
    const w = (n) => `${(100 * Number(n)) / max}%`;
    return el("div", { class: `shard ${state}`, "data-shard": String(s.index), title: s.haltedReason || "" },
      el("span", {}, `#${s.index}`),
      el("div", { class: "bar" },
        el("div", { class: "available", style: `width:${w(s.available)}`, "data-width": w(s.available) }),
        el("div", { class: "reserved", style: `width:${w(s.reserved)}` }),
        el("div", { class: "sold", style: `width:${w(s.sold)}` })),
      el("span", {}, `${s.available} / ${s.reserved} / ${s.sold}${state ? " " + state : ""}`));
  }));
}

function render() {
  const names = shown();
  for (const name of boxes.keys()) if (!names.includes(name)) boxes.delete(name);
  const roots = names.map((name) => {
    if (!boxes.has(name)) boxes.set(name, makeBox(name));
    const box = boxes.get(name);
    const stock = stocks.get(name);
    if (stock) updateBox(box, stock);
    return box.root;
  });
  const container = $("#skus");
  if (roots.length !== container.children.length || roots.some((r, i) => container.children[i] !== r)) container.replaceChildren(...roots);
  $("#ledger-sku").textContent = ledgerOf ? `of ${ledgerOf}` : "";
  $("#ledger tbody").replaceChildren(...ledgerTail.slice().reverse().map(({ entry: e }) => el("tr", {},
    el("td", {}, String(e.id)), el("td", {}, String(e.shard)), el("td", {}, kindLabel(e)), el("td", {}, String(e.quantity)),
    el("td", {}, e.source), el("td", {}, e.createdAt ? new Date(Number(e.createdAt.seconds) * 1000).toLocaleTimeString() : ""))));
}

// orderLineKey is the prefix of an order line's derived key
// (stock.OrderLineKey): its reserve, and the entries that end it, belong
// to an order, not to a call of their own.
const orderLineKey = "order-line:";

// kindLabel is a ledger entry's kind as the ledger view shows it: a
// refund names the sale it reverses (its original), an order line's entry
// says so and names its order's reference.
function kindLabel(e) {
  if (e.kind === "refund") return e.original ? `refund of ${e.original}` : "refund";
  if (e.source === "order" || (e.idempotencyKey || "").startsWith(orderLineKey)) {
    return `${e.kind} (order line${e.orderRef ? ` ${e.orderRef}` : ""})`;
  }
  return e.kind;
}

function select(name) {
  selected = name;
  for (const tr of document.querySelectorAll("#sku-list tbody tr")) tr.classList.toggle("selected", tr.dataset.sku === name);
  follow();
  render();
}

// ---- Metrics ----------------------------------------------------------------

// The families the page reads: the call counts and latency of the sale's
// calls, and the inputs of the alert rules it evaluates.
const metricNames = ["shardstock_rpc_calls_total", "shardstock_rpc_seconds", "shardstock_shard_halted",
  "shardstock_reconcile_unbalanced", "shardstock_shard_queue_rejected_total", "shardstock_shard_queue_depth",
  "shardstock_allocator_breaker_transitions_total", "shardstock_allocator_replays_total",
  "shardstock_rebalancer_transfers_ended_total", "shardstock_db_pool_wait_seconds_total",
  "shardstock_reconcile_last_success_timestamp_seconds", "shardstock_units_in_transit"];
// skuMetricNames: the selected SKU's own calls and latency, which
// ReadMetrics serves from the allocator's memory for the SKUs named in
// skus (never on /metrics: a label per SKU would grow without bound).
const skuMetricNames = ["shardstock_sku_calls_total", "shardstock_sku_rpc_seconds"];
// sellCall: the calls that sell, whose refusals and latency are charted.
const sellCall = /InventoryService\/(Reserve|Deduct|ReserveOrder)$/;
// rejectedReasons: the service did not decide the call (overload, its
// own failure, the caller unknown); any other reason is a refusal, the
// sale's answer (OUT_OF_STOCK, SALE_NOT_STARTED, SKU_PAUSED, ...).
const rejectedReasons = new Set(["RATE_LIMITED", "SHARD_UNAVAILABLE", "UNAUTHENTICATED", "PERMISSION_DENIED", "INTERNAL",
  "unavailable", "deadline_exceeded", "canceled", "resource_exhausted", "unknown", "internal", "unauthenticated", "permission_denied"]);

// summarise reduces one ReadMetrics answer to the figures the charts and
// alerts need (counters as read: the rates are differences of two reads).
// sku: the SKU whose own figures were asked for (sku: its refused,
// rejected and latency buckets, of the sell calls).
function summarise(samples, at, sku) {
  const m = { at, refused: 0, rejected: 0, buckets: new Map(), halted: 0, unbalanced: 0, queueRejected: 0, queueDepthMax: 0,
    breakerOpens: 0, replays: 0, sellCalls: 0, transferFailures: 0, poolWait: 0, reconciledAt: 0, inTransit: 0,
    sku: { name: sku, refused: 0, rejected: 0, buckets: new Map() } };
  for (const s of samples) {
    const l = s.labels;
    switch (s.name) {
      case "shardstock_sku_calls_total":
        if (l.sku !== sku || !sellCall.test(l.procedure) || l.reason === "OK") break;
        if (rejectedReasons.has(l.reason)) m.sku.rejected += s.value;
        else m.sku.refused += s.value;
        break;
      case "shardstock_sku_rpc_seconds_bucket":
        if (l.sku === sku && sellCall.test(l.procedure)) m.sku.buckets.set(l.le, (m.sku.buckets.get(l.le) || 0) + s.value);
        break;
      case "shardstock_reconcile_last_success_timestamp_seconds": m.reconciledAt = Math.max(m.reconciledAt, s.value); break;
      case "shardstock_units_in_transit": m.inTransit = s.value; break;
      case "shardstock_rpc_calls_total":
        if (!sellCall.test(l.procedure)) break;
        m.sellCalls += s.value;
        if (l.reason === "OK") break;
        if (rejectedReasons.has(l.reason)) m.rejected += s.value;
        else m.refused += s.value;
        break;
      case "shardstock_rpc_seconds_bucket":
        if (sellCall.test(l.procedure)) m.buckets.set(l.le, (m.buckets.get(l.le) || 0) + s.value);
        break;
      case "shardstock_shard_halted": m.halted = Math.max(m.halted, s.value); break;
      case "shardstock_reconcile_unbalanced": m.unbalanced = Math.max(m.unbalanced, s.value); break;
      case "shardstock_shard_queue_rejected_total": m.queueRejected += s.value; break;
      case "shardstock_shard_queue_depth": m.queueDepthMax = Math.max(m.queueDepthMax, s.value); break;
      case "shardstock_allocator_breaker_transitions_total": if (l.state === "open") m.breakerOpens += s.value; break;
      case "shardstock_allocator_replays_total": m.replays += s.value; break;
      case "shardstock_rebalancer_transfers_ended_total":
        if (l.outcome !== "credited" && l.outcome !== "OUT_OF_STOCK") m.transferFailures += s.value;
        break;
      case "shardstock_db_pool_wait_seconds_total": m.poolWait += s.value; break;
    }
  }
  return m;
}

// quantile is histogram_quantile over the difference of two reads'
// cumulative buckets: linear within the bucket the rank falls in.
// A count that fell was reset (a SKU's figures restart when it leaves the
// allocator's bounded set and comes back): then the later read alone
// counts, as Prometheus's rate does.
function quantile(q, from, to) {
  const bounds = [...to.buckets.keys()].map((le) => [le, le === "+Inf" ? Infinity : Number(le)]).sort((a, b) => a[1] - b[1]);
  const reset = [...to.buckets].some(([le, n]) => n < (from.buckets.get(le) || 0));
  const counts = bounds.map(([le, ub]) => [ub, (to.buckets.get(le) || 0) - (reset ? 0 : from.buckets.get(le) || 0)]);
  const total = counts.length ? counts[counts.length - 1][1] : 0;
  if (total <= 0) return NaN;
  const rank = q * total;
  let lower = 0, below = 0;
  for (const [ub, c] of counts) {
    if (c >= rank) {
      if (ub === Infinity) return lower;
      return lower + (ub - lower) * ((rank - below) / Math.max(1, c - below));
    }
    lower = ub;
    below = c;
  }
  return lower;
}

// reads: the summaries of the metrics read, one a tick, as many as the
// charts keep.
const reads = [];

async function readMetrics() {
  if (!token) return;
  const sku = selected;
  const r = await admin.readMetrics(sku ? { names: [...metricNames, ...skuMetricNames], skus: [sku] } : { names: metricNames });
  reads.push(summarise(r.samples, r.readAt ? Number(r.readAt.seconds) + r.readAt.nanos / 1e9 : Date.now() / 1000, sku));
  if (reads.length > samplesMax) reads.shift();
}

// The alert rules of deploy/alerts/shardstock.rules.yml the page can
// judge from one allocator's metrics, with the page's history (at most
// samplesMax ticks) for the rules' windows: an early warning on the
// screen; Prometheus's evaluation, over every process, is the one that
// pages. Names, layers and thresholds as in the rules (deploy/alerts
// TestDashboardPage checks them against the rules file). window: how the
// page's judgement differs from the rule's, shown beside it: a rule's
// range or for longer than what the page has read is judged over what it
// has (all: every read kept, at most samplesMax).
const alertRules = [
  { name: "ShardstockShardHalted", layer: "data-safety", threshold: 0, firing: (a, b, x) => b.halted > x },
  { name: "ShardstockReconcileUnbalanced", layer: "data-safety", threshold: 0, firing: (a, b, x) => b.unbalanced > x },
  { name: "ShardstockQueueRejections", layer: "execution", threshold: 0, firing: (a, b, x) => b.queueRejected - a.queueRejected > x },
  { name: "ShardstockBreakerOpen", layer: "execution", threshold: 0, firing: (a, b, x) => b.breakerOpens - a.breakerOpens > x },
  { name: "ShardstockTransferFailures", layer: "execution", threshold: 10, firing: (a, b, x) => b.transferFailures - a.transferFailures > x },
  { name: "ShardstockReplaySurge", layer: "execution", threshold: 0.2, firing: (a, b, x) => b.replays > a.replays && b.replays - a.replays > x * (b.sellCalls - a.sellCalls) },
  { name: "ShardstockQueueDepth", layer: "capacity", threshold: 2048, firing: (a, b, x) => b.queueDepthMax > x },
  { name: "ShardstockLatencyP99", layer: "capacity", threshold: 0.25, firing: (a, b, x) => quantile(0.99, a, b) > x },
  { name: "ShardstockPoolWaits", layer: "capacity", threshold: 0.5, firing: (a, b, x) => (b.poolWait - a.poolWait) / Math.max(1, b.at - a.at) > x },
  // The rule is over every allocator's last pass (max) and holds 10 min;
  // the page sees this allocator's alone, and only once it has finished a
  // pass (one that another allocator's lease skipped reads 0: not judged).
  { name: "ShardstockReconcileStale", layer: "data-safety", threshold: 3600,
    firing: (a, b, x) => b.reconciledAt > 0 && b.at - b.reconciledAt > x, window: (s) => `this allocator's passes; held ${s} s, not 10 min` },
  // min_over_time over 15 min: over the page's reads instead (-1: the
  // allocator could not read it).
  { name: "ShardstockUnitsInTransit", layer: "business-flow", threshold: 0,
    firing: (a, b, x, all) => Math.min(...all.map((r) => r.inTransit)) > x, window: (s) => `over the last ${s} s, not 15 min` },
];

function drawAlerts() {
  const box = $("#alerts");
  if (reads.length < 2) {
    box.textContent = token ? "reading metrics..." : "enter the admin token to see alerts";
    return;
  }
  const a = reads[0], b = reads[reads.length - 1];
  const secs = Math.round(b.at - a.at);
  const firing = alertRules.filter((r) => r.firing(a, b, r.threshold, reads));
  box.dataset.firing = String(firing.length);
  const label = (r) => `${r.name} (${r.layer}${r.window ? "; " + r.window(secs) : ""})`;
  box.replaceChildren(firing.length
    ? el("ul", {}, ...firing.map((r) => el("li", { class: "firing", "data-alert": r.name }, label(r))))
    : el("span", {}, `none of ${alertRules.length} rules firing over the last ${secs} s`),
  el("ul", { class: "judged" }, ...alertRules.filter((r) => r.window).map((r) => el("li", { "data-judged": r.name }, label(r)))));
}

// ---- Charts -----------------------------------------------------------------

// The charts of the selected SKU: one sample a tick, drawn into SVGs made
// once and updated in place.
const series = [
  { key: "soldPerSec", title: "sold per second" },
  { key: "refusedPerSec", title: "refused per second*" },
  { key: "rejectedPerSec", title: "rejected per second*" },
  { key: "p50ms", title: "latency p50 (ms)*" },
  { key: "p99ms", title: "latency p99 (ms)*" },
  { key: "available", title: "stock left" },
  { key: "inTransit", title: "in transit" },
  { key: "reserved", title: "reservations held" },
  { key: "sellOut", title: "projected sell-out (s)" },
];
let samples = [];
let charted = "";
const chartW = 300, chartH = 60;
// rates: units sold per second of each SKU shown, over the last tick;
// lastSold: each SKU's sold count at the last tick.
const rates = new Map();
const lastSold = new Map();

function sample() {
  const now = performance.now();
  for (const [name, st] of stocks) {
    const prev = lastSold.get(name);
    if (prev) rates.set(name, Number(st.sold - prev.sold) / Math.max(0.001, (now - prev.at) / 1000));
    lastSold.set(name, { sold: st.sold, at: now });
  }
  const stock = stocks.get(selected);
  if (!stock || !rates.has(selected)) return;
  if (charted !== selected) {
    charted = selected;
    samples = [];
  }
  const soldPerSec = rates.get(selected);
  const available = Number(stock.available);
  const recent = samples.slice(-(rateWindow - 1)).map((x) => x.soldPerSec).concat([soldPerSec]);
  const rate = recent.reduce((a, b) => a + b, 0) / recent.length;
  const s = { at: Date.now(), soldPerSec, available, reserved: Number(stock.reserved), inTransit: Number(stock.inTransit),
    sellOut: rate > 0 ? available / rate : NaN, refusedPerSec: NaN, rejectedPerSec: NaN, p50ms: NaN, p99ms: NaN };
  // The selected SKU's own figures, from the reads that asked for them
  // (a SKU selected since has none in the reads before).
  const own = reads.filter((r) => r.sku.name === selected);
  if (own.length >= 2) {
    const a = own[own.length - 2], b = own[own.length - 1], secs = Math.max(0.001, b.at - a.at);
    const delta = (x, y) => (y >= x ? y - x : y); // fell: reset, as rate() takes it
    s.refusedPerSec = delta(a.sku.refused, b.sku.refused) / secs;
    s.rejectedPerSec = delta(a.sku.rejected, b.sku.rejected) / secs;
    const from = own[Math.max(0, own.length - 1 - latencyWindow)];
    s.p50ms = 1000 * quantile(0.5, from.sku, b.sku);
    s.p99ms = 1000 * quantile(0.99, from.sku, b.sku);
  }
  samples.push(s);
  if (samples.length > samplesMax) samples.shift();
  drawCharts();
}

function drawCharts() {
  $("#charts-sku").textContent = charted ? `of ${charted}, last ${Math.round(samples.length * tickMs / 1000)} s` : "";
  for (const s of series) plot($(`#charts svg[data-series="${s.key}"]`), samples.map((x) => x[s.key]));
}

// plot draws vals, one a tick, into svg and shows the last beside it.
function plot(svg, vals) {
  // Scaled from the series' lowest to its highest, so that the stock of a
  // big SKU is seen moving.
  const finite = vals.filter(Number.isFinite);
  const lo = finite.length ? Math.min(...finite) : 0;
  const hi = Math.max(lo + 1, ...finite);
  const pts = vals.map((v, i) => Number.isFinite(v)
    ? `${((i * chartW) / Math.max(1, samplesMax - 1)).toFixed(1)},${(chartH - ((v - lo) * chartH) / (hi - lo)).toFixed(1)}` : null).filter(Boolean);
  svg.querySelector("polyline").setAttribute("points", pts.join(" "));
  svg.dataset.points = String(pts.length);
  svg.dataset.max = finite.length ? String(Math.max(...finite)) : "";
  const last = vals.length ? vals[vals.length - 1] : NaN;
  svg.parentElement.querySelector(".value").textContent = Number.isFinite(last) ? (Number.isInteger(last) ? String(last) : last.toFixed(1)) : "-";
}

function makeCharts() {
  $("#charts").replaceChildren(...chartBoxes(series));
}

// chartBoxes makes a box with an empty chart for each of list's series.
function chartBoxes(list) {
  const svgNS = "http://www.w3.org/2000/svg";
  return list.map((s) => {
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("class", "chart");
    svg.setAttribute("viewBox", `0 0 ${chartW} ${chartH}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.dataset.series = s.key;
    svg.dataset.points = "0";
    const line = document.createElementNS(svgNS, "polyline");
    svg.append(line);
    return el("div", { class: "chart-box" }, el("div", {}, s.title, " ", el("b", { class: "value" }, "-")), svg);
  });
}

// ---- Admission ----------------------------------------------------------------

// A SKU under admission (docs/admission.md) has its tokens outstanding and
// its waitlist charted in #admission. WatchStock does not carry them (the
// waitlist is a count in the database, not a shard's): GetStock is read
// once a tick, for the selected SKU only.
const admissionSeries = [
  { key: "tokensOutstanding", title: "tokens outstanding" },
  { key: "waitlistLength", title: "waitlist" },
];
let admissionSamples = [];
let admissionOf = "";

// underAdmission: whether the SKU list says name sells through admission.
const underAdmission = (name) => {
  const mode = listed.find((s) => s.sku.sku === name)?.sku.admission?.mode;
  return mode !== undefined && mode !== AdmissionMode.UNSPECIFIED;
};

async function sampleAdmission() {
  const box = $("#admission");
  const name = selected;
  if (!token || !name || !underAdmission(name)) {
    if (admissionOf !== "") {
      admissionOf = "";
      admissionSamples = [];
      box.replaceChildren(box.dataset.empty);
    }
    return;
  }
  const { stock, draw } = await inv.getStock({ sku: name });
  if (name !== selected) return;
  if (admissionOf !== name) {
    admissionOf = name;
    admissionSamples = [];
    box.replaceChildren(el("div", {}, `Admission of ${name}`), el("div", { class: "admission-draw" }),
      el("div", { class: "admission-charts" }, ...chartBoxes(admissionSeries)));
  }
  box.querySelector(".admission-draw").textContent = draw ? drawLine(draw) : "";
  admissionSamples.push({ tokensOutstanding: Number(stock.tokensOutstanding), waitlistLength: Number(stock.waitlistLength) });
  if (admissionSamples.length > samplesMax) admissionSamples.shift();
  for (const s of admissionSeries) plot(box.querySelector(`svg[data-series="${s.key}"]`), admissionSamples.map((x) => x[s.key]));
}

// drawLine says where a SKU's draw is (GetStock's DrawSummary).
function drawLine(d) {
  const at = (t) => (t ? new Date(Number(t.seconds) * 1000).toLocaleString() : "-");
  const state = { [DrawState.REGISTERING]: "registering", [DrawState.SEEDED]: "seeded", [DrawState.DRAWN]: "drawn" }[d.state] || "-";
  return `Draw: ${state}; draws at ${at(d.drawAt)}; drawn at ${at(d.drawnAt)}; ${d.tickets} tickets; ` +
    `${d.winners} winners; seed ${d.seedRecorded ? "recorded" : "not recorded"}`;
}

// ---- What has no stream -----------------------------------------------------

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
    el("td", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); select(s.sku.sku); } }, s.sku.sku)),
    el("td", {}, s.sku.status === SkuStatus.PAUSED ? "paused" : "active"),
    el("td", {}, String(s.available)), el("td", {}, String(s.reserved)), el("td", {}, String(s.sold)),
    el("td", {}, saleWindow(s.sku)))));
}

function saleWindow(cfg) {
  const at = (t) => (t ? new Date(Number(t.seconds) * 1000).toLocaleString() : "");
  return cfg.saleStart || cfg.saleEnd ? `${at(cfg.saleStart)} .. ${at(cfg.saleEnd)}` : "";
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
}

// slow reads what has no stream, every slowEvery ticks (at once after an
// action or a search), and follows the SKUs it shows.
let slowTicks = 0;
let slowRunning = false;
async function slow() {
  if (slowRunning || slowTicks++ % slowEvery !== 0) return;
  slowRunning = true;
  try {
    await refreshList();
    follow();
    render();
    await refreshSide();
  } catch (err) {
    showError(err);
  } finally {
    slowRunning = false;
  }
}

let tickRunning = false;
async function tick() {
  if (tickRunning) return;
  tickRunning = true;
  try {
    await readMetrics();
  } catch (err) {
    showError(err);
  } finally {
    tickRunning = false;
  }
  sample();
  sampleAdmission().catch(showError);
  drawAlerts();
  render();
  slow();
}

$("#token").value = token;
$("#token-state").textContent = token ? "set" : "not set";
$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  token = $("#token").value.trim();
  sessionStorage.setItem("shardstock-token", token);
  $("#token-state").textContent = token ? "set" : "not set";
  slowTicks = 0;
  slow();
});
$("#search-form").addEventListener("submit", (e) => {
  e.preventDefault();
  prefix = $("#search-prefix").value.trim();
  selected = "";
  slowTicks = 0;
  slow();
});
$("#create-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const sku = $("#create-sku").value.trim();
  act(async () => {
    await admin.createSku({ sku, initialStock: BigInt($("#create-stock").value || 0), shards: Number($("#create-shards").value || 1) });
    selected = sku;
  }, sku);
});

makeCharts();
$("#admission").dataset.empty = $("#admission").textContent;
slow();
// The streams stay open while the tab is hidden (they cost the server a
// watch each, bounded); the ticks, which read, stop.
setInterval(() => {
  if (!document.hidden) tick();
}, tickMs);
