import { ClientCode } from "../codes.js";
import { decodeMessages } from "../protocol.js";
import { HttpSessionTransport } from "./session.js";
import type { EventSourceConstructor, TransportContext } from "./types.js";

/** Server-Sent Events through the browser's `EventSource`. The browser's own reconnect is
 * switched off: the client reconnects itself, with backoff and its own positions. */
export class SseTransport extends HttpSessionTransport {
  readonly name = "sse" as const;
  private source: EventSource;

  constructor(ctx: TransportContext, eventSource: EventSourceConstructor | undefined = globalThis.EventSource) {
    super(ctx);
    if (eventSource === undefined) {
      throw new Error(
        "EventSource is not available here: in Node, install the `eventsource` package and pass its EventSource as the `eventSource` option, or use another transport",
      );
    }
    this.source = new eventSource(this.streamUrl("sse"));
    this.source.onmessage = (event: MessageEvent) => {
      try {
        for (const m of decodeMessages(String(event.data))) this.deliver(m);
      } catch {
        this.fail(3501, "the server sent an event that is not JSON");
      }
    };
    this.source.onerror = () => this.fail(ClientCode.TransportClosed, "event stream closed");
  }

  protected stop(): void {
    this.source.close();
  }
}
