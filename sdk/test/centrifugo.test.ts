/** centrifuge-js (Centrifugo's own client, from npm) against Herald's Centrifugo front:
 * publications, publishing, history, presence, joins and leaves, deltas, refusals, and a
 * recovery across a restart of the durable store, which Centrifugo's memory engine cannot. */
import { afterAll, afterEach, beforeAll, expect, it } from "vitest";
import WebSocket from "ws";
import { Centrifuge, type PublicationContext, type SubscribedContext } from "centrifuge";
import { Centrifuge as CentrifugeProtobuf } from "centrifuge/build/protobuf";
import { execFileSync } from "node:child_process";
import { Herald, heraldBinary, until } from "./herald.js";

let server: Herald;
const clients: Centrifuge[] = [];

beforeAll(async () => {
  server = await Herald.start();
});
afterEach(() => {
  for (const c of clients.splice(0)) c.disconnect();
});
afterAll(async () => {
  await server.dispose();
});

function centrifuge(url = server.url, options: Record<string, unknown> = {}): Centrifuge {
  const c = new Centrifuge(`${url.replace("http", "ws")}/centrifugo/connection/websocket`, {
    websocket: WebSocket,
    minReconnectDelay: 50,
    maxReconnectDelay: 300,
    ...options,
  });
  clients.push(c);
  return c;
}

it("subscribes, receives, publishes, reads history and presence", async () => {
  const channel = "chat:centrifuge";
  await server.publish(channel, { text: "before" });
  const c = centrifuge();
  const watcher = centrifuge();
  const sub = c.newSubscription(channel);
  const got: PublicationContext[] = [];
  sub.on("publication", (p) => got.push(p));
  const subscribed = new Promise<SubscribedContext>((resolve) => sub.once("subscribed", resolve));
  sub.subscribe();
  c.connect();
  const ctx = await subscribed;
  expect([ctx.recoverable, ctx.positioned, ctx.streamPosition?.offset]).toEqual([true, true, 1]);

  // Another client joins: a join for the first (the namespace has join_leave).
  // Joins come batched: this client's own, and the other's.
  const joins: string[] = [];
  sub.on("join", (j) => joins.push(j.info.client));
  const other = watcher.newSubscription(channel);
  other.subscribe();
  watcher.connect();
  await until("two joins", () => new Set(joins).size === 2);

  await server.publish(channel, { text: "from the api" });
  await sub.publish({ text: "from centrifuge-js" });
  await until("two publications", () => got.length === 2);
  expect(got.map((p) => [p.offset, p.data])).toEqual([
    [2, { text: "from the api" }],
    [3, { text: "from centrifuge-js" }],
  ]);

  const history = await sub.history({ limit: 10 });
  expect(history.publications.map((p) => p.offset)).toEqual([1, 2, 3]);
  expect(history.epoch).toBe(ctx.streamPosition?.epoch);
  const presence = await sub.presence();
  expect(Object.keys(presence.clients)).toHaveLength(2);
  const stats = await sub.presenceStats();
  expect(stats.numClients).toBe(2);
});

it("applies deltas to the publications it asked deltas for", async () => {
  const channel = "dash:centrifuge";
  const c = centrifuge();
  const sub = c.newSubscription(channel, { delta: "fossil" });
  const got: unknown[] = [];
  sub.on("publication", (p) => got.push(p.data));
  const subscribed = new Promise((resolve) => sub.once("subscribed", resolve));
  sub.subscribe();
  c.connect();
  await subscribed;
  const doc = (v: number) => ({ version: v, rows: Array.from({ length: 30 }, (_, i) => `row ${i} stays the same`) });
  for (let v = 1; v <= 5; v++) {
    await server.publish(channel, doc(v));
    await until(`version ${v}`, () => got.length === v);
  }
  expect(got).toEqual([1, 2, 3, 4, 5].map(doc));
});

it("a refused subscription ends with Herald's code, the connection stays", async () => {
  const c = centrifuge();
  const bad = c.newSubscription("$herald:events");
  const ended = new Promise<{ code: number }>((resolve) => bad.once("unsubscribed", resolve));
  bad.subscribe();
  c.connect();
  expect((await ended).code).toBe(114);
  const good = c.newSubscription("chat:still-here");
  const subscribed = new Promise((resolve) => good.once("subscribed", resolve));
  good.subscribe();
  await subscribed;
});

