/** SDK clients for tests, with fast reconnects, all disconnected by `disconnectAll`. */
import WebSocket from "ws";
import { Client, type ClientOptions, type Publication, type Subscription } from "../src/index.js";
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
