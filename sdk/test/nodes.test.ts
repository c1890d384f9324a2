/** The SDK against two Herald nodes sharing channels through a real Redis, with a "load
 * balancer" that sends every request to the node it likes: every transport receives,
 * publishes and resumes in offset order, and a stream's commands reach it through the other
 * node. */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { TransportName } from "../src/index.js";
import { client, disconnectAll, next, subscribed } from "./clients.js";
import { Herald, Redis, until } from "./herald.js";

let redis: Redis;
let a: Herald;
let b: Herald;

beforeAll(async () => {
  redis = await Redis.start();
  const args = ["--storage", "redis", "--redis-url", redis.url];
  a = await Herald.start({ args });
  b = await Herald.start({ args });
});
afterEach(disconnectAll);
afterAll(async () => {
  await a.dispose();
  await b.dispose();
  await redis.dispose();
});

/** Sends every `POST /connection/send` to the other node than the client's own. */
function crossing(own: Herald, other: Herald): typeof fetch {
  return (input, init) => {
    const url = String(input instanceof Request ? input.url : input);
    const routed = url.includes("/connection/send") ? url.replace(own.url, other.url) : url;
    return fetch(routed, init);
  };
}

const TRANSPORTS: TransportName[] = ["websocket", "stream", "longpoll", "poll"];

describe.each(TRANSPORTS)("over %s", (transport) => {
  it("a reader on one node and a writer on the other see one order", async () => {
    const channel = `chat:nodes-${transport}`;
    const { client: reader, got } = await subscribed(a.url, channel, { transports: transport, fetch: crossing(a, b) });

    const writer = client(b.url, { transports: transport, fetch: crossing(b, a) });
    writer.connect();
    await next(writer, "connected");
    const offsets: number[] = [];
    for (let i = 1; i <= 4; i++) {
      offsets.push((await writer.publish(channel, { n: i })).offset);
      await (i % 2 === 0 ? a : b).publish(channel, { api: i });
    }
    expect(offsets).toEqual([1, 3, 5, 7]);
    await until("eight publications", () => got.length === 8);
    expect(got.map((p) => p.offset)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    const history = await reader.history(channel, { limit: 100 });
    expect(history.publications?.map((p) => p.offset)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
  });
});
