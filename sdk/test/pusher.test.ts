/** Herald's Pusher front with the real libraries from npm: `pusher-js` (Node build) as the
 * client, the `pusher` server SDK as the app's backend (its HTTP API calls and its channel
 * signatures), and Herald's own API on the same channels. */
import PusherServer from "pusher";
import PusherClient from "pusher-js";
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { Herald, Redis, until } from "./herald.js";
import { APP, OTHER, pusherConfig } from "./pusher.js";

let herald: Herald;
const clients: PusherClient[] = [];

beforeAll(async () => {
  herald = await Herald.start({ args: ["--config", pusherConfig()] });
});
afterEach(() => {
  for (const c of clients.splice(0)) c.disconnect();
});
afterAll(async () => {
  await herald.dispose();
});

/** The app's backend, as the `pusher` server SDK. */
function backend(server: Herald = herald, app = APP): PusherServer {
  return new PusherServer({ appId: app.id, key: app.key, secret: app.secret, host: "127.0.0.1", port: String(server.port), useTLS: false });
}

/** A `pusher-js` client whose private and presence channels are signed by the app's
 * backend (`authorizeChannel`, as an auth endpoint would), as user `user` when given. */
function connect(options: { server?: Herald; app?: typeof APP; user?: { user_id: string; user_info?: Record<string, unknown> }; wsPath?: string } = {}): PusherClient {
  const server = options.server ?? herald;
  const app = options.app ?? APP;
  const signer = backend(server, app);
  const client = new PusherClient(app.key, {
    cluster: "local",
    wsHost: "127.0.0.1",
    wsPort: server.port,
    forceTLS: false,
    enabledTransports: ["ws"],
    ...(options.wsPath ? { wsPath: options.wsPath } : {}),
    channelAuthorization: {
      endpoint: "unused",
      transport: "ajax",
      customHandler: ({ socketId, channelName }, callback) => {
        const auth = channelName.startsWith("presence-")
          ? signer.authorizeChannel(socketId, channelName, options.user ?? { user_id: "anonymous" })
          : signer.authorizeChannel(socketId, channelName);
        callback(null, auth);
      },
    },
  });
  clients.push(client);
  return client;
}

/** A `pusher-js` client whose `signin()` the app's backend signs as `user` (as a user
 * authentication endpoint would). */
function signingIn(user: { id: string; name?: string; watchlist?: string[] }, server: Herald = herald): PusherClient {
  const signer = backend(server);
  const client = new PusherClient(APP.key, {
    cluster: "local",
    wsHost: "127.0.0.1",
    wsPort: server.port,
    forceTLS: false,
    enabledTransports: ["ws"],
    userAuthentication: {
      endpoint: "unused",
      transport: "ajax",
      customHandler: ({ socketId }, callback) => callback(null, signer.authenticateUser(socketId, user)),
    },
  });
  clients.push(client);
  return client;
}

async function connected(client: PusherClient): Promise<string> {
  await until("connected", () => client.connection.state === "connected");
  return client.connection.socket_id;
}

/** Subscribes and waits for the server's confirmation. */
async function subscribed(client: PusherClient, name: string) {
  const channel = client.subscribe(name);
  await new Promise<void>((resolve, reject) => {
    channel.bind("pusher:subscription_succeeded", () => resolve());
    channel.bind("pusher:subscription_error", (e: unknown) => reject(new Error(`subscription_error: ${JSON.stringify(e)}`)));
  });
  return channel;
}

/** Every `pusher:error` the client is sent, as it arrives. */
function pusherErrors(client: PusherClient): Array<{ code: number | null; message: string }> {
  const errors: Array<{ code: number | null; message: string }> = [];
  client.connection.bind("error", (e: { data?: { code: number | null; message: string } }) => {
    if (e.data) errors.push(e.data);
  });
  return errors;
}

/** Every event `name` on `channel`, as it arrives. */
function collect(channel: ReturnType<PusherClient["subscribe"]>, name: string): unknown[] {
  const got: unknown[] = [];
  channel.bind(name, (data: unknown) => got.push(data));
  return got;
}

describe("pusher-js on a public channel", () => {
  it("receives events from the pusher SDK and from Herald's own API on the same channel", async () => {
    const client = connect();
    await connected(client);
    const channel = await subscribed(client, "orders");
    const created = collect(channel, "created");
    const plain = collect(channel, "message");

    await backend().trigger("orders", "created", { id: 1 });
    // Herald's own API, on the app's namespace: the same channel.
    await herald.publish(`${APP.id}:orders`, { event: "created", data: { id: 2 } });
    await herald.publish(`${APP.id}:orders`, { text: "not a Pusher event" });
    await until("three events", () => created.length === 2 && plain.length === 1);
    expect(created).toEqual([{ id: 1 }, { id: 2 }]);
    expect(plain).toEqual([{ text: "not a Pusher event" }]);
  });

  it("leaves out the connection named by socket_id", async () => {
    const sender = connect();
    const other = connect();
    const socketId = await connected(sender);
    await connected(other);
    const mine = collect(await subscribed(sender, "news"), "flash");
    const theirs = collect(await subscribed(other, "news"), "flash");
    await backend().trigger("news", "flash", { n: 1 }, { socket_id: socketId });
    await backend().trigger("news", "flash", { n: 2 });
    await until("both reach the other client", () => theirs.length === 2);
    await until("the second reaches the sender", () => mine.length === 1);
    expect(mine).toEqual([{ n: 2 }]);
  });

  it("never lets one app's key read another app's channels", async () => {
    const one = connect();
    const two = connect({ app: OTHER });
    await connected(one);
    await connected(two);
    const seenByOne = collect(await subscribed(one, "shared-name"), "ping");
    const seenByTwo = collect(await subscribed(two, "shared-name"), "ping");
    await backend(herald, OTHER).trigger("shared-name", "ping", { app: 2 });
    await backend().trigger("shared-name", "ping", { app: 1 });
    await until("each app hears its own", () => seenByOne.length === 1 && seenByTwo.length === 1);
    expect(seenByOne).toEqual([{ app: 1 }]);
    expect(seenByTwo).toEqual([{ app: 2 }]);
    // Signed with app two's secret, app one's API refuses.
    const forged = new PusherServer({ appId: APP.id, key: APP.key, secret: OTHER.secret, host: "127.0.0.1", port: String(herald.port), useTLS: false });
    await expect(forged.trigger("shared-name", "ping", { forged: true })).rejects.toMatchObject({ status: 401 });
  });
});

