/* benchfs-bench access: a small metadata loop, built twice from this file: with -DVIA_CAPI
 * over the C library (benchfs.h), else over POSIX calls (run under LD_PRELOAD of the
 * interposition library). Creates COUNT empty files in DIR, stats them, unlinks them; prints
 * one JSON object with the rate of each phase.
 *
 * usage: metaloop DIR COUNT */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef VIA_CAPI
#include <benchfs.h>
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int fail(const char *what, const char *path, int err) {
#ifdef VIA_CAPI
    fprintf(stderr, "metaloop: %s %s: error %d (%s)\n", what, path, err, benchfs_last_error());
#else
    fprintf(stderr, "metaloop: %s %s: error %d\n", what, path, err);
#endif
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3 || atol(argv[2]) <= 0) {
        fprintf(stderr, "usage: metaloop DIR COUNT\n");
        return 2;
    }
    const char *dir = argv[1];
    long count = atol(argv[2]);
    char path[4096];
    double rate[3];
#ifdef VIA_CAPI
    int rc = benchfs_init(NULL, NULL, NULL, 1);
    if (rc != 0) return fail("init", "", rc);
#endif
    for (int phase = 0; phase < 3; phase++) {
        double start = now();
        for (long i = 0; i < count; i++) {
            snprintf(path, sizeof path, "%s/f%ld", dir, i);
#ifdef VIA_CAPI
            if (phase == 0) {
                benchfs_file *f;
                rc = benchfs_create(path, O_WRONLY | O_CREAT | O_EXCL, 0644, &f);
                if (rc == 0) rc = benchfs_close(f);
            } else if (phase == 1) {
                struct benchfs_stat st;
                rc = benchfs_stat(path, &st);
            } else {
                rc = benchfs_unlink(path);
            }
            if (rc != 0) return fail(phase == 0 ? "create" : phase == 1 ? "stat" : "unlink", path, rc);
#else
            int rc = 0;
            if (phase == 0) {
                int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
                rc = fd < 0 ? -1 : close(fd);
            } else if (phase == 1) {
                struct stat st;
                rc = stat(path, &st);
            } else {
                rc = unlink(path);
            }
            if (rc != 0) return fail(phase == 0 ? "create" : phase == 1 ? "stat" : "unlink", path, -1);
#endif
        }
        rate[phase] = (double)count / (now() - start);
    }
#ifdef VIA_CAPI
    benchfs_finalize();
#endif
    printf("{\"create\": %.1f, \"stat\": %.1f, \"unlink\": %.1f}\n", rate[0], rate[1], rate[2]);
    return 0;
}
