/** Headless Chromium for the browser tests: Debian's /usr/bin/chromium (or $CHROMIUM),
 * driven by playwright-core, never a downloaded browser. */
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium, type Browser } from "playwright-core";

const CHROMIUM = process.env["CHROMIUM"] ?? "/usr/bin/chromium";

/** Where tests leave screenshots (ignored by git). */
export const ARTIFACTS = join(dirname(fileURLToPath(import.meta.url)), "..", "test-artifacts");

export async function launchChromium(extraArgs: string[] = []): Promise<Browser> {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`no Chromium at ${CHROMIUM}: install Debian's (apt-get install --no-install-recommends chromium) or set CHROMIUM`);
  }
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync", ...extraArgs],
  });
}
