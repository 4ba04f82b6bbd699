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

  constructor(private readonly maxDistance: number) {}

  observe(position: number): StreamAdvice | null {
    if (this.last === null) {
      this.last = position;
      return null;
    }
    const delta = position - this.last;
    if (delta === 0) return this.advice();
    if (this.direction === 0) {
      if (Math.abs(delta) <= NEIGHBOUR) {
        this.direction = delta > 0 ? 1 : -1;
        this.dealt = null;
        this.distance = Math.min(this.maxDistance, START_DISTANCE);
      }
      this.last = position;
      return this.advice();
    }
    const ahead = delta * this.direction;
    const reach = Math.max(NEIGHBOUR, this.distance + NEIGHBOUR);
    if (ahead > 0 && ahead <= reach) {
      // Where we predicted: go further.
      this.distance = Math.min(this.maxDistance, Math.max(START_DISTANCE, this.distance * 2));
      this.last = position;
      return this.advice();
    }
    if (ahead < 0 && -ahead <= reach) {
      // A parallel reader slightly behind the others: still the same stream, nothing new to fetch.
      return null;
    }
    // A jump: the reader is not walking this way (or started over elsewhere).
    this.epoch++;
    this.dealt = null;
    this.direction = 0;
    this.distance = 0;
    this.last = position;
    return null;
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
