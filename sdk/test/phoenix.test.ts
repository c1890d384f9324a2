/** Herald's Phoenix front with the real `phoenix` client from npm (in Node, over `ws`),
 * and the seed study's Tsung exchange (serializer 1.0.0) byte for byte. */
import { LongPoll, Presence, Socket, type Channel } from "phoenix";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { startTryIt } from "./example.js";
import { Herald, signedToken, until } from "./herald.js";
import { SECRET, phoenixConfig } from "./phoenix.js";

let herald: Herald;
const sockets: Socket[] = [];

beforeAll(async () => {
  herald = await Herald.start({ args: ["--config", phoenixConfig()] });
});
afterEach(() => {
  for (const s of sockets.splice(0)) s.disconnect();
});
afterAll(async () => {
  await herald.dispose();
});

const WS = WebSocket as unknown as typeof globalThis.WebSocket;

/** A connected socket (over `ws` unless `options` says `transport: LongPoll`), to
 * `server` (the file's unless given); disconnected after the test. */
function socket(
  params: Record<string, string> = {},
  options: { transport?: typeof WS | typeof LongPoll; authToken?: string; server?: Herald } = {},
): Socket {
  const { transport = WS, authToken, server = herald } = options;
  const s = new Socket(`ws://127.0.0.1:${server.port}/socket`, { transport, params, ...(authToken ? { authToken } : {}) });
  sockets.push(s);
  s.connect();
  return s;
}

/** Joins `topic`; resolves with the channel, or rejects with the server's reason. */
function joined(s: Socket, topic: string, params: Record<string, unknown> = {}): Promise<Channel> {
  const channel = s.channel(topic, params);
  return new Promise((resolve, reject) => {
    channel
      .join()
      .receive("ok", () => resolve(channel))
      .receive("error", (e: unknown) => reject(new Error(JSON.stringify(e))))
      .receive("timeout", () => reject(new Error("join timed out")));
  });
}

function pushed(channel: Channel, event: string, payload: object): Promise<unknown> {
  return new Promise((resolve, reject) => {
    channel
      .push(event, payload)
      .receive("ok", resolve)
      .receive("error", (e: unknown) => reject(new Error(JSON.stringify(e))))
      .receive("timeout", () => reject(new Error("push timed out")));
  });
}

