/** The SDK with Herald's backend hooks, answered by the example backend of docs/hooks.md
 * (a real Node HTTP server): `rpc`, a channel's state on subscribe, and a stored-then-
 * broadcast publication, over every transport Node has. */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { ClientCode, HeraldError, type TransportName } from "../src/index.js";
import { client, collect, disconnectAll, next, subscribed } from "./clients.js";
import { startTryIt, type TryIt } from "./example.js";
import { Herald, until } from "./herald.js";

let tryIt: TryIt;
let server: Herald;

beforeAll(async () => {
  tryIt = await startTryIt();
  server = tryIt.server;
});
afterEach(disconnectAll);
afterAll(async () => {
  await tryIt?.dispose();
});

const NODE_TRANSPORTS: TransportName[] = ["websocket", "stream", "longpoll", "poll"];

describe.each(NODE_TRANSPORTS)("over %s", (transport) => {
  it("rpc is answered by the backend, and its refusals keep their code", async () => {
    const c = client(server.url, { transports: transport });
    c.connect();
    await next(c, "connected");
    expect(await c.rpc("whoami")).toEqual({ user: null, transport: expect.any(String) });
    const refused = await c.rpc("nope").catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(HeraldError);
    expect((refused as HeraldError).code).toBe(1004);
  });

  it("a subscription gets the room's state, and publications are stored then broadcast", async () => {
    const room = `room:${transport}`;
    const { client: c, got, context } = await subscribed(server.url, room, { transports: transport });
    expect(context.data).toEqual({ topic: `Welcome to ${room}`, messages: 0 });
    await c.publish(room, { text: " hello " });
    await until("the stored publication", () => got.length === 1);
    expect(got[0]!.data).toMatchObject({ text: "hello", by: "guest" });
    expect(await c.rpc("messages", { room })).toEqual([got[0]!.data]);
    const refused = await c.publish(room, { text: "" }).catch((e: unknown) => e);
    expect((refused as HeraldError).code).toBe(1001);
  });
});

describe.each(NODE_TRANSPORTS)("a room the backend refuses, over %s", (transport) => {
  it("ends that subscription with the backend's code and keeps the others and the connection", async () => {
    const c = client(server.url, { transports: transport });
    const staff = c.newSubscription("room:staff");
    const lobby = c.newSubscription(`room:lobby-${transport}`);
    const got = collect(lobby);
    const ended = next(staff, "unsubscribed");
    const errored = next(staff, "error");
    const ready = next(lobby, "subscribed");
    const disconnects: unknown[] = [];
    c.on("connecting", (e) => {
      if (e.code !== 0) disconnects.push(e);
    });
    // Both asked for at once: one request carries both on the polling transports.
    staff.subscribe();
    lobby.subscribe();
    c.connect();
    const [unsubscribed, error] = await Promise.all([ended, errored]);
    expect(unsubscribed.code).toBe(1003);
    expect(unsubscribed.reason).toContain("staff only");
    expect(error.code).toBe(1003);
    await ready;
    await server.publish(`room:lobby-${transport}`, { text: "still here" });
    await until("the lobby's publication", () => got.length === 1);
    expect(staff.state).toBe("unsubscribed");
    expect(c.state).toBe("connected");
    expect(disconnects).toEqual([]);
  });
});

describe("SSE where there is no EventSource (Node)", () => {
  it("fails once, naming the package that provides one", async () => {
    const c = client(server.url, { transports: "sse" });
    const errors: { code: number; message: string }[] = [];
    c.on("error", (e) => errors.push(e));
    const stopped = next(c, "disconnected");
    c.connect();
    const { code, reason } = await stopped;
    expect(code).toBe(ClientCode.NoTransport);
    expect(reason).toContain("eventsource");
    expect(errors).toHaveLength(1);
    expect(c.state).toBe("disconnected");
  });
});
