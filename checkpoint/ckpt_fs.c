/* File operations for checkpoints (checkpoint/ckpt_fs.h). */


#include "checkpoint/ckpt_fs.h"

#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

mt_status mt_ckpt_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: path '%s/%s' is longer than %zu bytes",
                        dir, name, cap - 1);
    return MT_OK;
}

mt_status mt_ckpt_mkdirs(const char *path) {
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: folder name '%s' is empty or too long",
                        path);
    memcpy(buf, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot create folder '%s'", buf);
        buf[i] = c;
    }
    if (!mt_ckpt_is_dir(path))
        return mt_error(MT_ERR_IO, "checkpoint: '%s' exists and is not a folder", path);
    return MT_OK;
}

mt_status mt_ckpt_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot open '%s' to fsync", path);
    mt_status st = MT_OK;
    if (fsync(fd) != 0) st = mt_error_errno(MT_ERR_IO, errno, "checkpoint: fsync of '%s'", path);
    close(fd);
    return st;
}

mt_status mt_ckpt_write_all(int fd, const void *buf, size_t len, const char *path) {
    const char *p = buf;
    while (len > 0) {
        /* Linux writes at most ~2 GiB per call; smaller pieces also keep a slow disk's writes
         * interruptible. */
        size_t piece = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);
        ssize_t n = write(fd, p, piece);
        if (n < 0) {
            if (errno == EINTR) continue;
            return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot write '%s'", path);
        }
        if (n == 0) return mt_error(MT_ERR_IO, "checkpoint: cannot write '%s': no progress", path);
        p += n;
        len -= (size_t)n;
    }
    return MT_OK;
}

/* O_DIRECT wants the buffer, the file offset and the length aligned to the device's logical
 * block: 4096 covers the 512 and 4096 of nearly every device. */
#define DIRECT_ALIGN ((size_t)4096)

/* Turns O_DIRECT off for the rest of the file (a filesystem that refuses it, or the tail). */
static mt_status direct_off(int fd, const char *path) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0)
        return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot reopen '%s' for buffered "
                              "writes", path);
    return MT_OK;
}

mt_status mt_ckpt_write_data_file(const char *path, const void *buf, size_t len,
                                  mt_ckpt_block_fn before, void *arg) {
    const char *p = buf;
    size_t direct_len = (uintptr_t)buf % DIRECT_ALIGN == 0 ? len / DIRECT_ALIGN * DIRECT_ALIGN : 0;
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    int fd = direct_len ? open(path, flags | O_DIRECT, 0644) : -1;
    if (fd < 0) { /* not aligned, or a filesystem without O_DIRECT (EINVAL) */
        direct_len = 0;
        fd = open(path, flags, 0644);
    }
    if (fd < 0) return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot create '%s'", path);
    mt_status st = MT_OK;
    for (size_t off = 0; off < len && st == MT_OK; off += MT_CKPT_WRITE_BLOCK) {
        size_t n = len - off < MT_CKPT_WRITE_BLOCK ? len - off : MT_CKPT_WRITE_BLOCK;
        if (before) before(arg, off, n);
        size_t done = 0;
        if (off < direct_len) {
            size_t dn = direct_len - off < n ? direct_len - off : n;
            ssize_t w;
            do w = write(fd, p + off, dn);
            while (w < 0 && errno == EINTR);
            if (w < 0 && errno == EINVAL && off == 0) {
                direct_len = 0; /* open accepted O_DIRECT, the first write did not */
                st = direct_off(fd, path);
            } else if (w < 0) {
                st = mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot write '%s'", path);
            } else {
                done = (size_t)w; /* a short direct write: the rest goes buffered */
                if (done < dn || off + n > direct_len) st = direct_off(fd, path);
                if (done < dn) direct_len = 0;
            }
        }
        if (st == MT_OK && done < n) {
            st = mt_ckpt_write_all(fd, p + off + done, n - done, path);
            /* Buffered: start the disk on this block now rather than at the fsync. Only a hint
             * (a filesystem may not implement it): the fsync makes the file durable and reports
             * a failed write-back. */
            (void)sync_file_range(fd, (off_t)off, (off_t)n, SYNC_FILE_RANGE_WRITE);
        }
    }
    if (st == MT_OK && fsync(fd) != 0)
        st = mt_error_errno(MT_ERR_IO, errno, "checkpoint: fsync of '%s'", path);
    if (close(fd) != 0 && st == MT_OK)
        st = mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot close '%s'", path);
    return st;
}

mt_status mt_ckpt_pread_all(int fd, void *buf, size_t len, uint64_t offset, const char *path) {
    char *p = buf;
    size_t done = 0;
    while (done < len) {
        size_t piece = len - done < ((size_t)1 << 30) ? len - done : ((size_t)1 << 30);
        ssize_t n = pread(fd, p + done, piece, (off_t)(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot read '%s'", path);
        }
        if (n == 0)
            return mt_error(MT_ERR_IO, "checkpoint: '%s' is truncated: %zu bytes at offset %llu "
                            "needed, the file ends at %llu",
                            path, len, (unsigned long long)offset,
                            (unsigned long long)(offset + done));
        done += (size_t)n;
    }
    return MT_OK;
}

mt_status mt_ckpt_replace_file(const char *dir, const char *name, const void *data, size_t len) {
    char tmp[PATH_MAX], final[PATH_MAX];
    char tmp_name[NAME_MAX + 1];
    if (snprintf(tmp_name, sizeof tmp_name, "%s.tmp", name) >= (int)sizeof tmp_name)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: file name '%s' is too long", name);
    MT_TRY(mt_ckpt_join(tmp, sizeof tmp, dir, tmp_name));
    MT_TRY(mt_ckpt_join(final, sizeof final, dir, name));
    mt_status st = mt_ckpt_write_data_file(tmp, data, len, NULL, NULL);
    if (st == MT_OK && rename(tmp, final) != 0)
        st = mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot rename '%s' to '%s'", tmp,
                            final);
    if (st != MT_OK) {
        unlink(tmp);
        return st;
    }
    return mt_ckpt_fsync_path(dir);
}

mt_status mt_ckpt_read_file(const char *path, size_t max, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mt_error_errno(errno == ENOENT ? MT_ERR_NOT_FOUND : MT_ERR_IO, errno,
                              "checkpoint: cannot open '%s'", path);
    struct stat sb;
    mt_status st = MT_OK;
    if (fstat(fd, &sb) != 0) st = mt_error_errno(MT_ERR_IO, errno, "checkpoint: stat '%s'", path);
    else if ((uint64_t)sb.st_size > max)
        st = mt_error(MT_ERR_IO, "checkpoint: '%s' has %lld bytes, more than the %zu expected at "
                      "most", path, (long long)sb.st_size, max);
    char *buf = NULL;
    if (st == MT_OK) {
        buf = malloc((size_t)sb.st_size + 1);
        if (!buf) st = mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: no memory to read '%s'", path);
    }
    if (st == MT_OK) st = mt_ckpt_pread_all(fd, buf, (size_t)sb.st_size, 0, path);
    close(fd);
    if (st != MT_OK) {
        free(buf);
        return st;
    }
    buf[sb.st_size] = '\0';
    *data = buf;
    *len = (size_t)sb.st_size;
    return MT_OK;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    int rc = flag == FTW_DP ? rmdir(path) : unlink(path);
    return rc != 0 && errno != ENOENT ? -1 : 0;
}

mt_status mt_ckpt_remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return MT_OK;
        return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot remove '%s'", path);
    }
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot remove '%s'", path);
    return MT_OK;
}

bool mt_ckpt_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

bool mt_ckpt_is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}
