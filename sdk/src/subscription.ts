import { Emitter } from "./emitter.js";
import { applyDelta, DeltaError } from "./delta.js";
import type { Position } from "./cursor.js";
import type { HistoryResult, Member, PresenceResult, PresenceStatsResult, PublishOptions, PublishResult, Sender, SubscribeResult } from "./protocol.js";
import type { HistoryOptions, PresenceOptions } from "./options.js";

export type SubscriptionState = "unsubscribed" | "subscribing" | "subscribed";

export interface Publication {
  channel: string;
  offset: number;
  epoch: string | undefined;
  data: unknown;
  /** Who sent it, when a signed-in client did (see `Sender`). */
  from?: Sender;
}

export interface SubscribedContext {
  channel: string;
  epoch: string;
  /** The newest offset the subscription has now. */
  offset: number;
  /** True when the subscription resumed from a position it already had. */
  resumed: boolean;
  /**
   * Only when `resumed`: true when every publication since the position followed (nothing
   * missed); false when history could not cover the gap, so the application must reload
   * its state (for example with `history()`) because publications were missed.
   */
  recovered: boolean | undefined;
  /** The channel's state from the application's backend (its subscribe hook), when it gave
   * one: apply it before the publications that follow. */
  data?: unknown;
}

export interface SubscriptionEvents {
  state: { state: SubscriptionState; previous: SubscriptionState };
  subscribing: { channel: string; code: number; reason: string };
  subscribed: SubscribedContext;
  unsubscribed: { channel: string; code: number; reason: string };
  publication: Publication;
  /** A member joined the channel (namespaces with `join_leave`; batched by the server,
   * and not sent for channels above its member threshold: use `presenceStats()` there). */
  join: { channel: string; member: Member };
  /** A member left the channel (after the server's reconnect grace). */
  leave: { channel: string; member: Member };
  /** Joins and leaves were, or are about to be, left out: the channel passed the server's
   * member threshold (either way). A list kept from `join` and `leave` is stale: read it
   * again with `presence()`, or count with `presenceStats()` while the channel is large. */
  missed: { channel: string };
  error: { channel: string; code: number; message: string };
}

/** What a subscription needs from its client. */
export interface SubscriptionHost {
  subscribeChannel(sub: Subscription): void;
  unsubscribeChannel(sub: Subscription): void;
  publish(channel: string, data: unknown, options?: PublishOptions): Promise<PublishResult>;
  history(channel: string, options?: HistoryOptions): Promise<HistoryResult>;
  presence(channel: string, options?: PresenceOptions): Promise<PresenceResult>;
  presenceStats(channel: string): Promise<PresenceStatsResult>;
  /** A publication arrived out of order: resubscribe every channel from its position. */
  resync(reason: string): void;
}

export interface SubscriptionOptions {
  /** Resume after this position instead of starting at the newest publication. */
  since?: Position;
  /** `"fossil"`: the server sends each live publication as the difference from the one
   * before (after one whole), which this client applies and checks; for data that changes
   * a little at a time, most of the bytes are saved. */
  delta?: "fossil";
  /** `true`: while publications wait for this client (a slow link, a long-poll between
   * requests), one published with the same conflation key as a later one is skipped, so
   * the client gets the newest value of each key (the server says which offsets it
   * skipped; the position moves over them, and nothing else is ever skipped). */
  conflate?: boolean;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * One channel's subscription. It keeps the channel's position (epoch and the last offset
 * delivered), resumes from it after every reconnect on any transport, drops anything at or
 * below it (so nothing is delivered twice), and says so when a gap could not be recovered.
 */
export class Subscription extends Emitter<SubscriptionEvents> {
  private current: SubscriptionState = "unsubscribed";
  private at: Position | undefined;
  /** Whether the subscription has been confirmed since it was last (re)subscribed. */
  confirmedOnce = false;
  /** The subscription token last obtained for this channel (`getSubscriptionToken`). */
  token: string | undefined;
  /** Whether it asks for deltas. */
  readonly delta: "fossil" | undefined;
  /** Whether it asks to skip publications replaced while they waited. */
  readonly conflate: boolean;
  /** The last publication's data as the server sent it, for the next delta. */
  private base: Uint8Array | undefined;

  constructor(
    readonly channel: string,
    private readonly host: SubscriptionHost,
    options: SubscriptionOptions = {},
  ) {
    super();
    this.at = options.since === undefined ? undefined : { ...options.since };
    this.delta = options.delta;
    this.conflate = options.conflate === true;
  }

  get state(): SubscriptionState {
    return this.current;
  }

  /** The last position delivered, or undefined before the first subscribe. */
  get position(): Position | undefined {
    return this.at === undefined ? undefined : { ...this.at };
  }

  subscribe(options: SubscriptionOptions = {}): void {
    if (options.since !== undefined) this.at = { ...options.since };
    if (this.current !== "unsubscribed") return;
    this.confirmedOnce = false;
    this.setState("subscribing");
    this.emit("subscribing", { channel: this.channel, code: 0, reason: "subscribe called" });
    this.host.subscribeChannel(this);
  }

  unsubscribe(): void {
    if (this.current === "unsubscribed") return;
    this.host.unsubscribeChannel(this);
    this.end(0, "unsubscribe called");
  }

  publish(data: unknown, options?: PublishOptions): Promise<PublishResult> {
    return this.host.publish(this.channel, data, options);
  }

  history(options?: HistoryOptions): Promise<HistoryResult> {
    return this.host.history(this.channel, options);
  }

