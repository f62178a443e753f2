/* Stand-in for IOR 4.x src/aiori-debug.h: the messages and aborts aiori-BENCHFS.c uses. */
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

#define EWARNF(FORMAT, ...) do {                                                \
        if (aiori_warning_as_errors) { ERRF(FORMAT, __VA_ARGS__); }             \
        fprintf(out_logfile, "WARNING: " FORMAT "\n", __VA_ARGS__);             \
        fflush(out_logfile);                                                    \
} while (0)

#endif
