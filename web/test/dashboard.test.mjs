// The dashboard in headless Chromium (Debian's chromium, driven by
// playwright-core) against the stack `make run` started, whose address,
// dashboard address (as its banner prints it, the token in it), demo SKU
// and admin token internal/e2e's TestE2E_Dashboard passes in
// SHARDSTOCK_URL, SHARDSTOCK_DASHBOARD_URL, SHARDSTOCK_DEMO_SKU and
// SHARDSTOCK_ADMIN_TOKEN: opened at that address, the page lists and shows
// the demo SKU with no typing; under a bounded load of deducts (some
// refused) its charts of that SKU (sold, refused, latency, stock) move
// and grow, its ledger's last entries change (from now: the ledger is
// followed with fromNow), and it sends no GetStock (the stock comes from
// WatchStock); then enter the token, create a SKU
// through the page, deduct from this script, see the bars move, pause the
// SKU through the page, see a refund and an order's line labelled in its
// ledger, see it paused (and a deduct refused), and save
// screenshots.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";
import { createClient, ConnectError, Code } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { InventoryService } from "../gen/shardstock/v1/inventory_pb.js";
import { AdminService } from "../gen/shardstock/v1/admin_pb.js";
import { AdmissionMode } from "../gen/shardstock/v1/types_pb.js";

const baseUrl = process.env.SHARDSTOCK_URL;
const pageUrl = process.env.SHARDSTOCK_DASHBOARD_URL;
const demo = process.env.SHARDSTOCK_DEMO_SKU;
const token = process.env.SHARDSTOCK_ADMIN_TOKEN;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const artifacts = resolve(process.env.ARTIFACTS_DIR || "../tmp/artifacts");
const sku = `dash-${process.pid}`;
const timeout = 15_000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// The load is bounded in count and time: at most loadMax deducts of one
// unit (fewer than the demo SKU's 1,000, so that it is still selling when
// the charts are read), for at most loadMs, loadPauseMs apart, so that it
// lasts past the reads (unpaced, 600 deducts could end in a second or two,
// before the ledger's first read, whose last entry then never changed).
const loadMax = 600;
const loadMs = 60_000;
const loadPauseMs = 20;

