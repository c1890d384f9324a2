/** Runs a real `herald serve` for tests: random port on 127.0.0.1, its own data directory. */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { inject } from "vitest";

export const API_KEY = "sdk-test-api-key-01";

/** The herald binary, built once by `test/global-setup.ts` (or `HERALD_BIN`). */
export function heraldBinary(): string {
  return inject("heraldBinary");
}

/** A new directory under the run's scratch directory, which is removed when the run ends. */
export function scratchDir(prefix: string): string {
  return mkdtempSync(join(inject("scratch"), prefix));
}

/** A connection token for `user` with public `info`, signed by `herald token` with the
 * HMAC secret `secret` (the one the server under test was started with). */
export function signedToken(secret: string, user: string, info: unknown): string {
  return execFileSync(heraldBinary(), ["token", "--user", user, "--info", JSON.stringify(info)], {
    env: { PATH: process.env["PATH"] ?? "", HERALD_AUTH__HMAC_SECRET: secret },
  })
    .toString()
    .trim();
}

export class Herald {
  private constructor(
    private child: ChildProcess,
    readonly url: string,
    readonly dataDir: string,
    private readonly ownsData: boolean,
  ) {}

  /** Starts a server. `listen` defaults to a random port; `dataDir` to a fresh directory. */
  static async start(
    options: { listen?: string; dataDir?: string; args?: string[]; env?: Record<string, string> } = {},
  ): Promise<Herald> {
    const dataDir = options.dataDir ?? scratchDir("herald-sdk-");
    const child = spawn(
      heraldBinary(),
      ["serve", "--listen", options.listen ?? "127.0.0.1:0", "--api-key", API_KEY, "--log-format", "json", "--data-dir", dataDir, ...(options.args ?? [])],
      {
        stdio: ["ignore", "ignore", "pipe"],
        env: { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("HERALD_"))), ...options.env },
      },
    );
    const address = await new Promise<string>((resolve, reject) => {
      const lines = createInterface({ input: child.stderr! });
      const seen: string[] = [];
      lines.on("line", (line) => {
        seen.push(line);
        try {
          const v = JSON.parse(line) as { fields?: { message?: string; address?: string } };
          if (v.fields?.message === "herald is listening" && v.fields.address) resolve(v.fields.address);
        } catch {
          // Not JSON: ignore.
        }
      });
      child.on("exit", (code) => reject(new Error(`herald exited with ${code}:\n${seen.join("\n")}`)));
    });
    return new Herald(child, `http://${address}`, dataDir, options.dataDir === undefined);
  }

  get port(): number {
    return Number(new URL(this.url).port);
  }

  /** Stops the process (SIGTERM: a graceful shutdown that tells clients to reconnect). */
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => this.child.once("exit", () => resolve()));
    this.child.kill(signal);
    await exited;
  }

  /** Stops and deletes the data directory it made. */
  async dispose(): Promise<void> {
    await this.stop("SIGKILL");
    if (this.ownsData) rmSync(this.dataDir, { recursive: true, force: true });
  }

  async publish(channel: string, data: unknown): Promise<{ offset: number; epoch: string }> {
    const response = await fetch(`${this.url}/api/publish`, {
      method: "POST",
      headers: { Authorization: `apikey ${API_KEY}`, "Content-Type": "application/json" },
      body: JSON.stringify({ channel, data }),
    });
    if (!response.ok) throw new Error(`publish: HTTP ${response.status} ${await response.text()}`);
    return (await response.json()) as { offset: number; epoch: string };
  }

  /** POSTs `body` to an API route and returns the answer. */
  async api(path: string, body: unknown): Promise<unknown> {
    const response = await fetch(`${this.url}${path}`, {
      method: "POST",
      headers: { Authorization: `apikey ${API_KEY}`, "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status} ${await response.text()}`);
    return response.json();
  }
}

/** Resolves when `condition` holds, checking on every event loop turn up to `ms`. */
export async function until(what: string, condition: () => boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A real `redis-server` on a free loopback port, for nodes that share channels. */
export class Redis {
  private constructor(
    private child: ChildProcess,
    readonly url: string,
    private dir: string,
  ) {}

  static async start(): Promise<Redis> {
    const port = await freePort();
    const dir = scratchDir("herald-redis-");
    const child = spawn("redis-server", ["--bind", "127.0.0.1", "--port", String(port), "--save", "", "--appendonly", "no", "--dir", dir], {
      stdio: ["ignore", "pipe", "ignore"],
    });
    await new Promise<void>((resolve, reject) => {
      const lines = createInterface({ input: child.stdout! });
      lines.on("line", (line) => {
        if (line.includes("Ready to accept connections")) resolve();
      });
      child.on("error", (e) => reject(new Error(`redis-server must be installed: ${e.message}`)));
      child.on("exit", (code) => reject(new Error(`redis-server exited with ${code}`)));
    });
    return new Redis(child, `redis://127.0.0.1:${port}`, dir);
  }

  async dispose(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = new Promise<void>((resolve) => this.child.once("exit", () => resolve()));
      this.child.kill("SIGKILL");
      await exited;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

async function freePort(): Promise<number> {
  const { createServer } = await import("node:net");
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}
