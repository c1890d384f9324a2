import type { Command, ServerMessage } from "../protocol.js";

export type TransportName = "websocket" | "sse" | "stream" | "iframe" | "longpoll" | "poll";

/** What a transport tells the client. */
export interface TransportEvents {
  /** Server messages, in the order they arrived. */
  message(message: ServerMessage): void;
  /** The transport is gone; called once. `code`/`reason` come from the server when it said. */
  close(code: number, reason: string): void;
}

/**
 * One attempt to talk to the server over one transport. Session transports (WebSocket and
 * the streams) carry commands and replies like a socket; polling transports carry the
 * subscription in each request and answer commands over plain HTTP.
 */
export interface Transport {
  readonly name: TransportName;
  /** Commands in one frame (WebSocket) or one request (`POST /connection/send`). */
  send(commands: Command[]): void;
  /** Stops without reporting `close`. `code` (WebSocket: the close frame's) tells the
   * server whether the client comes back: one that reconnects (3000-3499) has its
   * presence held for the server's grace; 1000, the default, leaves at once. */
  close(code?: number): void;
  /** Silence, ms, after which this transport is taken for dead, when it is not the
   * client's (`pingInterval` + `timeout`). */
  readonly silenceLimit?: number;
}

export interface TransportContext {
  /** The server's HTTP base URL, without a trailing slash. */
  baseUrl: string;
  /** How often, ms, the connection must show it is alive (streams ask for keepalives). */
  pingInterval: number;
  events: TransportEvents;
  /** The WebSocket's codec: Herald's JSON (the default) or Protobuf (the other transports
   * always speak JSON). */
  protocol?: "json" | "protobuf";
  /** Hooks for environments without the browser's globals (Node, tests). */
  websocket?: WebSocketConstructor;
  fetch: typeof fetch;
  /** The connection token to send, if any (read at each request: it is refreshed). */
  token(): string | undefined;
  /** Subscription tokens of the channels that have one (polling sends them each time). */
  subscriptionTokens(): string[];
  /** The client id of this client's first connection: sent again (`client`) so that
   * presence sees the same member come back, not a leave and a join. */
  firstClient(): string | undefined;
  /** A poll answer's `client`, to send back with the next request. */
  rememberClient(client: string): void;
}

/** HTTP answers about tokens (401 with error 101 or 109), as the close codes WebSocket
 * uses for the same (3500 invalid, 3504 expired). */
export function authClose(code: number): number {
  return code === 101 ? 3500 : code === 109 ? 3504 : code;
}

export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocket;

export type EventSourceConstructor = new (url: string) => EventSource;

/** An HTTP error answer: its code, its words, and the channel it refused when it names one. */
export interface HttpFailure {
  code: number;
  reason: string;
  channel?: string;
}

/** Reads an HTTP error answer (`{"error": {code, message, channel?}}`). */
export async function httpFailure(response: Response): Promise<HttpFailure> {
  let code = 0;
  let reason = `HTTP ${response.status}`;
  let channel: string | undefined;
  try {
    const body = (await response.json()) as { error?: { code?: number; message?: string; channel?: string } };
    if (body.error?.code !== undefined) code = body.error.code;
    if (body.error?.message !== undefined) reason = `${reason}: ${body.error.message}`;
    if (typeof body.error?.channel === "string") channel = body.error.channel;
  } catch {
    // A proxy's HTML error page, say: the status is all there is.
  }
  // An origin refusal: retrying from this page cannot help, so it ends the client (3502,
  // "forbidden") with the server's words, which say what to add to `allowed_origins`.
  if (code === 119) return { code: 3502, reason };
  return { code: response.status === 401 ? authClose(code) : code, reason, ...(channel !== undefined ? { channel } : {}) };
}
