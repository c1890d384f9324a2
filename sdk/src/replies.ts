/** Commands waiting for their replies, by id. */
import { ClientCode } from "./codes.js";
import { HeraldError } from "./options.js";
import type { ServerMessage } from "./protocol.js";

interface Pending {
  resolve(result: unknown): void;
  reject(error: HeraldError): void;
  timer: ReturnType<typeof setTimeout>;
}

/** Each command gets an id; the reply with that id settles it, with its result or its
 * error. No reply within `timeout` rejects it with 3402, and a connection's end rejects
 * every command still waiting. */
export class Replies {
  private nextId = 0;
  private readonly pending = new Map<number, Pending>();

  constructor(private readonly timeout: number) {}

  /** A new command id, whose reply will settle `resolve` or `reject`. */
  expect(resolve: (result: unknown) => void, reject: (error: HeraldError) => void): number {
    this.nextId += 1;
    const id = this.nextId;
    const timer = setTimeout(() => {
      this.pending.delete(id);
      reject(new HeraldError(ClientCode.NoPong, `no reply within ${this.timeout} ms`));
    }, this.timeout);
    this.pending.set(id, { resolve, reject, timer });
    return id;
  }

  /** Settles the command a reply answers (a reply to none is dropped: it timed out). */
  settle(m: ServerMessage & { id: number }): void {
    const pending = this.pending.get(m.id);
    if (pending === undefined) return;
    this.pending.delete(m.id);
    clearTimeout(pending.timer);
    if (m.error !== undefined) pending.reject(new HeraldError(m.error.code, m.error.message));
    else pending.resolve(firstResult(m));
  }

  /** Rejects every command still waiting. */
  rejectAll(error: HeraldError): void {
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      this.pending.delete(id);
      p.reject(error);
    }
  }
}

function firstResult(m: ServerMessage): unknown {
  for (const key of ["connect", "subscribe", "unsubscribe", "publish", "history", "refresh", "rpc", "presence", "presence_stats", "ping"] as const) {
    if (m[key] !== undefined) return m[key];
  }
  return {};
}
