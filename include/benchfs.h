/*
 * benchfs.h - the C interface of the BenchFS client (libbenchfs.so).
 *
 * Build:   cc app.c $(pkg-config --cflags --libs benchfs)
 *          (add -Wl,-rpath,$(pkg-config --variable=libdir benchfs) unless the library
 *          directory is on the loader's path; docs/capi.md has the details)
 *
 * Conventions (every function):
 *   - 0 (or a byte count) on success, a negative errno value on failure: -ENOENT, -EEXIST, ...
 *     benchfs_last_error() then gives a message for the calling thread.
 *   - Paths are absolute, '/'-separated, UTF-8, inside the BenchFS namespace (not the local
 *     file system). NULL, relative or non-UTF-8 paths give -EINVAL.
 *   - NULL output pointers and NULL buffers (with a non-zero count) give -EFAULT; a NULL file
 *     handle gives -EBADF. Other invalid pointers are undefined behaviour, as in libc.
 *   - Any call before benchfs_init or after benchfs_finalize gives -ESHUTDOWN.
 *   - No call aborts or unwinds: an internal error is reported as -EIO.
 *   - Server-side errors: -ETIMEDOUT (no answer within client.request_timeout_s),
 *     -ECONNRESET (a server is gone), -EPROTO (a malformed answer or registry entry).
 *
 * Threads: all functions may be called from several threads at once. Calls on different
 * files run in parallel, up to the max_clients given to benchfs_init (each thread doing I/O
 * uses one client while the call lasts; more threads wait for a free client). Calls on the
 * same file handle are serialized; closing a handle while another thread still uses it is
 * undefined, as with close(2). benchfs_init and benchfs_finalize must not race with other
 * calls.
 *
 * Consistency: close-to-open. A handle publishes the end of its writes (the file's size as
 * others see it) at benchfs_fsync and benchfs_close; a handle always sees its own writes, and
 * a read past the size a handle knows asks the file's owner once more. Clients never cache
 * bytes. So: writers close (or fsync), then readers open (e.g. with an MPI_Barrier between).
 * docs/namespace.md describes the namespace semantics (rename, unlink of an open file, ...).
 */
#ifndef BENCHFS_H
#define BENCHFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* mode_t, ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* An open file. Opaque; made by benchfs_open/benchfs_create, freed by benchfs_close. */
typedef struct benchfs_file benchfs_file;

/* What benchfs_stat fills (64 bytes, no padding). */
struct benchfs_stat {
    uint64_t size;         /* bytes */
    uint32_t mode;         /* S_IFREG or S_IFDIR plus permission bits, as st_mode */
    uint32_t stripe_count; /* servers the file's chunks are spread over (0: directory) */
    uint64_t chunk_size;   /* bytes per chunk (0: directory) */
    uint64_t mtime_ns;     /* last data change, nanoseconds since the Unix epoch */
    uint64_t ctime_ns;     /* last status change, nanoseconds since the Unix epoch */
    uint32_t stripe_start; /* index of the server holding chunk 0 */
    uint32_t reserved;     /* zero */
    uint8_t id[16];        /* the file's 128-bit id, most significant byte first (0: dir) */
};

/* What benchfs_statfs fills (48 bytes): the cluster's capacity, summed over the servers that
 * answered, each file system holding servers' data counted once. */
struct benchfs_statfs {
    uint64_t total_bytes;  /* size of the servers' file systems */
    uint64_t free_bytes;   /* free there (used = total - free) */
    uint64_t avail_bytes;  /* free for unprivileged writers */
    uint64_t files;        /* files and directories in BenchFS */
    uint32_t servers;      /* servers in the membership */
    uint32_t unreachable;  /* servers that did not answer (left out of the sums) */
    uint64_t reserved;     /* zero */
};

/* Entry types passed to readdir callbacks (the values of Linux's DT_REG, DT_DIR, DT_LNK). */
#define BENCHFS_DT_DIR 4
#define BENCHFS_DT_REG 8
#define BENCHFS_DT_LNK 10

