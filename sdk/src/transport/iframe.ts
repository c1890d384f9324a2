import { ClientCode } from "../codes.js";
import type { ServerMessage } from "../protocol.js";
import { HttpSessionTransport } from "./session.js";
import type { TransportContext } from "./types.js";

let serial = 0;

/** The forever frame: a hidden iframe whose document calls back into this page with each
 * push. Same origin only (the frame calls `parent.NAME`). */
export class IframeTransport extends HttpSessionTransport {
  readonly name = "iframe" as const;
  private frame: HTMLIFrameElement;
  private callback: string;

  constructor(ctx: TransportContext) {
    super(ctx);
    if (globalThis.document === undefined) throw new Error("the forever frame needs a browser document");
    serial += 1;
    this.callback = `__herald_frame_${serial}`;
    (globalThis as unknown as Record<string, unknown>)[this.callback] = (m: ServerMessage) => this.deliver(m);
    this.frame = document.createElement("iframe");
    this.frame.style.display = "none";
    this.frame.setAttribute("aria-hidden", "true");
    // `load` fires when the document ends: the server closed it (a `disconnect` push comes
    // first when it says why) or the request failed.
    this.frame.onload = () => this.fail(ClientCode.TransportClosed, "forever frame ended");
    this.frame.src = this.streamUrl("iframe", `callback=${this.callback}`);
    document.body.appendChild(this.frame);
  }

  protected stop(): void {
    delete (globalThis as unknown as Record<string, unknown>)[this.callback];
    this.frame.onload = null;
    this.frame.src = "about:blank";
    this.frame.remove();
  }
}
