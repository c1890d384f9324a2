import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts", "e2e/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Each file starts real servers (and the e2e file a browser); one at a time keeps a
    // 2-core machine's timings sane.
    fileParallelism: false,
  },
});
