// Builds the files Herald serves: /herald.js (the SDK as one script defining the global
// `Herald`) and /chat.js (the demo). They are committed under crates/server/assets so that
// the server builds without Node; `--check` fails when they are stale.
import { build } from "esbuild";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const assets = join(root, "..", "crates", "server", "assets");
const check = process.argv.includes("--check");

const targets = [
  { entry: "src/index.ts", out: "herald.js", globalName: "Herald" },
  { entry: "demo/chat.ts", out: "chat.js" },
  // Minified: it bundles uPlot (MIT, see the banner), most of its size.
  {
    entry: "demo/dashboard.ts",
    out: "dashboard.js",
    minify: true,
    banner: "// Bundles uPlot 1.6 (https://github.com/leeoniya/uPlot), Copyright (c) 2022 Leon Sorokin, MIT License.\n",
  },
];

let stale = [];
for (const t of targets) {
  const result = await build({
    entryPoints: [join(root, t.entry)],
    bundle: true,
    format: "iife",
    globalName: t.globalName,
    target: "es2020",
    minify: t.minify ?? false,
    legalComments: "none",
    write: false,
  });
  const text = `// Generated from sdk/${t.entry} by \`npm run build\` in sdk/; do not edit.\n` + (t.banner ?? "") + result.outputFiles[0].text;
  const path = join(assets, t.out);
  if (check) {
    let committed = "";
    try {
      committed = readFileSync(path, "utf8");
    } catch {}
    if (committed !== text) stale.push(path);
  } else {
    writeFileSync(path, text);
    console.log(`wrote ${path} (${text.length} bytes)`);
  }
}
// The dashboard's styles: its own, then uPlot's (the charts it bundles).
{
  const css =
    "/* Generated from sdk/demo/dashboard.css and uplot/dist/uPlot.min.css by `npm run build` in sdk/; do not edit. */\n" +
    readFileSync(join(root, "demo", "dashboard.css"), "utf8") +
    readFileSync(join(root, "node_modules", "uplot", "dist", "uPlot.min.css"), "utf8") +
    "\n";
  const path = join(assets, "dashboard.css");
  if (check) {
    let committed = "";
    try {
      committed = readFileSync(path, "utf8");
    } catch {}
    if (committed !== css) stale.push(path);
  } else {
    writeFileSync(path, css);
    console.log(`wrote ${path} (${css.length} bytes)`);
  }
}
if (stale.length > 0) {
  console.error(`stale: ${stale.join(", ")}\nrun \`npm run build\` in sdk/ and commit the result`);
  process.exit(1);
}
