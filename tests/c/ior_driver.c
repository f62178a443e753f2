/*
 * Runs contrib/ior/aiori-BENCHFS.c the way IOR 4.x and mdtest call a backend, against a real
 * cluster, with the stand-in IOR headers of tests/c/ior_stub (so this checks the backend's
 * logic, not IOR itself): options set through the backend's option table as IOR's parser
 * does, check_params, initialize (twice, as IOR may), xfer_hints, then IOR's
 * create/xfer/fsync/close/get_file_size/open/xfer/close/remove and mdtest's
 * mkdir/stat/access/mknod/rename/rmdir/statfs, and finalize.
 * Usage: ior_driver REGISTRY_DIR CONFIG_FILE CHUNK_SIZE SERVERS. Prints "ior_driver: OK".
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <benchfs.h>

#include "aiori.h"

/* What IOR itself defines. */
int rank;
int verbose;
FILE *out_logfile;
int aiori_warning_as_errors;

#define XFER (256 * 1024)
#define XFERS 6

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__);            \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));                  \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
        }                                                                                  \
    } while (0)

/* Sets an option by its long name the way IOR's option parser stores each type. */
static void set_option(option_help *table, const char *name, const char *value)
{
    for (option_help *o = table; o->longVar != NULL || o->shortVar != 0; o++) {
        if (o->longVar == NULL || strcmp(o->longVar, name) != 0)
            continue;
        switch (o->type) {
        case 's':
            *(char **)o->variable = strdup(value);
            return;
        case 'l':
            *(long long *)o->variable = atoll(value);
            return;
        case 'd':
            *(int *)o->variable = atoi(value);
            return;
        }
        CHECK(0, "option %s has type %c", name, o->type);
    }
    CHECK(0, "no option %s", name);
}

