/**
 * An existing Pusher app moved to Herald, in headless Chromium: the page loads `pusher-js`
 * (its web build, with encryption) and Laravel Echo from npm unchanged, its backend (a real
 * Node HTTP server) answers Laravel's `/broadcasting/auth` with the `pusher` server SDK's
 * signatures and publishes with the same SDK; only the host and port point at Herald.
 */
import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { createRequire } from "node:module";
import PusherServer from "pusher";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Herald } from "../test/herald.js";
import { APP, pusherConfig } from "../test/pusher.js";
import { launchChromium } from "./browser.js";

const require = createRequire(import.meta.url);
const PUSHER_JS = readFileSync(require.resolve("pusher-js/dist/web/pusher-with-encryption.min.js"));
const ECHO_JS = readFileSync(require.resolve("laravel-echo/iife"));
/** The app's end-to-end encryption key (Pusher's `encryptionMasterKeyBase64`): Herald never
 * sees it. */
const MASTER_KEY = Buffer.alloc(32, 7).toString("base64");

let browser: Browser;
let herald: Herald;
let app: Server;
let appOrigin: string;

function backend(): PusherServer {
  return new PusherServer({
    appId: APP.id,
    key: APP.key,
    secret: APP.secret,
    host: "127.0.0.1",
    port: String(herald.port),
    useTLS: false,
    encryptionMasterKeyBase64: MASTER_KEY,
  });
}

/** Who each user of the app follows (a user authentication's `watchlist`). */
const FRIENDS: Record<string, string[]> = { ann: ["bob", "cat"], bob: ["ann"] };

/** The application: its page, the two scripts, and Laravel's auth endpoints, where the
 * signed-in user is the `user` cookie and `private-user.{id}` is only that user's:
 * `/broadcasting/auth` signs channels, `/broadcasting/user-auth` the user (with its
 * watchlist). */
function application(): Server {
  return createServer((req, res) => {
    if (req.url === "/pusher.js" || req.url === "/echo.js") {
      res.setHeader("content-type", "text/javascript");
      res.end(req.url === "/pusher.js" ? PUSHER_JS : ECHO_JS);
      return;
    }
    if (req.url === "/broadcasting/user-auth" && req.method === "POST") {
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => {
        const socketId = new URLSearchParams(body).get("socket_id")!;
        const user = /(?:^|; )user=([^;]+)/.exec(req.headers.cookie ?? "")?.[1];
        if (!user) {
          res.statusCode = 403;
          res.end("forbidden");
          return;
        }
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify(backend().authenticateUser(socketId, { id: user, watchlist: FRIENDS[user] ?? [] })));
      });
      return;
    }
    if (req.url === "/broadcasting/auth" && req.method === "POST") {
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => {
        const form = new URLSearchParams(body);
        const socketId = form.get("socket_id")!;
        const channel = form.get("channel_name")!;
        const user = /(?:^|; )user=([^;]+)/.exec(req.headers.cookie ?? "")?.[1];
        const mine = channel === `private-user.${user}` || !channel.startsWith("private-user.");
        if (!user || !mine) {
          res.statusCode = 403;
          res.end("forbidden");
          return;
        }
        const auth = channel.startsWith("presence-")
          ? backend().authorizeChannel(socketId, channel, { user_id: user, user_info: { name: user.toUpperCase() } })
          : backend().authorizeChannel(socketId, channel);
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify(auth));
      });
      return;
    }
    res.setHeader("content-type", "text/html");
    res.end(`<!doctype html><title>app</title><script src="/pusher.js"></script><script src="/echo.js"></script>`);
  });
}

beforeAll(async () => {
  browser = await launchChromium();
  app = application();
  await new Promise<void>((resolve) => app.listen(0, "127.0.0.1", resolve));
  appOrigin = `http://127.0.0.1:${(app.address() as AddressInfo).port}`;
  herald = await Herald.start({ args: ["--config", pusherConfig(), "--allowed-origin", appOrigin] });
});

afterAll(async () => {
  await browser?.close();
  await herald?.dispose();
  await new Promise((resolve) => app?.close(resolve));
});

/** A page of the app signed in as `user`, with `window.Echo` set up as Laravel's
 * `resources/js/echo.js` does, pointed at Herald. */