describe("private and presence channels", () => {
  it("admits a private channel with the backend's signature, and refuses a forged one", async () => {
    const client = connect();
    await connected(client);
    const channel = await subscribed(client, "private-account.7");
    const got = collect(channel, "paid");
    await backend().trigger("private-account.7", "paid", { amount: 3 });
    await until("the event", () => got.length === 1);

    // A client that signs with a wrong secret is refused, and its connection stays.
    const forger = new PusherClient(APP.key, {
      cluster: "local",
      wsHost: "127.0.0.1",
      wsPort: herald.port,
      forceTLS: false,
      enabledTransports: ["ws"],
      channelAuthorization: {
        endpoint: "unused",
        transport: "ajax",
        customHandler: ({ socketId, channelName }, callback) =>
          callback(null, backend(herald, { ...APP, secret: "not-the-secret-0123456" }).authorizeChannel(socketId, channelName)),
      },
    });
    clients.push(forger);
    await connected(forger);
    const refused = forger.subscribe("private-account.7");
    const error = await new Promise<{ status: number }>((resolve) => refused.bind("pusher:subscription_error", resolve));
    expect(error.status).toBe(401);
    const open = await subscribed(forger, "public-board");
    expect(open.subscribed).toBe(true);
    expect(forger.connection.state).toBe("connected");
  });

  it("counts presence per user: member_added and member_removed once per user", async () => {
    const watcher = connect({ user: { user_id: "watcher", user_info: { name: "W" } } });
    await connected(watcher);
    const room = await subscribed(watcher, "presence-room");
    const added: Array<{ id: string; info: unknown }> = [];
    const removed: unknown[] = [];
    room.bind("pusher:member_added", (m: { id: string; info: unknown }) => added.push(m));
    room.bind("pusher:member_removed", (m: { id: unknown }) => removed.push(m.id));

    // Ann on two connections: one member_added.
    const ann1 = connect({ user: { user_id: "ann", user_info: { name: "Ann" } } });
    const ann2 = connect({ user: { user_id: "ann", user_info: { name: "Ann" } } });
    await connected(ann1);
    await connected(ann2);
    const annRoom = await subscribed(ann1, "presence-room");
    await subscribed(ann2, "presence-room");
    await until("ann added", () => added.length === 1);
    expect(added).toEqual([{ id: "ann", info: { name: "Ann" } }]);
    // Ann's own view lists both users.
    const members = (annRoom as unknown as { members: { count: number; me: { id: string } } }).members;
    expect(members.count).toBe(2);
    expect(members.me.id).toBe("ann");

    // One of Ann's connections leaves: still there. The last leaves: removed once.
    ann1.unsubscribe("presence-room");
    const bob = connect({ user: { user_id: 42 as unknown as string } });
    await connected(bob);
    await subscribed(bob, "presence-room");
    await until("bob added", () => added.length === 2);
    expect(removed).toEqual([]);
    ann2.unsubscribe("presence-room");
    await until("ann removed", () => removed.length === 1);
    expect(removed).toEqual(["ann"]);
    // A user id signed as a number comes back as one (issue #59), as pusher-js keeps it
    // for the member itself (members.me.id).
    expect(added[1]).toEqual({ id: 42, info: null });

    const users = (await backend().get({ path: "/channels/presence-room/users" })) as { json(): Promise<unknown> };
    expect(await users.json()).toEqual({ users: [{ id: "42" }, { id: "watcher" }] });
    // A later subscriber's list has the number too; its leave names it as one.
    const late = connect({ user: { user_id: "late" } });
    await connected(late);
    const lateRoom = await subscribed(late, "presence-room");
    const ids: unknown[] = [];
    (lateRoom as unknown as { members: { each(f: (m: { id: unknown }) => void): void } }).members.each((m) => ids.push(m.id));
    expect(ids).toContain("42");
    bob.unsubscribe("presence-room");
    await until("bob removed", () => removed.length === 2);
    expect(removed[1]).toBe(42);
  });
});

