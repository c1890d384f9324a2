import { backoffDelay } from "./backoff.js";
import { ClientCode, isRefusal, isTemporaryError, shouldReconnect } from "./codes.js";
import type { Position } from "./cursor.js";
import { Emitter } from "./emitter.js";
import {
  sinceParam,
  type Command,
  type ConnectResult,
  type ErrorBody,
  type HistoryResult,
  type Method,
  type PresenceResult,
  type PresenceStatsResult,
  type PublishResult,
  type RefreshResult,
  type RpcResult,
  type ServerMessage,
  type SubscribeResult,
} from "./protocol.js";
import { Subscription, type SubscriptionHost, type SubscriptionOptions } from "./subscription.js";
import { IframeTransport } from "./transport/iframe.js";
import { PollTransport, type PollSource } from "./transport/poll.js";
import { SseTransport } from "./transport/sse.js";
import { StreamTransport } from "./transport/stream.js";
import type { EventSourceConstructor, Transport, TransportContext, TransportName, WebSocketConstructor } from "./transport/types.js";
import { WebSocketTransport } from "./transport/websocket.js";

export const VERSION = "0.1.0";

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
   * How often the connection must show it is alive, ms (default 10000). Streams ask the
   * server for a keepalive this often, WebSocket sends a `ping` after this much quiet, a
   * long-poll is held at most this long; a connection that then stays silent for `timeout`
   * more is taken for dead and replaced, so a dead link that nobody closes is noticed
   * within 15 s by default, on every transport. (The forever frame, whose page is told of
   * no cut, asks for a keepalive every 500 ms and is taken for dead after 1 s without one.)
   */
  pingInterval?: number;
  /** Long-poll hold time asked of the server, seconds (default: `pingInterval`'s, 10). */
  longpollTimeout?: number;
  /** Interval polling period, ms (default 1000). */
  pollInterval?: number;
  /** Commands issued within this many ms travel in one frame (default 0: the same tick). */
  batchDelay?: number;
  /** Failed opens of a transport that has worked before it is given up for the next (default 3). */
  retriesBeforeFallback?: number;
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

interface Pending {
  resolve(result: unknown): void;
  reject(error: HeraldError): void;
  timer: ReturnType<typeof setTimeout>;
}

const SESSION_TRANSPORTS = new Set<TransportName>(["websocket", "sse", "stream", "iframe"]);

/**
 * A connection to Herald over the best transport that works here, with subscriptions that
 * survive every reconnect.
 *
 * ```ts
 * const client = new Client("https://rt.example.com");
 * const sub = client.newSubscription("chat:lobby");
 * sub.on("publication", (p) => console.log(p.offset, p.data));
 * sub.subscribe();
 * client.connect();
 * ```
 */
export class Client extends Emitter<ClientEvents> implements SubscriptionHost, PollSource {
  readonly baseUrl: string;
  private readonly options: Required<
    Omit<ClientOptions, "token" | "name" | "websocket" | "eventSource" | "fetch" | "transports" | "getToken" | "getSubscriptionToken">
  > &
    Pick<ClientOptions, "name" | "websocket" | "eventSource" | "getToken" | "getSubscriptionToken">;
  /** The connection token in use. */
  private token: string | undefined;
  /** Set when the server said the token expired: get a new one before reconnecting. */
  private tokenStale = false;
  private refreshTimer: ReturnType<typeof setTimeout> | undefined;
  private refreshing: Promise<void> | undefined;
  private readonly order: readonly TransportName[];
  private readonly doFetch: typeof fetch;
  private current: ClientState = "disconnected";
  private transport: Transport | undefined;
  private transportIndex = 0;
  private lastWorking = -1;
  private failuresOfWorking = 0;
  private attempt = 0;
  private reconnectTimer: ReturnType<typeof setTimeout> | undefined;
  private connectTimer: ReturnType<typeof setTimeout> | undefined;
  private pingTimer: ReturnType<typeof setTimeout> | undefined;
  private lastReceived = 0;
  private clientId = "";
  /** The id of this client's first connection, sent again on every reconnect and poll. */
  private firstClient: string | undefined;
  private nextId = 0;
  private readonly pending = new Map<number, Pending>();
  private outbox: Command[] = [];
  private flushScheduled = false;
  private readyWaiters: { resolve(): void; reject(e: HeraldError): void }[] = [];
  private readonly subs = new Map<string, Subscription>();
  /** Transports that do not exist in this environment, with why. */
  private readonly unavailable = new Map<TransportName, string>();

