// Generated from sdk/src/index.ts by `npm run build` in sdk/; do not edit.
"use strict";
var Herald = (() => {
  var __defProp = Object.defineProperty;
  var __getOwnPropDesc = Object.getOwnPropertyDescriptor;
  var __getOwnPropNames = Object.getOwnPropertyNames;
  var __hasOwnProp = Object.prototype.hasOwnProperty;
  var __export = (target, all) => {
    for (var name in all)
      __defProp(target, name, { get: all[name], enumerable: true });
  };
  var __copyProps = (to, from, except, desc) => {
    if (from && typeof from === "object" || typeof from === "function") {
      for (let key of __getOwnPropNames(from))
        if (!__hasOwnProp.call(to, key) && key !== except)
          __defProp(to, key, { get: () => from[key], enumerable: !(desc = __getOwnPropDesc(from, key)) || desc.enumerable });
    }
    return to;
  };
  var __toCommonJS = (mod) => __copyProps(__defProp({}, "__esModule", { value: true }), mod);

  // src/index.ts
  var index_exports = {};
  __export(index_exports, {
    AUTO_TRANSPORTS: () => AUTO_TRANSPORTS,
    Client: () => Client,
    ClientCode: () => ClientCode,
    HeraldError: () => HeraldError,
    Subscription: () => Subscription,
    VERSION: () => VERSION,
    backoffDelay: () => backoffDelay,
    decodeCursor: () => decodeCursor,
    encodeCursor: () => encodeCursor,
    shouldReconnect: () => shouldReconnect
  });

  // src/backoff.ts
  function backoffDelay(attempt, options, random = Math.random) {
    const exponent = Math.min(Math.max(attempt, 0), 30);
    const ceiling = Math.min(options.maxDelay, options.minDelay * 2 ** exponent);
    const half = ceiling / 2;
    return Math.round(half + random() * half);
  }

  // src/codes.ts
  var ClientCode = {
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
    NoTransport: 3510
  };
  var FATAL_WEBSOCKET = /* @__PURE__ */ new Set([1002, 1003, 1007, 1008, 1009, 1010]);
  function shouldReconnect(code) {
    if (code >= 3e3 && code < 5e3) {
      const inRange = code % 1e3;
      return inRange < 500;
    }
    return !FATAL_WEBSOCKET.has(code);
  }
  function isTemporaryError(code) {
    return code === 100 || code === 106 || code === 111 || code === 117 || code === 118 || code === 121 || code === 122;
  }
  function isRefusal(code) {
    return code >= 100 && code < 2e3 && !isTemporaryError(code);
  }

  // src/emitter.ts
  var Emitter = class {
    constructor() {
      this.listeners = /* @__PURE__ */ new Map();
    }
    on(event, listener) {
      let set = this.listeners.get(event);
      if (set === void 0) {
        set = /* @__PURE__ */ new Set();
        this.listeners.set(event, set);
      }
      set.add(listener);
      return () => this.off(event, listener);
    }
    once(event, listener) {
      const off = this.on(event, (ctx) => {
        off();
        listener(ctx);
      });
      return off;
    }
    off(event, listener) {
      this.listeners.get(event)?.delete(listener);
    }
    /** Listeners' exceptions are reported, never allowed to break the client's own state. */
    emit(event, ctx) {
      const set = this.listeners.get(event);
      if (set === void 0) return;
      for (const listener of [...set]) {
        try {
          listener(ctx);
        } catch (error) {
          setTimeout(() => {
            throw error;
          });
        }
      }
    }
  };

  // src/protocol.ts
  function encodeCommands(commands) {
    return commands.map((c) => {
      const wire = {};
      if (c.id !== void 0) wire["id"] = c.id;
      wire[c.method] = c.params;
      return JSON.stringify(wire);
    }).join("\n");
  }
  function decodeMessages(frame) {
    const out = [];
    for (const line of frame.split("\n")) {
      const trimmed = line.trim();
      if (trimmed === "") continue;
      const value = JSON.parse(trimmed);
      if (typeof value !== "object" || value === null || Array.isArray(value)) {
        throw new Error(`server sent ${trimmed.slice(0, 80)}, not a JSON object`);
      }
      out.push(value);
    }
    return out;
  }
  var LineSplitter = class {
    constructor() {
      this.tail = "";
    }
    push(chunk) {
      const text2 = this.tail + chunk;
      const lines = text2.split("\n");
      this.tail = lines.pop() ?? "";
      return lines.filter((l) => l.trim() !== "");
    }
  };
  function sinceParam(position) {
    if (position === void 0) return void 0;
    return position.epoch === void 0 ? { offset: position.offset } : { offset: position.offset, epoch: position.epoch };
  }

  // src/options.ts
  var AUTO_TRANSPORTS = ["websocket", "sse", "stream", "longpoll", "poll"];
  var HeraldError = class extends Error {
    constructor(code, message) {
      super(message);
      this.code = code;
      this.name = "HeraldError";
    }
  };

  // src/replies.ts
  var Replies = class {
    constructor(timeout) {
      this.timeout = timeout;
      this.nextId = 0;
      this.pending = /* @__PURE__ */ new Map();
    }
    /** A new command id, whose reply will settle `resolve` or `reject`. */
    expect(resolve, reject) {
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
    settle(m) {
      const pending = this.pending.get(m.id);
      if (pending === void 0) return;
      this.pending.delete(m.id);
      clearTimeout(pending.timer);
      if (m.error !== void 0) pending.reject(new HeraldError(m.error.code, m.error.message));
      else pending.resolve(firstResult(m));
    }
    /** Rejects every command still waiting. */
    rejectAll(error) {
      for (const [id, p] of this.pending) {
        clearTimeout(p.timer);
        this.pending.delete(id);
        p.reject(error);
      }
    }
  };
  function firstResult(m) {
    for (const key of ["connect", "subscribe", "unsubscribe", "publish", "history", "refresh", "rpc", "presence", "presence_stats", "ping"]) {
      if (m[key] !== void 0) return m[key];
    }
    return {};
  }

  // src/delta.ts
  var DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~";
  var VALUES = new Int8Array(128).fill(-1);
  for (let i = 0; i < DIGITS.length; i++) VALUES[DIGITS.charCodeAt(i)] = i;
  var DeltaError = class extends Error {
  };
  function applyDelta(source, delta) {
    let at = 0;
    const number = () => {
      const start = at;
      let value = 0;
      while (at < delta.length) {
        const c = delta[at];
        const digit = c < 128 ? VALUES[c] : -1;
        if (digit < 0) break;
        value = value * 64 + digit;
        at++;
      }
      if (at === start) throw new DeltaError("a number expected");
      return value;
    };
    const size = number();
    if (delta[at++] !== 10) throw new DeltaError("no newline after the size");
    const out = new Uint8Array(size);
    let written = 0;
    while (at < delta.length) {
      const count = number();
      const command = delta[at++];
      if (command === 64) {
        const offset = number();
        if (delta[at++] !== 44) throw new DeltaError("no comma after a copy");
        if (offset + count > source.length || written + count > size) throw new DeltaError("a copy past the end");
        out.set(source.subarray(offset, offset + count), written);
        written += count;
      } else if (command === 58) {
        if (at + count > delta.length || written + count > size) throw new DeltaError("a literal past the end");
        out.set(delta.subarray(at, at + count), written);
        written += count;
        at += count;
      } else if (command === 59) {
        if (written !== size) throw new DeltaError("the result is short");
        if (checksum(out) !== count) throw new DeltaError("bad checksum");
        return out;
      } else {
        throw new DeltaError("unknown command");
      }
    }
    throw new DeltaError("no end");
  }
  function checksum(bytes) {
    let sum = 0;
    let i = 0;
    for (; i + 4 <= bytes.length; i += 4) {
      sum = sum + (bytes[i] << 24 >>> 0) + (bytes[i + 1] << 16) + (bytes[i + 2] << 8) + bytes[i + 3] >>> 0;
    }
    let last = 0;
    for (let shift = 24; i < bytes.length; i++, shift -= 8) last += bytes[i] << shift;
    return sum + (last >>> 0) >>> 0;
  }

  // src/subscription.ts
  var encoder = new TextEncoder();
  var decoder = new TextDecoder("utf-8", { fatal: true });
  var Subscription = class extends Emitter {
    constructor(channel, host, options = {}) {
      super();
      this.channel = channel;
      this.host = host;
      this.current = "unsubscribed";
      /** Whether the subscription has been confirmed since it was last (re)subscribed. */
      this.confirmedOnce = false;
      this.at = options.since === void 0 ? void 0 : { ...options.since };
      this.delta = options.delta;
      this.conflate = options.conflate === true;
    }
    get state() {
      return this.current;
    }
    /** The last position delivered, or undefined before the first subscribe. */
    get position() {
      return this.at === void 0 ? void 0 : { ...this.at };
    }
    subscribe(options = {}) {
      if (options.since !== void 0) this.at = { ...options.since };
      if (this.current !== "unsubscribed") return;
      this.confirmedOnce = false;
      this.setState("subscribing");
      this.emit("subscribing", { channel: this.channel, code: 0, reason: "subscribe called" });
      this.host.subscribeChannel(this);
    }
    unsubscribe() {
      if (this.current === "unsubscribed") return;
      this.host.unsubscribeChannel(this);
      this.end(0, "unsubscribe called");
    }
    publish(data, options) {
      return this.host.publish(this.channel, data, options);
    }
    history(options) {
      return this.host.history(this.channel, options);
    }
    /** A page of the channel's members, in id order; pass the answer's `cursor` back for the
     * next page. Rejects with 108 when the channel's namespace keeps no presence. */
    presence(options) {
      return this.host.presence(this.channel, options);
    }
    /** How many clients and distinct users the channel has, however many (constant time). */
    presenceStats() {
      return this.host.presenceStats(this.channel);
    }
    /** A batch of joins and leaves from the server. */
    presenceChanged(join, leave, missed) {
      if (this.current !== "subscribed") return;
      for (const member of join) this.emit("join", { channel: this.channel, member });
      for (const member of leave) this.emit("leave", { channel: this.channel, member });
      if (missed) this.emit("missed", { channel: this.channel });
    }
    /** The connection dropped (or the server ended this subscription): wait to be
     * resubscribed. */
    interrupted(code, reason) {
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
    confirmed(result, publicationsFollow) {
      if (this.current === "unsubscribed") return;
      const resumed = this.at !== void 0;
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
        recovered: resumed ? result.recovered === true : void 0,
        ...result.data !== void 0 ? { data: result.data } : {}
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
    receive(pub) {
      if (this.current !== "subscribed" || this.at === void 0 || pub.offset <= this.at.offset) return;
      if (pub.full === void 0 && pub.delta === void 0) {
        this.deliver(pub.offset, pub.data, pub.from);
        return;
      }
      let text2;
      let data;
      try {
        if (pub.full !== void 0) {
          text2 = encoder.encode(pub.full);
        } else {
          if (this.base === void 0 || pub.offset !== this.at.offset + 1) throw new DeltaError("no base for the delta");
          text2 = applyDelta(this.base, encoder.encode(pub.delta));
        }
        data = JSON.parse(decoder.decode(text2));
      } catch (error) {
        this.base = void 0;
        this.host.resync(`${this.channel}: publication ${pub.offset} does not apply (${String(error)})`);
        return;
      }
      this.base = text2;
      this.deliver(pub.offset, data, pub.from);
    }
    /** The server skipped the publications after the position up to `offset`: a later one
     * of the same conflation key replaced each while it waited. */
    skipTo(offset) {
      if (this.current !== "subscribed" || this.at === void 0 || !this.conflate) return;
      if (offset > this.at.offset) this.at.offset = offset;
    }
    /** A publication for this channel; at or below the position it is a repeat and dropped. */
    deliver(offset, data, from) {
      if (this.current !== "subscribed" || this.at === void 0) return;
      if (offset <= this.at.offset) return;
      if (this.at.epoch !== void 0 && this.at.offset > 0 && offset !== this.at.offset + 1) {
        this.host.resync(`${this.channel}: offset ${offset} after ${this.at.offset}`);
        return;
      }
      this.at.offset = offset;
      this.emit("publication", { channel: this.channel, offset, epoch: this.at.epoch, data, ...from !== void 0 ? { from } : {} });
    }
    /** The server refused the subscription for good. */
    failed(code, message) {
      this.emit("error", { channel: this.channel, code, message });
      this.end(code, message);
    }
    /** The server's operator ended the subscription (code 120): it stays ended until the
     * application subscribes again. */
    endedByServer(code, reason) {
      this.end(code, reason);
    }
    /** Reports an error that did not end the subscription. */
    warn(code, message) {
      this.emit("error", { channel: this.channel, code, message });
    }
    end(code, reason) {
      if (this.current === "unsubscribed") return;
      this.setState("unsubscribed");
      this.emit("unsubscribed", { channel: this.channel, code, reason });
    }
    setState(state) {
      if (state === this.current) return;
      const previous = this.current;
      this.current = state;
      this.emit("state", { state, previous });
    }
  };

  // src/token.ts
  var TokenRefresher = class {
    constructor(getToken, host) {
      this.getToken = getToken;
      this.host = host;
    }
    /** Refreshes the token when 80% of its `ttlSeconds` have passed (at least a second before
     * the end, so the `refresh` command arrives in time). */
    schedule(ttlSeconds) {
      this.cancel();
      if (ttlSeconds === void 0 || this.getToken === void 0) return;
      const ms = Math.max(0, Math.min(ttlSeconds * 800, ttlSeconds * 1e3 - 1e3));
      this.timer = setTimeout(() => {
        this.timer = void 0;
        void this.refresh();
      }, ms);
    }
    cancel() {
      clearTimeout(this.timer);
      this.timer = void 0;
    }
    /** One refresh at a time: a second caller shares the one in flight. */
    refresh() {
      this.running ?? (this.running = this.run().finally(() => this.running = void 0));
      return this.running;
    }
    async run() {
      const getToken = this.getToken;
      if (getToken === void 0) return;
      const host = this.host;
      const retry = (attempt) => new Promise((r) => setTimeout(r, backoffDelay(attempt, { minDelay: 250, maxDelay: 5e3 })));
      for (let attempt = 0; host.connected(); attempt++) {
        let token;
        try {
          token = await getToken();
        } catch (error) {
          host.failed(error);
          await retry(attempt);
          continue;
        }
        if (!host.connected()) return;
        if (token === null || token === void 0 || token === "") {
          host.stop(3500, "getToken gave no token");
          return;
        }
        if (host.adopt(token)) {
          this.schedule(tokenTtl(token));
          return;
        }
        try {
          const result = await host.refresh(token);
          this.schedule(result.ttl);
        } catch (error) {
          const code = error instanceof HeraldError ? error.code : 0;
          if (code === 101) host.stop(3500, `refresh refused: ${String(error)}`);
          else if (code === 109) {
            await retry(attempt);
            continue;
          }
        }
        return;
      }
    }
  };
  function tokenTtl(token) {
    const payload = token?.split(".")[1];
    if (payload === void 0) return void 0;
    try {
      const json2 = atob(payload.replace(/-/g, "+").replace(/_/g, "/"));
      const exp = JSON.parse(json2).exp;
      return typeof exp === "number" ? Math.max(0, exp - Date.now() / 1e3) : void 0;
    } catch {
      return void 0;
    }
  }

  // src/watchdog.ts
  var Watchdog = class {
    start(limit, probe, watched) {
      this.stop();
      const check = () => {
        this.timer = void 0;
        if (!watched.alive()) return;
        const silent = Date.now() - watched.lastReceived();
        if (silent < limit) {
          this.timer = setTimeout(check, limit - silent);
        } else if (!probe) {
          watched.dead(`nothing received for ${silent} ms`);
        } else {
          watched.ping().then(
            () => {
              if (watched.alive()) this.timer = setTimeout(check, limit);
            },
            (error) => {
              if (error.code === ClientCode.NoPong && watched.alive()) watched.dead("no reply to ping");
            }
          );
        }
      };
      this.timer = setTimeout(check, limit);
    }
    stop() {
      clearTimeout(this.timer);
      this.timer = void 0;
    }
  };

  // src/transport/types.ts
  function authClose(code) {
    return code === 101 ? 3500 : code === 109 ? 3504 : code;
  }
  async function httpFailure(response) {
    let code = 0;
    let reason = `HTTP ${response.status}`;
    let channel;
    try {
      const body = await response.json();
      if (body.error?.code !== void 0) code = body.error.code;
      if (body.error?.message !== void 0) reason = `${reason}: ${body.error.message}`;
      if (typeof body.error?.channel === "string") channel = body.error.channel;
    } catch {
    }
    if (code === 119) return { code: 3502, reason };
    return { code: response.status === 401 ? authClose(code) : code, reason, ...channel !== void 0 ? { channel } : {} };
  }

  // src/transport/session.ts
  var HttpSessionTransport = class {
    constructor(ctx) {
      this.ctx = ctx;
      this.closed = false;
      this.sending = Promise.resolve();
    }
    /** The stream's URL; it opens without channels, which follow as `subscribe` commands.
     * The token rides in the query: EventSource and iframes cannot set headers. */
    streamUrl(path, query = "") {
      const params = new URLSearchParams(query);
      if (!params.has("ping")) params.set("ping", `${this.ctx.pingInterval}ms`);
      const token = this.ctx.token();
      if (token !== void 0) params.set("token", token);
      const first = this.ctx.firstClient();
      if (first !== void 0) params.set("client", first);
      const q = params.toString();
      return `${this.ctx.baseUrl}/connection/${path}${q === "" ? "" : "?" + q}`;
    }
    deliver(message) {
      if (this.closed) return;
      if (message.connect !== void 0 && message.id === void 0) this.session = message.connect.client;
      this.ctx.events.message(message);
    }
    send(commands) {
      if (this.closed) return;
      const body = encodeCommands(commands);
      this.sending = this.sending.then(async () => {
        if (this.closed || this.session === void 0) return;
        const url = `${this.ctx.baseUrl}/connection/send?session=${encodeURIComponent(this.session)}`;
        try {
          const response = await this.ctx.fetch(url, {
            method: "POST",
            body,
            headers: { "Content-Type": "application/x-ndjson" }
          });
          if (!response.ok) {
            const { code, reason } = await httpFailure(response);
            this.fail(response.status === 409 ? ClientCode.TransportClosed : code || ClientCode.TransportClosed, reason);
          }
        } catch (error) {
          this.fail(ClientCode.TransportClosed, `sending failed: ${String(error)}`);
        }
      });
    }
    close() {
      this.closed = true;
      this.stop();
    }
    /** Ends the transport and reports it, once. */
    fail(code, reason) {
      if (this.closed) return;
      this.close();
      this.ctx.events.close(code, reason);
    }
  };

  // src/transport/iframe.ts
  var serial = 0;
  var FRAME_PING_MS = 250;
  var IframeTransport = class extends HttpSessionTransport {
    constructor(ctx) {
      super(ctx);
      this.name = "iframe";
      this.silenceLimit = 4 * FRAME_PING_MS;
      if (globalThis.document === void 0) throw new Error("the forever frame needs a browser document");
      serial += 1;
      this.callback = `__herald_frame_${serial}`;
      globalThis[this.callback] = (m) => this.deliver(m);
      this.frame = document.createElement("iframe");
      this.frame.style.display = "none";
      this.frame.setAttribute("aria-hidden", "true");
      this.frame.onload = () => this.fail(ClientCode.TransportClosed, "forever frame ended");
      if (document.readyState === "complete") {
        this.open();
      } else {
        this.waitingForPage = () => this.open();
        globalThis.addEventListener("load", this.waitingForPage, { once: true });
      }
    }
    open() {
      this.waitingForPage = void 0;
      if (this.closed) return;
      this.frame.src = this.streamUrl("iframe", `callback=${this.callback}&ping=${FRAME_PING_MS}ms`);
      document.body.appendChild(this.frame);
    }
    stop() {
      if (this.waitingForPage !== void 0) globalThis.removeEventListener("load", this.waitingForPage);
      delete globalThis[this.callback];
      this.frame.onload = null;
      this.frame.src = "about:blank";
      this.frame.remove();
    }
  };

  // src/polled.ts
  var PolledSubscriptions = class {
    constructor(subs) {
      this.subs = subs;
    }
    channels() {
      const out = /* @__PURE__ */ new Map();
      for (const sub of this.subs.values()) {
        if (sub.state !== "unsubscribed") out.set(sub.channel, sub.position);
      }
      return out;
    }
    /** Whether a subscription asks for deltas (a poll asks for them for all its channels:
     * a subscription that did not ask takes them just as well). */
    delta() {
      return [...this.subs.values()].some((s) => s.state !== "unsubscribed" && s.delta !== void 0);
    }
    /** Whether the polls skip replaced publications: only when every subscription asks
     * (one request opens them all alike, and a subscription that did not ask gets every
     * publication). */
    conflate() {
      const open = [...this.subs.values()].filter((s) => s.state !== "unsubscribed");
      return open.length > 0 && open.every((s) => s.conflate);
    }
    answered(requested, announced) {
      for (const channel of requested) {
        const sub = this.subs.get(channel);
        if (sub === void 0 || sub.state !== "subscribing" || announced.has(channel)) continue;
        const position = sub.position;
        if (position?.epoch !== void 0) sub.confirmed({ epoch: position.epoch, offset: position.offset, recovered: true }, true);
      }
    }
    refused(code, reason, channel) {
      if (!isRefusal(code)) return false;
      const named = channel === void 0 ? void 0 : this.subs.get(channel);
      if (named !== void 0 && named.state !== "unsubscribed") {
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
  };

  // src/cursor.ts
  function encodeCursor(positions) {
    const parts = [];
    for (const [channel, p] of positions) {
      parts.push(`${channel};${p.epoch ?? "*"};${p.offset}`);
    }
    return parts.join("|");
  }
  function decodeCursor(cursor) {
    const out = /* @__PURE__ */ new Map();
    if (cursor === "") return out;
    for (const entry of cursor.split("|")) {
      const fields = entry.split(";");
      if (fields.length !== 3) throw new Error(`cursor entry ${JSON.stringify(entry)} is not CHANNEL;EPOCH;OFFSET`);
      const [channel, epoch, offsetText] = fields;
      const offset = Number(offsetText);
      if (channel === "" || epoch === "" || !/^\d+$/.test(offsetText) || !Number.isSafeInteger(offset)) {
        throw new Error(`cursor entry ${JSON.stringify(entry)} is not CHANNEL;EPOCH;OFFSET`);
      }
      out.set(channel, epoch === "*" ? { offset } : { offset, epoch });
    }
    return out;
  }

  // src/transport/poll.ts
  var PollTransport = class {
    constructor(name, ctx, source, options) {
      this.name = name;
      this.ctx = ctx;
      this.source = source;
      this.options = options;
      this.closed = false;
      this.fresh = true;
      /** A refresh came while no pause was waiting for it. */
      this.refreshed = false;
      this.sending = Promise.resolve();
      void this.run();
    }
    /** The channels changed: ask again now, without waiting for a held request to end. */
    refresh() {
      this.fresh = true;
      this.refreshed = true;
      this.etag = void 0;
      this.inFlight?.abort();
      this.wake?.();
    }
    send(commands) {
      if (this.closed) return;
      const body = encodeCommands(commands);
      this.sending = this.sending.then(async () => {
        if (this.closed) return;
        try {
          const response = await this.ctx.fetch(this.sendUrl(), {
            method: "POST",
            body,
            headers: { "Content-Type": "application/x-ndjson" }
          });
          const text2 = await response.text();
          for (const m of decodeMessages(text2)) this.emit(m);
        } catch (error) {
          this.fail(ClientCode.TransportClosed, `sending failed: ${String(error)}`);
        }
      });
    }
    /** `POST /connection/send` with the current tokens. */
    sendUrl() {
      const params = new URLSearchParams();
      const token = this.ctx.token();
      if (token !== void 0) params.set("token", token);
      for (const t of this.ctx.subscriptionTokens()) params.append("sub_token", t);
      const q = params.toString();
      return `${this.ctx.baseUrl}/connection/send${q === "" ? "" : "?" + q}`;
    }
    close() {
      this.closed = true;
      this.inFlight?.abort();
      this.wake?.();
    }
    emit(message) {
      if (!this.closed) this.ctx.events.message(message);
    }
    fail(code, reason) {
      if (this.closed) return;
      this.close();
      this.ctx.events.close(code, reason);
    }
    async run() {
      try {
        const response = await this.ctx.fetch(this.sendUrl(), {
          method: "POST",
          body: '{"id":0,"ping":{}}',
          headers: { "Content-Type": "application/x-ndjson" }
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
    async poll(channels) {
      const held = this.name === "longpoll" && !this.fresh;
      this.fresh = false;
      this.refreshed = false;
      const params = new URLSearchParams();
      const positioned = [];
      for (const [channel, position] of channels) {
        if (position === void 0) params.append("channel", channel);
        else positioned.push([channel, position]);
      }
      if (positioned.length > 0) params.set("cursor", encodeCursor(positioned));
      if (this.source.delta()) params.set("delta", "fossil");
      if (this.source.conflate()) params.set("conflate", "true");
      if (held) params.set("timeout", String(this.options.longpollTimeout));
      const first = this.ctx.firstClient();
      if (first !== void 0) params.set("client", first);
      if (this.name === "longpoll") params.set("session_key", this.sessionKey ?? "");
      const token = this.ctx.token();
      if (token !== void 0) params.set("token", token);
      for (const t of this.ctx.subscriptionTokens()) params.append("sub_token", t);
      const abort = new AbortController();
      this.inFlight = abort;
      const wait = held ? this.options.longpollTimeout * 1e3 + this.options.timeout : this.ctx.pingInterval;
      const limit = setTimeout(() => abort.abort(), wait);
      const headers = {};
      if (this.name === "poll" && this.etag !== void 0) headers["If-None-Match"] = this.etag;
      try {
        const response = await this.ctx.fetch(
          `${this.ctx.baseUrl}/connection/${held ? "longpoll" : "poll"}?${params.toString()}`,
          { signal: abort.signal, headers, cache: "no-store" }
        );
        if (response.status === 304) return;
        if (!response.ok) {
          const { code, reason, channel } = await httpFailure(response);
          if (!this.source.refused(code, reason, channel)) this.fail(code || ClientCode.TransportClosed, reason);
          this.fresh = true;
          return;
        }
        this.etag = response.headers.get("ETag") ?? void 0;
        const answer = await response.json();
        if (typeof answer.client === "string") this.ctx.rememberClient(answer.client);
        this.sessionKey = answer.session_key;
        const announced = /* @__PURE__ */ new Set();
        for (const m of answer.messages ?? []) {
          if (m.subscribe?.channel !== void 0) announced.add(m.subscribe.channel);
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
        if (this.inFlight === abort) this.inFlight = void 0;
      }
    }
    pause(ms) {
      return new Promise((resolve) => {
        const timer = ms === Infinity ? void 0 : setTimeout(done, ms);
        const self = this;
        function done() {
          if (timer !== void 0) clearTimeout(timer);
          self.wake = void 0;
          resolve();
        }
        this.wake = done;
        if (this.closed || this.refreshed) done();
        this.refreshed = false;
      });
    }
  };

  // src/transport/sse.ts
  var SseTransport = class extends HttpSessionTransport {
    constructor(ctx, eventSource = globalThis.EventSource) {
      super(ctx);
      this.name = "sse";
      if (eventSource === void 0) {
        throw new Error(
          "EventSource is not available here: in Node, install the `eventsource` package and pass its EventSource as the `eventSource` option, or use another transport"
        );
      }
      this.source = new eventSource(this.streamUrl("sse"));
      this.source.onmessage = (event) => {
        try {
          for (const m of decodeMessages(String(event.data))) this.deliver(m);
        } catch {
          this.fail(3501, "the server sent an event that is not JSON");
        }
      };
      this.source.onerror = () => this.fail(ClientCode.TransportClosed, "event stream closed");
    }
    stop() {
      this.source.close();
    }
  };

  // src/transport/stream.ts
  var StreamTransport = class extends HttpSessionTransport {
    constructor(ctx) {
      super(ctx);
      this.name = "stream";
      this.abort = new AbortController();
      void this.read();
    }
    async read() {
      try {
        const response = await this.ctx.fetch(this.streamUrl("stream"), { signal: this.abort.signal, cache: "no-store" });
        if (!response.ok || response.body === null) {
          const { code, reason } = await httpFailure(response);
          this.fail(code || ClientCode.TransportClosed, reason);
          return;
        }
        const reader = response.body.getReader();
        const decoder2 = new TextDecoder();
        const lines = new LineSplitter();
        for (; ; ) {
          const { done, value } = await reader.read();
          if (done) break;
          for (const line of lines.push(decoder2.decode(value, { stream: true }))) {
            for (const m of decodeMessages(line)) this.deliver(m);
          }
        }
        this.fail(ClientCode.TransportClosed, "stream ended");
      } catch (error) {
        this.fail(ClientCode.TransportClosed, `stream failed: ${String(error)}`);
      }
    }
    stop() {
      this.abort.abort();
    }
  };

  // src/protobuf.ts
  var utf8 = new TextEncoder();
  var text = new TextDecoder();
  var Writer = class _Writer {
    constructor() {
      this.bytes = [];
    }
    varint(n) {
      while (n > 127) {
        this.bytes.push(n % 128 | 128);
        n = Math.floor(n / 128);
      }
      this.bytes.push(n);
    }
    /** A varint field, written when given (`optional` fields are written even when 0). */
    number(field, n) {
      if (typeof n !== "number") return;
      this.varint(field * 8);
      this.varint(n);
    }
    /** A length-delimited field: a string, bytes, or a nested message. */
    bytesField(field, value) {
      if (value === void 0) return;
      this.varint(field * 8 + 2);
      this.varint(value.length);
      for (const b of value) this.bytes.push(b);
    }
    string(field, s) {
      if (typeof s === "string") this.bytesField(field, utf8.encode(s));
    }
    message(field, write) {
      const inner = new _Writer();
      write(inner);
      this.bytesField(field, Uint8Array.from(inner.bytes));
    }
  };
  var METHOD_FIELDS = {
    connect: 2,
    subscribe: 3,
    unsubscribe: 4,
    publish: 5,
    history: 6,
    refresh: 7,
    rpc: 8,
    presence: 9,
    presence_stats: 10,
    ping: 11
  };
  function since(w, field, value) {
    if (typeof value !== "object" || value === null) return;
    const s = value;
    w.message(field, (m) => {
      if (s["offset"] !== 0) m.number(1, s["offset"]);
      m.string(2, s["epoch"]);
    });
  }
  function json(w, field, value) {
    if (value !== void 0) w.bytesField(field, utf8.encode(JSON.stringify(value)));
  }
  var WRITE_PARAMS = {
    connect: (w, p) => ["token", "name", "version", "client"].forEach((k, i) => w.string(i + 1, p[k])),
    subscribe: (w, p) => {
      w.string(1, p["channel"]);
      since(w, 2, p["since"]);
      w.string(3, p["token"]);
      w.string(4, p["delta"]);
      if (p["conflate"] === true) w.number(5, 1);
    },
    unsubscribe: (w, p) => w.string(1, p["channel"]),
    publish: (w, p) => {
      w.string(1, p["channel"]);
      json(w, 2, p["data"]);
      w.string(3, p["idempotency_key"]);
      w.string(4, p["conflation_key"]);
    },
    history: (w, p) => {
      w.string(1, p["channel"]);
      since(w, 2, p["since"]);
      w.number(3, p["limit"]);
    },
    refresh: (w, p) => {
      w.string(1, p["channel"]);
      w.string(2, p["token"]);
    },
    rpc: (w, p) => {
      w.string(1, p["method"]);
      json(w, 2, p["data"]);
    },
    presence: (w, p) => {
      w.string(1, p["channel"]);
      w.number(2, p["limit"]);
      w.string(3, p["cursor"]);
    },
    presence_stats: (w, p) => w.string(1, p["channel"]),
    ping: () => void 0
  };
  function encodeProtobufCommands(commands) {
    const frame = new Writer();
    for (const c of commands) {
      const command = new Writer();
      command.number(1, c.id);
      command.message(METHOD_FIELDS[c.method], (w) => WRITE_PARAMS[c.method](w, c.params));
      frame.varint(command.bytes.length);
      frame.bytes.push(...command.bytes);
    }
    return Uint8Array.from(frame.bytes);
  }
  var PUBLICATION = { fields: { 1: ["offset", "u"], 2: ["data", "j"], 3: ["from", "j"] }, defaults: () => ({ offset: 0 }) };
  var STREAM = {
    fields: { 1: ["channel", "s"], 2: ["epoch", "s"], 3: ["offset", "u"], 4: ["recovered", "b"], 5: ["publications[]", PUBLICATION], 6: ["data", "j"], 7: ["delta", "s"] },
    defaults: () => ({ epoch: "", offset: 0 })
  };
  var MEMBER = { fields: { 1: ["client", "s"], 2: ["...", "j"] }, defaults: () => ({ client: "" }) };
  var EXPIRY = { fields: { 1: ["expires", "u"], 2: ["ttl", "u"] } };
  var SERVER_MESSAGE = {
    fields: {
      1: ["id", "u"],
      2: ["error", { fields: { 1: ["code", "u"], 2: ["message", "s"], 3: ["channel", "s"] }, defaults: () => ({ code: 0, message: "" }) }],
      3: [
        "connect",
        { fields: { 1: ["client", "s"], 2: ["version", "s"], 3: ["ping", "u"], 4: ["user", "s"], 5: ["expires", "u"], 6: ["ttl", "u"] }, defaults: () => ({ client: "", version: "", ping: 0 }) }
      ],
      4: ["subscribe", STREAM],
      5: ["unsubscribe", { fields: { 1: ["channel", "s"], 2: ["code", "u"], 3: ["reason", "s"] } }],
      6: ["publish", { fields: { 1: ["offset", "u"], 2: ["epoch", "s"], 3: ["repeat", "b"] }, defaults: () => ({ offset: 0, epoch: "" }) }],
      7: ["history", STREAM],
      8: ["refresh", EXPIRY],
      9: ["rpc", { fields: { 1: ["data", "j"] } }],
      10: ["presence", { fields: { 1: ["channel", "s"], 2: ["members[]", MEMBER], 3: ["cursor", "s"], 4: ["join[]", MEMBER], 5: ["leave[]", MEMBER], 6: ["missed", "b"], 7: ["clients", "u"] } }],
      11: ["presence_stats", { fields: { 1: ["clients", "u"], 2: ["users", "u"] }, defaults: () => ({ clients: 0, users: 0 }) }],
      12: ["ping", { fields: {} }],
      13: ["pub", { fields: { 1: ["channel", "s"], 2: ["offset", "u"], 3: ["data", "j"], 4: ["from", "j"], 5: ["full", "s"], 6: ["delta", "s"] }, defaults: () => ({ channel: "", offset: 0 }) }],
      14: ["disconnect", { fields: { 1: ["code", "u"], 2: ["reason", "s"], 3: ["reconnect", "b"] }, defaults: () => ({ code: 0, reason: "", reconnect: false }) }],
      15: ["conflated", { fields: { 1: ["channel", "s"], 2: ["offset", "u"] }, defaults: () => ({ channel: "", offset: 0 }) }]
    }
  };
  var Reader = class {
    constructor(bytes) {
      this.bytes = bytes;
      this.at = 0;
    }
    varint() {
      let n = 0;
      let scale = 1;
      for (; ; ) {
        if (this.at >= this.bytes.length) throw new Error("a Protobuf message is cut short");
        const b = this.bytes[this.at++];
        n += (b & 127) * scale;
        if (b < 128) return n;
        scale *= 128;
        if (scale > 2 ** 63) throw new Error("a Protobuf varint is too long");
      }
    }
    take(length) {
      if (this.at + length > this.bytes.length) throw new Error("a Protobuf message is cut short");
      const part = this.bytes.subarray(this.at, this.at + length);
      this.at += length;
      return part;
    }
  };
  function read(bytes, schema) {
    var _a;
    const out = schema.defaults?.() ?? {};
    const r = new Reader(bytes);
    while (r.at < bytes.length) {
      const key = r.varint();
      const [field, wireType] = [Math.floor(key / 8), key % 8];
      const value = wireType === 0 ? r.varint() : wireType === 2 ? r.take(r.varint()) : void 0;
      if (value === void 0) throw new Error(`unexpected Protobuf wire type ${wireType}`);
      const known = schema.fields[field];
      if (known === void 0) continue;
      const [name, kind] = known;
      const item = kind === "u" ? value : kind === "b" ? value !== 0 : kind === "s" ? text.decode(value) : kind === "j" ? JSON.parse(text.decode(value)) : read(value, kind);
      if (name === "...") Object.assign(out, item);
      else if (name.endsWith("[]")) (out[_a = name.slice(0, -2)] ?? (out[_a] = [])).push(item);
      else out[name] = item;
    }
    return out;
  }
  function decodeProtobufMessages(frame) {
    const out = [];
    const r = new Reader(frame);
    while (r.at < frame.length) {
      const message = read(r.take(r.varint()), SERVER_MESSAGE);
      const presence = message.presence;
      if (presence !== void 0 && message.id === void 0) {
        presence.join ?? (presence.join = []);
        presence.leave ?? (presence.leave = []);
      } else if (presence !== void 0) {
        presence.members ?? (presence.members = []);
      }
      out.push(message);
    }
    return out;
  }

  // src/transport/websocket.ts
  var WebSocketTransport = class {
    constructor(ctx) {
      this.ctx = ctx;
      this.name = "websocket";
      this.closed = false;
      const Impl = ctx.websocket ?? globalThis.WebSocket;
      if (Impl === void 0) throw new Error("WebSocket is not available here");
      const protobuf = ctx.protocol === "protobuf";
      this.socket = new Impl(ctx.baseUrl.replace(/^http/, "ws") + "/connection/websocket", protobuf ? "herald.protobuf" : "herald.json");
      this.socket.binaryType = "arraybuffer";
      this.protobuf = protobuf;
      this.socket.onmessage = (event) => {
        if (this.closed) return;
        let messages;
        try {
          messages = this.protobuf ? decodeProtobufMessages(new Uint8Array(event.data)) : decodeMessages(String(event.data));
        } catch {
          this.fail(3501, `the server sent a frame that is not ${this.protobuf ? "Protobuf" : "JSON"}`);
          return;
        }
        for (const m of messages) {
          if (this.closed) return;
          this.ctx.events.message(m);
        }
      };
      this.socket.onerror = () => void 0;
      this.socket.onclose = (event) => {
        if (this.closed) return;
        this.closed = true;
        this.ctx.events.close(event.code || ClientCode.TransportClosed, event.reason || "connection closed");
      };
    }
    /** The socket's own `open` is when commands may be sent; the client sends `connect` then. */
    onOpen(callback) {
      this.socket.onopen = () => {
        if (!this.closed) callback();
      };
    }
    send(commands) {
      if (this.closed || this.socket.readyState !== 1) return;
      this.socket.send(this.protobuf ? encodeProtobufCommands(commands) : encodeCommands(commands));
    }
    close(code = 1e3) {
      this.closed = true;
      try {
        this.socket.close(code);
      } catch {
      }
    }
    fail(code, reason) {
      this.close();
      this.ctx.events.close(code, reason);
    }
  };

  // src/client.ts
  var VERSION = "0.1.0";
  var Client = class extends Emitter {
    /** `url`: the server's HTTP(S) base URL; in a browser it defaults to the page's origin. */
    constructor(url, options = {}) {
      super();
      /** Set when the server said the token expired: get a new one before reconnecting. */
      this.tokenStale = false;
      this.current = "disconnected";
      this.transportIndex = 0;
      this.lastWorking = -1;
      this.failuresOfWorking = 0;
      this.attempt = 0;
      this.watchdog = new Watchdog();
      this.lastReceived = 0;
      this.clientId = "";
      this.outbox = [];
      this.flushScheduled = false;
      this.readyWaiters = [];
      this.subs = /* @__PURE__ */ new Map();
      /** The subscriptions as the polling transports read them. */
      this.polled = new PolledSubscriptions(this.subs);
      /** Transports that do not exist in this environment, with why. */
      this.unavailable = /* @__PURE__ */ new Map();
      const base = url ?? globalThis.location?.origin;
      if (base === void 0) throw new Error("give the server's URL, e.g. new Client('http://127.0.0.1:8080')");
      this.baseUrl = base.replace(/\/+$/, "");
      const transports = options.transports ?? "auto";
      this.order = transports === "auto" ? AUTO_TRANSPORTS : typeof transports === "string" ? [transports] : [...transports];
      if (this.order.length === 0) throw new Error("transports: name at least one");
      this.doFetch = options.fetch ?? globalThis.fetch.bind(globalThis);
      const pingInterval = options.pingInterval ?? 9e3;
      this.options = {
        minReconnectDelay: options.minReconnectDelay ?? 500,
        maxReconnectDelay: options.maxReconnectDelay ?? 2e4,
        timeout: options.timeout ?? 5e3,
        longpollTimeout: options.longpollTimeout ?? Math.max(1, Math.round(pingInterval / 1e3)),
        pollInterval: options.pollInterval ?? 1e3,
        batchDelay: options.batchDelay ?? 0,
        protocol: options.protocol ?? "json",
        retriesBeforeFallback: options.retriesBeforeFallback ?? 3,
        name: options.name,
        pingInterval,
        websocket: options.websocket,
        eventSource: options.eventSource,
        getToken: options.getToken,
        getSubscriptionToken: options.getSubscriptionToken
      };
      this.token = options.token;
      this.replies = new Replies(this.options.timeout);
      this.refresher = new TokenRefresher(this.options.getToken, {
        connected: () => this.current === "connected",
        adopt: (token) => {
          this.token = token;
          if (!(this.transport instanceof PollTransport)) return false;
          this.transport.refresh();
          return true;
        },
        refresh: (token) => this.request("refresh", { token }),
        stop: (code, reason) => this.stop(code, reason),
        failed: (error) => this.emit("error", { type: "transport", code: ClientCode.TokenUnavailable, message: `getToken failed: ${String(error)}` })
      });
    }
    get state() {
      return this.current;
    }
    /** The transport in use (or being tried). */
    get transportName() {
      return this.transport?.name;
    }
    connect() {
      if (this.current !== "disconnected") return;
      this.attempt = 0;
      this.setState("connecting");
      this.emit("connecting", { code: 0, reason: "connect called", transport: this.order[this.transportIndex] });
      this.open();
    }
    disconnect() {
      this.stop(ClientCode.Disconnected, "disconnect called");
    }
    /** Ends the connection for good and reports why. */
    stop(code, reason) {
      if (this.current === "disconnected") return;
      this.teardown(new HeraldError(code, reason));
      this.setState("disconnected");
      for (const sub of this.subs.values()) sub.interrupted(code, reason);
      this.emit("disconnected", { code, reason });
    }
    newSubscription(channel, options) {
      if (this.subs.has(channel)) throw new Error(`already a subscription to ${channel}; use getSubscription`);
      const sub = new Subscription(channel, this, options);
      this.subs.set(channel, sub);
      return sub;
    }
    /** Shorthand: a new subscription, subscribed at once. */
    subscribe(channel, options) {
      const sub = this.newSubscription(channel, options);
      sub.subscribe();
      return sub;
    }
    getSubscription(channel) {
      return this.subs.get(channel);
    }
    removeSubscription(sub) {
      sub.unsubscribe();
      this.subs.delete(sub.channel);
    }
    /** With `idempotencyKey`, a retry with the same key is stored once (`repeat: true`). */
    publish(channel, data, options = {}) {
      const params = { channel, data };
      if (options.idempotencyKey !== void 0) params["idempotency_key"] = options.idempotencyKey;
      if (options.conflationKey !== void 0) params["conflation_key"] = options.conflationKey;
      return this.call("publish", params);
    }
    /**
     * Calls the application's backend through Herald (its `rpc` hook) and resolves with its
     * answer's data; over every transport. Rejects with the backend's code (1000-1999 are the
     * application's own), 108 when the server has no rpc hook, 118 when the backend failed.
     */
    async rpc(method, data) {
      const params = { method };
      if (data !== void 0) params["data"] = data;
      const result = await this.call("rpc", params);
      return result.data;
    }
    history(channel, options = {}) {
      const params = { channel };
      if (options.limit !== void 0) params["limit"] = options.limit;
      const since2 = sinceParam(options.since);
      if (since2 !== void 0) params["since"] = since2;
      return this.call("history", params);
    }
    /** A page of `channel`'s members (namespaces with `presence`); see `Subscription.presence`. */
    presence(channel, options = {}) {
      const params = { channel };
      if (options.limit !== void 0) params["limit"] = options.limit;
      if (options.cursor !== void 0) params["cursor"] = options.cursor;
      return this.call("presence", params);
    }
    /** How many clients and distinct users `channel` has, however many. */
    presenceStats(channel) {
      return this.call("presence_stats", { channel });
    }
    // --- SubscriptionHost ---
    subscribeChannel(sub) {
      if (this.current !== "connected" || this.transport === void 0) return;
      const getToken = this.options.getSubscriptionToken;
      if (getToken === void 0) {
        this.sendSubscribe(sub);
        return;
      }
      const transport = this.transport;
      getToken(sub.channel).then(
        (token) => {
          sub.token = token ?? void 0;
          if (this.transport === transport && sub.state === "subscribing") this.sendSubscribe(sub);
        },
        (error) => {
          sub.warn(ClientCode.TokenUnavailable, `getSubscriptionToken failed: ${String(error)}`);
          this.retrySubscribe(sub);
        }
      );
    }
    sendSubscribe(sub) {
      if (this.current !== "connected" || this.transport === void 0) return;
      if (this.transport instanceof PollTransport) {
        this.transport.refresh();
        return;
      }
      const params = { channel: sub.channel };
      const since2 = sinceParam(sub.position);
      if (since2 !== void 0) params["since"] = since2;
      if (sub.token !== void 0) params["token"] = sub.token;
      if (sub.delta !== void 0) params["delta"] = sub.delta;
      if (sub.conflate) params["conflate"] = true;
      const sentOn = this.transport;
      this.command(
        "subscribe",
        params,
        (result) => {
          if (this.subs.get(sub.channel) === sub && sub.state === "subscribing") sub.confirmed(result, false);
        },
        (error) => {
          if (sub.state !== "subscribing" || this.transport !== sentOn) return;
          if (isTemporaryError(error.code)) {
            sub.warn(error.code, error.message);
            this.retrySubscribe(sub);
          } else if (isRefusal(error.code)) {
            sub.failed(error.code, error.message);
          }
        }
      );
    }
    unsubscribeChannel(sub) {
      if (this.current !== "connected" || this.transport === void 0) return;
      if (this.transport instanceof PollTransport) {
        queueMicrotask(() => this.transport?.refresh?.());
        return;
      }
      this.request("unsubscribe", { channel: sub.channel }).catch(() => {
      });
    }
    resync(reason) {
      this.emit("error", { type: "server", code: ClientCode.OutOfOrder, message: reason });
      this.dropTransport(ClientCode.OutOfOrder, `out of order: ${reason}`);
    }
    // --- connection ---
    /** Opens the next transport, fetching a token first when one is due. */
    open() {
      const getToken = this.options.getToken;
      if (getToken === void 0 || this.token !== void 0 && !this.tokenStale) {
        this.openTransport();
        return;
      }
      getToken().then(
        (token) => {
          if (this.current !== "connecting" || this.transport !== void 0) return;
          if (token === null || token === void 0 || token === "") {
            this.stop(3500, "getToken gave no token");
            return;
          }
          this.token = token;
          this.tokenStale = false;
          this.openTransport();
        },
        (error) => {
          if (this.current !== "connecting" || this.transport !== void 0) return;
          this.emit("error", { type: "transport", code: ClientCode.TokenUnavailable, message: `getToken failed: ${String(error)}` });
          this.reconnectTimer = setTimeout(() => {
            this.reconnectTimer = void 0;
            if (this.current === "connecting" && this.transport === void 0) this.open();
          }, backoffDelay(this.attempt++, this.backoff()));
        }
      );
    }
    openTransport() {
      const name = this.order[this.transportIndex];
      const ctx = {
        baseUrl: this.baseUrl,
        pingInterval: this.options.pingInterval,
        protocol: this.options.protocol,
        fetch: this.doFetch,
        websocket: this.options.websocket,
        token: () => this.token,
        subscriptionTokens: () => [...this.subs.values()].flatMap((s) => s.state !== "unsubscribed" && s.token !== void 0 ? [s.token] : []),
        firstClient: () => this.firstClient,
        rememberClient: (client) => {
          this.firstClient ?? (this.firstClient = client);
        },
        events: {
          message: (m) => this.onMessage(m),
          close: (code, reason) => this.onTransportClose(code, reason)
        }
      };
      let transport;
      try {
        transport = this.makeTransport(name, ctx);
      } catch (error) {
        this.transport = void 0;
        const why = `${name}: ${error instanceof Error ? error.message : String(error)}`;
        this.unavailable.set(name, why);
        if (this.order.every((n) => this.unavailable.has(n))) {
          const reasons = [...new Set(this.order.map((n) => this.unavailable.get(n)))].join("; ");
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
    makeTransport(name, ctx) {
      switch (name) {
        case "websocket": {
          const ws = new WebSocketTransport(ctx);
          ws.onOpen(() => {
            const params = { version: VERSION };
            if (this.token !== void 0) params["token"] = this.token;
            if (this.options.name !== void 0) params["name"] = this.options.name;
            if (this.firstClient !== void 0) params["client"] = this.firstClient;
            const id = this.replies.expect(
              (r) => this.onConnected(r),
              (e) => this.dropTransport(e.code >= 3e3 ? e.code : 3500, e.message)
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
            timeout: this.options.timeout
          });
      }
    }
    onMessage(m) {
      this.lastReceived = Date.now();
      if (m.id !== void 0 && m.id !== 0) {
        this.replies.settle(m);
        return;
      }
      if (m.pub !== void 0) {
        const sub = this.subs.get(m.pub.channel);
        if (sub === void 0) return;
        if (sub.state === "subscribing" && this.transport instanceof PollTransport && sub.position?.epoch !== void 0) {
          sub.confirmed({ epoch: sub.position.epoch, offset: sub.position.offset, recovered: true }, true);
        }
        sub.receive(m.pub);
      } else if (m.conflated !== void 0) {
        this.subs.get(m.conflated.channel)?.skipTo(m.conflated.offset);
      } else if (m.presence !== void 0) {
        this.subs.get(m.presence.channel)?.presenceChanged(m.presence.join, m.presence.leave, m.presence.missed === true);
      } else if (m.subscribe?.channel !== void 0) {
        this.subs.get(m.subscribe.channel)?.confirmed(m.subscribe, true);
      } else if (m.unsubscribe?.channel !== void 0) {
        const sub = this.subs.get(m.unsubscribe.channel);
        if (sub !== void 0 && sub.state === "subscribed") {
          const code = m.unsubscribe.code ?? 0;
          if (code === 120) {
            sub.endedByServer(code, m.unsubscribe.reason ?? "unsubscribed by the server");
            return;
          }
          sub.interrupted(code, m.unsubscribe.reason ?? "ended by the server");
          if (code === 109) sub.token = void 0;
          this.subscribeChannel(sub);
        }
      } else if (m.connect !== void 0) {
        this.onConnected(m.connect);
      } else if (m.disconnect !== void 0) {
        this.dropTransport(m.disconnect.code, m.disconnect.reason);
      } else if (m.error !== void 0) {
        this.emit("error", { type: "server", code: m.error.code, message: m.error.message });
      }
    }
    onConnected(result) {
      if (this.current !== "connecting" || this.transport === void 0) return;
      clearTimeout(this.connectTimer);
      this.clientId = result.client;
      if (result.client !== "") this.firstClient ?? (this.firstClient = result.client);
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
    onTransportClose(code, reason) {
      const failed = this.transport?.name ?? this.order[this.transportIndex];
      const wasConnected = this.current === "connected";
      if (this.current === "disconnected") return;
      this.teardown(new HeraldError(code, `disconnected: ${reason}`), false);
      for (const sub of this.subs.values()) sub.interrupted(code, reason);
      const renew = code === 3504 && this.options.getToken !== void 0;
      if (renew) this.tokenStale = true;
      if (!shouldReconnect(code) && !renew) {
        for (const w of this.readyWaiters.splice(0)) w.reject(new HeraldError(code, reason));
        this.setState("disconnected");
        this.emit("disconnected", { code, reason });
        return;
      }
      this.emit("error", { type: "transport", code, message: reason, transport: failed });
      let delay;
      if (wasConnected) {
        delay = backoffDelay(this.attempt++, this.backoff());
      } else if (this.transportIndex === this.lastWorking && ++this.failuresOfWorking < this.options.retriesBeforeFallback) {
        delay = backoffDelay(this.attempt++, this.backoff());
      } else {
        this.transportIndex = (this.transportIndex + 1) % this.order.length;
        delay = this.transportIndex === 0 || this.order.length === 1 ? backoffDelay(this.attempt++, this.backoff()) : 0;
      }
      this.setState("connecting");
      this.emit("connecting", { code, reason, transport: this.order[this.transportIndex] });
      this.reconnectTimer = setTimeout(() => {
        this.reconnectTimer = void 0;
        if (this.current === "connecting" && this.transport === void 0) this.open();
      }, delay);
    }
    /** Closes the transport ourselves and handles it like any other close. The close frame
     * carries `code` when it means coming back (the server then holds this client's presence
     * for its grace, as after a drop), 1000 when not (it leaves at once). */
    dropTransport(code, reason) {
      const transport = this.transport;
      if (transport === void 0) return;
      transport.close(shouldReconnect(code) && code >= 3e3 && code < 5e3 ? code : 1e3);
      this.onTransportClose(code, reason);
    }
    teardown(error, rejectWaiters = true) {
      clearTimeout(this.connectTimer);
      this.refresher.cancel();
      clearTimeout(this.reconnectTimer);
      this.watchdog.stop();
      this.reconnectTimer = void 0;
      this.transport?.close();
      this.transport = void 0;
      this.outbox = [];
      this.replies.rejectAll(error);
      if (rejectWaiters) for (const w of this.readyWaiters.splice(0)) w.reject(error);
    }
    backoff() {
      return { minDelay: this.options.minReconnectDelay, maxDelay: this.options.maxReconnectDelay };
    }
    /** Session transports: a connection that goes silent is taken for dead (see
     * `Watchdog`). Polling's requests have their own limits. */
    startWatchdog() {
      const transport = this.transport;
      if (transport === void 0 || transport instanceof PollTransport) return;
      const probe = transport.name === "websocket";
      const { pingInterval, timeout } = this.options;
      this.lastReceived = Date.now();
      this.watchdog.start(probe ? pingInterval : transport.silenceLimit ?? pingInterval + timeout, probe, {
        alive: () => this.current === "connected" && this.transport === transport,
        lastReceived: () => this.lastReceived,
        ping: () => this.request("ping", {}),
        dead: (reason) => this.dropTransport(ClientCode.NoPong, reason)
      });
    }
    setState(state) {
      if (state === this.current) return;
      const previous = this.current;
      this.current = state;
      this.emit("state", { state, previous });
    }
    // --- commands ---
    /** Waits for the connection (up to `timeout`), then sends and awaits the reply. */
    async call(method, params) {
      await this.ready();
      return this.request(method, params);
    }
    ready() {
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
          reject: (e) => {
            clearTimeout(timer);
            reject(e);
          }
        };
        const timer = setTimeout(() => {
          this.readyWaiters = this.readyWaiters.filter((w) => w !== waiter);
          reject(new HeraldError(ClientCode.ConnectTimeout, `not connected within ${this.options.timeout} ms`));
        }, this.options.timeout);
        this.readyWaiters.push(waiter);
      });
    }
    /** Queues a command on the open connection; commands queued in one tick share a frame. */
    request(method, params) {
      return new Promise((resolve, reject) => this.command(method, params, resolve, reject));
    }
    /** Sends a command with the next batch; `resolve` or `reject` is called as its reply is
     * read, before the rest of that frame. */
    command(method, params, resolve, reject) {
      const id = this.replies.expect(resolve, reject);
      this.outbox.push({ id, method, params });
      this.scheduleFlush();
    }
    retrySubscribe(sub) {
      setTimeout(() => {
        if (sub.state === "subscribing") this.subscribeChannel(sub);
      }, backoffDelay(1, this.backoff()));
    }
    scheduleFlush() {
      if (this.flushScheduled) return;
      this.flushScheduled = true;
      const flush = () => {
        this.flushScheduled = false;
        if (this.current !== "connected" || this.transport === void 0 || this.outbox.length === 0) return;
        this.transport.send(this.outbox.splice(0));
      };
      if (this.options.batchDelay > 0) setTimeout(flush, this.options.batchDelay);
      else queueMicrotask(flush);
    }
  };
  return __toCommonJS(index_exports);
})();