describe("client events", () => {
  it("reach the channel's other members, never the sender, and are rate-limited", async () => {
    const a = connect({ user: { user_id: "a" } });
    const b = connect({ user: { user_id: "b" } });
    await connected(a);
    await connected(b);
    const roomA = await subscribed(a, "presence-chat");
    const roomB = await subscribed(b, "presence-chat");
    const atA = collect(roomA, "client-typing");
    const atB: Array<{ data: unknown; user_id?: string }> = [];
    roomB.bind("client-typing", (data: unknown, meta: { user_id?: string }) => atB.push({ data, user_id: meta?.user_id }));
    expect(roomA.trigger("client-typing", { typing: true })).toBe(true);
    await until("b hears it", () => atB.length === 1);
    expect(atB[0]).toEqual({ data: { typing: true }, user_id: "a" });

    // Over 10 a second, bursts included (Pusher's rate): pusher:error 4301, and the
    // others are not sent.
    const errors = pusherErrors(a);
    for (let i = 0; i < 30; i++) roomA.trigger("client-typing", { i });
    await until("a rate error", () => errors.some((e) => e.code === 4301));
    await until("b's share arrives", () => atB.length >= 10);
    expect(atB.length).toBeLessThan(14);
    expect(atA).toEqual([]);

    // Not on public channels.
    const lobby = await subscribed(a, "lobby");
    lobby.trigger("client-hi", {});
    await until("refused on a public channel", () => errors.some((e) => e.message.includes("private and presence")));
  });

  it("refuse an oversized client event and a subscribe flood with Pusher's errors; the connection's channels go on", async () => {
    const a = connect({ user: { user_id: "flooder" } });
    const b = connect({ user: { user_id: "listener" } });
    await connected(a);
    await connected(b);
    const roomA = await subscribed(a, "private-flood");
    const heardByB = collect(await subscribed(b, "private-flood"), "client-big");
    const errors = pusherErrors(a);
    // Over Pusher's 10 KB for a client event: refused, not sent.
    roomA.trigger("client-big", { pad: "x".repeat(11 * 1024) });
    await until("the size error", () => errors.some((e) => e.message.includes("over 10240 bytes")));
    // A flood of subscriptions past client.max_subscriptions (512) and the message rate:
    // errors, and the connection stays with what it had.
    const refused: unknown[] = [];
    for (let i = 0; i < 700; i++) a.subscribe(`flood-${i}`).bind("pusher:subscription_error", (e: unknown) => refused.push(e));
    await until("refusals", () => refused.length > 0 || errors.some((e) => e.message.includes("messages per second")));
    expect(a.connection.state).toBe("connected");
    // The flood spent the connection's message allowance: a client event goes through
    // once it refills (sent again until one does).
    const resend = setInterval(() => roomA.trigger("client-big", { small: true }), 250);
    await until("a client event after the flood", () => heardByB.length >= 1, 15_000).finally(() => clearInterval(resend));
    expect(heardByB[0]).toEqual({ small: true });
    const ok = collect(roomA, "after");
    await backend().trigger("private-flood", "after", { n: 1 });
    await until("an event after the flood", () => ok.length === 1);
  });

  it("a message past the frame limit closes with a code pusher-js reconnects from, and the page goes on", async () => {
    const a = connect({ user: { user_id: "big-sender" } });
    const first = await connected(a);
    const room = await subscribed(a, "private-huge");
    const heard = collect(room, "after");
    // 70 KB: past client.max_frame_size (64 KiB), so the frame is refused unread. Pusher's
    // 4000-4099 would tell pusher-js never to reconnect: the page would lose its real-time
    // for a message it can simply not send again.
    room.trigger("client-huge", { pad: "x".repeat(70 * 1024) });
    await until("a new connection", () => a.connection.state === "connected" && a.connection.socket_id !== first, 15_000);
    await until("subscribed again", () => room.subscribed);
    await backend().trigger("private-huge", "after", { n: 1 });
    await until("an event after the reconnect", () => heard.length === 1);
  });

  it("are refused by an app that does not enable them", async () => {
    const client = connect({ app: OTHER });
    await connected(client);
    const channel = await subscribed(client, "private-x");
    const errors = pusherErrors(client);
    channel.trigger("client-x", {});
    await until("an error", () => errors.length === 1);
    expect(errors[0]!.message).toContain("not enabled");
  });
});

describe("cache channels and signed-in users", () => {
  it("sends a cache channel's last event on subscribing, or pusher:cache_miss", async () => {
    await backend().trigger("cache-price", "tick", { price: 1 });
    await backend().trigger("cache-price", "tick", { price: 2 });
    const client = connect();
    await connected(client);
    const price = client.subscribe("cache-price");
    const ticks = collect(price, "tick");
    const empty = client.subscribe("cache-nothing-yet");
    const misses = collect(empty, "pusher:cache_miss");
    await until("the cached event and the miss", () => ticks.length === 1 && misses.length === 1);
    expect(ticks).toEqual([{ price: 2 }]);
    await backend().trigger("cache-price", "tick", { price: 3 });
    await until("the next one live", () => ticks.length === 2);
    expect(ticks).toEqual([{ price: 2 }, { price: 3 }]);
  });

  it("signs a user in, and the backend ends that user's connections", async () => {
    const signer = backend();
    const client = signingIn({ id: "u-77", name: "Ann" });
    const states: string[] = [];
    client.connection.bind("state_change", (s: { current: string }) => states.push(s.current));
    client.signin();
    await until("signed in", () => (client.user as unknown as { user_data?: { id: string } }).user_data?.id === "u-77");
    const bystander = connect();
    await connected(bystander);
    await signer.terminateUserConnections("u-77");
    await until("its connection ended", () => states.includes("disconnected") || states.includes("unavailable") || states.includes("failed"));
    expect(bystander.connection.state).toBe("connected");
  });
});

describe("user channels", () => {
  /** A pusher-js client signed in as `id`, its user channel subscribed. */
  async function signedIn(id: string) {
    const client = signingIn({ id });
    const got: unknown[] = [];
    client.user.bind("notice", (data: unknown) => got.push(data));
    client.signin();
    const user = client.user as unknown as { serverToUserChannel?: { subscribed: boolean } };
    await until(`${id}'s channel subscribed`, () => user.serverToUserChannel?.subscribed === true);
    return got;
  }

  it("take the backend's sendToUser to every connection the user signed in on, and only theirs", async () => {
    const [tab1, tab2, other] = [await signedIn("u-88"), await signedIn("u-88"), await signedIn("u-99")];
    await backend().sendToUser("u-88", "notice", { n: 1 });
    await backend().sendToUser("u-99", "notice", { n: 2 });
    await until("each tab of u-88 has its notice", () => tab1.length === 1 && tab2.length === 1);
    await until("u-99 has its own", () => other.length === 1);
    expect(tab1).toEqual([{ n: 1 }]);
    expect(tab2).toEqual([{ n: 1 }]);
    expect(other).toEqual([{ n: 2 }]);
  });

  it("are refused to a connection not signed in as their user, and take no client events", async () => {
    await signedIn("u-12");
    const raw = new WebSocket(`ws://127.0.0.1:${herald.port}/app/${APP.key}?protocol=7`);
    const got: Array<{ event: string; channel?: string; data: unknown }> = [];
    raw.on("message", (m) => got.push(JSON.parse(m.toString())));
    try {
      await until("established", () => got.some((m) => m.event === "pusher:connection_established"));
      raw.send(JSON.stringify({ event: "pusher:subscribe", data: { channel: "#server-to-user-u-12", auth: "" } }));
      await until("refused", () => got.some((m) => m.event === "pusher:subscription_error"));
      const refusal = got.find((m) => m.event === "pusher:subscription_error")!;
      expect(refusal.channel).toBe("#server-to-user-u-12");
      const said = typeof refusal.data === "string" ? JSON.parse(refusal.data) : refusal.data;
      expect(said).toMatchObject({ status: 401 });
      raw.send(JSON.stringify({ event: "client-x", channel: "#server-to-user-u-12", data: {} }));
      await until("the client event refused", () => got.some((m) => m.event === "pusher:error"));
    } finally {
      raw.close();
    }
  });
});