describe("phoenix.js", () => {
  it("joins a topic, and an event pushed by one member reaches every member, the sender too", async () => {
    const a = await joined(socket(), "chat:lobby");
    const b = await joined(socket(), "chat:lobby");
    const atA: unknown[] = [];
    const atB: unknown[] = [];
    a.on("new_msg", (p) => void atA.push(p));
    b.on("new_msg", (p) => void atB.push(p));
    await pushed(a, "new_msg", { body: "hello" });
    await until("both hear it", () => atA.length === 1 && atB.length === 1);
    expect(atB).toEqual([{ body: "hello" }]);
  });

  it("leaves the sender out of its own event in a broadcast_from namespace, on WebSocket and long-poll", async () => {
    const polling = socket({}, { transport: LongPoll });
    const a = await joined(socket(), "quiet:room");
    const b = await joined(polling, "quiet:room");
    const atA: unknown[] = [];
    const atB: unknown[] = [];
    a.on("new_msg", (p) => void atA.push(p));
    b.on("new_msg", (p) => void atB.push(p));
    await pushed(a, "new_msg", { from: "a" });
    await pushed(b, "new_msg", { from: "b" });
    // A publication after both: each has heard the other's event, not its own.
    await herald.publish("quiet:room", { event: "new_msg", data: { from: "api" } });
    await until("the API's, at both", () => atA.length === 2 && atB.length === 2);
    expect(atA).toEqual([{ from: "b" }, { from: "api" }]);
    expect(atB).toEqual([{ from: "a" }, { from: "api" }]);
  });

  it("relays a binary push as a binary broadcast on WebSocket (2.0.0), as base64 where there is no binary (long-poll, the API)", async () => {
    const a = await joined(socket(), "chat:binary");
    const b = await joined(socket(), "chat:binary");
    const polling = await joined(socket({}, { transport: LongPoll }), "chat:binary");
    const atB: unknown[] = [];
    const polled: unknown[] = [];
    b.on("upload", (p) => void atB.push(p));
    polling.on("upload", (p) => void polled.push(p));
    // Bytes no JSON text holds, line breaks among them.
    const bytes = new Uint8Array([0, 10, 255, 13, 10, 2, 91]);
    await pushed(a, "upload", bytes.buffer as unknown as object);
    await until("the other socket and the poller hear it", () => atB.length === 1 && polled.length === 1);
    expect(atB[0]).toBeInstanceOf(ArrayBuffer);
    expect([...new Uint8Array(atB[0] as ArrayBuffer)]).toEqual([...bytes]);
    const base64 = Buffer.from(bytes).toString("base64");
    expect(polled).toEqual([{ binary: base64 }]);
    const history = await fetch(`${herald.url}/api/history?channel=chat:binary`, { headers: { Authorization: "apikey sdk-test-api-key-01" } });
    const stored = (await history.json()) as { publications: Array<{ data: unknown }> };
    expect(stored.publications.map((p) => p.data)).toEqual([{ event: "upload", data: base64, encoding: "base64" }]);
    // The long-poller's own binary push (phoenix.js posts it as base64) reaches the socket
    // as bytes.
    await pushed(polling, "upload", new Uint8Array([9, 8, 7]).buffer as unknown as object);
    await until("the poller's push", () => atB.length === 2);
    expect([...new Uint8Array(atB[1] as ArrayBuffer)]).toEqual([9, 8, 7]);
  });

  it("receives what Herald's API publishes on the topic, as the event it names", async () => {
    const c = await joined(socket(), "chat:news");
    const alerts: unknown[] = [];
    const plain: unknown[] = [];
    c.on("alert", (p) => void alerts.push(p));
    c.on("message", (p) => void plain.push(p));
    await herald.publish("chat:news", { event: "alert", data: { level: 2 } });
    await herald.publish("chat:news", { text: "plain" });
    await until("both", () => alerts.length === 1 && plain.length === 1);
    expect(alerts).toEqual([{ level: 2 }]);
    expect(plain).toEqual([{ text: "plain" }]);
  });

  it("asks the namespace's rules: a members-only topic needs the socket's token", async () => {
    await expect(joined(socket(), "members:room")).rejects.toThrow(/members:room/);
    const token = signedToken(SECRET, "ann", { name: "Ann" });
    const room = await joined(socket({ token }), "members:room");
    await pushed(room, "hi", {});
    // A bad token closes the socket (3500), as for Herald's own clients.
    const bad = socket({ token: "not-a-token" });
    const closes: number[] = [];
    bad.onClose((e: unknown) => void closes.push((e as { code: number }).code));
    await until("closed", () => closes.length > 0);
    expect(closes[0]).toBe(3500);
  });

  it("leaves a topic: nothing more arrives", async () => {
    const s = socket();
    const c = await joined(s, "chat:leaving");
    const got: unknown[] = [];
    c.on("message", (p) => void got.push(p));
    await herald.publish("chat:leaving", { n: 1 });
    await until("the first", () => got.length === 1);
    await new Promise<void>((resolve) => c.leave().receive("ok", () => resolve()));
    const other = await joined(s, "chat:still");
    const after: unknown[] = [];
    other.on("message", (p) => void after.push(p));
    await herald.publish("chat:leaving", { n: 2 });
    await herald.publish("chat:still", { n: 3 });
    await until("the other topic's", () => after.length === 1);
    expect(got).toEqual([{ n: 1 }]);
  });
});

describe("handle_in replies", () => {
  it("answers a push of [phoenix] rpc_events with the rpc hook's data, and its refusal with its code", async () => {
    const tryIt = await startTryIt({ HERALD_PHOENIX__RPC_EVENTS: '["whoami","messages"]' });
    try {
      const lobby = await joined(socket({}, { server: tryIt.server }), "room:lobby");
      const broadcast: unknown[] = [];
      lobby.on("whoami", (p) => void broadcast.push(p));
      expect(await pushed(lobby, "whoami", {})).toEqual({ user: null, transport: "phoenix" });
      await expect(pushed(lobby, "messages", { room: "room:staff" })).rejects.toThrow(/1003.*not your room|not your room.*1003/);
      expect(await pushed(lobby, "messages", { room: "room:lobby" })).toEqual([]);
      // Answered, not broadcast: a later event reaches the topic, and no whoami before it.
      const later: unknown[] = [];
      lobby.on("new_msg", (p) => void later.push(p));
      await tryIt.server.publish("room:lobby", { event: "new_msg", data: { text: "after" } });
      await until("the later event", () => later.length === 1);
      expect(broadcast).toEqual([]);
    } finally {
      await tryIt.dispose();
    }
  });

  it("gives a join the subscribe hook's info for its topic as its Presence metas", async () => {
    const tryIt = await startTryIt({ HERALD_NAMESPACES__ROOM__PRESENCE: "true" });
    try {
      const lobby = socket({}, { server: tryIt.server }).channel("room:lobby", {});
      const seen = new Presence(lobby);
      await new Promise<void>((resolve, reject) => lobby.join().receive("ok", () => resolve()).receive("error", reject));
      await until("the member", () => seen.list().length === 1);
      const [meta] = seen.list((_id, { metas }) => metas[0] as Record<string, unknown>);
      // The example backend's answer: the guest's role in the room.
      expect(meta).toEqual({ role: "guest", phx_ref: expect.any(String) });
    } finally {
      await tryIt.dispose();
    }
  });
});

