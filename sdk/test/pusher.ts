/** Herald's Pusher front under test: two apps, the first allowing client events, telling
 * watchlists and counting subscriptions. */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { scratchDir } from "./herald.js";

export const APP = { id: "1001", key: "app-one-key", secret: "app-one-secret-0123456789" };
export const OTHER = { id: "1002", key: "app-two-key", secret: "app-two-secret-0123456789" };

/** A configuration with two apps; the first allows client events, tells watchlists,
 * counts subscriptions, and posts webhooks to
 * `webhookUrl` when given (vacated channels after `leaveDelay`); `more` is appended (a
 * table of Herald's own configuration). */
export function pusherConfig(webhookUrl?: string, leaveDelay = "2s", more = ""): string {
  const dir = scratchDir("herald-pusher-");
  const file = join(dir, "herald.toml");
  writeFileSync(
    file,
    `[[pusher.apps]]
id = "${APP.id}"
key = "${APP.key}"
secret = "${APP.secret}"
client_events = true
watchlist_events = true
subscription_count = true
${webhookUrl ? `webhook_url = "${webhookUrl}"
webhook_leave_delay = "${leaveDelay}"` : ""}

[[pusher.apps]]
id = "${OTHER.id}"
key = "${OTHER.key}"
secret = "${OTHER.secret}"
${more}
`,
  );
  return file;
}