describe("watchlists", () => {
  /** Every watchlist event `client` hears, as `online:ID` or `offline:ID`, in order. */
  function watching(client: PusherClient): string[] {
    const heard: string[] = [];
    for (const name of ["online", "offline"]) {
      client.user.watchlist.bind(name, (e: { name: string; user_ids: string[] }) => heard.push(...e.user_ids.map((id) => `${e.name}:${id}`)));
    }
    return heard;
  }

  /** A user signed in (its signin answered), on `server`. */
  async function online(id: string, watchlist?: string[], server: Herald = herald) {
    const client = signingIn({ id, ...(watchlist ? { watchlist } : {}) }, server);
    const heard = watching(client);
    client.signin();
    await until(`${id} signed in`, () => (client.user as unknown as { user_data: unknown }).user_data !== null);
    return { client, heard };
  }

  it("tell a signed-in user who of its watchlist is online, then each arrival and departure of a user's last tab", async () => {
    const bob1 = await online("w-bob");
    const ann = await online("w-ann", ["w-bob", "w-cid"]);
    await until("ann hears who is online now", () => ann.heard.length === 2);
    expect([...ann.heard].sort()).toEqual(["offline:w-cid", "online:w-bob"]);

    const cid = await online("w-cid");
    await until("cid's arrival", () => ann.heard.length === 3).catch((e) => { throw new Error(`${e} ${JSON.stringify(ann.heard)}`); });
    expect(ann.heard[2]).toBe("online:w-cid");

    // Bob has a second tab: closing one of them is no departure.
    const bob2 = await online("w-bob");
    bob1.client.disconnect();
    cid.client.disconnect();
    await until("cid's departure", () => ann.heard.length === 4);
    expect(ann.heard[3]).toBe("offline:w-cid");
    bob2.client.disconnect();
    await until("bob's departure, with his last tab", () => ann.heard.length === 5);
    expect(ann.heard[4]).toBe("offline:w-bob");
    // A user's own status is no event of its own, nor of those who do not watch it.
    expect(cid.heard).toEqual([]);
  });

  it("refuse a watchlist of more than 100 users with pusher:error, and the connection stays", async () => {
    const many = Array.from({ length: 101 }, (_, i) => `w-many-${i}`);
    const client = signingIn({ id: "w-greedy", watchlist: many });
    const errors = pusherErrors(client);
    const heard: string[] = [];
    client.user.watchlist.bind("offline", () => heard.push("offline"));
    client.signin();
    await until("the refusal", () => errors.length === 1);
    expect(errors[0]!.message).toMatch(/at most 100/);
    expect(heard).toEqual([]);
    const events = collect(await subscribed(client, "after-refusal"), "still");
    await backend().trigger("after-refusal", "still", { here: true });
    await until("the connection goes on", () => events.length === 1);
  });

  it("are no channel of the app's: the HTTP API lists none, and a client cannot subscribe to one", async () => {
    await online("w-dan", ["w-eve"]);
    const listed = await backend().get({ path: "/channels" });
    const channels = Object.keys(((await listed.json()) as { channels: Record<string, unknown> }).channels);
    expect(channels.filter((c) => c.includes("online"))).toEqual([]);
    const raw = new WebSocket(`ws://127.0.0.1:${herald.port}/app/${APP.key}?protocol=7`);
    const got: Array<{ event: string; data: unknown }> = [];
    raw.on("message", (m) => got.push(JSON.parse(m.toString())));
    try {
      await until("established", () => got.some((m) => m.event === "pusher:connection_established"));
      raw.send(JSON.stringify({ event: "pusher:subscribe", data: { channel: "!online-w-eve" } }));
      await until("refused", () => got.some((m) => m.event === "pusher:subscription_error"));
    } finally {
      raw.close();
    }
  });
});

describe("subscription counts", () => {
  it("are still told above presence.join_leave_max_members, at most every ten windows", async () => {
    const server = await Herald.start({ args: ["--config", pusherConfig(undefined, "2s", `[presence]\njoin_leave_max_members = 2\njoin_leave_window = "50ms"`)] });
    try {
      const clients = [0, 1, 2, 3, 4].map(() => connect({ server }));
      const heard = clients.map((c) => {
        const got: number[] = [];
        c.subscribe("crowded").bind("pusher:subscription_count", (d: { subscription_count: number }) => got.push(d.subscription_count));
        return got;
      });
      await until("every subscriber counts five", () => heard.every((h) => h.at(-1) === 5));
      clients[4]!.unsubscribe("crowded");
      await until("four", () => heard.slice(0, 4).every((h) => h.at(-1) === 4));
    } finally {
      await server.dispose();
    }
  });

  /** Every count `channel` is told, as it arrives. */
  function counts(channel: ReturnType<PusherClient["subscribe"]>): number[] {
    const heard: number[] = [];
    channel.bind("pusher:subscription_count", (d: { subscription_count: number }) => heard.push(d.subscription_count));
    return heard;
  }

  it("tell each subscriber how many subscriptions its channel has, as they come and go; a presence channel counts members instead", async () => {
    const hooks = await webhookReceiver();
    const server = await Herald.start({ args: ["--config", pusherConfig(hooks.url)] });
    try {
      const [a, b, c] = [connect({ server }), connect({ server }), connect({ server })];
      const atA = counts(a.subscribe("counted"));
      await until("a counts itself", () => atA.at(-1) === 1);
      const atB = counts(b.subscribe("counted"));
      await until("both count two", () => atA.at(-1) === 2 && atB.at(-1) === 2);
      const atC = counts(c.subscribe("counted"));
      await until("three", () => atA.at(-1) === 3 && atB.at(-1) === 3 && atC.at(-1) === 3);
      c.unsubscribe("counted");
      b.disconnect();
      await until("a alone again", () => atA.at(-1) === 1);
      expect((a.channel("counted") as unknown as { subscriptionCount: number }).subscriptionCount).toBe(1);
      // The webhook says the same, at least once per change, the last one last.
      await until("the webhook's last count", () => hooks.named("subscription_count", "counted").at(-1)?.subscription_count === 1);
      expect(hooks.named("subscription_count", "counted")[0]).toMatchObject({ subscription_count: expect.any(Number) });

      // A presence channel: its members are its count (pusher-js's members.count).
      const first = connect({ server, user: { user_id: "counted-1" } });
      const room = await subscribed(first, "presence-counted");
      const heard = counts(room);
      const added: string[] = [];
      room.bind("pusher:member_added", (m: { id: string }) => added.push(m.id));
      await subscribed(connect({ server, user: { user_id: "counted-2" } }), "presence-counted");
      await until("the second member's arrival", () => added.length === 1);
      expect(heard).toEqual([]);
    } finally {
      await server.dispose();
      hooks.close();
    }
  });
});

