/* Stand-in for src/iordef.h as of hpc/ior 5fcf0ba995fd (checked line by line): only what aiori-BENCHFS.c uses (see README.md). */
#ifndef _IORDEF_H
#define _IORDEF_H

#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern int rank;
extern int verbose;

#define WRITE 0
#define WRITECHECK 1
#define READ 2
#define READCHECK 3

#define VERBOSE_2 2

typedef long long int IOR_offset_t;
typedef long long int IOR_size_t;

#endif
