/** Herald's Phoenix front under test. */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { scratchDir } from "./herald.js";

export const SECRET = "phoenix-test-hmac-secret-0123456789";

/** The seed's chat (topic `chat`, `speak` heard as `publish`), a members-only
 * namespace, and one whose client events skip their sender (`quiet`, as `broadcast_from!`);
 * `extra` is appended (more tables). */
export function phoenixConfig(extra = ""): string {
  const file = join(scratchDir("herald-phoenix-"), "herald.toml");
  writeFileSync(
    file,
    `[auth]
hmac_secret = "${SECRET}"

[channels]
subscribe = "anyone"
history = "anyone"
publish = "anyone"

[namespaces.room]
presence = true
join_leave = true

[namespaces.members]
subscribe = "authenticated"
publish = "authenticated"

[phoenix]
broadcast_from = ["quiet"]

[phoenix.events]
speak = "publish"
${extra}`,
  );
  return file;
}

