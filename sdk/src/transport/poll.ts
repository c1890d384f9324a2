import { ClientCode } from "../codes.js";
import { encodeCursor, type Position } from "../cursor.js";
import { decodeMessages, encodeCommands, type Command, type ServerMessage } from "../protocol.js";
import { httpFailure, type Transport, type TransportContext } from "./types.js";

/** What a polling transport needs from the client: each request carries the whole
 * subscription, so the client's channels and positions are read afresh every time. */
export interface PollSource {
  /** The channels to poll, with the position to resume after (undefined: start now). */
  channels(): Map<string, Position | undefined>;
  /** Whether to ask for deltas (`delta=fossil`). */
  delta(): boolean;
  /** Whether to skip publications replaced while they waited (`conflate=true`). */
  conflate(): boolean;
  /** An answer covered `requested`; `announced` got a `subscribe` push in it. */
  answered(requested: string[], announced: Set<string>): void;
  /** The server refused the request (a channel it will not open, say: `channel` when the
   * answer names it). True if the client dealt with it (dropped that channel, or the
   * channels that had not been confirmed yet). */
  refused(code: number, reason: string, channel?: string): boolean;
}

export interface PollOptions {
  /** Long-poll: how long the server may hold a request, seconds. */
  longpollTimeout: number;
  /** Interval polling: the pause between requests, milliseconds. */
  pollInterval: number;
  /** How long past its hold a long-poll may go unanswered before the link is taken for
   * dead, ms. */
  timeout: number;
}

/**
 * Long-polling and interval polling. "Connected" means the server answered; the first
 * request after any change of channels is a plain poll (answered at once, with every
 * `subscribe` push), then long-polls are held. A long-poller's session waits on the server
 * between requests for a few seconds (`session_key`); every request still carries the
 * whole subscription, so any server can answer it from its cursor.
 */
export class PollTransport implements Transport {
  private closed = false;
  private inFlight: AbortController | undefined;
  private wake: (() => void) | undefined;
  private fresh = true;
  /** A refresh came while no pause was waiting for it. */
  private refreshed = false;
  private etag: string | undefined;
  /** The key of the session the last answer parked (long-poll): the next request takes it
   * up, with what queued meanwhile, instead of the server building it again. */
  private sessionKey: string | undefined;
  private sending: Promise<void> = Promise.resolve();

  constructor(
    readonly name: "longpoll" | "poll",
    private readonly ctx: TransportContext,
    private readonly source: PollSource,
    private readonly options: PollOptions,
  ) {
    void this.run();
  }

  /** The channels changed: ask again now, without waiting for a held request to end. */
  refresh(): void {
    this.fresh = true;
    this.refreshed = true;
    this.etag = undefined;
    this.inFlight?.abort();
    this.wake?.();
  }

  send(commands: Command[]): void {
    if (this.closed) return;
    const body = encodeCommands(commands);
    this.sending = this.sending.then(async () => {
      if (this.closed) return;
      try {
        const response = await this.ctx.fetch(this.sendUrl(), {
          method: "POST",
          body,
          headers: { "Content-Type": "application/x-ndjson" },
        });
        const text = await response.text();
        for (const m of decodeMessages(text)) this.emit(m);
      } catch (error) {
        this.fail(ClientCode.TransportClosed, `sending failed: ${String(error)}`);
      }
    });
  }

  /** `POST /connection/send` with the current tokens. */
  private sendUrl(): string {
    const params = new URLSearchParams();
    const token = this.ctx.token();
    if (token !== undefined) params.set("token", token);
    for (const t of this.ctx.subscriptionTokens()) params.append("sub_token", t);
    const q = params.toString();
    return `${this.ctx.baseUrl}/connection/send${q === "" ? "" : "?" + q}`;
  }

  close(): void {
    this.closed = true;
    this.inFlight?.abort();
    this.wake?.();
  }

  private emit(message: ServerMessage): void {
    if (!this.closed) this.ctx.events.message(message);
  }

  private fail(code: number, reason: string): void {
    if (this.closed) return;
    this.close();
    this.ctx.events.close(code, reason);
  }

