import { describe, expect, it } from "vitest";
import { backoffDelay } from "../src/backoff.js";
import { ClientCode, isTemporaryError, shouldReconnect } from "../src/codes.js";
import { decodeCursor, encodeCursor } from "../src/cursor.js";
import { decodeMessages, encodeCommands, LineSplitter } from "../src/protocol.js";
import { Subscription, type SubscriptionHost } from "../src/subscription.js";

describe("backoff", () => {
  const options = { minDelay: 500, maxDelay: 20_000 };

  it("doubles its ceiling per attempt and stays between half and all of it", () => {
    for (let attempt = 0; attempt < 8; attempt++) {
      const ceiling = Math.min(20_000, 500 * 2 ** attempt);
      expect(backoffDelay(attempt, options, () => 0)).toBe(ceiling / 2);
      expect(backoffDelay(attempt, options, () => 0.999999)).toBe(Math.round(ceiling / 2 + 0.999999 * (ceiling / 2)));
    }
  });

  it("never exceeds the cap, however many attempts", () => {
    for (const attempt of [10, 50, 1000, Number.MAX_SAFE_INTEGER]) {
      expect(backoffDelay(attempt, options, () => 1)).toBe(20_000);
    }
  });

  it("spreads clients out (jitter)", () => {
    const delays = new Set(Array.from({ length: 50 }, () => backoffDelay(4, options)));
    expect(delays.size).toBeGreaterThan(10);
  });
});

describe("codes", () => {
  it("reconnects in the 3000-3499 and 4000-4499 ranges and not in the x500-x999 ones", () => {
    for (const code of [3000, 3001, 3003, 3007, 3499, 4000, 4499]) expect(shouldReconnect(code), String(code)).toBe(true);
    for (const code of [3500, 3501, 3503, 3505, 3999, 4500, 4999]) expect(shouldReconnect(code), String(code)).toBe(false);
  });

  it("follows RFC 6455 for WebSocket's own codes", () => {
    for (const code of [1000, 1001, 1006, 1011, 1012, 1013, 1014]) expect(shouldReconnect(code), String(code)).toBe(true);
    for (const code of [1002, 1003, 1007, 1008, 1009, 1010]) expect(shouldReconnect(code), String(code)).toBe(false);
  });

  it("the client's own codes reconnect", () => {
    for (const code of [ClientCode.TransportClosed, ClientCode.ConnectTimeout, ClientCode.NoPong, ClientCode.OutOfOrder]) {
      expect(shouldReconnect(code)).toBe(true);
    }
  });

  it("knows which command errors are worth retrying", () => {
    expect([100, 106, 111, 117, 118, 121, 122].every(isTemporaryError)).toBe(true);
    expect([101, 103, 107, 113, 114].some(isTemporaryError)).toBe(false);
  });
});

describe("cursor", () => {
  it("round-trips, keeping 'any epoch' as *", () => {
    const text = "chat:lobby;k3x9ab2c0d1e;42|news;*;7";
    const map = decodeCursor(text);
    expect(map.get("chat:lobby")).toEqual({ offset: 42, epoch: "k3x9ab2c0d1e" });
    expect(map.get("news")).toEqual({ offset: 7 });
    expect(encodeCursor(map)).toBe(text);
    expect(decodeCursor("").size).toBe(0);
  });

  it("refuses malformed entries with a message naming them", () => {
    for (const bad of ["a;b", "a;b;c", ";e;1", "a;;1", "a;e;-1", "a;e;1;2"]) {
      expect(() => decodeCursor(bad), bad).toThrow(/not CHANNEL;EPOCH;OFFSET/);
    }
  });
});

describe("codec", () => {
  it("encodes commands one per line, with and without ids", () => {
    const frame = encodeCommands([
      { id: 1, method: "subscribe", params: { channel: "a", since: { offset: 3, epoch: "e" } } },
      { method: "ping", params: {} },
    ]);
    expect(frame.split("\n").map((l) => JSON.parse(l))).toEqual([
      { id: 1, subscribe: { channel: "a", since: { offset: 3, epoch: "e" } } },
      { ping: {} },
    ]);
  });

  it("decodes every line of a batched frame and skips blank ones", () => {
    const messages = decodeMessages('{"id":1,"publish":{"offset":1,"epoch":"e"}}\n\n{"pub":{"channel":"a","offset":2,"data":"x\\ny"}}\n');
    expect(messages).toHaveLength(2);
    expect(messages[1]?.pub?.data).toBe("x\ny");
  });

  it("refuses lines that are not JSON objects", () => {
    expect(() => decodeMessages("[1,2]")).toThrow(/not a JSON object/);
    expect(() => decodeMessages("{broken")).toThrow();
  });

  it("splits a stream into lines whatever the chunk boundaries", () => {
    const text = '{"a":1}\n{"b":"two"}\n{"c":3}\n';
    for (let size = 1; size <= text.length; size++) {
      const splitter = new LineSplitter();
      const lines: string[] = [];
      for (let i = 0; i < text.length; i += size) lines.push(...splitter.push(text.slice(i, i + size)));
      expect(lines, `chunks of ${size}`).toEqual(['{"a":1}', '{"b":"two"}', '{"c":3}']);
    }
  });
});