describe("authToken", () => {
  /** A token for `user…` whose base64 holds no `+` or `/`: phoenix.js sends it with
   * `btoa`, and a WebSocket client refuses a subprotocol with either. */
  function subprotocolSafeToken(user: string): string {
    for (let i = 0; ; i++) {
      const token = signedToken(SECRET, `${user}-${i}`, {});
      if (!/[+/]/.test(btoa(token))) return token;
    }
  }

  it("is the connection token, on WebSocket (a subprotocol entry) and long-poll (a header)", async () => {
    const authToken = subprotocolSafeToken("auth-token");
    for (const transport of [WS, LongPoll]) {
      const room = await joined(socket({}, { transport, authToken }), "members:auth-token");
      await pushed(room, "hi", {});
    }
    // The members-only topic is refused without it.
    await expect(joined(socket(), "members:auth-token")).rejects.toThrow(/members:auth-token/);
  });
});

describe("the server ends a join", () => {
  it("closes it with phx_close when an operator unsubscribes the user, on WebSocket and long-poll, and phoenix.js does not rejoin", async () => {
    const token = signedToken(SECRET, "kicked", {});
    const polling = socket({ token }, { transport: LongPoll });
    const both = [socket({ token }), polling];
    const channels = [await joined(both[0]!, "members:kick"), await joined(polling, "members:kick")];
    const closed: number[] = [];
    const errored: number[] = [];
    channels.forEach((c, i) => {
      c.onClose(() => void closed.push(i));
      c.onError(() => void errored.push(i));
    });
    const done = await herald.api("/api/unsubscribe", { user: "kicked", channel: "members:kick" });
    expect(done).toEqual({ unsubscribed: 2 });
    await until("both closed", () => closed.length === 2);
    expect(errored).toEqual([]);
    expect(channels.map((c) => c.state)).toEqual(["closed", "closed"]);
    // Nothing more of the topic arrives, and no rejoin made it a member again: a topic
    // published to after it reaches each socket, and the ended one did not before it.
    const after: unknown[] = [];
    for (const c of channels) c.on("message", (p) => void after.push(p));
    const seen: unknown[] = [];
    for (const s of both) (await joined(s, "chat:kick-witness")).on("message", (p) => void seen.push(p));
    await herald.publish("members:kick", { n: 1 });
    await herald.publish("chat:kick-witness", { n: 2 });
    await until("the witness's, on both sockets", () => seen.length === 2);
    expect(after).toEqual([]);
  });
});

describe("Phoenix Presence", () => {
  it("lists a topic's members by user and tells who joins and leaves", async () => {
    // As apps do: the Presence made before the join, so that it hears the state.
    const annChannel = socket({ token: signedToken(SECRET, "ann", { name: "Ann" }) }).channel("room:presence", {});
    const seen = new Presence(annChannel);
    await new Promise<void>((resolve, reject) => annChannel.join().receive("ok", () => resolve()).receive("error", reject));
    const left: string[] = [];
    seen.onLeave((id) => void (id && left.push(id)));
    await until("ann sees herself", () => seen.list((id) => id).includes("ann"));
    const bobSocket = socket({ token: signedToken(SECRET, "bob", { name: "Bob" }) });
    const bob = await joined(bobSocket, "room:presence");
    await until("ann sees bob", () => seen.list((id) => id).sort().join() === "ann,bob");
    // The app's metas: the member's info (here from its token), with Phoenix's phx_ref.
    const metas = seen.list((id, { metas }) => ({ id, meta: metas[0] as Record<string, unknown> }));
    expect(metas).toContainEqual({ id: "bob", meta: { name: "Bob", phx_ref: expect.any(String) } });
    await new Promise<void>((resolve) => bob.leave().receive("ok", () => resolve()));
    await until("bob left", () => left.includes("bob"));
    expect(seen.list((id) => id)).toEqual(["ann"]);
  });
});

