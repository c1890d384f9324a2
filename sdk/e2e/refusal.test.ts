/**
 * A room the application's backend refuses, in headless Chromium on every transport
 * (issue #29): the server is configured as docs/hooks.md's "Try it", with its example
 * backend (a real Node HTTP server), whose subscribe hook keeps `room:staff` for alice. An
 * anonymous page that asks for the staff room and a lobby at once gets `unsubscribed` with
 * the backend's code for the first, the lobby's publications, and no disconnect.
 */
import type { Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTryIt, type TryIt } from "../test/example.js";
import type { Herald } from "../test/herald.js";
import { launchChromium } from "./browser.js";

const TRANSPORTS = ["websocket", "sse", "stream", "iframe", "longpoll", "poll"] as const;

let browser: Browser;
let tryIt: TryIt;
let server: Herald;

beforeAll(async () => {
  tryIt = await startTryIt();
  server = tryIt.server;
  browser = await launchChromium();
});

afterAll(async () => {
  await browser?.close();
  await tryIt?.dispose();
});

describe.each(TRANSPORTS)("in Chromium over %s", (transport) => {
  it("a refused room ends only its subscription, with the backend's code", async () => {
    const lobby = `room:lobby-browser-${transport}`;
    const p = await browser.newPage();
    await p.goto(`${server.url}/healthz`);
    await p.addScriptTag({ url: `${server.url}/herald.js` });
    await p.evaluate(
      ({ transport, lobby }) => {
        const w = window as unknown as Record<string, any>;
        w.events = [];
        w.received = [];
        const client = new w.Herald.Client(undefined, { transports: transport, minReconnectDelay: 100, pollInterval: 200 });
        client.on("connecting", (e: { code: number }) => w.events.push(`connecting:${e.code}`));
        client.on("disconnected", (e: { code: number }) => w.events.push(`disconnected:${e.code}`));
        const staff = client.newSubscription("room:staff");
        staff.on("error", (e: { code: number }) => w.events.push(`staff-error:${e.code}`));
        staff.on("unsubscribed", (e: { code: number; reason: string }) => w.events.push(`staff-unsubscribed:${e.code}:${e.reason}`));
        const room = client.newSubscription(lobby);
        room.on("subscribed", () => w.events.push("lobby-subscribed"));
        room.on("publication", (p: { data: unknown }) => w.received.push(p.data));
        staff.subscribe();
        room.subscribe();
        client.connect();
        w.client = client;
      },
      { transport, lobby },
    );
    await p.waitForFunction(
      () => {
        const events = (window as any).events as string[];
        return events.includes("lobby-subscribed") && events.some((e) => e.startsWith("staff-unsubscribed"));
      },
      undefined,
      { timeout: 20_000 },
    );
    await server.publish(lobby, { text: "still here" });
    await p.waitForFunction(() => (window as any).received.length >= 1, undefined, { timeout: 20_000 });
    const events = (await p.evaluate(() => (window as any).events)) as string[];
    expect(events).toContain("staff-error:1003");
    expect(events.find((e) => e.startsWith("staff-unsubscribed"))).toMatch(/^staff-unsubscribed:1003:.*staff only/);
    // Connected once, never dropped.
    expect(events.filter((e) => e.startsWith("connecting") || e.startsWith("disconnected"))).toEqual(["connecting:0"]);
    expect(await p.evaluate(() => (window as any).client.state)).toBe("connected");
    await p.close();
  });
});
