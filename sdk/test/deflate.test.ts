/** permessage-deflate (RFC 7692) with the real `ws` client from npm: negotiated with no
 * context takeover, publications and replies compressed on the wire, compressed commands
 * read, a compressed bomb closed with 1009 while others carry on; plain frames for a
 * client that offers nothing, and nothing negotiated when compression is off. */
import { writeFileSync } from "node:fs";
import type { Socket } from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { Herald, scratchDir, until } from "./herald.js";

let herald: Herald;

beforeAll(async () => {
  herald = await Herald.start();
});
afterAll(async () => {
  await herald.dispose();
});

/** A Herald connection over `ws`, collecting every line the server sends. */
class Conn {
  readonly lines: Array<Record<string, unknown>> = [];
  private next = 1;
  private constructor(
    readonly ws: WebSocket,
    /** The server's Sec-WebSocket-Extensions answer. */
    readonly answer: string,
  ) {
    ws.on("message", (m) => {
      for (const line of m.toString().split("\n")) this.lines.push(JSON.parse(line) as Record<string, unknown>);
    });
  }

  static async open(server: Herald, options: WebSocket.ClientOptions): Promise<Conn> {
    const ws = new WebSocket(`ws://127.0.0.1:${server.port}/connection/websocket`, options);
    let answer = "";
    ws.once("upgrade", (res) => (answer = String(res.headers["sec-websocket-extensions"] ?? "")));
    await new Promise((resolve, reject) => {
      ws.once("open", resolve);
      ws.once("error", reject);
    });
    const c = new Conn(ws, answer);
    await c.call({ connect: {} });
    return c;
  }

  /** Bytes read from the socket so far: what travelled on the wire. */
  get wireBytes(): number {
    return (this.ws as unknown as { _socket: Socket })._socket.bytesRead;
  }

  async call(command: Record<string, unknown>): Promise<Record<string, unknown>> {
    const id = this.next++;
    this.ws.send(JSON.stringify({ id, ...command }));
    await until(`reply ${id}`, () => this.lines.some((l) => l["id"] === id));
    const reply = this.lines.find((l) => l["id"] === id)!;
    expect(reply["error"], JSON.stringify(reply)).toBeUndefined();
    return reply;
  }

  async publication(channel: string, offset: number): Promise<unknown> {
    type Pub = { channel: string; offset: number; data: unknown };
    const found = () => this.lines.map((l) => l["pub"] as Pub | undefined).find((p) => p?.channel === channel && p.offset === offset);
    await until(`${channel} offset ${offset}`, () => found() !== undefined);
    return found()!.data;
  }

  closed(): Promise<{ code: number; reason: string }> {
    return new Promise((resolve) => this.ws.once("close", (code, reason) => resolve({ code, reason: reason.toString() })));
  }
}

/** About 1 KB of the JSON a dashboard or shop pushes. */
function catalogue(n: number): unknown {
  return {
    updated: "2026-11-27T10:00:00Z",
    items: Array.from({ length: 12 }, (_, i) => ({ id: n * 100 + i, name: `widget ${i}`, price: 12.5 + i, currency: "EUR", stock: 40 - i, tags: ["new", "sale"] })),
  };
}