  /** `url`: the server's HTTP(S) base URL; in a browser it defaults to the page's origin. */
  constructor(url?: string, options: ClientOptions = {}) {
    super();
    const base = url ?? globalThis.location?.origin;
    if (base === undefined) throw new Error("give the server's URL, e.g. new Client('http://127.0.0.1:8080')");
    this.baseUrl = base.replace(/\/+$/, "");
    const transports = options.transports ?? "auto";
    this.order = transports === "auto" ? AUTO_TRANSPORTS : typeof transports === "string" ? [transports] : [...transports];
    if (this.order.length === 0) throw new Error("transports: name at least one");
    this.doFetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    const pingInterval = options.pingInterval ?? 10_000;
    this.options = {
      minReconnectDelay: options.minReconnectDelay ?? 500,
      maxReconnectDelay: options.maxReconnectDelay ?? 20_000,
      timeout: options.timeout ?? 5_000,
      longpollTimeout: options.longpollTimeout ?? Math.max(1, Math.round(pingInterval / 1000)),
      pollInterval: options.pollInterval ?? 1_000,
      batchDelay: options.batchDelay ?? 0,
      retriesBeforeFallback: options.retriesBeforeFallback ?? 3,
      name: options.name,
      pingInterval,
      websocket: options.websocket,
      eventSource: options.eventSource,
      getToken: options.getToken,
      getSubscriptionToken: options.getSubscriptionToken,
    };
    this.token = options.token;
  }

  get state(): ClientState {
    return this.current;
  }

  /** The transport in use (or being tried). */
  get transportName(): TransportName | undefined {
    return this.transport?.name;
  }

  connect(): void {
    if (this.current !== "disconnected") return;
    this.attempt = 0;
    this.setState("connecting");
    this.emit("connecting", { code: 0, reason: "connect called", transport: this.order[this.transportIndex]! });
    this.open();
  }

  disconnect(): void {
    this.stop(ClientCode.Disconnected, "disconnect called");
  }

  /** Ends the connection for good and reports why. */
  private stop(code: number, reason: string): void {
    if (this.current === "disconnected") return;
    this.teardown(new HeraldError(code, reason));
    this.setState("disconnected");
    for (const sub of this.subs.values()) sub.interrupted(code, reason);
    this.emit("disconnected", { code, reason });
  }

  newSubscription(channel: string, options?: SubscriptionOptions): Subscription {
    if (this.subs.has(channel)) throw new Error(`already a subscription to ${channel}; use getSubscription`);
    const sub = new Subscription(channel, this, options);
    this.subs.set(channel, sub);
    return sub;
  }

  /** Shorthand: a new subscription, subscribed at once. */
  subscribe(channel: string, options?: SubscriptionOptions): Subscription {
    const sub = this.newSubscription(channel, options);
    sub.subscribe();
    return sub;
  }

  getSubscription(channel: string): Subscription | undefined {
    return this.subs.get(channel);
  }

  removeSubscription(sub: Subscription): void {
    sub.unsubscribe();
    this.subs.delete(sub.channel);
  }

  publish(channel: string, data: unknown): Promise<PublishResult> {
    return this.call<PublishResult>("publish", { channel, data });
  }

  /**
   * Calls the application's backend through Herald (its `rpc` hook) and resolves with its
   * answer's data; over every transport. Rejects with the backend's code (1000-1999 are the
   * application's own), 108 when the server has no rpc hook, 118 when the backend failed.
   */
  async rpc(method: string, data?: unknown): Promise<unknown> {
    const params: Record<string, unknown> = { method };
    if (data !== undefined) params["data"] = data;
    const result = await this.call<RpcResult>("rpc", params);
    return result.data;
  }

  history(channel: string, options: HistoryOptions = {}): Promise<HistoryResult> {
    const params: Record<string, unknown> = { channel };
    if (options.limit !== undefined) params["limit"] = options.limit;
    const since = sinceParam(options.since);
    if (since !== undefined) params["since"] = since;
    return this.call<HistoryResult>("history", params);
  }

