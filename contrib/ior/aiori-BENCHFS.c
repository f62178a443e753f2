/*
 * aiori-BENCHFS.c - IOR/mdtest backend for BenchFS, thin over libbenchfs (benchfs.h).
 *
 * Written against IOR's AIORI interface as of hpc/ior commit 5fcf0ba995fd (2026-04-03, IOR
 * 4.x; src/aiori.h: ior_aiori_t with create, mknod, open, xfer_hints, xfer, close, remove,
 * get_version, fsync, get_file_size, statfs, mkdir, rmdir, access, stat, initialize, finalize,
 * rename, get_options, check_params, sync, enable_mdtest; src/aiori-debug.h: ERR, ERRF, WARNF).
 * contrib/ior/build-ior.sh of BenchFS patches it into IOR (benchfs-ior.patch) and builds ior
 * and mdtest; docs/ior.md of BenchFS explains.
 *
 * Options (after -a BENCHFS):
 *   --benchfs.registry=DIR   registry directory of the running cluster
 *                            (default: cluster.registry_dir of the configuration, $BENCHFS_REGISTRY)
 *   --benchfs.config=FILE    BenchFS configuration file (default: $BENCHFS_CONFIG, defaults)
 *   --benchfs.chunk-size=N   layout.chunk_size (e.g. 4m; the servers' value decides)
 *   --benchfs.servers=N      cluster.expected_servers (default: from the configuration)
 * Test file names (-o, mdtest -d) are paths inside BenchFS, e.g. -o /ior/testfile; relative
 * ones (IOR's default -o testFile, mdtest's -d ./out) resolve from its root.
 *
 * Errors: a failed create/open/xfer/close/fsync/get_file_size aborts the run with the errno
 * and libbenchfs' message (as IOR's POSIX backend does); the int-returning calls (mkdir,
 * rmdir, access, stat, rename, mknod) return -1 with errno set, which mdtest reports.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <benchfs.h>

#include "ior.h"
#include "aiori.h"

typedef struct {
        char *registry;          /* --benchfs.registry */
        char *config;            /* --benchfs.config */
        long long chunk_size;    /* --benchfs.chunk-size, 0: from the configuration */
        int servers;             /* --benchfs.servers, 0: from the configuration */
} benchfs_options_t;

static aiori_xfer_hint_t *hints = NULL;
/* IOR may call initialize once per test; the library is initialized once. */
static int init_count = 0;

static int dry_run(void)
{
        return hints != NULL && hints->dryRun;
}

/* The handle IOR carries: aiori_fd_t is opaque to IOR. */
static benchfs_file *file_of(aiori_fd_t *fd)
{
        return (benchfs_file *)fd;
}

#define BENCHFS_ERR(RC, FORMAT, ...)                                                     \
        ERRF(FORMAT ": %s (%s)", __VA_ARGS__, strerror((int)-(RC)), benchfs_last_error())

/* A path inside BenchFS: BenchFS has no working directory, so a relative name (IOR's default
 * -o testFile, mdtest's default -d ./out) resolves from its root, as for a process whose
 * working directory is "/". `buf` holds PATH_MAX + 2 bytes; a longer name is passed on as it
 * is, and the library refuses it (relative, or ENAMETOOLONG). */
#define ABSOLUTE_BUF (PATH_MAX + 2)
static const char *absolute(const char *path, char *buf)
{
        int n;
        if (path[0] == '/')
                return path;
        n = snprintf(buf, ABSOLUTE_BUF, "/%s", path);
        return n > 0 && n < ABSOLUTE_BUF ? buf : path;
}

/* For the int-returning calls: -1 with errno set, the POSIX convention mdtest expects. */
static int posix_result(int rc)
{
        if (rc < 0) {
                errno = -rc;
                return -1;
        }
        return 0;
}

