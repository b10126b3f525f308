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
