// The owner and modes files and folders show.

import type { Param } from './param.js';

export const PERMISSION_PARAMS = [
  {
    flag: 'uid',
    configKey: 'file-system.uid',
    type: 'int',
    default: -1,
    help: 'Owner UID of every file and directory; -1 = the mounting user',
    group: 'Permissions',
    effect: 'effective',
    min: -1,
    max: 4_294_967_295,
  },
  {
    flag: 'gid',
    configKey: 'file-system.gid',
    type: 'int',
    default: -1,
    help: 'Owner GID of every file and directory; -1 = the mounting user\'s group',
    group: 'Permissions',
    effect: 'effective',
    min: -1,
    max: 4_294_967_295,
  },
  {
    flag: 'file-mode',
    configKey: 'file-system.file-mode',
    type: 'octal',
    default: 0o644,
    help: 'Permission bits of files, in octal',
    group: 'Permissions',
    effect: 'effective',
  },
  {
    flag: 'dir-mode',
    configKey: 'file-system.dir-mode',
    type: 'octal',
    default: 0o755,
    help: 'Permission bits of directories, in octal',
    group: 'Permissions',
    effect: 'effective',
  },
] as const satisfies readonly Param[];
