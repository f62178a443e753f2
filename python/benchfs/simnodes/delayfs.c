/*
 * delayfs: a passthrough FUSE file system that sleeps before every read and write.
 *
 * Written for the benchfs-diagnose tests: a loop device whose backing file lives here (attached
 * with `losetup --direct-io=on`) is a block device with a chosen service time, i.e. a slow
 * disk whose own r_await is high (what seed 000 saw on one member NVMe).
 *
 *   delayfs BACKING_DIR MOUNTPOINT [fuse options]
 *
 * Every file of BACKING_DIR appears at MOUNTPOINT. Files are opened with FUSE direct I/O (no
 * page cache in the way), requests are served by many threads and the kernel may keep many in
 * the background, so delayed requests overlap as they do on a device with a queue.
 *
 * The delay is read from and set through the virtual file MOUNTPOINT/.delay, which holds
 * "READ_US WRITE_US [SHARE_PPM]": `echo "20000 0" > MOUNTPOINT/.delay` makes every read take
 * 20 ms more from then on, while the file system is in use; `echo "20000 0 100000"` delays one
 * request in ten (a bimodal device: 10% of its I/Os at 20 ms more, the rest untouched).
 *
 * The share is of FUSE requests, counted per direction: every (1/share)-th request, spread
 * evenly, so the share is exact over any run of requests. The kernel splits a request above
 * 128 KiB (FUSE's max_pages) into several, so the share equals the share of block I/Os only
 * for I/Os of 128 KiB or less; a larger block I/O is delayed if any of its pieces is.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

static char backing[PATH_MAX];
static atomic_long read_delay_us;
static atomic_long write_delay_us;
/* Delayed requests per million; the counters number each direction's requests. */
#define PPM 1000000L
static atomic_long share_ppm = PPM;
static atomic_ulong read_count;
static atomic_ulong write_count;
static const char CONTROL[] = "/.delay";
#define CONTROL_FH ((uint64_t)-1)

static int full_path(char *out, const char *path) {
    if (snprintf(out, PATH_MAX, "%s%s", backing, path) >= PATH_MAX) return -ENAMETOOLONG;
    return 0;
}

static void sleep_us(long us) {
    if (us <= 0) return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static int control_text(char *buf, size_t size) {
    return snprintf(buf, size, "%ld %ld %ld\n", atomic_load(&read_delay_us),
                    atomic_load(&write_delay_us), atomic_load(&share_ppm));
}

/* Whether request number n of a direction is delayed: the n-th crosses a multiple of PPM
 * when share*n does, so `share` of any run of requests is. */
static int chosen(atomic_ulong *count) {
    long share = atomic_load(&share_ppm);
    if (share >= PPM) return 1;
    unsigned long n = atomic_fetch_add(count, 1);
    return (n + 1) * (unsigned long)share / PPM != n * (unsigned long)share / PPM;
}

static void *d_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    cfg->direct_io = 1;
    cfg->use_ino = 0;
    cfg->attr_timeout = 0;
    cfg->entry_timeout = 0;
    cfg->negative_timeout = 0;
    conn->max_background = 256;
    conn->congestion_threshold = 192;
    return NULL;
}

static int d_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    (void)fi;
    if (strcmp(path, CONTROL) == 0) {
        char buf[64];
        memset(st, 0, sizeof(*st));
        st->st_mode = S_IFREG | 0644;
        st->st_nlink = 1;
        st->st_size = control_text(buf, sizeof buf);
        return 0;
    }
    char p[PATH_MAX];
    int e = full_path(p, path);
    if (e) return e;
    return lstat(p, st) == -1 ? -errno : 0;
}

static int d_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                     struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off, (void)fi, (void)flags;
    char p[PATH_MAX];
    int e = full_path(p, path);
    if (e) return e;
    DIR *dir = opendir(p);
    if (!dir) return -errno;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        if (fill(buf, de->d_name, NULL, 0, 0)) break;
    }
    closedir(dir);
    return 0;
}

