/*
 * Drives libbenchfs the way IOR does, as several MPI ranks against a running cluster:
 *   1. file per process: create, pwrite 1 MiB transfers at offsets, fsync, close, open,
 *      pread and verify every byte, stat, then read a neighbour's file, readdir, remove;
 *   2. one shared file, rank-strided segments (IOR -s N without -F), verified by every rank;
 *   3. bad input and namespace errors (NULL and relative paths, ENOENT, EEXIST, ...);
 *   4. two pthreads per rank doing I/O on different files at once, verified.
 * Usage: benchfs_mpi_test REGISTRY_DIR CONFIG_FILE [TAG]
 * Prints "rank R: ok ..." per rank and, from rank 0, "benchfs_mpi_test: OK ranks=N
 * bytes_verified=B"; any failure prints "FAIL" with the errno and message, and aborts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <mpi.h>

#include <benchfs.h>

#define XFER (1 << 20)          /* IOR's transfer size */
#define FPP_XFERS 4             /* transfers per file-per-process file */
#define BLOCK (2 * XFER)        /* IOR's block size in the shared file */
#define SEGMENTS 2              /* IOR's segment count in the shared file */
#define THREAD_XFERS 3

static int rank, nranks;
static char root[256];
static uint64_t verified; /* bytes checked byte for byte on this rank (main thread) */

#define FAIL(...)                                                                          \
    do {                                                                                   \
        fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__);                \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fprintf(stderr, " [last error: %s]\n", benchfs_last_error());                      \
        fflush(stderr);                                                                    \
        MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
    } while (0)

/* rc must equal want (0, a byte count, or a negative errno). */
#define EXPECT(call, want)                                                                 \
    do {                                                                                   \
        long long rc_ = (long long)(call);                                                 \
        long long want_ = (long long)(want);                                               \
        if (rc_ != want_)                                                                  \
            FAIL("%s returned %lld (%s), expected %lld", #call, rc_,                       \
                 rc_ < 0 ? strerror((int)-rc_) : "not an error", want_);                   \
    } while (0)

/* The pattern: every 8-byte word names its writer's seed and its file offset. */
static void fill(unsigned char *buf, size_t len, uint64_t seed, uint64_t offset)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t word = ((seed + 1) * 0x9E3779B97F4A7C15ull) ^ (offset + i);
        memcpy(buf + i, &word, 8);
    }
}

static void verify(const unsigned char *got, size_t len, uint64_t seed, uint64_t offset,
                   const char *what)
{
    static unsigned char want[XFER];
    for (size_t done = 0; done < len; done += XFER) {
        size_t n = len - done < XFER ? len - done : XFER;
        fill(want, n, seed, offset + done);
        if (memcmp(got + done, want, n) != 0) {
            size_t at = 0;
            while (got[done + at] == want[at])
                at++;
            FAIL("%s: byte %" PRIu64 " differs (got 0x%02x, want 0x%02x)", what,
                 offset + done + at, got[done + at], want[at]);
        }
    }
    verified += len;
}

static void write_xfers(benchfs_file *f, uint64_t seed, const uint64_t *offsets, int n)
{
    static unsigned char buf[XFER];
    for (int i = 0; i < n; i++) {
        fill(buf, XFER, seed, offsets[i]);
        EXPECT(benchfs_pwrite(f, buf, XFER, (int64_t)offsets[i]), XFER);
    }
}

static void read_verify(benchfs_file *f, uint64_t seed, uint64_t offset, const char *what)
{
    static unsigned char buf[XFER];
    EXPECT(benchfs_pread(f, buf, XFER, (int64_t)offset), XFER);
    verify(buf, XFER, seed, offset, what);
}

static int count_entry(void *arg, const char *name, int type)
{
    if (strncmp(name, "rank-", 5) == 0 && type == BENCHFS_DT_REG)
        ++*(int *)arg;
    return 0;
}

static int stop_at_first(void *arg, const char *name, int type)
{
    (void)type;
    snprintf((char *)arg, 64, "%s", name);
    return 7;
}