/** A real HTTP server taking the app's webhooks: each post's events, and whether its
 * signature is valid (checked by the `pusher` SDK). `answering`, when given, runs before
 * the post is answered (the backend reading the API as it hears of a change). */
async function webhookReceiver(answering?: (events: Array<Record<string, unknown>>) => Promise<void>) {
  const received: Array<{ valid: boolean; events: Array<Record<string, unknown>> }> = [];
  const hooks = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", async () => {
      const webhook = backend().webhook({ headers: req.headers as Record<string, string>, rawBody: body });
      const events = webhook.getEvents() as unknown as Array<Record<string, unknown>>;
      if (answering) await answering(events);
      received.push({ valid: webhook.isValid(), events });
      res.end("ok");
    });
  });
  await new Promise<void>((resolve) => hooks.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(hooks.address() as AddressInfo).port}/pusher/webhook`;
  /** Each event once (a post may come again: at least once, the same `id`). */
  const events = () => [...new Map(received.flatMap((r) => r.events).map((e) => [e.id, e])).values()];
  /** Events `name` about `channel`. */
  const named = (name: string, channel: string) => events().filter((e) => e.name === name && e.channel === channel);
  return { url, received, events, named, close: () => hooks.close() };
}

describe("a page that opted in to resuming", () => {
  it("is sent what it missed while away, once and in order, and not what it sent itself", async () => {
    const page = `/resume/page-${randomUUID()}`;
    const client = connect({ wsPath: page });
    // docs/pusher.md's page code: keep the proof each connection is given, and send it
    // back as the next one connects (state_change comes before pusher-js subscribes).
    let proof: string | undefined;
    client.bind("herald:page", (d: { proof: string }) => (proof = d.proof));
    client.connection.bind("state_change", ({ current }: { current: string }) => {
      if (current === "connected" && proof) client.send_event("herald:resume", { proof });
    });
    const other = connect();
    await connected(client);
    await connected(other);
    const name = "private-resume-room";
    const room = await subscribed(client, name);
    const othersRoom = await subscribed(other, name);
    const news = collect(room, "news") as Array<{ n: number }>;
    const typed = collect(room, "client-typed");
    const othersTyped = collect(othersRoom, "client-typed");
    await backend().trigger(name, "news", { n: 1 });
    await until("the first event", () => news.length === 1);
    room.trigger("client-typed", { by: "page" });
    await until("the other client hears it", () => othersTyped.length === 1);
    // A round trip after the event: the pong that confirms it was read comes first.
    await subscribed(client, "resume-round-trip");
    client.disconnect();
    await until("disconnected", () => client.connection.state === "disconnected");
    await backend().trigger(name, "news", { n: 2 });
    await backend().trigger(name, "news", { n: 3 });
    client.connect();
    await until("what it missed", () => news.length === 3);
    await backend().trigger(name, "news", { n: 4 });
    await until("live again", () => news.length === 4);
    expect(news.map((e) => e.n)).toEqual([1, 2, 3, 4]);
    expect(typed).toEqual([]);
  });

  it("closes the page's connection Herald still holds when the page is back, and takes its place", async () => {
    const path = `/resume/page-${randomUUID()}/app/${APP.key}?protocol=7`;
    /** A raw Pusher connection (the \`ws\` client answers pings by itself). */
    const open = () => {
      const ws = new WebSocket(`ws://127.0.0.1:${herald.port}${path}`);
      const got: Array<{ event: string; channel?: string; data: unknown }> = [];
      ws.on("message", (m) => got.push(JSON.parse(m.toString())));
      const closed = new Promise<number>((resolve) => ws.on("close", (c) => resolve(c)));
      return { ws, got, closed };
    };
    /** The proof a connection was given. */
    const proofOf = (c: ReturnType<typeof open>) => {
      const page = c.got.find((m) => m.event === "herald:page");
      return page && (JSON.parse(page.data as string) as { proof: string }).proof;
    };
    const subscribe = async (c: ReturnType<typeof open>, resuming?: string) => {
      await until("established", () => proofOf(c) !== undefined);
      if (resuming) c.ws.send(JSON.stringify({ event: "herald:resume", data: { proof: resuming } }));
      c.ws.send(JSON.stringify({ event: "pusher:subscribe", data: { channel: "resume-takeover" } }));
      await until("subscribed", () => c.got.some((m) => m.event === "pusher_internal:subscription_succeeded"));
    };
    const news = (c: ReturnType<typeof open>) => c.got.filter((m) => m.event === "news").map((m) => JSON.parse(m.data as string).n);
    const first = open();
    await subscribe(first);
    await backend().trigger("resume-takeover", "news", { n: 1 });
    await until("the first event", () => news(first).length === 1);
    first.ws.send(JSON.stringify({ event: "pusher:ping", data: {} }));
    await until("a round trip", () => first.got.some((m) => m.event === "pusher:pong"));
    // The same page connects again while its first connection is open (as after a drop
    // Herald has not noticed): the first is closed with 4200, the second resumes after it.
    const second = open();
    const subscribing = subscribe(second, proofOf(first));
    expect(await first.closed).toBe(4200);
    await subscribing;
    await backend().trigger("resume-takeover", "news", { n: 2 });
    await until("the next event", () => news(second).length === 1);
    expect(news(second)).toEqual([2]);
    second.ws.close();
  });

  it("is not resumed without a page in its address, and a malformed page id is refused", async () => {
    const plain = connect();
    await connected(plain);
    const room = await subscribed(plain, "resume-plain");
    const got = collect(room, "news");
    plain.disconnect();
    await until("disconnected", () => plain.connection.state === "disconnected");
    await backend().trigger("resume-plain", "news", { missed: true });
    plain.connect();
    await connected(plain);
    await backend().trigger("resume-plain", "news", { live: true });
    await until("the live event", () => got.length === 1);
    expect(got).toEqual([{ live: true }]);
    // A page id that is too short is refused with Pusher's 4005.
    const bad = new WebSocket(`ws://127.0.0.1:${herald.port}/resume/short/app/${APP.key}?protocol=7`);
    const code = await new Promise<number>((resolve) => bad.on("close", (c) => resolve(c)));
    expect(code).toBe(4005);
  });
});

