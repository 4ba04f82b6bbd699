// "Did you mean ...?" for an unknown flag or config key: a typo should name its fix, not only fail.

function editDistance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0]!;
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const cur = row[j]!;
      row[j] = Math.min(row[j]! + 1, row[j - 1]! + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = cur;
    }
  }
  return row[b.length]!;
}

/** The candidate closest to `name` (case and '_' against '-' ignored), or '' when none is close. */
export function suggest(name: string, candidates: Iterable<string>): string {
  const norm = (s: string) => s.toLowerCase().replace(/_/g, '-');
  let best: string | undefined;
  let bestD = Infinity;
  for (const c of candidates) {
    const d = editDistance(norm(name), norm(c));
    if (d < bestD) {
      best = c;
      bestD = d;
    }
  }
  return best !== undefined && bestD <= Math.max(2, Math.floor(name.length / 4)) ? best : '';
}
