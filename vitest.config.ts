import { defineConfig } from 'vitest/config';

// Tests mount real FUSE filesystems and start real daemons: run files one at a time so two suites never
// fight over CPU-bound timing, and give each test room for a cold mount on a loaded 2-core machine.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    teardownTimeout: 30_000,
    reporters: ['default'],
  },
});
