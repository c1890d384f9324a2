/**
 * A page served from another origin than Herald's (docs/sdk.md's "A first page" opened from
 * another port, the first thing a newcomer tries), in headless Chromium: the SDK must stop
 * and say which origin to add to `allowed_origins`, not cycle through the transports with
 * "connection closed" forever.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { Browser } from "playwright-core";
import { launchChromium } from "./browser.js";
import { afterAll, beforeAll, expect, it } from "vitest";
import { Herald } from "../test/herald.js";


let browser: Browser;
let herald: Herald;
let other: Server;
let otherOrigin: string;

beforeAll(async () => {
  browser = await launchChromium();
  herald = await Herald.start();
  // The application's own page, on another port: another origin.
  other = createServer((_, res) => {
    res.setHeader("content-type", "text/html");
    res.end("<!doctype html><title>another origin</title><p>app</p>");
  });
  await new Promise<void>((resolve) => other.listen(0, "127.0.0.1", resolve));
  otherOrigin = `http://127.0.0.1:${(other.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await browser?.close();
  await herald?.dispose();
  await new Promise((resolve) => other?.close(resolve));
});

it("a page of an origin the server refuses stops and says what to add to allowed_origins", async () => {
  const page = await browser.newPage();
  await page.goto(`${otherOrigin}/`);
  await page.addScriptTag({ url: `${herald.url}/herald.js` });
  await page.evaluate((url) => {
    const w = window as unknown as Record<string, any>;
    w.events = [];
    const client = new w.Herald.Client(url, { minReconnectDelay: 50 });
    for (const name of ["connecting", "connected", "disconnected"]) {
      client.on(name, (e: { code?: number; reason?: string; transport?: string }) =>
        w.events.push({ name, code: e.code, reason: e.reason, transport: e.transport }),
      );
    }
    client.newSubscription("chat:lobby").subscribe();
    client.connect();
    w.client = client;
  }, herald.url);
  await page.waitForFunction(() => (window as any).events.some((e: { name: string }) => e.name === "disconnected"), undefined, {
    timeout: 20_000,
  });
  const events = (await page.evaluate(() => (window as any).events)) as { name: string; code: number; reason: string; transport?: string }[];
  const end = events.find((e) => e.name === "disconnected")!;
  expect(end.code).toBe(3502);
  expect(end.reason).toContain(`origin "${otherOrigin}" is not allowed; add it to allowed_origins`);
  // One pass along the transports at most, then stopped for good.
  expect(events.filter((e) => e.name === "connecting").length).toBeLessThanOrEqual(5);
  expect(events.some((e) => e.name === "connected")).toBe(false);
  expect(await page.evaluate(() => (window as any).client.state)).toBe("disconnected");
  await page.close();
});
