/** Conflation (`conflate: true`) against a real Herald: a subscription that falls behind a
 * burst of publications of one conflation key ends at the newest value, with its offsets
 * moving forward only and never a resync, on every transport and codec; publications the
 * server skipped are told to the SDK, which moves its position over them. */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type ClientOptions, type TransportName } from "../src/index.js";
import { client, collect, disconnectAll, next, rawSocket } from "./clients.js";
import { Herald, until } from "./herald.js";

let server: Herald;

beforeAll(async () => {
  server = await Herald.start();
});
afterEach(disconnectAll);
afterAll(async () => {
  await server.dispose();
});

const cases: [string, ClientOptions][] = [
  ["websocket", { transports: "websocket" as TransportName }],
  ["websocket, protobuf", { transports: "websocket" as TransportName, protocol: "protobuf" }],
  ["stream", { transports: "stream" as TransportName }],
  ["longpoll", { transports: "longpoll" as TransportName }],
];

describe.each(cases)("over %s", (name, options) => {
  it("ends at the newest value of a burst, offsets only forward, no resync", async () => {
    const channel = `ticker:${name.replace(/[^a-z]/g, "")}`;
    const c = client(server.url, options);
    const errors: unknown[] = [];
    c.on("error", (e) => errors.push(e));
    const sub = c.newSubscription(channel, { conflate: true, delta: "fossil" });
    const got = collect(sub);
    const subscribed = next(sub, "subscribed");
    sub.subscribe();
    c.connect();
    await subscribed;
    // All at once: publications pile up behind the client (most on long-poll, whose
    // parked session holds them between requests).
    const published = await Promise.all(
      Array.from({ length: 200 }, (_, i) => server.api("/api/publish", { channel, data: { price: i }, conflation_key: "BTC" })),
    );
    const last = Math.max(...published.map((p) => (p as { offset: number }).offset));
    await until("the newest publication", () => sub.position?.offset === last);
    const offsets = got.map((p) => p.offset);
    expect(offsets).toEqual([...offsets].sort((a, b) => a - b));
    expect(new Set(offsets).size).toBe(offsets.length);
    expect(got.at(-1)?.offset).toBe(last);
    const newest = published.findIndex((p) => (p as { offset: number }).offset === last);
    expect(got.at(-1)?.data).toEqual({ price: newest });
    expect(errors).toEqual([]);
  });
});

it("the server says which offsets it skipped, in the words the SDK reads", async () => {
  // A raw socket subscribed with conflate, not read while a burst is published: the
  // notices and publications together cover every offset once.
  const { ws, lines } = await rawSocket(server.url);
  ws.send(JSON.stringify({ id: 1, subscribe: { channel: "ticker:raw", conflate: true } }));
  await until("subscribed", () => lines.some((l) => l["id"] === 1));
  ws.pause();
  let last = 0;
  for (let i = 0; i < 300; i++) {
    const p = (await server.api("/api/publish", { channel: "ticker:raw", data: { price: i, pad: "x".repeat(8000) }, conflation_key: "BTC" })) as {
      offset: number;
    };
    last = p.offset;
  }
  ws.resume();
  let at = 0;
  await until("every offset", () => {
    for (const l of lines.splice(0)) {
      const skipped = l["conflated"] as { offset: number } | undefined;
      const pub = l["pub"] as { offset: number } | undefined;
      if (skipped !== undefined) {
        expect(skipped.offset).toBeGreaterThan(at);
        at = skipped.offset;
      } else if (pub !== undefined) {
        expect(pub.offset).toBe(at + 1);
        at = pub.offset;
      }
    }
    return at === last;
  });
  ws.close();
});

describe.each([
  ["json", {}],
  ["protobuf", { protocol: "protobuf" }],
] as [string, ClientOptions][])("a client's publish over %s", (name, options) => {
  it("carries a conflation key, as the API's does", async () => {
    const channel = `chat:keyed-${name}`;
    // A parked long-poll that conflates holds what is published until it asks again.
    const parked = (await (await fetch(`${server.url}/connection/longpoll?channel=${channel}&timeout=100ms&session_key=&conflate=true`)).json()) as {
      cursor: string;
      session_key: string;
    };
    const c = client(server.url, { transports: "websocket" as TransportName, ...options });
    const connected = next(c, "connected");
    c.connect();
    await connected;
    for (const n of [1, 2, 3]) await c.publish(channel, { n }, { conflationKey: "BTC" });
    const query = `channel=${channel}&cursor=${encodeURIComponent(parked.cursor)}&session_key=${parked.session_key}`;
    const got = (await (await fetch(`${server.url}/connection/longpoll?${query}`)).json()) as { messages: Array<Record<string, unknown>> };
    // "chat:" has join/leave: the long-poll's own join comes at the end of a presence
    // window (500 ms), in this answer or the first, as the machine's speed has it.
    const told = got.messages.filter((m) => m["presence"] === undefined);
    expect(told[0]).toEqual({ conflated: { channel, offset: 2 } });
    expect(told.slice(1).map((m) => (m["pub"] as { offset: number }).offset)).toEqual([3]);
  });
});
