/**
 * gcsfuse's special values as types, shared by every layer (imports nothing): -1 and 0 mean "forever" /
 * "unlimited" and "off" in its flags; here a component can never mistake one for a number.
 */
export type Ttl = { kind: 'off' } | { kind: 'forever' } | { kind: 'ms'; ms: number };
export type SizeLimit = { kind: 'off' } | { kind: 'unlimited' } | { kind: 'bytes'; bytes: number };
