// gcsfuse's --profile: named sets of defaults for ML workloads. A gcsfuse config with `profile:
// aiml-training` mounted here with gcsmount's own defaults: a 60 s metadata TTL where the user had asked
// for metadata kept for good, and a checkpointing job's folder renames refused (rename-dir-limit 0).

import type { ParamFlag } from './params.js';

export const PROFILES = ['aiml-training', 'aiml-serving', 'aiml-checkpointing'] as const;
export type Profile = (typeof PROFILES)[number];

/**
 * Each profile's defaults, as gcsfuse's profiles set them (its options gcsmount ignores left out:
 * implicit-dirs is always on here, cache-file-for-range-read has no counterpart). An option the user
 * sets, on the command line or in the config file, wins over its profile's value.
 */
const METADATA_FOR_GOOD: Partial<Record<ParamFlag, number>> = {
  'metadata-cache-ttl-secs': -1,
  'metadata-cache-negative-ttl-secs': 0,
  'stat-cache-max-size-mb': -1,
};

export const PROFILE_DEFAULTS: Record<Profile, Partial<Record<ParamFlag, number>>> = {
  'aiml-training': METADATA_FOR_GOOD,
  'aiml-serving': { ...METADATA_FOR_GOOD, 'kernel-list-cache-ttl-secs': -1 },
  'aiml-checkpointing': { ...METADATA_FOR_GOOD, 'rename-dir-limit': 200_000 },
};
