/*
 * benchfs.h in strict C99 (built with -std=c99 -pedantic -Wall -Wextra -Werror), and the
 * library's behaviour without a cluster: calls before init, bad arguments and configuration,
 * an empty registry. Usage: header_check EMPTY_REGISTRY_DIR. Prints "header_check: OK".
 */
#include <benchfs.h> /* first: the header must stand alone */

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* The layout the library writes (64 bytes, id last). */
typedef char stat_is_64_bytes[sizeof(struct benchfs_stat) == 64 ? 1 : -1];
typedef char id_at_48[offsetof(struct benchfs_stat, id) == 48 ? 1 : -1];
typedef char statfs_is_48_bytes[sizeof(struct benchfs_statfs) == 48 ? 1 : -1];
typedef char servers_at_32[offsetof(struct benchfs_statfs, servers) == 32 ? 1 : -1];

static int failures;

static void expect(const char *what, long long got, long long want)
{
    if (got != want) {
        printf("FAIL %s: got %lld (%s), want %lld [%s]\n", what, got,
               got < 0 ? strerror((int)-got) : "-", want, benchfs_last_error());
        failures++;
    }
}

static void expect_message(const char *what, const char *needle)
{
    if (strstr(benchfs_last_error(), needle) == NULL) {
        printf("FAIL %s: message \"%s\" lacks \"%s\"\n", what, benchfs_last_error(), needle);
        failures++;
    }
}

int main(int argc, char **argv)
{
    struct benchfs_stat st;
    benchfs_file *f = NULL;
    const char *bad_form[] = {"no-equals-sign", NULL};
    const char *unknown[] = {"client.no_such_key=1", NULL};
    const char *fast[] = {"cluster.expected_servers=1", "cluster.connect_timeout_s=0.2", NULL};

    if (argc != 2) {
        printf("usage: %s EMPTY_REGISTRY_DIR\n", argv[0]);
        return 2;
    }
    if (benchfs_version()[0] == '\0') {
        printf("FAIL empty version\n");
        failures++;
    }
    expect("last_error before any failure", (long long)strlen(benchfs_last_error()), 0);

    expect("stat before init", benchfs_stat("/", &st), -ESHUTDOWN);
    struct benchfs_statfs sf;
    expect("statfs before init", benchfs_statfs(&sf), -ESHUTDOWN);
    expect_message("stat before init", "not initialized");
    expect("open before init", benchfs_open("/f", 0, &f), -ESHUTDOWN);
    expect("finalize before init", benchfs_finalize(), -ESHUTDOWN);
    expect("pread NULL file", (long long)benchfs_pread(NULL, NULL, 0, 0), -EBADF);

    /* Run without BENCHFS_* variables: no registry anywhere. */
    expect("init NULL registry", benchfs_init(NULL, NULL, NULL, 0), -EINVAL);
    expect_message("init NULL registry", "cluster.registry_dir is not set");
    expect("init malformed override", benchfs_init(argv[1], NULL, bad_form, 0), -EINVAL);
    expect_message("init malformed override", "section.key=value");
    expect("init unknown key", benchfs_init(argv[1], NULL, unknown, 0), -EINVAL);
    expect_message("init unknown key", "no_such_key");
    expect("init too many clients", benchfs_init(argv[1], NULL, fast, 65), -EINVAL);
    expect("init missing config file",
           benchfs_init(argv[1], "/nonexistent/benchfs.toml", fast, 0), -ENOENT);
    expect("init empty registry", benchfs_init(argv[1], NULL, fast, 1), -ETIMEDOUT);
    expect_message("init empty registry", "missing");
    expect("still not initialized", benchfs_unlink("/f"), -ESHUTDOWN);

    if (failures != 0)
        return 1;
    printf("header_check: OK (libbenchfs %s)\n", benchfs_version());
    return 0;
}
