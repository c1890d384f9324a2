/**
 * phoenix.js in headless Chromium, loaded from npm unchanged by a page of another origin
 * (allowed by `allowed_origins`): two pages join one topic, and what one pushes both hear;
 * what Herald's API publishes arrives as the event it names.
 */
import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { createRequire } from "node:module";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, expect, it } from "vitest";
import { Herald } from "../test/herald.js";
import { phoenixConfig } from "../test/phoenix.js";
import { launchChromium } from "./browser.js";

const require = createRequire(import.meta.url);
const PHOENIX_JS = readFileSync(require.resolve("phoenix").replace("phoenix.cjs.js", "phoenix.min.js"));

let browser: Browser;
let herald: Herald;
let app: Server;
let appOrigin: string;

beforeAll(async () => {
  browser = await launchChromium();
  app = createServer((req, res) => {
    if (req.url === "/phoenix.js") {
      res.setHeader("content-type", "text/javascript");
      res.end(PHOENIX_JS);
      return;
    }
    res.setHeader("content-type", "text/html");
    res.end(`<!doctype html><title>app</title><script src="/phoenix.js"></script>`);
  });
  await new Promise<void>((resolve) => app.listen(0, "127.0.0.1", resolve));
  appOrigin = `http://127.0.0.1:${(app.address() as AddressInfo).port}`;
  herald = await Herald.start({ args: ["--config", phoenixConfig(), "--allowed-origin", appOrigin] });
});

afterAll(async () => {
  await browser?.close();
  await herald?.dispose();
  await new Promise((resolve) => app?.close(resolve));
});

/** A page whose phoenix.js socket joined `topic`, collecting `new_msg` and `alert`. */
async function member(topic: string): Promise<Page> {
  const page = await browser.newPage();
  await page.goto(`${appOrigin}/`);
  await page.evaluate(
    ({ port, topic }) =>
      new Promise<void>((resolve, reject) => {
        const w = window as any;
        w.got = [];
        const socket = new w.Phoenix.Socket(`ws://127.0.0.1:${port}/socket`, { params: {} });
        socket.connect();
        const channel = socket.channel(topic, {});
        channel.on("new_msg", (p: unknown) => w.got.push({ new_msg: p }));
        channel.on("alert", (p: unknown) => w.got.push({ alert: p }));
        channel.join().receive("ok", () => resolve()).receive("error", reject);
        w.channel = channel;
      }),
    { port: herald.port, topic },
  );
  return page;
}

async function collected(page: Page, count: number): Promise<unknown[]> {
  await page.waitForFunction((n) => (window as any).got.length >= n, count, { timeout: 20_000 });
  return page.evaluate(() => (window as any).got);
}

it("two pages on one topic hear what either pushes, and what the API publishes", async () => {
  const a = await member("chat:browser");
  const b = await member("chat:browser");
  await a.evaluate(() => (window as any).channel.push("new_msg", { body: "from a" }));
  expect(await collected(b, 1)).toEqual([{ new_msg: { body: "from a" } }]);
  expect(await collected(a, 1)).toEqual([{ new_msg: { body: "from a" } }]);
  await herald.publish("chat:browser", { event: "alert", data: { level: 1 } });
  expect(await collected(b, 2)).toEqual([{ new_msg: { body: "from a" } }, { alert: { level: 1 } }]);
});