describe("subscription state machine", () => {
  function host() {
    const calls: string[] = [];
    const h: SubscriptionHost = {
      subscribeChannel: (s) => calls.push(`subscribe ${s.channel}`),
      unsubscribeChannel: (s) => calls.push(`unsubscribe ${s.channel}`),
      publish: () => Promise.reject(new Error("unused")),
      history: () => Promise.reject(new Error("unused")),
      presence: () => Promise.reject(new Error("unused")),
      presenceStats: () => Promise.reject(new Error("unused")),
      resync: (reason) => calls.push(`resync ${reason}`),
    };
    return { h, calls };
  }

  function record(sub: Subscription) {
    const seen: string[] = [];
    sub.on("state", (e) => seen.push(`${e.previous}->${e.state}`));
    sub.on("publication", (p) => seen.push(`pub ${p.offset}`));
    sub.on("subscribed", (c) => seen.push(`subscribed resumed=${c.resumed} recovered=${c.recovered}`));
    return seen;
  }

  it("goes unsubscribed -> subscribing -> subscribed and back, asking its host", () => {
    const { h, calls } = host();
    const sub = new Subscription("a", h);
    const seen = record(sub);
    sub.subscribe();
    sub.confirmed({ epoch: "e", offset: 5 }, false);
    sub.interrupted(3001, "shutdown");
    sub.unsubscribe();
    expect(calls).toEqual(["subscribe a", "unsubscribe a"]);
    expect(seen).toEqual([
      "unsubscribed->subscribing",
      "subscribing->subscribed",
      "subscribed resumed=false recovered=undefined",
      "subscribed->subscribing",
      "subscribing->unsubscribed",
    ]);
    expect(sub.position).toEqual({ epoch: "e", offset: 5 });
  });

  it("delivers each offset once, in order, and drops repeats", () => {
    const sub = new Subscription("a", host().h);
    const seen = record(sub);
    sub.subscribe();
    sub.confirmed({ epoch: "e", offset: 2 }, false);
    for (const offset of [3, 3, 2, 4, 4]) sub.deliver(offset, null);
    expect(seen.filter((s) => s.startsWith("pub"))).toEqual(["pub 3", "pub 4"]);
  });

  it("resumes from its position: a reply's publications first, then live ones after them", () => {
    const sub = new Subscription("a", host().h, { since: { epoch: "e", offset: 2 } });
    const seen = record(sub);
    sub.subscribe();
    sub.confirmed({ epoch: "e", offset: 4, recovered: true, publications: [{ offset: 3, data: 1 }, { offset: 4, data: 2 }] }, false);
    sub.deliver(4, 2);
    sub.deliver(5, 3);
    expect(seen.slice(2)).toEqual(["subscribed resumed=true recovered=true", "pub 3", "pub 4", "pub 5"]);
  });

  it("with publications following as pushes, keeps its position until they arrive", () => {
    const sub = new Subscription("a", host().h, { since: { epoch: "e", offset: 2 } });
    const seen = record(sub);
    sub.subscribe();
    sub.confirmed({ epoch: "e", offset: 4, recovered: true }, true);
    sub.deliver(3, 1);
    sub.deliver(4, 2);
    expect(seen.filter((s) => s.startsWith("pub"))).toEqual(["pub 3", "pub 4"]);
  });

  it("reports a gap history could not cover, and takes the current position", () => {
    const sub = new Subscription("a", host().h, { since: { epoch: "old", offset: 9 } });
    const seen = record(sub);
    sub.subscribe();
    sub.confirmed({ epoch: "new", offset: 3, recovered: false }, false);
    expect(seen).toContain("subscribed resumed=true recovered=false");
    expect(sub.position).toEqual({ epoch: "new", offset: 3 });
    sub.deliver(4, null);
    expect(seen.at(-1)).toBe("pub 4");
  });

  it("asks for a resync instead of skipping when an offset is missing", () => {
    const { h, calls } = host();
    const sub = new Subscription("a", h);
    const seen = record(sub);
    sub.subscribe();
    sub.confirmed({ epoch: "e", offset: 2 }, false);
    sub.deliver(5, null);
    expect(seen.filter((s) => s.startsWith("pub"))).toEqual([]);
    expect(calls.at(-1)).toMatch(/^resync a: offset 5 after 2/);
    expect(sub.position?.offset).toBe(2);
  });

  it("ignores publications while not subscribed", () => {
    const sub = new Subscription("a", host().h);
    const seen = record(sub);
    sub.deliver(1, null);
    sub.subscribe();
    sub.deliver(1, null);
    expect(seen.filter((s) => s.startsWith("pub"))).toEqual([]);
  });
});
