// What one option of the table is: its name, config key, type, default, group and whether it takes effect.

export type ParamType = 'bool' | 'int' | 'float' | 'string' | 'duration' | 'octal' | 'string-list';

export type ParamGroup =
  | 'Mounting'
  | 'Metadata cache'
  | 'Block cache'
  | 'Downloads'
  | 'Writes'
  | 'GCS connection'
  | 'Authentication'
  | 'Logging and metrics'
  | 'Permissions'
  | 'Compatibility';

export type ParamEffect = 'effective' | 'planned' | 'ignored';

export interface Param {
  /** gcsfuse's flag name without dashes, e.g. 'metadata-cache-ttl-secs'. */
  flag: string;
  /** gcsfuse YAML path, e.g. 'metadata-cache.ttl-secs'; null if the option is command-line only. */
  configKey: string | null;
  type: ParamType;
  /** gcsfuse's current default (or ours where we differ, with the reason in `help`), in resolved form. */
  default: unknown;
  /** One line. For 'ignored' options it says why. */
  help: string;
  group: ParamGroup;
  /** 'planned': accepted now, takes effect in a later release; 'ignored': accepted for gcsfuse compatibility only. */
  effect: ParamEffect;
  /** Set when gcsfuse deprecates the option: what to use instead. */
  deprecated?: string;
  /** Bounds for numeric types (inclusive). */
  min?: number;
  max?: number;
  /** For an 'int' whose range takes -1 (unlimited) but where 0 would mean "never": why 0 is refused. */
  refuseZero?: string;
  /** For 'string' options with a fixed vocabulary (matched case-insensitively, stored lower-case). */
  choices?: readonly string[];
  /** A filesystem path: '~' is expanded and relative paths are made absolute. */
  path?: boolean;
}