describe("webhooks", () => {
  it("posts occupied and vacated once per channel, member added and removed once per user; a reload posts no vacated", async () => {
    const hooks = await webhookReceiver();
    const server = await Herald.start({ args: ["--config", pusherConfig(hooks.url)] });
    const room = "presence-occupancy";
    try {
      const first = connect({ server, user: { user_id: "dora" } });
      const second = connect({ server, user: { user_id: "dora" } });
      const public1 = connect({ server });
      await connected(first);
      await connected(second);
      await connected(public1);
      await subscribed(first, room);
      await subscribed(second, room);
      await subscribed(public1, "lobby-hooks");
      await until("occupied and added", () => hooks.named("member_added", room).length === 1 && hooks.named("channel_occupied", room).length === 1);
      await until("the public channel occupied", () => hooks.named("channel_occupied", "lobby-hooks").length === 1);
      expect(hooks.named("member_added", room)[0]).toMatchObject({ user_id: "dora" });
      // Dora's second tab closes: she is still there through the first.
      second.disconnect();
      // Her first tab closes too: she is gone at once (a tab closed is no drop), and is
      // added again when she reloads. The channel was empty for less than the app's
      // delay: no vacated, no second occupied.
      first.disconnect();
      await until("dora removed", () => hooks.named("member_removed", room).length === 1);
      const reloaded = connect({ server, user: { user_id: "dora" } });
      await connected(reloaded);
      await subscribed(reloaded, room);
      await until("dora added again", () => hooks.named("member_added", room).length === 2);
      reloaded.disconnect();
      public1.disconnect();
      await until("removed and vacated", () => hooks.named("member_removed", room).length === 2 && hooks.named("channel_vacated", room).length === 1);
      await until("the public channel vacated", () => hooks.named("channel_vacated", "lobby-hooks").length === 1);
      expect(hooks.named("channel_occupied", room)).toHaveLength(1);
      expect(hooks.named("member_removed", room)[1]).toMatchObject({ user_id: "dora" });
      expect(hooks.named("channel_occupied", "lobby-hooks")).toHaveLength(1);
      expect(hooks.named("member_added", "lobby-hooks")).toHaveLength(0);
      expect(hooks.received.every((r) => r.valid)).toBe(true);
    } finally {
      await server.dispose();
      hooks.close();
    }
  });

  // Issue #59: a member leaves once, at one moment, for everyone.
  it("keeps one presence clock: a closed tab leaves at once, a dropped connection after the grace, for the channel's clients, the API and the webhook alike", async () => {
    const room = "presence-clock";
    let server: Herald | undefined;
    /** The users GET /users listed as each member_removed webhook arrived. */
    const listedAtRemoval: Array<{ removed: unknown; users: string[] }> = [];
    const hooks = await webhookReceiver(async (events) => {
      for (const e of events.filter((e) => e.name === "member_removed" && e.channel === room)) {
        const answer = (await backend(server).get({ path: `/channels/${room}/users` })) as { json(): Promise<{ users: Array<{ id: string }> }> };
        listedAtRemoval.push({ removed: e.user_id, users: (await answer.json()).users.map((u) => u.id) });
      }
    });
    const node = await Herald.start({ args: ["--config", pusherConfig(hooks.url, "2s", '[presence]\ngrace = "3s"')] });
    server = node;
    const users = async () => {
      const answer = (await backend(node).get({ path: `/channels/${room}/users` })) as { json(): Promise<{ users: Array<{ id: string }> }> };
      return (await answer.json()).users.map((u) => u.id).sort();
    };
    const userCount = async () => {
      const answer = (await backend(node).get({ path: `/channels/${room}`, params: { info: "user_count" } })) as { json(): Promise<{ user_count: number }> };
      return (await answer.json()).user_count;
    };
    try {
      const watcher = connect({ server: node, user: { user_id: "watcher" } });
      await connected(watcher);
      const watched = await subscribed(watcher, room);
      const added = new Set<string>();
      const addedHook = (user: string) => hooks.named("member_added", room).some((e) => e.user_id === user);
      const removedAt = new Map<string, number>();
      watched.bind("pusher:member_added", (m: { id: string }) => added.add(m.id));
      watched.bind("pusher:member_removed", (m: { id: string }) => removedAt.set(m.id, Date.now()));

      // Dora closes her only tab.
      const dora = connect({ server: node, user: { user_id: "dora" } });
      await connected(dora);
      await subscribed(dora, room);
      // (Heard by the watcher first: a join and leave in one window cancel out.)
      await until("dora added", () => added.has("dora") && addedHook("dora"));
      const closedAt = Date.now();
      dora.disconnect();
      await until("the watcher hears dora leave", () => removedAt.has("dora"));
      await until("dora's webhook", () => listedAtRemoval.length === 1);
      // Well inside the grace (3 s), which is for drops.
      expect(removedAt.get("dora")! - closedAt).toBeLessThan(2000);
      expect(listedAtRemoval[0]).toEqual({ removed: "dora", users: ["watcher"] });
      expect(await users()).toEqual(["watcher"]);
      expect(await userCount()).toBe(1);

      // Eve's connection drops (no close frame): she stays for the grace, then leaves for
      // everyone, the webhook no earlier than GET /users.
      const eve = new WebSocket(`ws://127.0.0.1:${node.port}/app/${APP.key}?protocol=7`);
      const got: Array<{ event: string; data: string }> = [];
      eve.on("message", (m) => got.push(JSON.parse(m.toString())));
      await until("eve connected", () => got.some((m) => m.event === "pusher:connection_established"));
      const established = got.find((m) => m.event === "pusher:connection_established")!;
      const socketId = (JSON.parse(established.data) as { socket_id: string }).socket_id;
      const auth = backend(node).authorizeChannel(socketId, room, { user_id: "eve" });
      eve.send(JSON.stringify({ event: "pusher:subscribe", data: { channel: room, ...auth } }));
      await until("eve added", () => added.has("eve") && addedHook("eve"));
      const droppedAt = Date.now();
      eve.terminate();
      expect(await users()).toEqual(["eve", "watcher"]);
      await until("the watcher hears eve leave", () => removedAt.has("eve"));
      await until("eve's webhook", () => listedAtRemoval.length === 2);
      expect(removedAt.get("eve")! - droppedAt).toBeGreaterThanOrEqual(2900);
      expect(listedAtRemoval[1]).toEqual({ removed: "eve", users: ["watcher"] });
      expect(await userCount()).toBe(1);
    } finally {
      await node.dispose();
      hooks.close();
    }
  });

  it("posts client events and cache misses, signed as Pusher signs them", async () => {
    const { url, received, close } = await webhookReceiver();
    const hooks = { close };
    const server = await Herald.start({ args: ["--config", pusherConfig(url)] });
    try {
      const a = connect({ server, user: { user_id: "hooked" } });
      const b = connect({ server, user: { user_id: "other" } });
      await connected(a);
      await connected(b);
      const room = await subscribed(a, "presence-hooked");
      await subscribed(b, "presence-hooked");
      room.trigger("client-ping", { n: 1 });
      b.subscribe("cache-empty-for-hooks");
      const events = () => received.flatMap((r) => r.events);
      await until("both webhook events", () => events().some((e) => e.name === "client_event") && events().some((e) => e.name === "cache_miss"));
      expect(received.every((r) => r.valid)).toBe(true);
      expect(events().find((e) => e.name === "client_event")).toMatchObject({
        channel: "presence-hooked",
        event: "client-ping",
        data: JSON.stringify({ n: 1 }),
        socket_id: a.connection.socket_id,
        user_id: "hooked",
      });
      expect(events().find((e) => e.name === "cache_miss")).toMatchObject({ channel: "cache-empty-for-hooks" });
    } finally {
      await server.dispose();
      hooks.close();
    }
  });
});

