import { ClientCode } from "../codes.js";
import { decodeMessages, LineSplitter } from "../protocol.js";
import { HttpSessionTransport } from "./session.js";
import { httpFailure, type TransportContext } from "./types.js";

/** HTTP streaming: one long `fetch` response of newline-delimited JSON. */
export class StreamTransport extends HttpSessionTransport {
  readonly name = "stream" as const;
  private abort = new AbortController();

  constructor(ctx: TransportContext) {
    super(ctx);
    void this.read();
  }

  private async read(): Promise<void> {
    try {
      const response = await this.ctx.fetch(this.streamUrl("stream"), { signal: this.abort.signal, cache: "no-store" });
      if (!response.ok || response.body === null) {
        const { code, reason } = await httpFailure(response);
        this.fail(code || ClientCode.TransportClosed, reason);
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      const lines = new LineSplitter();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        for (const line of lines.push(decoder.decode(value, { stream: true }))) {
          for (const m of decodeMessages(line)) this.deliver(m);
        }
      }
      this.fail(ClientCode.TransportClosed, "stream ended");
    } catch (error) {
      this.fail(ClientCode.TransportClosed, `stream failed: ${String(error)}`);
    }
  }

  protected stop(): void {
    this.abort.abort();
  }
}
