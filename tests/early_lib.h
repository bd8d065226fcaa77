/* What early_lib's constructor managed to do. */
#ifndef HAK_EARLY_LIB_H
#define HAK_EARLY_LIB_H
#include <stddef.h>

enum {
  EARLY_RAN = 1 << 0,
  EARLY_MALLOC = 1 << 1,
  EARLY_CALLOC = 1 << 2,
  EARLY_REALLOC = 1 << 3,
  EARLY_STRDUP = 1 << 4,
  EARLY_MEMALIGN = 1 << 5,
  EARLY_MANY = 1 << 6,
  EARLY_THREAD = 1 << 7,
  EARLY_KEPT = 1 << 8,
  EARLY_ALL = (1 << 9) - 1,
};

extern int early_lib_status;
extern unsigned char* early_lib_block;
extern size_t early_lib_block_size;

#endif