  /** A page of the channel's members, in id order; pass the answer's `cursor` back for the
   * next page. Rejects with 108 when the channel's namespace keeps no presence. */
  presence(options?: PresenceOptions): Promise<PresenceResult> {
    return this.host.presence(this.channel, options);
  }

  /** How many clients and distinct users the channel has, however many (constant time). */
  presenceStats(): Promise<PresenceStatsResult> {
    return this.host.presenceStats(this.channel);
  }

  /** A batch of joins and leaves from the server. */
  presenceChanged(join: readonly Member[], leave: readonly Member[], missed: boolean): void {
    if (this.current !== "subscribed") return;
    for (const member of join) this.emit("join", { channel: this.channel, member });
    for (const member of leave) this.emit("leave", { channel: this.channel, member });
    if (missed) this.emit("missed", { channel: this.channel });
  }

  /** The connection dropped (or the server ended this subscription): wait to be
   * resubscribed. */
  interrupted(code: number, reason: string): void {
    if (this.current !== "subscribed") return;
    this.confirmedOnce = false;
    this.setState("subscribing");
    this.emit("subscribing", { channel: this.channel, code, reason });
  }

  /**
   * The server confirmed the subscription (a reply, or a `subscribe` push on HTTP
   * transports). `publicationsFollow`: the replayed publications arrive as separate
   * pushes after this, so the position must not jump ahead of them.
   */
  confirmed(result: SubscribeResult, publicationsFollow: boolean): void {
    if (this.current === "unsubscribed") return;
    const resumed = this.at !== undefined;
    // The server says `recovered: true` only after checking the epoch (a position at offset 0
    // resumes in any epoch: it holds nothing of its own).
    if (result.recovered === true) {
      this.at = { epoch: result.epoch, offset: this.at?.offset ?? 0 };
    } else {
      this.at = { epoch: result.epoch, offset: result.offset };
    }
    this.confirmedOnce = true;
    this.setState("subscribed");
    this.emit("subscribed", {
      channel: this.channel,
      epoch: result.epoch,
      offset: publicationsFollow ? this.at.offset : result.offset,
      resumed,
      recovered: resumed ? result.recovered === true : undefined,
      ...(result.data !== undefined ? { data: result.data } : {}),
    });
    for (const p of result.publications ?? []) this.deliver(p.offset, p.data, p.from);
    if (!publicationsFollow && result.recovered !== false && this.at.offset < result.offset) {
      this.at.offset = result.offset;
    }
  }

  /** A publication push: plain, whole as text, or a delta from the last one's data. A
   * delta that does not apply (a base this client does not have, a bad checksum) loses
   * nothing: every channel resumes from its position, and the server sends the next one
   * whole. */
  receive(pub: { offset: number; data?: unknown; full?: string; delta?: string; from?: Sender }): void {
    if (this.current !== "subscribed" || this.at === undefined || pub.offset <= this.at.offset) return;
    if (pub.full === undefined && pub.delta === undefined) {
      this.deliver(pub.offset, pub.data, pub.from);
      return;
    }
    let text: Uint8Array;
    let data: unknown;
    try {
      if (pub.full !== undefined) {
        text = encoder.encode(pub.full);
      } else {
        if (this.base === undefined || pub.offset !== this.at.offset + 1) throw new DeltaError("no base for the delta");
        text = applyDelta(this.base, encoder.encode(pub.delta));
      }
      data = JSON.parse(decoder.decode(text));
    } catch (error) {
      this.base = undefined;
      this.host.resync(`${this.channel}: publication ${pub.offset} does not apply (${String(error)})`);
      return;
    }
    this.base = text;
    this.deliver(pub.offset, data, pub.from);
  }

  /** The server skipped the publications after the position up to `offset`: a later one
   * of the same conflation key replaced each while it waited. */
  skipTo(offset: number): void {
    if (this.current !== "subscribed" || this.at === undefined || !this.conflate) return;
    if (offset > this.at.offset) this.at.offset = offset;
  }

  /** A publication for this channel; at or below the position it is a repeat and dropped. */
  deliver(offset: number, data: unknown, from?: Sender): void {
    if (this.current !== "subscribed" || this.at === undefined) return;
    if (offset <= this.at.offset) return;
    if (this.at.epoch !== undefined && this.at.offset > 0 && offset !== this.at.offset + 1) {
      this.host.resync(`${this.channel}: offset ${offset} after ${this.at.offset}`);
      return;
    }
    this.at.offset = offset;
    this.emit("publication", { channel: this.channel, offset, epoch: this.at.epoch, data, ...(from !== undefined ? { from } : {}) });
  }

  /** The server refused the subscription for good. */
  failed(code: number, message: string): void {
    this.emit("error", { channel: this.channel, code, message });
    this.end(code, message);
  }

  /** The server's operator ended the subscription (code 120): it stays ended until the
   * application subscribes again. */
  endedByServer(code: number, reason: string): void {
    this.end(code, reason);
  }

  /** Reports an error that did not end the subscription. */
  warn(code: number, message: string): void {
    this.emit("error", { channel: this.channel, code, message });
  }

  private end(code: number, reason: string): void {
    if (this.current === "unsubscribed") return;
    this.setState("unsubscribed");
    this.emit("unsubscribed", { channel: this.channel, code, reason });
  }

  private setState(state: SubscriptionState): void {
    if (state === this.current) return;
    const previous = this.current;
    this.current = state;
    this.emit("state", { state, previous });
  }
}
