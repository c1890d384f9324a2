/** What a client is configured with, the events it emits, and the error its commands fail
 * with. */
import type { Position } from "./cursor.js";
import type { EventSourceConstructor, TransportName, WebSocketConstructor } from "./transport/types.js";

/** The order `transports: "auto"` tries: the best first, each next one works in more places. */
export const AUTO_TRANSPORTS: readonly TransportName[] = ["websocket", "sse", "stream", "longpoll", "poll"];

export type ClientState = "disconnected" | "connecting" | "connected";

export interface ClientOptions {
  /** One transport to use only, a list to try in order, or "auto" (the default). */
  transports?: TransportName | readonly TransportName[] | "auto";
  /** A connection token to use (sent in `connect`, or with each HTTP request). For tokens
   * that expire, give `getToken` instead (or as well): it is asked for a new one in time. */
  token?: string;
  /**
   * Fetches a connection token from your backend. Called before connecting when there is
   * no valid token, before the current one expires (one call at a time, retried with
   * jitter when it throws), and after the server closed with 3504 (expired). Resolve
   * `null` when the user has no token (signed out): the client then stops, with 3500.
   */
  getToken?: () => Promise<string | null | undefined>;
  /**
   * Fetches a subscription token for `channel` (for namespaces whose channels must be
   * granted), or resolves `null` for channels that need none. Asked before every
   * subscribe, and again when the server ends a subscription because its token expired.
   */
  getSubscriptionToken?: (channel: string) => Promise<string | null | undefined>;
  /** A name for this client, sent in `connect` (WebSocket). */
  name?: string;
  /** First reconnect delay, ms (default 500). */
  minReconnectDelay?: number;
  /** Largest reconnect delay, ms (default 20000). */
  maxReconnectDelay?: number;
  /** How long to wait for a connection to open and for a command's reply, ms (default 5000). */
  timeout?: number;
  /**
   * How often the connection must show it is alive, ms (default 9000). Streams ask the
   * server for a keepalive this often, WebSocket sends a `ping` after this much quiet, a
   * long-poll is held at most this long; a connection that then stays silent for `timeout`
   * more is taken for dead and replaced, so a dead link that nobody closes is noticed
   * within 14 s by default (9 + 5), on every transport. (The forever frame, whose page is
   * told of no cut, asks for a keepalive every 250 ms and is taken for dead after 1 s
   * without one.)
   */
  pingInterval?: number;
  /** Long-poll hold time asked of the server, seconds (default: `pingInterval`'s, 9). */
  longpollTimeout?: number;
  /** Interval polling period, ms (default 1000). */
  pollInterval?: number;
  /** Commands issued within this many ms travel in one frame (default 0: the same tick). */
  batchDelay?: number;
  /** Failed opens of a transport that has worked before it is given up for the next (default 3). */
  retriesBeforeFallback?: number;
  /**
   * The WebSocket's codec: `"json"` (the default) or `"protobuf"` (Herald's Protobuf
   * codec, binary frames: smaller and cheaper to read for numbers and small messages).
   * The HTTP transports carry text and always speak JSON, so a fallback from WebSocket
   * still works; publications' data is JSON either way.
   */
  protocol?: "json" | "protobuf";
  /** A WebSocket implementation where there is no global one (Node 20: the `ws` package). */
  websocket?: WebSocketConstructor;
  /** An EventSource implementation where there is no global one (Node: the `eventsource`
   * package's `EventSource`). */
  eventSource?: EventSourceConstructor;
  /** A fetch implementation (default: the global one). */
  fetch?: typeof fetch;
}

export interface HistoryOptions {
  /** At most this many publications (newest ones, or the first after `since`). */
  limit?: number;
  /** Publications after this position. */
  since?: Position;
}

export interface PresenceOptions {
  /** At most this many members (the server's default is 100, its cap 1000). */
  limit?: number;
  /** The previous page's `cursor`: members after it. */
  cursor?: string;
}

export interface ClientEvents {
  state: { state: ClientState; previous: ClientState };
  connecting: { code: number; reason: string; transport: TransportName };
  connected: { transport: TransportName; client: string; user: string | undefined };
  disconnected: { code: number; reason: string };
  error: { type: "transport" | "command" | "server"; code: number; message: string; transport?: TransportName };
}

/** A failed command: `code` is the server's error code (docs/protocol.md), or a client one. */
export class HeraldError extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
    this.name = "HeraldError";
  }
}
