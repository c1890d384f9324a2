import { ClientCode } from "../codes.js";
import { decodeMessages, encodeCommands, type Command } from "../protocol.js";
import { decodeProtobufMessages, encodeProtobufCommands } from "../protobuf.js";
import type { Transport, TransportContext } from "./types.js";

export class WebSocketTransport implements Transport {
  readonly name = "websocket" as const;
  private socket: WebSocket;
  private closed = false;
  /** Whether it speaks Herald's Protobuf codec (`herald.protobuf`), not JSON. */
  private readonly protobuf: boolean;

  constructor(private readonly ctx: TransportContext) {
    const Impl = ctx.websocket ?? globalThis.WebSocket;
    if (Impl === undefined) throw new Error("WebSocket is not available here");
    const protobuf = ctx.protocol === "protobuf";
    this.socket = new Impl(ctx.baseUrl.replace(/^http/, "ws") + "/connection/websocket", protobuf ? "herald.protobuf" : "herald.json");
    this.socket.binaryType = "arraybuffer";
    this.protobuf = protobuf;
    this.socket.onmessage = (event: MessageEvent) => {
      if (this.closed) return;
      let messages;
      try {
        messages = this.protobuf ? decodeProtobufMessages(new Uint8Array(event.data as ArrayBuffer)) : decodeMessages(String(event.data));
      } catch {
        this.fail(3501, `the server sent a frame that is not ${this.protobuf ? "Protobuf" : "JSON"}`);
        return;
      }
      for (const m of messages) {
        if (this.closed) return;
        this.ctx.events.message(m);
      }
    };
    // The close event that follows says everything an error could.
    this.socket.onerror = () => undefined;
    this.socket.onclose = (event: CloseEvent) => {
      if (this.closed) return;
      this.closed = true;
      this.ctx.events.close(event.code || ClientCode.TransportClosed, event.reason || "connection closed");
    };
  }

  /** The socket's own `open` is when commands may be sent; the client sends `connect` then. */
  onOpen(callback: () => void): void {
    this.socket.onopen = () => {
      if (!this.closed) callback();
    };
  }

  send(commands: Command[]): void {
    if (this.closed || this.socket.readyState !== 1) return;
    this.socket.send(this.protobuf ? encodeProtobufCommands(commands) : encodeCommands(commands));
  }

  close(code = 1000): void {
    this.closed = true;
    try {
      this.socket.close(code);
    } catch {
      // Already closing.
    }
  }

  private fail(code: number, reason: string): void {
    this.close();
    this.ctx.events.close(code, reason);
  }
}
