/** SDK clients for tests, with fast reconnects, all disconnected by `disconnectAll`. */
import WebSocket from "ws";
import { Client, type ClientOptions, type Publication, type SubscribedContext, type Subscription } from "../src/index.js";
import type { Emitter } from "../src/emitter.js";

export const NodeWebSocket = WebSocket as unknown as NonNullable<ClientOptions["websocket"]>;
const clients: Client[] = [];

export function client(url: string, options: ClientOptions = {}): Client {
  const c = new Client(url, { websocket: NodeWebSocket, minReconnectDelay: 50, maxReconnectDelay: 500, timeout: 3000, pollInterval: 100, ...options });
  clients.push(c);
  return c;
}

export function disconnectAll(): void {
  for (const c of clients.splice(0)) c.disconnect();
}

export function collect(sub: Subscription): Publication[] {
  const got: Publication[] = [];
  sub.on("publication", (p) => got.push(p));
  return got;
}

/** The next `event` from `emitter` (that `accept` takes). */
export function next<E extends { [K in keyof E]: unknown }, K extends keyof E>(
  emitter: Emitter<E>,
  event: K,
  accept: (ctx: E[K]) => boolean = () => true,
): Promise<E[K]> {
  return new Promise((resolve) => {
    const off = emitter.on(event, (ctx) => {
      if (accept(ctx)) {
        off();
        resolve(ctx);
      }
    });
  });
}

/** A client of `url` subscribed to `channel`: it connects and resolves once subscribed,
 * collecting every publication from then on. */
export async function subscribed(
  url: string,
  channel: string,
  options: ClientOptions = {},
): Promise<{ client: Client; sub: Subscription; got: Publication[]; context: SubscribedContext }> {
  const c = client(url, options);
  const sub = c.newSubscription(channel);
  const got = collect(sub);
  const ready = next(sub, "subscribed");
  sub.subscribe();
  c.connect();
  return { client: c, sub, got, context: await ready };
}

/** A raw WebSocket to a Herald (no SDK), with every JSON line it receives, in order. */
export async function rawSocket(url: string): Promise<{ ws: WebSocket; lines: Record<string, unknown>[] }> {
  const ws = new WebSocket(`${url.replace("http", "ws")}/connection/websocket`);
  const lines: Record<string, unknown>[] = [];
  ws.on("message", (m) => {
    for (const line of m.toString().split("\n")) lines.push(JSON.parse(line) as Record<string, unknown>);
  });
  await new Promise((resolve) => ws.once("open", resolve));
  return { ws, lines };
}