static option_help *BENCHFS_options(aiori_mod_opt_t **init_backend_options,
                                    aiori_mod_opt_t *init_values)
{
        benchfs_options_t *o = malloc(sizeof(*o));
        if (o == NULL)
                ERR("out of memory");
        if (init_values != NULL)
                memcpy(o, init_values, sizeof(*o));
        else
                memset(o, 0, sizeof(*o));
        *init_backend_options = (aiori_mod_opt_t *)o;

        option_help h[] = {
            {0, "benchfs.registry", "Registry directory of the cluster (default: $BENCHFS_REGISTRY)",
             OPTION_OPTIONAL_ARGUMENT, 's', &o->registry},
            {0, "benchfs.config", "BenchFS configuration file (default: $BENCHFS_CONFIG)",
             OPTION_OPTIONAL_ARGUMENT, 's', &o->config},
            {0, "benchfs.chunk-size", "layout.chunk_size in bytes, e.g. 4m (0: configuration)",
             OPTION_OPTIONAL_ARGUMENT, 'l', &o->chunk_size},
            {0, "benchfs.servers", "cluster.expected_servers (0: configuration)",
             OPTION_OPTIONAL_ARGUMENT, 'd', &o->servers},
            LAST_OPTION};
        option_help *help = malloc(sizeof(h));
        if (help == NULL)
                ERR("out of memory");
        memcpy(help, h, sizeof(h));
        return help;
}

static int BENCHFS_check_params(aiori_mod_opt_t *options)
{
        benchfs_options_t *o = (benchfs_options_t *)options;
        /* A missing registry is reported by benchfs_init, which also looks at the config. */
        if (o->chunk_size < 0 || o->servers < 0) {
                fprintf(out_logfile, "ERROR: --benchfs.chunk-size and --benchfs.servers "
                                     "must not be negative\n");
                return 1;
        }
        return 0;
}

static void BENCHFS_initialize(aiori_mod_opt_t *options)
{
        benchfs_options_t *o = (benchfs_options_t *)options;
        char chunk[64], servers[64];
        const char *overrides[3];
        int n = 0, rc;

        if (init_count++ > 0)
                return;
        if (BENCHFS_check_params(options) != 0)
                ERR("invalid BENCHFS options");
        if (o->chunk_size > 0) {
                snprintf(chunk, sizeof(chunk), "layout.chunk_size=%lld", o->chunk_size);
                overrides[n++] = chunk;
        }
        if (o->servers > 0) {
                snprintf(servers, sizeof(servers), "cluster.expected_servers=%d", o->servers);
                overrides[n++] = servers;
        }
        overrides[n] = NULL;
        /* One client per rank: IOR does one transfer at a time. */
        rc = benchfs_init(o->registry, o->config, overrides, 1);
        if (rc < 0)
                BENCHFS_ERR(rc, "benchfs_init(\"%s\")",
                            o->registry != NULL ? o->registry : "$BENCHFS_REGISTRY");
}

static void BENCHFS_finalize(aiori_mod_opt_t *options)
{
        int rc;
        (void)options;
        if (init_count <= 0 || --init_count > 0)
                return;
        rc = benchfs_finalize();
        if (rc < 0)
                BENCHFS_ERR(rc, "benchfs_finalize%s", "()");
}

static void BENCHFS_xfer_hints(aiori_xfer_hint_t *params)
{
        hints = params;
}

static int open_flags(int iorflags)
{
        int flags = 0;
        if (iorflags & IOR_RDONLY)
                flags |= O_RDONLY;
        if (iorflags & IOR_WRONLY)
                flags |= O_WRONLY;
        if (iorflags & IOR_RDWR)
                flags |= O_RDWR;
        if (iorflags & IOR_APPEND)
                flags |= O_APPEND; /* refused by libbenchfs: I/O is positional */
        if (iorflags & IOR_CREAT)
                flags |= O_CREAT;
        if (iorflags & IOR_TRUNC)
                flags |= O_TRUNC;
        if (iorflags & IOR_EXCL)
                flags |= O_EXCL;
        /* IOR_DIRECT needs nothing: BenchFS clients have no page cache to bypass. */
        return flags;
}

static aiori_fd_t *BENCHFS_create(char *path, int iorflags, aiori_mod_opt_t *options)
{
        benchfs_file *f = NULL;
        int rc;
        (void)options;
        if (dry_run())
                return NULL;
        char name[ABSOLUTE_BUF];
        rc = benchfs_create(absolute(path, name), open_flags(iorflags), 0664, &f);
        if (rc < 0)
                BENCHFS_ERR(rc, "cannot create \"%s\"", path);
        return (aiori_fd_t *)f;
}