describe("the signed HTTP API", () => {
  it("answers channels, a channel's counts, and batches, from the pusher SDK", async () => {
    const client = connect({ user: { user_id: "u1" } });
    await connected(client);
    await subscribed(client, "presence-stats");
    await subscribed(client, "ticker");
    const api = backend();
    const list = (await (await api.get({ path: "/channels", params: { filter_by_prefix: "presence-", info: "user_count" } })).json()) as {
      channels: Record<string, { user_count: number }>;
    };
    expect(list.channels["presence-stats"]).toEqual({ user_count: 1 });
    const one = (await (await api.get({ path: "/channels/ticker", params: { info: "subscription_count" } })).json()) as unknown;
    expect(one).toEqual({ occupied: true, subscription_count: 1 });
    const empty = (await (await api.get({ path: "/channels/nobody-here" })).json()) as unknown;
    expect(empty).toEqual({ occupied: false });

    const ticks = collect(client.channel("ticker")!, "tick");
    await api.triggerBatch([
      { channel: "ticker", name: "tick", data: { n: 1 } },
      { channel: "ticker", name: "tick", data: { n: 2 } },
    ]);
    await until("both ticks", () => ticks.length === 2);
    expect(ticks).toEqual([{ n: 1 }, { n: 2 }]);
  });

  it("refuses a stale timestamp and a body that does not match its md5", async () => {
    const body = JSON.stringify({ name: "e", channels: ["c"], data: "{}" });
    const stale = await fetch(`${herald.url}/apps/${APP.id}/events?auth_key=${APP.key}&auth_timestamp=1000&auth_version=1.0&body_md5=x&auth_signature=00`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body,
    });
    expect(stale.status).toBe(401);
    expect(await stale.text()).toContain("auth_timestamp");
    // An unknown app id is answered as a bad signature is: nothing tells which ids exist.
    const unknown = await fetch(`${herald.url}/apps/nope/events`, { method: "POST", body });
    expect(unknown.status).toBe(401);
    expect(await unknown.text()).toContain("invalid signature");
  });
});

