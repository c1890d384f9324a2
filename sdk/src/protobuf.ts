/**
 * Herald's Protobuf codec (crates/protocol/proto/herald.proto, WebSocket subprotocol
 * `herald.protobuf`): commands written and server messages read as the same objects the
 * JSON codec gives, so that nothing past the transport knows which one it speaks. Each
 * message is length-delimited (a varint, then its bytes), several to a binary frame.
 *
 * A reader and writer of its own for the messages of one schema (about 150 lines), not a
 * Protobuf library: the SDK stays one small file. The tests hold it to the `.proto` with
 * protobufjs and to the server's golden frames.
 */

import type { Command, ServerMessage } from "./protocol.js";

const utf8 = new TextEncoder();
const text = new TextDecoder();

// ---- writing commands

class Writer {
  bytes: number[] = [];

  varint(n: number): void {
    while (n > 0x7f) {
      this.bytes.push((n % 0x80) | 0x80);
      n = Math.floor(n / 0x80);
    }
    this.bytes.push(n);
  }

  /** A varint field, written when given (`optional` fields are written even when 0). */
  number(field: number, n: unknown): void {
    if (typeof n !== "number") return;
    this.varint(field * 8);
    this.varint(n);
  }

  /** A length-delimited field: a string, bytes, or a nested message. */
  bytesField(field: number, value: Uint8Array | undefined): void {
    if (value === undefined) return;
    this.varint(field * 8 + 2);
    this.varint(value.length);
    for (const b of value) this.bytes.push(b);
  }

  string(field: number, s: unknown): void {
    if (typeof s === "string") this.bytesField(field, utf8.encode(s));
  }

  message(field: number, write: (w: Writer) => void): void {
    const inner = new Writer();
    write(inner);
    this.bytesField(field, Uint8Array.from(inner.bytes));
  }
}

/** `Command.method`'s field numbers, by method. */
const METHOD_FIELDS: Record<Command["method"], number> = {
  connect: 2,
  subscribe: 3,
  unsubscribe: 4,
  publish: 5,
  history: 6,
  refresh: 7,
  rpc: 8,
  presence: 9,
  presence_stats: 10,
  ping: 11,
};

type Params = Record<string, unknown>;

function since(w: Writer, field: number, value: unknown): void {
  if (typeof value !== "object" || value === null) return;
  const s = value as Params;
  w.message(field, (m) => {
    if (s["offset"] !== 0) m.number(1, s["offset"]);
    m.string(2, s["epoch"]);
  });
}

/** A JSON value as the bytes of its text (data is JSON text on this wire too). */
function json(w: Writer, field: number, value: unknown): void {
  if (value !== undefined) w.bytesField(field, utf8.encode(JSON.stringify(value)));
}

/** The parameters of each method, field by field as herald.proto numbers them. */
const WRITE_PARAMS: Record<Command["method"], (w: Writer, p: Params) => void> = {
  connect: (w, p) => ["token", "name", "version", "client"].forEach((k, i) => w.string(i + 1, p[k])),
  subscribe: (w, p) => {
    w.string(1, p["channel"]);
    since(w, 2, p["since"]);
    w.string(3, p["token"]);
    w.string(4, p["delta"]);
    if (p["conflate"] === true) w.number(5, 1);
  },
  unsubscribe: (w, p) => w.string(1, p["channel"]),
  publish: (w, p) => {
    w.string(1, p["channel"]);
    json(w, 2, p["data"]);
    w.string(3, p["idempotency_key"]);
    w.string(4, p["conflation_key"]);
  },
  history: (w, p) => {
    w.string(1, p["channel"]);
    since(w, 2, p["since"]);
    w.number(3, p["limit"]);
  },
  refresh: (w, p) => {
    w.string(1, p["channel"]);
    w.string(2, p["token"]);
  },
  rpc: (w, p) => {
    w.string(1, p["method"]);
    json(w, 2, p["data"]);
  },
  presence: (w, p) => {
    w.string(1, p["channel"]);
    w.number(2, p["limit"]);
    w.string(3, p["cursor"]);
  },
  presence_stats: (w, p) => w.string(1, p["channel"]),
  ping: () => undefined,
};

/** Commands as one binary frame: each a length-delimited `Command`. */
export function encodeProtobufCommands(commands: readonly Command[]): Uint8Array {
  const frame = new Writer();
  for (const c of commands) {
    const command = new Writer();
    command.number(1, c.id);
    command.message(METHOD_FIELDS[c.method], (w) => WRITE_PARAMS[c.method](w, c.params));
    frame.varint(command.bytes.length);
    frame.bytes.push(...command.bytes);
  }
  return Uint8Array.from(frame.bytes);
}

// ---- reading server messages

/**
 * How a field is read: a varint as a number (`u`) or a boolean (`b`), bytes as a string
 * (`s`), as JSON text (`j`), or a nested message (a schema). Repeated fields are listed
 * with `[]` after their name.
 */
type Kind = "u" | "b" | "s" | "j" | Schema;
interface Schema {
  fields: Record<number, [string, Kind]>;
  /** Fields the JSON codec always writes, with the value Protobuf leaves out. */
  defaults?: () => Record<string, unknown>;
}