test("the dashboard shows stock moving and pauses a SKU", { timeout: 80_000 }, async () => {
  assert.ok(baseUrl && pageUrl && demo, "SHARDSTOCK_URL, SHARDSTOCK_DASHBOARD_URL or SHARDSTOCK_DEMO_SKU is not set");
  const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--headless=new"] });
  try {
    const page = await browser.newPage();
    const consoleErrors = [];
    page.on("pageerror", (e) => consoleErrors.push(String(e)));
    // make run's demo SKU, selling before the page opens: listed and
    // shown with no typing, the token coming in the address.
    const bearer = (next) => async (req) => { req.header.set("Authorization", `Bearer ${token}`); return next(req); };
    const inv = createClient(InventoryService, createConnectTransport({ baseUrl, interceptors: [bearer] })); // an admin may act as a service
    const admin = createClient(AdminService, createConnectTransport({ baseUrl, interceptors: [bearer] }));
    // A past in its ledger before the page opens, which the page must not
    // read (it follows the ledger from now).
    for (let i = 0; i < 3; i++) await inv.deduct({ sku: demo, quantity: 1n, idempotencyKey: `dash-before-${process.pid}-${i}` });
    const { stock: before } = await inv.getStock({ sku: demo });
    // Every call the page makes, by procedure: it follows the stock through
    // WatchStock, not by reading it again each second.
    const calls = [];
    page.on("request", (r) => calls.push({ at: Date.now(), procedure: new URL(r.url()).pathname.split("/").pop() }));
    await page.goto(pageUrl);
    await page.waitForSelector(`#sku-list tr[data-sku="${demo}"]`, { timeout });
    await page.waitForSelector(`.sku[data-sku="${demo}"] [data-field=available]:text-is("${before.available}")`, { timeout });
    // The ledger is followed from now: the demo SKU's earlier entries (the
    // deducts above) are not read, and the table stays empty until a deduct.
    for (const end = Date.now() + timeout; !calls.some((c) => c.procedure === "WatchLedger"); await sleep(100)) {
      assert.ok(Date.now() < end, "the page did not open WatchLedger");
    }
    await sleep(1000);
    assert.equal(await page.locator("#ledger tbody tr").count(), 0, "the page read the ledger from before it opened");
    assert.ok(!(await page.evaluate(() => location.hash)).includes("token"), "the token stayed in the address");

    // Under load the charts move and grow: their data differ between two
    // reads, and hold more points; the ledger's last entries change.
    const chartsFrom = Date.now();
    let load = true;
    const loadEnd = Date.now() + loadMs;
    let sent = 0;
    const loading = (async () => {
      for (let i = 0; load && i < loadMax && Date.now() < loadEnd; i++, sent++) {
        await inv.deduct({ sku: demo, quantity: 1n, idempotencyKey: `dash-load-${process.pid}-${i}` });
        await sleep(loadPauseMs);
        // More than the SKU has: refused OUT_OF_STOCK, charted as its own.
        if (i % 10 === 0) {
          await inv.deduct({ sku: demo, quantity: 5000n, idempotencyKey: `dash-over-${process.pid}-${i}` }).catch(() => {});
        }
      }
    })();
    const chartData = () => page.locator("#charts svg.chart").evaluateAll((svgs) =>
      svgs.map((s) => ({ series: s.dataset.series, points: Number(s.dataset.points), max: Number(s.dataset.max), line: s.querySelector("polyline").getAttribute("points"),
        value: s.parentElement.querySelector(".value").textContent })));
    const ledgerTop = () => page.locator("#ledger tbody tr").first().textContent();
    await page.waitForFunction(() => Number(document.querySelector('#charts svg[data-series="refusedPerSec"]').dataset.points) >= 2, null, { timeout });
    await page.waitForSelector("#ledger tbody tr", { timeout });
    assert.ok((await page.locator("#charts-sku").textContent()).startsWith(`of ${demo}`), "the demo SKU is not the one charted");
    const first = await chartData();
    const ledgerFirst = await ledgerTop();
    const watched = Date.now();
    await page.waitForFunction((n) => Number(document.querySelector('#charts svg[data-series="available"]').dataset.points) >= n + 3,
      first.find((c) => c.series === "available").points, { timeout });
    const second = await chartData();
    // The ledger's table follows the change stream, which delivers an
    // entry once every transaction older than it in the Postgres cluster
    // has ended (docs/changestream.md): the change is waited for, up to
    // the test's timeout, while the load goes on.
    let ledgerSecond = await ledgerTop();
    for (const end = Date.now() + timeout; ledgerSecond === ledgerFirst && Date.now() < end; await sleep(100)) {
      ledgerSecond = await ledgerTop();
    }
    const during = calls.filter((c) => c.at >= watched && c.at <= Date.now());
    load = false;
    await loading;
    const keys = ["soldPerSec", "refusedPerSec", "rejectedPerSec", "p50ms", "p99ms", "available", "inTransit", "reserved", "sellOut"];
    assert.deepEqual(first.map((c) => c.series), keys, "the charts");
    for (const key of ["soldPerSec", "available", "refusedPerSec", "p99ms"]) {
      const a = first.find((c) => c.series === key), b = second.find((c) => c.series === key);
      assert.ok(b.points > a.points, `chart ${key}: ${a.points} -> ${b.points} points, want more under load`);
      assert.notEqual(b.line, a.line, `chart ${key} did not move under load`);
    }
    // Moving is more than growing: the stock left read lower, and its
    // line holds more than one height.
    const heights = (c) => new Set(c.line.split(" ").map((p) => p.split(",")[1])).size;
    const avail = (d) => d.find((c) => c.series === "available");
    assert.ok(Number(avail(second).value) < Number(avail(first).value), `stock left ${avail(first).value} -> ${avail(second).value} under load`);
    assert.ok(heights(avail(second)) > 1, `stock left charted flat under load: ${avail(second).line}`);
    // The demo SKU's own refusals (its deducts of more than it has), and
    // its own sales, are charted above zero.
    for (const key of ["refusedPerSec", "soldPerSec"]) {
      const max = second.find((c) => c.series === key).max;
      assert.ok(max > 0, `chart ${key}: highest ${max}, want above 0 while such deducts were sent`);
    }
    assert.notEqual(ledgerSecond, ledgerFirst, "the ledger's last entry did not change under load");
    // The alerts are judged (which fire depends on this machine's load:
    // LatencyP99 may): a count, and each firing one named.
    const firing = Number(await page.locator("#alerts").getAttribute("data-firing"));
    assert.ok(Number.isInteger(firing), "the alerts were not judged");
    assert.equal(await page.locator("#alerts li[data-alert^=Shardstock]").count(), firing, "alerts firing without a name");
    const count = (p) => during.filter((c) => c.procedure === p).length;
    assert.equal(count("GetStock"), 0, `GetStock called ${count("GetStock")} times while the stock was watched`);
    assert.ok(count("ReadMetrics") >= 2, `ReadMetrics called ${count("ReadMetrics")} times, want once a second`);
    console.log(`charts checked in ${Date.now() - chartsFrom} ms after ${sent} deducts; calls while watched: ${JSON.stringify(Object.fromEntries(
      [...new Set(during.map((c) => c.procedure))].map((p) => [p, count(p)])))}`);
    mkdirSync(artifacts, { recursive: true });
    await page.screenshot({ path: join(artifacts, "dashboard-charts.png"), fullPage: true });

    await page.fill("#token", token);
    await page.click("#token-form button");
    await page.waitForSelector("#token-state:text('set')", { timeout });

    // Create a SKU through the page: it is watched and shown with 4 shards.
    await page.click("summary");
    await page.fill("#create-sku", sku);
    await page.fill("#create-stock", "100");
    await page.fill("#create-shards", "4");
    await page.click("#create-form button");
    const box = `.sku[data-sku="${sku}"]`;
    await page.waitForSelector(`${box} [data-field=available]:text-is("100")`, { timeout });
    assert.equal(await page.locator(`${box} .shard`).count(), 4);
    // The bars' widths once all are drawn, read in the page in one go: read
    // apart from the wait, they were read 0 wide (three CI runs).
    const widths = (sel) => {
      const ws = [...document.querySelectorAll(sel)].map((b) => b.getBoundingClientRect().width);
      return ws.length > 0 && ws.every((w) => w > 0) ? ws : null;
    };
    const widthBefore = await (await page.waitForFunction(widths, `${box} .shard .available`, { timeout })).jsonValue();

    // Deduct from the script: the numbers and the bars move.
    for (let i = 0; i < 10; i++) {
      await inv.deduct({ sku, quantity: 3n, idempotencyKey: `${sku}-${i}` });
    }
    await page.waitForSelector(`${box} [data-field=available]:text-is("70")`, { timeout });
    await page.waitForSelector(`${box} [data-field=sold]:text-is("30")`, { timeout });
    const sum = (a) => a.reduce((x, y) => x + y, 0);
    const shrunk = await page.waitForFunction(([sel, before]) => {
      const ws = [...document.querySelectorAll(sel)].map((b) => b.getBoundingClientRect().width);
      return ws.reduce((x, y) => x + y, 0) < before ? ws : null;
    }, [`${box} .shard .available`, sum(widthBefore)], { timeout }).catch(() => null);
    assert.ok(shrunk, `available bars ${widthBefore}: they did not shrink`);

    // The ledger view labels a refund with the sale it reverses, and an
    // order's line with the order's reference.
    // The page follows the SKU's ledger from the moment it is selected
    // (fromNow): deduct until an entry shows, so the stream is live
    // before the refund and the order are made.
    await page.click(`${box} h3 a`);
    await page.waitForSelector(`#ledger-sku:text-is("of ${sku}")`, { timeout });
    for (let i = 0; ; i++) {
      await inv.deduct({ sku, quantity: 1n, idempotencyKey: `${sku}-live-${i}` });
      try {
        await page.waitForSelector("#ledger tbody tr", { timeout: 500 });
        break;
      } catch (err) {
        if (i >= 20) throw err;
      }
    }
    await inv.refund({ sku, idempotencyKey: `${sku}-refund`, original: { sale: { case: "deductKey", value: `${sku}-0` } }, quantity: 1n, reason: "payment failed" });
    await inv.reserveOrder({ idempotencyKey: `${sku}-order`, orderRef: `${sku}-cart`, lines: [{ sku, quantity: 2n }] });
    await page.waitForSelector(`#ledger tbody td:text-is("refund of deduct:${sku}-0")`, { timeout });
    await page.waitForSelector(`#ledger tbody td:text-is("reserve (order line ${sku}-cart)")`, { timeout });

    // Pause through the page: shown paused, and a deduct is refused.
    await page.click(`${box} button[data-action=pause]`);
    await page.waitForSelector(`${box} [data-field=status]:text-is("paused")`, { timeout });
    await assert.rejects(inv.deduct({ sku, quantity: 1n, idempotencyKey: `${sku}-paused` }), (err) => {
      assert.ok(err instanceof ConnectError);
      assert.equal(err.code, Code.FailedPrecondition);
      assert.equal(err.details.map((d) => d.debug?.reason).find(Boolean), "SKU_PAUSED");
      return true;
    });
    // A SKU under admission, searched for: its tokens outstanding and its
    // waitlist are charted in #admission, one sample a tick.
    const drop = `${demo}-drop`;
    const admissionFrom = Date.now();
    await admin.createSku({ sku: drop, initialStock: 2n, shards: 1, admission: { mode: AdmissionMode.TOKENS, waitlistMax: 5n } });
    for (let i = 0; i < 3; i++) await inv.requestToken({ sku: drop, quantity: 1n, idempotencyKey: `${drop}-${i}` });
    await page.fill("#search-prefix", drop);
    await page.click("#search-form button");
    const admitted = (key) => `#admission svg[data-series="${key}"]`;
    await page.waitForFunction((sel) => Number(document.querySelector(sel)?.dataset.points) >= 2, admitted("waitlistLength"), { timeout });
    const value = (key) => page.locator(admitted(key)).locator("xpath=..").locator(".value").textContent();
    assert.equal(await value("tokensOutstanding"), "2", "tokens outstanding charted");
    assert.equal(await value("waitlistLength"), "1", "waitlist charted");
    console.log(`admission charted in ${Date.now() - admissionFrom} ms`);
    // A SKU that sells by draw: its draw's state is shown above the charts.
    const lottery = `${demo}-lottery`;
    await admin.createSku({ sku: lottery, initialStock: 1n, shards: 1,
      admission: { mode: AdmissionMode.DRAW, waitlistMax: 5n, drawAt: { seconds: BigInt(Math.floor(Date.now() / 1000) + 3600), nanos: 0 } } });
    for (let i = 0; i < 2; i++) await inv.requestToken({ sku: lottery, quantity: 1n, idempotencyKey: `${lottery}-${i}`, customerRef: `c-${i}` });
    await page.fill("#search-prefix", lottery);
    await page.click("#search-form button");
    await page.waitForSelector("#admission .admission-draw:has-text('Draw: registering')", { timeout });
    const drawText = await page.locator("#admission .admission-draw").textContent();
    assert.match(drawText, /2 tickets; 0 winners; seed not recorded/, "draw state shown");
    // The topology panel shows every partition owned.
    await page.waitForSelector("#topology:has-text('256 of 256 partitions owned')", { timeout });

    const shot = join(artifacts, "dashboard.png");
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`screenshot: ${shot}`);
    assert.deepEqual(consoleErrors, [], "the page threw");
  } finally {
    await browser.close();
  }
});