  private async run(): Promise<void> {
    // Reachability first, so that "connected" means something even with no channels yet.
    try {
      const response = await this.ctx.fetch(this.sendUrl(), {
        method: "POST",
        body: '{"id":0,"ping":{}}',
        headers: { "Content-Type": "application/x-ndjson" },
      });
      if (!response.ok) {
        const { code, reason } = await httpFailure(response);
        this.fail(code || ClientCode.TransportClosed, reason);
        return;
      }
      await response.text();
    } catch (error) {
      this.fail(ClientCode.TransportClosed, `server unreachable: ${String(error)}`);
      return;
    }
    this.emit({ connect: { client: "", version: "", ping: this.options.longpollTimeout } });
    while (!this.closed) {
      const channels = this.source.channels();
      if (channels.size === 0) {
        await this.pause(Infinity);
        continue;
      }
      await this.poll(channels);
      if (this.name === "poll" && !this.fresh) await this.pause(this.options.pollInterval);
    }
  }

  private async poll(channels: Map<string, Position | undefined>): Promise<void> {
    const held = this.name === "longpoll" && !this.fresh;
    this.fresh = false;
    this.refreshed = false;
    const params = new URLSearchParams();
    const positioned: [string, Position][] = [];
    for (const [channel, position] of channels) {
      if (position === undefined) params.append("channel", channel);
      else positioned.push([channel, position]);
    }
    if (positioned.length > 0) params.set("cursor", encodeCursor(positioned));
    if (this.source.delta()) params.set("delta", "fossil");
    if (this.source.conflate()) params.set("conflate", "true");
    if (held) params.set("timeout", String(this.options.longpollTimeout));
    const first = this.ctx.firstClient();
    if (first !== undefined) params.set("client", first);
    // Empty asks for a key; the server parks the session only when asked.
    if (this.name === "longpoll") params.set("session_key", this.sessionKey ?? "");
    // Stateless: every request carries the tokens, and the server checks them every time.
    const token = this.ctx.token();
    if (token !== undefined) params.set("token", token);
    for (const t of this.ctx.subscriptionTokens()) params.append("sub_token", t);
    const abort = new AbortController();
    this.inFlight = abort;
    // A dead link that nobody closes: no answer within the hold plus `timeout` (a plain
    // poll: within `pingInterval`) means it is taken for dead.
    const wait = held ? this.options.longpollTimeout * 1000 + this.options.timeout : this.ctx.pingInterval;
    const limit = setTimeout(() => abort.abort(), wait);
    const headers: Record<string, string> = {};
    if (this.name === "poll" && this.etag !== undefined) headers["If-None-Match"] = this.etag;
    try {
      const response = await this.ctx.fetch(
        `${this.ctx.baseUrl}/connection/${held ? "longpoll" : "poll"}?${params.toString()}`,
        { signal: abort.signal, headers, cache: "no-store" },
      );
      if (response.status === 304) return;
      if (!response.ok) {
        const { code, reason, channel } = await httpFailure(response);
        if (!this.source.refused(code, reason, channel)) this.fail(code || ClientCode.TransportClosed, reason);
        this.fresh = true;
        return;
      }
      this.etag = response.headers.get("ETag") ?? undefined;
      const answer = (await response.json()) as {
        messages?: ServerMessage[];
        client?: string;
        session_key?: string;
      };
      if (typeof answer.client === "string") this.ctx.rememberClient(answer.client);
      this.sessionKey = answer.session_key;
      const announced = new Set<string>();
      for (const m of answer.messages ?? []) {
        if (m.subscribe?.channel !== undefined) announced.add(m.subscribe.channel);
        this.emit(m);
        if (this.closed) return;
      }
      this.source.answered([...channels.keys()], announced);
    } catch (error) {
      if (abort.signal.aborted && (this.closed || this.fresh)) return;
      const why = abort.signal.aborted ? `no answer within ${wait} ms` : String(error);
      this.fail(ClientCode.TransportClosed, `poll failed: ${why}`);
    } finally {
      clearTimeout(limit);
      if (this.inFlight === abort) this.inFlight = undefined;
    }
  }

  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = ms === Infinity ? undefined : setTimeout(done, ms);
      const self = this;
      function done(): void {
        if (timer !== undefined) clearTimeout(timer);
        self.wake = undefined;
        resolve();
      }
      this.wake = done;
      if (this.closed || this.refreshed) done();
      this.refreshed = false;
    });
  }
}
