// Connect and gRPC-Web clients from Node (@connectrpc/connect-web, the
// transports a browser uses) against a real shardstock allocator, whose
// address, admin token and a service JWT (signed by a key of the
// allocator's JWKS) internal/e2e's TestE2E_WebClients passes in
// SHARDSTOCK_URL, SHARDSTOCK_ADMIN_TOKEN and SHARDSTOCK_SERVICE_JWT: create
// a SKU, then reserve and commit through each transport with the JWT, see
// a call without a credential refused, read the stock back without one (no
// internals), and watch it sell out and come back over gRPC-Web
// (WatchStock, open to callers without a credential), as a storefront would.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createClient, ConnectError, Code } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";
import { InventoryService, StockEvent } from "../gen/shardstock/v1/inventory_pb.js";
import { AdminService } from "../gen/shardstock/v1/admin_pb.js";

const baseUrl = process.env.SHARDSTOCK_URL;
const token = process.env.SHARDSTOCK_ADMIN_TOKEN;
const sku = `web-${process.pid}`;

const jwt = process.env.SHARDSTOCK_SERVICE_JWT;
const withBearer = (credential) => (next) => async (req) => {
  req.header.set("Authorization", `Bearer ${credential}`);
  return next(req);
};
const bearer = withBearer(token);

test("admin over Connect creates a SKU", async () => {
  assert.ok(baseUrl, "SHARDSTOCK_URL is not set");
  const admin = createClient(AdminService, createConnectTransport({ baseUrl, interceptors: [bearer] }));
  const res = await admin.createSku({ sku, initialStock: 10n, shards: 2 });
  assert.equal(res.sku?.sku, sku);
  assert.equal(res.stock?.available, 10n);
});

for (const [name, transport, anonymous] of [
  ["Connect", createConnectTransport({ baseUrl, interceptors: [withBearer(jwt)] }), createConnectTransport({ baseUrl })],
  ["gRPC-Web", createGrpcWebTransport({ baseUrl, interceptors: [withBearer(jwt)] }), createGrpcWebTransport({ baseUrl })],
]) {
  test(`without a credential, no reserve over ${name}`, async () => {
    assert.ok(jwt, "SHARDSTOCK_SERVICE_JWT is not set");
    const inv = createClient(InventoryService, anonymous);
    await assert.rejects(inv.reserve({ sku, quantity: 1n, idempotencyKey: `${sku}-${name}-anonymous` }), (err) => {
      assert.ok(err instanceof ConnectError);
      assert.equal(err.code, Code.Unauthenticated);
      return true;
    });
  });

  test(`reserve and commit over ${name} with a service JWT`, async () => {
    const inv = createClient(InventoryService, transport);
    const key = `${sku}-${name}`;
    const r = await inv.reserve({ sku, quantity: 2n, idempotencyKey: key });
    assert.equal(r.reservation?.quantity, 2n);
    const again = await inv.reserve({ sku, quantity: 2n, idempotencyKey: key });
    assert.equal(again.replayed, true);
    const c = await inv.commit({ reservationId: r.reservation.reservationId });
    assert.equal(c.reservation?.reservationId, r.reservation.reservationId);
    await assert.rejects(inv.deduct({ sku, quantity: 100n, idempotencyKey: `${key}-big` }), (err) => {
      assert.ok(err instanceof ConnectError);
      assert.equal(err.code, Code.FailedPrecondition);
      return true;
    });
  });
}

test("the stock shows both commits, and no server to a caller without a credential", async () => {
  const inv = createClient(InventoryService, createConnectTransport({ baseUrl }));
  const st = await inv.getStock({ sku });
  assert.equal(st.stock?.sold, 4n);
  assert.equal(st.stock?.available, 6n);
  assert.equal(st.stock?.shards.length, 2);
  assert.ok(st.stock.shards.every((s) => s.serverId === "" && s.haltedReason === ""));
});

test("WatchStock over gRPC-Web: SOLD_OUT within a second of the last unit, BACK_IN_STOCK after a replenish", async () => {
  const inv = createClient(InventoryService, createConnectTransport({ baseUrl, interceptors: [withBearer(jwt)] }));
  const watcher = createClient(InventoryService, createGrpcWebTransport({ baseUrl }));
  const abort = new AbortController();
  const stream = watcher.watchStock({ skus: [sku] }, { signal: abort.signal })[Symbol.asyncIterator]();
  const next = async (what) => {
    const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error(`no ${what} within 10 s`)), 10_000));
    const { value, done } = await Promise.race([stream.next(), timeout]);
    assert.ok(!done, `WatchStock ended waiting for ${what}`);
    return value;
  };
  try {
    const first = await next("snapshot");
    assert.equal(first.event, StockEvent.SNAPSHOT);
    assert.equal(first.stock?.available, 6n);
    await inv.deduct({ sku, quantity: 6n, idempotencyKey: `${sku}-last-units` });
    const soldAt = Date.now();
    let m = await next("SOLD_OUT");
    while (m.event === StockEvent.CHANGED) m = await next("SOLD_OUT");
    assert.equal(m.event, StockEvent.SOLD_OUT);
    assert.ok(Date.now() - soldAt < 1000, `SOLD_OUT ${Date.now() - soldAt} ms after the last unit sold`);
    await inv.replenish({ sku, quantity: 3n, idempotencyKey: `${sku}-back` });
    m = await next("BACK_IN_STOCK");
    assert.equal(m.event, StockEvent.BACK_IN_STOCK);
    assert.equal(m.stock?.available, 3n);
  } finally {
    abort.abort();
  }
});
