/** Who sent a publication: a signed-in client's publications carry `from` (the token's user
 * and `info`) live and from history, over every transport Node has; the backend's do not. */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { TransportName } from "../src/index.js";
import { client, disconnectAll, subscribed } from "./clients.js";
import { Herald, signedToken, until } from "./herald.js";

const SECRET = "a-sender-test-secret-of-at-least-32-bytes";
let server: Herald;

beforeAll(async () => {
  server = await Herald.start({ env: { HERALD_AUTH__HMAC_SECRET: SECRET } });
});
afterEach(disconnectAll);
afterAll(async () => {
  await server.dispose();
});

function token(user: string, info: unknown): string {
  return signedToken(SECRET, user, info);
}

describe.each(["websocket", "stream", "longpoll", "poll"] as TransportName[])("over %s", (transport) => {
  it("a signed-in client's publications say who sent them", async () => {
    const channel = `chat:from-${transport}`;
    const { client: reader, got } = await subscribed(server.url, channel, { transports: transport });
    const writer = client(server.url, { transports: "websocket", token: token("ann", { name: "Ann" }) });
    writer.connect();
    await writer.publish(channel, { text: "hi" });
    await server.publish(channel, "from the backend");
    await until("both publications", () => got.length === 2);
    expect(got[0]!.from).toEqual({ user: "ann", info: { name: "Ann" } });
    expect(got[1]!.from).toBeUndefined();
    const history = await reader.history(channel, { since: { offset: 0 } });
    expect(history.publications?.map((p) => p.from)).toEqual([{ user: "ann", info: { name: "Ann" } }, undefined]);
  });
});
