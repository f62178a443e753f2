/* A C client for tests/test_faults.py: writes (and reads back) 2 MiB at offset 0 of one file in a
 * loop until a call fails or 30 s pass, timing every call. Prints "writing" once the loop runs,
 * then one line: "failed errno=<name> after_s=<seconds> max_call_s=<seconds> message=<text>",
 * or "no failure". Usage: fault_writer REGISTRY CONFIG PATH */
#define _POSIX_C_SOURCE 200809L
#include <benchfs.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static const char *errno_name(long e) {
    switch (e) {
    case EHOSTDOWN: return "EHOSTDOWN";
    case ETIMEDOUT: return "ETIMEDOUT";
    case ECONNRESET: return "ECONNRESET";
    default: return "other";
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s REGISTRY CONFIG PATH\n", argv[0]);
        return 2;
    }
    int rc = benchfs_init(argv[1], argv[2], NULL, 0);
    if (rc < 0) {
        fprintf(stderr, "benchfs_init: %s\n", benchfs_last_error());
        return 1;
    }
    size_t len = 2u << 20;
    unsigned char *buf = malloc(len), *back = malloc(len);
    if (buf == NULL || back == NULL) return 1;
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(i * 7 + 3);
    benchfs_file *f = NULL;
    rc = benchfs_create(argv[3], O_RDWR, 0644, &f);
    if (rc < 0) {
        fprintf(stderr, "benchfs_create: %s\n", benchfs_last_error());
        return 1;
    }
    double start = now(), max_call = 0.0;
    long failure = 0;
    int announced = 0;
    while (now() - start < 30.0 && failure == 0) {
        double t = now();
        ssize_t n = benchfs_pwrite(f, buf, len, 0);
        if (n >= 0) n = benchfs_pread(f, back, len, 0);
        double took = now() - t;
        if (took > max_call) max_call = took;
        if (n < 0) failure = (long)-n;
        else if ((size_t)n != len || memcmp(buf, back, len) != 0) {
            printf("mismatch\n");
            return 1;
        }
        if (!announced) {
            printf("writing\n");
            fflush(stdout);
            announced = 1;
        }
    }
    if (failure != 0)
        printf("failed errno=%s after_s=%.3f max_call_s=%.3f message=%s\n", errno_name(failure),
               now() - start, max_call, benchfs_last_error());
    else
        printf("no failure\n");
    fflush(stdout);
    benchfs_close(f); /* may fail too: the size owner may be the dead server */
    benchfs_finalize();
    free(buf);
    free(back);
    return 0;
}