/*
 * Connects to the cluster whose servers registered in registry_dir (NULL: the configured
 * cluster.registry_dir, e.g. $BENCHFS_REGISTRY; -EINVAL if that is empty too), waiting up to
 * cluster.connect_timeout_s for cluster.expected_servers of them (then -ETIMEDOUT).
 *
 * The configuration resolves as everywhere in BenchFS: built-in defaults < config_path (a
 * TOML file; NULL: $BENCHFS_CONFIG if set) < BENCHFS_* environment variables < overrides.
 * overrides is NULL or a NULL-terminated array of "section.key=value" strings, e.g.
 *     const char *ov[] = {"cluster.expected_servers=4", "client.chunk_size=4194304", NULL};
 * An unknown key or bad value gives -EINVAL (see benchfs_last_error for which).
 *
 * max_clients bounds the clients (connections to every server) the library opens for
 * concurrent calls; they are created when first needed. 0 means 4; at most 64.
 *
 * Returns -EALREADY if already initialized. Call once per process (per MPI rank).
 */
int benchfs_init(const char *registry_dir, const char *config_path,
                 const char *const *overrides, unsigned max_clients);

/* Disconnects. Files still open then fail with -ESHUTDOWN (benchfs_close still frees them,
 * but their sizes are not published: close them first). -ESHUTDOWN if not initialized.
 * benchfs_init may be called again afterwards. */
int benchfs_finalize(void);

/*
 * Opens the file at path; on success *out is the handle, on failure *out is NULL.
 * flags: O_CREAT, O_EXCL (with O_CREAT: -EEXIST if the file exists) and O_TRUNC are honoured;
 * the access mode (O_RDONLY/O_WRONLY/O_RDWR), O_DIRECT and other bits are accepted and
 * ignored (there are no permission checks; I/O never goes through a page cache).
 * O_APPEND gives -EINVAL (all I/O is positional). A missing file gives -ENOENT, a missing
 * parent directory -ENOENT, a directory -EISDIR.
 */
int benchfs_open(const char *path, int flags, benchfs_file **out);

/* benchfs_open with O_CREAT added; mode's permission bits are stored (0644 is usual). */
int benchfs_create(const char *path, int flags, mode_t mode, benchfs_file **out);

/* Publishes the size this handle wrote, then frees the handle, also when it fails (the
 * handle must not be used afterwards, whatever the result). */
int benchfs_close(benchfs_file *file);

/* Writes count bytes from buf at offset; returns count or a negative errno (never short). */
ssize_t benchfs_pwrite(benchfs_file *file, const void *buf, size_t count, int64_t offset);

/* Reads up to count bytes at offset into buf; returns the bytes read: short only at the end
 * of the file, 0 at or past it. Never-written ranges inside the file read as zeros. */
ssize_t benchfs_pread(benchfs_file *file, void *buf, size_t count, int64_t offset);

/* Returns once the file's bytes are durable on the servers' devices; publishes its size. */
int benchfs_fsync(benchfs_file *file);

/* Takes (type F_RDLCK or F_WRLCK) or releases (F_UNLCK) this handle's lock on bytes
 * [start, start + len) of the file (len 0: to its end, however it grows), across every client
 * of the job (an OFD lock; benchfs_close releases them). wait != 0: waits while another
 * holder conflicts; otherwise -EAGAIN at once. A lock is a boundary: the size written is
 * published first, and nothing read ahead before it is used after it. */
int benchfs_lock(benchfs_file *file, int type, int64_t start, int64_t len, int wait);

/* Fills *st with the attributes of path (file or directory), symbolic links followed
 * (-ELOOP after 40). */
int benchfs_stat(const char *path, struct benchfs_stat *st);

/* As benchfs_stat, a symbolic link's own attributes (S_IFLNK; size: the target's length). */
int benchfs_lstat(const char *path, struct benchfs_stat *st);

