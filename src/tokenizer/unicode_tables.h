// Unicode Character Database extracts for NFC (generated into unicode_tables.cpp and
// unicode_compositions.cpp by tools/gen_unicode_tables.py; see docs/tokenizer.md for how to
// regenerate).
#pragma once

#include <cstdint>

namespace lilac::unicode_tables {

// Two-stage tables over all code points: value(cp) = Stage2[Stage1[cp >> 8] * 256 + (cp & 255)].
extern const uint8_t kCccStage1[0x1100];  // canonical combining class
extern const uint8_t kCccStage2[];
extern const uint8_t kNfcQcStage1[0x1100];  // NFC_Quick_Check: 0 Yes, 1 Maybe, 2 No
extern const uint8_t kNfcQcStage2[];

// Full canonical decomposition of `cp`: kDecompositionPool[offset .. offset + length).
// Sorted by cp; Hangul syllables are not listed (decomposed algorithmically).
struct Decomposition {
  uint32_t cp;
  uint16_t offset;
  uint8_t length;
};
extern const Decomposition kDecompositions[];
extern const uint32_t kDecompositionCount;
extern const uint32_t kDecompositionPool[];

// Primary composites: key = first << 21 | second, sorted by key (Hangul not listed).
struct Composition {
  uint64_t key;
  uint32_t composite;
};
extern const Composition kCompositions[];
extern const uint32_t kCompositionCount;

}  // namespace lilac::unicode_tables
