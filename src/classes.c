/* Size classes: the table of block sizes and how many 64 KiB units a page of
 * each class spans.  Filled once at start; no allocation. */
#include "internal.h"

uint32_t hak_class_size[HAK_CLASSES];
uint32_t hak_class_block[HAK_CLASSES];
uint8_t hak_class_units[HAK_CLASSES];
uint16_t hak_class_start_lines[HAK_CLASSES];
uint64_t hak_class_magic[HAK_CLASSES];
uint8_t hak_class_by_64[HAK_CLASS_MAX_SIZE / 64 + 1];

/* A page should hold at least this many blocks, so that mid-size classes do not
 * churn pages (with 4 blocks a page of 16-64 KiB blocks ran out every third
 * malloc); the tail it cannot use should stay under 1/8 of the page. */
static unsigned units_for(size_t bsize) {
  unsigned min_blocks = bsize <= 65536 ? 8 : 4;
  for (unsigned n = 1; n <= 16; n++) {
    size_t bytes = n * HAK_UNIT_SIZE;
    size_t blocks = bytes / bsize;
    if (blocks >= min_blocks && (bytes - blocks * bsize) * 8 <= bytes) return n;
  }
  return 16;
}

void hak_classes_init(void) {
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    size_t size = c < 16 ? 16u * (c + 1) : (size_t)((c - 16) % 4 + 5) << ((c - 16) / 4 + 6);
    hak_class_size[c] = (uint32_t)size;
    /* 40-64 KiB blocks (multiples of 8 KiB, 8 to a page end to end) would all
     * start at one offset of their 64 KiB units, in one set of the L1 and
     * 1-8 of the L2 cache: a line more each moves every block's first line
     * one set on from the last (mid_large's L2 read misses 255k -> 37k per
     * 2x10^6 operations under cachegrind).  Smaller multiples of 8 KiB too
     * raised peak RSS: a block start off its OS page touches one page more
     * of those its last byte falls in over the block's lives
     * (docs/BENCHMARKS.md). */
    size_t block = size + (size >= HAK_PAD_FROM && size <= 65536 ? 64 : 0);
    hak_class_block[c] = (uint32_t)block;
    hak_class_units[c] = (uint8_t)units_for(block);
    size_t bytes = (size_t)hak_class_units[c] * HAK_UNIT_SIZE;
    hak_class_start_lines[c] = (uint16_t)((bytes - bytes / block * block) / 64 + 1);
    hak_class_magic[c] = hak_div_magic((uint32_t)block);
    /* Sizes of 64-byte step i (those above 64 * (i - 1)) fall in class c if
     * it is the first to hold 64 * i bytes. */
    for (size_t i = c == 0 ? 0 : hak_class_size[c - 1] / 64 + 1; i <= size / 64; i++)
      hak_class_by_64[i] = (uint8_t)c;
  }
  for (unsigned c = 0; c < HAK_CLASSES; c++) hak_assert(hak_class_of(hak_class_size[c]) == c);
  hak_assert(hak_class_of(HAK_DIRECT_MAX) == HAK_DIRECT_CLASSES - 1);
}