async function signedIn(user: string): Promise<{ context: BrowserContext; page: Page }> {
  const context = await browser.newContext();
  await context.addCookies([{ name: "user", value: user, url: appOrigin }]);
  const page = await context.newPage();
  await page.goto(`${appOrigin}/`);
  await page.evaluate(
    ({ key, port }) => {
      const w = window as unknown as Record<string, any>;
      w.got = [];
      w.Echo = new w.Echo.default({
        broadcaster: "pusher",
        key,
        cluster: "mt1",
        wsHost: "127.0.0.1",
        wsPort: port,
        forceTLS: false,
        enabledTransports: ["ws"],
        authEndpoint: "/broadcasting/auth",
        userAuthentication: { endpoint: "/broadcasting/user-auth", transport: "ajax" },
        Pusher: w.Pusher,
      });
    },
    { key: APP.key, port: herald.port },
  );
  return { context, page };
}

/** What the page collected in `window.got`. */
async function got(page: Page): Promise<any[]> {
  return page.evaluate(() => (window as any).got);
}

/** Polls the page until `test` holds on what it collected. */
async function collected(page: Page, what: string, test: (got: any[]) => boolean): Promise<any[]> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const now = await got(page);
    if (test(now)) return now;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; page got ${JSON.stringify(now)}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Waits until Echo's channel `name` is subscribed on the page. */
async function subscribedTo(page: Page, name: string): Promise<void> {
  await page.waitForFunction((n) => (window as any).Echo.connector.pusher.channel(n)?.subscribed === true, name, { timeout: 20_000 });
}

describe("Laravel Echo over pusher-js", () => {
  it("listens on a public channel to events the pusher SDK triggers, as Laravel names them", async () => {
    const { context, page } = await signedIn("ann");
    await page.evaluate(() => {
      const w = window as any;
      w.Echo.channel("orders").listen("OrderShipped", (e: unknown) => w.got.push(e));
    });
    await subscribedTo(page, "orders");
    await backend().trigger("orders", "App\\Events\\OrderShipped", { order: { id: 7 } });
    expect(await collected(page, "the event", (g) => g.length === 1)).toEqual([{ order: { id: 7 } }]);
    await context.close();
  });

  it("subscribes to the user's private channel through /broadcasting/auth, and is refused another's", async () => {
    const { context, page } = await signedIn("ann");
    await page.evaluate(() => {
      const w = window as any;
      w.Echo.private("user.ann").listen(".balance", (e: unknown) => w.got.push(e));
      w.Echo.private("user.bob").error((e: { status: number }) => w.got.push({ refused: e.status }));
    });
    await subscribedTo(page, "private-user.ann");
    await backend().trigger("private-user.ann", "balance", { cents: 120 });
    await backend().trigger("private-user.bob", "balance", { cents: 999 });
    const seen = await collected(page, "the event and the refusal", (g) => g.length === 2);
    expect(seen).toContainEqual({ cents: 120 });
    expect(seen).toContainEqual({ refused: 403 });
    await context.close();
  });

  it("joins a presence channel: here, joining, leaving, and whispers between members", async () => {
    const ann = await signedIn("ann");
    await ann.page.evaluate(() => {
      const w = window as any;
      w.Echo.join("room.1")
        .here((users: Array<{ name: string }>) => w.got.push({ here: users.map((u) => u.name).sort() }))
        .joining((u: { name: string }) => w.got.push({ joining: u.name }))
        .leaving((u: { name: string }) => w.got.push({ leaving: u.name }))
        .listenForWhisper("typing", (e: unknown) => w.got.push({ whisper: e }));
    });
    await collected(ann.page, "here", (g) => g.some((e) => e.here));

    const bob = await signedIn("bob");
    await bob.page.evaluate(() => {
      const w = window as any;
      w.room = w.Echo.join("room.1").here((users: Array<{ name: string }>) => w.got.push({ here: users.map((u) => u.name).sort() }));
    });
    expect(await collected(bob.page, "bob's here", (g) => g.length === 1)).toEqual([{ here: ["ANN", "BOB"] }]);
    await collected(ann.page, "bob joining", (g) => g.some((e) => e.joining === "BOB"));
    await bob.page.evaluate(() => (window as any).room.whisper("typing", { who: "bob" }));
    await collected(ann.page, "the whisper", (g) => g.some((e) => e.whisper?.who === "bob"));
    // Bob closes his tab: the browser closes the socket saying so, and he leaves at once
    // (issue #59: it took the 5 s grace kept for dropped connections).
    const closedAt = Date.now();
    await bob.context.close();
    const seen = await collected(ann.page, "bob leaving", (g) => g.some((e) => e.leaving === "BOB"));
    expect(Date.now() - closedAt).toBeLessThan(2500);
    expect(seen.filter((e) => e.joining || e.leaving)).toEqual([{ joining: "BOB" }, { leaving: "BOB" }]);
    await ann.context.close();
  });
});

