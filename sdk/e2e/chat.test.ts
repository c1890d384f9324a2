/**
 * The chat demo in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core):
 * every transport both ways, recovery after a server restart with nothing lost or doubled,
 * and the automatic fallback when WebSocket is blocked.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { ARTIFACTS, launchChromium } from "./browser.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Herald } from "../test/herald.js";

const TRANSPORTS = ["ws", "sse", "stream", "iframe", "longpoll", "poll"] as const;
const SHOWN: Record<string, string> = { ws: "websocket" };

let browser: Browser;
let server: Herald;
const pageErrors: string[] = [];

beforeAll(async () => {
  browser = await launchChromium();
  server = await Herald.start();
});

afterAll(async () => {
  await browser?.close();
  await server?.dispose();
  expect(pageErrors).toEqual([]);
});

async function openChat(url: string, query: string, context?: BrowserContext): Promise<Page> {
  const ctx = context ?? (await browser.newContext({ viewport: { width: 900, height: 560 } }));
  const page = await ctx.newPage();
  page.on("pageerror", (e) => pageErrors.push(`${query}: ${e.message}`));
  await page.goto(`${url}/chat?${query}`, { waitUntil: "domcontentloaded" });
  await page.waitForSelector('body[data-state="connected"]');
  return page;
}

async function speak(page: Page, nick: string, text: string): Promise<void> {
  await page.fill("#nick", nick);
  await page.fill("#text", text);
  await page.click("#speak");
}

/** The texts shown, in page order. */
async function texts(page: Page): Promise<string[]> {
  return page.$$eval("#messages li .text", (items) => items.map((i) => i.textContent ?? ""));
}

async function waitForText(page: Page, text: string): Promise<void> {
  await page.waitForFunction(
    (t) => Array.from(document.querySelectorAll("#messages li .text")).some((i) => i.textContent === t),
    text,
  );
}

describe.each(TRANSPORTS)("transport=%s", (transport) => {
  it("two pages chat both ways; the page shows its transport and state", async () => {
    const room = `e2e-${transport}`;
    const alice = await openChat(server.url, `transport=${transport}&room=${room}`);
    const bob = await openChat(server.url, `transport=${transport}&room=${room}`);
    for (const page of [alice, bob]) {
      expect(await page.textContent("#transport")).toBe(SHOWN[transport] ?? transport);
      expect(await page.textContent("#state")).toBe("connected");
      expect(await page.textContent("#title")).toBe(`Herald chat: #${room}`);
    }
    const hostile = `hi bob <img src=x onerror="window.__pwned=1"> <b>bold</b> via ${transport}`;
    await speak(alice, "alice", hostile);
    await waitForText(bob, hostile);
    await speak(bob, "bob", `hello alice via ${transport}`);
    await waitForText(alice, `hello alice via ${transport}`);
    // Shown as text: no element was made from it and nothing ran.
    expect(await bob.$$eval("#messages img, #messages b", (n) => n.length)).toBe(0);
    expect(await bob.evaluate(() => (window as unknown as { __pwned?: number }).__pwned)).toBeUndefined();
    expect(await alice.$eval("#messages li:first-child .nick", (n) => n.textContent)).toBe("alice");
    // A newcomer sees the conversation from history.
    const carol = await openChat(server.url, `transport=${transport}&room=${room}`);
    await waitForText(carol, `hello alice via ${transport}`);
    expect(await texts(carol)).toEqual([hostile, `hello alice via ${transport}`]);
    for (const page of [alice, bob, carol]) await page.context().close();
  });
});

describe("compression", () => {
  it("Chromium negotiates permessage-deflate over /chat and chats both ways with long messages", async () => {
    const room = "e2e-deflate";
    const ctx = await browser.newContext({ viewport: { width: 900, height: 560 } });
    const page = await ctx.newPage();
    // The handshake's answer, as Chromium's network stack saw it.
    const cdp = await ctx.newCDPSession(page);
    await cdp.send("Network.enable");
    const answers: string[] = [];
    cdp.on("Network.webSocketHandshakeResponseReceived", (e) => {
      const headers = e.response.headers as Record<string, string>;
      const key = Object.keys(headers).find((k) => k.toLowerCase() === "sec-websocket-extensions");
      answers.push(key ? headers[key]! : "");
    });
    page.on("pageerror", (e) => pageErrors.push(`deflate: ${e.message}`));
    await page.goto(`${server.url}/chat?transport=ws&room=${room}`, { waitUntil: "domcontentloaded" });
    await page.waitForSelector('body[data-state="connected"]');
    const other = await openChat(server.url, `transport=ws&room=${room}`);
    expect(answers).toEqual(["permessage-deflate; server_no_context_takeover; client_no_context_takeover"]);
    // Longer than websocket.compression_min_size both ways: Chromium compresses what it
    // sends, Herald what it pushes.
    const long = `${"a long line that compresses well, ".repeat(8)}from Chromium`;
    await speak(page, "alice", long);
    await waitForText(other, long);
    const reply = `${"an answer that compresses well too, ".repeat(8)}from the other page`;
    await speak(other, "bob", reply);
    await waitForText(page, reply);
    expect(await texts(page)).toEqual([long, reply]);
    await ctx.close();
  });
});

