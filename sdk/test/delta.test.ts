/** Deltas (`delta: "fossil"`) against a real Herald: the SDK applies and checks them on
 * every transport, and a delta the server sent applies to the bytes it was made from. */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type TransportName } from "../src/index.js";
import { applyDelta, DeltaError } from "../src/delta.js";
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

/** About 2 KB of which one field changes per version, with text of many bytes a character. */
function document(version: number): unknown {
  const fields: Record<string, string> = {};
  for (let i = 0; i < 40; i++) fields[`field${i}`] = `value ${i} of a dashboard — ünïcödé, 東京 — that rarely changes`;
  return { version, fields };
}

describe.each(["websocket", "stream", "longpoll"] as TransportName[])("over %s", (transport) => {
  it("receives every publication whole, from deltas, with no resync", async () => {
    const channel = `dash:${transport}`;
    const c = client(server.url, { transports: transport });
    const errors: unknown[] = [];
    c.on("error", (e) => errors.push(e));
    const sub = c.newSubscription(channel, { delta: "fossil" });
    const got = collect(sub);
    const subscribed = next(sub, "subscribed");
    sub.subscribe();
    c.connect();
    await subscribed;
    for (let version = 1; version <= 8; version++) {
      await server.publish(channel, document(version));
      await until(`version ${version}`, () => got.length === version);
    }
    expect(got.map((p) => [p.offset, p.data])).toEqual([1, 2, 3, 4, 5, 6, 7, 8].map((v) => [v, document(v)]));
    expect(errors).toEqual([]);
  });
});

it("a delta from the server applies to the text before it, and a damaged one is refused", async () => {
  const { ws, lines } = await rawSocket(server.url);
  ws.send(JSON.stringify({ id: 1, subscribe: { channel: "dash:raw", delta: "fossil" } }));
  await until("subscribed", () => lines.some((l) => l["id"] === 1));
  await server.publish("dash:raw", document(1));
  await server.publish("dash:raw", document(2));
  type Pub = { full?: string; delta?: string };
  await until("two publications", () => lines.filter((l) => l["pub"] !== undefined).length === 2);
  const [whole, delta] = lines.filter((l) => l["pub"] !== undefined).map((l) => l["pub"] as Pub);
  const encoder = new TextEncoder();
  const base = encoder.encode(whole!.full!);
  const patch = encoder.encode(delta!.delta!);
  expect(patch.length * 10).toBeLessThan(base.length);
  const applied = new TextDecoder().decode(applyDelta(base, patch));
  expect(JSON.parse(applied)).toEqual(document(2));
  const damaged = base.slice();
  damaged[base.length - 10] = damaged[base.length - 10]! ^ 1;
  expect(() => applyDelta(damaged, patch)).toThrow(DeltaError);
  expect(() => applyDelta(base, patch.subarray(0, patch.length - 3))).toThrow(DeltaError);
  ws.close();
});
