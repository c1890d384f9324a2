import { backoffDelay } from "./backoff.js";
import { ClientCode, isRefusal, isTemporaryError, shouldReconnect } from "./codes.js";
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
  type PublishOptions,
  type PublishResult,
  type RefreshResult,
  type RpcResult,
  type ServerMessage,
  type SubscribeResult,
} from "./protocol.js";
import {
  AUTO_TRANSPORTS,
  HeraldError,
  type ClientEvents,
  type ClientOptions,
  type ClientState,
  type HistoryOptions,
  type PresenceOptions,
} from "./options.js";
import { Replies } from "./replies.js";
import { Subscription, type SubscriptionHost, type SubscriptionOptions } from "./subscription.js";
import { TokenRefresher, tokenTtl } from "./token.js";
import { Watchdog } from "./watchdog.js";
import { IframeTransport } from "./transport/iframe.js";
import { PolledSubscriptions } from "./polled.js";
import { PollTransport } from "./transport/poll.js";
import { SseTransport } from "./transport/sse.js";
import { StreamTransport } from "./transport/stream.js";
import type { Transport, TransportContext, TransportName } from "./transport/types.js";
import { WebSocketTransport } from "./transport/websocket.js";

export const VERSION = "0.1.0";

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
export class Client extends Emitter<ClientEvents> implements SubscriptionHost {
  readonly baseUrl: string;
  private readonly options: Required<
    Omit<ClientOptions, "token" | "name" | "websocket" | "eventSource" | "fetch" | "transports" | "getToken" | "getSubscriptionToken">
  > &
    Pick<ClientOptions, "name" | "websocket" | "eventSource" | "getToken" | "getSubscriptionToken">;
  /** The connection token in use. */
  private token: string | undefined;
  /** Set when the server said the token expired: get a new one before reconnecting. */
  private tokenStale = false;
  private readonly refresher: TokenRefresher;
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
  private readonly watchdog = new Watchdog();
  private lastReceived = 0;
  private clientId = "";
  /** The id of this client's first connection, sent again on every reconnect and poll. */
  private firstClient: string | undefined;
  private readonly replies: Replies;
  private outbox: Command[] = [];
  private flushScheduled = false;
  private readyWaiters: { resolve(): void; reject(e: HeraldError): void }[] = [];
  private readonly subs = new Map<string, Subscription>();
  /** The subscriptions as the polling transports read them. */
  private readonly polled = new PolledSubscriptions(this.subs);
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
    const pingInterval = options.pingInterval ?? 9_000;
    this.options = {
      minReconnectDelay: options.minReconnectDelay ?? 500,
      maxReconnectDelay: options.maxReconnectDelay ?? 20_000,
      timeout: options.timeout ?? 5_000,
      longpollTimeout: options.longpollTimeout ?? Math.max(1, Math.round(pingInterval / 1000)),
      pollInterval: options.pollInterval ?? 1_000,
      batchDelay: options.batchDelay ?? 0,
      protocol: options.protocol ?? "json",
      retriesBeforeFallback: options.retriesBeforeFallback ?? 3,
      name: options.name,
      pingInterval,
      websocket: options.websocket,
      eventSource: options.eventSource,
      getToken: options.getToken,
      getSubscriptionToken: options.getSubscriptionToken,
    };
    this.token = options.token;
    this.replies = new Replies(this.options.timeout);
    this.refresher = new TokenRefresher(this.options.getToken, {
      connected: () => this.current === "connected",
      adopt: (token) => {
        this.token = token;
        // Polling is stateless: the next request carries the new token. A long-poll held
        // now carries the old one, and the server ends its session when that expires
        // (3504), so it is asked again now, with the new one.
        if (!(this.transport instanceof PollTransport)) return false;
        this.transport.refresh();
        return true;
      },
      refresh: (token) => this.request<RefreshResult>("refresh", { token }),
      stop: (code, reason) => this.stop(code, reason),
      failed: (error) => this.emit("error", { type: "transport", code: ClientCode.TokenUnavailable, message: `getToken failed: ${String(error)}` }),
    });
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

