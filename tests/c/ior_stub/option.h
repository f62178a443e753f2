/* Stand-in for src/option.h as of hpc/ior 5fcf0ba995fd (checked line by line): only what aiori-BENCHFS.c uses (see README.md). */
#ifndef _IOR_OPTION_H
#define _IOR_OPTION_H

#include <stdint.h>

typedef enum {
  OPTION_FLAG,
  OPTION_OPTIONAL_ARGUMENT,
  OPTION_REQUIRED_ARGUMENT
} option_value_type;

typedef struct {
  char shortVar;
  char *longVar;
  char *help;
  option_value_type arg;
  char type; /* 'd' int, 'l' long long (with k/m/g suffixes), 's' strdup'ed string, ... */
  void *variable;
} option_help;

#define LAST_OPTION {0, 0, 0, (option_value_type) 0, 0, NULL}

#endif
