/**
 * How far ahead to fetch for one stream of reads over numbered files (chunks of one array in C order, or
 * files of one folder in name order). The distance ramps up while the reader keeps landing where we
 * predicted and falls to nothing on a jump, so a shuffled reader costs (almost) no extra bytes: it only
 * starts a stream when two reads happen to be neighbours, and the next jump ends it.
 */
export interface StreamAdvice {
  /** The furthest position read: fetch from the next one on. */
  from: number;
  direction: 1 | -1;
  /** Files to have on their way ahead of `position`, 0 for none. */
  distance: number;
}

/** Distance a stream starts with once two reads were neighbours. */
const START_DISTANCE = 2;
/** A step of up to this many files counts as a neighbour (parallel readers skip some). */
const NEIGHBOUR = 2;
/**
 * The most readers a stream's reach is widened for (below): 16 dask threads or loader processes are the
 * common crowd; past that the budgets, not the distance, should bound what is fetched ahead.
 */
const MAX_CROWD = 16;
/** Weight of each read in the running mean of how far behind the front reads land. */
const LAG_WEIGHT = 1 / 16;
/**
 * A crowd is recognised from this many recent reads, all different, within CROWD_SPAN times as many
 * files: readers splitting a walk land close together but rarely next to one another in turn, while a
 * shuffled reader's reads of a large array are spread across it (8 within 24 files of 384: ~1 in 10^7).
 */
const CROWD_READS = 8;
const CROWD_SPAN = 3;

export class ReadStream {
  /** The furthest position read, in the stream's direction. */
  private last: number | null = null;
  private direction: 1 | -1 | 0 = 0;
  private distance = 0;
  /** Bumped on every jump: a round of fetches planned before it is no longer wanted. */
  epoch = 0;
  /** The furthest position ahead that a walk has dealt with (started, found fetched, found absent); null: none. */
  private dealt: number | null = null;
  /** A walk is fetching for this stream: it goes on to wherever later reads move the stream. */
  walking = false;
  /**
   * Running mean of how far behind the front (`last`) reads land. One reader reads at the front; c
   * readers splitting a walk (reader k takes every c-th file, as dask threads and loader processes do)
   * land about (c - 1) / 2 behind it, so 1 + 2 x lag estimates c.
   */
  private lag = 0;
  /** Reads in a row that landed behind the front. */
  private behind = 0;
  /** The last CROWD_READS positions read (distinct from the one before), oldest first. */
  private readonly recent: number[] = [];

  constructor(private readonly maxDistance: number) {}

  /** Files the stream reaches ahead of its front now (0 when none is running). */
  get distanceAhead(): number {
    return this.direction === 0 ? 0 : this.distance;
  }

