/** The client's subscriptions as the polling transports see them: each request carries
 * every channel and its position, and each answer confirms or refuses them. */
import { isRefusal } from "./codes.js";
import type { Position } from "./cursor.js";
import type { Subscription } from "./subscription.js";
import type { PollSource } from "./transport/poll.js";

export class PolledSubscriptions implements PollSource {
  constructor(private readonly subs: ReadonlyMap<string, Subscription>) {}

  channels(): Map<string, Position | undefined> {
    const out = new Map<string, Position | undefined>();
    for (const sub of this.subs.values()) {
      if (sub.state !== "unsubscribed") out.set(sub.channel, sub.position);
    }
    return out;
  }

  /** Whether a subscription asks for deltas (a poll asks for them for all its channels:
   * a subscription that did not ask takes them just as well). */
  delta(): boolean {
    return [...this.subs.values()].some((s) => s.state !== "unsubscribed" && s.delta !== undefined);
  }

  /** Whether the polls skip replaced publications: only when every subscription asks
   * (one request opens them all alike, and a subscription that did not ask gets every
   * publication). */
  conflate(): boolean {
    const open = [...this.subs.values()].filter((s) => s.state !== "unsubscribed");
    return open.length > 0 && open.every((s) => s.conflate);
  }

  answered(requested: string[], announced: Set<string>): void {
    for (const channel of requested) {
      const sub = this.subs.get(channel);
      if (sub === undefined || sub.state !== "subscribing" || announced.has(channel)) continue;
      const position = sub.position;
      if (position?.epoch !== undefined) sub.confirmed({ epoch: position.epoch, offset: position.offset, recovered: true }, true);
    }
  }

  refused(code: number, reason: string, channel?: string): boolean {
    if (!isRefusal(code)) return false;
    // The server names the channel it refused; older servers only in their words.
    const named = channel === undefined ? undefined : this.subs.get(channel);
    if (named !== undefined && named.state !== "unsubscribed") {
      named.failed(code, reason);
      return true;
    }
    const unconfirmed = [...this.subs.values()].filter((s) => s.state === "subscribing" && !s.confirmedOnce);
    const mentioned = unconfirmed.filter((s) => reason.includes(s.channel));
    const culprits = mentioned.length > 0 ? mentioned : unconfirmed;
    if (culprits.length === 0) return false;
    for (const sub of culprits) sub.failed(code, reason);
    return true;
  }
}
