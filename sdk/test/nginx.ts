/**
 * nginx started from the repository's `deploy/nginx.conf` (and `deploy/herald-locations.conf`),
 * changed only where a test machine must differ: its ports, the nodes' ports, the
 * certificate, and where it keeps its pid, logs and temporary files. The same changes as
 * `crates/herald/tests/support/nginx.rs`.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { chmodSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, connect } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { scratchDir } from "./herald.js";

/** The repository's `deploy/` directory. */
export const DEPLOY = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "deploy");

/** The public name in the deploy files; the browser resolves it to 127.0.0.1. */
export const HOST_NAME = "chat.example.com";

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

async function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

export class Nginx {
  private constructor(
    private readonly child: ChildProcess,
    private readonly dir: string,
    readonly http: number,
    readonly https: number,
  ) {}

  /** Starts it in front of the two nodes listening on `nodes`. */
  static async start(nodes: [number, number]): Promise<Nginx> {
    const dir = scratchDir("herald-nginx-");
    // Workers may run as another user (nginx run as root switches to `nobody`).
    chmodSync(dir, 0o777);
    const [http, https] = [await freePort(), await freePort()];
    const cert = join(dir, "cert.pem");
    const key = join(dir, "key.pem");
    execFileSync("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", `/CN=${HOST_NAME}`, "-addext", `subjectAltName=DNS:${HOST_NAME}`, "-keyout", key, "-out", cert], { stdio: "ignore" });
    const changes: [string, string][] = [
      ["listen 80;", `listen 127.0.0.1:${http};`],
      ["listen [::]:80;", ""],
      ["listen 443 ssl http2;", `listen 127.0.0.1:${https} ssl http2;`],
      ["listen [::]:443 ssl http2;", ""],
      ["127.0.0.1:8080", `127.0.0.1:${nodes[0]}`],
      ["127.0.0.1:8081", `127.0.0.1:${nodes[1]}`],
      [`/etc/letsencrypt/live/${HOST_NAME}/fullchain.pem`, cert],
      [`/etc/letsencrypt/live/${HOST_NAME}/privkey.pem`, key],
      ["/run/nginx.pid", `${dir}/nginx.pid`],
      ["/var/log/nginx/", `${dir}/`],
      ["/var/lib/nginx/", `${dir}/`],
    ];
    for (const file of ["nginx.conf", "herald-locations.conf"]) {
      let text = readFileSync(join(DEPLOY, file), "utf8");
      for (const [from, to] of changes) text = text.split(from).join(to);
      writeFileSync(join(dir, file), text);
    }
    const child = spawn("nginx", ["-g", "daemon off;", "-e", join(dir, "error.log"), "-p", dir, "-c", join(dir, "nginx.conf")], { stdio: "ignore" });
    const deadline = Date.now() + 10_000;
    while (!(await listening(https))) {
      if (Date.now() > deadline || child.exitCode !== null) {
        throw new Error(`nginx did not listen: ${readFileSync(join(dir, "error.log"), "utf8")}`);
      }
    }
    return new Nginx(child, dir, http, https);
  }

  async dispose(): Promise<void> {
    if (this.child.exitCode === null) {
      const exited = new Promise<void>((resolve) => this.child.once("exit", () => resolve()));
      // SIGTERM: the master stops its workers, then exits.
      this.child.kill("SIGTERM");
      await exited;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}
