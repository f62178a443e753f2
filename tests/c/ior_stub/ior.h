/* Stand-in for IOR 4.x src/ior.h: aiori-BENCHFS.c needs nothing from it but its includes. */
#ifndef _IOR_H
#define _IOR_H

#include "option.h"
#include "iordef.h"

#endif