static void file_per_process(void)
{
    char path[300], other[300];
    snprintf(path, sizeof path, "%s/rank-%d.dat", root, rank);
    benchfs_file *f = NULL;

    EXPECT(benchfs_create(path, O_WRONLY | O_EXCL, 0644, &f), 0);
    uint64_t offsets[FPP_XFERS];
    for (int i = 0; i < FPP_XFERS; i++) /* IOR -z order: not sequential */
        offsets[i] = (uint64_t)((i * 3) % FPP_XFERS) * XFER;
    write_xfers(f, (uint64_t)rank, offsets, FPP_XFERS);
    EXPECT(benchfs_fsync(f), 0);
    EXPECT(benchfs_close(f), 0);

    EXPECT(benchfs_open(path, O_RDONLY, &f), 0);
    for (int i = 0; i < FPP_XFERS; i++)
        read_verify(f, (uint64_t)rank, (uint64_t)i * XFER, "own file");
    /* At the end: short, then nothing. */
    static unsigned char tail[XFER];
    EXPECT(benchfs_pread(f, tail, XFER, (int64_t)FPP_XFERS * XFER - 4096), 4096);
    verify(tail, 4096, (uint64_t)rank, (uint64_t)FPP_XFERS * XFER - 4096, "tail");
    EXPECT(benchfs_pread(f, tail, XFER, (int64_t)FPP_XFERS * XFER), 0);
    EXPECT(benchfs_close(f), 0);

    struct benchfs_stat st;
    EXPECT(benchfs_stat(path, &st), 0);
    if (st.size != (uint64_t)FPP_XFERS * XFER || !S_ISREG(st.mode) || (st.mode & 0777) != 0644)
        FAIL("stat %s: size %" PRIu64 " mode %o", path, st.size, st.mode);
    struct benchfs_statfs sf;
    EXPECT(benchfs_statfs(&sf), 0);
    if (sf.servers == 0 || sf.unreachable != 0 || sf.total_bytes == 0 || sf.free_bytes > sf.total_bytes
        || sf.avail_bytes > sf.free_bytes || sf.files < 2 || sf.reserved != 0)
        FAIL("statfs: %u servers (%u unreachable), %" PRIu64 " of %" PRIu64 " free, %" PRIu64 " files",
             sf.servers, sf.unreachable, sf.free_bytes, sf.total_bytes, sf.files);
    if (st.chunk_size == 0 || st.stripe_count == 0)
        FAIL("stat %s: no layout (chunk %" PRIu64 ", stripes %u)", path, st.chunk_size,
             st.stripe_count);

    /* The servers' checksum of the file: one hash per chunk; the neighbour's of the same
     * file, sent over, must be the same (tests/test_capi.py checks the values with xxhash). */
    enum { MAX_HASHES = 64 };
    static uint8_t mine[MAX_HASHES][16], theirs[MAX_HASHES][16];
    uint64_t chunk = 0;
    size_t count = 0, expected = (size_t)((st.size + st.chunk_size - 1) / st.chunk_size);
    EXPECT(benchfs_checksum(path, &chunk, NULL, 0, &count), 0);
    if (chunk != st.chunk_size || count != expected || count > MAX_HASHES)
        FAIL("checksum %s: %zu ranges of %" PRIu64 " bytes", path, count, chunk);
    EXPECT(benchfs_checksum(path, &chunk, &mine[0][0], MAX_HASHES, &count), 0);
    EXPECT(benchfs_checksum(path, NULL, NULL, 1, NULL), -EFAULT);
    EXPECT(benchfs_checksum(root, NULL, NULL, 0, NULL), -EISDIR);

    /* Another client's view (close-to-open): the neighbour's file, after everyone closed. */
    MPI_Barrier(MPI_COMM_WORLD);
    int next = (rank + 1) % nranks;
    snprintf(other, sizeof other, "%s/rank-%d.dat", root, next);
    size_t other_count = 0;
    EXPECT(benchfs_checksum(other, NULL, &theirs[0][0], MAX_HASHES, &other_count), 0);
    /* Rank r computed its own file's checksum, and r - 1 that same file's: send ours back. */
    static uint8_t own_of_next[MAX_HASHES][16];
    MPI_Sendrecv(mine, MAX_HASHES * 16, MPI_BYTE, (rank + nranks - 1) % nranks, 7, own_of_next,
                 MAX_HASHES * 16, MPI_BYTE, next, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (other_count != count || memcmp(theirs, own_of_next, count * 16) != 0)
        FAIL("checksum of %s differs between two clients", other);
    /* A short line per hash, each written at once: mpiexec interleaves the ranks' output,
     * and a long line could be cut by another rank's. */
    for (size_t i = 0; i < count; i++) {
        char hex[33];
        for (int b = 0; b < 16; b++)
            snprintf(hex + 2 * b, 3, "%02x", mine[i][b]);
        printf("checksum rank %d range %zu %s\n", rank, i, hex);
        fflush(stdout);
    }
    EXPECT(benchfs_open(other, O_RDONLY, &f), 0);
    for (int i = 0; i < FPP_XFERS; i++)
        read_verify(f, (uint64_t)next, (uint64_t)i * XFER, "neighbour's file");
    EXPECT(benchfs_close(f), 0);

    int found = 0;
    EXPECT(benchfs_readdir(root, count_entry, &found), 0);
    if (found != nranks)
        FAIL("readdir %s: %d rank files, expected %d", root, found, nranks);
    char first[64] = "";
    EXPECT(benchfs_readdir(root, stop_at_first, first), 7);
    if (first[0] == 0)
        FAIL("readdir callback saw no name");

    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT(benchfs_unlink(path), 0);
    EXPECT(benchfs_stat(path, &st), -ENOENT);
}

static void shared_file(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/shared.dat", root);
    benchfs_file *f = NULL;
    if (rank == 0) {
        EXPECT(benchfs_create(path, O_RDWR | O_EXCL, 0600, &f), 0);
        EXPECT(benchfs_close(f), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* IOR's shared-file layout: segment s, rank r owns [(s*N + r)*BLOCK, +BLOCK). */
    EXPECT(benchfs_open(path, O_RDWR, &f), 0);
    uint64_t offsets[SEGMENTS * (BLOCK / XFER)];
    int n = 0;
    for (int s = 0; s < SEGMENTS; s++)
        for (int x = 0; x < BLOCK / XFER; x++)
            offsets[n++] = ((uint64_t)s * nranks + rank) * BLOCK + (uint64_t)x * XFER;
    write_xfers(f, 100 + (uint64_t)rank, offsets, n);
    EXPECT(benchfs_fsync(f), 0);
    EXPECT(benchfs_close(f), 0);
    MPI_Barrier(MPI_COMM_WORLD);

    /* Every rank reads the whole file back, each block checked against its writer. */
    uint64_t size = (uint64_t)SEGMENTS * nranks * BLOCK;
    struct benchfs_stat st;
    EXPECT(benchfs_stat(path, &st), 0);
    if (st.size != size)
        FAIL("shared file size %" PRIu64 ", expected %" PRIu64, st.size, size);
    EXPECT(benchfs_open(path, O_RDONLY, &f), 0);
    for (uint64_t off = 0; off < size; off += XFER) {
        uint64_t writer = (off / BLOCK) % (uint64_t)nranks;
        read_verify(f, 100 + writer, off, "shared file");
    }
    EXPECT(benchfs_close(f), 0);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        EXPECT(benchfs_unlink(path), 0);
}

static void bad_input(void)
{
    char path[300], dir[300], moved[300];
    benchfs_file *f = (benchfs_file *)&f; /* must be cleared on failure */
    snprintf(path, sizeof path, "%s/errors-%d", root, rank);
    snprintf(dir, sizeof dir, "%s/dir-%d", root, rank);
    snprintf(moved, sizeof moved, "%s/moved-%d", root, rank);

    EXPECT(benchfs_open(NULL, O_RDONLY, &f), -EINVAL);
    if (f != NULL)
        FAIL("a failed open left *out set");
    EXPECT(benchfs_open("relative/path", O_RDONLY, &f), -EINVAL);
    if (benchfs_last_error()[0] == 0)
        FAIL("no message after a failed call");
    EXPECT(benchfs_create("no-slash", 0, 0644, &f), -EINVAL);
    EXPECT(benchfs_stat(NULL, NULL), -EINVAL);
    EXPECT(benchfs_statfs(NULL), -EFAULT);
    EXPECT(benchfs_open(path, O_RDONLY, &f), -ENOENT);
    EXPECT(benchfs_open(path, O_RDONLY, NULL), -EFAULT);
    EXPECT(benchfs_create(path, O_APPEND, 0644, &f), -EINVAL);

    EXPECT(benchfs_create(path, O_EXCL, 0644, &f), 0);
    benchfs_file *g = NULL;
    EXPECT(benchfs_create(path, O_EXCL, 0644, &g), -EEXIST);
    EXPECT(benchfs_pwrite(f, "x", 1, -1), -EINVAL);
    EXPECT(benchfs_pwrite(f, NULL, 1, 0), -EFAULT);
    EXPECT(benchfs_pwrite(NULL, "x", 1, 0), -EBADF);
    EXPECT(benchfs_pwrite(f, "0123456789", 10, 0), 10);
    EXPECT(benchfs_close(f), 0);
    EXPECT(benchfs_close(NULL), -EBADF);

    /* O_CREAT without O_EXCL opens the existing file; O_TRUNC empties it. */
    EXPECT(benchfs_open(path, O_CREAT | O_RDWR, &f), 0);
    char b[16] = {0};
    EXPECT(benchfs_pread(f, b, sizeof b, 0), 10);
    if (memcmp(b, "0123456789", 10) != 0)
        FAIL("read back %.10s", b);
    EXPECT(benchfs_close(f), 0);
    EXPECT(benchfs_truncate(path, 4), 0);
    struct benchfs_stat st;
    EXPECT(benchfs_stat(path, &st), 0);
    if (st.size != 4)
        FAIL("size after truncate: %" PRIu64, st.size);
    EXPECT(benchfs_truncate(path, -1), -EINVAL);
    EXPECT(benchfs_open(path, O_RDWR | O_TRUNC, &f), 0);
    EXPECT(benchfs_close(f), 0);
    EXPECT(benchfs_stat(path, &st), 0);
    if (st.size != 0)
        FAIL("size after O_TRUNC: %" PRIu64, st.size);

    EXPECT(benchfs_mkdir(dir, 0755), 0);
    EXPECT(benchfs_mkdir(dir, 0755), -EEXIST);
    EXPECT(benchfs_stat(dir, &st), 0);
    if (!S_ISDIR(st.mode))
        FAIL("%s is not a directory: mode %o", dir, st.mode);
    EXPECT(benchfs_rename(path, moved), 0);
    EXPECT(benchfs_stat(path, &st), -ENOENT);
    EXPECT(benchfs_unlink(dir), -EISDIR);
    EXPECT(benchfs_rmdir(moved), -ENOTDIR);
    EXPECT(benchfs_readdir(dir, NULL, NULL), -EFAULT);
    EXPECT(benchfs_unlink(moved), 0);
    EXPECT(benchfs_unlink(moved), -ENOENT);
    EXPECT(benchfs_rmdir(dir), 0);
}

struct job {
    int id;
    char path[300];
    uint64_t bytes;
    char error[256];
};

/* One thread's file: write, fsync, close, open, read, verify, unlink. Reports, never aborts. */
static void *thread_io(void *arg)
{
    struct job *j = arg;
    unsigned char *buf = malloc(XFER), *want = malloc(XFER);
    benchfs_file *f = NULL;
    long long rc;
    uint64_t seed = 1000 + (uint64_t)rank * 10 + (uint64_t)j->id;
    if (buf == NULL || want == NULL) {
        snprintf(j->error, sizeof j->error, "out of memory");
        goto out;
    }
#define TRY(call)                                                                          \
    if ((rc = (long long)(call)) < 0) {                                                    \
        snprintf(j->error, sizeof j->error, "%s: %s (%s)", #call, strerror((int)-rc),      \
                 benchfs_last_error());                                                    \
        goto out;                                                                          \
    }
    TRY(benchfs_create(j->path, O_EXCL | O_WRONLY, 0644, &f));
    for (int i = 0; i < THREAD_XFERS; i++) {
        fill(buf, XFER, seed, (uint64_t)i * XFER);
        TRY(benchfs_pwrite(f, buf, XFER, (int64_t)i * XFER));
    }
    TRY(benchfs_fsync(f));
    rc = benchfs_close(f);
    f = NULL;
    TRY(rc);
    TRY(benchfs_open(j->path, O_RDONLY, &f));
    for (int i = 0; i < THREAD_XFERS; i++) {
        TRY(benchfs_pread(f, buf, XFER, (int64_t)i * XFER));
        fill(want, XFER, seed, (uint64_t)i * XFER);
        if (rc != XFER || memcmp(buf, want, XFER) != 0) {
            snprintf(j->error, sizeof j->error, "transfer %d: %lld bytes, content differs", i,
                     rc);
            goto out;
        }
        j->bytes += XFER;
    }
    rc = benchfs_close(f);
    f = NULL;
    TRY(rc);
    TRY(benchfs_unlink(j->path));
#undef TRY
out:
    if (f != NULL)
        benchfs_close(f);
    free(buf);
    free(want);
    return NULL;
}

static void two_threads(void)
{
    struct job jobs[2];
    pthread_t tids[2];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < 2; i++) {
        jobs[i].id = i;
        snprintf(jobs[i].path, sizeof jobs[i].path, "%s/thread-%d-%d.dat", root, rank, i);
        if (pthread_create(&tids[i], NULL, thread_io, &jobs[i]) != 0)
            FAIL("pthread_create");
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(tids[i], NULL);
        if (jobs[i].error[0] != 0)
            FAIL("thread %d: %s", i, jobs[i].error);
        verified += jobs[i].bytes;
    }
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (argc < 3) {
        if (rank == 0)
            fprintf(stderr, "usage: %s REGISTRY_DIR CONFIG_FILE [TAG]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    snprintf(root, sizeof root, "/capi-%s", argc > 3 ? argv[3] : "test");

    /* Before init: every call fails cleanly. */
    struct benchfs_stat st;
    EXPECT(benchfs_stat("/", &st), -ESHUTDOWN);

    const char *overrides[] = {"client.max_inflight=16", NULL};
    EXPECT(benchfs_init(argv[1], argv[2], overrides, 2), 0);
    EXPECT(benchfs_init(argv[1], argv[2], overrides, 2), -EALREADY);

    if (rank == 0)
        EXPECT(benchfs_mkdir(root, 0755), 0);
    MPI_Barrier(MPI_COMM_WORLD);

    file_per_process();
    shared_file();
    bad_input();
    two_threads();

    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        int left = 0;
        EXPECT(benchfs_readdir(root, count_entry, &left), 0);
        if (left != 0)
            FAIL("%d rank files left in %s", left, root);
        EXPECT(benchfs_rmdir(root), 0);
    }

    EXPECT(benchfs_finalize(), 0);
    EXPECT(benchfs_stat("/", &st), -ESHUTDOWN);
    EXPECT(benchfs_finalize(), -ESHUTDOWN);

    printf("rank %d: ok (%" PRIu64 " bytes verified)\n", rank, verified);
    fflush(stdout);
    unsigned long long mine = verified, total = 0;
    MPI_Reduce(&mine, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("benchfs_mpi_test: OK ranks=%d bytes_verified=%llu\n", nranks, total);
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
