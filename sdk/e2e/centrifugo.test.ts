/**
 * centrifuge-js in headless Chromium, its browser build loaded from npm unchanged by a page
 * of another origin (allowed by `allowed_origins`), against Herald's Centrifugo front: two
 * pages on one channel hear what either publishes and what Herald's API publishes, with
 * the Protobuf build too.
 */
import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { createRequire } from "node:module";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, expect, it } from "vitest";
import { Herald } from "../test/herald.js";
import { launchChromium } from "./browser.js";

const require = createRequire(import.meta.url);
const dist = require.resolve("centrifuge").replace(/build[/\\]index\.js$/, "dist/");
const BUILDS: Record<string, Buffer> = {
  "/centrifuge.js": readFileSync(`${dist}centrifuge.js`),
  "/centrifuge.protobuf.js": readFileSync(`${dist}centrifuge.protobuf.js`),
};

let browser: Browser;
let herald: Herald;
let app: Server;
let appOrigin: string;

beforeAll(async () => {
  browser = await launchChromium();
  app = createServer((req, res) => {
    const build = BUILDS[req.url ?? ""];
    if (build !== undefined) {
      res.setHeader("content-type", "text/javascript");
      res.end(build);
      return;
    }
    const script = req.url === "/protobuf" ? "/centrifuge.protobuf.js" : "/centrifuge.js";
    res.setHeader("content-type", "text/html");
    res.end(`<!doctype html><title>app</title><script src="${script}"></script>`);
  });
  await new Promise<void>((resolve) => app.listen(0, "127.0.0.1", resolve));
  appOrigin = `http://127.0.0.1:${(app.address() as AddressInfo).port}`;
  herald = await Herald.start({ args: ["--allowed-origin", appOrigin] });
});

afterAll(async () => {
  await browser?.close();
  await herald?.dispose();
  await new Promise((resolve) => app?.close(resolve));
});

/** A page subscribed to `channel` with centrifuge-js (`path`: its JSON or Protobuf build),
 * collecting the publications' data as JSON. */
async function member(channel: string, path = "/"): Promise<Page> {
  const page = await browser.newPage();
  await page.goto(`${appOrigin}${path}`);
  await page.evaluate(
    ({ port, channel }) =>
      new Promise<void>((resolve, reject) => {
        const w = window as any;
        w.got = [];
        const client = new w.Centrifuge(`ws://127.0.0.1:${port}/centrifugo/connection/websocket`);
        const sub = client.newSubscription(channel);
        sub.on("publication", (ctx: { data: unknown }) =>
          w.got.push(ctx.data instanceof Uint8Array ? JSON.parse(new TextDecoder().decode(ctx.data)) : ctx.data),
        );
        sub.on("subscribed", () => resolve());
        sub.on("unsubscribed", (ctx: unknown) => reject(new Error(JSON.stringify(ctx))));
        sub.subscribe();
        client.connect();
        w.sub = sub;
      }),
    { port: herald.port, channel },
  );
  return page;
}

async function collected(page: Page, count: number): Promise<unknown[]> {
  await page.waitForFunction((n) => (window as any).got.length >= n, count, { timeout: 20_000 });
  return page.evaluate(() => (window as any).got);
}

it("two pages, JSON and Protobuf, hear what either publishes and what the API publishes", async () => {
  const json = await member("chat:centrifuge-browser");
  const protobuf = await member("chat:centrifuge-browser", "/protobuf");
  await json.evaluate(() => (window as any).sub.publish({ text: "from the JSON page" }));
  await protobuf.evaluate(() =>
    (window as any).sub.publish(new TextEncoder().encode(JSON.stringify({ text: "from the Protobuf page" }))),
  );
  await herald.publish("chat:centrifuge-browser", { text: "from the API" });
  const expected = [{ text: "from the JSON page" }, { text: "from the Protobuf page" }, { text: "from the API" }];
  expect(await collected(json, 3)).toEqual(expected);
  expect(await collected(protobuf, 3)).toEqual(expected);
});