const PUBLICATION: Schema = { fields: { 1: ["offset", "u"], 2: ["data", "j"], 3: ["from", "j"] }, defaults: () => ({ offset: 0 }) };
const STREAM: Schema = {
  fields: { 1: ["channel", "s"], 2: ["epoch", "s"], 3: ["offset", "u"], 4: ["recovered", "b"], 5: ["publications[]", PUBLICATION], 6: ["data", "j"], 7: ["delta", "s"] },
  defaults: () => ({ epoch: "", offset: 0 }),
};
/** A member: its `client`, and its other fields (a JSON object) beside it. */
const MEMBER: Schema = { fields: { 1: ["client", "s"], 2: ["...", "j"] }, defaults: () => ({ client: "" }) };
const EXPIRY: Schema = { fields: { 1: ["expires", "u"], 2: ["ttl", "u"] } };
const SERVER_MESSAGE: Schema = {
  fields: {
    1: ["id", "u"],
    2: ["error", { fields: { 1: ["code", "u"], 2: ["message", "s"], 3: ["channel", "s"] }, defaults: () => ({ code: 0, message: "" }) }],
    3: [
      "connect",
      { fields: { 1: ["client", "s"], 2: ["version", "s"], 3: ["ping", "u"], 4: ["user", "s"], 5: ["expires", "u"], 6: ["ttl", "u"] }, defaults: () => ({ client: "", version: "", ping: 0 }) },
    ],
    4: ["subscribe", STREAM],
    5: ["unsubscribe", { fields: { 1: ["channel", "s"], 2: ["code", "u"], 3: ["reason", "s"] } }],
    6: ["publish", { fields: { 1: ["offset", "u"], 2: ["epoch", "s"], 3: ["repeat", "b"] }, defaults: () => ({ offset: 0, epoch: "" }) }],
    7: ["history", STREAM],
    8: ["refresh", EXPIRY],
    9: ["rpc", { fields: { 1: ["data", "j"] } }],
    10: ["presence", { fields: { 1: ["channel", "s"], 2: ["members[]", MEMBER], 3: ["cursor", "s"], 4: ["join[]", MEMBER], 5: ["leave[]", MEMBER], 6: ["missed", "b"], 7: ["clients", "u"] } }],
    11: ["presence_stats", { fields: { 1: ["clients", "u"], 2: ["users", "u"] }, defaults: () => ({ clients: 0, users: 0 }) }],
    12: ["ping", { fields: {} }],
    13: ["pub", { fields: { 1: ["channel", "s"], 2: ["offset", "u"], 3: ["data", "j"], 4: ["from", "j"], 5: ["full", "s"], 6: ["delta", "s"] }, defaults: () => ({ channel: "", offset: 0 }) }],
    14: ["disconnect", { fields: { 1: ["code", "u"], 2: ["reason", "s"], 3: ["reconnect", "b"] }, defaults: () => ({ code: 0, reason: "", reconnect: false }) }],
    15: ["conflated", { fields: { 1: ["channel", "s"], 2: ["offset", "u"] }, defaults: () => ({ channel: "", offset: 0 }) }],
  },
};

class Reader {
  at = 0;
  constructor(readonly bytes: Uint8Array) {}

  varint(): number {
    let n = 0;
    let scale = 1;
    for (;;) {
      if (this.at >= this.bytes.length) throw new Error("a Protobuf message is cut short");
      const b = this.bytes[this.at++]!;
      n += (b & 0x7f) * scale;
      if (b < 0x80) return n;
      scale *= 0x80;
      if (scale > 2 ** 63) throw new Error("a Protobuf varint is too long");
    }
  }

  take(length: number): Uint8Array {
    if (this.at + length > this.bytes.length) throw new Error("a Protobuf message is cut short");
    const part = this.bytes.subarray(this.at, this.at + length);
    this.at += length;
    return part;
  }
}

function read(bytes: Uint8Array, schema: Schema): Record<string, unknown> {
  const out: Record<string, unknown> = schema.defaults?.() ?? {};
  const r = new Reader(bytes);
  while (r.at < bytes.length) {
    const key = r.varint();
    const [field, wireType] = [Math.floor(key / 8), key % 8];
    const value = wireType === 0 ? r.varint() : wireType === 2 ? r.take(r.varint()) : undefined;
    if (value === undefined) throw new Error(`unexpected Protobuf wire type ${wireType}`);
    const known = schema.fields[field];
    // Fields this SDK does not know (a newer server's) are skipped.
    if (known === undefined) continue;
    const [name, kind] = known;
    const item = kind === "u" ? value : kind === "b" ? value !== 0 : kind === "s" ? text.decode(value as Uint8Array) : kind === "j" ? JSON.parse(text.decode(value as Uint8Array)) : read(value as Uint8Array, kind);
    if (name === "...") Object.assign(out, item);
    else if (name.endsWith("[]")) ((out[name.slice(0, -2)] ??= []) as unknown[]).push(item);
    else out[name] = item;
  }
  return out;
}

/** A binary frame from the server: its length-delimited messages, as the JSON codec gives them. */
export function decodeProtobufMessages(frame: Uint8Array): ServerMessage[] {
  const out: ServerMessage[] = [];
  const r = new Reader(frame);
  while (r.at < frame.length) {
    const message = read(r.take(r.varint()), SERVER_MESSAGE) as ServerMessage;
    // The JSON codec always writes a presence push's two lists, and a page's members.
    const presence = message.presence as (ServerMessage["presence"] & { members?: unknown[] }) | undefined;
    if (presence !== undefined && message.id === undefined) {
      presence.join ??= [];
      presence.leave ??= [];
    } else if (presence !== undefined) {
      presence.members ??= [];
    }
    out.push(message);
  }
  return out;
}
