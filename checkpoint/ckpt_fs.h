/* Internal: the file operations a crash-safe checkpoint is made of. Every function reports
 * failures through mt_error with the path and the system's reason. */
#ifndef MT_CHECKPOINT_CKPT_FS_H
#define MT_CHECKPOINT_CKPT_FS_H

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Creates path and its missing parents (mkdir -p), 0755. */
mt_status mt_ckpt_mkdirs(const char *path);

/* fsync of a file or folder by name: a folder's fsync makes the names created, renamed or
 * removed in it durable. */
mt_status mt_ckpt_fsync_path(const char *path);

/* Writes len bytes to fd at its position, retrying short writes and EINTR. */
mt_status mt_ckpt_write_all(int fd, const void *buf, size_t len, const char *path);

/* What a data file is written in: blocks of this size (docs/benchmarks.md, checkpoints). */
#define MT_CKPT_WRITE_BLOCK ((size_t)16 << 20)

/* Called with each block of mt_ckpt_write_data_file before it is written: [offset, offset + len)
 * of the buffer (= of the file). */
typedef void (*mt_ckpt_block_fn)(void *arg, size_t offset, size_t len);

/* Creates path (replacing a file there) with buf's len bytes, fsynced and closed, one
 * MT_CKPT_WRITE_BLOCK at a time: before(arg, ...) (may be NULL) runs on a block, then the block
 * is written. The bytes go from buf to the disk with O_DIRECT when buf is 4096-aligned and the
 * filesystem takes it (the last len % 4096 bytes buffered): no copy into the page cache (CPU
 * time and memory bandwidth taken from training, fresh page-cache pages, dirty-page throttling;
 * docs/benchmarks.md has the figures) and no cache filled with a checkpoint nobody reads soon.
 * Otherwise each block goes through the page cache and the disk is started on it at once
 * (sync_file_range), so that it writes while the next block is prepared instead of all at the
 * fsync. */
mt_status mt_ckpt_write_data_file(const char *path, const void *buf, size_t len,
                                  mt_ckpt_block_fn before, void *arg);

/* Replaces dir/name with data atomically: dir/name.tmp is written and fsynced, renamed over
 * dir/name, and dir fsynced. A reader sees the old or the new content, never a mix. */
mt_status mt_ckpt_replace_file(const char *dir, const char *name, const void *data, size_t len);

/* Reads a whole file (at most max bytes: a larger one is an error naming both sizes) into a
 * malloc'd buffer with a NUL after the last byte. */
mt_status mt_ckpt_read_file(const char *path, size_t max, char **data, size_t *len);

/* Reads len bytes at offset; a file that ends before is MT_ERR_IO saying "truncated". */
mt_status mt_ckpt_pread_all(int fd, void *buf, size_t len, uint64_t offset, const char *path);

/* Removes path and everything below it (rm -rf); a missing path is fine. */
mt_status mt_ckpt_remove_tree(const char *path);

/* Joins dir and name into out ("dir/name"); MT_ERR_INVALID_ARG when it does not fit. */
mt_status mt_ckpt_join(char *out, size_t cap, const char *dir, const char *name);

/* Whether path exists and is a folder / a regular file. */
bool mt_ckpt_is_dir(const char *path);
bool mt_ckpt_is_file(const char *path);

#endif
