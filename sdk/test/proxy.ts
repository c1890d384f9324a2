/**
 * Things between the client and the server that tests control: a TCP relay that can go
 * silent or hold bytes back, and an HTTP proxy that does not speak WebSocket and buffers
 * streamed responses (the kind that breaks real-time).
 */
import { createServer as createHttpServer, request, type Server as HttpServer } from "node:http";
import { createServer, connect, type Server, type Socket } from "node:net";

/** A TCP relay. It can go silent (a dead connection whose socket never says so), or hold
 * back what the server sends and then hand it over in one piece, as one read (what a busy
 * network or a client that was not scheduled for a while gets). */
export class Relay {
  private sockets = new Set<Socket>();
  private silenced = new Set<Socket>();
  /** While holding: what each connection's server side sent, not passed on yet. */
  private heldBack: Map<Socket, Buffer[]> | undefined;
  private constructor(
    private server: Server,
    readonly url: string,
  ) {}

  static async start(target: string): Promise<Relay> {
    const { hostname, port } = new URL(target);
    let relay: Relay | undefined;
    const server = createServer((inbound) => {
      const outbound = connect(Number(port), hostname);
      relay!.sockets.add(inbound).add(outbound);
      inbound.pipe(outbound);
      outbound.on("data", (chunk: Buffer) => {
        const held = relay!.heldBack;
        if (held === undefined) inbound.write(chunk);
        else held.set(inbound, [...(held.get(inbound) ?? []), chunk]);
      });
      const end = () => {
        inbound.destroy();
        outbound.destroy();
      };
      inbound.on("error", end).on("close", end);
      outbound.on("error", end).on("close", end);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const address = server.address() as { port: number };
    relay = new Relay(server, `http://127.0.0.1:${address.port}`);
    return relay;
  }

  /** Every open connection stops carrying bytes, in both directions, without closing. */
  silence(): void {
    for (const s of this.sockets) {
      s.unpipe();
      s.pause();
      s.removeAllListeners("data");
      this.silenced.add(s);
    }
    this.sockets.clear();
  }

  /** The connections silenced so far are dropped, as a NAT that forgot them would: the
   * browser's next use of one is answered with a reset. */
  forgetSilenced(): void {
    for (const s of this.silenced) s.resetAndDestroy();
    this.silenced.clear();
  }

  /** Every open connection is reset (TCP RST both ways), as when a server or a middlebox
   * drops them. New connections are relayed as before. */
  reset(): void {
    for (const s of this.sockets) s.resetAndDestroy();
    this.sockets.clear();
    // What was held back went with its connection.
    this.heldBack = undefined;
  }

  /** From now on, what the server sends is kept here until [`release`]. */
  hold(): void {
    this.heldBack ??= new Map();
  }

  /** Everything held so far, as text. */
  held(): string {
    return [...(this.heldBack?.values() ?? [])].map((chunks) => Buffer.concat(chunks).toString()).join("");
  }

  /** Passes on what was held, each connection's in one write, and stops holding. */
  release(): void {
    for (const [socket, chunks] of this.heldBack ?? []) socket.write(Buffer.concat(chunks));
    this.heldBack = undefined;
  }

  get connections(): number {
    return this.sockets.size / 2;
  }

  close(): void {
    this.forgetSilenced();
    for (const s of this.sockets) s.destroy();
    this.server.close();
  }
}

/** An HTTP/1.1 proxy that refuses WebSocket upgrades and holds streamed answers back until
 * they end, as some corporate proxies and misconfigured reverse proxies do. */
export class BufferingProxy {
  private constructor(
    private server: HttpServer,
    readonly url: string,
  ) {}

  static async start(target: string): Promise<BufferingProxy> {
    const { hostname, port } = new URL(target);
    const server = createHttpServer((req, res) => {
      const upstream = request(
        { hostname, port, path: req.url, method: req.method, headers: req.headers },
        (answer) => {
          const chunks: Buffer[] = [];
          answer.on("data", (c: Buffer) => chunks.push(c));
          answer.on("end", () => {
            res.writeHead(answer.statusCode ?? 502, answer.headers);
            res.end(Buffer.concat(chunks));
          });
        },
      );
      upstream.on("error", () => {
        res.writeHead(502);
        res.end();
      });
      req.pipe(upstream);
      res.on("close", () => upstream.destroy());
    });
    server.on("upgrade", (_req, socket) => {
      socket.end("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const address = server.address() as { port: number };
    return new BufferingProxy(server, `http://127.0.0.1:${address.port}`);
  }

  close(): void {
    this.server.closeAllConnections();
    this.server.close();
  }
}
