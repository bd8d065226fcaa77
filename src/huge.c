/* Huge blocks: above HAK_LARGE_MAX a block gets a mapping of its own, laid
 * out as a segment (header at a 2 MiB boundary, so free finds it by the same
 * mask), and realloc grows or moves it with mremap instead of copying. */
#include <errno.h>

#include "internal.h"

#define PAGE_UP(x) (((x) + HAK_OS_PAGE - 1) & ~(size_t)(HAK_OS_PAGE - 1))

/* Distance from the header to the block: the header page, or the alignment.
 * An alignment of 2 MiB or more puts the block exactly one segment above the
 * header, and the segment map marks the block's unit HAK_MAP_HUGE_ABOVE. */
static size_t huge_offset(size_t align) {
  if (align <= HAK_OS_PAGE) return HAK_SEG_HDR_SIZE;
  if (align < HAK_SEG_SIZE) return align;
  return HAK_SEG_SIZE;
}

static void huge_map(hak_segment_t* seg, bool on) {
  hak_segmap_set(seg, on ? HAK_MAP_SEGMENT : HAK_MAP_NONE);
  if (seg->huge_block == (uint8_t*)seg + HAK_SEG_SIZE)
    hak_segmap_set(seg->huge_block, on ? HAK_MAP_HUGE_ABOVE : HAK_MAP_NONE);
}

void* hak_huge_alloc(size_t size, size_t align) {
  if (size > HAK_SIZE_LIMIT || align > HAK_SIZE_LIMIT) {
    errno = ENOMEM;
    return NULL;
  }
  size_t off = huge_offset(align);
  size_t total = PAGE_UP(off + size);
  /* The header sits on a 2 MiB boundary; with a larger alignment, that
   * boundary is one segment below an aligned address.  The mapping kept is
   * at most size + alignment (plus a page of rounding). */
  uint8_t* base = align <= HAK_SEG_SIZE ? hak_os_map_aligned(total, HAK_SEG_SIZE, 0)
                                        : hak_os_map_aligned(total, align, HAK_SEG_SIZE);
  if (base == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  hak_segment_t* seg = (hak_segment_t*)base;
  seg->kind = HAK_SEG_HUGE;
  seg->map_size = total;
  seg->huge_block = base + off;
  huge_map(seg, true);
  hak_count(huge_allocs, 1);
  return seg->huge_block;
}

void hak_huge_free(hak_segment_t* seg) {
  huge_map(seg, false);
  hak_os_unmap(seg, seg->map_size);
}

size_t hak_huge_usable(hak_segment_t* seg, const void* p) {
  return (size_t)((uint8_t*)seg + seg->map_size - (const uint8_t*)p);
}

/* Resizes a huge block without copying when it can: shrink in place, grow in
 * place, or move the pages to a new 2 MiB-aligned place.  NULL means the
 * caller must allocate and copy (or that memory is exhausted). */
void* hak_huge_realloc(hak_segment_t* seg, void* p, size_t size) {
  if (p != seg->huge_block) hak_fatal("realloc of an invalid pointer (inside a huge block)", p);
  uint8_t* base = (uint8_t*)seg;
  if (size <= HAK_LARGE_MAX || size > HAK_SIZE_LIMIT) return NULL;
  size_t off = (size_t)((uint8_t*)p - base);
  size_t old_total = seg->map_size;
  size_t total = PAGE_UP(off + size);
  if (total == old_total) return p;
  if (total < old_total || hak_os_remap(base, old_total, total, NULL) != NULL) {
    if (total < old_total) hak_os_unmap(base + total, old_total - total);
    seg->map_size = total;
    return p;
  }
  uint8_t* dest = hak_os_map_aligned(total, HAK_SEG_SIZE, 0);
  if (dest == NULL) return NULL;
  huge_map(seg, false);
  if (hak_os_remap(base, old_total, total, dest) == NULL) {
    huge_map(seg, true);
    hak_os_unmap(dest, total);
    return NULL;
  }
  seg = (hak_segment_t*)dest;
  seg->map_size = total;
  seg->huge_block = dest + off;
  huge_map(seg, true);
  return seg->huge_block;
}