/* Makes a symbolic link at path to target, kept as given: a relative target is resolved from
 * the link's directory; an absolute one is a host path, followed inside BenchFS under its
 * mount point, the interposition library's prefix or client.link_roots (elsewhere -EXDEV
 * when followed). -EEXIST if path exists. */
int benchfs_symlink(const char *target, const char *path);

/* Copies the target of the symbolic link at path into buf (not NUL-terminated, like
 * readlink(2)), at most size bytes; returns its length, or -EINVAL if path is not a link. */
ssize_t benchfs_readlink(const char *path, char *buf, size_t size);

/* Removes a file and frees its chunks on every server. -EISDIR for a directory. */
int benchfs_unlink(const char *path);

/* Creates a directory (its parent must exist). -EEXIST if path exists. */
int benchfs_mkdir(const char *path, mode_t mode);

/* Removes an empty directory: -ENOTEMPTY otherwise, -ENOTDIR for a file. */
int benchfs_rmdir(const char *path);

/*
 * Calls callback(arg, name, type) for every entry of a directory, in name order ("." and
 * ".." are not listed); type is BENCHFS_DT_REG, BENCHFS_DT_DIR or BENCHFS_DT_LNK. The listing is fetched
 * before the first callback and no lock is held during callbacks, so a callback may call
 * this library (e.g. unlink the entry). A non-zero return from the callback stops the
 * listing and is returned (use positive values to tell them from errors). name is valid
 * only during the callback. Returns 0 after the last entry, or a negative errno (the
 * callback was then not called).
 */
typedef int (*benchfs_readdir_cb)(void *arg, const char *name, int type);
int benchfs_readdir(const char *path, benchfs_readdir_cb callback, void *arg);

/*
 * A find run on the servers: every metadata owner checks the names it holds. Matches the names
 * under root (and root itself) whose last component matches the glob name (NULL: any), of type
 * (0: any, BENCHFS_DT_REG, BENCHFS_DT_DIR), with size_min <= size <= size_max and a
 * modification time after newer_ns (0: any). The matches are fetched first; then callback(arg,
 * path, type, size, mtime_ns) runs for each in path order with no lock held (NULL: counts
 * only); a non-zero return stops and is returned. *examined (names under root) and *matched
 * are set when not NULL. Returns 0, that non-zero value, or a negative errno.
 */
typedef int (*benchfs_find_cb)(void *arg, const char *path, int type, uint64_t size,
                               uint64_t mtime_ns);
int benchfs_find(const char *root, const char *name, int type, uint64_t size_min,
                 uint64_t size_max, uint64_t newer_ns, benchfs_find_cb callback, void *arg,
                 uint64_t *examined, uint64_t *matched);

/* Renames within BenchFS (data does not move). A file replaces a file, a directory an empty
 * directory; a non-empty directory gives -EXDEV. */
int benchfs_rename(const char *from, const char *to);

/* Sets a file's size: shrinking frees the chunks beyond it, growing reads back as zeros. */
int benchfs_truncate(const char *path, int64_t size);

/* The checksum of the file at path as its servers read it back from their storage: the
 * xxh3-128 of each chunk-aligned range [i * chunk_size, (i + 1) * chunk_size), the last cut at
 * the file's size, hashed on every server at once. Sets *chunk_size and *count (the number of
 * ranges; 0 for an empty file) and writes the first min(count, max) hashes to hashes, 16 bytes
 * each, most significant byte first (as xxhsum prints them). With more ranges than max, call
 * again with room for count. */
int benchfs_checksum(const char *path, uint64_t *chunk_size, uint8_t *hashes, size_t max,
                     size_t *count);

/* Fills *st with the cluster's capacity; fails only if no server answers. */
int benchfs_statfs(struct benchfs_statfs *st);

/* The message of the calling thread's last failed call ("" if none), valid until that
 * thread's next failed call. Successful calls leave it unchanged (like errno). */
const char *benchfs_last_error(void);

/* The library version, e.g. "0.1.0" (a static string). */
const char *benchfs_version(void);

#ifdef __cplusplus
}
#endif

#endif /* BENCHFS_H */
