// Builds the dashboard into internal/api/dashboard/ (committed, so that
// make run needs no npm): app.js bundled with esbuild, index.html and
// app.css copied. The output is deterministic; make checkgenerate rebuilds
// it and fails on a difference.
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";

const out = "../internal/api/dashboard";
mkdirSync(out, { recursive: true });
await build({
  entryPoints: ["dashboard/app.js"],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  legalComments: "none",
  outfile: `${out}/app.js`,
  logLevel: "warning",
});
for (const f of ["index.html", "app.css"]) copyFileSync(`dashboard/${f}`, `${out}/${f}`);