  /** A page of `channel`'s members (namespaces with `presence`); see `Subscription.presence`. */
  presence(channel: string, options: PresenceOptions = {}): Promise<PresenceResult> {
    const params: Record<string, unknown> = { channel };
    if (options.limit !== undefined) params["limit"] = options.limit;
    if (options.cursor !== undefined) params["cursor"] = options.cursor;
    return this.call<PresenceResult>("presence", params);
  }

  /** How many clients and distinct users `channel` has, however many. */
  presenceStats(channel: string): Promise<PresenceStatsResult> {
    return this.call<PresenceStatsResult>("presence_stats", { channel });
  }

  // --- SubscriptionHost ---

  subscribeChannel(sub: Subscription): void {
    if (this.current !== "connected" || this.transport === undefined) return;
    const getToken = this.options.getSubscriptionToken;
    if (getToken === undefined) {
      this.sendSubscribe(sub);
      return;
    }
    const transport = this.transport;
    getToken(sub.channel).then(
      (token) => {
        sub.token = token ?? undefined;
        if (this.transport === transport && sub.state === "subscribing") this.sendSubscribe(sub);
      },
      (error: unknown) => {
        sub.warn(ClientCode.TokenUnavailable, `getSubscriptionToken failed: ${String(error)}`);
        this.retrySubscribe(sub);
      },
    );
  }

  private sendSubscribe(sub: Subscription): void {
    if (this.current !== "connected" || this.transport === undefined) return;
    if (this.transport instanceof PollTransport) {
      this.transport.refresh();
      return;
    }
    const params: Record<string, unknown> = { channel: sub.channel };
    const since = sinceParam(sub.position);
    if (since !== undefined) params["since"] = since;
    if (sub.token !== undefined) params["token"] = sub.token;
    // Answered in the same turn as the reply, not a promise's turn later: a publication that
    // raced with the subscribe may follow the reply in the same frame, and must find the
    // subscription confirmed.
    this.command(
      "subscribe",
      params,
      (result) => {
        if (this.subs.get(sub.channel) === sub && sub.state === "subscribing") sub.confirmed(result as SubscribeResult, false);
      },
      (error: HeraldError) => {
        if (sub.state !== "subscribing") return;
        if (isTemporaryError(error.code)) {
          sub.warn(error.code, error.message);
          this.retrySubscribe(sub);
        } else if (isRefusal(error.code)) {
          sub.failed(error.code, error.message);
        }
        // Otherwise the connection dropped: the subscription is resubscribed on reconnect.
      },
    );
  }

  unsubscribeChannel(sub: Subscription): void {
    if (this.current !== "connected" || this.transport === undefined) return;
    if (this.transport instanceof PollTransport) {
      queueMicrotask(() => (this.transport as PollTransport | undefined)?.refresh?.());
      return;
    }
    this.request("unsubscribe", { channel: sub.channel }).catch(() => {
      // Unsubscribing from a channel the server no longer has for us is fine.
    });
  }

  resync(reason: string): void {
    this.emit("error", { type: "server", code: ClientCode.OutOfOrder, message: reason });
    this.dropTransport(ClientCode.OutOfOrder, `out of order: ${reason}`);
  }

  // --- PollSource ---

