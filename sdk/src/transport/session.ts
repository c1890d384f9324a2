import { ClientCode } from "../codes.js";
import { encodeCommands, type Command, type ServerMessage } from "../protocol.js";
import { httpFailure, type Transport, type TransportContext, type TransportName } from "./types.js";

/**
 * The part every server-to-client stream shares (SSE, NDJSON streaming, forever frame):
 * the session id from the `connect` push, and commands sent with `POST /connection/send`,
 * one request at a time so that they reach the session in order. Replies come back in the
 * stream.
 */
export abstract class HttpSessionTransport implements Transport {
  abstract readonly name: TransportName;
  protected closed = false;
  private session: string | undefined;
  private sending: Promise<void> = Promise.resolve();

  constructor(protected readonly ctx: TransportContext) {}

  /** The stream's URL; it opens without channels, which follow as `subscribe` commands.
   * The token rides in the query: EventSource and iframes cannot set headers. */
  protected streamUrl(path: string, query = ""): string {
    const params = new URLSearchParams(query);
    // Keepalives at least this often, so that a silence longer than that means a dead link.
    if (!params.has("ping")) params.set("ping", `${this.ctx.pingInterval}ms`);
    const token = this.ctx.token();
    if (token !== undefined) params.set("token", token);
    const first = this.ctx.firstClient();
    if (first !== undefined) params.set("client", first);
    const q = params.toString();
    return `${this.ctx.baseUrl}/connection/${path}${q === "" ? "" : "?" + q}`;
  }

  protected deliver(message: ServerMessage): void {
    if (this.closed) return;
    if (message.connect !== undefined && message.id === undefined) this.session = message.connect.client;
    this.ctx.events.message(message);
  }

  send(commands: Command[]): void {
    if (this.closed) return;
    const body = encodeCommands(commands);
    this.sending = this.sending.then(async () => {
      if (this.closed || this.session === undefined) return;
      const url = `${this.ctx.baseUrl}/connection/send?session=${encodeURIComponent(this.session)}`;
      try {
        const response = await this.ctx.fetch(url, {
          method: "POST",
          body,
          headers: { "Content-Type": "application/x-ndjson" },
        });
        if (!response.ok) {
          const { code, reason } = await httpFailure(response);
          // 409: the session ended (server restart, stream cut): reopen and resume.
          this.fail(response.status === 409 ? ClientCode.TransportClosed : code || ClientCode.TransportClosed, reason);
        }
      } catch (error) {
        this.fail(ClientCode.TransportClosed, `sending failed: ${String(error)}`);
      }
    });
  }

  close(): void {
    this.closed = true;
    this.stop();
  }

  /** Ends the transport and reports it, once. */
  protected fail(code: number, reason: string): void {
    if (this.closed) return;
    this.close();
    this.ctx.events.close(code, reason);
  }

  protected abstract stop(): void;
}
