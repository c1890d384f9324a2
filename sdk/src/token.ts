/** Keeping a connection token fresh: a new one from `getToken` before the current one
 * expires, handed to the connection. */
import { backoffDelay } from "./backoff.js";
import { HeraldError } from "./options.js";
import type { RefreshResult } from "./protocol.js";

/** What the refresher needs from its client. */
export interface RefreshHost {
  /** Whether the connection is up (a refresh is for a live connection). */
  connected(): boolean;
  /** Takes `token` for the next requests; true when that is all it takes (polling: each
   * request carries the token), false when the connection must be told (`refresh`). */
  adopt(token: string): boolean;
  /** Sends the `refresh` command. */
  refresh(token: string): Promise<RefreshResult>;
  /** Stops the client for good. */
  stop(code: number, reason: string): void;
  /** Reports that `getToken` failed (it is tried again). */
  failed(error: unknown): void;
}

export class TokenRefresher {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private running: Promise<void> | undefined;

  constructor(
    private readonly getToken: (() => Promise<string | null | undefined>) | undefined,
    private readonly host: RefreshHost,
  ) {}

  /** Refreshes the token when 80% of its `ttlSeconds` have passed (at least a second before
   * the end, so the `refresh` command arrives in time). */
  schedule(ttlSeconds: number | undefined): void {
    this.cancel();
    if (ttlSeconds === undefined || this.getToken === undefined) return;
    const ms = Math.max(0, Math.min(ttlSeconds * 800, ttlSeconds * 1000 - 1000));
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.refresh();
    }, ms);
  }

  cancel(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** One refresh at a time: a second caller shares the one in flight. */
  private refresh(): Promise<void> {
    this.running ??= this.run().finally(() => (this.running = undefined));
    return this.running;
  }

  private async run(): Promise<void> {
    const getToken = this.getToken;
    if (getToken === undefined) return;
    const host = this.host;
    // Jittered backoff between tries, never past the token's end: the server then closes
    // with 3504 and the client reconnects with whatever token it gets next.
    const retry = (attempt: number) => new Promise((r) => setTimeout(r, backoffDelay(attempt, { minDelay: 250, maxDelay: 5_000 })));
    for (let attempt = 0; host.connected(); attempt++) {
      let token: string | null | undefined;
      try {
        token = await getToken();
      } catch (error) {
        host.failed(error);
        await retry(attempt);
        continue;
      }
      if (!host.connected()) return;
      if (token === null || token === undefined || token === "") {
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
          // The backend gave an expired token: ask again, not in a tight loop.
          await retry(attempt);
          continue;
        }
        // Otherwise the connection dropped; reconnecting uses the new token.
      }
      return;
    }
  }
}

/** Seconds until a JWT's `exp`, read without checking it (only to schedule a refresh;
 * the server is the one that checks). */
export function tokenTtl(token: string | undefined): number | undefined {
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
