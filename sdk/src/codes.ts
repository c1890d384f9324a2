/**
 * What a close or `disconnect` code tells the client to do. The server groups its codes by
 * range so that a client needs no table of them (docs/protocol.md, "Close codes").
 */

/** Disconnect codes the client itself uses (they never come from the server). */
export const ClientCode = {
  /** `disconnect()` was called. */
  Disconnected: 0,
  /** The transport closed without a code (network drop, refused connection). */
  TransportClosed: 1006,
  /** The transport opened but no `connect` arrived in time: a proxy may be buffering it. */
  ConnectTimeout: 3401,
  /** A ping command got no reply in time. */
  NoPong: 3402,
  /** A publication arrived out of order; the client resubscribes to resume cleanly. */
  OutOfOrder: 3403,
  /** `getToken` or `getSubscriptionToken` threw; the client retries. */
  TokenUnavailable: 3404,
  /** None of the transports asked for exists in this environment (SSE in Node without an
   * `EventSource`, say): the client stops, since trying again cannot help. */
  NoTransport: 3510,
} as const;

/** WebSocket close codes (RFC 6455) after which reconnecting cannot help. */
const FATAL_WEBSOCKET = new Set([1002, 1003, 1007, 1008, 1009, 1010]);

/** True when a client disconnected with `code` should reconnect (with backoff). */
export function shouldReconnect(code: number): boolean {
  if (code >= 3000 && code < 5000) {
    const inRange = code % 1000;
    return inRange < 500;
  }
  return !FATAL_WEBSOCKET.has(code);
}

/**
 * Error codes in command replies after which the same command may succeed later
 * (internal, limit, rate, shutting down, the application's backend or the broker
 * unavailable, an outcome not known).
 */
export function isTemporaryError(code: number): boolean {
  return code === 100 || code === 106 || code === 111 || code === 117 || code === 118 || code === 121 || code === 122;
}

/**
 * Error codes that refuse a subscription for good: the server's own (100-999) other than
 * the temporary ones, and an application's (1000-1999, from its backend's hooks).
 */
export function isRefusal(code: number): boolean {
  return code >= 100 && code < 2000 && !isTemporaryError(code);
}
