/** The dashboard's browser tests: Debian's Chromium, driven through playwright-core. */
import { existsSync } from 'node:fs';
import { chromium, type Browser } from 'playwright-core';

/** Debian's Chromium, which the dashboard's browser tests drive through playwright-core. */
const CHROMIUM = '/usr/bin/chromium';
const CHROMIUM_FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];

/**
 * The `skip` of a browser suite: false when Chromium is installed. A missing
 * Chromium fails the file rather than skipping it unnoticed, unless
 * PGASYNQ_SKIP_BROWSER=1 says to skip on purpose.
 */
export function browserSkip(): false | string {
  if (existsSync(CHROMIUM)) return false;
  if (process.env.PGASYNQ_SKIP_BROWSER === '1') return `no ${CHROMIUM}, and PGASYNQ_SKIP_BROWSER=1`;
  throw new Error(`${CHROMIUM} is missing: apt-get install -y chromium (.ci/run does), or PGASYNQ_SKIP_BROWSER=1 to skip the browser tests`);
}

/** A headless Chromium for a browser suite. */
export function launchBrowser(): Promise<Browser> {
  return chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_FLAGS });
}