describe("phoenix.js's long-poll fallback", () => {
  it("joins, pushes and receives over /socket/longpoll, with the socket's token", async () => {
    const token = signedToken(SECRET, "lp-user", {});
    const room = await joined(socket({ token }, { transport: LongPoll }), "members:polled");
    const ws = await joined(socket({ token }), "members:polled");
    const polled: unknown[] = [];
    const viaWs: unknown[] = [];
    room.on("new_msg", (p) => void polled.push(p));
    ws.on("new_msg", (p) => void viaWs.push(p));
    await pushed(room, "new_msg", { from: "poller" });
    await pushed(ws, "new_msg", { from: "websocket" });
    await herald.publish("members:polled", { event: "new_msg", data: { from: "api" } });
    await until("all three, both ways", () => polled.length === 3 && viaWs.length === 3);
    expect(polled).toEqual([{ from: "poller" }, { from: "websocket" }, { from: "api" }]);
    expect(viaWs).toEqual(polled);
  });

  it("refuses a stale session token with 410, and a members-only topic without a token", async () => {
    const stale = await fetch(`${herald.url}/socket/longpoll?vsn=2.0.0&token=${"0".repeat(32)}`);
    expect(await stale.json()).toEqual({ status: 410 });
    await expect(joined(socket({}, { transport: LongPoll }), "members:polled")).rejects.toThrow(/members:polled/);
  });
});

describe("heartbeats", () => {
  it("drop a client silent past client.idle_timeout (no heartbeat, no pong) with 3005, and keep one that heartbeats", async () => {
    const server = await Herald.start({ args: ["--config", phoenixConfig(`[client]\nping_interval = "300ms"\nidle_timeout = "1s"\n`)] });
    try {
      const url = `ws://127.0.0.1:${server.port}/socket/websocket?vsn=2.0.0`;
      // Neither answers the server's pings (a stalled client); only one heartbeats.
      const silent = new WebSocket(url, { autoPong: false });
      const beating = new WebSocket(url, { autoPong: false });
      const silentClosed = new Promise<number>((resolve) => silent.on("close", (c) => resolve(c)));
      let beatingClosed: number | undefined;
      beating.on("close", (c) => (beatingClosed = c));
      let replies = 0;
      beating.on("message", () => replies++);
      await new Promise((resolve) => beating.on("open", resolve));
      let ref = 0;
      const beat = setInterval(() => beating.send(JSON.stringify([null, String(++ref), "phoenix", "heartbeat", {}])), 200);
      try {
        expect(await silentClosed).toBe(3005);
        // The beating one is answered ten more heartbeats (two idle timeouts' worth)
        // after the silent one went, and is still open.
        const answered = replies;
        await until("ten more heartbeat replies", () => replies >= answered + 10, 5000);
        expect(beatingClosed).toBeUndefined();
        expect(beating.readyState).toBe(WebSocket.OPEN);
      } finally {
        clearInterval(beat);
        beating.close();
      }
    } finally {
      await server.dispose();
    }
  });
});

describe("the seed's Tsung exchange (serializer 1.0.0)", () => {
  it("joins chat, heartbeats, and hears its speak broadcast back as publish", async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${herald.port}/socket/websocket`);
    const got: Array<Record<string, unknown>> = [];
    ws.on("message", (m) => got.push(JSON.parse(m.toString())));
    await new Promise((resolve) => ws.on("open", resolve));
    ws.send(JSON.stringify({ topic: "chat", event: "phx_join", payload: {}, ref: "1" }));
    await until("joined", () => got.some((m) => m.ref === "1"));
    expect(got[0]).toEqual({ topic: "chat", event: "phx_reply", payload: { status: "ok", response: {} }, ref: "1" });
    ws.send(JSON.stringify({ topic: "chat", event: "speak", payload: { body: "hi all" } }));
    ws.send(JSON.stringify({ topic: "phoenix", event: "heartbeat", payload: {}, ref: "2" }));
    await until("the broadcast and the heartbeat reply", () => got.length === 3);
    expect(got).toContainEqual({ topic: "chat", event: "publish", payload: { body: "hi all" }, ref: null });
    expect(got).toContainEqual({ topic: "phoenix", event: "phx_reply", payload: { status: "ok", response: {} }, ref: "2" });
    // Not a Phoenix message: closed with 3501 (bad request), saying why.
    const closed = new Promise<number>((resolve) => ws.on("close", (code) => resolve(code)));
    ws.send("{nope");
    expect(await closed).toBe(3501);
  });

  it("answers an event on a topic it has not joined with an error, and refuses a bad topic", async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${herald.port}/socket/websocket?vsn=2.0.0`);
    const got: unknown[] = [];
    ws.on("message", (m) => got.push(JSON.parse(m.toString())));
    await new Promise((resolve) => ws.on("open", resolve));
    ws.send(JSON.stringify([null, "1", "chat", "speak", { body: "x" }]));
    ws.send(JSON.stringify(["2", "2", "bad topic!", "phx_join", {}]));
    await until("two errors", () => got.length === 2);
    expect(got[0]).toEqual([null, "1", "chat", "phx_reply", { status: "error", response: { reason: "unmatched topic" } }]);
    expect((got[1] as unknown[])[4]).toMatchObject({ status: "error" });
    ws.close();
  });
});
