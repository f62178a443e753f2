/* Stand-in for src/ior.h as of hpc/ior 5fcf0ba995fd (checked line by line): aiori-BENCHFS.c needs nothing from it but its includes. */
#ifndef _IOR_H
#define _IOR_H

#include "option.h"
#include "iordef.h"

#endif
