{
  "targets": [
    {
      "target_name": "gcsmount_fuse",
      "sources": ["gcsmount_fuse.c", "session.c", "ll_ops.c", "replies.c", "reply_later.c", "block_write.c", "native_path.c", "block_reads.c", "block_slots.c", "block_regs.c", "crc32c.c", "log_socket.c", "deferred.c"],
      "cflags": ["-Wall", "-Wextra", "-O2", "<!@(pkg-config --cflags fuse3)"],
      "libraries": ["<!@(pkg-config --libs fuse3)", "-lpthread"]
    }
  ]
}
