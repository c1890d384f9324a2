import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts", "e2e/**/*.test.ts"],
    // The server binary is built once here, outside every hook timeout.
    globalSetup: ["test/global-setup.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Each file starts real servers (and the e2e file a browser); one at a time keeps a
    // 2-core machine's timings sane.
    fileParallelism: false,
  },
});
