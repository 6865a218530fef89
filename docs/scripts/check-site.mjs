// Checks the built site (.vitepress/dist) beyond VitePress's own dead-link check, which knows
// pages but not anchors: every internal link's page exists and, when it names an anchor, that
// page has an element with that id. Then serves the site and takes a screenshot of two pages in
// Chromium (Debian's /usr/bin/chromium, driven by the repository's playwright-core), written to
// .vitepress/dist/screenshots/. Exits 1 on a broken link or anchor.
import { readdirSync, readFileSync, mkdirSync, existsSync, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { extname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const dist = fileURLToPath(new URL('../.vitepress/dist/', import.meta.url));
const pages = readdirSync(dist, { recursive: true }).filter((f) => f.endsWith('.html') && f !== '404.html');

/** The page a site path names, as cleanUrls serves it: /guide/cli → guide/cli.html, / → index.html. */
function pageOf(path) {
  const p = decodeURIComponent(path).replace(/^\//, '');
  for (const candidate of [p, `${p}.html`, join(p, 'index.html')]) {
    if (candidate && existsSync(join(dist, candidate)) && statSync(join(dist, candidate)).isFile()) return candidate;
  }
  return p === '' ? 'index.html' : undefined;
}

const ids = new Map(pages.map((f) => [f, new Set([...readFileSync(join(dist, f), 'utf8').matchAll(/\sid="([^"]+)"/g)].map((m) => m[1]))]));
const broken = [];
let links = 0;
for (const page of pages) {
  const html = readFileSync(join(dist, page), 'utf8');
  for (const [, href] of html.matchAll(/<a [^>]*href="([^"]+)"/g)) {
    if (/^(https?:|mailto:)/.test(href) || href.startsWith('/assets/')) continue;
    links++;
    const url = new URL(href.replace(/&amp;/g, '&'), `http://site/${page}`);
    const target = pageOf(url.pathname);
    if (target === undefined || !target.endsWith('.html')) {
      if (target === undefined) broken.push(`${page}: ${href} (no such page)`);
      continue;
    }
    const anchor = decodeURIComponent(url.hash.slice(1));
    if (anchor && !ids.get(target)?.has(anchor)) broken.push(`${page}: ${href} (no #${anchor} in ${target})`);
  }
}
console.log(`site: ${pages.length} pages, ${links} internal links checked`);
if (broken.length > 0) {
  for (const b of broken) console.log(`BROKEN ${b}`);
  process.exit(1);
}

const TYPES = {
  '.html': 'text/html',
  '.js': 'text/javascript',
  '.css': 'text/css',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.woff2': 'font/woff2',
};
const server = createServer((req, res) => {
  const path = new URL(req.url, 'http://site').pathname;
  const file = pageOf(path) ?? path.replace(/^\//, '');
  const full = join(dist, file);
  if (!relative(dist, full).startsWith('..') && existsSync(full) && statSync(full).isFile()) {
    res.writeHead(200, { 'content-type': TYPES[extname(full)] ?? 'application/octet-stream' });
    res.end(readFileSync(full));
  } else {
    res.writeHead(404).end();
  }
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const base = `http://127.0.0.1:${server.address().port}`;
const { chromium } = createRequire(import.meta.url)('../../node_modules/playwright-core');
const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  mkdirSync(join(dist, 'screenshots'), { recursive: true });
  for (const [path, name] of [
    ['/', 'home'],
    ['/guide/getting-started', 'getting-started'],
  ]) {
    const response = await page.goto(`${base}${path}`, { waitUntil: 'networkidle' });
    if (response?.status() !== 200) throw new Error(`${path}: HTTP ${response?.status()}`);
    await page.locator('.VPContent h1, .VPHero .name').first().waitFor();
    await page.screenshot({ path: join(dist, 'screenshots', `${name}.png`) });
  }
  console.log(`screenshots of / and /guide/getting-started in ${relative(process.cwd(), join(dist, 'screenshots'))}`);
} finally {
  await browser.close();
  server.close();
}
