// Messages that need no answer, kept on the receive thread: a read handle's or a folder's release
// (answered here), a forget. Each message handed to JavaScript wakes its thread, and a cold chunk
// file's release did so on its own (0.76 of its ~4.9 wake-ups: a perf sched_wakeup count,
// bench/RESULTS.md session 16); kept, it goes with the next request, the open of the reader's next
// file. Only the receive thread keeps and sends these, so JavaScript still sees the kernel's order: a
// release before the open that follows it.

#include "mount.h"

#include <poll.h>

// How long a kept message may wait for a request to go with, and how many are kept at most.
#define DEFERRED_MAX_MS 20
#define DEFERRED_MAX 128

void send_deferred(struct mount *m) {
  struct msg *msg = m->deferred_head;
  m->deferred_head = m->deferred_tail = NULL;
  m->deferred_count = 0;
  while (msg) {
    struct msg *next = msg->next;
    msg->next = NULL;
    msg_send(m, msg);
    msg = next;
  }
}

void defer(struct mount *m, int op, uint64_t ino, uint64_t a) {
  struct msg *msg = msg_new(op, NULL, ino, a, 0, 0, NULL, NULL);
  // Out of memory: JavaScript never hears of it, as when forward fails to allocate a notice.
  if (!msg) return;
  if (m->deferred_tail) m->deferred_tail->next = msg;
  else {
    m->deferred_head = msg;
    m->deferred_since_ns = br_now_ns();
  }
  m->deferred_tail = msg;
  if (++m->deferred_count >= DEFERRED_MAX) send_deferred(m);
}

// Before the receive thread reads the next request: kept messages go once the oldest has waited its
// time, or once no request came for the rest of it (poll), so a quiet mount hears its releases soon.
void deferred_wait(struct mount *m, int fd) {
  if (!m->deferred_head) return;
  uint64_t waited_ms = (br_now_ns() - m->deferred_since_ns) / 1000000u;
  if (waited_ms < DEFERRED_MAX_MS) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(DEFERRED_MAX_MS - waited_ms)) > 0) {
      // A request is there; the kept ones go with it if it reaches JavaScript, else on a later turn.
      if ((br_now_ns() - m->deferred_since_ns) / 1000000u < DEFERRED_MAX_MS) return;
    }
  }
  send_deferred(m);
}
