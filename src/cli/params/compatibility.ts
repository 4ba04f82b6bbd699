// gcsfuse options accepted for compatibility.

import { PROFILES } from '../profiles.js';
import type { Param } from './param.js';

export const COMPATIBILITY_PARAMS = [
  {
    flag: 'enable-rapid-appends',
    configKey: 'write.enable-rapid-appends',
    type: 'bool',
    default: true,
    help: 'Appends to Rapid (zonal) buckets\' appendable objects: gcsmount uploads each file whole (staged) or streamed at close',
    group: 'Compatibility',
    effect: 'ignored',
  },
  {
    flag: 'ignore-interrupts',
    configKey: 'file-system.ignore-interrupts',
    type: 'bool',
    default: true,
    help: 'Protects in-flight writes from signals in gcsfuse: gcsmount never abandons a request for a signal (it does not act on FUSE interrupts)',
    group: 'Compatibility',
    effect: 'ignored',
  },
  {
    flag: 'app-name',
    configKey: 'app-name',
    type: 'string',
    default: '',
    help: 'Named in the User-Agent of every request, after gcsmount/VERSION (as gcsfuse names it after its own)',
    group: 'Compatibility',
    effect: 'effective',
  },
  {
    flag: 'profile',
    configKey: 'profile',
    type: 'string',
    default: '',
    help: "gcsfuse's defaults for a workload: aiml-training and aiml-serving keep metadata for good (--metadata-cache-ttl-secs -1, negative TTL 0, no stat cache limit; serving also keeps the kernel's listings, --kernel-list-cache-ttl-secs -1), aiml-checkpointing that and --rename-dir-limit 200000; options set explicitly win",
    group: 'Compatibility',
    effect: 'effective',
    // '': no profile (the default).
    choices: ['', ...PROFILES],
  },
] as const satisfies readonly Param[];
