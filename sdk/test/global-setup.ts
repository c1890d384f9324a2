/**
 * Builds the herald binary once, before any test file runs, so no file's `beforeAll` pays
 * for a compile under its hook timeout.
 *
 * It builds the way the README's test command already did (`cargo test --workspace`), so in
 * CI this finds everything fresh and takes a fraction of a second. A plain
 * `cargo build -p herald` would resolve features differently (no dev-dependencies), rebuild
 * half the dependency tree and overwrite `target/debug/herald` that the Rust tests use.
 */
import { spawn } from "node:child_process";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { TestProject } from "vitest/node";

const workspace = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

declare module "vitest" {
  export interface ProvidedContext {
    heraldBinary: string;
    scratch: string;
  }
}

export default async function setup(project: TestProject): Promise<() => void> {
  let binary = process.env["HERALD_BIN"];
  if (!binary) {
    const status = await new Promise<number | null>((resolve, reject) => {
      const child = spawn("cargo", ["test", "--workspace", "--no-run", "--quiet"], { cwd: workspace, stdio: "inherit" });
      child.on("error", reject);
      child.on("exit", resolve);
    });
    if (status !== 0) throw new Error(`building herald (cargo test --workspace --no-run) failed with ${status}`);
    binary = join(workspace, "target", "debug", "herald");
  }
  project.provide("heraldBinary", binary);
  // Every directory a test makes (data directories, configs, nginx's) goes under one that is
  // removed when the run ends, whatever a test left behind. Others may traverse it: nginx's
  // workers run as `nobody`.
  const scratch = mkdtempSync(join(tmpdir(), "herald-sdk-tests-"));
  chmodSync(scratch, 0o755);
  project.provide("scratch", scratch);
  return () => rmSync(scratch, { recursive: true, force: true });
}
