import { ClientCode } from "../codes.js";
import type { ServerMessage } from "../protocol.js";
import { HttpSessionTransport } from "./session.js";
import type { TransportContext } from "./types.js";

let serial = 0;

/** How often a forever frame asks for a keepalive, ms (the server's floor). A page is told
 * nothing when a frame's body is cut (Chromium fires no `load` and the document stays
 * `loading`), so a frame silent for a second is taken for dead. Three keepalives fit in
 * that second: one late by half a second on a loaded machine (it happened in CI with
 * two-per-second) is not taken for a cut. */
const FRAME_PING_MS = 250;

/** The forever frame: a hidden iframe whose document calls back into this page with each
 * push. Same origin only (the frame calls `parent.NAME`).
 *
 * Its document never finishes while it streams, and a page's `load` waits for the frames it
 * holds when its own document is parsed. So the frame is only added once the page has
 * loaded: `load` fires (and the page's own `onload` code runs) as it would without Herald. */
export class IframeTransport extends HttpSessionTransport {
  readonly name = "iframe" as const;
  readonly silenceLimit = 4 * FRAME_PING_MS;
  private frame: HTMLIFrameElement;
  private callback: string;
  private waitingForPage: (() => void) | undefined;

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
    if (document.readyState === "complete") {
      this.open();
    } else {
      this.waitingForPage = () => this.open();
      globalThis.addEventListener("load", this.waitingForPage, { once: true });
    }
  }

  private open(): void {
    this.waitingForPage = undefined;
    if (this.closed) return;
    // The URL is made now, so it carries the token and client id current at opening.
    this.frame.src = this.streamUrl("iframe", `callback=${this.callback}&ping=${FRAME_PING_MS}ms`);
    document.body.appendChild(this.frame);
  }

  protected stop(): void {
    if (this.waitingForPage !== undefined) globalThis.removeEventListener("load", this.waitingForPage);
    delete (globalThis as unknown as Record<string, unknown>)[this.callback];
    this.frame.onload = null;
    this.frame.src = "about:blank";
    this.frame.remove();
  }
}
