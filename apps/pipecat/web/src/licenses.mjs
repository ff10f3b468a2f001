// Writes ../pipecat-client.LICENSES.txt: each npm package bundled into ../pipecat-client.js (from esbuild's
// metafile), its version and its licence text.
import fs from "node:fs";
import path from "node:path";

const meta = JSON.parse(fs.readFileSync("meta.json", "utf8"));
const packages = new Set();
for (const input of Object.keys(meta.inputs)) {
  const m = input.match(/node_modules\/((?:@[^/]+\/)?[^/]+)\//);
  if (m) packages.add(m[1]);
}
let out = "Third-party code in pipecat-client.js (bundled by build.sh from package-lock.json):\n";
for (const name of [...packages].sort()) {
  const dir = path.join("node_modules", name);
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
  const file = fs.readdirSync(dir).find((f) => /^licen[cs]e/i.test(f));
  out += `\n==== ${name} ${pkg.version} (${pkg.license}) ====\n`;
  out += file ? fs.readFileSync(path.join(dir, file), "utf8") : `(no licence file in the package; its package.json says ${pkg.license})\n`;
}
fs.writeFileSync("../pipecat-client.LICENSES.txt", out);