static int BENCHFS_mknod(char *path)
{
        benchfs_file *f = NULL;
        int rc;
        if (dry_run())
                return 0;
        char name[ABSOLUTE_BUF];
        rc = benchfs_create(absolute(path, name), O_WRONLY | O_EXCL, 0664, &f);
        if (rc < 0)
                return posix_result(rc);
        return posix_result(benchfs_close(f));
}

static aiori_fd_t *BENCHFS_open(char *path, int iorflags, aiori_mod_opt_t *options)
{
        benchfs_file *f = NULL;
        int rc;
        (void)options;
        if (dry_run())
                return NULL;
        char name[ABSOLUTE_BUF];
        rc = benchfs_open(absolute(path, name), open_flags(iorflags), &f);
        if (rc < 0)
                BENCHFS_ERR(rc, "cannot open \"%s\"", path);
        return (aiori_fd_t *)f;
}

static IOR_offset_t BENCHFS_xfer(int access, aiori_fd_t *fd, IOR_size_t *buffer,
                                 IOR_offset_t length, IOR_offset_t offset,
                                 aiori_mod_opt_t *options)
{
        ssize_t n;
        (void)options;
        if (dry_run())
                return length;
        if (length < 0 || offset < 0)
                ERRF("invalid transfer: %lld bytes at offset %lld", length, offset);
        if (access == WRITE)
                n = benchfs_pwrite(file_of(fd), buffer, (size_t)length, (int64_t)offset);
        else
                n = benchfs_pread(file_of(fd), buffer, (size_t)length, (int64_t)offset);
        if (n < 0)
                BENCHFS_ERR(n, "%s of %lld bytes at offset %lld failed",
                            access == WRITE ? "write" : "read", length, offset);
        return (IOR_offset_t)n;
}

static void BENCHFS_fsync(aiori_fd_t *fd, aiori_mod_opt_t *options)
{
        int rc;
        (void)options;
        if (dry_run())
                return;
        rc = benchfs_fsync(file_of(fd));
        if (rc < 0)
                BENCHFS_ERR(rc, "fsync failed%s", "");
}

static void BENCHFS_close(aiori_fd_t *fd, aiori_mod_opt_t *options)
{
        int rc;
        (void)options;
        if (dry_run())
                return;
        rc = benchfs_close(file_of(fd));
        if (rc < 0)
                BENCHFS_ERR(rc, "close failed%s", "");
}

static void BENCHFS_remove(char *path, aiori_mod_opt_t *options)
{
        int rc;
        (void)options;
        if (dry_run())
                return;
        char name[ABSOLUTE_BUF];
        rc = benchfs_unlink(absolute(path, name));
        if (rc < 0)
                WARNF("cannot remove \"%s\": %s (%s)", path, strerror(-rc),
                      benchfs_last_error());
}

static char *BENCHFS_get_version(void)
{
        return (char *)benchfs_version();
}

static IOR_offset_t BENCHFS_get_file_size(aiori_mod_opt_t *options, char *path)
{
        struct benchfs_stat st;
        int rc;
        (void)options;
        if (dry_run())
                return 0;
        char name[ABSOLUTE_BUF];
        rc = benchfs_stat(absolute(path, name), &st);
        if (rc < 0)
                BENCHFS_ERR(rc, "cannot stat \"%s\"", path);
        return (IOR_offset_t)st.size;
}

/* The cluster's capacity (benchfs_statfs), in 4 KiB blocks. */
static int BENCHFS_statfs(const char *path, ior_aiori_statfs_t *buf, aiori_mod_opt_t *options)
{
        struct benchfs_statfs st;
        const uint64_t bsize = 4096;
        (void)path;
        (void)options;
        memset(buf, 0, sizeof(*buf));
        if (dry_run())
                return 0;
        if (posix_result(benchfs_statfs(&st)) < 0)
                return -1;
        buf->f_bsize = bsize;
        buf->f_blocks = st.total_bytes / bsize;
        buf->f_bfree = st.free_bytes / bsize;
        buf->f_bavail = st.avail_bytes / bsize;
        /* BenchFS allocates names without limit: files in use plus UINT32_MAX free. */
        buf->f_ffree = UINT32_MAX;
        buf->f_files = st.files + buf->f_ffree;
        return 0;
}