it("recovers what was published across a restart of the server", async () => {
  const restarting = await Herald.start();
  const port = restarting.port;
  const channel = "chat:restart";
  const c = centrifuge(restarting.url);
  const sub = c.newSubscription(channel);
  const got: number[] = [];
  sub.on("publication", (p) => got.push(p.offset ?? 0));
  const contexts: SubscribedContext[] = [];
  sub.on("subscribed", (ctx) => contexts.push(ctx));
  sub.subscribe();
  c.connect();
  await until("subscribed", () => contexts.length === 1);
  await restarting.publish(channel, 1);
  await until("the first", () => got.length === 1);
  await restarting.stop();
  const again = await Herald.start({ listen: `127.0.0.1:${port}`, dataDir: restarting.dataDir });
  try {
    await again.publish(channel, 2);
    await again.publish(channel, 3);
    await until("the recovery", () => contexts.length === 2 && got.length === 3);
    expect(got).toEqual([1, 2, 3]);
    expect([contexts[1]!.wasRecovering, contexts[1]!.recovered]).toEqual([true, true]);
  } finally {
    c.disconnect();
    await again.dispose();
    await restarting.dispose();
  }
});

it("speaks Protobuf (centrifuge/build/protobuf, the mobile SDKs' codec): publications, publish, history, deltas", async () => {
  const channel = "chat:protobuf";
  const c = new CentrifugeProtobuf(`${server.url.replace("http", "ws")}/centrifugo/connection/websocket`, {
    websocket: WebSocket,
    minReconnectDelay: 50,
  });
  const encoder = new TextEncoder();
  const decoder = new TextDecoder();
  try {
    const sub = c.newSubscription(channel, { delta: "fossil" });
    const got: unknown[] = [];
    sub.on("publication", (p) => got.push(JSON.parse(decoder.decode(p.data as Uint8Array))));
    const subscribed = new Promise<SubscribedContext>((resolve) => sub.once("subscribed", resolve));
    sub.subscribe();
    c.connect();
    expect((await subscribed).positioned).toBe(true);
    const doc = (v: number) => ({ version: v, rows: Array.from({ length: 30 }, (_, i) => `row ${i} stays the same`) });
    await server.publish(channel, doc(1));
    await until("the first", () => got.length === 1);
    await sub.publish(encoder.encode(JSON.stringify(doc(2))));
    await server.publish(channel, doc(3));
    await until("three", () => got.length === 3);
    expect(got).toEqual([doc(1), doc(2), doc(3)]);
    const history = await sub.history({ limit: 10 });
    expect(history.publications.map((p) => p.offset)).toEqual([1, 2, 3]);
    // Data that is not JSON is refused: Herald keeps JSON.
    await expect(sub.publish(new Uint8Array([0, 1, 2]))).rejects.toMatchObject({ code: 107 });
  } finally {
    c.disconnect();
  }
});

it("connects with Herald's JWT: the user is the token's, its channels are subscribed by the server, a bad token is refused", async () => {
  const secret = "a-centrifugo-test-secret-of-32-bytes!!";
  const authed = await Herald.start({ env: { HERALD_AUTH__HMAC_SECRET: secret } });
  const token = (user: string) =>
    execFileSync(heraldBinary(), ["token", "--user", user, "--info", '{"name":"Ada"}', "--grant", "chat:*", "--channel", "chat:inbox-42"], {
      env: { PATH: process.env["PATH"] ?? "", HERALD_AUTH__HMAC_SECRET: secret },
    })
      .toString()
      .trim();
  try {
    const c = centrifuge(authed.url, { token: token("42") });
    const serverSide: string[] = [];
    c.on("subscribed", (ctx) => serverSide.push(ctx.channel));
    const got: unknown[] = [];
    c.on("publication", (ctx) => got.push([ctx.channel, ctx.data]));
    const sub = c.newSubscription("chat:room");
    const subscribed = new Promise((resolve) => sub.once("subscribed", resolve));
    sub.subscribe();
    c.connect();
    await subscribed;
    await until("the token's channel", () => serverSide.includes("chat:inbox-42"));
    await authed.publish("chat:inbox-42", { to: "42" });
    await until("the server-side publication", () => got.length === 1);
    expect(got).toEqual([["chat:inbox-42", { to: "42" }]]);
    const presence = await sub.presence();
    const members = Object.values(presence.clients);
    expect(members.map((m) => [m.user, m.connInfo])).toEqual([["42", { name: "Ada" }]]);

    const bad = centrifuge(authed.url, { token: "not.a.token", maxReconnectDelay: 60_000 });
    const closed = new Promise<{ code: number }>((resolve) => bad.once("disconnected", resolve));
    bad.connect();
    expect((await closed).code).toBe(3500);
  } finally {
    await authed.dispose();
  }
});
