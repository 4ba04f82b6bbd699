// The daemon's log to syslog (/dev/log: journald or rsyslog), where gcsfuse logs when it runs in the
// background without a log file. Node has no Unix datagram socket: these two calls are one (the socket lives as long as the daemon). Sends
// never block: a syslog that cannot take a line now (EAGAIN) loses it, the daemon never waits on it.

#include "mount.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

// logSocketOpen(path): a datagram socket connected to `path`; its descriptor, or -errno.
static napi_value log_socket_open(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  args_of(env, info, 1, argv);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  size_t len = 0;
  int result;
  if (napi_get_value_string_utf8(env, argv[0], addr.sun_path, sizeof addr.sun_path, &len) != napi_ok || len == 0 || len >= sizeof addr.sun_path - 1) {
    result = -EINVAL;
  } else {
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      result = -errno;
    } else if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
      result = -errno;
      close(fd);
    } else {
      result = fd;
    }
  }
  napi_value out;
  napi_create_int32(env, result, &out);
  return out;
}

// logSocketSend(fd, buffer): sends the buffer as one datagram; the bytes sent, or -errno.
static napi_value log_socket_send(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  args_of(env, info, 2, argv);
  void *data = NULL;
  size_t len = 0;
  int result;
  if (napi_get_buffer_info(env, argv[1], &data, &len) != napi_ok) {
    result = -EINVAL;
  } else {
    ssize_t n = send((int)num(env, argv[0]), data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    result = n < 0 ? -errno : (int)n;
  }
  napi_value out;
  napi_create_int32(env, result, &out);
  return out;
}

int log_socket_exports(napi_env env, napi_value exports) {
  EXPORT("logSocketOpen", log_socket_open);
  EXPORT("logSocketSend", log_socket_send);
  return 1;
}
