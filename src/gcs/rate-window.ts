/**
 * What the request-rate limiter granted and what GCS accepted over the last second, counted in
 * 100 ms slots of a ring: the rate controller's cuts and growth are measured against use, not against
 * the nominal rate (see rate-controller.ts for why).
 */

/** Successes in the last second are counted in buckets of this many ms. */
const WINDOW_SLOT_MS = 100;
const WINDOW_SLOTS = 10;
/**
 * Below this many grants a count says nothing: a slow-start step that allows fewer is not gated by its
 * use, and a window that holds fewer does not end a slow start.
 */
export const MEASURABLE_GRANTS = 4;

export class RateWindow {
  /** Accepted requests per 100 ms slot over the last second (a ring). */
  private readonly accepted = new Array<number>(WINDOW_SLOTS).fill(0);
  /** Requests granted per 100 ms slot, in the same ring. */
  private readonly sent = new Array<number>(WINDOW_SLOTS).fill(0);
  private slotStart: number;
  private slot = 0;
  /** When requests started flowing after a quiet second: the accepted rate means something a second later. */
  private activeSince: number;
  private lastGrantAt = Number.NEGATIVE_INFINITY;

  constructor(
    private readonly now: () => number,
    startedAt: number,
  ) {
    this.slotStart = startedAt;
    this.activeSince = startedAt;
  }

  /** A token was granted at `t`. */
  granted(t: number): void {
    this.roll();
    this.sent[this.slot]!++;
    if (t - this.lastGrantAt > WINDOW_SLOT_MS * WINDOW_SLOTS) this.activeSince = t;
    this.lastGrantAt = t;
  }

  /** GCS answered a request (anything but a 429). */
  succeeded(): void {
    this.roll();
    this.accepted[this.slot]!++;
  }

  /** Whether requests have flowed for a whole window by `t`, so that acceptedRate measures a second. */
  fullSecond(t: number): boolean {
    return t - this.activeSince >= WINDOW_SLOT_MS * WINDOW_SLOTS;
  }

  /** Requests/s GCS accepted over the last second, at least `floor` (called only after a second of activity). */
  acceptedRate(t: number, floor: number): number {
    this.roll();
    // The ring holds the current, partial slot and the full slots before it.
    const covered = (WINDOW_SLOTS - 1) * WINDOW_SLOT_MS + (t - this.slotStart);
    return Math.max(floor, (this.accepted.reduce((a, b) => a + b, 0) * 1000) / Math.max(WINDOW_SLOT_MS, covered));
  }

  /**
   * Requests/s granted over the last `slots` slots of the ring, the current, partial one included;
   * null below a few grants (a 429 answered late, after the requests had stopped, would measure an
   * empty window and end the slow start at the floor).
   */
  sentRate(t: number, slots: number): number | null {
    this.roll();
    let n = 0;
    for (let i = 0; i < slots; i++) n += this.sent[(this.slot - i + WINDOW_SLOTS) % WINDOW_SLOTS]!;
    if (n < MEASURABLE_GRANTS) return null;
    return (n * 1000) / Math.max(WINDOW_SLOT_MS, (slots - 1) * WINDOW_SLOT_MS + (t - this.slotStart));
  }

  private roll(): void {
    const t = this.now();
    while (t - this.slotStart >= WINDOW_SLOT_MS) {
      this.slotStart += WINDOW_SLOT_MS;
      this.slot = (this.slot + 1) % WINDOW_SLOTS;
      this.accepted[this.slot] = 0;
      this.sent[this.slot] = 0;
      // After a long idle, skip ahead instead of looping slot by slot.
      if (t - this.slotStart > WINDOW_SLOT_MS * WINDOW_SLOTS) {
        this.accepted.fill(0);
        this.sent.fill(0);
        this.slotStart = t;
      }
    }
  }
}