static int BENCHFS_mkdir(const char *path, mode_t mode, aiori_mod_opt_t *options)
{
        (void)options;
        if (dry_run())
                return 0;
        char name[ABSOLUTE_BUF];
        return posix_result(benchfs_mkdir(absolute(path, name), mode));
}

static int BENCHFS_rmdir(const char *path, aiori_mod_opt_t *options)
{
        (void)options;
        if (dry_run())
                return 0;
        char name[ABSOLUTE_BUF];
        return posix_result(benchfs_rmdir(absolute(path, name)));
}

/* Existence only: BenchFS has no permission checks, so every mode is granted. */
static int BENCHFS_access(const char *path, int mode, aiori_mod_opt_t *options)
{
        struct benchfs_stat st;
        (void)mode;
        (void)options;
        if (dry_run())
                return 0;
        char name[ABSOLUTE_BUF];
        return posix_result(benchfs_stat(absolute(path, name), &st));
}

static int BENCHFS_stat(const char *path, struct stat *buf, aiori_mod_opt_t *options)
{
        struct benchfs_stat st;
        uint64_t ino = 0;
        int rc;
        (void)options;
        if (dry_run())
                return 0;
        char name[ABSOLUTE_BUF];
        rc = benchfs_stat(absolute(path, name), &st);
        if (rc < 0)
                return posix_result(rc);
        memset(buf, 0, sizeof(*buf));
        for (int i = 0; i < 8; i++)
                ino = (ino << 8) | (uint64_t)(st.id[i] ^ st.id[8 + i]);
        buf->st_ino = (ino_t)ino;
        buf->st_mode = (mode_t)st.mode;
        buf->st_nlink = S_ISDIR(st.mode) ? 2 : 1;
        buf->st_uid = getuid();
        buf->st_gid = getgid();
        buf->st_size = (off_t)st.size;
        buf->st_blksize = st.chunk_size > 0 ? (blksize_t)st.chunk_size : 4096;
        buf->st_blocks = (blkcnt_t)((st.size + 511) / 512);
        buf->st_mtim.tv_sec = (time_t)(st.mtime_ns / 1000000000u);
        buf->st_mtim.tv_nsec = (long)(st.mtime_ns % 1000000000u);
        buf->st_ctim.tv_sec = (time_t)(st.ctime_ns / 1000000000u);
        buf->st_ctim.tv_nsec = (long)(st.ctime_ns % 1000000000u);
        buf->st_atim = buf->st_mtim;
        return 0;
}

static int BENCHFS_rename(const char *from, const char *to, aiori_mod_opt_t *options)
{
        (void)options;
        if (dry_run())
                return 0;
        char from_buf[ABSOLUTE_BUF], to_buf[ABSOLUTE_BUF];
        return posix_result(benchfs_rename(absolute(from, from_buf), absolute(to, to_buf)));
}

/* Nothing to flush: clients cache no data or metadata (fsync is per file). */
static void BENCHFS_sync(aiori_mod_opt_t *options)
{
        (void)options;
}

ior_aiori_t benchfs_aiori = {
        .name = "BENCHFS",
        .name_legacy = NULL,
        .create = BENCHFS_create,
        .mknod = BENCHFS_mknod,
        .open = BENCHFS_open,
        .xfer_hints = BENCHFS_xfer_hints,
        .xfer = BENCHFS_xfer,
        .close = BENCHFS_close,
        .remove = BENCHFS_remove,
        .get_version = BENCHFS_get_version,
        .fsync = BENCHFS_fsync,
        .get_file_size = BENCHFS_get_file_size,
        .statfs = BENCHFS_statfs,
        .mkdir = BENCHFS_mkdir,
        .rmdir = BENCHFS_rmdir,
        .access = BENCHFS_access,
        .stat = BENCHFS_stat,
        .initialize = BENCHFS_initialize,
        .finalize = BENCHFS_finalize,
        .rename = BENCHFS_rename,
        .get_options = BENCHFS_options,
        .check_params = BENCHFS_check_params,
        .sync = BENCHFS_sync,
        .enable_mdtest = true,
};
