/** The JSON messages of docs/protocol.md, and the newline-delimited framing they travel in. */

import type { Position } from "./cursor.js";

export type Method =
  | "connect"
  | "subscribe"
  | "unsubscribe"
  | "publish"
  | "history"
  | "refresh"
  | "rpc"
  | "presence"
  | "presence_stats"
  | "ping";

/** One command: `{"id": N, "METHOD": {PARAMS}}`. */
export interface Command {
  id?: number;
  method: Method;
  params: Record<string, unknown>;
}

export interface ErrorBody {
  code: number;
  message: string;
}

/** Who sent a client's publication: the user of its token or connect hook, and their
 * public `info`. Absent on publications from the backend's API and from anonymous clients. */
export interface Sender {
  user: string;
  info?: unknown;
  /** The `info` of the subscription token the sender joined the channel with. */
  channel_info?: unknown;
}

/** A client in a channel (presence): its public id, and who it is when it signed in. */
export interface Member {
  /** The member's public id (not the connection's id, which stays secret). */
  client: string;
  user?: string;
  info?: unknown;
  /** The `info` of the subscription token it joined the channel with. */
  channel_info?: unknown;
}

/** A page of members; pass `cursor` back for the next one (absent on the last). */
export interface PresenceResult {
  members: Member[];
  cursor?: string;
}

/** How many are in a channel. */
export interface PresenceStatsResult {
  /** Members (clients). */
  clients: number;
  /** Distinct users among them. */
  users: number;
}

export interface PublicationData {
  offset: number;
  data: unknown;
  from?: Sender;
}

export interface ConnectResult {
  client: string;
  version: string;
  /** The server's ping interval, seconds. */
  ping: number;
  /** The user the token names (absent when anonymous). */
  user?: string;
  /** When the token expires, Unix seconds, and the same as seconds from now. */
  expires?: number;
  ttl?: number;
}

export interface RefreshResult {
  expires?: number;
  ttl?: number;
}

export interface SubscribeResult {
  channel?: string;
  epoch: string;
  offset: number;
  recovered?: boolean;
  publications?: PublicationData[];
  /** The channel's state from the application's backend (its subscribe hook), if it gave one. */
  data?: unknown;
}

/** The answer of the application's backend to an `rpc` call. */
export interface RpcResult {
  data: unknown;
}

export interface PublishResult {
  offset: number;
  epoch: string;
  /** An earlier publish with the same idempotency key stored it; this one stored nothing. */
  repeat?: true;
}

export interface PublishOptions {
  /**
   * Stored once per key and channel within the server's `idempotency_window` (5 min): send
   * the same key again when a publish failed without saying it was not stored (122).
   */
  idempotencyKey?: string;
  /**
   * Subscriptions made with `conflate` skip this publication once a later one with the same
   * key waits behind it for them (1 to 128 bytes): the newest price, score or position.
   */
  conflationKey?: string;
}

export interface HistoryResult {
  epoch: string;
  offset: number;
  publications?: PublicationData[];
}

export interface DisconnectBody {
  code: number;
  reason: string;
  reconnect?: boolean;
}

/** Anything the server sends: replies carry `id` (or `error`); pushes do not. */
export interface ServerMessage {
  id?: number;
  error?: ErrorBody;
  connect?: ConnectResult;
  subscribe?: SubscribeResult;
  /** A reply (empty), or a push ending one subscription (a subscription token expired). */
  unsubscribe?: { channel?: string; code?: number; reason?: string };
  refresh?: RefreshResult;
  publish?: PublishResult;
  history?: HistoryResult;
  rpc?: RpcResult;
  ping?: Record<string, never>;
  /** A publication: `data`, or on a subscription made with `delta: "fossil"` its data as
   * text (`full`) or the Fossil delta from the previous one's (`delta`). */
  pub?: { channel: string; offset: number; data?: unknown; full?: string; delta?: string; from?: Sender };
  /** On a subscription made with `conflate: true`: the publications after its position up
   * to `offset` were replaced by later ones of their conflation keys and will not come. */
  conflated?: { channel: string; offset: number };
  /** Who joined and left a channel during the server's last window (a batch). */
  presence?: { channel: string; join: Member[]; leave: Member[]; missed?: boolean; clients?: number };
  presence_stats?: PresenceStatsResult;
  disconnect?: DisconnectBody;
}

/** Commands as one frame: one JSON object per line. */
export function encodeCommands(commands: readonly Command[]): string {
  return commands
    .map((c) => {
      const wire: Record<string, unknown> = {};
      if (c.id !== undefined) wire["id"] = c.id;
      wire[c.method] = c.params;
      return JSON.stringify(wire);
    })
    .join("\n");
}

/** A frame (or a chunk of lines) from the server: one JSON object per non-empty line. */
export function decodeMessages(frame: string): ServerMessage[] {
  const out: ServerMessage[] = [];
  for (const line of frame.split("\n")) {
    const trimmed = line.trim();
    if (trimmed === "") continue;
    const value: unknown = JSON.parse(trimmed);
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      throw new Error(`server sent ${trimmed.slice(0, 80)}, not a JSON object`);
    }
    out.push(value as ServerMessage);
  }
  return out;
}

/**
 * Splits a growing text stream into complete lines: feed chunks as they come, get back
 * the lines that are complete; the unfinished tail waits for the next chunk.
 */
export class LineSplitter {
  private tail = "";

  push(chunk: string): string[] {
    const text = this.tail + chunk;
    const lines = text.split("\n");
    this.tail = lines.pop() ?? "";
    return lines.filter((l) => l.trim() !== "");
  }
}

export function sinceParam(position: Position | undefined): Record<string, unknown> | undefined {
  if (position === undefined) return undefined;
  return position.epoch === undefined ? { offset: position.offset } : { offset: position.offset, epoch: position.epoch };
}
