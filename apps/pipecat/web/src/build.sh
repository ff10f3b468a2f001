#!/bin/sh
# Rebuild ../pipecat-client.js (and ../pipecat-client.LICENSES.txt) from the exact versions in package-lock.json.
# Needs node + npm here; the page that loads the bundle needs neither.
set -e
cd "$(dirname "$0")"
npm ci --no-audit --no-fund
npx esbuild entry.js --bundle --format=esm --minify --target=es2020 --alias:@daily-co/daily-js=./no-daily.js \
  --legal-comments=none --metafile=meta.json --outfile=../pipecat-client.js
node licenses.mjs
rm -rf node_modules meta.json