static void pattern(IOR_size_t *buf, long long offset)
{
    for (size_t i = 0; i < XFER / sizeof(IOR_size_t); i++)
        buf[i] = (IOR_size_t)(offset + (long long)(i * sizeof(IOR_size_t))) ^ ((long long)rank << 56);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    out_logfile = stdout;
    CHECK(argc == 5, "usage: ior_driver REGISTRY_DIR CONFIG_FILE CHUNK_SIZE SERVERS");
    const ior_aiori_t *b = &benchfs_aiori;
    CHECK(strcmp(b->name, "BENCHFS") == 0 && b->enable_mdtest, "table");

    aiori_mod_opt_t *opts = NULL;
    option_help *table = b->get_options(&opts, NULL);
    CHECK(opts != NULL && table != NULL, "get_options");
    set_option(table, "benchfs.chunk-size", "-1");
    CHECK(b->check_params(opts) != 0, "check_params accepted a negative chunk size");
    set_option(table, "benchfs.registry", argv[1]);
    set_option(table, "benchfs.config", argv[2]);
    set_option(table, "benchfs.chunk-size", argv[3]);
    set_option(table, "benchfs.servers", argv[4]);
    CHECK(b->check_params(opts) == 0, "check_params");
    /* IOR re-creates the options from defaults per test: the copy must keep them. */
    aiori_mod_opt_t *copy = NULL;
    free(b->get_options(&copy, opts));
    CHECK(memcmp(copy, opts, sizeof(void *)) == 0, "options copied from init_values");

    b->initialize(opts);
    b->initialize(opts); /* nested, as IOR may do per test */
    aiori_xfer_hint_t hints;
    memset(&hints, 0, sizeof(hints));
    hints.filePerProc = 1;
    hints.transferSize = XFER;
    b->xfer_hints(&hints);

    char file[64], dir[64], node[128], moved[128];
    snprintf(file, sizeof file, "/ior-driver.%08d", rank);
    snprintf(dir, sizeof dir, "/mdtest-driver.%d", rank);
    snprintf(node, sizeof node, "%s/file.mdtest.%d.0", dir, rank);
    snprintf(moved, sizeof moved, "%s/renamed", dir);

    /* IOR: write phase (-w -F -z order), fsync (-e), close. */
    IOR_size_t *buf = malloc(XFER), *want = malloc(XFER);
    CHECK(buf != NULL && want != NULL, "malloc");
    aiori_fd_t *fd = b->create(file, IOR_WRONLY | IOR_CREAT, opts);
    CHECK(fd != NULL, "create");
    for (int i = 0; i < XFERS; i++) {
        long long off = (long long)((i * 5) % XFERS) * XFER;
        pattern(buf, off);
        CHECK(b->xfer(WRITE, fd, buf, XFER, off, opts) == XFER, "write at %lld", off);
    }
    b->fsync(fd, opts);
    b->close(fd, opts);
    CHECK(b->get_file_size(opts, file) == (IOR_offset_t)XFERS * XFER, "file size");

    /* IOR: read phase with -R (check every byte). */
    fd = b->open(file, IOR_RDONLY, opts);
    for (int i = 0; i < XFERS; i++) {
        long long off = (long long)i * XFER;
        CHECK(b->xfer(READ, fd, buf, XFER, off, opts) == XFER, "read at %lld", off);
        pattern(want, off);
        CHECK(memcmp(buf, want, XFER) == 0, "data at %lld", off);
    }
    CHECK(b->xfer(READ, fd, buf, XFER, (long long)XFERS * XFER, opts) == 0, "read at EOF");
    b->close(fd, opts);
    b->remove(file, opts);
    CHECK(b->access(file, F_OK, opts) == -1 && errno == ENOENT, "removed file");

    /* mdtest: tree, file create (mknod and create), stat, rename, remove, rmdir. */
    struct stat st;
    CHECK(b->mkdir(dir, 0755, opts) == 0, "mkdir");
    CHECK(b->mkdir(dir, 0755, opts) == -1 && errno == EEXIST, "mkdir twice");
    CHECK(b->stat(dir, &st, opts) == 0 && S_ISDIR(st.st_mode), "stat dir");
    CHECK(b->mknod(node) == 0, "mknod");
    CHECK(b->stat(node, &st, opts) == 0 && S_ISREG(st.st_mode) && st.st_size == 0 &&
              st.st_nlink == 1 && st.st_ino != 0,
          "stat file");
    CHECK(b->access(node, R_OK | W_OK, opts) == 0, "access");
    CHECK(b->rmdir(dir, opts) == -1 && errno == ENOTEMPTY, "rmdir non-empty");
    CHECK(b->rename(node, moved, opts) == 0, "rename");
    CHECK(b->stat(node, &st, opts) == -1 && errno == ENOENT, "old name gone");
    fd = b->create(node, IOR_WRONLY | IOR_CREAT, opts);
    b->close(fd, opts);
    b->remove(node, opts);
    b->remove(moved, opts);
    CHECK(b->rmdir(dir, opts) == 0, "rmdir");
    ior_aiori_statfs_t sfs;
    CHECK(b->statfs("/", &sfs, opts) == 0, "statfs");
    b->sync(opts);
    CHECK(b->get_version()[0] != '\0', "version");

    b->finalize(opts);
    struct benchfs_stat bst;
    CHECK(benchfs_stat("/", &bst) == 0, "still initialized after one of two finalizes");
    b->finalize(opts);
    CHECK(benchfs_stat("/", &bst) == -ESHUTDOWN, "finalized");

    /* A dry run touches nothing. */
    hints.dryRun = 1;
    CHECK(b->create("/never", IOR_WRONLY | IOR_CREAT, opts) == NULL, "dry-run create");
    CHECK(b->xfer(WRITE, NULL, buf, 10, 0, opts) == 10, "dry-run xfer");

    free(buf);
    free(want);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("ior_driver: OK\n");
    MPI_Finalize();
    return 0;
}