  channels(): Map<string, Position | undefined> {
    const out = new Map<string, Position | undefined>();
    for (const sub of this.subs.values()) {
      if (sub.state !== "unsubscribed") out.set(sub.channel, sub.position);
    }
    return out;
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

  // --- connection ---

  /** Opens the next transport, fetching a token first when one is due. */
  private open(): void {
    const getToken = this.options.getToken;
    if (getToken === undefined || (this.token !== undefined && !this.tokenStale)) {
      this.openTransport();
      return;
    }
    getToken().then(
      (token) => {
        if (this.current !== "connecting" || this.transport !== undefined) return;
        if (token === null || token === undefined || token === "") {
          this.stop(3500, "getToken gave no token");
          return;
        }
        this.token = token;
        this.tokenStale = false;
        this.openTransport();
      },
      (error: unknown) => {
        if (this.current !== "connecting" || this.transport !== undefined) return;
        this.emit("error", { type: "transport", code: ClientCode.TokenUnavailable, message: `getToken failed: ${String(error)}` });
        this.reconnectTimer = setTimeout(() => {
          this.reconnectTimer = undefined;
          if (this.current === "connecting" && this.transport === undefined) this.open();
        }, backoffDelay(this.attempt++, this.backoff()));
      },
    );
  }

  private openTransport(): void {
    const name = this.order[this.transportIndex]!;
    const ctx: TransportContext = {
      baseUrl: this.baseUrl,
      pingInterval: this.options.pingInterval,
      fetch: this.doFetch,
      websocket: this.options.websocket,
      token: () => this.token,
      subscriptionTokens: () => [...this.subs.values()].flatMap((s) => (s.state !== "unsubscribed" && s.token !== undefined ? [s.token] : [])),
      firstClient: () => this.firstClient,
      rememberClient: (client) => {
        this.firstClient ??= client;
      },
      events: {
        message: (m) => this.onMessage(m),
        close: (code, reason) => this.onTransportClose(code, reason),
      },
    };
    let transport: Transport;
    try {
      transport = this.makeTransport(name, ctx);
    } catch (error) {
      // Not available in this environment: the same as blocked, unless no transport asked
      // for is available, when trying again cannot help: the client stops, once, saying why.
      this.transport = undefined;
      const why = `${name}: ${error instanceof Error ? error.message : String(error)}`;
      this.unavailable.set(name, why);
      if (this.order.every((n) => this.unavailable.has(n))) {
        const reasons = [...new Set(this.order.map((n) => this.unavailable.get(n)!))].join("; ");
        queueMicrotask(() => {
          this.emit("error", { type: "transport", code: ClientCode.NoTransport, message: reasons, transport: name });
          this.stop(ClientCode.NoTransport, reasons);
        });
        return;
      }
      queueMicrotask(() => this.onTransportClose(ClientCode.TransportClosed, why));
      return;
    }
    this.transport = transport;
    this.connectTimer = setTimeout(() => {
      if (this.current === "connecting" && this.transport === transport) {
        this.dropTransport(ClientCode.ConnectTimeout, `${name}: no connect within ${this.options.timeout} ms`);
      }
    }, this.options.timeout);
  }

  private makeTransport(name: TransportName, ctx: TransportContext): Transport {
    switch (name) {
      case "websocket": {
        const ws = new WebSocketTransport(ctx);
        ws.onOpen(() => {
          const params: Record<string, unknown> = { version: VERSION };
          if (this.token !== undefined) params["token"] = this.token;
          if (this.options.name !== undefined) params["name"] = this.options.name;
          if (this.firstClient !== undefined) params["client"] = this.firstClient;
          this.nextId += 1;
          const id = this.nextId;
          this.expect(id, (r) => this.onConnected(r as ConnectResult), (e) => this.dropTransport(e.code >= 3000 ? e.code : 3500, e.message));
          ws.send([{ id, method: "connect", params }]);
        });
        return ws;
      }
      case "sse":
        return new SseTransport(ctx, this.options.eventSource);
      case "stream":
        return new StreamTransport(ctx);
      case "iframe":
        return new IframeTransport(ctx);
      case "longpoll":
      case "poll":
        return new PollTransport(name, ctx, this, {
          longpollTimeout: this.options.longpollTimeout,
          pollInterval: this.options.pollInterval,
          timeout: this.options.timeout,
        });
    }
  }

  private onMessage(m: ServerMessage): void {
    this.lastReceived = Date.now();
    if (m.id !== undefined && m.id !== 0) {
      const pending = this.pending.get(m.id);
      if (pending === undefined) return;
      this.pending.delete(m.id);
      clearTimeout(pending.timer);
      if (m.error !== undefined) pending.reject(new HeraldError(m.error.code, m.error.message));
      else pending.resolve(firstResult(m));
      return;
    }
    if (m.pub !== undefined) {
      const sub = this.subs.get(m.pub.channel);
      if (sub === undefined) return;
      // On polling transports a complete resume is not announced: its first publication is.
      if (sub.state === "subscribing" && this.transport instanceof PollTransport && sub.position?.epoch !== undefined) {
        sub.confirmed({ epoch: sub.position.epoch, offset: sub.position.offset, recovered: true }, true);
      }
      sub.deliver(m.pub.offset, m.pub.data, m.pub.from);
    } else if (m.presence !== undefined) {
      this.subs.get(m.presence.channel)?.presenceChanged(m.presence.join, m.presence.leave, m.presence.missed === true);
    } else if (m.subscribe?.channel !== undefined) {
      this.subs.get(m.subscribe.channel)?.confirmed(m.subscribe, true);
    } else if (m.unsubscribe?.channel !== undefined) {
      // The server ended one subscription. Its operator did (120): it stays ended. Its
      // token expired (109): get a new token and resume from the position held, so
      // nothing is missed.
      const sub = this.subs.get(m.unsubscribe.channel);
      if (sub !== undefined && sub.state === "subscribed") {
        const code = m.unsubscribe.code ?? 0;
        if (code === 120) {
          sub.endedByServer(code, m.unsubscribe.reason ?? "unsubscribed by the server");
          return;
        }
        sub.interrupted(code, m.unsubscribe.reason ?? "ended by the server");
        if (code === 109) sub.token = undefined;
        this.subscribeChannel(sub);
      }
    } else if (m.connect !== undefined) {
      this.onConnected(m.connect);
    } else if (m.disconnect !== undefined) {
      this.dropTransport(m.disconnect.code, m.disconnect.reason);
    } else if (m.error !== undefined) {
      this.emit("error", { type: "server", code: m.error.code, message: m.error.message });
    }
  }

  private onConnected(result: ConnectResult): void {
    if (this.current !== "connecting" || this.transport === undefined) return;
    clearTimeout(this.connectTimer);
    this.clientId = result.client;
    if (result.client !== "") this.firstClient ??= result.client;
    this.attempt = 0;
    this.lastWorking = this.transportIndex;
    this.failuresOfWorking = 0;
    this.setState("connected");
    const transport = this.transport.name;
    this.startWatchdog();
    this.scheduleRefresh(result.ttl ?? tokenTtl(this.token));
    this.emit("connected", { transport, client: this.clientId, user: result.user });
    for (const w of this.readyWaiters.splice(0)) w.resolve();
    for (const sub of this.subs.values()) {
      if (sub.state === "subscribing") this.subscribeChannel(sub);
    }
    this.scheduleFlush();
  }

  private onTransportClose(code: number, reason: string): void {
    const failed = this.transport?.name ?? this.order[this.transportIndex]!;
    const wasConnected = this.current === "connected";
    if (this.current === "disconnected") return;
    this.teardown(new HeraldError(code, `disconnected: ${reason}`), false);
    for (const sub of this.subs.values()) sub.interrupted(code, reason);
    // An expired token is worth a new one: with `getToken`, reconnect after fetching it.
    const renew = code === 3504 && this.options.getToken !== undefined;
    if (renew) this.tokenStale = true;
    if (!shouldReconnect(code) && !renew) {
      for (const w of this.readyWaiters.splice(0)) w.reject(new HeraldError(code, reason));
      this.setState("disconnected");
      this.emit("disconnected", { code, reason });
      return;
    }
    this.emit("error", { type: "transport", code, message: reason, transport: failed });
    let delay: number;
    if (wasConnected) {
      delay = backoffDelay(this.attempt++, this.backoff());
    } else if (this.transportIndex === this.lastWorking && ++this.failuresOfWorking < this.options.retriesBeforeFallback) {
      // It worked before: the server is more likely restarting than the transport blocked.
      delay = backoffDelay(this.attempt++, this.backoff());
    } else {
      this.transportIndex = (this.transportIndex + 1) % this.order.length;
      // Falling back along the list is immediate; a full round of failures backs off.
      delay = this.transportIndex === 0 || this.order.length === 1 ? backoffDelay(this.attempt++, this.backoff()) : 0;
    }
    this.setState("connecting");
    this.emit("connecting", { code, reason, transport: this.order[this.transportIndex]! });
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = undefined;
      if (this.current === "connecting" && this.transport === undefined) this.open();
    }, delay);
  }

  /** Closes the transport ourselves and handles it like any other close. */
  private dropTransport(code: number, reason: string): void {
    const transport = this.transport;
    if (transport === undefined) return;
    transport.close();
    this.onTransportClose(code, reason);
  }

  private teardown(error: HeraldError, rejectWaiters = true): void {
    clearTimeout(this.connectTimer);
    clearTimeout(this.refreshTimer);
    this.refreshTimer = undefined;
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.pingTimer);
    this.reconnectTimer = undefined;
    this.pingTimer = undefined;
    this.transport?.close();
    this.transport = undefined;
    this.outbox = [];
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      this.pending.delete(id);
      p.reject(error);
    }
    if (rejectWaiters) for (const w of this.readyWaiters.splice(0)) w.reject(error);
  }

  private backoff() {
    return { minDelay: this.options.minReconnectDelay, maxDelay: this.options.maxReconnectDelay };
  }

  /** Session transports: a connection that goes silent is taken for dead and replaced,
   * even when its socket says nothing (a blackholed link, a NAT that forgot it, a forever
   * frame whose body was cut). Streams hear the keepalives they asked for, so silence past
   * their limit is enough; WebSocket's keepalives are invisible to a page, so after
   * `pingInterval` of quiet it asks (`ping`), and no reply within `timeout` ends it. One
   * timer, set for the moment the limit would pass: no wake-up per message. */
  private startWatchdog(): void {
    const transport = this.transport;
    if (transport === undefined || transport instanceof PollTransport) return;
    const probe = transport.name === "websocket";
    const { pingInterval, timeout } = this.options;
    const limit = probe ? pingInterval : (transport.silenceLimit ?? pingInterval + timeout);
    const mine = () => this.current === "connected" && this.transport === transport;
    const check = (): void => {
      this.pingTimer = undefined;
      if (!mine()) return;
      const silent = Date.now() - this.lastReceived;
      if (silent < limit) {
        this.pingTimer = setTimeout(check, limit - silent);
      } else if (!probe) {
        this.dropTransport(ClientCode.NoPong, `nothing received for ${silent} ms`);
      } else {
        this.request("ping", {}).then(
          () => {
            if (mine()) this.pingTimer = setTimeout(check, limit);
          },
          (error: HeraldError) => {
            if (error.code === ClientCode.NoPong && mine()) this.dropTransport(ClientCode.NoPong, "no reply to ping");
          },
        );
      }
    };
    this.lastReceived = Date.now();
    clearTimeout(this.pingTimer);
    this.pingTimer = setTimeout(check, limit);
  }

  // --- token refresh ---

  /** Refreshes the token when 80% of its `ttlSeconds` have passed (at least a second before
   * the end, so the `refresh` command arrives in time). */
  private scheduleRefresh(ttlSeconds: number | undefined): void {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = undefined;
    if (ttlSeconds === undefined || this.options.getToken === undefined) return;
    const ms = Math.max(0, Math.min(ttlSeconds * 800, ttlSeconds * 1000 - 1000));
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = undefined;
      void this.refreshToken();
    }, ms);
  }

  /** One refresh at a time: a second caller shares the one in flight. */
  private refreshToken(): Promise<void> {
    this.refreshing ??= this.doRefresh().finally(() => (this.refreshing = undefined));
    return this.refreshing;
  }

  private async doRefresh(): Promise<void> {
    const getToken = this.options.getToken;
    if (getToken === undefined) return;
    // Jittered backoff between tries, never past the token's end: the server then closes
    // with 3504 and the client reconnects with whatever token it gets next.
    const retry = (attempt: number) => new Promise((r) => setTimeout(r, backoffDelay(attempt, { minDelay: 250, maxDelay: 5_000 })));
    for (let attempt = 0; this.current === "connected"; attempt++) {
      let token: string | null | undefined;
      try {
        token = await getToken();
      } catch (error) {
        this.emit("error", { type: "transport", code: ClientCode.TokenUnavailable, message: `getToken failed: ${String(error)}` });
        await retry(attempt);
        continue;
      }
      if (this.current !== "connected") return;
      if (token === null || token === undefined || token === "") {
        this.stop(3500, "getToken gave no token");
        return;
      }
      this.token = token;
      if (this.transport instanceof PollTransport) {
        // Stateless: the next request carries the new token.
        this.scheduleRefresh(tokenTtl(token));
        return;
      }
      try {
        const result = await this.request<RefreshResult>("refresh", { token });
        this.scheduleRefresh(result.ttl);
      } catch (error) {
        const code = error instanceof HeraldError ? error.code : 0;
        if (code === 101) this.stop(3500, `refresh refused: ${String(error)}`);
        else if (code === 109) {
          // The backend gave an expired token: ask again, not in a tight loop.
          await retry(attempt);
          continue;
        }
        // Otherwise the connection dropped; reconnecting uses the new token.
      }
      return;
    }
  }

  private setState(state: ClientState): void {
    if (state === this.current) return;
    const previous = this.current;
    this.current = state;
    this.emit("state", { state, previous });
  }

  // --- commands ---

  /** Waits for the connection (up to `timeout`), then sends and awaits the reply. */
  private async call<T>(method: Method, params: Record<string, unknown>): Promise<T> {
    await this.ready();
    return this.request<T>(method, params);
  }

  private ready(): Promise<void> {
    if (this.current === "connected") return Promise.resolve();
    if (this.current === "disconnected") {
      return Promise.reject(new HeraldError(ClientCode.Disconnected, "the client is disconnected; call connect()"));
    }
    return new Promise((resolve, reject) => {
      const waiter = {
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
        reject: (e: HeraldError) => {
          clearTimeout(timer);
          reject(e);
        },
      };
      const timer = setTimeout(() => {
        this.readyWaiters = this.readyWaiters.filter((w) => w !== waiter);
        reject(new HeraldError(ClientCode.ConnectTimeout, `not connected within ${this.options.timeout} ms`));
      }, this.options.timeout);
      this.readyWaiters.push(waiter);
    });
  }

  /** Queues a command on the open connection; commands queued in one tick share a frame. */
  private request<T>(method: Method, params: Record<string, unknown>): Promise<T> {
    return new Promise<T>((resolve, reject) => this.command(method, params, resolve as (r: unknown) => void, reject));
  }

  /** Sends a command with the next batch; `resolve` or `reject` is called as its reply is
   * read, before the rest of that frame. */
  private command(method: Method, params: Record<string, unknown>, resolve: (r: unknown) => void, reject: (e: HeraldError) => void): void {
    this.nextId += 1;
    const id = this.nextId;
    this.expect(id, resolve, reject);
    this.outbox.push({ id, method, params });
    this.scheduleFlush();
  }

  private expect(id: number, resolve: (r: unknown) => void, reject: (e: HeraldError) => void): void {
    const timer = setTimeout(() => {
      this.pending.delete(id);
      reject(new HeraldError(ClientCode.NoPong, `no reply within ${this.options.timeout} ms`));
    }, this.options.timeout);
    this.pending.set(id, { resolve, reject, timer });
  }

  private retrySubscribe(sub: Subscription): void {
    setTimeout(() => {
      if (sub.state === "subscribing") this.subscribeChannel(sub);
    }, backoffDelay(1, this.backoff()));
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    const flush = () => {
      this.flushScheduled = false;
      if (this.current !== "connected" || this.transport === undefined || this.outbox.length === 0) return;
      this.transport.send(this.outbox.splice(0));
    };
    if (this.options.batchDelay > 0) setTimeout(flush, this.options.batchDelay);
    else queueMicrotask(flush);
  }
}

function firstResult(m: ServerMessage): unknown {
  for (const key of ["connect", "subscribe", "unsubscribe", "publish", "history", "refresh", "rpc", "presence", "presence_stats", "ping"] as const) {
    if (m[key] !== undefined) return m[key];
  }
  return {};
}

/** Seconds until a JWT's `exp`, read without checking it (only to schedule a refresh;
 * the server is the one that checks). */
function tokenTtl(token: string | undefined): number | undefined {
  const payload = token?.split(".")[1];
  if (payload === undefined) return undefined;
  try {
    const json = atob(payload.replace(/-/g, "+").replace(/_/g, "/"));
    const exp = (JSON.parse(json) as { exp?: unknown }).exp;
    return typeof exp === "number" ? Math.max(0, exp - Date.now() / 1000) : undefined;
  } catch {
    return undefined;
  }
}

export type { ErrorBody };