describe("a signed-in user (pusher.signin() under Echo)", () => {
  it("hears what the backend sends to the user, and when the users it watches come online and go offline", async () => {
    const ann = await signedIn("ann");
    await ann.page.evaluate(() => {
      const w = window as any;
      const pusher = w.Echo.connector.pusher;
      pusher.user.bind("notice", (e: unknown) => w.got.push({ notice: e }));
      for (const status of ["online", "offline"]) {
        pusher.user.watchlist.bind(status, (e: { name: string; user_ids: string[] }) => w.got.push({ [e.name]: [...e.user_ids].sort() }));
      }
      pusher.signin();
    });
    expect(await collected(ann.page, "who is online", (g) => g.length === 1)).toEqual([{ offline: ["bob", "cat"] }]);
    await ann.page.waitForFunction(() => (window as any).Echo.connector.pusher.user.serverToUserChannel?.subscribed === true, null, { timeout: 20_000 });
    await backend().sendToUser("ann", "notice", { unread: 3 });
    await collected(ann.page, "the backend's notice", (g) => g.some((e) => e.notice));

    const bob = await signedIn("bob");
    await bob.page.evaluate(() => (window as any).Echo.connector.pusher.signin());
    await collected(ann.page, "bob online", (g) => g.some((e) => e.online));
    await bob.context.close();
    const seen = await collected(ann.page, "bob offline", (g) => g.some((e) => e.offline?.includes("bob") && e.offline.length === 1));
    expect(seen).toEqual([{ offline: ["bob", "cat"] }, { notice: { unread: 3 } }, { online: ["bob"] }, { offline: ["bob"] }]);
    await ann.context.close();
  });
});

describe("pusher-js in the browser", () => {
  it("decrypts an encrypted channel's events; Herald stores and relays only ciphertext", async () => {
    const { context, page } = await signedIn("ann");
    await page.evaluate(() => {
      const w = window as any;
      w.Echo.connector.pusher.subscribe("private-encrypted-vault").bind("secret", (e: unknown) => w.got.push(e));
    });
    await subscribedTo(page, "private-encrypted-vault");
    await backend().trigger("private-encrypted-vault", "secret", { pin: "4321" });
    expect(await collected(page, "the decrypted event", (g) => g.length === 1)).toEqual([{ pin: "4321" }]);
    const history = await fetch(`${herald.url}/api/history?channel=${APP.id}:private-encrypted-vault`, {
      headers: { Authorization: "apikey sdk-test-api-key-01" },
    });
    const stored = await history.text();
    expect(stored).toContain("ciphertext");
    expect(stored).not.toContain("4321");
    await context.close();
  });

  it("reconnects after the server restarts, subscribes again and receives what follows", async () => {
    const { context, page } = await signedIn("ann");
    await page.evaluate(() => {
      const w = window as any;
      const pusher = w.Echo.connector.pusher;
      pusher.connection.bind("state_change", (s: { current: string }) => w.got.push({ state: s.current }));
      pusher.subscribe("private-feed").bind("item", (e: unknown) => w.got.push(e));
    });
    await subscribedTo(page, "private-feed");
    const address = new URL(herald.url).host;
    await herald.stop("SIGTERM");
    herald = await Herald.start({ listen: address, dataDir: herald.dataDir, args: ["--config", pusherConfig(), "--allowed-origin", appOrigin] });
    await collected(page, "a reconnection", (g) => {
      const states = g.filter((e) => e.state).map((e) => e.state);
      return states.includes("connecting") && states.at(-1) === "connected";
    });
    await subscribedTo(page, "private-feed");
    await backend().trigger("private-feed", "item", { n: 2 });
    const seen = await collected(page, "the event after the restart", (g) => g.some((e) => e.n === 2));
    expect(seen.filter((e) => e.n)).toEqual([{ n: 2 }]);
    await context.close();
  });
});
