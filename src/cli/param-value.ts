// One textual value of an option, from the command line or the config file, turned into its resolved
// value by the option's type: both sources go through here, so a value means the same in either.

import type { Param } from './params.js';
import {
  OptionError,
  optionLabel,
  parseBool,
  parseChoice,
  parseDuration,
  parseFloat,
  parseInt,
  parseOctal,
  parseStringList,
} from './values.js';

/** Parse one textual value for `param`; `label` names the option in error messages. */
export function parseParamValue(param: Param, text: string, label: string): unknown {
  switch (param.type) {
    case 'bool':
      return parseBool(label, text);
    case 'int': {
      const n = parseInt(label, text, param.min, param.max);
      if (n === 0 && param.refuseZero) throw new OptionError(`invalid value ${JSON.stringify(text)} for ${optionLabel(label)}: ${param.refuseZero}`);
      return n;
    }
    case 'float':
      return parseFloat(label, text, param.min, param.max);
    case 'duration': {
      const ms = parseDuration(label, text);
      if (param.min !== undefined && ms < param.min) {
        throw new OptionError(`invalid value ${JSON.stringify(text)} for ${optionLabel(label)}: too short`);
      }
      return ms;
    }
    case 'octal':
      return parseOctal(label, text);
    case 'string-list':
      return parseStringList(text);
    case 'string':
      return param.choices ? parseChoice(label, text, param.choices) : text;
  }
}