describe("connection refusals", () => {
  /** Opens a raw WebSocket to `path`; the first message and the close code. */
  async function refusal(path: string): Promise<{ first: unknown; code: number }> {
    const ws = new WebSocket(`ws://127.0.0.1:${herald.port}${path}`);
    let first: unknown;
    ws.on("message", (m) => {
      first ??= JSON.parse(m.toString());
    });
    const code = await new Promise<number>((resolve) => ws.on("close", (c) => resolve(c)));
    return { first, code };
  }

  it("says why with pusher:error and the same close code", async () => {
    expect(await refusal(`/app/no-such-key?protocol=7`)).toMatchObject({ code: 4001, first: { event: "pusher:error", data: { code: 4001 } } });
    expect((await refusal(`/app/${APP.key}?protocol=4`)).code).toBe(4007);
    expect((await refusal(`/app/${APP.key}`)).code).toBe(4008);
    expect((await refusal(`/app/${APP.key}?protocol=x`)).code).toBe(4006);
  });

  it("answers malformed and unknown messages with pusher:error and keeps the connection", async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${herald.port}/app/${APP.key}?protocol=7`);
    const got: Array<{ event: string; data: unknown }> = [];
    ws.on("message", (m) => got.push(JSON.parse(m.toString())));
    await until("established", () => got.some((m) => m.event === "pusher:connection_established"));
    ws.send("{not json");
    ws.send(JSON.stringify({ event: "pusher:nonsense", data: {} }));
    ws.send(JSON.stringify({ event: "pusher:subscribe", data: { channel: "bad:name" } }));
    ws.send(JSON.stringify({ event: "pusher:ping", data: {} }));
    await until("pong", () => got.some((m) => m.event === "pusher:pong"));
    expect(got.filter((m) => m.event === "pusher:error").length).toBe(2);
    expect(got.some((m) => m.event === "pusher:subscription_error")).toBe(true);
    expect(ws.readyState).toBe(WebSocket.OPEN);
    ws.close();
  });
});

describe("two Herald nodes on Redis", () => {
  let redis: Redis;
  let a: Herald;
  let b: Herald;
  let hooks: Awaited<ReturnType<typeof webhookReceiver>>;
  beforeAll(async () => {
    redis = await Redis.start();
    hooks = await webhookReceiver();
    const args = ["--config", pusherConfig(hooks.url, "1s"), "--storage", "redis", "--redis-url", redis.url];
    a = await Herald.start({ args });
    b = await Herald.start({ args });
  });
  afterAll(async () => {
    await a.dispose();
    await b.dispose();
    await redis.dispose();
    hooks.close();
  });

  it("tells each user's arrival and departure once, whichever node its connections are on", async () => {
    const watcher = connect({ server: a, user: { user_id: "watcher" } });
    await connected(watcher);
    const room = await subscribed(watcher, "presence-nodes");
    const added: string[] = [];
    const removed: string[] = [];
    room.bind("pusher:member_added", (m: { id: string }) => added.push(m.id));
    room.bind("pusher:member_removed", (m: { id: string }) => removed.push(m.id));

    const onA = connect({ server: a, user: { user_id: "carol" } });
    const onB = connect({ server: b, user: { user_id: "carol" } });
    await connected(onA);
    await connected(onB);
    await subscribed(onA, "presence-nodes");
    const seenFromB = await subscribed(onB, "presence-nodes");
    await until("carol added", () => added.length === 1);
    expect((seenFromB as unknown as { members: { count: number } }).members.count).toBe(2);
    onA.disconnect();
    // Carol is still there through node b: nothing is removed, and an event published on
    // node b reaches the watcher on node a.
    const events = collect(room, "moved");
    await backend(b).trigger("presence-nodes", "moved", { to: "b" });
    await until("the event crosses nodes", () => events.length === 1);
    expect(removed).toEqual([]);
    onB.disconnect();
    await until("carol removed", () => removed.length === 1);
    expect(added).toEqual(["carol"]);
    expect(removed).toEqual(["carol"]);
  });

  // Last: it kills node b.
  it("tell a watcher on one node of a user signed in on the other", async () => {
    const fay = signingIn({ id: "n-fay", watchlist: ["n-gus"] }, a);
    const heard: string[] = [];
    for (const name of ["online", "offline"]) {
      fay.user.watchlist.bind(name, (e: { name: string; user_ids: string[] }) => heard.push(...e.user_ids.map((id) => `${e.name}:${id}`)));
    }
    fay.signin();
    await until("fay hears gus is offline", () => heard.length === 1);
    const gus = signingIn({ id: "n-gus" }, b);
    gus.signin();
    await until("gus comes online on node b", () => heard.length === 2);
    gus.disconnect();
    await until("and goes offline", () => heard.length === 3);
    expect(heard).toEqual(["offline:n-gus", "online:n-gus", "offline:n-gus"]);
  });

  it("count a channel's subscriptions over both nodes", async () => {
    const onA = connect({ server: a });
    const onB = connect({ server: b });
    const atA: number[] = [];
    const atB: number[] = [];
    onA.subscribe("counted-nodes").bind("pusher:subscription_count", (d: { subscription_count: number }) => atA.push(d.subscription_count));
    await until("one on node a", () => atA.at(-1) === 1);
    onB.subscribe("counted-nodes").bind("pusher:subscription_count", (d: { subscription_count: number }) => atB.push(d.subscription_count));
    await until("two, told on both nodes", () => atA.at(-1) === 2 && atB.at(-1) === 2);
    onB.disconnect();
    await until("one again on node a", () => atA.at(-1) === 1);
  });

  it("posts each user's and channel's webhooks once across nodes, and a killed node's leaves", async () => {
    const room = "presence-hooked-nodes";
    const erinOnA = connect({ server: a, user: { user_id: "erin" } });
    const erinOnB = connect({ server: b, user: { user_id: "erin" } });
    const frank = connect({ server: b, user: { user_id: "frank" } });
    for (const c of [erinOnA, erinOnB, frank]) await connected(c);
    await subscribed(erinOnA, room);
    await subscribed(erinOnB, room);
    await subscribed(frank, room);
    const users = (name: string) => hooks.named(name, room).map((e) => e.user_id).sort();
    await until("both users added", () => users("member_added").length === 2);
    // Erin leaves node a but stays through node b: she is not removed.
    erinOnA.disconnect();
    // Node b dies without a word: node a's sweep of b's presence is the users' and the
    // channel's leave.
    await b.stop("SIGKILL");
    await until("both users removed and the channel vacated", () => users("member_removed").length === 2 && hooks.named("channel_vacated", room).length === 1, 40_000);
    expect(users("member_added")).toEqual(["erin", "frank"]);
    expect(users("member_removed")).toEqual(["erin", "frank"]);
    expect(hooks.named("channel_occupied", room)).toHaveLength(1);
    expect(hooks.received.every((r) => r.valid)).toBe(true);
  }, 60_000);
});
