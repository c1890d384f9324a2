/**
 * The dashboard (issue #16, item 3) in headless Chromium while `herald bench fanout` loads
 * the server: signing in with the API key, figures arriving live over Herald's own
 * transport, every panel filled, and an operator's actions on a client from the page.
 * A screenshot is left in test-artifacts/dashboard.png.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { Browser, Page } from "playwright-core";
import { ARTIFACTS, launchChromium } from "./browser.js";
import { afterAll, beforeAll, expect, it } from "vitest";
import { client, next } from "../test/clients.js";
import { API_KEY, Herald, heraldBinary, Redis } from "../test/herald.js";


let browser: Browser;
let server: Herald;
let bench: ChildProcess | undefined;
const pageErrors: string[] = [];

beforeAll(async () => {
  browser = await launchChromium();
  // One new channel a minute per address (bursts of 2), so that the test can make a
  // refusal show in the "Clients refused by a limit" table without touching the rest.
  server = await Herald.start({ env: { HERALD_LIMITS__NEW_CHANNELS_PER_ADDRESS: "1" } });
});

afterAll(async () => {
  bench?.kill("SIGINT");
  await browser?.close();
  await server?.dispose();
  expect(pageErrors).toEqual([]);
});

/** The text of every cell of a table's body, row by row. */
function rows(page: Page, table: string): Promise<string[][]> {
  return page.$$eval(`#${table} tbody tr`, (trs) => trs.map((tr) => Array.from(tr.children).map((td) => td.textContent ?? "")));
}

it("signs in with the API key and shows live figures under load; an operator acts on a client", async () => {
  // Load: subscribers on one channel, publications at a steady rate, for longer than
  // this test needs (it is stopped at the end).
  bench = spawn(
    heraldBinary(),
    ["bench", "fanout", "--url", server.url, "--api-key", API_KEY, "--subscribers", "200", "--publications", "3000", "--rate", "40", "--workers", "1"],
    { stdio: "ignore" },
  );
  const context = await browser.newContext({ viewport: { width: 1280, height: 1000 } });
  const page = await context.newPage();
  page.on("pageerror", (e) => pageErrors.push(e.message));
  await page.goto(`${server.url}/dashboard`);

  // A wrong key is refused, and the page says why.
  await page.fill("#key", "not-the-key");
  await page.click("#signin button[type=submit]");
  await page.waitForFunction(() => (document.getElementById("signin-error")?.textContent ?? "").includes("wrong API key"));

  await page.fill("#key", API_KEY);
  await page.click("#signin button[type=submit]");
  await page.waitForSelector('body[data-state="connected"]');
  expect(await page.textContent("#state")).toBe("live over websocket");

  // Figures keep arriving: enough points for a line, and deliveries flowing.
  await page.waitForFunction(
    () => Number(document.body.dataset["points"]) >= 10 && Number(document.body.dataset["deliveries"]) > 100 && Number(document.body.dataset["deliveryP99"]) > 0,
    null,
    { timeout: 45_000 },
  );
  const nodes = await rows(page, "nodes");
  expect(nodes).toHaveLength(1);
  const [node, , connections, deliveries] = nodes[0]!;
  expect(node).toMatch(/^[A-Za-z0-9]+$/);
  expect(Number(connections)).toBeGreaterThanOrEqual(200);
  expect(Number(deliveries)).toBeGreaterThan(100);
  const legend = (chart: string) => page.$$eval(`#${chart} .u-legend .u-series .u-label`, (ls) => ls.map((l) => l.textContent ?? ""));
  expect(await legend("chart-connections")).toContain("websocket");
  expect(await legend("chart-deliveries")).toContain("websocket");
  expect(await legend("chart-latency")).toEqual(expect.arrayContaining(["publish p99", "delivery p99"]));
  const threads = await legend("chart-threads");
  expect(threads.some((t) => t.startsWith("herald-w-"))).toBe(true);
  expect(threads.some((t) => t.startsWith("herald-f-"))).toBe(true);
  const namespaces = await rows(page, "namespaces");
  expect(namespaces.length).toBeGreaterThan(0);
  expect(Number(namespaces[0]![1])).toBeGreaterThan(0);

  // Moving: the deliveries chart gains points between two looks.
  const points = Number(await page.evaluate(() => document.body.dataset["points"]));
  await page.waitForFunction((p) => Number(document.body.dataset["points"]) > p + 2, points, { timeout: 15_000 });
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, "dashboard.png"), fullPage: true });

  // An operator finds a client, unsubscribes it from its channel, then disconnects it.
  const c = client(server.url, { transports: "websocket" });
  const room = c.subscribe("chat:dashboard");
  const connected = next(c, "connected");
  c.connect();
  const { client: id } = await connected;
  await next(room, "subscribed");

  // Refusals by a limit show, by limit (issue #37): this address may make two channels by
  // publishing; the third is refused.
  const made = await Promise.allSettled(["a", "b", "c"].map((n) => c.publish(`chat:refused-${n}`, n)));
  expect(made.filter((m) => m.status === "rejected")).toHaveLength(1);
  await page.waitForFunction(() => (document.querySelector("#refusals tbody tr td")?.textContent ?? "") === "limits.new_channels_per_address", null, { timeout: 15_000 });
  expect((await rows(page, "refusals"))[0]).toEqual(["limits.new_channels_per_address", "1", "1"]);
  await page.selectOption("#lookup-kind", "client");
  await page.fill("#lookup-who", id);
  await page.click("#lookup button[type=submit]");
  await page.waitForFunction((cid) => document.querySelector("#connections tbody tr td")?.textContent === cid, id);
  expect((await rows(page, "connections"))[0]!.slice(1, 3)).toEqual(["", "websocket"]);
  const ended = next(room, "unsubscribed");
  await page.click("#connections tbody tr td:nth-child(6) button");
  expect(await ended).toMatchObject({ code: 120 });
  const dropped = next(c, "connecting");
  await page.click("#connections tbody tr td:nth-child(7) button");
  expect(await dropped).toMatchObject({ code: 3007 });
  c.disconnect();
  await context.close();
});

it("shows a node's broker: its lag and topology, and that it subscribed again after Redis cut it off", async () => {
  const redis = await Redis.start();
  const node = await Herald.start({ args: ["--storage", "redis", "--redis-url", redis.url] });
  const context = await browser.newContext();
  try {
    const page = await context.newPage();
    page.on("pageerror", (e) => pageErrors.push(e.message));
    await page.goto(`${node.url}/dashboard`);
    await page.fill("#key", API_KEY);
    await page.click("#signin button[type=submit]");
    const broker = () => page.$eval("#nodes tbody tr td:nth-child(10)", (td) => td.textContent ?? "").catch(() => "");
    await page.waitForFunction(() => / ms · single$/.test(document.querySelector("#nodes tbody tr td:nth-child(10)")?.textContent ?? ""), null, { timeout: 20_000 });
    // Redis drops the node's pub/sub connection (as a failover or a network cut would).
    const port = new URL(redis.url).port;
    execFileSync("redis-cli", ["-p", port, "CLIENT", "KILL", "TYPE", "pubsub"]);
    // Reachable again (a lag, not "unreachable"), and it says it subscribed again.
    await page.waitForFunction(() => /^\d+(\.\d+)? ms · single · resubscribed 1x$/.test(document.querySelector("#nodes tbody tr td:nth-child(10)")?.textContent ?? ""), null, { timeout: 20_000 });
    expect(await broker()).toMatch(/^\d+(\.\d+)? ms · single · resubscribed 1x$/);
  } finally {
    await context.close();
    await node.dispose();
    await redis.dispose();
  }
});
