// The subset of fuse-native 2.2 that gcsmount uses. Errors are negative errno numbers.
declare module 'fuse-native' {
  export interface FuseStat {
    mode: number;
    uid: number;
    gid: number;
    size: number;
    mtime: Date;
    atime: Date;
    ctime: Date;
    nlink?: number;
    blocks?: number;
    blksize?: number;
  }
  export interface FuseStatfs {
    bsize: number;
    frsize: number;
    blocks: number;
    bfree: number;
    bavail: number;
    files: number;
    ffree: number;
    favail: number;
    fsid: number;
    flag: number;
    namemax: number;
  }
  type Cb<T extends unknown[] = []> = (err: number, ...result: T) => void;
  export interface FuseOps {
    init?(cb: Cb): void;
    statfs?(path: string, cb: Cb<[FuseStatfs?]>): void;
    getattr?(path: string, cb: Cb<[FuseStat?]>): void;
    fgetattr?(path: string, fd: number, cb: Cb<[FuseStat?]>): void;
    access?(path: string, mode: number, cb: Cb): void;
    readdir?(path: string, cb: Cb<[string[]?, FuseStat[]?]>): void;
    open?(path: string, flags: number, cb: Cb<[number?]>): void;
    opendir?(path: string, flags: number, cb: Cb<[number?]>): void;
    read?(path: string, fd: number, buf: Buffer, len: number, pos: number, cb: (bytesOrErr: number) => void): void;
    write?(path: string, fd: number, buf: Buffer, len: number, pos: number, cb: (bytesOrErr: number) => void): void;
    release?(path: string, fd: number, cb: Cb): void;
    releasedir?(path: string, fd: number, cb: Cb): void;
    create?(path: string, mode: number, cb: Cb<[number?]>): void;
    unlink?(path: string, cb: Cb): void;
    rename?(src: string, dest: string, cb: Cb): void;
    mkdir?(path: string, mode: number, cb: Cb): void;
    rmdir?(path: string, cb: Cb): void;
    truncate?(path: string, size: number, cb: Cb): void;
    ftruncate?(path: string, fd: number, size: number, cb: Cb): void;
    chmod?(path: string, mode: number, cb: Cb): void;
    chown?(path: string, uid: number, gid: number, cb: Cb): void;
    utimens?(path: string, atime: Date, mtime: Date, cb: Cb): void;
    symlink?(src: string, dest: string, cb: Cb): void;
    link?(src: string, dest: string, cb: Cb): void;
    setxattr?(path: string, name: string, value: Buffer, position: number, flags: number, cb: Cb): void;
    removexattr?(path: string, name: string, cb: Cb): void;
  }
  export interface FuseOptions {
    force?: boolean;
    mkdir?: boolean;
    debug?: boolean;
    timeout?: false | number | Record<string, number | false>;
    allowOther?: boolean;
    defaultPermissions?: boolean;
    maxRead?: number | string;
    fsname?: string;
    subtype?: string;
    autoCache?: boolean;
    kernelCache?: boolean;
    entryTimeout?: number | string;
    attrTimeout?: number | string;
    acAttrTimeout?: number | string;
    uid?: number;
    gid?: number;
  }
  export default class Fuse {
    constructor(mnt: string, ops: FuseOps, opts?: FuseOptions);
    mount(cb: (err: Error | null) => void): void;
    unmount(cb: (err: Error | null) => void): void;
    static unmount(mnt: string, cb: (err: Error | null) => void): void;
  }
}
