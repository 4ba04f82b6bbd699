import { readFileSync } from 'node:fs';

/** gcsmount's version, from its package.json (one place to change it), for --version and the User-Agent. */
export const VERSION: string = (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }).version;
