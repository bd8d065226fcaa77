/* Size classes: the table of block sizes and how many 64 KiB units a page of
 * each class spans.  Filled once at start; no allocation. */
#include "internal.h"

uint32_t hak_class_size[HAK_CLASSES];
uint8_t hak_class_units[HAK_CLASSES];
uint16_t hak_class_start_lines[HAK_CLASSES];
uint16_t hak_class_start_off[HAK_CLASSES];
uint64_t hak_class_magic[HAK_CLASSES];
uint8_t hak_class_by_64[HAK_CLASS_MAX_SIZE / 64 + 1];
uint8_t hak_class_direct_first[HAK_DIRECT_CLASSES];
uint8_t hak_class_direct_slots[HAK_DIRECT_CLASSES];

/* A page should hold at least this many blocks, so that mid-size classes do not
 * churn pages: malloc mispredicts each time its page runs out, which with 8
 * blocks of 8-64 KiB a page came every 7.5 mallocs of random sizes (with 4,
 * every third); with 16, fewer pages hold a class's free blocks, and peak RSS
 * is lower too (docs/BENCHMARKS.md).  The 640-1024 B classes take two units
 * (128-204 blocks): a class's current page gets only its share of the frees,
 * and with 64 blocks of 1 KiB it ran out every 26 mallocs.  At most
 * HAK_CLASS_UNITS_MAX units, so that beside such a page and a few small ones
 * a segment keeps room for a realloc home to grow to HAK_LARGE_MAX (16
 * units); the 40-64 KiB classes then hold 12-16 blocks.  The tail a page
 * cannot use stays under 1/8 of it. */
#define HAK_CLASS_UNITS_MAX 12u
static unsigned units_for(size_t bsize) {
  unsigned min_blocks = bsize <= 1024 ? 128 : bsize < 8192 ? 8 : bsize <= 65536 ? 16 : 4;
  for (unsigned n = 1; n < HAK_CLASS_UNITS_MAX; n++) {
    size_t bytes = n * HAK_UNIT_SIZE;
    size_t blocks = bytes / bsize;
    if (blocks >= min_blocks && (bytes - blocks * bsize) * 8 <= bytes) return n;
  }
  return HAK_CLASS_UNITS_MAX;
}

/* The small classes whose blocks fill their pages exactly (one start line)
 * would all start at a unit boundary, and their first blocks, the ones a
 * program that frees what it just allocated uses over and over, would share
 * the low 12 bits of their addresses: the processor then takes a load from
 * one for a store to another just made (4K aliasing) and waits.  Each such
 * class starts its pages a different line in, of 8: a multiple of its
 * largest power-of-two factor, so that its blocks keep their alignment
 * (alloc_aligned relies on it), at the cost of at most 512 bytes of a
 * 64 KiB page.  string_builder (8-64 B blocks) ran 6% faster
 * (docs/BENCHMARKS.md). */
#define HAK_START_OFF_MAX_SIZE 256

/* 16-256 B in steps of 16, then four classes a doubling up to 1 KiB (5/4,
 * 6/4, 7/4, 8/4 of the doubling's base) and five above: one a little above
 * the power of two, then 5/4, 3/2, 7/4 and 2.  A size a little above a power
 * of two (a buffer and its header, a 4 KiB page and its descriptor) is
 * common, and would land at the bottom of the widest step.  Up to 8 KiB
 * that class is 5/64 above (rounded down to 64 B: 1088, 2176, 4416, 8832),
 * to take sqlite3's blocks of 1,032 and 4,368 bytes with little unused;
 * above, 9/8 (18,432 ...): 5/64 there too raised the peak RSS of random
 * 1-64 KiB blocks 3-5% (docs/BENCHMARKS.md). */
static size_t class_size(unsigned c) {
  static const uint8_t quarters[4] = {5, 6, 7, 8};
  if (c < 16) return 16u * (c + 1);
  if (c < 24) return (size_t)((c - 16) % 4 + 5) << ((c - 16) / 4 + 6);
  size_t base = (size_t)1024 << ((c - 24) / 5);
  unsigned i = (c - 24) % 5;
  if (i != 0) return base * quarters[i - 1] / 4;
  return base <= 8192 ? base + (base * 5 / 64 & ~(size_t)63) : base * 9 / 8;
}

void hak_classes_init(void) {
  unsigned exact = 0;
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    size_t size = class_size(c);
    hak_class_size[c] = (uint32_t)size;
    hak_class_units[c] = (uint8_t)units_for(size);
    size_t bytes = (size_t)hak_class_units[c] * HAK_UNIT_SIZE;
    hak_class_start_lines[c] = (uint16_t)((bytes - bytes / size * size) / 64 + 1);
    if (hak_class_start_lines[c] == 1 && size <= HAK_START_OFF_MAX_SIZE) {
      size_t align = size & -size;
      if (align < 64) align = 64;
      size_t off = (size_t)(exact++ % 8) * 64;
      hak_class_start_off[c] = (uint16_t)((off + align - 1) / align * align);
    }
    hak_class_magic[c] = hak_div_magic((uint32_t)size);
    /* Sizes of 64-byte step i (those above 64 * (i - 1)) fall in class c if
     * it is the first to hold 64 * i bytes. */
    for (size_t i = c == 0 ? 0 : hak_class_size[c - 1] / 64 + 1; i <= size / 64; i++)
      hak_class_by_64[i] = (uint8_t)c;
    if (c < HAK_DIRECT_CLASSES) {
      size_t lo = c == 0 ? 0 : hak_class_size[c - 1] / 16 + 1;
      size_t hi = size / 16 < HAK_DIRECT_SLOTS - 1 ? size / 16 : HAK_DIRECT_SLOTS - 1;
      size_t slots = hi - lo + 1;
      hak_class_direct_first[c] = (uint8_t)lo;
      hak_class_direct_slots[c] = (uint8_t)slots;
      hak_assert(slots == 1 || slots == 2 || slots == 4 || slots == 8);
    }
  }
  for (unsigned c = 0; c < HAK_CLASSES; c++) hak_assert(hak_class_of(hak_class_size[c]) == c);
  hak_assert(hak_class_of(HAK_DIRECT_MAX) == HAK_DIRECT_CLASSES - 1);
}
