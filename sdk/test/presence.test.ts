/** Presence over every transport Node has: who is in a channel, counts, and join/leave. */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Member, TransportName } from "../src/index.js";
import { disconnectAll, next, subscribed } from "./clients.js";
import { Herald, signedToken } from "./herald.js";

const SECRET = "a-presence-test-secret-of-at-least-32-bytes";
let server: Herald;

beforeAll(async () => {
  server = await Herald.start({
    env: {
      HERALD_AUTH__HMAC_SECRET: SECRET,
      HERALD_PRESENCE__JOIN_LEAVE_WINDOW: "50ms",
      HERALD_PRESENCE__GRACE: "200ms",
      HERALD_PRESENCE__POLL_GRACE: "300ms",
      HERALD_PRESENCE__JOIN_LEAVE_MAX_MEMBERS: "3",
    },
  });
});
afterEach(disconnectAll);
afterAll(async () => {
  await server.dispose();
});

function token(user: string, info: unknown): string {
  return signedToken(SECRET, user, info);
}

describe.each(["websocket", "stream", "longpoll", "poll"] as TransportName[])("over %s", (transport) => {
  it("shows who is in the channel and who comes and goes", async () => {
    const channel = `chat:presence-${transport}`;
    const watcher = await subscribed(server.url, channel, { transports: "websocket", token: token("ann", { name: "Ann" }) });
    const joined = next(watcher.sub, "join", (e) => e.member.user === "bob");
    const member = await subscribed(server.url, channel, { transports: transport, token: token("bob", { name: "Bob" }) });
    const join = await joined;
    expect(join.member).toMatchObject({ user: "bob", info: { name: "Bob" } });

    expect(await member.sub.presenceStats()).toEqual({ clients: 2, users: 2 });
    const page = await member.sub.presence({ limit: 1 });
    expect(page.members).toHaveLength(1);
    const rest = await member.sub.presence({ limit: 1, cursor: page.cursor });
    const everyone: Member[] = [...page.members, ...rest.members];
    expect(everyone.map((m) => m.user).sort()).toEqual(["ann", "bob"]);
    expect(everyone.find((m) => m.user === "bob")?.client).toBe(join.member.client);

    const left = next(watcher.sub, "leave", (e) => e.member.client === join.member.client);
    member.client.disconnect();
    expect((await left).member.user).toBe("bob");
  });
});

it("says when joins and leaves stop being pushed, above the member threshold", async () => {
  const channel = "chat:presence-crowd";
  const watcher = await subscribed(server.url, channel, { transports: "websocket", token: token("ann", null) });
  const missed = next(watcher.sub, "missed", () => true);
  for (const user of ["bob", "cy", "dee"]) {
    await subscribed(server.url, channel, { transports: "websocket", token: token(user, null) });
  }
  expect(await missed).toEqual({ channel });
  expect(await watcher.sub.presenceStats()).toEqual({ clients: 4, users: 4 });
});

it("presence of a namespace without it is refused with 108", async () => {
  const { sub } = await subscribed(server.url, "plain", { transports: "websocket", token: token("cy", null) });
  await expect(sub.presenceStats()).rejects.toMatchObject({ code: 108 });
});
