/* Stand-in for IOR's src/aiori-debug.h, checked line by line against hpc/ior 5fcf0ba995fd
 * (2026-04-03): the messages and aborts aiori-BENCHFS.c uses (ERRF, ERR, WARNF). */
#ifndef _AIORI_UTIL_H
#define _AIORI_UTIL_H

#include <stdio.h>

extern FILE *out_logfile;
extern int verbose;
extern int aiori_warning_as_errors;

#define ERRF(FORMAT, ...) do {                                                  \
        fprintf(out_logfile, "ERROR: " FORMAT ", (%s:%d)\n", __VA_ARGS__,       \
                __FILE__, __LINE__);                                            \
        fflush(out_logfile);                                                    \
        MPI_Abort(MPI_COMM_WORLD, -1);                                          \
} while (0)

#define ERR(MSG) do {                                                           \
        fprintf(out_logfile, "ERROR: %s, (%s:%d)\n", MSG, __FILE__, __LINE__);  \
        fflush(out_logfile);                                                    \
        MPI_Abort(MPI_COMM_WORLD, -1);                                          \
} while (0)

/* WARNF as IOR has it since January 2022 (EWARNF, which aiori-BENCHFS.c once used, is gone):
 * an error when warnings are errors, else "WARNING: ..." with the location only above
 * VERBOSE_2. */
#define WARNF(FORMAT, ...) do {                                                 \
        if (aiori_warning_as_errors) { ERRF(FORMAT, __VA_ARGS__); }             \
        if (verbose > VERBOSE_2) {                                              \
                fprintf(out_logfile, "WARNING: " FORMAT ", (%s:%d).\n",          \
                        __VA_ARGS__, __FILE__, __LINE__);                       \
        } else {                                                                \
                fprintf(out_logfile, "WARNING: " FORMAT "\n", __VA_ARGS__);     \
        }                                                                       \
        fflush(out_logfile);                                                    \
} while (0)

#endif
