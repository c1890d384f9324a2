/** Noticing a connection that died without a word: a blackholed link, a NAT or proxy that
 * forgot it, a forever frame whose body was cut. */
import { ClientCode } from "./codes.js";
import type { HeraldError } from "./options.js";

/** What the watchdog needs from its client. */
export interface Watched {
  /** Whether this connection is still the client's, and up. */
  alive(): boolean;
  /** When anything was last received on it (`Date.now()`). */
  lastReceived(): number;
  /** Sends a `ping` command; rejects with 3402 when no reply comes in time. */
  ping(): Promise<unknown>;
  /** Ends the connection as dead (the client reconnects and resumes). */
  dead(reason: string): void;
}

/**
 * One timer per connection, set for the moment its silence would pass `limit`, so a busy
 * connection costs no wake-up per message. A stream hears the keepalives it asked for, so
 * silence past its limit is enough; a WebSocket's keepalives are invisible to a page, so
 * after `limit` of quiet it asks (`probe`: a `ping` command), and no reply in time ends it.
 */
export class Watchdog {
  private timer: ReturnType<typeof setTimeout> | undefined;

  start(limit: number, probe: boolean, watched: Watched): void {
    this.stop();
    const check = (): void => {
      this.timer = undefined;
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
          (error: HeraldError) => {
            if (error.code === ClientCode.NoPong && watched.alive()) watched.dead("no reply to ping");
          },
        );
      }
    };
    this.timer = setTimeout(check, limit);
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