static int d_open(const char *path, struct fuse_file_info *fi) {
    fi->direct_io = 1;
    if (strcmp(path, CONTROL) == 0) {
        fi->fh = CONTROL_FH;
        return 0;
    }
    char p[PATH_MAX];
    int e = full_path(p, path);
    if (e) return e;
    int fd = open(p, fi->flags & ~(O_DIRECT | O_CREAT | O_EXCL | O_NOCTTY));
    if (fd == -1) return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int d_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    int e = full_path(p, path);
    if (e) return e;
    int fd = open(p, (fi->flags & ~O_DIRECT) | O_CREAT, mode);
    if (fd == -1) return -errno;
    fi->direct_io = 1;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int d_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    if (fi->fh == CONTROL_FH) {
        char text[64];
        int n = control_text(text, sizeof text);
        if (off >= n) return 0;
        size_t len = (size_t)(n - off) < size ? (size_t)(n - off) : size;
        memcpy(buf, text + off, len);
        return (int)len;
    }
    if (chosen(&read_count)) sleep_us(atomic_load(&read_delay_us));
    ssize_t n = pread((int)fi->fh, buf, size, off);
    return n == -1 ? -errno : (int)n;
}

static int d_write(const char *path, const char *buf, size_t size, off_t off,
                   struct fuse_file_info *fi) {
    (void)path;
    if (fi->fh == CONTROL_FH) {
        char text[64];
        size_t len = size < sizeof text - 1 ? size : sizeof text - 1;
        memcpy(text, buf, len);
        text[len] = '\0';
        long r, w, share = PPM;
        int got = sscanf(text, "%ld %ld %ld", &r, &w, &share);
        if (got < 2 || r < 0 || w < 0 || share < 0 || share > PPM) return -EINVAL;
        atomic_store(&read_delay_us, r);
        atomic_store(&write_delay_us, w);
        atomic_store(&share_ppm, share);
        return (int)size;
    }
    if (chosen(&write_count)) sleep_us(atomic_load(&write_delay_us));
    ssize_t n = pwrite((int)fi->fh, buf, size, off);
    return n == -1 ? -errno : (int)n;
}

static int d_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
    if (strcmp(path, CONTROL) == 0) return 0;
    if (fi != NULL && fi->fh != CONTROL_FH) return ftruncate((int)fi->fh, size) == -1 ? -errno : 0;
    char p[PATH_MAX];
    int e = full_path(p, path);
    if (e) return e;
    return truncate(p, size) == -1 ? -errno : 0;
}

static int d_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
    (void)path;
    if (fi->fh == CONTROL_FH) return 0;
    int r = datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh);
    return r == -1 ? -errno : 0;
}

static int d_fallocate(const char *path, int mode, off_t off, off_t len,
                       struct fuse_file_info *fi) {
    (void)path;
    if (fi->fh == CONTROL_FH) return -EOPNOTSUPP;
    return fallocate((int)fi->fh, mode, off, len) == -1 ? -errno : 0;
}

static int d_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    if (fi->fh != CONTROL_FH) close((int)fi->fh);
    return 0;
}

static int d_unlink(const char *path) {
    char p[PATH_MAX];
    int e = full_path(p, path);
    if (e) return e;
    return unlink(p) == -1 ? -errno : 0;
}

static int d_mkdir(const char *path, mode_t mode) {
    char p[PATH_MAX];
    int e = full_path(p, path);
    if (e) return e;
    return mkdir(p, mode) == -1 ? -errno : 0;
}

static int d_rmdir(const char *path) {
    char p[PATH_MAX];
    int e = full_path(p, path);
    if (e) return e;
    return rmdir(p) == -1 ? -errno : 0;
}

static int d_statfs(const char *path, struct statvfs *st) {
    (void)path;
    return statvfs(backing, st) == -1 ? -errno : 0;
}

static const struct fuse_operations ops = {
    .init = d_init,
    .getattr = d_getattr,
    .readdir = d_readdir,
    .open = d_open,
    .create = d_create,
    .read = d_read,
    .write = d_write,
    .truncate = d_truncate,
    .fsync = d_fsync,
    .fallocate = d_fallocate,
    .release = d_release,
    .unlink = d_unlink,
    .mkdir = d_mkdir,
    .rmdir = d_rmdir,
    .statfs = d_statfs,
};

int main(int argc, char *argv[]) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s BACKING_DIR MOUNTPOINT [fuse options]\n", argv[0]);
        return 2;
    }
    if (realpath(argv[1], backing) == NULL) {
        perror(argv[1]);
        return 1;
    }
    /* fuse_main sees: prog MOUNTPOINT [options] */
    argv[1] = argv[0];
    return fuse_main(argc - 1, argv + 1, &ops, NULL);
}
