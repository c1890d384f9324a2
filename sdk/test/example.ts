/** Herald configured as docs/hooks.md's "Try it", answered by its example backend
 * (docs/examples/hooks-backend.mjs, a real Node HTTP server on a free port). */
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
// @ts-expect-error: a plain JavaScript example, checked by running it here.
import { server as exampleBackend } from "../../docs/examples/hooks-backend.mjs";
import { Herald } from "./herald.js";

export interface TryIt {
  server: Herald;
  backend: Server;
  dispose(): Promise<void>;
}

/** `env`: more of Herald's environment, beside the example's. */
export async function startTryIt(env: Record<string, string> = {}): Promise<TryIt> {
  const backend = (exampleBackend as () => Server)();
  await new Promise<void>((resolve) => backend.listen(0, "127.0.0.1", resolve));
  const base = `http://127.0.0.1:${(backend.address() as AddressInfo).port}`;
  // The configuration docs/hooks.md gives, as environment variables.
  const server = await Herald.start({
    env: {
      HERALD_HOOKS__CONNECT_URL: `${base}/connect`,
      HERALD_HOOKS__SUBSCRIBE_URL: `${base}/subscribe`,
      HERALD_HOOKS__PUBLISH_URL: `${base}/publish`,
      HERALD_HOOKS__RPC_URL: `${base}/rpc`,
      HERALD_HOOKS__EVENTS_URL: `${base}/events`,
      HERALD_HOOKS__COOKIES: '["session"]',
      HERALD_NAMESPACES__ROOM__SUBSCRIBE_HOOK: "true",
      HERALD_NAMESPACES__ROOM__PUBLISH_HOOK: "true",
      HERALD_NAMESPACES__ROOM__PUBLISH: "anyone",
      ...env,
    },
  });
  return {
    server,
    backend,
    async dispose() {
      await server.dispose();
      backend.close();
    },
  };
}