describe("a client that offers deflate", () => {
  it("gets it without context takeover, and its publications arrive compressed on the wire", async () => {
    const c = await Conn.open(herald, { perMessageDeflate: true });
    expect(c.ws.extensions).toBe("permessage-deflate");
    expect(c.answer).toBe("permessage-deflate; server_no_context_takeover; client_no_context_takeover");
    await c.call({ subscribe: { channel: "chat:deflate" } });
    const plain = Buffer.byteLength(JSON.stringify(catalogue(1)));
    expect(plain).toBeGreaterThan(900);
    const before = c.wireBytes;
    for (let n = 1; n <= 5; n++) await herald.publish("chat:deflate", catalogue(n));
    for (let n = 1; n <= 5; n++) expect(await c.publication("chat:deflate", n)).toEqual(catalogue(n));
    // Five pushes of ~1 KB each took less than a third of that on the wire.
    expect(c.wireBytes - before).toBeLessThan((5 * plain) / 3);
    c.ws.close();
  });

  it("sends compressed commands (ws compresses every message with threshold 0), and is answered", async () => {
    const c = await Conn.open(herald, { perMessageDeflate: { threshold: 0 } });
    await c.call({ subscribe: { channel: "chat:both-ways" } });
    const published = await c.call({ publish: { channel: "chat:both-ways", data: catalogue(7) } });
    expect(published["publish"]).toMatchObject({ offset: 1 });
    expect(await c.publication("chat:both-ways", 1)).toEqual(catalogue(7));
    // A history reply larger than a frame (16 KiB) comes compressed, in fragments.
    for (let n = 2; n <= 40; n++) await herald.publish("chat:both-ways", catalogue(n));
    const history = await c.call({ history: { channel: "chat:both-ways", since: { offset: 0 }, limit: 40 } });
    expect((history["history"] as { publications: unknown[] }).publications).toHaveLength(40);
    c.ws.close();
  });

  it("reads a burst of concurrent publications whole, every offset once and in order", async () => {
    const c = await Conn.open(herald, { perMessageDeflate: true });
    await c.call({ subscribe: { channel: "chat:burst" } });
    await Promise.all(Array.from({ length: 300 }, (_, i) => herald.publish("chat:burst", { n: i, ...(catalogue(i) as object) })));
    await c.publication("chat:burst", 300);
    // Every offset once, in order, and every publication's data whole.
    const pubs = c.lines.map((l) => l["pub"] as { channel: string; offset: number; data: { n: number } } | undefined).filter((p) => p?.channel === "chat:burst");
    expect(pubs.map((p) => p!.offset)).toEqual(Array.from({ length: 300 }, (_, i) => i + 1));
    expect(pubs.map((p) => p!.data.n).sort((a, b) => a - b)).toEqual(Array.from({ length: 300 }, (_, i) => i));
    for (const p of pubs) expect(p!.data).toEqual({ n: p!.data.n, ...(catalogue(p!.data.n) as object) });
    c.ws.close();
  });

  it("is closed with 1009 when a compressed message inflates past the limit; a bystander is still served", async () => {
    const bystander = await Conn.open(herald, { perMessageDeflate: true });
    await bystander.call({ subscribe: { channel: "chat:after-bomb" } });
    const bomber = await Conn.open(herald, { perMessageDeflate: { threshold: 0 } });
    const closed = bomber.closed();
    // 10 MB of one letter: about 10 KB compressed, under the 64 KiB frame limit.
    bomber.ws.send("a".repeat(10_000_000));
    const { code, reason } = await closed;
    expect(code).toBe(1009);
    expect(reason).toContain("65536");
    await herald.publish("chat:after-bomb", { still: "here" });
    expect(await bystander.publication("chat:after-bomb", 1)).toEqual({ still: "here" });
    bystander.ws.close();
  });
});

describe("a client that offers nothing", () => {
  it("gets plain frames", async () => {
    const c = await Conn.open(herald, { perMessageDeflate: false });
    expect(c.ws.extensions).toBe("");
    expect(c.answer).toBe("");
    await c.call({ subscribe: { channel: "chat:plain" } });
    const before = c.wireBytes;
    await herald.publish("chat:plain", catalogue(1));
    expect(await c.publication("chat:plain", 1)).toEqual(catalogue(1));
    expect(c.wireBytes - before).toBeGreaterThan(Buffer.byteLength(JSON.stringify(catalogue(1))));
    c.ws.close();
  });
});

describe('[websocket] compression = "off"', () => {
  it("declines deflate, and the client carries on uncompressed", async () => {
    const file = join(scratchDir("herald-deflate-"), "herald.toml");
    writeFileSync(file, `[websocket]\ncompression = "off"\n`);
    const off = await Herald.start({ args: ["--config", file] });
    try {
      const c = await Conn.open(off, { perMessageDeflate: { threshold: 0 } });
      expect(c.answer).toBe("");
      await c.call({ subscribe: { channel: "chat:off" } });
      await off.publish("chat:off", catalogue(2));
      expect(await c.publication("chat:off", 1)).toEqual(catalogue(2));
      c.ws.close();
    } finally {
      await off.dispose();
    }
  });
});
