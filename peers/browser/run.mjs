// Drives the browser peer: serves page.html and JsSIP from a local HTTP server, opens it in
// headless Chromium (puppeteer-core, over the DevTools protocol), waits until the page has
// registered, made its call and answered the calls it expects (each until its caller hung
// up), then prints the page's outcome
// as JSON and keeps a screenshot. Exit 0 when everything asked for happened, 1 otherwise.
//
//   node run.mjs --server wss://127.0.0.1:8443 --domain example.test --user alice \
//       --password secret [--call sip:bob@example.test] [--answer N] [--wait-s 30] \
//       [--screenshot out.png] [--ready FILE]
//
// --ready FILE is written once the page has registered, so a test can place calls to it.
import { createServer } from 'node:http';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import puppeteer from 'puppeteer-core';
import esbuild from 'esbuild';

const here = dirname(fileURLToPath(import.meta.url));
const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const need = (k) => {
  if (!args[k]) { console.error(`run.mjs: --${k} is required`); process.exit(2); }
  return args[k];
};
const require = createRequire(import.meta.url);
// JsSIP is published as CommonJS: bundled here for the page, exposed as `JsSIP`.
const jssip = esbuild.buildSync({
  entryPoints: [require.resolve('jssip')],
  bundle: true,
  format: 'iife',
  globalName: 'JsSIP',
  platform: 'browser',
  write: false,
}).outputFiles[0].text;
const page = readFileSync(join(here, 'page.html'));
const http = createServer((req, res) => {
  const path = new URL(req.url, 'http://x').pathname;
  if (path === '/jssip.js') { res.writeHead(200, { 'content-type': 'text/javascript' }); res.end(jssip); return; }
  if (path === '/') { res.writeHead(200, { 'content-type': 'text/html' }); res.end(page); return; }
  res.writeHead(path === '/favicon.ico' ? 204 : 404); res.end();
});
await new Promise((ok) => http.listen(0, '127.0.0.1', ok));
const query = new URLSearchParams({
  server: need('server'), domain: need('domain'), user: need('user'), password: need('password'),
  ...(args.call ? { call: args.call } : {}),
});
const browser = await puppeteer.launch({
  executablePath: args.chromium || '/usr/bin/chromium',
  headless: true,
  args: [
    '--no-sandbox',
    // The test's CA is its own: the WSS certificate is not in Chromium's store.
    '--ignore-certificate-errors',
    '--use-fake-ui-for-media-stream',
    '--use-fake-device-for-media-stream',
  ],
});
const answers = Number(args.answer || 0);
const deadline = Date.now() + 1000 * Number(args['wait-s'] || 30);
let outcome = null;
let readyWritten = false;
try {
  const tab = await browser.newPage();
  tab.on('console', (m) => console.error(`[page] ${m.text()}`));
  await tab.goto(`http://127.0.0.1:${http.address().port}/?${query}`);
  const done = (o) => o.registered
    && (!args.call || o.outgoing !== null)
    && o.incoming.filter((c) => c.state === 'ended' || c.state.startsWith('failed')).length >= answers;
  while (Date.now() < deadline) {
    outcome = await tab.evaluate(() => JSON.parse(JSON.stringify(window.outcome)));
    if (outcome.registered && args.ready && !readyWritten) { writeFileSync(args.ready, 'registered\n'); readyWritten = true; }
    if (done(outcome) || outcome.errors.length) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  await new Promise((r) => setTimeout(r, 700));
  outcome = await tab.evaluate(() => JSON.parse(JSON.stringify(window.outcome)));
  if (args.screenshot) await tab.screenshot({ path: args.screenshot });
} finally {
  await browser.close();
  http.close();
}
console.log(JSON.stringify(outcome));
const ok = outcome && outcome.registered
  && (!args.call || outcome.outgoing === 'confirmed')
  && outcome.incoming.filter((c) => c.state === 'ended').length >= answers;
process.exit(ok ? 0 : 1);