describe("forever frame", () => {
  it("the page's load event fires while messages keep flowing", async () => {
    const context = await browser.newContext({ viewport: { width: 900, height: 560 } });
    const page = await context.newPage();
    page.on("pageerror", (e) => pageErrors.push(`iframe load: ${e.message}`));
    // The page's own `load`, as an application's onload code would see it.
    await page.addInitScript(() => window.addEventListener("load", () => (document.documentElement.dataset["loaded"] = "yes")));
    // Waiting for `load` (Playwright's default) used to time out: the frame held it forever.
    await page.goto(`${server.url}/chat?transport=iframe&room=e2e-onload`, { waitUntil: "load", timeout: 10_000 });
    await page.waitForSelector('body[data-state="connected"]');
    expect(await page.evaluate(() => [document.readyState, document.documentElement.dataset["loaded"]])).toEqual(["complete", "yes"]);
    expect(await page.textContent("#transport")).toBe("iframe");
    // Messages flow both ways after `load`.
    const other = await openChat(server.url, "transport=ws&room=e2e-onload");
    await speak(other, "ws", "to the frame");
    await waitForText(page, "to the frame");
    await speak(page, "frame", "from the frame");
    await waitForText(other, "from the frame");
    await context.close();
    await other.context().close();
  });
});

describe("who is here", () => {
  it("three pages see each other, and the others see one leave", async () => {
    const room = "e2e-presence";
    const pages = [
      await openChat(server.url, `transport=ws&room=${room}`),
      await openChat(server.url, `transport=sse&room=${room}`),
      await openChat(server.url, `transport=longpoll&room=${room}`),
    ];
    const here = (count: number) => (page: Page) =>
      page.waitForFunction((n) => document.querySelectorAll("#members li").length === n && document.getElementById("here")?.textContent === String(n), count, { timeout: 15_000 });
    await Promise.all(pages.map(here(3)));
    const ids = await Promise.all(pages.map((p) => p.$$eval("#members li", (items) => items.map((i) => (i as HTMLElement).dataset["client"]).sort())));
    expect(ids[1]).toEqual(ids[0]);
    expect(ids[2]).toEqual(ids[0]);
    mkdirSync(ARTIFACTS, { recursive: true });
    await pages[0]!.screenshot({ path: join(ARTIFACTS, "chat-presence.png") });
    // The third page goes away: after the server's reconnect grace, the others show two.
    await pages[2]!.context().close();
    await Promise.all(pages.slice(0, 2).map(here(2)));
    for (const page of pages.slice(0, 2)) await page.context().close();
  });
});

describe("recovery", () => {
  it.each(TRANSPORTS)("transport=%s: after a server restart every message shows exactly once", async (transport) => {
    const first = await Herald.start();
    const dataDir = first.dataDir;
    let live = first;
    const room = `restart-${transport}`;
    try {
      const page = await openChat(live.url, `transport=${transport}&room=${room}`);
      await live.publish(`chat:${room}`, { nick: "api", text: "before" });
      await waitForText(page, "before");
      const port = live.port;
      await live.stop();
      await page.waitForSelector('body[data-state="connecting"]');
      // Published while the page cannot reach any server: only history can bring these.
      const aside = await Herald.start({ dataDir });
      for (const n of [1, 2, 3]) await aside.publish(`chat:${room}`, { nick: "api", text: `missed ${n}` });
      await aside.stop();
      live = await Herald.start({ dataDir, listen: `127.0.0.1:${port}` });
      await page.waitForSelector('body[data-state="connected"]', { timeout: 30_000 });
      await live.publish(`chat:${room}`, { nick: "api", text: "after" });
      await waitForText(page, "after");
      expect(await texts(page)).toEqual(["before", "missed 1", "missed 2", "missed 3", "after"]);
      const offsets = await page.$$eval("#messages li", (items) => items.map((i) => Number((i as HTMLElement).dataset["offset"])));
      expect(offsets).toEqual([1, 2, 3, 4, 5]);
      expect(await page.isHidden("#notice")).toBe(true);
      await page.context().close();
    } finally {
      await live.dispose();
    }
  });
});

describe("automatic transport", () => {
  it("uses WebSocket when it can", async () => {
    const page = await openChat(server.url, "room=auto");
    expect(await page.textContent("#transport")).toBe("websocket");
    await page.context().close();
  });

  it("with WebSocket blocked, falls back and still chats both ways", async () => {
    const blocked = await browser.newContext({ viewport: { width: 900, height: 560 } });
    // As a network that refuses the upgrade: every WebSocket fails at once.
    await blocked.addInitScript(() => {
      class Refused extends EventTarget {
        readyState = 3;
        onopen: ((e: Event) => void) | null = null;
        onerror: ((e: Event) => void) | null = null;
        onclose: ((e: CloseEvent) => void) | null = null;
        onmessage: ((e: MessageEvent) => void) | null = null;
        constructor() {
          super();
          setTimeout(() => {
            this.onerror?.(new Event("error"));
            this.onclose?.(new CloseEvent("close", { code: 1006 }));
          });
        }
        send(): void {}
        close(): void {}
      }
      (window as unknown as { WebSocket: unknown }).WebSocket = Refused;
    });
    const fallback = await openChat(server.url, "room=fallback", blocked);
    const fallbackTransport = await fallback.textContent("#transport");
    expect(fallbackTransport).toBe("sse");
    const normal = await openChat(server.url, "room=fallback");
    expect(await normal.textContent("#transport")).toBe("websocket");
    await speak(fallback, "blocked", "hello from behind the firewall");
    await waitForText(normal, "hello from behind the firewall");
    await speak(normal, "open", "hello back");
    await waitForText(fallback, "hello back");

    mkdirSync(ARTIFACTS, { recursive: true });
    const screenshot = join(ARTIFACTS, "chat.png");
    await normal.screenshot({ path: screenshot });
    console.log(`chat page screenshot: ${screenshot}`);
    await blocked.close();
    await normal.context().close();
  });
});
