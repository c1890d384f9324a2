/**
 * The deployment files as an operator copies them (issue #37), in headless Chromium: nginx
 * from `deploy/nginx.conf` in front of two nodes started with `deploy/herald.toml` on one
 * Redis, reached by its public name (`chat.example.com`, resolved to 127.0.0.1 by the
 * browser) on non-default ports, over HTTP and over TLS (HTTP/2). On every transport a page
 * of that origin subscribes, receives a publication the API made through nginx, and sends
 * one of its own.
 */
import type { Browser, BrowserContext } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { API_KEY, Herald, Redis } from "../test/herald.js";
import { DEPLOY, freePort, HOST_NAME, Nginx } from "../test/nginx.js";
import { join } from "node:path";
import { launchChromium } from "./browser.js";

const TRANSPORTS = ["websocket", "sse", "stream", "iframe", "longpoll", "poll"] as const;

let redis: Redis;
let nodes: Herald[] = [];
let nginx: Nginx;
let browser: Browser;
let context: BrowserContext;

beforeAll(async () => {
  redis = await Redis.start();
  const ports = [await freePort(), await freePort()] as [number, number];
  nodes = await Promise.all(
    ports.map((port) => Herald.start({ listen: `127.0.0.1:${port}`, args: ["--config", join(DEPLOY, "herald.toml"), "--redis-url", redis.url] })),
  );
  nginx = await Nginx.start(ports);
  browser = await launchChromium([`--host-resolver-rules=MAP ${HOST_NAME} 127.0.0.1`]);
  // The test's certificate is its own, not a CA's.
  context = await browser.newContext({ ignoreHTTPSErrors: true });
});

afterAll(async () => {
  await context?.close();
  await browser?.close();
  await nginx?.dispose();
  await Promise.all(nodes.map((n) => n.dispose()));
  await redis?.dispose();
});

const SCHEMES = [
  ["http", () => `http://${HOST_NAME}:${nginx.http}`],
  ["https", () => `https://${HOST_NAME}:${nginx.https}`],
] as const;

describe.each(SCHEMES)("through the documented nginx over %s", (scheme, base) => {
  it("serves the pages", async () => {
    const p = await context.newPage();
    for (const path of ["/healthz", "/chat", "/dashboard", "/herald.js"]) {
      const answer = await p.goto(`${base()}${path}`);
      expect(answer?.status(), path).toBe(200);
    }
    if (scheme === "https") {
      const protocol = await p.evaluate(() => (performance.getEntriesByType("navigation")[0] as PerformanceNavigationTiming).nextHopProtocol);
      expect(protocol).toBe("h2");
    }
    await p.close();
  });

  it.each(TRANSPORTS)("receives and sends over %s", async (transport) => {
    const channel = `chat:nginx-${scheme}-${transport}`;
    const p = await context.newPage();
    await p.goto(`${base()}/healthz`);
    await p.addScriptTag({ url: `${base()}/herald.js` });
    await p.evaluate(
      ({ transport, channel }) => {
        const w = window as unknown as Record<string, any>;
        w.received = [];
        w.events = [];
        const client = new w.Herald.Client(undefined, { transports: transport, minReconnectDelay: 100, pollInterval: 200 });
        client.on("disconnected", (e: { code: number }) => w.events.push(`disconnected:${e.code}`));
        const sub = client.newSubscription(channel);
        sub.on("subscribed", () => w.events.push("subscribed"));
        sub.on("error", (e: { code: number }) => w.events.push(`error:${e.code}`));
        sub.on("publication", (pub: { data: unknown }) => w.received.push(pub.data));
        sub.subscribe();
        client.connect();
        w.client = client;
        w.sub = sub;
      },
      { transport, channel },
    );
    await p.waitForFunction(() => (window as any).events.includes("subscribed"), undefined, { timeout: 20_000 });
    // The backend publishes through nginx's /api/ (this machine is on its allow list).
    const status = await p.evaluate(
      async ({ channel, key }) => {
        const r = await fetch("/api/publish", { method: "POST", headers: { Authorization: `apikey ${key}`, "Content-Type": "application/json" }, body: JSON.stringify({ channel, data: "from the api" }) });
        return r.status;
      },
      { channel, key: API_KEY },
    );
    expect(status).toBe(200);
    await p.waitForFunction(() => (window as any).received.length >= 1, undefined, { timeout: 20_000 });
    // The page sends: a WebSocket frame, or POST /connection/send through either node.
    await p.evaluate(() => (window as any).sub.publish("from the page"));
    await p.waitForFunction(() => (window as any).received.length >= 2, undefined, { timeout: 20_000 });
    expect(await p.evaluate(() => (window as any).received)).toEqual(["from the api", "from the page"]);
    expect(await p.evaluate(() => (window as any).events)).toEqual(["subscribed"]);
    await p.close();
  });
});