  observe(position: number): StreamAdvice | null {
    if (this.recent[this.recent.length - 1] !== position) {
      this.recent.push(position);
      if (this.recent.length > CROWD_READS) this.recent.shift();
    }
    if (this.last === null) {
      this.last = position;
      return null;
    }
    const delta = position - this.last;
    if (delta === 0) return this.advice();
    if (this.direction === 0) {
      if (Math.abs(delta) <= NEIGHBOUR) {
        // Nothing comes before position 0: reads 1 then 0 are readers starting together at the beginning
        // (their first reads arrive in any order), not a walk backwards, which would fetch nothing and
        // take 2 x CROWD_READS forward reads to be given up.
        const atStart = delta < 0 && position === 0;
        this.direction = delta > 0 || atStart ? 1 : -1;
        this.dealt = null;
        this.behind = 0;
        this.distance = Math.min(this.maxDistance, START_DISTANCE);
        if (!atStart) this.last = position;
      } else if (!this.crowdStarts()) {
        this.last = position;
      }
      return this.advice();
    }
    const ahead = delta * this.direction;
    // Within the crowd's width a read ahead of the front is a faster reader, not a jump.
    const reach = Math.max(NEIGHBOUR, this.distance, Math.ceil(2 * this.lag)) + NEIGHBOUR;
    if (ahead > 0 && ahead <= reach) {
      // Where we predicted: go further.
      this.behind = 0;
      this.lag -= this.lag * LAG_WEIGHT;
      this.distance = Math.min(this.reachCap(), Math.max(START_DISTANCE, this.distance * 2));
      this.last = position;
      return this.advice();
    }
    if (ahead < 0 && -ahead <= reach) {
      // A parallel reader slightly behind the others: still the same stream, nothing new to fetch.
      this.lag += (-ahead - this.lag) * LAG_WEIGHT;
      // Unless nobody passes the front any more: each of c readers passes it at least once per c reads
      // when they move the stream's way. A crowd whose first neighbours in turn were taken for a walk
      // backwards would otherwise hold that stream for ever, every read landing "behind" it.
      if (++this.behind <= Math.max(2 * CROWD_READS, 2 * this.crowd())) return null;
    }
    // A jump: the reader is not walking this way (or started over elsewhere).
    this.epoch++;
    this.dealt = null;
    this.direction = 0;
    this.distance = 0;
    this.lag = 0;
    this.behind = 0;
    if (!this.crowdStarts()) this.last = position;
    return this.advice();
  }

  /**
   * Starts a stream when the recent reads are a crowd (see CROWD_READS) moving one way: its front is the
   * furthest of them, and how far behind it the others are seeds the crowd's size.
   */
  private crowdStarts(): boolean {
    const r = this.recent;
    if (r.length < CROWD_READS || new Set(r).size < CROWD_READS) return false;
    const lo = Math.min(...r);
    const hi = Math.max(...r);
    if (hi - lo > CROWD_SPAN * CROWD_READS) return false;
    const half = CROWD_READS / 2;
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const trend = mean(r.slice(half)) - mean(r.slice(0, half));
    if (trend === 0) return false;
    this.direction = trend > 0 ? 1 : -1;
    this.last = this.direction > 0 ? hi : lo;
    this.lag = Math.abs(this.last - mean(r));
    this.behind = 0;
    this.dealt = null;
    this.distance = Math.min(this.reachCap(), START_DISTANCE);
    return true;
  }

  /**
   * How far ahead of the front the stream may reach: --prefetch-max-files-ahead files ahead of each
   * reader in its own sequence. c readers splitting a walk each take every c-th file, so that is c
   * times the distance ahead of the front; with the distance of one reader, 16 readers had each only
   * two files of their own on the way, and a sharded Zarr load went in waves of one round trip each.
   */
  private reachCap(): number {
    return this.maxDistance * this.crowd();
  }

  /** How many readers split the walk, as far as their lag says (1 to MAX_CROWD). */
  private crowd(): number {
    return Math.min(MAX_CROWD, Math.max(1, Math.round(1 + 2 * this.lag)));
  }

  /**
   * The part of the stream's reach that no walk has dealt with yet (`from` is the last position dealt
   * with, or the last read), or null when there is none: what a walk still has to fetch.
   */
  unplanned(): StreamAdvice | null {
    const advice = this.advice();
    if (!advice) return null;
    const end = advice.from + advice.direction * advice.distance;
    const from = this.dealt !== null && (this.dealt - advice.from) * advice.direction > 0 ? this.dealt : advice.from;
    const distance = (end - from) * advice.direction;
    return distance > 0 ? { from, direction: advice.direction, distance } : null;
  }

  /** A walk has dealt with `position` (and every one before it in the stream's direction). */
  dealtWith(position: number): void {
    if (this.direction !== 0 && (this.dealt === null || (position - this.dealt) * this.direction > 0)) this.dealt = position;
  }

  private advice(): StreamAdvice | null {
    if (this.direction === 0 || this.distance === 0 || this.last === null) return null;
    return { from: this.last, direction: this.direction, distance: this.distance };
  }
}
