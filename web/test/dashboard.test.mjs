// The dashboard in headless Chromium (Debian's chromium, driven by
// playwright-core) against a real shardstock allocator, whose address and
// admin token internal/e2e's TestE2E_Dashboard passes in SHARDSTOCK_URL and
// SHARDSTOCK_ADMIN_TOKEN: opened with the token in its address (as `make
// run` prints it), the page lists and shows a SKU created before it with
// no typing, and its charts move and grow under load; then enter the
// token, create a SKU through the page, deduct from this script, see the
// bars move, pause the SKU through the page, see it paused (and a deduct
// refused), and save screenshots.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";
import { createClient, ConnectError, Code } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { InventoryService } from "../gen/shardstock/v1/inventory_pb.js";
import { AdminService } from "../gen/shardstock/v1/admin_pb.js";

const baseUrl = process.env.SHARDSTOCK_URL;
const token = process.env.SHARDSTOCK_ADMIN_TOKEN;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const artifacts = resolve(process.env.ARTIFACTS_DIR || "../tmp/artifacts");
const sku = `dash-${process.pid}`;
const demo = `demo-${process.pid}`;
const timeout = 15_000;

test("the dashboard shows stock moving and pauses a SKU", { timeout: 60_000 }, async () => {
  assert.ok(baseUrl, "SHARDSTOCK_URL is not set");
  const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--headless=new"] });
  try {
    const page = await browser.newPage();
    const consoleErrors = [];
    page.on("pageerror", (e) => consoleErrors.push(String(e)));
    // A SKU selling before the page opens, as make run's demo SKU: listed
    // and shown with no typing, the token coming in the address.
    const bearer = (next) => async (req) => { req.header.set("Authorization", `Bearer ${token}`); return next(req); };
    const inv = createClient(InventoryService, createConnectTransport({ baseUrl, interceptors: [bearer] })); // an admin may act as a service
    const admin = createClient(AdminService, createConnectTransport({ baseUrl, interceptors: [bearer] }));
    await admin.createSku({ sku: demo, initialStock: 100000n, shards: 4 });
    await page.goto(`${baseUrl}/#token=${encodeURIComponent(token)}`);
    await page.waitForSelector(`#sku-list tr[data-sku="${demo}"]`, { timeout });
    await page.waitForSelector(`.sku[data-sku="${demo}"] [data-field=available]`, { timeout });
    assert.ok(!(await page.evaluate(() => location.hash)).includes("token"), "the token stayed in the address");

    // Under load the charts move and grow: their data differ between two
    // reads, and hold more points.
    const chartsFrom = Date.now();
    let load = true;
    const loading = (async () => {
      for (let i = 0; load; i++) await inv.deduct({ sku: demo, quantity: 1n, idempotencyKey: `${demo}-${i}` });
    })();
    const chartData = () => page.locator("#charts svg.chart").evaluateAll((svgs) =>
      svgs.map((s) => ({ series: s.dataset.series, points: Number(s.dataset.points), line: s.querySelector("polyline").getAttribute("points") })));
    await page.waitForFunction(() => Number(document.querySelector('#charts svg[data-series="soldPerSec"]').dataset.points) >= 2, null, { timeout });
    const first = await chartData();
    await page.waitForFunction((n) => Number(document.querySelector('#charts svg[data-series="available"]').dataset.points) >= n + 2,
      first.find((c) => c.series === "available").points, { timeout });
    const second = await chartData();
    load = false;
    await loading;
    assert.ok(first.length >= 5, `${first.length} charts, want sold per second, stock left, reservations, in transit, sell-out`);
    for (const key of ["soldPerSec", "available"]) {
      const a = first.find((c) => c.series === key), b = second.find((c) => c.series === key);
      assert.ok(b.points > a.points, `chart ${key}: ${a.points} -> ${b.points} points, want more under load`);
      assert.notEqual(b.line, a.line, `chart ${key} did not move under load`);
    }
    mkdirSync(artifacts, { recursive: true });
    await page.screenshot({ path: join(artifacts, "dashboard-charts.png"), fullPage: true });
    console.log(`charts checked in ${Date.now() - chartsFrom} ms`);

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
    const widthBefore = await page.locator(`${box} .shard .available`).evaluateAll((bars) => bars.map((b) => b.getBoundingClientRect().width));

    // Deduct from the script: the numbers and the bars move.
    for (let i = 0; i < 10; i++) {
      await inv.deduct({ sku, quantity: 3n, idempotencyKey: `${sku}-${i}` });
    }
    await page.waitForSelector(`${box} [data-field=available]:text-is("70")`, { timeout });
    await page.waitForSelector(`${box} [data-field=sold]:text-is("30")`, { timeout });
    const widthAfter = await page.locator(`${box} .shard .available`).evaluateAll((bars) => bars.map((b) => b.getBoundingClientRect().width));
    const sum = (a) => a.reduce((x, y) => x + y, 0);
    assert.ok(sum(widthAfter) < sum(widthBefore), `available bars ${widthBefore} -> ${widthAfter}: they did not shrink`);

    // Pause through the page: shown paused, and a deduct is refused.
    await page.click(`${box} button[data-action=pause]`);
    await page.waitForSelector(`${box} [data-field=status]:text-is("paused")`, { timeout });
    await assert.rejects(inv.deduct({ sku, quantity: 1n, idempotencyKey: `${sku}-paused` }), (err) => {
      assert.ok(err instanceof ConnectError);
      assert.equal(err.code, Code.FailedPrecondition);
      assert.equal(err.details.map((d) => d.debug?.reason).find(Boolean), "SKU_PAUSED");
      return true;
    });
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
