/** Herald's Protobuf codec (`protocol: "protobuf"`): the SDK reads every golden frame as
 * the JSON codec's namesake, the golden frames and the SDK's commands are what
 * crates/protocol/proto/herald.proto says (read by protobufjs), and a client speaking it
 * against a real Herald receives, publishes, resumes and takes deltas as a JSON one does. */
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import protobuf from "protobufjs";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Command } from "../src/protocol.js";
import { decodeProtobufMessages, encodeProtobufCommands } from "../src/protobuf.js";
import { client, collect, disconnectAll, next } from "./clients.js";
import { Herald, until } from "./herald.js";

const protocolCrate = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "crates", "protocol");

/** `NAME FRAME` lines of a fixture. */
function fixture(file: string): Map<string, string> {
  const lines = readFileSync(join(protocolCrate, "fixtures", file), "utf8").split("\n");
  return new Map(lines.filter((l) => l !== "" && !l.startsWith("#")).map((l) => [l.slice(0, l.indexOf(" ")), l.slice(l.indexOf(" ") + 1)]));
}

const golden = fixture("frames.protobuf.txt");
const goldenJson = fixture("frames.txt");
const schema = protobuf.parse(readFileSync(join(protocolCrate, "proto", "herald.proto"), "utf8")).root;

describe("the golden frames", () => {
  it("read as their JSON namesakes, field for field", () => {
    expect(golden.size).toBeGreaterThan(20);
    for (const [name, hex] of golden) {
      const messages = decodeProtobufMessages(Buffer.from(hex, "hex"));
      expect(messages, name).toEqual([JSON.parse(goldenJson.get(name)!)]);
    }
  });

  it("are ServerMessages as herald.proto declares them", () => {
    const ServerMessage = schema.lookupType("herald.v1.ServerMessage");
    for (const [name, hex] of golden) {
      const bytes = Buffer.from(hex, "hex");
      const reader = protobuf.Reader.create(bytes);
      const message = ServerMessage.decodeDelimited(reader);
      expect(reader.pos, name).toBe(bytes.length);
      // Written again from what the .proto let protobufjs read, it is the same bytes: no
      // field the server writes is missing from the .proto or typed otherwise there.
      const again = Buffer.from(ServerMessage.encodeDelimited(message).finish()).toString("hex");
      expect(again, name).toBe(hex);
    }
  });
});

it("the SDK's commands are Commands as herald.proto declares them", () => {
  const commands: Command[] = [
    { id: 1, method: "connect", params: { token: "t", name: "sdk" } },
    { id: 2, method: "subscribe", params: { channel: "chat:1", since: { offset: 300, epoch: "e1" }, delta: "fossil" } },
    { id: 3, method: "publish", params: { channel: "chat:1", data: { text: "hi" }, idempotency_key: "k" } },
    { id: 4, method: "history", params: { channel: "chat:1", limit: 0 } },
    { id: 5, method: "rpc", params: { method: "sum", data: [1, 2] } },
    { id: 6, method: "presence", params: { channel: "chat:1", limit: 10, cursor: "c" } },
    { id: 0, method: "ping", params: {} },
    { method: "unsubscribe", params: { channel: "chat:1" } },
  ];
  const Command = schema.lookupType("herald.v1.Command");
  const reader = protobuf.Reader.create(encodeProtobufCommands(commands));
  const read: unknown[] = [];
  while (reader.pos < reader.len) read.push(Command.toObject(Command.decodeDelimited(reader), { bytes: String, longs: Number }));
  const json = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64");
  expect(read).toEqual([
    { id: 1, connect: { token: "t", name: "sdk" } },
    { id: 2, subscribe: { channel: "chat:1", since: { offset: 300, epoch: "e1" }, delta: "fossil" } },
    { id: 3, publish: { channel: "chat:1", data: json({ text: "hi" }), idempotencyKey: "k" } },
    { id: 4, history: { channel: "chat:1", limit: 0 } },
    { id: 5, rpc: { method: "sum", data: json([1, 2]) } },
    { id: 6, presence: { channel: "chat:1", limit: 10, cursor: "c" } },
    { id: 0, ping: {} },
    { unsubscribe: { channel: "chat:1" } },
  ]);
});

describe("against a real Herald", () => {
  let server: Herald;
  beforeAll(async () => {
    server = await Herald.start();
  });
  afterEach(disconnectAll);
  afterAll(async () => {
    await server.dispose();
  });

  it("receives, publishes, reads history and takes deltas over herald.protobuf", async () => {
    const channel = "chat:protobuf";
    await server.publish(channel, { text: "before" });
    const c = client(server.url, { transports: "websocket", protocol: "protobuf" });
    const sub = c.newSubscription(channel, { since: { offset: 0 } });
    const got = collect(sub);
    const subscribed = next(sub, "subscribed");
    sub.subscribe();
    c.connect();
    expect((await subscribed).offset).toBe(1);
    await server.publish(channel, { text: "from the api", n: 2 ** 40 });
    const own = await c.publish(channel, { text: "from the client" });
    expect(own.offset).toBe(3);
    await until("three publications", () => got.length === 3);
    expect(got.map((p) => [p.offset, p.data])).toEqual([
      [1, { text: "before" }],
      [2, { text: "from the api", n: 2 ** 40 }],
      [3, { text: "from the client" }],
    ]);
    const history = await c.history(channel, { limit: 10 });
    expect(history.publications?.map((p) => p.offset)).toEqual([1, 2, 3]);
    expect(await c.rpc("no-hook", {}).catch((e: { code: number }) => e.code)).toBeGreaterThan(0);

    const dash = c.newSubscription("dash:protobuf", { delta: "fossil" });
    const versions = collect(dash);
    const dashed = next(dash, "subscribed");
    dash.subscribe();
    await dashed;
    const doc = (v: number) => ({ v, text: "a document that changes a little at a time ".repeat(20) });
    for (let v = 1; v <= 5; v++) await server.publish("dash:protobuf", doc(v));
    await until("five versions", () => versions.length === 5);
    expect(versions.map((p) => p.data)).toEqual([1, 2, 3, 4, 5].map(doc));
  });

  it("falls back to a transport that speaks JSON", async () => {
    const c = client(server.url, { transports: ["longpoll"], protocol: "protobuf" });
    const sub = c.newSubscription("chat:protobuf-fallback");
    const got = collect(sub);
    const subscribed = next(sub, "subscribed");
    sub.subscribe();
    c.connect();
    await subscribed;
    await server.publish("chat:protobuf-fallback", "hi");
    await until("the publication", () => got.length === 1);
    expect(got[0]!.data).toBe("hi");
  });
});