  /** With `idempotencyKey`, a retry with the same key is stored once (`repeat: true`). */
  publish(channel: string, data: unknown, options: PublishOptions = {}): Promise<PublishResult> {
    const params: Record<string, unknown> = { channel, data };
    if (options.idempotencyKey !== undefined) params["idempotency_key"] = options.idempotencyKey;
    if (options.conflationKey !== undefined) params["conflation_key"] = options.conflationKey;
    return this.call<PublishResult>("publish", params);
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
    if (sub.delta !== undefined) params["delta"] = sub.delta;
    if (sub.conflate) params["conflate"] = true;
    const sentOn = this.transport;
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
        // The connection ended before the reply: that rejects with the close's code, which
        // may look like an application's refusal (1006 is in 1000-1999). The subscription
        // is sent again on the reconnect.
        if (sub.state !== "subscribing" || this.transport !== sentOn) return;
        if (isTemporaryError(error.code)) {
          sub.warn(error.code, error.message);
          this.retrySubscribe(sub);
        } else if (isRefusal(error.code)) {
          sub.failed(error.code, error.message);
        }
        // Otherwise (no reply in time) the subscription waits for the next connection.
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
      protocol: this.options.protocol,
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
          const id = this.replies.expect(
            (r) => this.onConnected(r as ConnectResult),
            (e) => this.dropTransport(e.code >= 3000 ? e.code : 3500, e.message),
          );
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
        return new PollTransport(name, ctx, this.polled, {
          longpollTimeout: this.options.longpollTimeout,
          pollInterval: this.options.pollInterval,
          timeout: this.options.timeout,
        });
    }
  }

  private onMessage(m: ServerMessage): void {
    this.lastReceived = Date.now();
    if (m.id !== undefined && m.id !== 0) {
      this.replies.settle(m as ServerMessage & { id: number });
      return;
    }
    if (m.pub !== undefined) {
      const sub = this.subs.get(m.pub.channel);
      if (sub === undefined) return;
      // On polling transports a complete resume is not announced: its first publication is.
      if (sub.state === "subscribing" && this.transport instanceof PollTransport && sub.position?.epoch !== undefined) {
        sub.confirmed({ epoch: sub.position.epoch, offset: sub.position.offset, recovered: true }, true);
      }
      sub.receive(m.pub);
    } else if (m.conflated !== undefined) {
      this.subs.get(m.conflated.channel)?.skipTo(m.conflated.offset);
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
    this.refresher.schedule(result.ttl ?? tokenTtl(this.token));
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

  /** Closes the transport ourselves and handles it like any other close. The close frame
   * carries `code` when it means coming back (the server then holds this client's presence
   * for its grace, as after a drop), 1000 when not (it leaves at once). */
  private dropTransport(code: number, reason: string): void {
    const transport = this.transport;
    if (transport === undefined) return;
    transport.close(shouldReconnect(code) && code >= 3000 && code < 5000 ? code : 1000);
    this.onTransportClose(code, reason);
  }

  private teardown(error: HeraldError, rejectWaiters = true): void {
    clearTimeout(this.connectTimer);
    this.refresher.cancel();
    clearTimeout(this.reconnectTimer);
    this.watchdog.stop();
    this.reconnectTimer = undefined;
    this.transport?.close();
    this.transport = undefined;
    this.outbox = [];
    this.replies.rejectAll(error);
    if (rejectWaiters) for (const w of this.readyWaiters.splice(0)) w.reject(error);
  }

  private backoff() {
    return { minDelay: this.options.minReconnectDelay, maxDelay: this.options.maxReconnectDelay };
  }

  /** Session transports: a connection that goes silent is taken for dead (see
   * `Watchdog`). Polling's requests have their own limits. */
  private startWatchdog(): void {
    const transport = this.transport;
    if (transport === undefined || transport instanceof PollTransport) return;
    const probe = transport.name === "websocket";
    const { pingInterval, timeout } = this.options;
    this.lastReceived = Date.now();
    this.watchdog.start(probe ? pingInterval : (transport.silenceLimit ?? pingInterval + timeout), probe, {
      alive: () => this.current === "connected" && this.transport === transport,
      lastReceived: () => this.lastReceived,
      ping: () => this.request("ping", {}),
      dead: (reason) => this.dropTransport(ClientCode.NoPong, reason),
    });
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
    const id = this.replies.expect(resolve, reject);
    this.outbox.push({ id, method, params });
    this.scheduleFlush();
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

export type { ErrorBody };
